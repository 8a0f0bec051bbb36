//! loom models of the ring's head/consumed protocol (testing tier 3).
//!
//! Run with `scripts/loom.sh` (`RUSTFLAGS="--cfg loom"`); a normal build
//! compiles nothing here.
//!
//! What is real and what is modelled:
//! - real: [`Producer`] and [`Consumer`] (every index decision and check),
//!   [`Geometry::slot_offset`], the control-block offsets, and the index
//!   loads and stores `RingMedium` makes through the same functions of
//!   `ring` ([`ring::load_consumed`], [`ring::publish_head`] with its store
//!   fence, [`ring::load_head`], [`ring::publish_consumed`]), with the
//!   orderings written there, in the order the medium calls them
//!   (producer: load `consumed`, write the free slots, publish `head`;
//!   consumer: load `head`, read the ready slots, publish `consumed` into
//!   the peer's window);
//! - modelled: the memory behind the windows ([`ModelWindow`]): every 8-byte
//!   word is a loom atomic (via `barlink_transport::sync`); data words are
//!   stored and loaded `Relaxed`, so loom may hand a reader any value the
//!   memory model allows — stale, or half of a packet — unless the index
//!   protocol orders it. Each slot also has a shadow `UnsafeCell` that loom
//!   checks for data races: a write to a slot that is not ordered after the
//!   previous read of that slot (the producer overwriting a slot the
//!   consumer has not released) fails the model, as the plain `memcpy` of a
//!   real in-process window would be undefined behaviour.
//!
//! A packet in the model is two words: its index and a checksum of it, so a
//! reader can tell the packet it expects from a stale one, an empty slot or
//! a torn one.
//!
//! Index words check themselves: the `corrupt_*` models flip bits of one
//! index store on its way into the window (as a flaky BAR path does), and
//! the reader must ignore it (a missed update, never acted on) and carry
//! on once the writer stores its index again, as the link does every
//! millisecond. Their `*_is_caught` counterpart takes the count without its
//! check and must fail.
//!
//! Each model runs two threads (producer and consumer) over a ring of two
//! slots, with four to six packets so that every slot is reused. The
//! protocol as the link runs it (whole batches) is explored exhaustively;
//! the variants that publish indices one packet at a time have far more
//! interleavings and are explored up to [`PREEMPTION_BOUND`] preemptions
//! (`LOOM_MAX_PREEMPTIONS` overrides it for all models; the other `LOOM_*`
//! variables work as usual). The `*_is_caught` models break one ordering or
//! one step of the protocol and must fail, with the message of the check
//! that catches it: they show that the checks have teeth. A broken ordering
//! is made by the model window, which weakens one of `ring`'s index accesses
//! to `Relaxed` ([`IndexAccess`]), so the code under test stays the ring's.
#![cfg(loom)]

use barlink_transport::ring::{
    self, Consumer, Geometry, IndexKind, MissedUpdate, Producer, encode_index, offset,
};
use barlink_transport::sync::atomic::{AtomicU64, Ordering};
use barlink_transport::sync::{Arc, hint, thread};
use barlink_transport::window::{Window, WindowError};

/// Two slots of one cache line: the smallest ring the layout allows, so
/// that the third packet already reuses slot 0.
const GEOMETRY: Geometry = Geometry {
    slot_size: 64,
    slot_count: 2,
};

/// Bytes of a packet in the model: its index and a checksum of the index.
const PACKET_LEN: usize = 16;

/// How far loom explores a model.
#[derive(Debug, Clone, Copy)]
enum Explore {
    /// Every execution (feasible for the link's batched protocol: with two
    /// slots it moves packets in lockstep pairs).
    Exhaustively,
    /// Executions with at most this many thread preemptions.
    Preemptions(usize),
}

