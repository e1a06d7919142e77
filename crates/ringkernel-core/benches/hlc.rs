//! Hybrid logical clock: `tick` and `update` uncontended, against `uhlc` (Eclipse
//! Zenoh's HLC) in the same run.
//!
//! `uhlc`'s update only merges (it returns no timestamp), ours merges and returns the
//! receive event's timestamp, so ours does slightly more work per call.
//!
//! Each timestamp is stored the way a sender uses it (ours into a message header, the
//! peer's into a local slot) and the store is kept alive with `black_box(&..)`. Passing
//! the 16-byte timestamp to `black_box` by value instead costs the harness about 4 ns
//! by itself on the dev VM (`harness/black_box_16B`: a memory round trip behind an asm
//! barrier, where an 8-byte value stays in a register), which would be measuring the
//! harness, not the clock.
//!
//! `ringkernel/tick` uses the default physical clock (`CLOCK_REALTIME_COARSE` on Linux);
//! `ringkernel/tick_systemtime` uses `SystemTime::now`, the clock `uhlc` reads, so the
//! clock-read cost and the clock-update cost can be told apart.
//!
//! ```text
//! cargo bench -p ringkernel-core --bench hlc -- --warm-up-time 1 --measurement-time 3
//! ```

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringkernel_core::hlc::{system_clock_ms, HlcClock, HlcTimestamp};
use ringkernel_core::message::MessageHeader;
use std::hint::black_box;
use std::time::{SystemTime, UNIX_EPOCH};

fn systemtime_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn bench_tick(c: &mut Criterion) {
    let mut g = c.benchmark_group("hlc_tick");
    g.throughput(Throughput::Elements(1));
    // The physical-clock reads on their own, to split tick's cost.
    g.bench_function("clock/system_clock_ms", |b| {
        b.iter(|| black_box(system_clock_ms()))
    });
    g.bench_function("clock/SystemTime_now", |b| {
        b.iter(|| black_box(systemtime_ms()))
    });
    // The other half of tick's floor: one uncontended atomic add (what tick does when
    // the physical clock has not moved past the clock's time).
    let word = std::sync::atomic::AtomicU64::new(0);
    g.bench_function("floor/atomic_fetch_add", |b| {
        b.iter(|| black_box(word.fetch_add(1, std::sync::atomic::Ordering::AcqRel)))
    });
    g.bench_function("harness/black_box_16B", |b| {
        b.iter(|| black_box(HlcTimestamp::from_parts(black_box(5), 1)))
    });
    let ours = HlcClock::new(1);
    let mut header = MessageHeader::default();
    g.bench_function("ringkernel/tick", |b| {
        b.iter(|| {
            header.set_hlc(ours.tick());
            black_box(&header);
        })
    });
    let ours_std = HlcClock::with_physical_clock(1, systemtime_ms, 1_000);
    g.bench_function("ringkernel/tick_systemtime", |b| {
        b.iter(|| {
            header.set_hlc(ours_std.tick());
            black_box(&header);
        })
    });
    let theirs = uhlc::HLC::default();
    let mut slot = theirs.new_timestamp();
    g.bench_function("uhlc/new_timestamp", |b| {
        b.iter(|| {
            slot = theirs.new_timestamp();
            black_box(&slot);
        })
    });
    g.finish();
}

fn bench_update(c: &mut Criterion) {
    let mut g = c.benchmark_group("hlc_update");
    g.throughput(Throughput::Elements(1));
    let ours = HlcClock::new(1);
    let remote = HlcClock::new(2).tick();
    let mut header = MessageHeader::default();
    g.bench_function("ringkernel/update", |b| {
        b.iter(|| {
            header.set_hlc(ours.update(black_box(&remote)).unwrap());
            black_box(&header);
        })
    });
    let theirs = uhlc::HLC::default();
    let remote_ts = uhlc::HLC::default().new_timestamp();
    g.bench_function("uhlc/update_with_timestamp", |b| {
        b.iter(|| black_box(theirs.update_with_timestamp(black_box(&remote_ts)).is_ok()))
    });
    g.finish();
}

criterion_group!(benches, bench_tick, bench_update);
criterion_main!(benches);
