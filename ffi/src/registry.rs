//! Handles: keys into one process-wide registry, never pointers.
//!
//! A handle's value is `kind << 56 | id`, where `id` comes from a counter
//! that never repeats (2^56 handles before it would wrap). A C caller gets it
//! as an opaque pointer that nobody dereferences. Every call looks the value
//! up: a null, closed, forged or wrong-kind handle is an error with a message
//! that says which, never a dereference of freed memory. Closing removes the
//! entry; the object itself is reference-counted, so a thread still inside a
//! call on it finishes safely (and sees it closed at its next step).
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, RwLock, Weak};

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
        REMOVALS.fetch_add(1, Ordering::Release);
    }
    removed
}

/// Handles removed so far: a link a thread cached is good only while this
/// has not moved since it was looked up.
static REMOVALS: AtomicU64 = AtomicU64::new(0);

/// Links a thread's lookups remember: a server thread often drives a few
/// links in turn (a request in from one, out to another).
const CACHED_LINKS: usize = 4;

/// One remembered lookup: its handle value, [`REMOVALS`] as read before
/// the lookup, and the cell.
type CachedLink = Option<(u64, u64, Weak<LinkCell>)>;

thread_local! {
    /// This thread's last link lookups, the newest first. Every call on a
    /// link looks it up; the registry's lock and hash then stay out of the
    /// way. Weak references: the cache never keeps a closed link's cell
    /// alive.
    static LAST_LINKS: RefCell<[CachedLink; CACHED_LINKS]> =
        const { RefCell::new([const { None }; CACHED_LINKS]) };
}

/// The cell this thread looked `value` up as lately, if no handle was
/// removed since.
fn cached_link(value: u64, removals: u64) -> Option<Arc<LinkCell>> {
    LAST_LINKS
        .try_with(|last| {
            let last = last.try_borrow().ok()?;
            last.iter().find_map(|entry| match entry {
                Some((cached, seen, cell)) if *cached == value && *seen == removals => {
                    cell.upgrade()
                }
                _ => None,
            })
        })
        .ok()
        .flatten()
}

fn cache_link(value: u64, removals: u64, cell: &Arc<LinkCell>) {
    let _ = LAST_LINKS.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut() {
            // An entry left stale for this handle by a removal elsewhere is
            // replaced, not kept beside the new one, so live links are not
            // crowded out.
            let end = last
                .iter()
                .position(|entry| entry.as_ref().is_some_and(|(cached, ..)| *cached == value))
                .unwrap_or(CACHED_LINKS - 1);
            last[..=end].rotate_right(1);
            last[0] = Some((value, removals, Arc::downgrade(cell)));
        }
    });
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
    // Read before the lookup (see `remove`).
    let removals = REMOVALS.load(Ordering::Acquire);
    if let Some(cell) = cached_link(value, removals) {
        return Ok(cell);
    }
    match get(value, Kind::Link)? {
        Object::Link(cell) => {
            cache_link(value, removals, &cell);
            Ok(cell)
        }
        _ => Err(explain(value, Kind::Link)),
    }
}

pub(crate) fn listener(value: u64) -> Result<Arc<ListenerCell>> {
    match get(value, Kind::Listener)? {
        Object::Listener(cell) => Ok(cell),
        _ => Err(explain(value, Kind::Listener)),
    }
}

pub(crate) fn buffer(value: u64) -> Result<Arc<Region>> {
    match get(value, Kind::Buffer)? {
        Object::Buffer(region) => Ok(region),
        _ => Err(explain(value, Kind::Buffer)),
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

/// Removes a buffer handle if `check` allows it (under the registry lock, so
/// no lookup can race in between).
pub(crate) fn remove_buffer_if(
    value: u64,
    check: impl FnOnce(&Region) -> Result<()>,
) -> Result<()> {
    if value >> ID_BITS != Kind::Buffer as u64 {
        return Err(explain(value, Kind::Buffer));
    }
    let mut objects = objects_write();
    match objects.get(&value) {
        Some(Object::Buffer(region)) => check(region)?,
        _ => return Err(explain(value, Kind::Buffer)),
    }
    objects.remove(&value);
    Ok(())
}
