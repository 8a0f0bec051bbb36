//! Handles: keys into one process-wide registry, never pointers.
//!
//! A handle's value is `kind << 56 | id`, where `id` comes from a counter
//! that never repeats (2^56 handles before it would wrap). A C caller gets it
//! as an opaque pointer that nobody dereferences. Every call looks the value
//! up: a null, closed, forged or wrong-kind handle is an error with a message
//! that says which, never a dereference of freed memory. Closing removes the
//! entry; the object itself is reference-counted, so a thread still inside a
//! call on it finishes safely (and sees it closed at its next step). Each
//! thread remembers its last few lookups of links and of buffers (strong
//! references, so that a call on an object it uses touches no shared
//! count); a removal makes every thread's remembered lookups of that kind
//! stale, and a thread lets them go at its next lookup.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

use crate::error::{Error, Result};
use crate::ids::IdMap;
use crate::link::LinkCell;
use crate::payload::Region;
use crate::peer::ListenerCell;
use crate::types::barlink_status::BARLINK_INVALID_HANDLE;

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Link = 1,
    Listener = 2,
    Buffer = 3,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Link => "link",
            Kind::Listener => "listener",
            Kind::Buffer => "buffer",
        }
    }

    fn from_tag(tag: u64) -> Option<Kind> {
        match tag {
            1 => Some(Kind::Link),
            2 => Some(Kind::Listener),
            3 => Some(Kind::Buffer),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Object {
    Link(Arc<LinkCell>),
    Listener(Arc<ListenerCell>),
    Buffer(Arc<Region>),
}

const ID_BITS: u32 = 56;
const ID_MASK: u64 = (1 << ID_BITS) - 1;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static OBJECTS: LazyLock<RwLock<Objects>> = LazyLock::new(|| RwLock::new(Objects::default()));

/// Handles by value.
type Objects = IdMap<Object>;

fn objects_read() -> std::sync::RwLockReadGuard<'static, Objects> {
    // Nothing panics while holding the lock except on allocation failure,
    // which aborts: a poisoned map is still consistent.
    OBJECTS
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn objects_write() -> std::sync::RwLockWriteGuard<'static, Objects> {
    OBJECTS
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn insert(kind: Kind, object: Object) -> Result<u64> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    if id > ID_MASK {
        return Err(Error::new(
            BARLINK_INVALID_HANDLE,
            "this process has used up its 2^56 handles",
        ));
    }
    let value = ((kind as u64) << ID_BITS) | id;
    objects_write().insert(value, object);
    Ok(value)
}

/// Why `value` names no live object of `kind`.
fn explain(value: u64, kind: Kind) -> Error {
    let name = kind.name();
    if value == 0 {
        return Error::new(BARLINK_INVALID_HANDLE, format!("the {name} handle is NULL"));
    }
    let id = value & ID_MASK;
    match Kind::from_tag(value >> ID_BITS) {
        Some(found) if found != kind => Error::new(
            BARLINK_INVALID_HANDLE,
            format!(
                "a {} handle was passed where a {name} handle belongs",
                found.name()
            ),
        ),
        Some(_) if id != 0 && id < NEXT_ID.load(Ordering::Relaxed) => Error::new(
            BARLINK_INVALID_HANDLE,
            format!("the {name} handle was already closed (use after close, or a double close)"),
        ),
        _ => Error::new(
            BARLINK_INVALID_HANDLE,
            format!("{value:#x} is not a barlink {name} handle (uninitialized or corrupted?)"),
        ),
    }
}

fn get(value: u64, kind: Kind) -> Result<Object> {
    if value >> ID_BITS != kind as u64 {
        return Err(explain(value, kind));
    }
    objects_read()
        .get(&value)
        .cloned()
        .ok_or_else(|| explain(value, kind))
}

fn remove(value: u64, kind: Kind) -> Result<Object> {
    // Checked before touching the map: a handle of another kind must not
    // remove the object it names.
    if value >> ID_BITS != kind as u64 {
        return Err(explain(value, kind));
    }
    let removed = objects_write()
        .remove(&value)
        .ok_or_else(|| explain(value, kind));
    if removed.is_ok() {
        // After the removal: a thread that reads the old count may still
        // use its cached cell, as a call that began before the close would.
        if let Some(removals) = cached_removals(kind) {
            removals.fetch_add(1, Ordering::Release);
        }
        // The closing thread lets its reference go now (other threads at
        // their next lookup of a link).
        if kind == Kind::Link {
            forget_cached(&LAST_LINKS);
        }
    }
    removed
}

/// Handles of each cached kind removed so far: a lookup a thread cached
/// is good only while its kind's count has not moved since it was made.
/// One count a kind, so that a server deregistering buffers keeps its
/// links' lookups.
static LINK_REMOVALS: AtomicU64 = AtomicU64::new(0);
static BUFFER_REMOVALS: AtomicU64 = AtomicU64::new(0);

/// The removals count of a kind whose lookups threads cache (listeners'
/// are not: a listener is looked up once per accept).
fn cached_removals(kind: Kind) -> Option<&'static AtomicU64> {
    match kind {
        Kind::Link => Some(&LINK_REMOVALS),
        Kind::Buffer => Some(&BUFFER_REMOVALS),
        Kind::Listener => None,
    }
}