/// The preemption bound of the models that cannot be explored exhaustively:
/// about 15 s of CPU for all of them in a release build (exhaustive would
/// take hours). Every mistake modelled here shows within two preemptions;
/// `LOOM_MAX_PREEMPTIONS=6` explores deeper (about 70 s).
const PREEMPTION_BOUND: Explore = Explore::Preemptions(4);

/// A packet's second word: a function of its index that no other small
/// index, and no zeroed memory, shares.
fn checksum(index: u64) -> u64 {
    (index ^ 0x9e37_79b9_7f4a_7c15)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9)
        .rotate_left(29)
}

fn packet(index: u64) -> [u8; PACKET_LEN] {
    let mut bytes = [0; PACKET_LEN];
    bytes[..8].copy_from_slice(&index.to_le_bytes());
    bytes[8..].copy_from_slice(&checksum(index).to_le_bytes());
    bytes
}

/// Panics unless `bytes` is exactly packet `expected`, saying what was
/// there instead.
fn check_packet(expected: u64, slot: usize, bytes: &[u8; PACKET_LEN]) {
    let index = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let sum = u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes"));
    if (index, sum) == (expected, checksum(expected)) {
        return;
    }
    let found = if (index, sum) == (0, 0) {
        "an empty slot (never written)".to_string()
    } else if sum == checksum(index) {
        format!("whole packet {index}")
    } else {
        format!("a torn packet (index word {index}, checksum word {sum:#x})")
    };
    panic!(
        "consumer read a wrong packet: expected packet {expected} in slot at {slot}, found {found}"
    );
}

/// A loom shadow of a slot's bytes, for its race detector only: it holds
/// nothing, and creates no synchronization.
#[derive(Debug)]
struct Shadow(loom::cell::UnsafeCell<()>);

// SAFETY: the cell holds `()` and its pointer is never dereferenced; `with`
// and `with_mut` only record the access for loom's race detector, which is
// the point of sharing it between threads.
unsafe impl Sync for Shadow {}

/// Whether a [`ModelWindow`] checks slot accesses for races.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RaceCheck {
    /// Every slot read and write is checked by loom's race detector.
    On,
    /// Only values are checked (to show that the value checks alone catch
    /// a bug).
    Off,
}

/// The memory behind a ring window, made of loom atomics: one per 8-byte
/// word of [`GEOMETRY`]'s ring, plus a race-checking shadow per slot.
///
/// Copies must be whole, aligned words (the model's packets are); each word
/// is one `Relaxed` access, so a copy racing another may be seen half old,
/// half new, as over PCIe.
#[derive(Debug)]
struct ModelWindow {
    words: Vec<AtomicU64>,
    slots: Vec<Shadow>,
    race_check: RaceCheck,
    relaxed: Option<IndexAccess>,
    corruption: Option<Corruption>,
    /// Index stores of a new value made so far, and the last value stored
    /// (outside the model: one thread stores each index, so these only
    /// number its stores).
    index_stores: std::sync::atomic::AtomicU32,
    last_stored: std::sync::atomic::AtomicU64,
}

/// One index store that lands corrupted.
#[derive(Debug, Clone, Copy)]
struct Corruption {
    /// Which index (the window holds stores of one index only, from one
    /// thread: `head` in the consumer's window, `consumed` in the
    /// producer's).
    store: IndexAccess,
    /// The `nth` store of a new value (from 1; repeats of the same value
    /// are not counted, and land intact) lands with these bits flipped.
    nth: u32,
    flip: u64,
}

