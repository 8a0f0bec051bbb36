//! Python objects' memory, read and written in place through the buffer
//! protocol: the one module of this crate with `unsafe` (it calls the
//! CPython C API and makes slices of memory Python owns).
//!
//! A [`BufferView`] holds the exporter's buffer (and a reference to the
//! exporter) until it is released, so the memory stays where it is: a
//! `bytearray` cannot be resized under it, a numpy array not freed. Views
//! a link holds for zero-copy sends are released with the GIL held, never
//! from inside a call that let the GIL go ([`Graveyard`]).
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// One exporter's buffer, contiguous bytes, held until dropped.
pub struct BufferView {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: a Py_buffer is plain data plus a strong reference to its
// exporter; the memory it describes stays valid until PyBuffer_Release,
// which only `Drop` calls, with the GIL held. Moving the view to another
// thread changes none of that.
unsafe impl Send for BufferView {}
// SAFETY: shared access only reads the memory (`bytes`); writing needs
// `&mut self`.
unsafe impl Sync for BufferView {}

impl std::fmt::Debug for BufferView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferView")
            .field("len", &self.len())
            .field("readonly", &self.is_readonly())
            .finish()
    }
}

impl BufferView {
    /// The contiguous bytes of `obj` (any buffer exporter: bytes,
    /// bytearray, memoryview, array.array, a C-contiguous numpy array);
    /// `writable` asks for a buffer this side may write.
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<BufferView> {
        let flags: c_int = if writable {
            ffi::PyBUF_WRITABLE
        } else {
            ffi::PyBUF_SIMPLE
        };
        let mut view = Box::new(MaybeUninit::<ffi::Py_buffer>::zeroed());
        // SAFETY: `obj` is a live object (a `Bound` proves the GIL is
        // held) and `view` is writable memory of a Py_buffer's size.
        let status = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if status != 0 {
            let cause = PyErr::take(obj.py()).map(|e| e.to_string());
            let kind = obj
                .get_type()
                .name()
                .map_or_else(|_| "object".to_string(), |n| n.to_string());
            let why = cause.unwrap_or_else(|| "it refused".to_string());
            return Err(if writable {
                PyTypeError::new_err(format!(
                    "a writable, contiguous buffer is needed (bytearray, numpy array, \
                     memoryview of one), not {kind}: {why}"
                ))
            } else {
                PyTypeError::new_err(format!(
                    "an object with the buffer protocol and contiguous memory is needed \
                     (bytes, bytearray, memoryview, numpy array; torch tensors via .numpy()), \
                     not {kind}: {why}"
                ))
            });
        }
        // SAFETY: PyObject_GetBuffer succeeded, so it filled the view in.
        let view = unsafe { Box::from_raw(Box::into_raw(view).cast::<ffi::Py_buffer>()) };
        let view = BufferView { view };
        if view.view.len < 0 {
            return Err(PyBufferError::new_err(
                "the exporter gave a negative length",
            ));
        }
        Ok(view)
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        // `get` refused a negative length.
        self.view.len as usize
    }

    /// Where the bytes lie, as addresses, to tell whether two views
    /// overlap.
    pub fn span(&self) -> std::ops::Range<usize> {
        let start = self.view.buf as usize;
        start..start + self.len()
    }

    /// Whether the exporter allows no writes (bytes, a read-only
    /// memoryview): such memory cannot change while the view is held.
    pub fn is_readonly(&self) -> bool {
        self.view.readonly != 0
    }

    /// The bytes, read in place.
    pub fn bytes(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: the exporter promised `len` contiguous bytes at `buf`
        // (PyBUF_SIMPLE), valid until the view is released, which happens
        // only when `self` is dropped; the borrow ends before that.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), self.len()) }
    }

