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
    /// The limit `BARLINK_CPU_ISA` put on the kernels, if it put one.
    pub isa_limit: Option<&'static str>,
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
            isa_limit: (isa_limit() != IsaLimit::Avx512).then(|| isa_limit().name()),
        }
    }
}

/// The widest of barlink's own vector kernels a process may use. By
/// default whatever the CPU has; `BARLINK_CPU_ISA` lowers it, as oneDNN's
/// `ONEDNN_MAX_CPU_ISA` does: to run the kernels of an older CPU on a newer
/// one (to compare them on one machine), or with `avx2` to keep 512-bit
/// instructions off a CPU that slows its clock for them. A limit above
/// what the CPU has changes nothing. Only barlink's own code obeys it:
/// under `portable` checksums go to `crc-fast`, which picks its own path
/// (512 bits wide where the CPU has AVX-512).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IsaLimit {
    /// None of barlink's own vector or `crc32` kernels: copies by
    /// `memcpy`, checksums by `crc-fast` (whose own dispatch this does not
    /// reach: not a way to keep 512-bit instructions off).
    Portable,
    /// The 256-bit kernels (AVX2 with VPCLMULQDQ), not the 512-bit ones.
    Avx2,
    /// Every kernel the CPU can run (the default).
    Avx512,
}

impl IsaLimit {
    /// The environment variable that sets the limit.
    pub const VARIABLE: &'static str = "BARLINK_CPU_ISA";

    /// The limit a value of [`IsaLimit::VARIABLE`] names (`avx512`, `avx2`
    /// or `portable`, in any case), or `None`.
    pub fn parse(value: &str) -> Option<IsaLimit> {
        match value.trim().to_ascii_lowercase().as_str() {
            "avx512" => Some(IsaLimit::Avx512),
            "avx2" => Some(IsaLimit::Avx2),
            "portable" => Some(IsaLimit::Portable),
            _ => None,
        }
    }

    /// The value that names this limit.
    pub fn name(self) -> &'static str {
        match self {
            IsaLimit::Avx512 => "avx512",
            IsaLimit::Avx2 => "avx2",
            IsaLimit::Portable => "portable",
        }
    }

    /// The limit the environment sets: `Ok(None)` when the variable is
    /// unset or empty, an error naming the variable and its values when
    /// it names no limit. Commands check this at start so that a typo is
    /// refused rather than ignored.
    pub fn from_env() -> Result<Option<IsaLimit>, String> {
        let Some(value) = std::env::var_os(Self::VARIABLE).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let text = value.to_string_lossy();
        Self::parse(&text).map(Some).ok_or_else(|| {
            format!(
                "{}={text:?} names no instruction set limit: use avx512, avx2 or portable, or unset it",
                Self::VARIABLE
            )
        })
    }
}

/// The limit on the kernels for this process (see [`IsaLimit`]), read once.
/// A value that names no limit is ignored with a warning: commands refuse
/// it before they get here ([`IsaLimit::from_env`]). The warning goes to
/// the log, or to stderr in a process that set up no logging (a C or
/// Python program), as NCCL's warnings about its variables do: a typo
/// there must not pass unseen.
pub fn isa_limit() -> IsaLimit {
    static LIMIT: std::sync::OnceLock<IsaLimit> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| match IsaLimit::from_env() {
        Ok(limit) => limit.unwrap_or(IsaLimit::Avx512),
        Err(error) => {
            const IGNORED: &str = "ignored; every kernel the CPU has stays in use";
            if tracing::dispatcher::has_been_set() {
                tracing::warn!(%error, "{IGNORED}");
            } else {
                eprintln!("barlink: warning: {error}: {IGNORED}");
            }
            IsaLimit::Avx512
        }
    })
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

/// Whether the CPU is an AMD one (CPUID leaf 0's vendor string
/// `AuthenticAMD`), where some copies are best made otherwise than on
/// Intel. Checked once.
pub(crate) fn is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AMD.get_or_init(|| {
            // The vendor string lies in EBX, EDX, ECX, in that order.
            let vendor = std::arch::x86_64::__cpuid(0);
            (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the 512-bit fused copy takes its destination's lines for
/// writing ahead of its stores (design change 57). On Intel that lets the
/// lines a peer's core holds come in parallel; on an AMD Zen 4 the same
/// hints slowed every size they were tried at, most of all the long
/// copies (design change 71), so AMD CPUs store without them.
pub(crate) fn writes_ahead() -> bool {
    has_prefetchw() && !is_amd()
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

    /// The vendor check that picks AMD's copies agrees with the vendor
    /// Linux names: a wrong constant would keep Intel's choices on AMD.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn the_vendor_check_agrees_with_the_kernel() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let Some(vendor) = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("vendor_id"))
        else {
            println!(
                "SKIPPED the_vendor_check_agrees_with_the_kernel: /proc/cpuinfo names no vendor"
            );
            return;
        };
        let vendor = vendor.trim_start_matches([' ', '\t', ':']).trim();
        assert_eq!(is_amd(), vendor == "AuthenticAMD", "vendor_id {vendor:?}");
        assert_eq!(writes_ahead(), has_prefetchw() && vendor != "AuthenticAMD");
    }

    #[test]
    fn an_isa_limit_is_named_in_any_case_and_nothing_else_is_one() {
        assert_eq!(IsaLimit::parse("AVX2"), Some(IsaLimit::Avx2));
        assert_eq!(IsaLimit::parse(" avx512 "), Some(IsaLimit::Avx512));
        assert_eq!(IsaLimit::parse("portable"), Some(IsaLimit::Portable));
        for wrong in ["", "avx", "sse4.2", "avx-512"] {
            assert_eq!(IsaLimit::parse(wrong), None, "{wrong:?}");
        }
        for limit in [IsaLimit::Portable, IsaLimit::Avx2, IsaLimit::Avx512] {
            assert_eq!(IsaLimit::parse(limit.name()), Some(limit));
        }
        assert!(IsaLimit::Portable < IsaLimit::Avx2 && IsaLimit::Avx2 < IsaLimit::Avx512);
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
            && isa_limit() == IsaLimit::Avx512
        {
            let expected = if writes_ahead() {
                "avx512-vpclmulqdq fused, destination lines taken ahead, non-temporal stores into large messages"
            } else {
                "avx512-vpclmulqdq fused, non-temporal stores into large messages"
            };
            assert_eq!(report.copy_crc_kernel, expected);
            assert!(report.features.contains(&"avx512f"));
        }
    }
}