impl ModelWindow {
    fn new(
        race_check: RaceCheck,
        relaxed: Option<IndexAccess>,
        corruption: Option<Corruption>,
    ) -> ModelWindow {
        let len = GEOMETRY.ring_len();
        let words: Vec<AtomicU64> = (0..len / 8).map(|_| AtomicU64::new(0)).collect();
        // The indices as `init_ring` lays them out: zero, with its check.
        words[offset::HEAD / 8].store(encode_index(IndexKind::Head, 0), Ordering::Relaxed);
        words[offset::CONSUMED / 8].store(encode_index(IndexKind::Consumed, 0), Ordering::Relaxed);
        ModelWindow {
            words,
            slots: (0..GEOMETRY.slot_count)
                .map(|_| Shadow(loom::cell::UnsafeCell::new(())))
                .collect(),
            race_check,
            relaxed,
            corruption,
            index_stores: std::sync::atomic::AtomicU32::new(0),
            last_stored: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `value` as the store at `offset` lands: corrupted if it is the one.
    fn landing(&self, offset: usize, value: u64) -> u64 {
        let Some(corruption) = self.corruption else {
            return value;
        };
        let index = match corruption.store {
            IndexAccess::HeadStore => offset::HEAD,
            IndexAccess::ConsumedStore => offset::CONSUMED,
            _ => return value,
        };
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        if offset != index || self.last_stored.swap(value, relaxed) == value {
            return value;
        }
        let nth = self.index_stores.fetch_add(1, relaxed) + 1;
        if nth == corruption.nth {
            value ^ corruption.flip
        } else {
            value
        }
    }

    /// The ordering an index access at `offset` gets: the one the ring asked
    /// for, or `Relaxed` where a broken variant weakens it.
    fn ordering(&self, offset: usize, store: bool, asked: Ordering) -> Ordering {
        let access = match (offset, store) {
            (offset::HEAD, true) => IndexAccess::HeadStore,
            (offset::HEAD, false) => IndexAccess::HeadLoad,
            (offset::CONSUMED, true) => IndexAccess::ConsumedStore,
            (offset::CONSUMED, false) => IndexAccess::ConsumedLoad,
            _ => return asked,
        };
        if self.relaxed == Some(access) {
            Ordering::Relaxed
        } else {
            asked
        }
    }

    /// The words `offset..offset + len` cover, checked.
    fn span(&self, offset: usize, len: usize) -> Result<&[AtomicU64], WindowError> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.len())
            .ok_or(WindowError::OutOfBounds {
                offset,
                len,
                window_len: self.len(),
            })?;
        if !offset.is_multiple_of(8) || !len.is_multiple_of(8) {
            return Err(WindowError::Misaligned { offset, align: 8 });
        }
        Ok(&self.words[offset / 8..end / 8])
    }

    /// The shadow of the slot that `offset` lies in, if it lies in one.
    fn shadow(&self, offset: usize) -> Option<&loom::cell::UnsafeCell<()>> {
        let slot = offset.checked_sub(offset::SLOTS)? / GEOMETRY.slot_size as usize;
        (self.race_check == RaceCheck::On).then(|| &self.slots[slot].0)
    }
}

impl Window for ModelWindow {
    fn len(&self) -> usize {
        self.words.len() * 8
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        let words = self.span(offset, src.len())?;
        if let Some(shadow) = self.shadow(offset) {
            shadow.with_mut(|_| ());
        }
        for (word, bytes) in words.iter().zip(src.chunks_exact(8)) {
            let value = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            word.store(value, Ordering::Relaxed);
        }
        Ok(())
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        let words = self.span(offset, dst.len())?;
        if let Some(shadow) = self.shadow(offset) {
            shadow.with(|_| ());
        }
        for (word, bytes) in words.iter().zip(dst.chunks_exact_mut(8)) {
            bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        Ok(())
    }

    fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        let order = self.ordering(offset, false, order);
        Ok(self.span(offset, 8)?[0].load(order))
    }

    fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
        let order = self.ordering(offset, true, order);
        let value = self.landing(offset, value);
        self.span(offset, 8)?[0].store(value, order);
        Ok(())
    }

    fn fetch_add_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<u64, WindowError> {
        Ok(self.span(offset, 8)?[0].fetch_add(value, order))
    }

    /// What the Rust memory model sees of the real fence on x86_64
    /// (`sfence`, an instruction for write-combined memory): nothing. So
    /// the model relies on the `Release` store of `head` alone, as the
    /// language does. (Elsewhere the real fence is a `SeqCst` fence, which
    /// would order the data even before a `Relaxed` head store; x86_64 is
    /// the case that needs the `Release`.)
    fn store_fence(&self) {}
}

