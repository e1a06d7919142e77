//! Latency histogram accuracy against exact percentiles, concurrent recording, and the
//! counter/runtime snapshots.
//!
//! Run: `cargo test -p ringkernel-core --test telemetry`.

use ringkernel_core::lifecycle::LifecycleState;
use ringkernel_core::runtime::KernelId;
use ringkernel_core::telemetry::{
    KernelCounters, LatencyHistogram, RuntimeMetrics, HISTOGRAM_MAX_RELATIVE_ERROR,
};
use ringkernel_core::BackendKind;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A small xorshift generator so the test needs no extra dependency; seeded from the
/// clock so each run sees fresh data (the seed is printed on failure).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A seed from the clock (never 0, which xorshift would keep at 0).
fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1
}

fn exact(sorted: &[u64], q: f64) -> u64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[test]
fn percentiles_are_within_the_error_bound() {
    let seed = fresh_seed();
    let mut rng = Rng(seed);
    // Three shapes: uniform, log-uniform over 12 decades, and a few huge outliers.
    let datasets: Vec<Vec<u64>> = vec![
        (0..20_000).map(|_| rng.next() % 100_000).collect(),
        (0..20_000)
            .map(|_| 1u64 << (rng.next() % 40) | (rng.next() % 1024))
            .collect(),
        (0..5_000)
            .map(|i| {
                if i % 100 == 0 {
                    u64::MAX - rng.next() % 1000
                } else {
                    rng.next() % 50
                }
            })
            .collect(),
    ];
    for (d, data) in datasets.iter().enumerate() {
        let h = LatencyHistogram::new();
        for &v in data {
            h.record(v);
        }
        let mut sorted = data.clone();
        sorted.sort_unstable();
        for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0] {
            let want = exact(&sorted, q);
            let got = h.percentile(q);
            let err = (got as f64 - want as f64).abs();
            assert!(
                err <= want as f64 * HISTOGRAM_MAX_RELATIVE_ERROR + 0.5,
                "dataset {d}, q {q}: got {got}, exact {want} (seed {seed})"
            );
        }
        assert_eq!(h.percentile(0.0), sorted[0]);
        assert_eq!(h.percentile(1.0), *sorted.last().unwrap());
        let s = h.summary();
        assert_eq!(s.count, data.len() as u64);
        assert_eq!(s.max_ns, *sorted.last().unwrap());
        assert!(s.p50_ns <= s.p90_ns && s.p90_ns <= s.p99_ns && s.p99_ns <= s.max_ns);
    }
}

#[test]
fn small_values_are_exact_and_mean_is_right() {
    let h = LatencyHistogram::new();
    assert_eq!(h.percentile(0.5), 0, "empty");
    assert_eq!(h.summary().count, 0);
    for v in [3u64, 1, 2, 4, 10] {
        h.record(v);
    }
    assert_eq!(h.percentile(0.5), 3);
    assert_eq!(h.percentile(0.2), 1);
    assert_eq!(h.percentile(0.8), 4);
    assert_eq!(h.summary().mean_ns, 4.0);
    assert_eq!(h.percentile(f64::NAN), 1);
    assert_eq!(h.percentile(7.0), 10);
    h.record_duration(Duration::from_micros(1));
    assert_eq!(h.count(), 6);
    assert_eq!(h.max(), 1_000);
}

#[test]
fn record_n_equals_n_records() {
    let (one_by_one, batched) = (LatencyHistogram::new(), LatencyHistogram::new());
    for (v, n) in [(7u64, 3u64), (500, 1000), (90_000, 2)] {
        for _ in 0..n {
            one_by_one.record(v);
        }
        batched.record_n(v, n);
    }
    batched.record_n(1, 0);
    assert_eq!(batched.count(), one_by_one.count());
    assert_eq!(batched.max(), 90_000);
    assert_eq!(batched.percentile(0.0), 7, "the minimum");
    for q in [0.001, 0.01, 0.5, 0.999, 1.0] {
        assert_eq!(batched.percentile(q), one_by_one.percentile(q), "q {q}");
    }
    assert_eq!(batched.summary().mean_ns, one_by_one.summary().mean_ns);
}

