//! Review findings (placeholder while building).
mod common;
#[test]
fn builds() {}