/// One of the ring's four index accesses, which a broken variant weakens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IndexAccess {
    HeadStore,
    HeadLoad,
    ConsumedStore,
    ConsumedLoad,
}

/// How the protocol is run: its orderings and steps as [`LINK`] runs them,
/// or with one deliberate mistake; and how many packets each side handles
/// between two index publications.
#[derive(Debug, Clone, Copy)]
struct Protocol {
    /// One of the ring's index accesses weakened to `Relaxed`, if any.
    relaxed: Option<IndexAccess>,
    /// The consumer publishes each packet's release before reading it.
    release_before_read: bool,
    /// Most packets the producer writes before publishing `head`.
    producer_batch: u64,
    /// Most packets the consumer reads before publishing `consumed`.
    consumer_batch: u64,
    /// One index store that lands corrupted.
    corruption: Option<Corruption>,
    /// Each side stores its index again while it waits (at most
    /// [`REPEATS`] times between two steps forward), as the link does on a
    /// timer.
    repeat: bool,
    /// The consumer takes the head's count without its check.
    unchecked_head: bool,
}

impl Protocol {
    /// This protocol, with indices published after every packet.
    const fn one_packet_at_a_time(self) -> Protocol {
        Protocol {
            producer_batch: 1,
            consumer_batch: 1,
            ..self
        }
    }
}

/// Most repeated index stores per side between two steps forward: one
/// corrupted store needs one repeat after it (repeats land intact); the
/// bound keeps the models finite.
const REPEATS: u32 = 1;

/// The protocol as `ring` specifies it and `RingLink::progress` runs it
/// for small packets: the producer fills every free slot and then
/// publishes `head` once; the consumer reads every ready slot and then
/// publishes `consumed` once. With two slots this moves packets in
/// lockstep pairs. (The link publishes mid-batch every 16 KiB of packets,
/// which the one-step and batching variants below cover, and may hold
/// `consumed` back until its next transmission: a later publication of
/// the same value, which can only keep the producer waiting longer.)
const LINK: Protocol = Protocol {
    relaxed: None,
    release_before_read: false,
    producer_batch: u64::MAX,
    consumer_batch: u64::MAX,
    corruption: None,
    repeat: false,
    unchecked_head: false,
};

/// The same protocol with an index published after every packet, so that
/// each side sees the other's indices move one packet at a time (as a link
/// whose engine has one packet ready at a time does): the producer reuses
/// a slot while the consumer still reads the other one.
const PER_PACKET: Protocol = Protocol {
    producer_batch: 1,
    consumer_batch: 1,
    ..LINK
};

/// The writing side: sends packets `0..packets` into `peer` (the
/// consumer's window), learning about free slots from `own`. With
/// `repeat`, it stores its head again while it waits for slots, and after
/// the last packet until the consumer reports it consumed.
fn produce(own: &ModelWindow, peer: &ModelWindow, packets: u64, protocol: Protocol) {
    let mut producer = Producer::new(GEOMETRY);
    let mut repeats = 0;
    let mut next = 0;
    loop {
        let consumed = ring::load_consumed(own).expect("load consumed");
        match producer.on_consumed(consumed) {
            Ok(()) => {}
            Err(MissedUpdate::Corrupt { .. }) if protocol.corruption.is_some() => {}
            Err(miss) => panic!("the consumer's count is plausible: {miss}"),
        }
        let all_consumed = producer.free_slots() == u64::from(GEOMETRY.slot_count);
        if next == packets && (!protocol.repeat || all_consumed) {
            return;
        }
        let mut published = None;
        let batch_end = next.saturating_add(protocol.producer_batch).min(packets);
        while next < batch_end
            && let Some(slot) = producer.next_slot_offset()
        {
            peer.write(slot, &packet(next)).expect("write a slot");
            next += 1;
            published = Some(producer.commit());
        }
        match published {
            Some(head) => {
                ring::publish_head(peer, head).expect("publish head");
                repeats = 0;
            }
            // Waiting (for the consumer to free a slot, or to report the
            // last packets): a timer repeats the head.
            None if protocol.repeat && repeats < REPEATS => {
                repeats += 1;
                ring::publish_head(peer, producer.written()).expect("repeat head");
            }
            None => hint::spin_loop(),
        }
    }
}

