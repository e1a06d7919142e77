//! Batch push/pop on the SPSC slot ring: full and empty rings, wrap-around of slots and
//! of the 64-bit indices, the same validation as the single-message read path, and a
//! two-thread stress test.

use ringkernel_core::message::{flags, MessageHeader, HEADER_SIZE};
use ringkernel_core::queue::slot::{
    new_header, ring_bytes, slot_channel, SlotConsumer, SlotProducer,
};
use ringkernel_core::queue::QueueHeader;
use ringkernel_core::Error;
use std::ptr::NonNull;

fn hdr(id: u64) -> MessageHeader {
    let mut h = MessageHeader::new(5, 0);
    h.message_id = id;
    h
}

/// Pops everything waiting as (message_id, payload) pairs.
fn drain(rx: &mut SlotConsumer) -> Vec<(u64, Vec<u8>)> {
    let mut got = Vec::new();
    loop {
        let n = rx
            .try_pop_batch_with(usize::MAX, |h, p| got.push((h.message_id, p.to_vec())))
            .unwrap();
        if n == 0 {
            return got;
        }
    }
}

#[test]
fn batch_push_stops_when_full_and_counts_one_rejection() {
    let (mut tx, mut rx) = slot_channel(4, 128).unwrap();
    let headers: Vec<_> = (0..6).map(hdr).collect();
    let payloads: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; i as usize + 1]).collect();
    let n = tx
        .try_push_batch(headers.iter().zip(payloads.iter().map(|p| &p[..])))
        .unwrap();
    assert_eq!(n, 4);
    let s = tx.stats();
    assert_eq!((s.enqueued, s.full_rejections, s.depth), (4, 1, 4));
    // A full ring takes nothing.
    assert_eq!(
        tx.try_push_batch([(&headers[4], &payloads[4][..])])
            .unwrap(),
        0
    );
    assert_eq!(tx.stats().full_rejections, 2);
    let got = drain(&mut rx);
    assert_eq!(got.len(), 4);
    for (i, (id, p)) in got.iter().enumerate() {
        assert_eq!((*id, p), (i as u64, &payloads[i]));
    }
    assert_eq!(tx.free(), 4);
}

#[test]
fn batch_pop_on_empty_and_with_max_zero() {
    let (mut tx, mut rx) = slot_channel(8, 128).unwrap();
    let mut calls = 0;
    assert_eq!(
        rx.try_pop_batch_with(usize::MAX, |_, _| calls += 1)
            .unwrap(),
        0
    );
    tx.try_push(&hdr(1), b"x").unwrap();
    assert_eq!(rx.try_pop_batch_with(0, |_, _| calls += 1).unwrap(), 0);
    assert_eq!(calls, 0);
    assert_eq!(rx.len(), 1, "max 0 takes nothing");
    assert_eq!(rx.try_pop_batch_with(1, |_, _| calls += 1).unwrap(), 1);
    assert_eq!((calls, rx.len(), rx.stats().dequeued), (1, 0, 1));
}

#[test]
fn batch_pop_respects_max_and_order() {
    let (mut tx, mut rx) = slot_channel(16, 128).unwrap();
    let h: Vec<_> = (0..10).map(hdr).collect();
    let n = tx.try_push_batch(h.iter().map(|h| (h, &b"p"[..]))).unwrap();
    assert_eq!(n, 10);
    let mut ids = Vec::new();
    assert_eq!(
        rx.try_pop_batch_with(3, |h, _| ids.push(h.message_id))
            .unwrap(),
        3
    );
    assert_eq!(
        rx.stats().dequeued,
        3,
        "the head is published once per batch"
    );
    assert_eq!(
        rx.try_pop_batch_with(100, |h, _| ids.push(h.message_id))
            .unwrap(),
        7
    );
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
}

#[test]
fn batches_wrap_around_the_slots() {
    let (mut tx, mut rx) = slot_channel(4, 128).unwrap();
    let mut next = 0u64;
    let mut expect = 0u64;
    // Batches of 3 on a ring of 4: every batch after the first straddles the end.
    for _ in 0..20 {
        let h: Vec<_> = (next..next + 3).map(hdr).collect();
        let payloads: Vec<[u8; 8]> = (next..next + 3).map(u64::to_le_bytes).collect();
        let n = tx
            .try_push_batch(h.iter().zip(payloads.iter().map(|p| &p[..])))
            .unwrap();
        assert_eq!(n, 3);
        next += 3;
        for (id, p) in drain(&mut rx) {
            assert_eq!(id, expect);
            assert_eq!(p, expect.to_le_bytes());
            expect += 1;
        }
    }
    assert_eq!(expect, 60);
}