#[test]
fn a_batch_records_what_records_one_by_one_do() {
    let seed = fresh_seed();
    let mut rng = Rng(seed);
    let (one_by_one, batched) = (LatencyHistogram::new(), LatencyHistogram::new());
    let mut b = batched.batch();
    // Runs of similar values (as a stream's samples come) and scattered ones.
    for i in 0..20_011u64 {
        let v = match i % 3 {
            0 => 400 + rng.next() % 16,
            1 => rng.next() % 5_000_000,
            _ => rng.next() % 40,
        };
        one_by_one.record(v);
        b.record(v);
        if i == 10_000 {
            b.flush();
            assert_eq!(batched.count(), 10_001, "seed {seed}: flushed mid-way");
        }
    }
    assert_eq!(
        batched.count(),
        10_001,
        "seed {seed}: the rest waits for the flush"
    );
    drop(b);
    assert_eq!(batched.count(), one_by_one.count(), "seed {seed}");
    assert_eq!(batched.max(), one_by_one.max(), "seed {seed}");
    for q in [0.0, 0.001, 0.1, 0.5, 0.9, 0.999, 1.0] {
        assert_eq!(
            batched.percentile(q),
            one_by_one.percentile(q),
            "seed {seed}, q {q}"
        );
    }
    assert_eq!(
        batched.summary().mean_ns,
        one_by_one.summary().mean_ns,
        "seed {seed}"
    );
    // An empty batch changes nothing.
    drop(batched.batch());
    assert_eq!(batched.count(), one_by_one.count());
}

#[test]
fn concurrent_recording_loses_nothing() {
    let h = Arc::new(LatencyHistogram::new());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let h = h.clone();
            std::thread::spawn(move || {
                for i in 0..50_000u64 {
                    h.record(t * 1_000_000 + i);
                }
            })
        })
        .collect();
    // Read while they write: must never panic and stay within the recorded range.
    for _ in 0..100 {
        let p = h.percentile(0.5);
        assert!(p <= 3_050_000);
    }
    for t in threads {
        t.join().unwrap();
    }
    let s = h.summary();
    assert_eq!(s.count, 200_000);
    assert_eq!(s.max_ns, 3_049_999);
    let mean = (0..4u64).map(|t| t as f64 * 1e6 + 24_999.5).sum::<f64>() / 4.0;
    assert!((s.mean_ns - mean).abs() < 1e-6 * mean);
}

#[test]
fn snapshots_and_totals() {
    let a = KernelCounters::default();
    a.received.store(10, Ordering::Relaxed);
    a.processed.store(9, Ordering::Relaxed);
    a.dropped.store(1, Ordering::Relaxed);
    a.emitted.store(9, Ordering::Relaxed);
    a.latency.record(1_000);
    let b = KernelCounters::default();
    b.received.store(5, Ordering::Relaxed);
    b.processed.store(5, Ordering::Relaxed);
    let ma = a.snapshot(KernelId(2), "a", LifecycleState::Active, 3, 1);
    let mb = b.snapshot(KernelId(1), "b", LifecycleState::Deactivated, 0, 0);
    assert_eq!(
        (ma.received, ma.processed, ma.dropped, ma.emitted),
        (10, 9, 1, 9)
    );
    assert_eq!(
        (ma.queue_depth, ma.output_depth, ma.name.as_str()),
        (3, 1, "a")
    );
    assert_eq!(ma.latency.count, 1);
    assert_eq!(ma.latency.p50_ns, 1_000);
    let rt = RuntimeMetrics::from_kernels(
        BackendKind::Cpu,
        Duration::from_secs(2),
        vec![ma.clone(), mb.clone()],
    );
    assert_eq!(
        (rt.total_received, rt.total_processed, rt.total_dropped),
        (15, 14, 1)
    );
    assert_eq!(rt.kernels, vec![mb, ma], "sorted by id");
    assert_eq!(rt.uptime, Duration::from_secs(2));
}
