//! Gives the shared library a SONAME carrying the ABI's major version
//! (`libbarlink_c.so.MAJOR`), read from `ffi/src/types.rs` so the two cannot
//! disagree: a program linked against it then refuses to start with a
//! library of another major.
fn main() {
    println!("cargo:rerun-if-changed=../src/types.rs");
    let types = std::fs::read_to_string("../src/types.rs").expect("ffi/src/types.rs is readable");
    let major = types
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("pub const BARLINK_ABI_VERSION_MAJOR: u32 = ")?
                .strip_suffix(';')?
                .parse::<u32>()
                .ok()
        })
        .expect("ffi/src/types.rs defines BARLINK_ABI_VERSION_MAJOR as a u32 literal");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libbarlink_c.so.{major}");
    }
}
