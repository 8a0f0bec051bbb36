//! Sizes as people write them on command lines and in variables.
#![forbid(unsafe_code)]

/// Parses sizes like `8`, `4K`, `64KiB`, `1M`, `16MiB`, `1G` (binary units).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits_end);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (try 8, 4K, 64KiB, 1M)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?} (use K, M or G)"
            ));
        }
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }
}
