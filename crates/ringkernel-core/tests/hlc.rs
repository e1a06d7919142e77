//! Hybrid logical clock: uniqueness and monotonicity under threads, the update rules of
//! Kulkarni et al. (2014) with a controlled physical clock, drift rejection and counter
//! overflow.
//!
//! Run: `cargo test -p ringkernel-core --test hlc`.

use ringkernel_core::hlc::{HlcClock, HlcTimestamp, MAX_LOGICAL};
use ringkernel_core::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};

/// The controllable physical clock, shared by the tests of this file (they take
/// `LOCK` so that they do not move each other's time).
static NOW_MS: AtomicU64 = AtomicU64::new(0);
static LOCK: Mutex<()> = Mutex::new(());

fn fake_now() -> u64 {
    NOW_MS.load(Ordering::SeqCst)
}

fn at(ms: u64) -> MutexGuard<'static, ()> {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    NOW_MS.store(ms, Ordering::SeqCst);
    g
}

fn ts(l: u64, c: u32) -> HlcTimestamp {
    HlcTimestamp::new(l, c)
}

#[test]
fn four_threads_a_million_ticks_each_unique_and_increasing() {
    const THREADS: usize = 4;
    const TICKS: usize = 1_000_000;
    let clock = Arc::new(HlcClock::new(1));
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let clock = clock.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                let mut v = Vec::with_capacity(TICKS);
                start.wait();
                for _ in 0..TICKS {
                    v.push(clock.tick().as_u64());
                }
                v
            })
        })
        .collect();
    let per_thread: Vec<Vec<u64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (t, v) in per_thread.iter().enumerate() {
        assert!(
            v.windows(2).all(|w| w[0] < w[1]),
            "thread {t}: sequence not strictly increasing"
        );
    }
    let mut all: Vec<u64> = per_thread.into_iter().flatten().collect();
    assert_eq!(all.len(), THREADS * TICKS);
    all.sort_unstable();
    let before = all.len();
    all.dedup();
    assert_eq!(all.len(), before, "duplicate timestamps across threads");
    assert!(clock.peek().as_u64() >= *all.last().unwrap());
}

#[test]
fn tick_rules() {
    let _g = at(1_000);
    let c = HlcClock::with_physical_clock(0, fake_now, 100);
    // pt ahead of l: l' = pt, c' = 0.
    assert_eq!(c.tick(), ts(1_000, 0));
    // pt unchanged: the counter advances.
    assert_eq!(c.tick(), ts(1_000, 1));
    assert_eq!(c.tick(), ts(1_000, 2));
    // Physical clock goes backwards: l holds, the counter advances.
    NOW_MS.store(900, Ordering::SeqCst);
    assert_eq!(c.tick(), ts(1_000, 3));
    // Physical clock moves on: counter resets.
    NOW_MS.store(1_001, Ordering::SeqCst);
    assert_eq!(c.tick(), ts(1_001, 0));
    assert_eq!(c.peek(), ts(1_001, 0));
}

#[test]
fn update_rules_of_the_paper() {
    let _g = at(1_000);
    let c = HlcClock::with_physical_clock(0, fake_now, 1_000);
    c.tick();
    c.tick(); // state (1000, 1)

    // l' == l == l_m: c' = max(c, c_m) + 1.
    assert_eq!(c.update(&ts(1_000, 7)).unwrap(), ts(1_000, 8));
    assert_eq!(c.update(&ts(1_000, 3)).unwrap(), ts(1_000, 9));

    // l' == l_m only (remote ahead of local and of pt): c' = c_m + 1.
    assert_eq!(c.update(&ts(1_200, 4)).unwrap(), ts(1_200, 5));

    // l' == l only (local ahead of remote and of pt): c' = c + 1.
    assert_eq!(c.update(&ts(1_100, 50)).unwrap(), ts(1_200, 6));

    // pt ahead of both: l' = pt, c' = 0.
    NOW_MS.store(1_500, Ordering::SeqCst);
    assert_eq!(c.update(&ts(1_300, 9)).unwrap(), ts(1_500, 0));

    // pt equals l and l_m: the first case still applies (max counter + 1).
    assert_eq!(c.update(&ts(1_500, 4)).unwrap(), ts(1_500, 5));

    // pt equals l, remote behind: c + 1.
    assert_eq!(c.update(&ts(1_400, 40)).unwrap(), ts(1_500, 6));

    // A receive is always after the remote send and after every local event.
    let r = ts(1_500, 100);
    let got = c.update(&r).unwrap();
    assert!(got > r && got > ts(1_500, 6));
    assert!(c.tick() > got);
}

