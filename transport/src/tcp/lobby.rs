//! Connections admitted apart: each client taken off a listening socket
//! is authenticated (and whatever else its admission asks) on a thread of
//! its own, and what it comes to waits here for a taker.
//!
//! Admitting one client after another let one that connected and said
//! nothing — no key needed for that — hold every other back for its
//! authentication limit, and a stream of them kept a server from linking
//! anyone. Here the client that proves itself first is taken first. At
//! most [`MAX_ADMITTING`] admissions run at once. When all are busy and a
//! new client waits, the longest-waiting admission is cut off if it has
//! had [`ADMISSION_PATIENCE`] (a client that holds the key takes a few
//! round trips); otherwise new clients wait in the kernel's queue until a
//! place frees, so a burst of honest clients is admitted in turn.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::channel::{ADMISSION_FLOOR, Channel, ChannelError, ChannelListener, ChannelOptions};

/// Admissions running at once at most (each a thread and a descriptor).
pub(super) const MAX_ADMITTING: usize = 64;

/// How long an admission runs before, with every place taken and a new
/// client waiting, it may be cut off to make room: long enough for a
/// handshake over a slow path (a few round trips), short enough that
/// silent clients must keep coming at [`MAX_ADMITTING`] a second to keep
/// others out.
const ADMISSION_PATIENCE: Duration = Duration::from_secs(1);

/// Longest a taker waits before it looks at the socket again.
const LOOK: Duration = Duration::from_millis(5);

/// A connection being admitted.
#[derive(Debug)]
struct Admitting {
    id: u64,
    since: Instant,
    /// The same socket, to cut the admission off.
    socket: TcpStream,
}

/// What the takers and the admissions share.
#[derive(Debug)]
struct Hall<T> {
    /// Admitted connections waiting for a taker, oldest first, with when
    /// each was admitted.
    ready: VecDeque<(Instant, T)>,
    admitting: Vec<Admitting>,
    next_admission: u64,
    /// Recent admissions that failed on the client's side, by admission
    /// id: each taker reports only those it started.
    refused: VecDeque<(u64, ChannelError)>,
}

/// Failed admissions remembered for their takers.
const REFUSALS_KEPT: usize = 64;

/// Admitted connections of type `T` waiting for their takers, and the
/// admissions under way.
#[derive(Debug)]
pub(super) struct Lobby<T> {
    shared: Arc<(Mutex<Hall<T>>, Condvar)>,
    /// How long an admitted connection waits for a taker, and how many
    /// wait at most (past that the oldest goes).
    kept_for: Duration,
    max_kept: usize,
}

/// What a taker asks of [`Lobby::next`].
pub(super) struct Take<'a, T> {
    pub(super) listener: &'a ChannelListener,
    pub(super) timeout: Duration,
    /// The taker's limits. An admission it starts has its
    /// `auth_timeout` in all (authentication and whatever `admit` reads),
    /// not the taker's deadline: another taker may take what it admits.
    pub(super) options: &'a ChannelOptions,
    /// Which admitted connections this taker takes.
    pub(super) pick: &'a dyn Fn(&T) -> bool,
    /// What an admission does with a new connection, on its thread.
    pub(super) admit: Arc<dyn Fn(Channel) -> Result<T, ChannelError> + Send + Sync>,
    /// Whether a refusal during the wait is the error when nothing came.
    pub(super) refusal_is_error: bool,
}

