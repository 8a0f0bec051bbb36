//! The progress line on stderr, and byte counts for people.

use std::io::Write as _;

/// A line on stderr, rewritten in place, when stderr is a terminal.
pub struct Progress {
    pub on: bool,
}

impl Progress {
    pub fn show(&self, text: &str) {
        if self.on {
            eprint!("\r{text:<72}\r");
            let _ = std::io::stderr().flush();
        }
    }

    pub fn clear(&self) {
        self.show("");
    }
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}
