//! Queue throughput: producer and consumer on two threads.
//!
//! * `spsc_u64`: 8-byte items through our typed SPSC ring, `rtrb` and
//!   `crossbeam_queue::ArrayQueue` (same capacity, same spin/yield policy).
//! * `slots`: full message slots (64-byte header + payload, 256-byte slots) through the
//!   SPSC slot ring (`slot_channel`) and the MPSC one (`mpsc_slot_channel`), written in
//!   place by `try_push` and read in place by `pop_with`.
//! * `batches_128B`: 64-byte payloads in 128-byte slots, 256 per batch, through the
//!   stamped ring (what the CUDA backend's host side does per message when streaming)
//!   and the plain slot ring's batch calls.
//! * `stamped_alone_64K`: the stamped ring's producer and consumer each alone, on a
//!   ring of 65,536 128-byte slots (as the CUDA streaming bench's): nanoseconds a
//!   message of each host thread's own work.
//!
//! Throughput is in messages per second (`Throughput::Elements`). A quick run:
//!
//! ```text
//! cargo bench -p ringkernel-core --bench queue -- --warm-up-time 1 --measurement-time 3
//! ```

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use crossbeam_queue::ArrayQueue;
use ringkernel_core::message::MessageHeader;
use ringkernel_core::queue::{mpsc, slot, spsc};
use std::hint::black_box;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Ring capacity used by every contender.
const CAP: usize = 4096;

/// Waiting policy shared by all contenders (the one `crossbeam_utils::Backoff::snooze`
/// uses): spin `2^step` pause instructions, doubling up to 64, then give the core away
/// (the machine may have fewer free cores than threads).
struct Backoff(u32);
impl Backoff {
    #[inline(always)]
    fn new() -> Self {
        Backoff(0)
    }
    #[inline(always)]
    fn reset(&mut self) {
        self.0 = 0;
    }
    #[inline(always)]
    fn wait(&mut self) {
        if self.0 <= 6 {
            for _ in 0..1u32 << self.0 {
                std::hint::spin_loop();
            }
            self.0 += 1;
        } else {
            thread::yield_now();
        }
    }
}

/// Runs `consume` on a second thread and `produce` here; returns the time from the start
/// of production until the consumer has taken everything.
fn two_threads<P, C>(produce: P, consume: C) -> Duration
where
    P: FnOnce(),
    C: FnOnce() -> u64 + Send + 'static,
{
    let consumer = thread::spawn(consume);
    let start = Instant::now();
    produce();
    black_box(consumer.join().unwrap());
    start.elapsed()
}

fn spsc_ours(iters: u64) -> Duration {
    let (mut tx, mut rx) = spsc::channel::<u64>(CAP).unwrap();
    two_threads(
        move || {
            let mut b = Backoff::new();
            for i in 0..iters {
                let mut v = i;
                while let Err(back) = tx.push(v) {
                    v = back;
                    b.wait();
                }
                b.reset();
            }
        },
        move || {
            let (mut n, mut sum, mut b) = (0, 0u64, Backoff::new());
            while n < iters {
                match rx.pop() {
                    Some(v) => {
                        sum = sum.wrapping_add(v);
                        n += 1;
                        b.reset();
                    }
                    None => b.wait(),
                }
            }
            sum
        },
    )
}

fn spsc_rtrb(iters: u64) -> Duration {
    let (mut tx, mut rx) = rtrb::RingBuffer::<u64>::new(CAP);
    two_threads(
        move || {
            let mut b = Backoff::new();
            for i in 0..iters {
                let mut v = i;
                while let Err(rtrb::PushError::Full(back)) = tx.push(v) {
                    v = back;
                    b.wait();
                }
                b.reset();
            }
        },
        move || {
            let (mut n, mut sum, mut b) = (0, 0u64, Backoff::new());
            while n < iters {
                match rx.pop() {
                    Ok(v) => {
                        sum = sum.wrapping_add(v);
                        n += 1;
                        b.reset();
                    }
                    Err(_) => b.wait(),
                }
            }
            sum
        },
    )
}