#[test]
fn drift_is_rejected_and_leaves_the_clock_unchanged() {
    let _g = at(10_000);
    let c = HlcClock::with_physical_clock(0, fake_now, 500);
    assert_eq!(c.max_drift_ms(), 500);
    c.tick();
    let before = c.peek();
    let err = c.update(&ts(10_501, 0)).unwrap_err();
    assert_eq!(
        err,
        Error::ClockDrift {
            drift_ms: 501,
            max_drift_ms: 500
        }
    );
    assert_eq!(
        c.peek(),
        before,
        "a rejected update must not move the clock"
    );
    // Exactly at the limit is accepted.
    assert_eq!(c.update(&ts(10_500, 2)).unwrap(), ts(10_500, 3));
}

#[test]
fn counter_overflow_carries_into_l() {
    let _g = at(5_000);
    let c = HlcClock::with_physical_clock(0, fake_now, 1_000);
    // Bring the counter to its maximum through an update, then tick once more.
    assert_eq!(
        c.update(&ts(5_000, MAX_LOGICAL - 1)).unwrap(),
        ts(5_000, MAX_LOGICAL)
    );
    let t = c.tick();
    assert_eq!(t, ts(5_001, 0), "overflow advances l by one");
    assert!(t > ts(5_000, MAX_LOGICAL));
    // The same through update's c_m + 1 case.
    assert_eq!(c.update(&ts(5_002, MAX_LOGICAL)).unwrap(), ts(5_003, 0));
    // And when the physical clock catches up, it takes over again.
    NOW_MS.store(5_010, Ordering::SeqCst);
    assert_eq!(c.tick(), ts(5_010, 0));
}

#[test]
fn a_full_millisecond_of_ticks_keeps_order() {
    let _g = at(7_000);
    let c = HlcClock::with_physical_clock(0, fake_now, 1_000);
    let mut last = c.tick();
    // More ticks than the counter holds within one frozen millisecond.
    for _ in 0..(MAX_LOGICAL as u64 + 10) {
        let t = c.tick();
        assert!(t > last);
        last = t;
    }
    assert_eq!(last.physical_ms(), 7_001);
    assert_eq!(last.logical(), 9);
}

#[test]
fn clocks_on_two_nodes_never_issue_equal_timestamps() {
    fn frozen() -> u64 {
        42_000
    }
    // Same physical clock, same history: only the node id tells them apart.
    let a = HlcClock::with_physical_clock(1, frozen, 1_000);
    let b = HlcClock::with_physical_clock(2, frozen, 1_000);
    let ta: Vec<_> = (0..1000).map(|_| a.tick()).collect();
    let tb: Vec<_> = (0..1000).map(|_| b.tick()).collect();
    for (x, y) in ta.iter().zip(&tb) {
        assert_eq!(x.packed(), y.packed(), "same time part");
        assert_ne!(x, y);
        assert!(
            x < y,
            "equal (physical, logical): node 1 orders before node 2"
        );
    }
    // Order is (physical, logical, node): a later time wins over a larger node.
    assert!(HlcTimestamp::new(5, 1).with_node(0) > HlcTimestamp::new(5, 0).with_node(u64::MAX));
    assert!(HlcTimestamp::new(6, 0).with_node(0) > HlcTimestamp::new(5, 9).with_node(7));
    // A merge keeps the receiver's node id and moves past the remote.
    let got = b.update(&ta[999]).unwrap();
    assert_eq!(got.node(), 2);
    assert!(got > ta[999] && got > tb[999]);
}