#[test]
fn oversized_payload_mid_batch_publishes_the_ones_before() {
    let (mut tx, mut rx) = slot_channel(8, 128).unwrap();
    let big = [0u8; 65];
    let h = hdr(0);
    let msgs: [(&MessageHeader, &[u8]); 4] = [(&h, b"a"), (&h, b"b"), (&h, &big), (&h, b"d")];
    assert_eq!(
        tx.try_push_batch(msgs),
        Err(Error::MessageTooLarge { size: 65, max: 64 })
    );
    assert_eq!(tx.stats().enqueued, 2);
    let got: Vec<_> = drain(&mut rx).into_iter().map(|(_, p)| p).collect();
    assert_eq!(got, vec![b"a".to_vec(), b"b".to_vec()]);
}

/// A ring in caller-owned memory (as a GPU backend maps it), with both halves made by
/// `from_raw_parts`, so the test can corrupt slots behind the producer's back. Every
/// access goes through one raw pointer (no reference to the memory is ever made).
struct RawRing {
    base: *mut u8,
    lines: usize,
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

impl RawRing {
    fn new(
        capacity: usize,
        slot_size: usize,
        start_index: u64,
    ) -> (Self, SlotProducer, SlotConsumer) {
        let bytes = ring_bytes(capacity, slot_size).unwrap();
        let lines = bytes.div_ceil(64);
        let mem: Box<[Line]> = vec![Line([0; 64]); lines].into_boxed_slice();
        let base = Box::into_raw(mem).cast::<u8>();
        let mut header: QueueHeader = new_header(capacity, slot_size).unwrap();
        header.tail = start_index;
        header.head = start_index;
        // SAFETY: `base` holds `bytes` bytes aligned to 64; the header goes at offset 0.
        unsafe { base.cast::<QueueHeader>().write(header) };
        let h = NonNull::new(base.cast::<QueueHeader>()).unwrap();
        // SAFETY: the slots follow the 128-byte header inside the allocation.
        let slots = NonNull::new(unsafe { base.add(std::mem::size_of::<QueueHeader>()) }).unwrap();
        // SAFETY: the allocation outlives both halves (each test drops them before the
        // RawRing); there is exactly one producer and one consumer; nothing else
        // touches the indices.
        let tx = unsafe { SlotProducer::from_raw_parts(h, slots, None).unwrap() };
        // SAFETY: as above.
        let rx = unsafe { SlotConsumer::from_raw_parts(h, slots, None).unwrap() };
        (RawRing { base, lines }, tx, rx)
    }

    /// Applies `f` to the bytes of the slot of `index` (the test only calls this while
    /// the slot is published and not being read).
    fn corrupt(&self, index: u64, capacity: usize, slot_size: usize, f: fn(&mut [u8])) {
        let off =
            std::mem::size_of::<QueueHeader>() + (index as usize & (capacity - 1)) * slot_size;
        assert!(off + slot_size <= self.lines * 64);
        // SAFETY: the slot lies inside the allocation, and no ring half reads or writes
        // it while `f` runs (single-threaded test, slot published and not popped).
        f(unsafe { std::slice::from_raw_parts_mut(self.base.add(off), slot_size) })
    }
}

impl Drop for RawRing {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.base.cast::<Line>(), self.lines);
        // SAFETY: `base` came from `Box::into_raw` of a boxed slice of `lines` Lines
        // and is freed once, after both halves were dropped.
        drop(unsafe { Box::from_raw(slice) });
    }
}

#[test]
fn the_64_bit_indices_wrap() {
    let start = u64::MAX - 2;
    let (_mem, mut tx, mut rx) = RawRing::new(4, 128, start);
    let h: Vec<_> = (0..4).map(hdr).collect();
    for round in 0..3 {
        let n = tx.try_push_batch(h.iter().map(|h| (h, &b"w"[..]))).unwrap();
        assert_eq!(n, 4, "round {round}");
        assert_eq!(
            tx.try_push(&hdr(9), b"x"),
            Err(Error::QueueFull { capacity: 4 })
        );
        let ids: Vec<_> = drain(&mut rx).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, vec![0, 1, 2, 3], "round {round}");
    }
    assert_eq!(rx.stats().dequeued, start.wrapping_add(12));
    drop((tx, rx));
}

