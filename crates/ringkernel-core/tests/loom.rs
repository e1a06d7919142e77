//! Model-checked tests of the typed queues with `loom`: every interleaving (up to loom's
//! preemption bound) of a producer and a consumer, checking no loss, no duplication, FIFO
//! order and drop accounting.
//!
//! Not part of the normal test run (CI does not run it). Run it with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p ringkernel-core --test loom --release
//! ```
//!
//! Under `--cfg loom` the queues' atomics, `Arc` and `UnsafeCell` come from `loom`
//! (see `src/sync.rs`), so loom sees every shared-memory access the queues make.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use ringkernel_core::queue::{mpsc, spsc};

#[test]
fn spsc_transfers_in_order_through_wraparound() {
    loom::model(|| {
        // Capacity 2 and 3 items: the producer must see "full" and the ring must wrap.
        let (mut tx, mut rx) = spsc::channel::<u32>(2).unwrap();
        let p = thread::spawn(move || {
            for i in 0..3 {
                let mut v = i;
                loop {
                    match tx.push(v) {
                        Ok(()) => break,
                        Err(back) => {
                            v = back;
                            thread::yield_now();
                        }
                    }
                }
            }
        });
        let mut next = 0;
        while next < 3 {
            match rx.pop() {
                Some(v) => {
                    assert_eq!(v, next);
                    next += 1;
                }
                None => thread::yield_now(),
            }
        }
        p.join().unwrap();
        assert_eq!(rx.pop(), None);
    });
}

/// Counts drops so that loom checks no value is dropped twice or leaked.
struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn spsc_drop_with_items_in_flight() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut tx, mut rx) = spsc::channel::<Counted>(2).unwrap();
        let d = drops.clone();
        let p = thread::spawn(move || {
            let _ = tx.push(Counted(d.clone()));
            let _ = tx.push(Counted(d));
            // `tx` dropped here, maybe before the consumer has looked.
        });
        let popped = rx.pop();
        drop(popped);
        drop(rx);
        p.join().unwrap();
        // Both items were pushed (capacity 2) and each is dropped exactly once, whether
        // popped or left in the ring.
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}

#[test]
fn mpsc_two_producers() {
    loom::model(|| {
        let (tx, mut rx) = mpsc::channel::<(u8, u8)>(2).unwrap();
        let handles: Vec<_> = (0..2u8)
            .map(|p| {
                let tx = tx.clone();
                thread::spawn(move || {
                    // Each producer pushes 1 item into a ring of 2: never full.
                    tx.push((p, 0)).unwrap();
                })
            })
            .collect();
        drop(tx);
        let mut seen = [false; 2];
        let mut got = 0;
        while got < 2 {
            match rx.pop() {
                Some((p, i)) => {
                    assert_eq!(i, 0);
                    assert!(!seen[p as usize], "duplicate");
                    seen[p as usize] = true;
                    got += 1;
                }
                None => thread::yield_now(),
            }
        }
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(rx.pop(), None);
    });
}

#[test]
fn mpsc_full_and_wraparound() {
    loom::model(|| {
        let (tx, mut rx) = mpsc::channel::<u8>(1).unwrap();
        // The single slot is taken: the other producer sees "full" until we pop.
        tx.push(1).unwrap();
        let tx2 = tx.clone();
        let p = thread::spawn(move || {
            while tx2.push(2).is_err() {
                thread::yield_now();
            }
        });
        let mut got = Vec::new();
        while got.len() < 2 {
            match rx.pop() {
                Some(v) => got.push(v),
                None => thread::yield_now(),
            }
        }
        p.join().unwrap();
        assert_eq!(got, vec![1, 2]);
        assert_eq!(tx.push(3), Ok(()), "the slot is free again after two laps");
        assert_eq!(rx.pop(), Some(3));
    });
}
