//! RFC 1982 serial-number arithmetic, for the wrapping epochs and
//! transmission serials that packets carry.

/// `a` comes before `b` in RFC 1982 serial-number order (wrapping u32).
pub(crate) fn serial_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 1 << 31
}