/// Lookups a thread remembers, per kind: a server thread often drives a
/// few links in turn (a request in from one, out to another), and sends
/// from a few registered buffers.
const CACHED: usize = 4;

/// A thread's last lookups of one kind of handle, the newest first: each
/// its handle value, its kind's removals count as read before the lookup,
/// and the object (`P`: a strong reference to it).
struct Recent<P> {
    entries: [Option<(u64, u64, P)>; CACHED],
}

impl<P> Recent<P> {
    const fn new() -> Recent<P> {
        Recent {
            entries: [None, None, None, None],
        }
    }

    /// What this thread looked `value` up as lately, if no handle of its
    /// kind was removed since.
    fn find(&self, value: u64, removals: u64) -> Option<&P> {
        self.entries.iter().find_map(|entry| match entry {
            Some((cached, seen, object)) if *cached == value && *seen == removals => Some(object),
            _ => None,
        })
    }

    fn remember(&mut self, value: u64, removals: u64, object: P) {
        // Entries from before a removal are let go: one may be the removed
        // object's (a strong reference would keep it), and the others are
        // looked up again at their next use.
        for entry in &mut self.entries {
            if entry.as_ref().is_some_and(|(_, seen, _)| *seen != removals) {
                *entry = None;
            }
        }
        // An entry for this handle is replaced, not kept beside the new
        // one, so live handles are not crowded out.
        let end = self
            .entries
            .iter()
            .position(|entry| entry.as_ref().is_none_or(|(cached, ..)| *cached == value))
            .unwrap_or(CACHED - 1);
        self.entries[..=end].rotate_right(1);
        self.entries[0] = Some((value, removals, object));
    }

    fn clear(&mut self) {
        self.entries = [None, None, None, None];
    }
}

/// A thread's cache of one kind's lookups.
type Cache<T> = std::thread::LocalKey<RefCell<Recent<Arc<T>>>>;

thread_local! {
    /// Every call on a link or buffer looks its handle up: with these, the
    /// registry's lock and hash stay out of the way, and so does the
    /// object's reference count (two atomic updates a lookup, on every
    /// message's way). Strong references: an object removed on another
    /// thread stays here until this thread's next lookup of its kind, so a
    /// close and a deregistration free what the object held themselves
    /// (the link, its messages and copies; the dma-buf mapping), leaving
    /// only an empty shell to wait.
    static LAST_LINKS: RefCell<Recent<Arc<LinkCell>>> = const { RefCell::new(Recent::new()) };
    static LAST_BUFFERS: RefCell<Recent<Arc<Region>>> = const { RefCell::new(Recent::new()) };
}

/// Runs `body` on the object `value` names: on this thread's cached
/// reference when it looked the handle up lately and no handle of its
/// kind was removed since, else on the registry's (remembered for the
/// next call). `unwrap` takes the object of its kind.
fn with_cached<T, R>(
    cache: &'static Cache<T>,
    removed: &AtomicU64,
    value: u64,
    kind: Kind,
    unwrap: impl FnOnce(Object) -> Option<Arc<T>>,
    body: impl FnOnce(&Arc<T>) -> Result<R>,
) -> Result<R> {
    // Read before the lookup (see `remove`).
    let removals = removed.load(Ordering::Acquire);
    let mut body = Some(body);
    // The body runs under the cache's shared borrow: a lookup inside it
    // still finds, and only a miss inside it goes unremembered.
    let cached = cache.try_with(|recent| {
        let recent = recent.try_borrow().ok()?;
        let object = recent.find(value, removals)?;
        body.take().map(|body| body(object))
    });
    if let Ok(Some(result)) = cached {
        return result;
    }
    match body.take() {
        Some(body) => look_up_and_remember(cache, removals, value, kind, unwrap, body),
        None => unreachable!("the body runs only when the cache answers"),
    }
}