/// The reading side: receives `packets` packets from `own`, checking each,
/// and reports what it consumed into `peer` (the producer's window). With
/// `repeat`, it stores its consumed count again while it waits, and once
/// more at the end.
fn consume(own: &ModelWindow, peer: &ModelWindow, packets: u64, protocol: Protocol) {
    let mut consumer = Consumer::new(GEOMETRY);
    let mut repeats = 0;
    let mut received = 0;
    while received < packets {
        let head = ring::load_head(own).expect("load head");
        let outcome = if protocol.unchecked_head {
            consumer.on_head_count(head as u32)
        } else {
            consumer.on_head(head)
        };
        let ready = match outcome {
            Ok(ready) => ready,
            // Ignored: what was known stays ready (none, as the consumer
            // reads all it knows of before loading the head again).
            Err(MissedUpdate::Corrupt { .. }) if protocol.corruption.is_some() => 0,
            Err(miss) => panic!("the producer's head is plausible: {miss}"),
        };
        if ready == 0 {
            if protocol.repeat && repeats < REPEATS {
                repeats += 1;
                ring::publish_consumed(peer, consumer.released()).expect("repeat consumed");
            } else {
                // Nothing published yet: wait for the producer.
                hint::spin_loop();
            }
            continue;
        }
        let mut consumed = None;
        let batch_end = received.saturating_add(protocol.consumer_batch);
        while received < batch_end
            && let Some(slot) = consumer.next_slot_offset()
        {
            if protocol.release_before_read {
                let early = consumer.release();
                ring::publish_consumed(peer, early).expect("publish consumed");
            }
            let mut bytes = [0; PACKET_LEN];
            own.read(slot, &mut bytes).expect("read a slot");
            check_packet(received, slot, &bytes);
            received += 1;
            repeats = 0;
            if !protocol.release_before_read {
                consumed = Some(consumer.release());
            }
        }
        if let Some(consumed) = consumed {
            ring::publish_consumed(peer, consumed).expect("publish consumed");
        }
    }
    if protocol.repeat {
        // The timer, once more after the end: a producer waiting for the
        // last count gets it even if its last store was the corrupted one.
        ring::publish_consumed(peer, consumer.released()).expect("repeat consumed");
    }
}