    /// The bytes, to write in place (a view got `writable`). Python code
    /// may touch the same memory meanwhile, as it may during any C
    /// extension's write; the collectives that use this hold the tensors.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        assert!(
            self.view.readonly == 0,
            "the buffer was checked to be writable"
        );
        if self.len() == 0 {
            return &mut [];
        }
        // SAFETY: the view is writable (PyBUF_WRITABLE was granted) and
        // holds `len` contiguous bytes at `buf`, valid until the view is
        // released in `drop`; `&mut self` keeps this the only slice made
        // from it while the borrow lasts.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), self.len()) }
    }

    /// Copies `src` to the start of the buffer (a view got `writable`).
    pub fn write_prefix(&mut self, src: &[u8]) {
        assert!(
            src.len() <= self.len() && self.view.readonly == 0,
            "the buffer was checked to be writable and large enough"
        );
        if src.is_empty() {
            return;
        }
        // SAFETY: the view is writable (PyBUF_WRITABLE was granted) and
        // holds `len >= src.len()` contiguous bytes; `src` is Rust memory,
        // so the two cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.view.buf.cast::<u8>(), src.len());
        }
    }
}

impl Drop for BufferView {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: the view was filled in by PyObject_GetBuffer and is
            // released exactly once, here, with the GIL held.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// Items handed from calls that run without the GIL to the next call that
/// holds it: a list behind a mutex, with a count read first so that most
/// calls, finding nothing, take no lock.
#[derive(Debug)]
struct Handoff<T> {
    items: Mutex<Vec<T>>,
    count: AtomicUsize,
    limit: usize,
}

impl<T> Handoff<T> {
    fn new(limit: usize) -> Handoff<T> {
        Handoff {
            items: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
            limit,
        }
    }

    /// Keeps `item`, or drops it if `limit` items wait already.
    fn put(&self, item: T) {
        let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        if items.len() < self.limit {
            items.push(item);
            self.count.fetch_add(1, Ordering::Release);
        }
    }

    /// Everything put so far (a put racing this call is taken now or by
    /// the next call).
    fn take_all(&self) -> Vec<T> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.count.store(0, Ordering::Relaxed);
        std::mem::take(&mut *self.items.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Views a link no longer needs, kept until a call that holds the GIL
/// releases them: the engine drops a zero-copy message when its peer
/// acknowledges it, inside calls that run without the GIL.
#[derive(Debug)]
pub struct Graveyard(Handoff<BufferView>);

impl Default for Graveyard {
    fn default() -> Self {
        Graveyard(Handoff::new(usize::MAX))
    }
}

impl Graveyard {
    pub fn bury(&self, view: BufferView) {
        self.0.put(view);
    }

    /// Releases what was buried (call with the GIL held).
    pub fn release(&self, _py: Python<'_>) {
        drop(self.0.take_all());
    }
}

/// A new `bytes` holding a copy of `data`, copied without the GIL when it
/// is large (`detach_from` bytes or more). Unlike `PyBytes::new_with`, the
/// object's memory is not zeroed first: it is written once.
pub fn bytes_from<'py>(
    py: Python<'py>,
    data: &[u8],
    detach_from: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    if data.len() < detach_from {
        return Ok(PyBytes::new(py, data));
    }
    let len = ffi::Py_ssize_t::try_from(data.len())
        .map_err(|_| PyBufferError::new_err("a message too large for bytes"))?;
    // SAFETY: a NULL source asks CPython for an uninitialised object of
    // `len` bytes; the GIL is held (`py`).
    let raw = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), len) };
    // SAFETY: `raw` is a new reference or NULL with an exception set.
    let bytes = unsafe { Bound::from_owned_ptr_or_err(py, raw)? }.cast_into::<PyBytes>()?;
    let target = SendPtr(
        // SAFETY: `bytes` is a bytes object; its buffer holds `len` bytes.
        unsafe { ffi::PyBytes_AsString(bytes.as_ptr()) }.cast::<u8>(),
    );
    py.detach(move || {
        // SAFETY: nobody else sees the new object yet, so writing its
        // `len` bytes (from Rust memory, no overlap) races nothing; the
        // object stays alive (`bytes`) across this call.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), target.get(), data.len()) }
    });
    Ok(bytes)
}