fn spsc_crossbeam(iters: u64) -> Duration {
    let q = Arc::new(ArrayQueue::<u64>::new(CAP));
    let rq = q.clone();
    two_threads(
        move || {
            let mut b = Backoff::new();
            for i in 0..iters {
                let mut v = i;
                while let Err(back) = q.push(v) {
                    v = back;
                    b.wait();
                }
                b.reset();
            }
        },
        move || {
            let (mut n, mut sum, mut b) = (0, 0u64, Backoff::new());
            while n < iters {
                match rq.pop() {
                    Some(v) => {
                        sum = sum.wrapping_add(v);
                        n += 1;
                        b.reset();
                    }
                    None => b.wait(),
                }
            }
            sum
        },
    )
}

fn mpsc_ours_one_producer(iters: u64) -> Duration {
    let (tx, mut rx) = mpsc::channel::<u64>(CAP).unwrap();
    two_threads(
        move || {
            let mut b = Backoff::new();
            for i in 0..iters {
                let mut v = i;
                while let Err(back) = tx.push(v) {
                    v = back;
                    b.wait();
                }
                b.reset();
            }
        },
        move || {
            let (mut n, mut sum, mut b) = (0, 0u64, Backoff::new());
            while n < iters {
                match rx.pop() {
                    Some(v) => {
                        sum = sum.wrapping_add(v);
                        n += 1;
                        b.reset();
                    }
                    None => b.wait(),
                }
            }
            sum
        },
    )
}

fn bench_spsc(c: &mut Criterion) {
    let mut g = c.benchmark_group("spsc_u64");
    g.throughput(Throughput::Elements(1));
    g.bench_function("ringkernel", |b| b.iter_custom(spsc_ours));
    g.bench_function("rtrb", |b| b.iter_custom(spsc_rtrb));
    g.bench_function("crossbeam_ArrayQueue", |b| b.iter_custom(spsc_crossbeam));
    g.bench_function("ringkernel_mpsc_1p", |b| {
        b.iter_custom(mpsc_ours_one_producer)
    });
    g.finish();
}

/// Slot size and payload of the slot benchmarks.
const SLOT: usize = 256;
const SLOT_CAP: usize = 1024;

fn header(i: u64) -> MessageHeader {
    let mut h = MessageHeader::new(1, 0);
    h.message_id = i;
    h
}

fn slots_spsc(iters: u64, payload_len: usize) -> Duration {
    let (mut tx, mut rx) = slot::slot_channel(SLOT_CAP, SLOT).unwrap();
    let payload = vec![0x5Au8; payload_len];
    two_threads(
        move || {
            let mut b = Backoff::new();
            for i in 0..iters {
                let h = header(i);
                while tx.try_push(&h, &payload).is_err() {
                    b.wait();
                }
                b.reset();
            }
        },
        move || {
            let (mut n, mut sum, mut b) = (0, 0u64, Backoff::new());
            while n < iters {
                match rx.pop_with(|h, p| h.message_id ^ p[p.len() - 1] as u64) {
                    Some(v) => {
                        sum = sum.wrapping_add(v);
                        n += 1;
                        b.reset();
                    }
                    None => b.wait(),
                }
            }
            sum
        },
    )
}

fn slots_mpsc(iters: u64, payload_len: usize) -> Duration {
    let (tx, mut rx) = slot::mpsc_slot_channel(SLOT_CAP, SLOT).unwrap();
    let payload = vec![0x5Au8; payload_len];
    two_threads(
        move || {
            let mut b = Backoff::new();
            for i in 0..iters {
                let h = header(i);
                while tx.try_push(&h, &payload).is_err() {
                    b.wait();
                }
                b.reset();
            }
        },
        move || {
            let (mut n, mut sum, mut b) = (0, 0u64, Backoff::new());
            while n < iters {
                match rx.pop_with(|h, p| h.message_id ^ p[p.len() - 1] as u64) {
                    Some(v) => {
                        sum = sum.wrapping_add(v);
                        n += 1;
                        b.reset();
                    }
                    None => b.wait(),
                }
            }
            sum
        },
    )
}

fn bench_slots(c: &mut Criterion) {
    let mut g = c.benchmark_group("slots_256B");
    g.throughput(Throughput::Elements(1));
    for payload in [32usize, 192] {
        g.bench_function(format!("spsc_payload_{payload}"), |b| {
            b.iter_custom(|n| slots_spsc(n, payload))
        });
        g.bench_function(format!("mpsc_payload_{payload}"), |b| {
            b.iter_custom(|n| slots_mpsc(n, payload))
        });
    }
    g.finish();
}

