//! Multi-threaded stress tests of every queue: no loss, no duplication, FIFO order per
//! producer; bad capacities; drop safety.
//!
//! Run: `cargo test -p ringkernel-core --test queue_stress` (add `--release` for the
//! larger message counts).

use ringkernel_core::message::{flags, MessageHeader, HEADER_SIZE};
use ringkernel_core::queue::{mpsc, slot, spsc};
use ringkernel_core::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Turns a hang (a lost item, a dead peer thread) into a test failure: call `idle` on
/// every empty/full retry and `progress` whenever an item moves.
struct Watchdog {
    what: &'static str,
    last: Instant,
}

impl Watchdog {
    fn new(what: &'static str) -> Self {
        Watchdog {
            what,
            last: Instant::now(),
        }
    }
    fn progress(&mut self) {
        self.last = Instant::now();
    }
    fn idle(&mut self, state: impl FnOnce() -> String) {
        if self.last.elapsed() > Duration::from_secs(60) {
            panic!("{}: no progress for 60 s; {}", self.what, state());
        }
        thread::yield_now();
    }
}

/// Items per producer: smaller in debug builds so the suite stays fast.
const N: u64 = if cfg!(debug_assertions) {
    100_000
} else {
    1_000_000
};
const PRODUCERS: u64 = 4;

#[test]
fn spsc_two_threads_in_order() {
    let (mut tx, mut rx) = spsc::channel::<u64>(64).unwrap();
    let p = thread::spawn(move || {
        let mut w = Watchdog::new("spsc producer");
        for i in 0..N {
            let mut v = i;
            while let Err(back) = tx.push(v) {
                v = back;
                w.idle(|| format!("{:?}", tx.stats()));
            }
            w.progress();
        }
        tx.stats()
    });
    let mut expect = 0u64;
    let mut w = Watchdog::new("spsc consumer");
    while expect < N {
        match rx.pop() {
            Some(v) => {
                assert_eq!(v, expect, "lost, duplicated or reordered item");
                expect += 1;
                w.progress();
            }
            None => w.idle(|| format!("expecting {expect}, {:?}", rx.stats())),
        }
    }
    let pstats = p.join().unwrap();
    assert_eq!(rx.pop(), None, "nothing beyond what was pushed");
    let s = rx.stats();
    assert_eq!((s.enqueued, s.dequeued, s.depth), (N, N, 0));
    assert_eq!(s.full_rejections, pstats.full_rejections);
}

