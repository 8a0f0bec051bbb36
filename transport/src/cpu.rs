//! What this CPU is and which kernels the transport chose on it, so that
//! every figure a benchmark reports says where it came from.
#![forbid(unsafe_code)]

/// The CPU a process runs on, as reports name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuReport {
    /// The model name (`/proc/cpuinfo`) with its family, model and
    /// stepping numbers (a virtual machine's name may say only "AMD EPYC",
    /// which spans generations with different vector units), or "unknown".
    pub model: String,
    /// The vector and checksum features the kernels dispatch on that this
    /// CPU has, in a fixed order (`avx2`, `avx512f`, ...).
    pub features: Vec<&'static str>,
    /// The kernel behind a checksum of a long buffer.
    pub crc_kernel: &'static str,
    /// The kernel behind a copy with its CRC (a packet into or out of a
    /// window).
    pub copy_crc_kernel: &'static str,
    /// The kernel behind a plain window copy of 512 bytes or more.
    pub copy_kernel: &'static str,
}

impl CpuReport {
    /// The report for the CPU this process runs on.
    pub fn current() -> CpuReport {
        CpuReport {
            model: model_name().unwrap_or_else(|| "unknown".to_string()),
            features: features(),
            crc_kernel: crate::crc::checksum_kernel(),
            copy_crc_kernel: crate::crc::copy_kernel(),
            copy_kernel: crate::window::copy_kernel(),
        }
    }
}

/// The first processor's model name in `/proc/cpuinfo`, with its family,
/// model and stepping where the file gives them.
fn model_name() -> Option<String> {
    describe(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
}

/// `model name (family F model M stepping S)` from the text of
/// `/proc/cpuinfo`: the first processor's fields only.
fn describe(cpuinfo: &str) -> Option<String> {
    let first = cpuinfo.split("\n\n").next()?;
    let field = |key: &str| {
        first.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            (name.trim() == key).then(|| value.trim().to_string())
        })
    };
    let name = field("model name")?;
    let numbers: Vec<String> = [
        ("family", "cpu family"),
        ("model", "model"),
        ("stepping", "stepping"),
    ]
    .into_iter()
    .filter_map(|(label, key)| Some(format!("{label} {}", field(key)?)))
    .collect();
    if numbers.is_empty() {
        return Some(name);
    }
    Some(format!("{name} ({})", numbers.join(" ")))
}

/// Whether the CPU has `prefetchw`, which takes a cache line in the state
/// a write needs (CPUID 8000_0001h, ECX bit 8, which Linux reports as
/// `3dnowprefetch`). Checked once.
pub(crate) fn has_prefetchw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static PREFETCHW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *PREFETCHW.get_or_init(|| {
            let highest_extended = std::arch::x86_64::__cpuid(0x8000_0000).eax;
            highest_extended >= 0x8000_0001
                && std::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The features the kernels dispatch on, those this CPU has.
fn features() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut present = Vec::new();
        macro_rules! check {
            ($($feature:tt),*) => {
                $(if std::arch::is_x86_feature_detected!($feature) {
                    present.push($feature);
                })*
            };
        }
        check!(
            "sse4.2",
            "pclmulqdq",
            "avx2",
            "vpclmulqdq",
            "avx512f",
            "avx512vl"
        );
        if has_prefetchw() {
            present.push("prefetchw");
        }
        present
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_carries_its_family_model_and_stepping() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nstepping\t: 0\n\nprocessor\t: 1\ncpu family\t: 99\nmodel\t\t: 1\nmodel name\t: other\n";
        assert_eq!(
            describe(cpuinfo).as_deref(),
            Some("AMD EPYC (family 25 model 17 stepping 0)")
        );
        assert_eq!(
            describe("model name\t: Some CPU\n").as_deref(),
            Some("Some CPU"),
            "no numbers: the name alone"
        );
        assert_eq!(describe("processor\t: 0\n"), None);
    }

    /// The CPUID bit read for `prefetchw` is the one Linux reports as
    /// `3dnowprefetch`: a wrong bit could run an instruction the CPU
    /// lacks. Only that direction is checked: Linux may report the flag
    /// on AMD CPUs whose CPUID (in a guest, say) hides the bit.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn the_prefetchw_check_agrees_with_the_kernel() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let Some(flags) = cpuinfo.lines().find(|line| line.starts_with("flags")) else {
            println!(
                "SKIPPED the_prefetchw_check_agrees_with_the_kernel: /proc/cpuinfo lists no flags"
            );
            return;
        };
        let kernel_says = flags.split_whitespace().any(|flag| flag == "3dnowprefetch");
        assert!(
            !has_prefetchw() || kernel_says,
            "CPUID says prefetchw, the kernel does not"
        );
        assert_eq!(
            CpuReport::current().features.contains(&"prefetchw"),
            has_prefetchw()
        );
    }

    #[test]
    fn the_report_names_a_kernel_of_each_kind() {
        let report = CpuReport::current();
        assert!(!report.model.is_empty());
        for kernel in [
            report.crc_kernel,
            report.copy_crc_kernel,
            report.copy_kernel,
        ] {
            assert!(!kernel.is_empty());
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
        {
            let expected = if has_prefetchw() {
                "avx512-vpclmulqdq fused, destination lines taken ahead, non-temporal stores into large messages"
            } else {
                "avx512-vpclmulqdq fused, non-temporal stores into large messages"
            };
            assert_eq!(report.copy_crc_kernel, expected);
            assert!(report.features.contains(&"avx512f"));
        }
    }
}
