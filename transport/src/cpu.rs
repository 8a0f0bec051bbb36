//! What this CPU is and which kernels the transport chose on it, so that
//! every figure a benchmark reports says where it came from.
#![forbid(unsafe_code)]

/// The CPU a process runs on, as reports name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuReport {
    /// The model name (`/proc/cpuinfo`), or "unknown".
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

/// The first `model name` line of `/proc/cpuinfo`.
fn model_name() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
        .map(|(_, name)| name.trim().to_string())
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
            assert_eq!(report.copy_crc_kernel, "avx512-vpclmulqdq fused");
            assert!(report.features.contains(&"avx512f"));
        }
    }
}