#[test]
fn mpsc_many_producers_fifo_per_producer() {
    let (tx, mut rx) = mpsc::channel::<(u64, u64)>(128).unwrap();
    let handles: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let tx = tx.clone();
            thread::spawn(move || {
                let mut w = Watchdog::new("mpsc producer");
                for i in 0..N {
                    let mut v = (p, i);
                    while let Err(back) = tx.push(v) {
                        v = back;
                        w.idle(|| format!("{:?}", tx.stats()));
                    }
                    w.progress();
                }
            })
        })
        .collect();
    drop(tx);
    let mut next = vec![0u64; PRODUCERS as usize];
    let mut got = 0u64;
    let mut w = Watchdog::new("mpsc consumer");
    while got < N * PRODUCERS {
        match rx.pop() {
            Some((p, i)) => {
                assert_eq!(
                    i, next[p as usize],
                    "producer {p}: out of order or duplicated"
                );
                next[p as usize] += 1;
                got += 1;
                w.progress();
            }
            None => w.idle(|| format!("next {next:?}, {:?}", rx.stats())),
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(rx.pop(), None);
    assert!(
        next.iter().all(|&n| n == N),
        "every item of every producer arrived"
    );
    let s = rx.stats();
    assert_eq!(
        (s.enqueued, s.dequeued, s.depth),
        (N * PRODUCERS, N * PRODUCERS, 0)
    );
}

fn msg(producer: u32, i: u64) -> (MessageHeader, Vec<u8>) {
    let mut h = MessageHeader::new(5, 0);
    h.source_kernel = producer;
    h.message_id = i;
    h.flags = flags::CHECKSUM;
    // Payload length varies with i so lengths are checked too.
    let len = (i % 57) as usize + 8;
    let mut payload = vec![0u8; len];
    payload[..8].copy_from_slice(&i.to_le_bytes());
    for (k, b) in payload[8..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_add(k as u8) ^ producer as u8;
    }
    (h, payload)
}

#[test]
fn slot_spsc_two_threads_in_order() {
    let (mut tx, mut rx) = slot::slot_channel(64, 128).unwrap();
    let n = N / 2;
    let p = thread::spawn(move || {
        let mut w = Watchdog::new("slot spsc producer");
        for i in 0..n {
            let (h, payload) = msg(1, i);
            loop {
                match tx.try_push(&h, &payload) {
                    Ok(()) => break,
                    Err(Error::QueueFull { capacity: 64 }) => {
                        w.idle(|| format!("{:?}", tx.stats()))
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            w.progress();
        }
    });
    let mut expect = 0u64;
    let mut w = Watchdog::new("slot spsc consumer");
    while expect < n {
        // Alternate between the copying and the in-place pop.
        let got = if expect & 1 == 0 {
            rx.try_pop().unwrap().map(|e| (e.header, e.payload))
        } else {
            rx.try_pop_with(|h, p| (*h, p.to_vec())).unwrap()
        };
        match got {
            Some((h, payload)) => {
                let (_, want) = msg(1, expect);
                assert_eq!(h.message_id, expect);
                assert_eq!(h.payload_len as usize, want.len());
                assert_eq!(payload, want);
                expect += 1;
                w.progress();
            }
            None => w.idle(|| format!("expecting {expect}, {:?}", rx.stats())),
        }
    }
    p.join().unwrap();
    assert!(rx.try_pop().unwrap().is_none());
    assert_eq!(rx.stats().dequeued, n);
}

#[test]
fn slot_mpsc_many_producers_fifo_per_producer() {
    let (tx, mut rx) = slot::mpsc_slot_channel(64, 256).unwrap();
    let n = N / 2;
    let handles: Vec<_> = (0..PRODUCERS as u32)
        .map(|p| {
            let tx = tx.clone();
            thread::spawn(move || {
                let mut w = Watchdog::new("slot mpsc producer");
                for i in 0..n {
                    let (h, payload) = msg(p, i);
                    while let Err(e) = tx.try_push(&h, &payload) {
                        assert_eq!(e, Error::QueueFull { capacity: 64 });
                        w.idle(|| format!("{:?}", tx.stats()));
                    }
                    w.progress();
                }
            })
        })
        .collect();
    let mut next = vec![0u64; PRODUCERS as usize];
    let mut got = 0;
    let mut w = Watchdog::new("slot mpsc consumer");
    while got < n * PRODUCERS {
        match rx.try_pop().unwrap() {
            Some(e) => {
                let p = e.header.source_kernel;
                let i = next[p as usize];
                assert_eq!(
                    e.header.message_id, i,
                    "producer {p}: out of order or duplicated"
                );
                assert_eq!(e.payload, msg(p, i).1);
                next[p as usize] += 1;
                got += 1;
                w.progress();
            }
            None => w.idle(|| format!("next {next:?}, {:?}", rx.stats())),
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    assert!(rx.try_pop().unwrap().is_none());
    assert!(next.iter().all(|&c| c == n));
    let s = tx.stats();
    assert_eq!(
        (s.enqueued, s.dequeued, s.depth),
        (n * PRODUCERS, n * PRODUCERS, 0)
    );
}

/// Producers pushing batches (`try_push_batch`, one tail update per batch) and single
/// messages at once: every message arrives once, each producer's in order.
#[test]
fn slot_mpsc_batches_keep_per_producer_order() {
    let (tx, mut rx) = slot::mpsc_slot_channel(64, 256).unwrap();
    let n = N / 2;
    let handles: Vec<_> = (0..PRODUCERS as u32)
        .map(|p| {
            let tx = tx.clone();
            thread::spawn(move || {
                let mut w = Watchdog::new("slot mpsc batch producer");
                let mut i = 0;
                while i < n {
                    // Odd producers push one at a time, even ones in batches of up to 7.
                    let len = if p % 2 == 1 { 1 } else { 1 + (i % 7) };
                    let msgs: Vec<_> = (i..(i + len).min(n)).map(|j| msg(p, j)).collect();
                    let batch: Vec<(MessageHeader, &[u8])> =
                        msgs.iter().map(|(h, b)| (*h, &b[..])).collect();
                    let pushed = tx.try_push_batch(&batch).unwrap();
                    if pushed == 0 {
                        w.idle(|| format!("{:?}", tx.stats()));
                    } else {
                        i += pushed as u64;
                        w.progress();
                    }
                }
            })
        })
        .collect();
    let mut next = vec![0u64; PRODUCERS as usize];
    let mut got = 0;
    let mut w = Watchdog::new("slot mpsc batch consumer");
    while got < n * PRODUCERS {
        match rx.try_pop().unwrap() {
            Some(e) => {
                let p = e.header.source_kernel;
                let i = next[p as usize];
                assert_eq!(e.header.message_id, i, "producer {p}: out of order or lost");
                assert_eq!(e.payload, msg(p, i).1);
                next[p as usize] += 1;
                got += 1;
                w.progress();
            }
            None => w.idle(|| format!("next {next:?}, {:?}", rx.stats())),
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    assert!(rx.try_pop().unwrap().is_none());
}

/// Closing an MPSC ring while producers push (one by one and in batches): every push
/// that succeeded is taken after the close (nothing slips in after the final sweep,
/// nothing accepted is lost), and every push after the close fails.
#[test]
fn slot_mpsc_close_loses_nothing_that_was_accepted() {
    for round in 0..50u32 {
        let (tx, mut rx) = slot::mpsc_slot_channel(1024, 128).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..4u32)
            .map(|p| {
                let (tx, accepted) = (tx.clone(), accepted.clone());
                thread::spawn(move || {
                    let mut i = 0u64;
                    loop {
                        let h = MessageHeader::new(p, 0);
                        let r = if (p + round) % 2 == 0 {
                            tx.try_push(&h, b"").map(|()| 1)
                        } else {
                            tx.try_push_batch(&[(h, &b""[..]), (h, &b""[..]), (h, &b""[..])])
                        };
                        match r {
                            Ok(k) => {
                                accepted.fetch_add(k, Ordering::SeqCst);
                            }
                            Err(Error::QueueFull { .. }) => {}
                            Err(Error::KernelTerminated(_)) => return,
                            Err(e) => panic!("unexpected {e:?}"),
                        }
                        i += 1;
                        if i.is_multiple_of(64) {
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        // Let them run, taking some messages meanwhile (a bounded number per look:
        // producers that keep up with the receiver would otherwise keep it here for as
        // long as the OS lets them, which took up to 40 s of a CI run).
        let mut taken = 0;
        for _ in 0..200 {
            for _ in 0..1024 {
                if rx.try_pop().unwrap().is_none() {
                    break;
                }
                taken += 1;
            }
            thread::yield_now();
        }
        let left = rx.close();
        let mut w = Watchdog::new("close sweep");
        while !rx.is_complete() {
            w.idle(|| "producers still writing after the close".to_string());
        }
        let mut swept = 0;
        while rx.try_pop().unwrap().is_some() {
            swept += 1;
        }
        assert_eq!(swept, left, "close() counted what the sweep took");
        for h in handles {
            h.join().unwrap();
        }
        assert!(tx.is_closed());
        assert!(matches!(
            tx.try_push(&MessageHeader::new(0, 0), b""),
            Err(Error::KernelTerminated(_))
        ));
        assert_eq!(
            taken + swept,
            accepted.load(Ordering::SeqCst),
            "round {round}: accepted pushes lost or extra ones slipped in after the close"
        );
        assert!(rx.try_pop().unwrap().is_none());
    }
}

#[test]
fn non_power_of_two_capacities_are_invalid() {
    for cap in [0usize, 3, 6, 100, 1000] {
        assert!(
            matches!(spsc::channel::<u8>(cap), Err(Error::InvalidArgument(_))),
            "{cap}"
        );
        assert!(
            matches!(mpsc::channel::<u8>(cap), Err(Error::InvalidArgument(_))),
            "{cap}"
        );
        assert!(
            matches!(slot::slot_channel(cap, 256), Err(Error::InvalidArgument(_))),
            "{cap}"
        );
        assert!(
            matches!(
                slot::mpsc_slot_channel(cap, 256),
                Err(Error::InvalidArgument(_))
            ),
            "{cap}"
        );
    }
    assert!(spsc::channel::<u8>(1).is_ok());
    assert!(mpsc::channel::<u8>(1).is_ok());
}

#[test]
fn full_ring_hands_the_value_back() {
    let (mut tx, mut rx) = spsc::channel::<String>(2).unwrap();
    tx.push("a".into()).unwrap();
    tx.push("b".into()).unwrap();
    assert_eq!(tx.push("c".into()), Err("c".to_string()));
    assert_eq!(tx.free(), 0);
    assert_eq!(rx.pop().as_deref(), Some("a"));
    tx.push("c".into()).unwrap();
    assert_eq!(rx.len(), 2);
    assert_eq!(tx.stats().full_rejections, 1);

    let (tx, mut rx) = mpsc::channel::<String>(2).unwrap();
    tx.push("a".into()).unwrap();
    tx.push("b".into()).unwrap();
    assert_eq!(tx.push("c".into()), Err("c".to_string()));
    assert_eq!(rx.pop().as_deref(), Some("a"));
    assert_eq!(rx.pop().as_deref(), Some("b"));
    assert_eq!(rx.pop(), None);
    assert_eq!(rx.stats().full_rejections, 1);
}

/// Counts live instances so leaks and double drops show.
struct Tracked(Arc<AtomicUsize>);
impl Tracked {
    fn new(live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Tracked(live.clone())
    }
}
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn drop_releases_unpopped_items_exactly_once() {
    let live = Arc::new(AtomicUsize::new(0));
    {
        let (mut tx, mut rx) = spsc::channel::<Tracked>(8).unwrap();
        // Wrap around the ring a few times, then leave 5 items in it.
        for _ in 0..3 {
            for _ in 0..6 {
                assert!(tx.push(Tracked::new(&live)).is_ok());
            }
            for _ in 0..6 {
                drop(rx.pop().unwrap());
            }
        }
        for _ in 0..5 {
            assert!(tx.push(Tracked::new(&live)).is_ok());
        }
        drop(rx.pop());
        assert_eq!(live.load(Ordering::SeqCst), 4);
        drop(tx);
        assert_eq!(
            live.load(Ordering::SeqCst),
            4,
            "the consumer still holds them"
        );
        assert!(rx.is_abandoned());
    }
    assert_eq!(live.load(Ordering::SeqCst), 0);
    {
        let (tx, mut rx) = mpsc::channel::<Tracked>(8).unwrap();
        let tx2 = tx.clone();
        for k in 0..12 {
            let t = if k % 2 == 0 { &tx } else { &tx2 };
            assert!(t.push(Tracked::new(&live)).is_ok());
            if k % 3 == 0 {
                drop(rx.pop().unwrap());
            }
        }
        assert_eq!(live.load(Ordering::SeqCst), 12 - 4);
        drop(rx);
        assert_eq!(
            live.load(Ordering::SeqCst),
            8,
            "senders keep the ring alive"
        );
    }
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn zero_sized_items_are_counted() {
    let (mut tx, mut rx) = spsc::channel::<()>(4).unwrap();
    for _ in 0..4 {
        tx.push(()).unwrap();
    }
    assert_eq!(tx.push(()), Err(()));
    assert_eq!(rx.len(), 4);
    assert_eq!(std::iter::from_fn(|| rx.pop()).count(), 4);
}

#[test]
fn corrupt_slots_are_consumed_and_reported() {
    // Build a ring over memory we own, so we can corrupt a slot behind the queue's back.
    #[repr(C, align(64))]
    struct Ring {
        header: ringkernel_core::queue::QueueHeader,
        slots: [u8; 4 * 128],
    }
    let mut ring = Box::new(Ring {
        header: slot::new_header(4, 128).unwrap(),
        slots: [0; 4 * 128],
    });
    let hdr = std::ptr::NonNull::from(&mut ring.header);
    let slots = std::ptr::NonNull::new(ring.slots.as_mut_ptr()).unwrap();
    // SAFETY: `ring` outlives both halves (dropped at the end of the test), its header was
    // initialised by `new_header`, and this test is the only producer and consumer; the
    // corruption below happens while neither side is touching that slot.
    let (mut tx, mut rx) = unsafe {
        (
            slot::SlotProducer::from_raw_parts(hdr, slots, None).unwrap(),
            slot::SlotConsumer::from_raw_parts(hdr, slots, None).unwrap(),
        )
    };
    for i in 0..4u64 {
        let mut h = MessageHeader::new(1, 0);
        h.message_id = i;
        h.flags = flags::CHECKSUM;
        tx.try_push(&h, b"payload!").unwrap();
    }
    let base = slots.as_ptr();
    // SAFETY: all four slots are published and unread; nothing else accesses them now.
    unsafe {
        *base = 0; // slot 0: bad magic
        let len_off = 128 + 12; // slot 1: payload_len too large
        base.add(len_off).cast::<u32>().write_unaligned(1000);
        *base.add(2 * 128 + HEADER_SIZE) ^= 0xFF; // slot 2: payload no longer matches checksum
    }
    assert!(matches!(rx.try_pop(), Err(Error::Device(m)) if m.contains("magic")));
    assert!(matches!(rx.try_pop(), Err(Error::Device(m)) if m.contains("payload_len")));
    assert!(matches!(rx.try_pop(), Err(Error::Device(m)) if m.contains("checksum")));
    let ok = rx.try_pop().unwrap().unwrap();
    assert_eq!(
        (ok.header.message_id, ok.payload.as_slice()),
        (3, &b"payload!"[..])
    );
    assert!(rx.try_pop().unwrap().is_none());
    // The queue keeps working after the corrupt slots.
    tx.try_push(&MessageHeader::new(2, 0), b"x").unwrap();
    assert_eq!(
        rx.pop_with(|h, p| (h.type_id, p.to_vec())),
        Some((2, b"x".to_vec()))
    );
    // The header in caller-owned memory reflects the indices.
    drop((tx, rx));
    assert_eq!((ring.header.tail, ring.header.head), (5, 5));
}

#[test]
fn pop_with_skips_corrupt_slots() {
    let (tx, mut rx) = slot::mpsc_slot_channel(4, 128).unwrap();
    let (mut stx, mut srx) = slot::slot_channel(4, 128).unwrap();
    for v in [b"a", b"b"] {
        let mut h = MessageHeader::new(1, 0);
        h.flags = flags::CHECKSUM;
        tx.try_push(&h, v).unwrap();
        stx.try_push(&h, v).unwrap();
    }
    assert_eq!(rx.pop_with(|_, p| p.to_vec()), Some(b"a".to_vec()));
    assert_eq!(srx.pop_with(|_, p| p.to_vec()), Some(b"a".to_vec()));
    assert_eq!(rx.pop_with(|_, p| p.to_vec()), Some(b"b".to_vec()));
    assert_eq!(srx.pop_with(|_, p| p.to_vec()), Some(b"b".to_vec()));
    assert_eq!(rx.pop_with(|_, p| p.to_vec()), None);
    assert_eq!(srx.pop_with(|_, p| p.to_vec()), None);
}

#[test]
fn from_raw_parts_rejects_bad_headers() {
    #[repr(C, align(64))]
    struct Ring {
        header: ringkernel_core::queue::QueueHeader,
        slots: [u8; 4 * 128],
    }
    let mut ring = Box::new(Ring {
        header: slot::new_header(4, 128).unwrap(),
        slots: [0; 4 * 128],
    });
    ring.header.capacity = 3;
    let hdr = std::ptr::NonNull::from(&mut ring.header);
    let slots = std::ptr::NonNull::new(ring.slots.as_mut_ptr()).unwrap();
    // SAFETY: the memory is valid for the duration of the call; the constructor fails
    // before it returns a handle.
    let r = unsafe { slot::SlotProducer::from_raw_parts(hdr, slots, None) };
    assert!(matches!(r, Err(Error::InvalidArgument(_))));
    ring.header.capacity = 4;
    ring.header.mask = 7;
    // SAFETY: as above.
    let r = unsafe { slot::SlotConsumer::from_raw_parts(hdr, slots, None) };
    assert!(matches!(r, Err(Error::InvalidArgument(_))));
}

#[test]
fn capacity_one_rings_under_contention() {
    // With one slot, "free for the next lap" and "holds an item" must stay distinct
    // (plain Vyukov sequence numbers coincide there).
    // Every item is a hand-over between threads here, so keep the count modest.
    let n = N / 50;
    let (tx, mut rx) = mpsc::channel::<(u64, u64)>(1).unwrap();
    let (stx, mut srx) = slot::mpsc_slot_channel(1, 128).unwrap();
    let hs: Vec<_> = (0..3u64)
        .map(|p| {
            let (tx, stx) = (tx.clone(), stx.clone());
            thread::spawn(move || {
                let mut w = Watchdog::new("capacity-1 producer");
                for i in 0..n {
                    while tx.push((p, i)).is_err() {
                        w.idle(|| format!("{:?}", tx.stats()));
                    }
                    let (h, payload) = msg(p as u32, i);
                    while stx.try_push(&h, &payload).is_err() {
                        w.idle(|| format!("{:?}", stx.stats()));
                    }
                    w.progress();
                }
            })
        })
        .collect();
    let (mut next, mut snext) = ([0u64; 3], [0u64; 3]);
    let (mut got, mut sgot) = (0, 0);
    let mut w = Watchdog::new("capacity-1 consumer");
    while got < 3 * n || sgot < 3 * n {
        let mut idle = true;
        if let Some((p, i)) = rx.pop() {
            assert_eq!(i, next[p as usize]);
            next[p as usize] += 1;
            got += 1;
            idle = false;
        }
        if let Some(e) = srx.try_pop().unwrap() {
            let p = e.header.source_kernel as usize;
            assert_eq!(e.header.message_id, snext[p]);
            assert_eq!(e.payload, msg(p as u32, snext[p]).1);
            snext[p] += 1;
            sgot += 1;
            idle = false;
        }
        if idle {
            w.idle(|| {
                format!(
                    "typed {next:?} {:?}, slots {snext:?} {:?}",
                    rx.stats(),
                    srx.stats()
                )
            });
        } else {
            w.progress();
        }
    }
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!((rx.pop(), srx.try_pop().unwrap()), (None, None));
}

#[test]
fn raw_parts_ring_across_threads_with_keep_alive() {
    // A ring in memory owned by someone else (as a GPU backend's mapped buffer would
    // be), kept alive by the `keep_alive` handle that both halves hold.
    #[repr(C, align(64))]
    struct Ring {
        header: std::cell::UnsafeCell<ringkernel_core::queue::QueueHeader>,
        slots: std::cell::UnsafeCell<[u8; 8 * 256]>,
    }
    // SAFETY: the ring's memory is only accessed through the queue halves, which
    // synchronise with atomics.
    unsafe impl Sync for Ring {}
    let ring = Arc::new(Ring {
        header: std::cell::UnsafeCell::new(slot::new_header(8, 256).unwrap()),
        slots: std::cell::UnsafeCell::new([0; 8 * 256]),
    });
    let hdr = std::ptr::NonNull::new(ring.header.get()).unwrap();
    let slots = std::ptr::NonNull::new(ring.slots.get().cast::<u8>()).unwrap();
    let keep: Arc<dyn std::any::Any + Send + Sync> = ring.clone();
    // SAFETY: `keep` keeps the memory alive as long as either half lives; the header was
    // initialised by `new_header`; there is exactly one producer and one consumer.
    let (mut tx, mut rx) = unsafe {
        (
            slot::SlotProducer::from_raw_parts(hdr, slots, Some(keep.clone())).unwrap(),
            slot::SlotConsumer::from_raw_parts(hdr, slots, Some(keep)).unwrap(),
        )
    };
    drop(ring);
    let n = N / 5;
    let p = thread::spawn(move || {
        let mut w = Watchdog::new("raw producer");
        for i in 0..n {
            let (h, payload) = msg(2, i);
            while tx.try_push(&h, &payload).is_err() {
                w.idle(|| format!("{:?}", tx.stats()));
            }
            w.progress();
        }
    });
    let mut w = Watchdog::new("raw consumer");
    let mut next = 0;
    while next < n {
        match rx.try_pop().unwrap() {
            Some(e) => {
                assert_eq!(e.header.message_id, next);
                assert_eq!(e.payload, msg(2, next).1);
                next += 1;
                w.progress();
            }
            None => w.idle(|| format!("expecting {next}, {:?}", rx.stats())),
        }
    }
    p.join().unwrap();
    assert_eq!(rx.stats().enqueued, n);
    assert!(rx.is_empty());
}
