//! A sysfs tree with two PCI devices whose BAR 2 `resource2` files are
//! ordinary files: mapped by two sides of a link, they carry its rings as
//! the BARs of two devices would (mmap of a regular file behaves like mmap
//! of a BAR file for everything but caching). Shared by the facade's, the
//! C ABI's and Python's BAR tests.
#![allow(dead_code)]

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `IORESOURCE_MEM | IORESOURCE_PREFETCH | IORESOURCE_MEM_64`.
const MEM64_PREF: u64 = 0x0014_220c;

/// Bytes of each device's BAR 2.
pub const BAR_BYTES: u64 = 16 << 20;

/// The two devices: side A owns the first, side B the second.
pub const DEVICES: [&str; 2] = ["0000:00:10.0", "0000:00:11.0"];

/// A fixture tree, removed when dropped.
pub struct BarFixture {
    pub root: PathBuf,
}

impl Drop for BarFixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl BarFixture {
    pub fn new(tag: &str) -> BarFixture {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("barlink-bars-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (slot, bdf) in DEVICES.iter().enumerate() {
            let dir = root.join("sys/bus/pci/devices").join(bdf);
            fs::create_dir_all(&dir).unwrap();
            // A memory controller of ivshmem's ids: no GPU the topology
            // classifies, so the windows are used as named.
            fs::write(dir.join("vendor"), "0x1af4\n").unwrap();
            fs::write(dir.join("device"), "0x1110\n").unwrap();
            fs::write(dir.join("class"), "0x050000\n").unwrap();
            let mut lines = vec!["0x0000000000000000 0x0000000000000000 0x0000000000000000"; 13]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>();
            let start = 0xf000_0000u64 + slot as u64 * BAR_BYTES;
            lines[2] = format!(
                "0x{start:016x} 0x{:016x} 0x{MEM64_PREF:016x}",
                start + BAR_BYTES - 1
            );
            fs::write(dir.join("resource"), lines.join("\n") + "\n").unwrap();
            fs::File::create(dir.join("resource2"))
                .unwrap()
                .set_len(BAR_BYTES)
                .unwrap();
        }
        BarFixture { root }
    }

    /// The window text of device `slot`'s BAR 2 from `offset`, `len` bytes.
    pub fn window(&self, slot: usize, offset: u64, len: u64) -> String {
        format!("{}/2@{offset:#x}+{len:#x}", DEVICES[slot])
    }
}