/// Checks, under every interleaving loom explores, that `packets` packets
/// pass from a producer thread to a consumer thread intact and in order.
fn model(packets: u64, protocol: Protocol, race_check: RaceCheck, explore: Explore) {
    let mut builder = loom::model::Builder::new();
    // `LOOM_MAX_PREEMPTIONS`, when set, wins.
    if builder.preemption_bound.is_none()
        && let Explore::Preemptions(bound) = explore
    {
        builder.preemption_bound = Some(bound);
    }
    // Counts executions, outside the model (a std atomic, not loom's).
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let counter = executions.clone();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The consumer's receive window: the producer writes slots and head.
        let corruption = |index: IndexAccess| protocol.corruption.filter(|c| c.store == index);
        let ring = Arc::new(ModelWindow::new(
            race_check,
            protocol.relaxed,
            corruption(IndexAccess::HeadStore),
        ));
        // The producer's own window: the consumer writes consumed there.
        let credits = Arc::new(ModelWindow::new(
            race_check,
            protocol.relaxed,
            corruption(IndexAccess::ConsumedStore),
        ));
        GEOMETRY.validate(ring.len()).expect("the model ring fits");

        let producer = thread::spawn({
            let (ring, credits) = (ring.clone(), credits.clone());
            move || produce(&credits, &ring, packets, protocol)
        });
        consume(&ring, &credits, packets, protocol);
        producer.join().expect("producer thread");

        if protocol.corruption.is_none() {
            assert_eq!(
                ring.load_u64(offset::HEAD, Ordering::Relaxed),
                Ok(encode_index(IndexKind::Head, packets))
            );
            assert_eq!(
                credits.load_u64(offset::CONSUMED, Ordering::Relaxed),
                Ok(encode_index(IndexKind::Consumed, packets))
            );
        }
    });
    let batch = |most: u64| match most {
        u64::MAX => "all".to_string(),
        most => most.to_string(),
    };
    eprintln!(
        "{packets} packets, batches of {} (producer) and {} (consumer), {}: {} executions in {:.2?}",
        batch(protocol.producer_batch),
        batch(protocol.consumer_batch),
        match builder.preemption_bound {
            Some(bound) => format!("at most {bound} preemptions"),
            None => "exhaustive".to_string(),
        },
        executions.load(std::sync::atomic::Ordering::Relaxed),
        started.elapsed()
    );
}

// --- The protocol holds -------------------------------------------------

#[test]
fn every_packet_read_is_the_one_published_as_the_link_runs_it() {
    model(6, LINK, RaceCheck::On, Explore::Exhaustively);
}

#[test]
fn every_packet_read_is_the_one_published_one_index_step_at_a_time() {
    model(4, PER_PACKET, RaceCheck::On, PREEMPTION_BOUND);
}

#[test]
fn every_packet_read_is_the_one_published_with_a_batching_producer() {
    model(
        4,
        Protocol {
            consumer_batch: 1,
            ..LINK
        },
        RaceCheck::On,
        PREEMPTION_BOUND,
    );
}

#[test]
fn every_packet_read_is_the_one_published_with_a_batching_consumer() {
    model(
        4,
        Protocol {
            producer_batch: 1,
            ..LINK
        },
        RaceCheck::On,
        PREEMPTION_BOUND,
    );
}

// --- A corrupt index is a missed update ----------------------------------

/// The corruption models' bound: their repeated stores multiply the
/// executions, and a missed update and its repair show within three.
const CORRUPTION_BOUND: Explore = Explore::Preemptions(3);

/// The protocol as the link runs it with one index store corrupted, and
/// repeats to repair it.
const fn corrupted(store: IndexAccess, nth: u32, flip: u64) -> Protocol {
    Protocol {
        corruption: Some(Corruption { store, nth, flip }),
        repeat: true,
        ..LINK
    }
}

/// The first head store (head 2) lands as head 1 with the check of 2: the
/// consumer ignores it and goes on when the producer stores its head
/// again (the next packet, or a repeat).
#[test]
fn a_corrupt_head_is_ignored_then_repaired() {
    model(
        3,
        corrupted(IndexAccess::HeadStore, 1, 0b11),
        RaceCheck::On,
        CORRUPTION_BOUND,
    );
}

/// The last new head (3, after 2) is corrupted in its check half: only a
/// repeat can announce the last packet.
#[test]
fn a_corrupt_last_head_is_repaired_by_a_repeat() {
    model(
        3,
        corrupted(IndexAccess::HeadStore, 2, 1 << 40),
        RaceCheck::On,
        CORRUPTION_BOUND,
    );
}

/// A consumed store lands corrupted: the producer keeps the slots it knew
/// were busy (never reuses one the consumer may still read) until the
/// consumer stores its count again.
#[test]
fn a_corrupt_consumed_count_is_ignored_then_repaired() {
    for nth in [1, 2] {
        model(
            3,
            corrupted(IndexAccess::ConsumedStore, nth, 1 << 2),
            RaceCheck::On,
            CORRUPTION_BOUND,
        );
    }
}