/// [`with_cached`] when the thread's cache has no answer: the registry's
/// lookup, remembered for the next call. Out of the way of the calls'
/// own code, which every message runs.
#[cold]
#[inline(never)]
fn look_up_and_remember<T, R>(
    cache: &'static Cache<T>,
    removals: u64,
    value: u64,
    kind: Kind,
    unwrap: impl FnOnce(Object) -> Option<Arc<T>>,
    body: impl FnOnce(&Arc<T>) -> Result<R>,
) -> Result<R> {
    let object = unwrap(get(value, kind)?).ok_or_else(|| explain(value, kind))?;
    let _ = cache.try_with(|recent| {
        if let Ok(mut recent) = recent.try_borrow_mut() {
            recent.remember(value, removals, Arc::clone(&object));
        }
    });
    body(&object)
}

/// Lets go of this thread's cached lookups of `cache`'s kind (a removal
/// made them stale).
fn forget_cached<T>(cache: &'static Cache<T>) {
    let _ = cache.try_with(|recent| {
        if let Ok(mut recent) = recent.try_borrow_mut() {
            recent.clear();
        }
    });
}

/// Runs `body` on the link `value` names (see [`with_cached`]).
pub(crate) fn with_link<R>(
    value: u64,
    body: impl FnOnce(&Arc<LinkCell>) -> Result<R>,
) -> Result<R> {
    with_cached(
        &LAST_LINKS,
        &LINK_REMOVALS,
        value,
        Kind::Link,
        |object| match object {
            Object::Link(cell) => Some(cell),
            _ => None,
        },
        body,
    )
}

/// Runs `body` on the buffer `value` names (see [`with_cached`]).
pub(crate) fn with_buffer<R>(
    value: u64,
    body: impl FnOnce(&Arc<Region>) -> Result<R>,
) -> Result<R> {
    with_cached(
        &LAST_BUFFERS,
        &BUFFER_REMOVALS,
        value,
        Kind::Buffer,
        |object| match object {
            Object::Buffer(region) => Some(region),
            _ => None,
        },
        body,
    )
}

pub(crate) fn insert_link(cell: Arc<LinkCell>) -> Result<u64> {
    insert(Kind::Link, Object::Link(cell))
}

pub(crate) fn insert_listener(cell: Arc<ListenerCell>) -> Result<u64> {
    insert(Kind::Listener, Object::Listener(cell))
}

pub(crate) fn insert_buffer(region: Arc<Region>) -> Result<u64> {
    insert(Kind::Buffer, Object::Buffer(region))
}

pub(crate) fn link(value: u64) -> Result<Arc<LinkCell>> {
    with_link(value, |cell| Ok(Arc::clone(cell)))
}

pub(crate) fn listener(value: u64) -> Result<Arc<ListenerCell>> {
    match get(value, Kind::Listener)? {
        Object::Listener(cell) => Ok(cell),
        _ => Err(explain(value, Kind::Listener)),
    }
}

pub(crate) fn remove_link(value: u64) -> Result<Arc<LinkCell>> {
    match remove(value, Kind::Link)? {
        Object::Link(cell) => Ok(cell),
        _ => Err(explain(value, Kind::Link)),
    }
}

pub(crate) fn remove_listener(value: u64) -> Result<Arc<ListenerCell>> {
    match remove(value, Kind::Listener)? {
        Object::Listener(cell) => Ok(cell),
        _ => Err(explain(value, Kind::Listener)),
    }
}

/// Removes a buffer handle if `check` allows it, under the registry's
/// lock so that no lookup through the registry races in between; returns
/// what `check` gave, for the caller to drop after the lock. A thread
/// may still find the buffer in its cache meanwhile; `check`
/// (`Region::retire`) marks it dead under the region's own lock, so a
/// post from it is refused all the same.
pub(crate) fn remove_buffer_if<T>(
    value: u64,
    check: impl FnOnce(&Region) -> Result<T>,
) -> Result<T> {
    if value >> ID_BITS != Kind::Buffer as u64 {
        return Err(explain(value, Kind::Buffer));
    }
    let mut objects = objects_write();
    let checked = match objects.get(&value) {
        Some(Object::Buffer(region)) => check(region)?,
        _ => return Err(explain(value, Kind::Buffer)),
    };
    objects.remove(&value);
    // As in `remove`: no thread's cached lookup of it is good any more.
    BUFFER_REMOVALS.fetch_add(1, Ordering::Release);
    drop(objects);
    forget_cached(&LAST_BUFFERS);
    Ok(checked)
}
