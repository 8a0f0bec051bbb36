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
use std::sync::{Mutex, OnceLock, PoisonError};

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

    /// The bytes of `range`, read in place: a slice of that range only, so
    /// that it aliases nothing written meanwhile elsewhere in the buffer.
    pub fn range(&self, range: std::ops::Range<usize>) -> &[u8] {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "the range lies in the buffer"
        );
        if range.is_empty() {
            return &[];
        }
        // SAFETY: as in `bytes`; the range lies in the `len` bytes
        // (checked above).
        unsafe {
            std::slice::from_raw_parts(self.view.buf.cast::<u8>().add(range.start), range.len())
        }
    }

    /// The bytes of `range`, to write in place (a view got `writable`): a
    /// slice of that range only, like [`BufferView::range`].
    pub fn range_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        assert!(
            self.view.readonly == 0 && range.start <= range.end && range.end <= self.len(),
            "the buffer was checked to be writable, and the range lies in it"
        );
        if range.is_empty() {
            return &mut [];
        }
        // SAFETY: as in `bytes_mut`; the range lies in the `len` bytes
        // (checked above).
        unsafe {
            std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>().add(range.start), range.len())
        }
    }

    /// Lends `range` of the buffer (a view got `writable`) to a link as a
    /// receive target, so that a message lands there with no copy after
    /// the checked one out of the medium.
    ///
    /// # Safety
    /// The caller keeps this view alive and leaves `range` alone (no
    /// slice of it from [`BufferView::bytes_mut`] or
    /// [`BufferView::range_mut`], and no other lent range over it) until
    /// the link has handed the target back or dropped it: the link writes
    /// the range whenever it is driven until then.
    ///
    /// `buffer_len` is the target's [`RecvTarget::buffer_len`] hint (0:
    /// the message's own length decides how the medium writes it).
    ///
    /// [`RecvTarget::buffer_len`]: barlink_transport::RecvTarget::buffer_len
    pub unsafe fn lend(&mut self, range: std::ops::Range<usize>, buffer_len: usize) -> LentRange {
        assert!(
            self.view.readonly == 0 && range.start <= range.end && range.end <= self.len(),
            "the buffer was checked to be writable, and the range lies in it"
        );
        LentRange {
            // In bounds: checked above.
            ptr: self.view.buf.cast::<u8>().wrapping_add(range.start),
            len: range.end - range.start,
            buffer_len,
        }
    }

    /// The buffer's bytes lent to a link for one send call: the link reads
    /// them in place until [`SendLoan::back_up`] puts a copy in their
    /// place.
    ///
    /// # Safety
    /// The caller keeps this view held while the loan may read it: until
    /// the link let go of the loan, or until a backup is in place. The
    /// link reads the loan's bytes only under one lock, under which the
    /// backup is put in place and the link's count checked before the
    /// view is released, so that the link never reads the view after it
    /// is released; the view's holder may read it without the lock.
    pub unsafe fn lend_to_send(&self) -> SendLoan {
        SendLoan {
            ptr: self.view.buf.cast::<u8>(),
            len: self.len(),
            backup: OnceLock::new(),
        }
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

/// A buffer's bytes lent to a link for one send call (see
/// [`BufferView::lend_to_send`]), and the copy that takes their place if
/// the call returns before the link let go of them.
#[derive(Debug)]
pub struct SendLoan {
    ptr: *const u8,
    len: usize,
    backup: OnceLock<Vec<u8>>,
}

// SAFETY: only the address and length are stored; whichever thread
// drives the link reads through them under the contract of
// `BufferView::lend_to_send`, which does not depend on the thread.
unsafe impl Send for SendLoan {}
// SAFETY: as for Send; the copy is set once, through `OnceLock`.
unsafe impl Sync for SendLoan {}

impl SendLoan {
    /// The bytes: the copy once there is one, else the caller's, in place.
    pub fn bytes(&self) -> &[u8] {
        if let Some(copy) = self.backup.get() {
            return copy;
        }
        if self.len == 0 {
            return &[];
        }
        // SAFETY: no copy yet, so by `lend_to_send`'s contract the view
        // holding `len` bytes at `ptr` is still held.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Puts a copy of the caller's bytes in their place (once); whether
    /// it copied now. After it, the loan no longer reads the view.
    pub fn back_up(&self) -> bool {
        if self.backup.get().is_some() {
            return false;
        }
        self.back_up_with(self.bytes().to_vec())
    }

    /// As [`SendLoan::back_up`], with the copy made already (of these
    /// very bytes, while the view was held).
    pub fn back_up_with(&self, copy: Vec<u8>) -> bool {
        debug_assert_eq!(copy.len(), self.len);
        self.backup.set(copy).is_ok()
    }

    /// Whether a copy is in the bytes' place.
    pub fn is_backed_up(&self) -> bool {
        self.backup.get().is_some()
    }
}

/// A range of a writable [`BufferView`] lent to a link as a receive
/// target (see [`BufferView::lend`]).
#[derive(Debug)]
pub struct LentRange {
    ptr: *mut u8,
    len: usize,
    /// The length of the buffer this range is part of, as a hint for how
    /// to write it (see `BufferView::lend`).
    buffer_len: usize,
}

// SAFETY: only the address and length are stored; whichever thread
// drives the link writes through them under the contract of
// `BufferView::lend`, which does not depend on the thread.
unsafe impl Send for LentRange {}

impl barlink_transport::RecvTarget for LentRange {
    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr..ptr+len` lies in a writable view's memory (checked
        // by `lend`), which by `lend`'s contract stays valid and is
        // touched by nothing else while the link holds this target.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn buffer_len(&self) -> u64 {
        self.buffer_len as u64
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
        drop(self.take());
    }

    /// What was buried, for a caller that holds the GIL to drop.
    pub fn take(&self) -> Vec<BufferView> {
        self.0.take_all()
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
    crate::exit::detached(py, move || {
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

/// A writable view received into in order, its ranges lent to one link as
/// receive targets: a range lent is not touched here until the link hands
/// it back with its message ([`LandingView::landed`]) or this takes it back
/// ([`LandingView::take_back_all`]), and dropping the view takes back
/// whatever is still lent first. That is `BufferView::lend`'s contract,
/// kept by construction.
pub struct LandingView {
    view: BufferView,
    shared: std::sync::Arc<crate::link::Shared>,
    /// Lent ranges, in the order posted.
    lent: std::collections::VecDeque<(barlink_transport::PostId, std::ops::Range<usize>)>,
    /// Whether the whole view is filled before anyone reads it, so its
    /// ranges may be written around the cache when it is large.
    filled_unread: bool,
}

impl std::fmt::Debug for LandingView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LandingView")
            .field("view", &self.view)
            .field("lent", &self.lent.len())
            .finish_non_exhaustive()
    }
}

impl LandingView {
    /// `view` (got writable) receives over the link of `shared`.
    pub fn new(view: BufferView, shared: std::sync::Arc<crate::link::Shared>) -> LandingView {
        LandingView {
            view,
            shared,
            lent: std::collections::VecDeque::new(),
            filled_unread: false,
        }
    }

    /// Says that nothing reads the view's bytes until all of it has
    /// landed (no chunk is forwarded or combined as it arrives): its
    /// ranges are then lent as parts of one buffer of its length, which
    /// the ring link writes around the cache when that is large.
    pub fn filled_before_read(&mut self) {
        self.filled_unread = true;
    }

    pub fn len(&self) -> usize {
        self.view.len()
    }

    pub fn span(&self) -> std::ops::Range<usize> {
        self.view.span()
    }

    /// Ranges lent and not yet handed back.
    pub fn lent(&self) -> usize {
        self.lent.len()
    }

    /// Lends `range` to the link of `conn` (the link `shared` holds,
    /// locked by the caller) for the next message that fits it.
    pub fn lend(
        &mut self,
        conn: &mut barlink::Connection<crate::link::Payload>,
        range: std::ops::Range<usize>,
    ) -> barlink_transport::PostId {
        self.lend_as(conn, range, |lent| Box::new(lent))
    }

    /// Lends `range` as [`LandingView::lend`] does, as the target `wrap`
    /// makes of it (a combining one, say).
    pub fn lend_as(
        &mut self,
        conn: &mut barlink::Connection<crate::link::Payload>,
        range: std::ops::Range<usize>,
        wrap: impl FnOnce(LentRange) -> Box<dyn barlink_transport::RecvTarget>,
    ) -> barlink_transport::PostId {
        assert!(
            !self.lent.iter().any(|(_, r)| overlap(r, &range)),
            "a range is lent once"
        );
        let buffer_len = if self.filled_unread { self.len() } else { 0 };
        // SAFETY: the view lives in `self`, whose drop takes the range back
        // first; the range overlaps no other lent one (checked above); and
        // `range_mut` refuses a range that overlaps a lent one, so nothing
        // here touches it until the link hands it back. Other views of the
        // same memory are kept off it by their users (a chain's halves
        // wait for an earlier overlapping one to complete).
        let target = unsafe { self.view.lend(range.clone(), buffer_len) };
        let id = conn.post_recv(wrap(target));
        self.lent.push_back((id, range));
        id
    }

    /// Whether target `id` is one of the ranges this view lent.
    pub fn holds(&self, id: barlink_transport::PostId) -> bool {
        self.lent.iter().any(|(lent, _)| *lent == id)
    }

    /// The link handed back target `id` with its message: the range it
    /// was lent for, if `id` is the oldest range lent (targets are taken
    /// in the order posted).
    pub fn landed(&mut self, id: barlink_transport::PostId) -> Option<std::ops::Range<usize>> {
        if self.lent.front().is_some_and(|(first, _)| *first == id) {
            return self.lent.pop_front().map(|(_, range)| range);
        }
        None
    }

    /// Takes back the oldest range lent, which its message passed by (it
    /// arrived elsewhere); the others stay lent.
    pub fn take_back_first(&mut self, conn: &mut barlink::Connection<crate::link::Payload>) {
        if let Some((id, _)) = self.lent.pop_front() {
            let _ = conn.unpost_recv(id);
        }
    }

    /// Takes every lent range back from the link (`conn`, `None` once the
    /// link is gone from its `Shared`: it was dropped with them, or
    /// `Link.close` took them back before closing it). A message that landed in one and
    /// was not taken yet is copied out by the link and keeps its place.
    pub fn take_back_all(&mut self, conn: Option<&mut barlink::Connection<crate::link::Payload>>) {
        if let Some(conn) = conn {
            for (id, _) in &self.lent {
                let _ = conn.unpost_recv(*id);
            }
        }
        self.lent.clear();
    }

    /// The bytes of `range`, to write in place; only while no lent range
    /// overlaps it.
    pub fn range_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        assert!(
            !self.lent.iter().any(|(_, r)| overlap(r, &range)),
            "lent ranges are taken back before the view is written here"
        );
        self.view.range_mut(range)
    }
}

impl Drop for LandingView {
    fn drop(&mut self) {
        if self.lent.is_empty() {
            return;
        }
        let shared = std::sync::Arc::clone(&self.shared);
        let mut state = shared.lock();
        self.take_back_all(state.conn.as_mut());
    }
}

/// Whether two byte ranges share a byte.
pub fn overlap(a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}