/// Taken without its check, a first head store (head 1, one packet at a
/// time) that lands as head 2 is plausible (2 of 2 slots), and the
/// consumer reads a slot never written.
#[test]
#[should_panic(expected = "consumer read a wrong packet")]
fn a_corrupt_head_taken_without_its_check_is_caught() {
    model(
        3,
        Protocol {
            unchecked_head: true,
            ..corrupted(IndexAccess::HeadStore, 1, 0b11)
        }
        .one_packet_at_a_time(),
        RaceCheck::Off,
        Explore::Preemptions(1),
    );
}

// --- Each mistake is caught ---------------------------------------------

/// Without `Release` on head, the consumer may see the new head and an old
/// slot: the value check alone catches it.
#[test]
#[should_panic(expected = "consumer read a wrong packet")]
fn a_relaxed_head_store_is_caught_by_the_packet_check() {
    model(
        3,
        Protocol {
            relaxed: Some(IndexAccess::HeadStore),
            ..LINK
        },
        RaceCheck::Off,
        Explore::Exhaustively,
    );
}

/// The same mistake, seen by the race detector: the consumer's read of a
/// slot is not ordered after the producer's write of it.
#[test]
#[should_panic(expected = "Causality violation: Concurrent read and write accesses.")]
fn a_relaxed_head_store_is_caught_as_a_race() {
    model(
        3,
        Protocol {
            relaxed: Some(IndexAccess::HeadStore),
            ..LINK
        },
        RaceCheck::On,
        Explore::Exhaustively,
    );
}

/// `Acquire` on the head load is the other half of the same edge.
#[test]
#[should_panic(expected = "consumer read a wrong packet")]
fn a_relaxed_head_load_is_caught() {
    model(
        3,
        Protocol {
            relaxed: Some(IndexAccess::HeadLoad),
            ..LINK
        },
        RaceCheck::Off,
        Explore::Exhaustively,
    );
}

/// Without `Release` on consumed, the producer's reuse of a slot is not
/// ordered after the consumer's read of it. loom does not explore a load
/// seeing a store that comes later in program order (load buffering), so
/// no value goes wrong here; the race detector is what catches it.
#[test]
#[should_panic(
    expected = "Causality violation: Concurrent read and write accesses to `UnsafeCell`"
)]
fn a_relaxed_consumed_store_is_caught() {
    model(
        3,
        Protocol {
            relaxed: Some(IndexAccess::ConsumedStore),
            ..LINK
        },
        RaceCheck::On,
        Explore::Exhaustively,
    );
}

/// `Acquire` on the consumed load is the other half of that edge.
#[test]
#[should_panic(
    expected = "Causality violation: Concurrent read and write accesses to `UnsafeCell`"
)]
fn a_relaxed_consumed_load_is_caught() {
    model(
        3,
        Protocol {
            relaxed: Some(IndexAccess::ConsumedLoad),
            ..LINK
        },
        RaceCheck::On,
        Explore::Exhaustively,
    );
}

/// A consumer that frees a slot before reading it lets the producer
/// overwrite the packet under it: the value check sees the newer packet.
#[test]
#[should_panic(expected = "consumer read a wrong packet")]
fn releasing_a_slot_before_reading_it_is_caught_by_the_packet_check() {
    model(
        3,
        Protocol {
            release_before_read: true,
            ..LINK
        },
        RaceCheck::Off,
        Explore::Exhaustively,
    );
}

/// The same mistake, seen by the race detector.
#[test]
#[should_panic(
    expected = "Causality violation: Concurrent read and write accesses to `UnsafeCell`"
)]
fn releasing_a_slot_before_reading_it_is_caught_as_a_race() {
    model(
        3,
        Protocol {
            release_before_read: true,
            ..LINK
        },
        RaceCheck::On,
        Explore::Exhaustively,
    );
}