/// How one corruption shows on the two read paths: the single-message `try_pop` and
/// the batch path must reject the same slots with the same error.
#[test]
fn corrupt_slots_are_rejected_on_the_batch_path_like_on_try_pop() {
    type Corrupt = fn(&mut [u8]);
    let cases: [(&str, Corrupt, &str); 4] = [
        ("magic", |s| s[0] ^= 0xFF, "magic"),
        ("version", |s| s[4] = 99, "version"),
        (
            "payload_len",
            |s| s[12..16].copy_from_slice(&1000u32.to_le_bytes()),
            "payload_len",
        ),
        ("checksum", |s| s[HEADER_SIZE] ^= 1, "checksum"),
    ];
    for (what, corrupt, needle) in cases {
        let mut errors = Vec::new();
        for batch in [false, true] {
            let (mem, mut tx, mut rx) = RawRing::new(8, 128, 0);
            let mut h = hdr(0);
            h.flags |= flags::CHECKSUM;
            for i in 0..3u64 {
                h.message_id = i;
                tx.try_push(&h, &i.to_le_bytes()).unwrap();
            }
            mem.corrupt(1, 8, 128, corrupt);
            let mut ids = Vec::new();
            let err = if batch {
                let r = rx.try_pop_batch_with(usize::MAX, |h, _| ids.push(h.message_id));
                r.expect_err("a corrupt slot is an error on the batch path")
            } else {
                ids.push(rx.try_pop().unwrap().unwrap().header.message_id);
                rx.try_pop()
                    .expect_err("a corrupt slot is an error on try_pop")
            };
            assert_eq!(ids, vec![0], "{what}: the message before it is delivered");
            assert!(
                matches!(err, Error::Device(ref m) if m.contains(needle)),
                "{what}: {err}"
            );
            assert_eq!(
                rx.stats().dequeued,
                2,
                "{what}: the corrupt slot is consumed"
            );
            // The ring goes on: the message after it is intact.
            let rest = drain(&mut rx);
            assert_eq!(rest.len(), 1, "{what}");
            assert_eq!(rest[0], (2, 2u64.to_le_bytes().to_vec()), "{what}");
            errors.push(err);
            drop((tx, rx));
        }
        assert_eq!(
            errors[0], errors[1],
            "{what}: both paths report the same error"
        );
    }
}

#[test]
fn two_threads_stream_batches() {
    const N: u64 = if cfg!(miri) { 3_000 } else { 200_000 };
    let (mut tx, mut rx) = slot_channel(64, 128).unwrap();
    let producer = std::thread::spawn(move || {
        let mut next = 0u64;
        let mut batch = 1u64;
        while next < N {
            let k = batch.min(N - next);
            let h: Vec<_> = (next..next + k).map(hdr).collect();
            let p: Vec<[u8; 16]> = (next..next + k)
                .map(|i| {
                    let mut b = [0u8; 16];
                    b[..8].copy_from_slice(&i.to_le_bytes());
                    b[8..].copy_from_slice(&(!i).to_le_bytes());
                    b
                })
                .collect();
            let n = tx
                .try_push_batch(h.iter().zip(p.iter().map(|p| &p[..])))
                .unwrap() as u64;
            next += n;
            if n == 0 {
                std::thread::yield_now();
            }
            batch = batch % 97 + 1;
        }
        tx
    });
    let mut expect = 0u64;
    let mut max = 1usize;
    let mut first_bad: Option<String> = None;
    while expect < N {
        let n = rx
            .try_pop_batch_with(max, |h, p| {
                let ok = h.message_id == expect
                    && p.len() == 16
                    && p[..8] == expect.to_le_bytes()
                    && p[8..] == (!expect).to_le_bytes();
                if !ok && first_bad.is_none() {
                    first_bad = Some(format!("message {expect}: got id {} {p:?}", h.message_id));
                }
                expect += 1;
            })
            .unwrap();
        if n == 0 {
            std::thread::yield_now();
        }
        max = max % 50 + 1;
    }
    let tx = producer.join().unwrap();
    assert_eq!(first_bad, None);
    assert_eq!(expect, N);
    assert!(rx.is_empty());
    assert_eq!((tx.stats().enqueued, rx.stats().dequeued), (N, N));
}