/// `iters` 64-byte messages through a ring, pushed in batches of up to 256 by `push(n)`
/// (returns how many it took) and popped in batches by `pop(&mut sum)` (returns how
/// many it took, folding each into `sum`), on two threads.
fn batches(
    iters: u64,
    mut push: impl FnMut(usize) -> usize,
    mut pop: impl FnMut(&mut u64) -> usize + Send + 'static,
) -> Duration {
    two_threads(
        move || {
            let (mut sent, mut b) = (0u64, Backoff::new());
            while sent < iters {
                let n = push((iters - sent).min(256) as usize);
                sent += n as u64;
                if n == 0 {
                    b.wait();
                } else {
                    b.reset();
                }
            }
        },
        move || {
            let (mut n, mut sum, mut b) = (0u64, 0u64, Backoff::new());
            while n < iters {
                let got = pop(&mut sum);
                n += got as u64;
                if got == 0 {
                    b.wait();
                } else {
                    b.reset();
                }
            }
            sum
        },
    )
}

/// [`batches`] over a channel made by `$channel(SLOT_CAP, 128)`: the stamped and the
/// slot rings have the same batch API but no common trait.
macro_rules! batches_over {
    ($name:ident, $channel:path) => {
        fn $name(iters: u64) -> Duration {
            let (mut tx, mut rx) = $channel(SLOT_CAP, 128).unwrap();
            let (h, payload) = (MessageHeader::new(1, 64), [0x5Au8; 64]);
            batches(
                iters,
                move |want| {
                    tx.try_push_batch(std::iter::repeat_n((&h, &payload[..]), want))
                        .unwrap()
                },
                move |sum| {
                    rx.try_pop_batch_with(256, |h, p| {
                        *sum = sum.wrapping_add(h.type_id as u64 ^ p[63] as u64)
                    })
                    .unwrap()
                },
            )
        }
    };
}
batches_over!(
    batches_stamped,
    ringkernel_core::queue::stamped::stamped_channel
);
batches_over!(batches_plain, slot::slot_channel);

/// Slots of the stamped ring in `alone`: the CUDA streaming bench's queue capacity, so
/// the ring (11.5 MB) does not fit a core's caches, as there.
const ALONE_CAP: usize = 1 << 16;

/// One thread's work alone on a stamped ring of [`ALONE_CAP`] 128-byte slots: the
/// producer filling the empty ring with 64-byte payloads in batches of 4,096 (`produce`
/// true), or the consumer draining the full ring (the time of the other half is left
/// out). What the CUDA backend's host threads each do per message when streaming.
fn stamped_alone(iters: u64, produce: bool) -> Duration {
    let (mut tx, mut rx) =
        ringkernel_core::queue::stamped::stamped_channel(ALONE_CAP, 128).unwrap();
    let (h, payload) = (MessageHeader::new(1, 64), [0x5Au8; 64]);
    let mut spent = Duration::ZERO;
    let mut done = 0u64;
    let mut sum = 0u64;
    while done < iters {
        let n = (iters - done).min(ALONE_CAP as u64) as usize;
        let t = Instant::now();
        let mut sent = 0;
        while sent < n {
            sent += tx
                .try_push_batch(std::iter::repeat_n(
                    (&h, &payload[..]),
                    (n - sent).min(4096),
                ))
                .unwrap();
        }
        if produce {
            spent += t.elapsed();
        }
        let t = Instant::now();
        let mut got = 0;
        while got < n {
            got += rx
                .try_pop_batch_with(usize::MAX, |h, p| {
                    sum = sum.wrapping_add(h.type_id as u64 ^ p[63] as u64)
                })
                .unwrap();
        }
        if !produce {
            spent += t.elapsed();
        }
        done += n as u64;
    }
    black_box(sum);
    spent
}

fn bench_batches(c: &mut Criterion) {
    let mut g = c.benchmark_group("batches_128B");
    g.throughput(Throughput::Elements(1));
    g.bench_function("stamped", |b| b.iter_custom(batches_stamped));
    g.bench_function("slot_ring", |b| b.iter_custom(batches_plain));
    g.finish();
    let mut g = c.benchmark_group("stamped_alone_64K");
    g.throughput(Throughput::Elements(1));
    g.bench_function("producer", |b| b.iter_custom(|n| stamped_alone(n, true)));
    g.bench_function("consumer", |b| b.iter_custom(|n| stamped_alone(n, false)));
    g.finish();
}

criterion_group!(benches, bench_spsc, bench_slots, bench_batches);
criterion_main!(benches);
