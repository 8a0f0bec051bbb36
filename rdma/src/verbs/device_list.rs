//! The device list (`ibv_get_device_list`): the names of the devices, and
//! the walk over the list that [`Context`](super::context::Context) opens
//! a device from.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int};

use crate::error::RdmaError;
use crate::sys::{self, Verbs};

/// The names of the RDMA devices libibverbs sees (`ibv_get_device_list`),
/// possibly none. Use [`crate::device::devices`] for full discovery.
pub fn device_names() -> Result<Vec<String>, RdmaError> {
    let v = sys::verbs()?;
    with_device_list(v, |list| {
        Ok(list
            .iter()
            .map(|&dev| {
                // SAFETY: `dev` is an element of the live list; the name is
                // a NUL-terminated string inside the device struct.
                unsafe { device_name(v, dev) }
            })
            .collect())
    })
}

/// Runs `f` over the device list, freed afterwards.
pub(super) fn with_device_list<T>(
    v: &'static Verbs,
    f: impl FnOnce(&[*mut sys::ibv_device]) -> Result<T, RdmaError>,
) -> Result<T, RdmaError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned list is freed below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        let errno = sys::errno();
        return Err(RdmaError::NoDevice {
            reason: format!(
                "ibv_get_device_list failed: {} (errno {errno}){}",
                crate::error::strerror(errno),
                if errno == libc::ENOSYS {
                    " -- the kernel has no RDMA (ib_uverbs) support"
                } else {
                    ""
                }
            ),
        });
    }
    let n = usize::try_from(n).unwrap_or(0);
    // SAFETY: the library returned an array of `n` device pointers (plus a
    // terminating null), live until `free_device_list`.
    let devices = unsafe { std::slice::from_raw_parts(list, n) };
    let result = f(devices);
    // SAFETY: `list` came from `get_device_list` and is freed once; contexts
    // opened from its devices stay valid (the library refcounts them).
    unsafe { (v.free_device_list)(list) };
    result
}

/// # Safety
/// `dev` must be a live device of a device list.
pub(super) unsafe fn device_name(v: &Verbs, dev: *mut sys::ibv_device) -> String {
    // SAFETY: per this function's contract; the library returns a pointer
    // into the device struct (NUL-terminated) or null.
    let name = unsafe { (v.get_device_name)(dev) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (see above), valid while `dev` is.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}