/// A pointer into a new, unshared object, carried into a call that runs
/// without the GIL.
struct SendPtr(*mut u8);

impl SendPtr {
    fn get(&self) -> *mut u8 {
        self.0
    }
}

// SAFETY: the object it points into is reachable from no other thread
// until the call that writes through it returns.
unsafe impl Send for SendPtr {}
// SAFETY: as for Send: only the one call holds it.
unsafe impl Sync for SendPtr {}

/// Fills `view` to export `len` bytes at `ptr`, read-only, owned by
/// `owner` (a Message), for its `__getbuffer__`.
///
/// # Safety
/// `view` is the pointer CPython passed to `__getbuffer__`; `ptr..ptr+len`
/// stays valid and unchanged while `owner` lives.
pub unsafe fn export_readonly(
    owner: &Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    ptr: *const u8,
    len: usize,
    flags: c_int,
) -> PyResult<()> {
    if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
        return Err(PyBufferError::new_err(
            "a received message is read-only: recv_into() writes into a buffer of yours",
        ));
    }
    let len = ffi::Py_ssize_t::try_from(len)
        .map_err(|_| PyBufferError::new_err("a message too large to export"))?;
    // SAFETY: the caller's contract; PyBuffer_FillInfo takes a new
    // reference to `owner`, which keeps the memory alive until the
    // consumer releases the view.
    let status = unsafe {
        ffi::PyBuffer_FillInfo(view, owner.as_ptr(), ptr.cast_mut().cast(), len, 1, flags)
    };
    if status != 0 {
        return Err(PyErr::take(owner.py())
            .unwrap_or_else(|| PyBufferError::new_err("PyBuffer_FillInfo failed")));
    }
    Ok(())
}

/// Received buffers given back by dropped Messages and copied-out
/// receives, for the link to reuse (no allocation, no page faults for the
/// next message of the size). The engine keeps its own within its budget.
#[derive(Debug)]
pub struct Spares(Handoff<Vec<u8>>);

impl Default for Spares {
    fn default() -> Self {
        Spares(Handoff::new(8))
    }
}

impl Spares {
    pub fn keep(&self, buffer: Vec<u8>) {
        self.0.put(buffer);
    }

    /// Hands what was kept to the link.
    pub fn give_back<B: AsRef<[u8]>>(&self, conn: &mut Option<barlink::Connection<B>>) {
        let Some(conn) = conn else {
            return;
        };
        for buffer in self.0.take_all() {
            conn.recycle(buffer);
        }
    }
}

/// A received message, read in place: its memory exported read-only
/// through the buffer protocol (`memoryview(m)`, `numpy.frombuffer(m)`),
/// given back to the link for reuse when the last view of it is gone.
#[pyclass(module = "barlink", frozen)]
#[derive(Debug)]
pub struct Message {
    data: Vec<u8>,
    spares: std::sync::Arc<Spares>,
}

impl Message {
    pub fn new(data: Vec<u8>, spares: std::sync::Arc<Spares>) -> Message {
        Message { data, spares }
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        self.spares.keep(std::mem::take(&mut self.data));
    }
}

#[pymethods]
impl Message {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    /// A copy as bytes.
    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, pyo3::types::PyBytes> {
        pyo3::types::PyBytes::new(py, &self.data)
    }

    /// A copy as bytes.
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, pyo3::types::PyBytes> {
        pyo3::types::PyBytes::new(py, &self.data)
    }

    fn __repr__(&self) -> String {
        format!("<barlink.Message {} bytes>", self.data.len())
    }

    /// # Safety
    /// Called by CPython with a view to fill in.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (ptr, len) = {
            let message = slf.get();
            (message.data.as_ptr(), message.data.len())
        };
        // SAFETY: the Message is frozen, so `data` never changes or moves
        // while it lives, and the view holds a reference to it.
        unsafe { export_readonly(slf.as_any(), view, ptr, len, flags) }
    }
}
