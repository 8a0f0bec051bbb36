//! `libbarlink_c.{so,a}`, barlink's C library: the extern functions of
//! [`barlink_ffi`], which `ffi/include/barlink.h` declares. This crate holds
//! no code of its own; it exists so that the C library is built from a
//! crate whose only crate types are the C library's (docs/ARCHITECTURE.md,
//! design change 86).
#![forbid(unsafe_code)]

pub use barlink_ffi::*;