impl<T: Send + 'static> Lobby<T> {
    pub(super) fn new(kept_for: Duration, max_kept: usize) -> Lobby<T> {
        Lobby {
            shared: Arc::new((
                Mutex::new(Hall {
                    ready: VecDeque::new(),
                    admitting: Vec::new(),
                    next_admission: 0,
                    refused: VecDeque::new(),
                }),
                Condvar::new(),
            )),
            kept_for,
            max_kept,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Hall<T>> {
        lock(&self.shared.0)
    }

    /// An admitted connection `take.pick` accepts: one waiting here, else
    /// one taken off the socket and admitted within `take.timeout` (zero:
    /// one look). Others admitted meanwhile wait here for their takers.
    /// New clients are taken off the socket only until the timeout; one
    /// this call took keeps at least [`ADMISSION_FLOOR`] to prove itself,
    /// so that a poll does not take a waiting client only to leave it
    /// unanswered. So the call ends by `timeout` plus that floor.
    pub(super) fn next(&self, take: &Take<'_, T>) -> Result<Option<T>, ChannelError> {
        let deadline = Instant::now() + take.timeout;
        let mut started: Vec<u64> = Vec::new();
        let mut first_look = true;
        loop {
            if let Some(taken) = self.take_ready(take.pick) {
                return Ok(Some(taken));
            }
            if first_look || Instant::now() < deadline {
                first_look = false;
                while self.has_room(take.listener)
                    && let Some(channel) = take.listener.try_accept(take.options)?
                {
                    if let Some(id) = self.admit_apart(channel, take) {
                        started.push(id);
                    }
                }
            }
            let now = Instant::now();
            let mut hall = self.lock();
            if hall.ready.iter().any(|(_, ready)| (take.pick)(ready)) {
                continue;
            }
            // Admissions this call began that may still finish.
            let floor = hall
                .admitting
                .iter()
                .filter(|admitting| started.contains(&admitting.id))
                .map(|admitting| admitting.since + ADMISSION_FLOOR)
                .max();
            let end = floor.map_or(deadline, |floor| deadline.max(floor));
            if now >= end {
                let refusal = hall
                    .refused
                    .iter()
                    .rposition(|(id, _)| started.contains(id))
                    .and_then(|at| hall.refused.remove(at));
                return match refusal {
                    Some((_, refusal)) if take.refusal_is_error => Err(refusal),
                    _ => Ok(None),
                };
            }
            let wait = (end - now).min(LOOK);
            drop(
                self.shared
                    .1
                    .wait_timeout(hall, wait)
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
    }

    /// Whether another admission may start. Two bounds: admissions under
    /// way ([`MAX_ADMITTING`]), and those plus the admitted connections
    /// nobody has taken yet (`max_kept`), so that admissions never run
    /// ahead of the takers further than what can be kept. At either bound,
    /// room is made only for a client that waits on the socket, and only
    /// from one that has had its [`ADMISSION_PATIENCE`]: the longest
    /// admission under way is cut off, or the oldest connection nobody
    /// took is dropped. Otherwise new clients wait in the kernel's queue.
    fn has_room(&self, listener: &ChannelListener) -> bool {
        let mut hall = self.lock();
        drop_stale(&mut hall, self.kept_for);
        if hall.admitting.len() >= MAX_ADMITTING {
            let oldest = hall
                .admitting
                .iter()
                .enumerate()
                .min_by_key(|(_, admitting)| admitting.since)
                .map(|(at, admitting)| (at, admitting.since));
            match oldest {
                Some((at, since))
                    if since.elapsed() >= ADMISSION_PATIENCE && listener.has_waiting_client() =>
                {
                    let cut = hall.admitting.swap_remove(at);
                    tracing::warn!(
                        waited = ?since.elapsed(),
                        "cut off the admission that waited longest: too many clients at once"
                    );
                    let _ = cut.socket.shutdown(std::net::Shutdown::Both);
                }
                _ => return false,
            }
        }
        if hall.ready.len() + hall.admitting.len() >= self.max_kept {
            match hall.ready.front() {
                Some((since, _))
                    if since.elapsed() >= ADMISSION_PATIENCE && listener.has_waiting_client() =>
                {
                    hall.ready.pop_front();
                    tracing::warn!("dropped an admitted connection nobody took: too many wait");
                }
                _ => return false,
            }
        }
        true
    }

    /// A waiting connection `pick` accepts, dropping those that waited too
    /// long.
    fn take_ready(&self, pick: &dyn Fn(&T) -> bool) -> Option<T> {
        let mut hall = self.lock();
        drop_stale(&mut hall, self.kept_for);
        let index = hall.ready.iter().position(|(_, ready)| pick(ready))?;
        hall.ready.remove(index).map(|(_, taken)| taken)
    }

    /// Connections admitted and waiting for a taker.
    #[cfg(test)]
    pub(super) fn ready_count(&self) -> usize {
        self.lock().ready.len()
    }

    /// Admits `channel` on a thread of its own, within the taker's
    /// authentication limit; its id, or `None` when it could not start (the
    /// connection is dropped and the client told nothing).
    fn admit_apart(&self, mut channel: Channel, take: &Take<'_, T>) -> Option<u64> {
        channel.set_deadline(Some(Instant::now() + take.options.auth_timeout));
        let socket = match channel.try_clone_socket() {
            Ok(socket) => socket,
            Err(error) => {
                tracing::warn!(%error, "dropped a client: no second handle on its socket");
                return None;
            }
        };
        let id = {
            let mut hall = self.lock();
            let id = hall.next_admission;
            hall.next_admission += 1;
            hall.admitting.push(Admitting {
                id,
                since: Instant::now(),
                socket,
            });
            id
        };
        let shared = Arc::clone(&self.shared);
        let admit = Arc::clone(&take.admit);
        let (kept_for, max_kept) = (self.kept_for, self.max_kept);
        let spawned = std::thread::Builder::new()
            .name("barlink-tcp-admit".to_string())
            .spawn(move || {
                let outcome = admit(channel);
                let (hall, arrived) = &*shared;
                let mut hall = lock(hall);
                let Some(at) = hall.admitting.iter().position(|a| a.id == id) else {
                    // Cut off meanwhile: whatever it came to is dropped,
                    // and it is nobody's refusal.
                    return;
                };
                hall.admitting.swap_remove(at);
                match outcome {
                    Ok(admitted) => {
                        drop_stale(&mut hall, kept_for);
                        while hall.ready.len() >= max_kept {
                            hall.ready.pop_front();
                            tracing::warn!("dropped an admitted connection: too many wait");
                        }
                        hall.ready.push_back((Instant::now(), admitted));
                    }
                    Err(refusal) => {
                        if hall.refused.len() >= REFUSALS_KEPT {
                            hall.refused.pop_front();
                        }
                        hall.refused.push_back((id, refusal));
                    }
                }
                drop(hall);
                arrived.notify_all();
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "dropped a client: no thread to admit it");
            self.lock().admitting.retain(|admitting| admitting.id != id);
            return None;
        }
        Some(id)
    }
}

/// Drops admitted connections that waited longer than `kept_for`.
fn drop_stale<T>(hall: &mut Hall<T>, kept_for: Duration) {
    hall.ready.retain(|(since, _)| {
        let fresh = since.elapsed() < kept_for;
        if !fresh {
            tracing::warn!("dropped an admitted connection nobody took");
        }
        fresh
    });
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
