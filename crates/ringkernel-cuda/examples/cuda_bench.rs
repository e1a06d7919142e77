//! Benchmarks of the CUDA backend (run on a GPU machine, release build):
//!
//! ```text
//! cargo run --release -p ringkernel-cuda --example cuda_bench -- [--quick] [--out results.txt]
//!     [--only compute|actors|k2k|rt|stream]
//! ```
//!
//! 1. One message host → GPU handler → host: round trip p50/p99 through a persistent
//!    kernel (engine API, spinning; and `KernelHandle::call`), beside one kernel launch
//!    per message + synchronise, and a CUDA-graph replay per message (`--only rt`: the
//!    persistent kernel's two alone).
//! 2. Streaming 64-byte-payload messages through one persistent kernel (msgs/s), with
//!    each host thread's CPU a message (`--only stream`: this alone; `BENCH_STREAM_*`
//!    variables shape it, see `stream`).
//! 3. K2K on the GPU: messages/s from one kernel to another through the device inbox,
//!    and the one-way latency (device clock). `BENCH_K2K_*` variables shape it (see
//!    `k2k`).
//! 4. add / softmax / RMSNorm on 64M f32 (GB/s) and a device-to-device copy.
//! 5. matmul 8192² fp32 and TF32 (TFLOP/s).

use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::compute::{BinaryOp, ComputeBackend, MatmulDims};
use ringkernel_core::message::{Envelope, MessageHeader, RingMessage};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::{GpuHandler, KernelRegistry};
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_core::util::SplitMix64;
use ringkernel_core::Result;
use ringkernel_cuda::baseline::{check_echo, LaunchBaseline};
use ringkernel_cuda::{CudaCompute, CudaRuntime};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const STREAM_SRC: &str = r#"
// bench.stream: replies with the same 64-byte payload (parallel: one thread a message).
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)ctx; (void)state; (void)out_hdr;
    const uint4* s = (const uint4*)in_payload;
    uint4* d = (uint4*)out_payload;
    for (unsigned i = 0; i < in_hdr->payload_len / 16; i++) d[i] = s[i];
    return 1;
}
"#;

const K2K_SRC_SRC: &str = r#"
// bench.k2k_src: payload {u32 dest, u32 count, u32 batch, u32 pad}: sends `count`
// messages to kernel `dest` through its device inbox, each carrying the device time of
// its send: one at a time (`rk_send_to`) when `batch` is 0 or 1, else up to `batch` with
// one reservation (`rk_send_many_to`); what a full inbox refuses is retried. Replies
// {u64 retries, u64 ns} (calls refused for a full inbox, device time inside the
// delivering calls) when done. Parallel: several triggers send at once.
struct Trigger { unsigned dest; unsigned count; unsigned batch; unsigned pad; };
struct Probe { unsigned long long sent_ns; unsigned long long pad[3]; };
#define K2K_MAX_BATCH 16u
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state; (void)out_hdr; (void)out_payload;
    const Trigger t = *(const Trigger*)in_payload;
    if (in_hdr->payload_len != sizeof(Trigger) || t.batch > K2K_MAX_BATCH) return -3;
    unsigned long long full = 0;  // calls refused for a full inbox (and retried)
    unsigned long long in_send = 0;  // device time inside the delivering calls
    Probe p[K2K_MAX_BATCH];
    for (unsigned b = 0; b < K2K_MAX_BATCH; b++) p[b].pad[0] = p[b].pad[1] = p[b].pad[2] = 0;
    const unsigned step = t.batch > 1u ? t.batch : 1u;
    for (unsigned i = 0; i < t.count;) {
        const unsigned n = t.count - i < step ? t.count - i : step;
#ifndef K2K_SPLIT
        // This warp's route hint as the send finds it (read before the timed part).
        const RkK2kHint* const hint = ctx->k2k_hint;
        const unsigned long long seen_ns = hint ? hint->seen_ns : 0ull;
        const bool hinted = hint && hint->dest1 == t.dest + 1u;
#endif
        const unsigned long long t0 = rk_globaltimer_ns();
        for (unsigned b = 0; b < n; b++) p[b].sent_ns = t0;
        int got;
        if (step == 1u) {
#ifdef K2K_SPLIT
            // rk_send_to's steps, each timed (cycles): route, reservation, header, stores.
            int r = RK_K2K_DELIVERED;
            RkK2kHint* const h = ctx->k2k_hint;
            if (t.count == 1u && h && h->dest1 == t.dest + 1u && t0 - h->seen_ns < RK_K2K_HINT_FRESH_NS) {
                // The hinted path as rk_send_to takes it (a fresh hint: the route's
                // load in flight while the compare-and-swap from the hint goes out),
                // timed: the route's load issued and the hint read, the swap until its
                // result is back, the route's result, and the header and stores.
                const long long c0 = clock64();
                uint4 a, b;
                rk_k2k_route_load(ctx, t.dest, &a, &b);
                RkInbox* const ib = (RkInbox*)h->inbox;
                const rk_u64 idx = h->next, head = h->head, cap = h->cap;
                const long long c1 = clock64();
                const rk_u64 seen = idx >= head && idx - head < cap ? rk_k2k_cas(&ib->reserve, idx, idx + 1u) : ~idx;
                const long long c2 = clock64();
                const bool valid = b.y == 1u && b.x == t.dest && ((rk_u64)a.x | ((rk_u64)a.y << 32)) == h->inbox;
                const long long c3 = clock64();
                if (seen != idx || !valid) return -3;
                h->next = idx + 1u;
                h->seen_ns = t0;
                const RkK2kDest d = rk_k2k_hint_dest(h);
                union { RkMessageHeader h; rk_u32 w[16]; } u;
                rk_k2k_header(ctx, &u.h, t.dest, 0x42, sizeof(Probe));
                rk_k2k_write(d, idx, u.w, (const unsigned char*)&p[0], sizeof(Probe));
                const long long c4 = clock64();
                unsigned long long* o = (unsigned long long*)out_payload;
                o[2] = c1 - c0; o[3] = c2 - c1; o[4] = c3 - c2; o[5] = c4 - c3;
                o[6] = 1;
                in_send += rk_globaltimer_ns() - t0;
                i += 1;
                continue;
            }
            const long long c0 = clock64();
            RkK2kDest d;
            if (!rk_k2k_route(ctx, t.dest, sizeof(Probe), &d)) return -3;
            const long long c1 = clock64();
            rk_u64 idx;
            if (rk_k2k_reserve<true>(d, 1u, &idx, ctx->k2k_hint) == 0u) r = RK_K2K_QUEUE_FULL;
            const long long c2 = clock64();
            if (r == RK_K2K_DELIVERED) {
                union { RkMessageHeader h; rk_u32 w[16]; } u;
                rk_k2k_header(ctx, &u.h, t.dest, 0x42, sizeof(Probe));
                const long long c3 = clock64();
                rk_k2k_write(d, idx, u.w, (const unsigned char*)&p[0], sizeof(Probe));
                const long long c4 = clock64();
                unsigned long long* o = (unsigned long long*)out_payload;
                o[2] = c1 - c0; o[3] = c2 - c1; o[4] = c3 - c2; o[5] = c4 - c3;
                o[6] = 0;
                // As rk_send_to keeps it: the next send may take the hinted path.
                if (h && t.count == 1u) rk_k2k_hint_keep(h, t.dest, t0, d);
            }
#else
            const int r = rk_send_to(ctx, t.dest, 0x42, &p[0], sizeof(Probe));
            // How long before this send (device clock) the warp's hint last saw the
            // route valid: under RK_K2K_HINT_FRESH_NS, rk_send_to reserves beside the
            // route's read.
            if (t.count == 1u && hint) ((unsigned long long*)out_payload)[2] = hinted ? t0 - seen_ns : ~0ull;
#endif
            if (r == RK_K2K_NOT_FOUND) return -3;
            got = r == RK_K2K_DELIVERED ? 1 : 0;
        } else {
            got = rk_send_many_to(ctx, t.dest, 0x42, p, sizeof(Probe), n);
            if (got < 0) return -3;
        }
        if (got > 0) {
            in_send += rk_globaltimer_ns() - t0;
            i += (unsigned)got;
        } else {
            full++;
            __nanosleep(64);
        }
    }
    ((unsigned long long*)out_payload)[0] = full;
    ((unsigned long long*)out_payload)[1] = in_send;
#ifdef K2K_SPLIT
    out_hdr->payload_len = t.count == 1u ? 56 : 16;
#else
    out_hdr->payload_len = t.count == 1u && ctx->k2k_hint ? 24 : 16;
#endif
    return 1;
}
"#;

const K2K_SINK_SRC: &str = r#"
// bench.k2k_sink: counts K2K probes and their one-way latency (device clock). A host
// message {u64 expected} arms it; when `expected` probes have arrived (counted by the
// probe that completes them, or by the arming message if they came first), it replies
// {count, sum_ns, max_ns, first_ns, last_ns} (the device times of the first and the
// last arrival) and resets. Parallel: probes are counted with atomics.
struct SinkState { unsigned long long expected, count, sum, max, not_first, last; };
__device__ int sink_reply(SinkState* s, unsigned long long c, RkMessageHeader* out_hdr, unsigned char* out_payload) {
    __threadfence();
    unsigned long long* o = (unsigned long long*)out_payload;
    o[0] = c;
    o[1] = atomicExch(&s->sum, 0ull);
    o[2] = atomicExch(&s->max, 0ull);
    o[3] = ~atomicExch(&s->not_first, 0ull);
    o[4] = atomicExch(&s->last, 0ull);
    out_hdr->payload_len = 40;
    out_hdr->type_id = 0x43;
    atomicExch(&s->count, 0ull);
    return 1;
}
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    SinkState* s = (SinkState*)state;
    (void)in_hdr;
    if (!ctx->from_inbox) {
        const unsigned long long e = *(const unsigned long long*)in_payload;
        atomicExch(&s->expected, e);
        __threadfence();
        const unsigned long long c = atomicAdd(&s->count, 0ull);
        if (e != 0ull && c >= e && atomicCAS(&s->expected, e, 0ull) == e) return sink_reply(s, c, out_hdr, out_payload);
        return 0;
    }
    const unsigned long long now = rk_globaltimer_ns();
    unsigned long long lat = now - *(const unsigned long long*)in_payload;
    atomicAdd(&s->sum, lat);
    atomicMax(&s->max, lat);
    atomicMax(&s->not_first, ~now);
    atomicMax(&s->last, now);
    __threadfence();  // the sum and max before the count that may complete them
    const unsigned long long c = atomicAdd(&s->count, 1ull) + 1ull;
    if (c == *(volatile unsigned long long*)&s->expected && atomicCAS(&s->expected, c, 0ull) == c)
        return sink_reply(s, c, out_hdr, out_payload);
    return 0;
}
"#;

struct Report {
    text: String,
    out: Option<String>,
}

impl Report {
    /// Prints a line and rewrites the output file, so a run cut short keeps its numbers.
    fn line(&mut self, s: String) {
        println!("{s}");
        let _ = writeln!(self.text, "{s}");
        if let Some(p) = &self.out {
            let _ = std::fs::write(p, &self.text);
        }
    }
}

async fn phase<T>(
    what: &str,
    secs: u64,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(r) => r,
        Err(_) => Err(ringkernel_core::Error::Device(format!(
            "{what}: no result within {secs} s"
        ))),
    }
}

/// The `q` quantile of `v` (sorts it); NaN when `v` is empty.
fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// The median (us) of phase `i` of a kernel's profiled rounds (from `t[i]` to
/// `t[i + 1]`) over those that recorded it; NaN when none did.
fn phase_p50<'a>(rounds: impl Iterator<Item = &'a ringkernel_cuda::RoundProfile>, i: usize) -> f64 {
    phase_pct(rounds, i, 0.5)
}

/// As [`phase_p50`], at quantile `q`.
fn phase_pct<'a>(
    rounds: impl Iterator<Item = &'a ringkernel_cuda::RoundProfile>,
    i: usize,
    q: f64,
) -> f64 {
    let mut v: Vec<f64> = rounds
        .filter(|r| r.t[i + 1] >= r.t[i] && r.t[i + 1] > 0)
        .map(|r| (r.t[i + 1] - r.t[i]) as f64 / 1e3)
        .collect();
    pct(&mut v, q)
}

/// The one-message loop's take (mode 3 entries, from `t[1]` to `t[2]`) in its four
/// parts, p50 us: to the decision, the output credit, the message index and clock
/// range, staging the slot.
fn take_split<'a>(fast: impl Iterator<Item = &'a ringkernel_cuda::RoundProfile> + Clone) -> String {
    let part = |a: &dyn Fn(&ringkernel_cuda::RoundProfile) -> u64,
                b: &dyn Fn(&ringkernel_cuda::RoundProfile) -> u64| {
        let mut v: Vec<f64> = fast
            .clone()
            .filter(|r| a(r) > 0 && b(r) >= a(r))
            .map(|r| (b(r) - a(r)) as f64 / 1e3)
            .collect();
        pct(&mut v, 0.5)
    };
    format!(
        "take, p50 us: to the decision {:.3}, output credit {:.3}, index + clock {:.3}, staging {:.3}",
        part(&|r| r.t[1], &|r| r.read[0]),
        part(&|r| r.read[0], &|r| r.read[1]),
        part(&|r| r.read[1], &|r| r.read[2]),
        part(&|r| r.read[2], &|r| r.t[2]),
    )
}

/// The one-message loop's take step by step, p50 SM cycles between lane 0's marks
/// (mode 3 entries, [`ringkernel_cuda::TAKE_MARKS`]).
fn take_marks<'a>(fast: impl Iterator<Item = &'a ringkernel_cuda::RoundProfile> + Clone) -> String {
    let steps: Vec<String> = ringkernel_cuda::TAKE_MARKS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut v: Vec<f64> = fast
                .clone()
                .map(|r| r.marks[i])
                .filter(|&c| c > 0)
                .map(f64::from)
                .collect();
            let p50 = pct(&mut v, 0.5);
            format!("{name} {p50:.0}")
        })
        .collect();
    format!("take, p50 cycles: {}", steps.join(", "))
}

/// The phases of a profiled round, in order ([`ringkernel_cuda::RoundProfile::t`]).
const PHASES: [&str; 6] = [
    "plan",
    "read (PCIe)",
    "validate",
    "decide",
    "handle",
    "place",
];

/// The times (us) from one profiled round's start to the next's.
fn round_periods(prof: &[ringkernel_cuda::RoundProfile]) -> Vec<f64> {
    prof.windows(2)
        .map(|w| w[1].t[0].saturating_sub(w[0].t[0]) as f64 / 1e3)
        .collect()
}

/// Spins on `try_dequeue` until a reply comes; also returns when the successful call
/// began.
fn spin_dequeue_timed(k: &ringkernel_core::runtime::KernelHandle) -> Result<(Envelope, Instant)> {
    let start = Instant::now();
    loop {
        let t = Instant::now();
        if let Some(e) = k.engine().try_dequeue()? {
            return Ok((e, t));
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(ringkernel_core::Error::Timeout(Duration::from_secs(10)));
        }
        std::hint::spin_loop();
    }
}

/// A bench knob from the environment (`BENCH_K2K_*`), or its default.
fn knob(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A kernel's `inbox_threads` from the environment variable `name` (unset or 0: the
/// default split).
fn inbox_knob(name: &str) -> Option<u32> {
    Some(knob(name, 0)).filter(|&n| n > 0)
}

/// How the bench's lines name an `inbox_threads` setting.
fn inbox_label(inbox: Option<u32>) -> String {
    inbox.map_or("default".to_string(), |n| n.to_string())
}

/// The K2K trigger: kernel `dest` gets `count` probes from the handling thread.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Trigger {
    dest: u32,
    count: u32,
    batch: u32,
    pad: u32,
}

impl ringkernel_core::message::RingMessage for Trigger {
    const TYPE_ID: u32 = 0x45;
    const NAME: &'static str = "bench.Trigger";
}

/// K2K on the GPU: throughput from many sender threads into one kernel's inbox, then
/// the one-way latency one message at a time. Knobs (environment): BENCH_K2K_SENDERS
/// (128), BENCH_K2K_PER (5,000 messages a sender), BENCH_K2K_SINK_BLOCK (512),
/// BENCH_K2K_SINK_GRID (1), BENCH_K2K_SINK_SLOT (128 bytes: a probe is 96),
/// BENCH_K2K_SINK_INBOX (0: the default split; else the sink's `inbox_threads`),
/// BENCH_K2K_SRC_BLOCK (256), BENCH_K2K_SRC_GRID (1), BENCH_K2K_BATCH (1: each sender
/// sends one message a call; up to 16 with `rk_send_many_to`), BENCH_K2K_PROFILE (1,
/// with RINGKERNEL_CUDA_PROFILE: the sink's inbox rounds and one-message loop),
/// BENCH_K2K_SPLIT (1: the one-at-a-time sender runs `rk_send_to`'s steps itself and
/// times each in SM cycles: route, reservation, header, stores; a send from a fresh
/// route hint as `rk_send_to`'s hinted path: the route's load issued and the hint
/// read, the swap, the route's result, header and stores). Without the split, the
/// one-at-a-time sends report their route hint's age.
async fn k2k(rep: &mut Report, rt: &CudaRuntime, quick: bool) -> Result<()> {
    eprintln!("[bench] k2k");
    let senders = knob("BENCH_K2K_SENDERS", 128);
    let per = knob("BENCH_K2K_PER", if quick { 1_000 } else { 5_000 });
    let (sink_block, sink_grid) = (
        knob("BENCH_K2K_SINK_BLOCK", 512),
        knob("BENCH_K2K_SINK_GRID", 1),
    );
    let sink_slot = knob("BENCH_K2K_SINK_SLOT", 128) as usize;
    let sink_inbox = inbox_knob("BENCH_K2K_SINK_INBOX");
    // Messages a sender thread sends with one reservation (1: `rk_send_to`).
    let batch = knob("BENCH_K2K_BATCH", 1);
    let (src_block, src_grid) = (
        knob("BENCH_K2K_SRC_BLOCK", 256),
        knob("BENCH_K2K_SRC_GRID", 1),
    );
    let mut sink_opts = LaunchOptions::default()
        .with_queue_capacity(1 << 14)
        .with_slot_size(sink_slot)
        .with_block_size(sink_block)
        .with_grid_size(sink_grid);
    sink_opts.inbox_threads = sink_inbox;
    let sink = rt.launch("bench.k2k_sink", sink_opts).await?;
    let src = rt
        .launch(
            "bench.k2k_src",
            LaunchOptions::default()
                .with_block_size(src_block)
                .with_grid_size(src_grid),
        )
        .await?;
    let arm = |expected: u64| Envelope::from_bytes(0x44, &expected.to_le_bytes());
    let trigger = |count: u32, batch: u32| Trigger {
        dest: sink.id().0,
        count,
        batch,
        pad: 0,
    };
    let read = |e: &Envelope| -> [u64; 5] {
        let mut o = [0u64; 5];
        for (i, v) in o.iter_mut().enumerate() {
            *v = u64::from_le_bytes(e.payload[i * 8..i * 8 + 8].try_into().unwrap());
        }
        o
    };
    // Throughput: the triggers go in one batch, so the source kernel sees them at once
    // and its threads send in parallel (one thread a trigger).
    let total_k2k = per as u64 * senders as u64;
    sink.send_envelope(&arm(total_k2k)).await?;
    let triggers: Vec<Trigger> = (0..senders).map(|_| trigger(per, batch)).collect();
    let t0 = Instant::now();
    src.send_batch(&triggers).await?;
    let r = sink.receive_envelope(Some(Duration::from_secs(60))).await?;
    let secs = t0.elapsed().as_secs_f64();
    let [count, sum, max, first, last] = read(&r);
    let span = last.saturating_sub(first) as f64 / 1e9;
    rep.line(format!(
        "K2K on the GPU ({senders} sender threads -> one kernel's inbox, {batch} a call; sink {sink_grid}x{sink_block} ({} inbox threads a block), {sink_slot}-byte slots, source {src_grid}x{src_block}): {:.2} M msgs/s ({count} msgs in {secs:.4} s); between the first and the last arrival (device clock) {:.2} M msgs/s; under load one-way mean {:.2} us, max {:.2} us",
        inbox_label(sink_inbox),
        count as f64 / secs / 1e6,
        if span > 0.0 { count as f64 / span / 1e6 } else { 0.0 },
        sum as f64 / count.max(1) as f64 / 1e3,
        max as f64 / 1e3
    ));
    // With RINGKERNEL_CUDA_PROFILE=<entries> and BENCH_K2K_PROFILE=1: the sink's inbox
    // rounds (block 0) during the flood. (Without BENCH_K2K_PROFILE its profile holds
    // its host rounds, which say nothing about K2K.)
    let inbox_profiled = k2k_inbox_profiled();
    let prof = if inbox_profiled {
        rt.round_profile(&sink)?
    } else {
        Vec::new()
    };
    if !prof.is_empty() {
        let took: Vec<&ringkernel_cuda::RoundProfile> =
            prof.iter().filter(|r| r.taken > 0).collect();
        let phase = |i: usize| phase_p50(took.iter().copied(), i);
        let mut period = round_periods(&prof);
        let modes: Vec<usize> = (0..4)
            .map(|m| prof.iter().filter(|r| r.mode == m).count())
            .collect();
        let names = ["plan", "read", "validate", "decide", "handle", "place"];
        rep.line(format!(
            "  sink inbox rounds (block 0, device clock): {} rounds, {} took messages ({:.1} each); modes none/spec/claimed/one-message {:?}; period p50 {:.3} us; phases p50 (us): {}",
            prof.len(),
            took.len(),
            took.iter().map(|r| r.taken as f64).sum::<f64>() / took.len().max(1) as f64,
            modes,
            pct(&mut period, 0.5),
            (0..6)
                .map(|i| format!("{} {:.3}", names[i], phase(i)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut full = 0u64;
    for _ in 0..senders {
        let e = src.receive_envelope(Some(Duration::from_secs(10))).await?;
        full += e
            .payload
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
    }
    rep.line(format!(
        "  sends refused for a full inbox and retried: {full} ({:.2} a message)",
        full as f64 / count.max(1) as f64
    ));
    // Latency: one message at a time.
    let pings = if quick { 100 } else { 500 };
    let mut lat = Vec::with_capacity(pings);
    let mut in_send = Vec::with_capacity(pings);
    let mut split: [Vec<f64>; 4] = Default::default();
    // The same for sends that took the hinted path: the route's load issued and the hint
    // read, the swap, the route's result, header and stores.
    let mut hinted: [Vec<f64>; 4] = Default::default();
    // Without the split: the age (ns) of the sending warp's route hint at each send
    // (u64::MAX: the hint named no route to the sink).
    let mut hint_age: Vec<u64> = Vec::with_capacity(pings);
    for _ in 0..pings {
        sink.send_envelope(&arm(1)).await?;
        src.send(trigger(1, 1)).await?;
        let r = sink.receive_envelope(Some(Duration::from_secs(10))).await?;
        let [_, sum, _, _, _] = read(&r);
        lat.push(sum as f64 / 1e3);
        let e = src.receive_envelope(Some(Duration::from_secs(10))).await?;
        if let Some(b) = e.payload.get(8..16) {
            in_send.push(u64::from_le_bytes(b.try_into().unwrap()) as f64 / 1e3);
        }
        if let Some(b) = e.payload.get(16..56) {
            let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()) as f64;
            let at = if w(4) == 1.0 { &mut hinted } else { &mut split };
            for (i, v) in at.iter_mut().enumerate() {
                v.push(w(i));
            }
        } else if let Some(b) = e.payload.get(16..24) {
            hint_age.push(u64::from_le_bytes(b.try_into().unwrap()));
        }
    }
    if !split[0].is_empty() {
        rep.line(format!(
            "  the sender's rk_send_to, p50 cycles (BENCH_K2K_SPLIT=1): route {:.0}, reservation {:.0}, header {:.0}, stores {:.0}",
            pct(&mut split[0], 0.5),
            pct(&mut split[1], 0.5),
            pct(&mut split[2], 0.5),
            pct(&mut split[3], 0.5)
        ));
    }
    if !hinted[0].is_empty() {
        rep.line(format!(
            "  the sender's hinted path, p50 cycles (BENCH_K2K_SPLIT=1, {} sends): route load issued and hint read {:.0}, the swap {:.0}, the route's result {:.0}, header and stores {:.0}",
            hinted[0].len(),
            pct(&mut hinted[0], 0.5),
            pct(&mut hinted[1], 0.5),
            pct(&mut hinted[2], 0.5),
            pct(&mut hinted[3], 0.5)
        ));
    }
    if !hint_age.is_empty() {
        // RK_K2K_HINT_FRESH_NS (ringkernel.cuh): 500 us.
        let fresh = hint_age.iter().filter(|&&a| a < 500_000).count();
        let mut ages: Vec<f64> = hint_age
            .iter()
            .filter(|&&a| a != u64::MAX)
            .map(|&a| a as f64 / 1e3)
            .collect();
        rep.line(format!(
            "  the sender's route hint: fresh (under 500 us) at {fresh} of {} sends; age p50 {:.1} us",
            hint_age.len(),
            if ages.is_empty() { f64::NAN } else { pct(&mut ages, 0.5) }
        ));
    }
    let (k50, k99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    rep.line(format!("K2K one-way latency, one message at a time (device clock): p50 {k50:.2} us  p99 {k99:.2} us"));
    // Where it goes: the sender's rk_send_to, and (with the sink's inbox rounds
    // profiled) the sink's one-message loop.
    let fast: Vec<ringkernel_cuda::RoundProfile> = if inbox_profiled {
        rt.round_profile(&sink)?
            .into_iter()
            .filter(|r| r.mode == 3)
            .collect()
    } else {
        Vec::new()
    };
    let step = |i: usize| phase_p50(fast.iter(), i);
    let sink_loop = if fast.is_empty() {
        "; the sink's one-message loop is measured with BENCH_K2K_PROFILE=1".to_string()
    } else {
        format!(
            "; sink's one-message loop ({} messages): the poll that found it {:.3}, take {:.3}, handler {:.3}, after the handler {:.3}; {}",
            fast.len(),
            step(0),
            step(1),
            step(2),
            step(3),
            take_split(fast.iter())
        )
    };
    rep.line(format!(
        "  breakdown (p50, us, device clock): sender inside rk_send_to {:.3}{sink_loop}",
        pct(&mut in_send, 0.5),
    ));
    sink.terminate().await?;
    src.terminate().await?;
    Ok(())
}

/// Whether the K2K sink is built with its inbox rounds profiled (`BENCH_K2K_PROFILE=1`).
fn k2k_inbox_profiled() -> bool {
    std::env::var("BENCH_K2K_PROFILE").is_ok_and(|v| v == "1")
}

async fn actors(
    rep: &mut Report,
    quick: bool,
    k2k_only: bool,
    rt_only: bool,
    stream_only: bool,
) -> Result<()> {
    eprintln!("[bench] host link bandwidth");
    let (h2d, d2h) = ringkernel_cuda::baseline::host_link_bandwidth(0, 64 << 20)?;
    rep.line(format!(
        "host link (pinned memory copies of 64 MiB): host->device {:.1} GB/s, device->host {:.1} GB/s",
        h2d / 1e9,
        d2h / 1e9
    ));
    // The runtime adds the CUDA built-ins itself.
    let reg = KernelRegistry::new();
    // BENCH_STREAM_DEFINES: `NAME=VALUE,...` compiled into the streaming kernel (the
    // template's tuning macros, e.g. RK_READ_UNROLL).
    let defines: String = std::env::var("BENCH_STREAM_DEFINES")
        .unwrap_or_default()
        .split(',')
        .filter_map(|d| d.split_once('='))
        .map(|(n, v)| format!("#define {n} {v}\n"))
        .collect();
    reg.register_gpu(GpuHandler::new("bench.stream").with_cuda(format!("{defines}{STREAM_SRC}")));
    // BENCH_K2K_SPLIT=1: the one-at-a-time sender times rk_send_to's steps.
    reg.register_gpu(GpuHandler::new("bench.k2k_src").with_cuda(
        if std::env::var("BENCH_K2K_SPLIT").is_ok_and(|v| v == "1") {
            format!("#define K2K_SPLIT 1\n{K2K_SRC_SRC}")
        } else {
            K2K_SRC_SRC.to_string()
        },
    ));
    reg.register_gpu(
        GpuHandler::new("bench.k2k_sink")
            .with_cuda(if k2k_inbox_profiled() {
                format!("#define RK_PROFILE_INBOX 1\n{K2K_SINK_SRC}")
            } else {
                K2K_SINK_SRC.to_string()
            })
            .with_state_bytes(48),
    );
    let rt = CudaRuntime::with_registry(reg).await?;
    rep.line(format!("runtime: {}", rt.device_info()));
    for h in [ECHO, "bench.stream", "bench.k2k_src", "bench.k2k_sink"] {
        rt.preload(h)?;
    }
    if k2k_only {
        return k2k(rep, &rt, quick).await;
    }
    if stream_only {
        stream(rep, &rt, quick, h2d, d2h).await?;
        rt.shutdown().await?;
        return Ok(());
    }

    // ---- 1. round trip ----
    let n = if quick { 2_000 } else { 20_000 };
    // BENCH_RT_BLOCK: the echo kernel's block size (default 128).
    let rt_block = std::env::var("BENCH_RT_BLOCK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128u32);
    let k = rt
        .launch(ECHO, LaunchOptions::default().with_block_size(rt_block))
        .await?;
    rep.line(format!("echo kernel block size: {rt_block}"));
    let mut h = MessageHeader::new(Token::TYPE_ID, std::mem::size_of::<Token>());
    let mut samples = Vec::with_capacity(n);
    // Host shares of each round trip: the enqueue call, and the dequeue call that
    // returned the reply (validation, copy, decode).
    let (mut enq, mut deq) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..(n + 2000) as u64 {
        h.message_id = i + 1;
        h.correlation_id = i + 1;
        let t = Token::new(i, i as f64);
        let t0 = Instant::now();
        k.engine().try_enqueue(&h, bytemuck::bytes_of(&t))?;
        let t1 = Instant::now();
        let (env, t2) = spin_dequeue_timed(&k)?;
        let r = env.decode::<Token>()?;
        let t3 = Instant::now();
        let dt = (t3 - t0).as_secs_f64() * 1e6;
        if i >= 2000 {
            enq.push((t1 - t0).as_secs_f64() * 1e6);
            deq.push((t3 - t2).as_secs_f64() * 1e6);
        }
        if r.id != i || r.value != 2.0 * i as f64 {
            return Err(ringkernel_core::Error::Device(format!(
                "wrong echo {r:?} for {i}"
            )));
        }
        if i >= 2000 {
            samples.push(dt);
        }
    }
    // The tail: what the host's two calls took in the slowest 2% of the round trips,
    // against the median ones (the samples line up with `enq` and `deq`).
    let tail_line = {
        let mut order: Vec<usize> = (0..samples.len()).collect();
        order.sort_by(|&a, &b| samples[a].partial_cmp(&samples[b]).unwrap());
        let slow = &order[order.len() * 98 / 100..];
        let mid = &order[order.len() * 45 / 100..order.len() * 55 / 100];
        let mean =
            |idx: &[usize], v: &[f64]| idx.iter().map(|&i| v[i]).sum::<f64>() / idx.len() as f64;
        format!(
            "  tail (means, us): slowest 2%: round trip {:.2}, host enqueue {:.2}, host dequeue+decode {:.2}; middle 10%: round trip {:.2}, enqueue {:.2}, dequeue+decode {:.2}; p90 {:.2}, p95 {:.2}, p99.9 {:.2}",
            mean(slow, &samples),
            mean(slow, &enq),
            mean(slow, &deq),
            mean(mid, &samples),
            mean(mid, &enq),
            mean(mid, &deq),
            samples[order[order.len() * 90 / 100]],
            samples[order[order.len() * 95 / 100]],
            samples[order[order.len() * 999 / 1000]],
        )
    };
    let (p50, p99) = (pct(&mut samples, 0.5), pct(&mut samples, 0.99));
    rep.line(format!("round trip, persistent kernel (engine, spin): p50 {p50:.2} us  p99 {p99:.2} us  ({n} msgs)"));
    rep.line(tail_line);
    let (e50, d50) = (pct(&mut enq, 0.5), pct(&mut deq, 0.5));
    let dev = k.metrics().latency;
    let dev_us = dev.p50_ns as f64 / 1e3;
    rep.line(format!(
        "  breakdown (p50): host enqueue {e50:.2} us, host dequeue+decode {d50:.2} us, device handler {dev_us:.2} us (%globaltimer), \
         the rest (PCIe both ways, polling, the kernel's round) {:.2} us",
        p50 - e50 - d50 - dev_us
    ));
    // Where the kernel's time goes (RINGKERNEL_CUDA_PROFILE=<entries> in the
    // environment): the phases of the host group's rounds, device clock.
    let prof = rt.round_profile(&k)?;
    if !prof.is_empty() {
        let phase =
            |taken: bool, i: usize| phase_p50(prof.iter().filter(|r| (r.taken > 0) == taken), i);
        let mut period = round_periods(&prof);
        let with: Vec<String> = (0..6)
            .map(|i| format!("{} {:.3}", PHASES[i], phase(true, i)))
            .collect();
        let idle: Vec<String> = (0..3)
            .map(|i| format!("{} {:.3}", PHASES[i], phase(false, i)))
            .collect();
        let took = prof.iter().filter(|r| r.taken > 0).count();
        // Warp 0's one-message loop (mode 3): poll, decide, handler, reply.
        let fast: Vec<&ringkernel_cuda::RoundProfile> =
            prof.iter().filter(|r| r.mode == 3).collect();
        if !fast.is_empty() {
            let step = |i: usize| phase_p50(fast.iter().copied(), i);
            let mut gap: Vec<f64> = fast
                .windows(2)
                .map(|w| (w[1].t[0].saturating_sub(w[0].t[4])) as f64 / 1e3)
                .collect();
            rep.line(format!(
                "  one-message loop ({} messages, p50 us, device clock): poll that found it {:.3}, take {:.3}, handler {:.3}, reply written + fence {:.3}; from a reply to the poll that finds the next message {:.3}",
                fast.len(),
                step(0),
                step(1),
                step(2),
                step(3),
                pct(&mut gap, 0.5)
            ));
            rep.line(format!("  {}", take_split(fast.iter().copied())));
            rep.line(format!("  {}", take_marks(fast.iter().copied())));
            let step99 = |i: usize| phase_pct(fast.iter().copied(), i, 0.99);
            rep.line(format!(
                "  one-message loop, p99 us: poll that found it {:.3}, take {:.3}, handler {:.3}, reply {:.3}; reply to next poll {:.3}",
                step99(0),
                step99(1),
                step99(2),
                step99(3),
                pct(&mut gap, 0.99)
            ));
        }
        let mut mhz: Vec<f64> = prof
            .iter()
            .filter(|r| r.taken > 0 && r.t[6] > r.t[0])
            .map(|r| r.cycles as f64 / (r.t[6] - r.t[0]) as f64 * 1e3)
            .collect();
        let sub = |f: &dyn Fn(&ringkernel_cuda::RoundProfile) -> (u64, u64)| {
            let mut v: Vec<f64> = prof
                .iter()
                .map(f)
                .filter(|&(a, b)| a > 0 && b >= a)
                .map(|(a, b)| (b - a) as f64 / 1e3)
                .collect();
            pct(&mut v, 0.5)
        };
        rep.line(format!(
            "  inside the read (p50, us): own unit staged {:.3}, announcements in {:+.3}, lane tails done {:+.3}, group synced {:+.3}",
            sub(&|r| (r.t[1], r.read[0])),
            sub(&|r| (r.read[0], r.read[1])),
            sub(&|r| (r.read[1], r.read[2])),
            sub(&|r| (r.read[2], r.t[2]))
        ));
        if !mhz.is_empty() {
            rep.line(format!(
                "  SM clock during rounds with a message: {:.0} MHz (p50; cycles over device time)",
                pct(&mut mhz, 0.5)
            ));
        }
        rep.line(format!(
            "  kernel rounds (p50, us, device clock; {} rounds, {took} with a message): period {:.3}; with a message: {}; idle: {}",
            prof.len(),
            pct(&mut period, 0.5),
            with.join(", "),
            idle.join(", ")
        ));
    }
    let mut call_samples = Vec::with_capacity(n / 4);
    for i in 0..(n / 4) as u64 {
        let t0 = Instant::now();
        let r: Token = k.call(Token::new(i, 1.0), Duration::from_secs(10)).await?;
        call_samples.push(t0.elapsed().as_secs_f64() * 1e6);
        assert_eq!(r.id, i);
    }
    let (c50, c99) = (pct(&mut call_samples, 0.5), pct(&mut call_samples, 0.99));
    rep.line(format!(
        "round trip, persistent kernel (KernelHandle::call): p50 {c50:.2} us  p99 {c99:.2} us"
    ));
    k.terminate().await?;
    if rt_only {
        return Ok(());
    }

    let base = LaunchBaseline::new(0)?;
    let mut launch = Vec::with_capacity(n);
    let mut graph = Vec::with_capacity(n);
    for i in 0..(n + 500) as u64 {
        let t = Token::new(i, i as f64);
        let t0 = Instant::now();
        let r = base.round_trip_launch(&t, i + 1)?;
        let dt = t0.elapsed().as_secs_f64() * 1e6;
        check_echo(&t, &r)?;
        let t1 = Instant::now();
        let r = base.round_trip_graph(&t, i + 1)?;
        let dg = t1.elapsed().as_secs_f64() * 1e6;
        check_echo(&t, &r)?;
        if i >= 500 {
            launch.push(dt);
            graph.push(dg);
        }
    }
    let (l50, l99) = (pct(&mut launch, 0.5), pct(&mut launch, 0.99));
    let (g50, g99) = (pct(&mut graph, 0.5), pct(&mut graph, 0.99));
    rep.line(format!(
        "round trip, kernel launch + sync per message: p50 {l50:.2} us  p99 {l99:.2} us"
    ));
    rep.line(format!(
        "round trip, CUDA graph replay + sync per message: p50 {g50:.2} us  p99 {g99:.2} us"
    ));
    rep.line(format!(
        "persistent vs launch: {:.2}x faster at p50; vs graph replay: {:.2}x",
        l50 / p50,
        g50 / p50
    ));

    // ---- 2. K2K on the GPU ----
    k2k(rep, &rt, quick).await?;
    // ---- 3. streaming 64-byte payloads ----
    stream(rep, &rt, quick, h2d, d2h).await?;

    rt.shutdown().await?;
    Ok(())
}

/// This thread's CPU time so far (ns), from `/proc/thread-self/schedstat`; `None`
/// where there is none (off Linux).
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The CPU this thread last ran on (`/proc/thread-self/stat`, field 39); `None` off
/// Linux.
fn thread_on_cpu() -> Option<u32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command's closing parenthesis start at field 3.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(36)?
        .parse()
        .ok()
}

/// CPU nanoseconds a message between two `thread_cpu_ns` readings, as text.
fn cpu_per_msg(a: Option<u64>, b: Option<u64>, msgs: u64) -> String {
    match (a, b) {
        (Some(a), Some(b)) if msgs > 0 => format!("{:.1} ns", (b - a) as f64 / msgs as f64),
        _ => "n/a".into(),
    }
}

/// What a streaming consumer thread reports: messages, empty polls, calls that took
/// some, time inside those calls, its CPU time (ns) before and after, the CPU it ran on.
type ConsumerRun = (
    u64,
    u64,
    u64,
    Duration,
    Option<u64>,
    Option<u64>,
    Option<u32>,
);

/// What a streaming producer thread reports: messages, calls that found the input
/// full, time inside the calls that wrote, when it was done (s after the start), its
/// CPU time (ns) before and after, the CPU it ran on.
type ProducerRun = (
    u64,
    u64,
    Duration,
    f64,
    Option<u64>,
    Option<u64>,
    Option<u32>,
);

/// Streaming 64-byte payloads through one persistent kernel: `CudaStreamer` batches
/// from producer threads (BENCH_STREAM_PRODUCERS, 2), replies taken by consumer threads
/// (BENCH_STREAM_CONSUMERS, 2): with one of each the stream made 28-31 M msgs/s, with
/// two 48-52 (H200, 5 alternating pairs, BENCHMARKS.md 2026-11-28); then the
/// per-message engine API. Other knobs (environment): BENCH_STREAM_GRID (8),
/// BENCH_STREAM_BLOCK (512), BENCH_STREAM_BATCH (4,096 messages a `try_send_batch`),
/// BENCH_STREAM_MSGS (20M; 1M with `--quick`), BENCH_STREAM_QUEUE (65,536 input
/// slots), BENCH_STREAM_OUT (65,536 output slots), BENCH_STREAM_INBOX (0: the kernel's default
/// `inbox_threads`; else that many), BENCH_STREAM_BACKOFF_NS (0: how long
/// the producer waits after finding the input full before it tries again). Each
/// thread's CPU time a message and how often it found nothing to do are printed, and
/// with `RINGKERNEL_CUDA_PROFILE` the kernel's host rounds (block 0) during the stream.
async fn stream(rep: &mut Report, rt: &CudaRuntime, quick: bool, h2d: f64, d2h: f64) -> Result<()> {
    eprintln!("[bench] streaming");
    let total: u64 = std::env::var("BENCH_STREAM_MSGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1_000_000 } else { 20_000_000 });
    let (grid, block) = (
        knob("BENCH_STREAM_GRID", 8),
        knob("BENCH_STREAM_BLOCK", 512),
    );
    let batch = knob("BENCH_STREAM_BATCH", 4096).max(1) as u64;
    let queue = knob("BENCH_STREAM_QUEUE", 1 << 16) as usize;
    // 8 blocks and an output as deep as the input: with 4 blocks and 4,096 output
    // slots (the shape before 2026-11-28) the stream was slower in 4 of 5 same-call
    // pairs on an H200, its median 0.82x (BENCHMARKS.md).
    let out_queue = knob("BENCH_STREAM_OUT", 1 << 16) as usize;
    let producers = u64::from(knob("BENCH_STREAM_PRODUCERS", 2).max(1));
    let consumers = knob("BENCH_STREAM_CONSUMERS", 2).max(1) as usize;
    let inbox = inbox_knob("BENCH_STREAM_INBOX");
    let backoff = Duration::from_nanos(knob("BENCH_STREAM_BACKOFF_NS", 0).into());
    let mut opts = LaunchOptions::default()
        .with_slot_size(128)
        .with_queue_capacity(queue)
        .with_output_capacity(out_queue)
        .with_block_size(block)
        .with_grid_size(grid);
    opts.inbox_threads = inbox;
    let k = rt.launch("bench.stream", opts).await?;
    rep.line(format!(
        "streaming kernel: grid {grid} x block {block} ({} inbox threads a block), 128-byte slots, queues of {queue} in and {out_queue} out, batches of {batch}",
        inbox_label(inbox)
    ));
    let payload = [0x5Au8; 64];
    let hs = MessageHeader::new(0x77, 64);
    let streamer = rt.streamer(&k)?;
    // Replies taken by all consumers together: each stops when the stream is done.
    let got_all = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let consumer_threads = (0..consumers)
        .map(|i| {
            let streamer = streamer.clone();
            let got_all = got_all.clone();
            // Named, as the producers below, so that a profile (perf) tells them apart.
            std::thread::Builder::new()
                .name(format!("bench-consumer{i}"))
                .spawn(move || -> Result<ConsumerRun> {
                    let cpu0 = thread_cpu_ns();
                    let mut got = 0u64;
                    let mut bad = 0u64;
                    let mut empty = 0u64;
                    let mut calls = 0u64;
                    // Time inside the calls that took replies: the thread's work without
                    // its spinning (every thread spins while it waits, so its CPU time
                    // is the run's wall time).
                    let mut busy = Duration::ZERO;
                    let start = Instant::now();
                    while got_all.load(Ordering::Relaxed) < total {
                        let t = Instant::now();
                        let n = streamer.try_receive_batch(usize::MAX, &mut |_h, p| {
                            if p.len() != 64 || p[0] != 0x5A || p[63] != 0x5A {
                                bad += 1;
                            }
                        })?;
                        if n > 0 {
                            busy += t.elapsed();
                            got_all.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        got += n as u64;
                        calls += u64::from(n > 0);
                        if n == 0 {
                            empty += 1;
                            if start.elapsed() > Duration::from_secs(60) {
                                return Err(ringkernel_core::Error::Timeout(Duration::from_secs(
                                    60,
                                )));
                            }
                            std::hint::spin_loop();
                        }
                    }
                    if bad > 0 {
                        return Err(ringkernel_core::Error::Device(format!(
                            "{bad} corrupt stream replies"
                        )));
                    }
                    Ok((
                        got,
                        empty,
                        calls,
                        busy,
                        cpu0,
                        thread_cpu_ns(),
                        thread_on_cpu(),
                    ))
                })
                .map_err(|e| ringkernel_core::Error::Device(format!("consumer thread: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let producer_threads = (0..producers)
        .map(|i| {
            let streamer = streamer.clone();
            let share = total / producers + u64::from(i < total % producers);
            std::thread::Builder::new()
                .name(format!("bench-producer{i}"))
                .spawn(move || -> Result<ProducerRun> {
                    let cpu0 = thread_cpu_ns();
                    let mut sent = 0u64;
                    let mut full = 0u64;
                    let mut busy = Duration::ZERO; // inside the calls that wrote messages
                    while sent < share {
                        let want = (share - sent).min(batch) as usize;
                        let t = Instant::now();
                        let n = streamer
                            .try_send_batch(std::iter::repeat_n((&hs, &payload[..]), want))?;
                        if n > 0 {
                            busy += t.elapsed();
                        }
                        sent += n as u64;
                        if n == 0 {
                            full += 1;
                            if t0.elapsed() > Duration::from_secs(60) {
                                return Err(ringkernel_core::Error::Timeout(Duration::from_secs(
                                    60,
                                )));
                            }
                            // BENCH_STREAM_BACKOFF_NS: how long a producer waits before it
                            // tries a full input again (0: at once).
                            let t = Instant::now();
                            while t.elapsed() < backoff {
                                std::hint::spin_loop();
                            }
                            std::hint::spin_loop();
                        }
                    }
                    let done = t0.elapsed().as_secs_f64();
                    Ok((
                        sent,
                        full,
                        busy,
                        done,
                        cpu0,
                        thread_cpu_ns(),
                        thread_on_cpu(),
                    ))
                })
                .map_err(|e| ringkernel_core::Error::Device(format!("producer thread: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let join = |e: &str| ringkernel_core::Error::Device(format!("{e} panicked"));
    let prod: Vec<ProducerRun> = producer_threads
        .into_iter()
        .map(|t| t.join().map_err(|_| join("producer"))?)
        .collect::<Result<_>>()?;
    let cons: Vec<ConsumerRun> = consumer_threads
        .into_iter()
        .map(|t| t.join().map_err(|_| join("consumer"))?)
        .collect::<Result<_>>()?;
    let secs = t0.elapsed().as_secs_f64();
    let got: u64 = cons.iter().map(|c| c.0).sum();
    let rate = got as f64 / secs;
    // What crosses the link per message: the request's and the reply's stamped units
    // (16 bytes per 12 of the 128-byte slot), and the latency sample.
    let units = ringkernel_core::queue::stamped::stamped_slot_bytes(128) as f64;
    rep.line(format!(
        "streaming 64-B payloads through one persistent kernel: {:.2} M msgs/s ({got} msgs in {secs:.3} s; CudaStreamer batches, {producers} producer + {consumers} consumer threads)",
        rate / 1e6
    ));
    rep.line(format!(
        "  link traffic: {:.2} GB/s each way ({units} B of stamped units per message) = {:.1}% of host->device, {:.1}% of device->host copy bandwidth",
        rate * units / 1e9,
        100.0 * rate * units / h2d,
        100.0 * rate * (units + 8.0) / d2h
    ));
    let per_thread = |busy: Duration, cpu: (Option<u64>, Option<u64>), n: u64| {
        format!(
            "busy {:.1} ns, CPU {} a message of its {n}",
            busy.as_secs_f64() * 1e9 / n.max(1) as f64,
            cpu_per_msg(cpu.0, cpu.1, n)
        )
    };
    rep.line(format!(
        "  host threads' work without their spinning (busy: inside the calls that moved messages; CPU includes the spinning): producers [{}], found the input full {} times, done after {:.3} s; consumers [{}], found nothing {} times, {:.1} replies a call that took some; on CPUs {:?} / {:?}",
        prod.iter()
            .map(|p| per_thread(p.2, (p.4, p.5), p.0))
            .collect::<Vec<_>>()
            .join("; "),
        prod.iter().map(|p| p.1).sum::<u64>(),
        prod.iter().map(|p| p.3).fold(0.0, f64::max),
        cons.iter()
            .map(|c| per_thread(c.3, (c.4, c.5), c.0))
            .collect::<Vec<_>>()
            .join("; "),
        cons.iter().map(|c| c.1).sum::<u64>(),
        got as f64 / cons.iter().map(|c| c.2).sum::<u64>().max(1) as f64,
        prod.iter().map(|p| p.6).collect::<Vec<_>>(),
        cons.iter().map(|c| c.6).collect::<Vec<_>>(),
    ));
    let prof = rt.round_profile(&k)?;
    let took: Vec<&ringkernel_cuda::RoundProfile> = prof.iter().filter(|r| r.taken > 0).collect();
    if !took.is_empty() {
        let mut taken: Vec<f64> = took.iter().map(|r| r.taken as f64).collect();
        let mean = taken.iter().sum::<f64>() / taken.len() as f64;
        let mut period = round_periods(&prof);
        let phases: Vec<String> = (0..6)
            .map(|i| format!("{} {:.3}", PHASES[i], phase_p50(took.iter().copied(), i)))
            .collect();
        rep.line(format!(
            "  kernel host rounds, block 0 ({} profiled, {} with messages): taken p50 {:.0} (mean {:.1}), period p50 {:.3} us; with messages (p50 us): {}",
            prof.len(),
            took.len(),
            pct(&mut taken, 0.5),
            mean,
            pct(&mut period, 0.5),
            phases.join(", ")
        ));
    }
    // Each host thread's work alone, twice: the producer filling the input of the
    // deactivated kernel, the consumer draining a full output.
    let ring = queue.min(out_queue) as u64;
    for rep_i in 0..2 {
        k.deactivate().await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        let mut sent = 0u64;
        while sent < ring {
            let want = (ring - sent).min(batch) as usize;
            let n = streamer.try_send_batch(std::iter::repeat_n((&hs, &payload[..]), want))?;
            if n == 0 {
                return Err(ringkernel_core::Error::Device(
                    "the idle kernel's input filled before it held a queue's worth".into(),
                ));
            }
            sent += n as u64;
        }
        let fill = t.elapsed().as_secs_f64() / ring as f64 * 1e9;
        k.activate().await?;
        let t = Instant::now();
        while k.engine().output_depth() < ring as usize {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(ringkernel_core::Error::Timeout(Duration::from_secs(10)));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let t = Instant::now();
        let mut got = 0u64;
        while got < ring {
            got += streamer.try_receive_batch(usize::MAX, &mut |_h, _p| {})? as u64;
        }
        let drain = t.elapsed().as_secs_f64() / ring as f64 * 1e9;
        rep.line(format!(
            "  host work alone ({}): producer {fill:.1} ns a message ({ring} into the idle kernel's input), consumer {drain:.1} ns a message (a full output drained)",
            rep_i + 1
        ));
    }
    // The same through the per-message engine API (one index update per message).
    let per_msg: u64 = total / 10;
    let engine = k.engine().clone();
    let consumer = {
        let engine = engine.clone();
        std::thread::spawn(move || -> Result<u64> {
            let mut got = 0u64;
            let start = Instant::now();
            while got < per_msg {
                match engine.try_dequeue()? {
                    Some(_) => got += 1,
                    None => {
                        if start.elapsed() > Duration::from_secs(60) {
                            return Err(ringkernel_core::Error::Timeout(Duration::from_secs(60)));
                        }
                        std::hint::spin_loop()
                    }
                }
            }
            Ok(got)
        })
    };
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < per_msg {
        match engine.try_enqueue(&hs, &payload) {
            Ok(()) => sent += 1,
            Err(ringkernel_core::Error::QueueFull { .. }) => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    let got = consumer
        .join()
        .map_err(|_| ringkernel_core::Error::Device("consumer panicked".into()))??;
    let secs = t0.elapsed().as_secs_f64();
    rep.line(format!(
        "streaming 64-B payloads, per-message try_enqueue/try_dequeue: {:.2} M msgs/s ({got} msgs)",
        got as f64 / secs / 1e6
    ));
    let m = k.metrics();
    rep.line(format!(
        "  kernel metrics: processed {} dropped {}",
        m.processed, m.dropped
    ));
    eprintln!("[bench] terminating the streaming kernel");
    k.terminate().await?;
    eprintln!("[bench] terminated");
    Ok(())
}

fn time_op(gpu: &CudaCompute, reps: usize, mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    for i in 0..3 {
        f(i)?;
    }
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps {
        let t0 = Instant::now();
        f(i)?;
        gpu.synchronize()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(pct(&mut times, 0.5))
}

fn compute(rep: &mut Report, quick: bool) -> Result<()> {
    let gpu = CudaCompute::new(0)?;
    rep.line(format!("compute: {}", gpu.device_name()));
    let n: usize = 64 << 20;
    let mut rng = SplitMix64::new(7);
    let data: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(n, -2.0, 2.0)).collect();
    let bufs: Vec<_> = data.iter().map(|d| gpu.upload(d)).collect::<Result<_>>()?;
    let out = gpu.alloc(n)?;
    let reps = if quick { 5 } else { 30 };
    let gbs = |bytes: f64, s: f64| bytes / s / 1e9;
    let copy = time_op(&gpu, reps, |i| gpu.copy(&*bufs[i % 3], 0, &*out, 0, n))?;
    let copy_bw = gbs(8.0 * n as f64, copy);
    rep.line(format!(
        "copy d2d 64M f32: {:.3} ms, {copy_bw:.0} GB/s (read + write)",
        copy * 1e3
    ));
    let add = time_op(&gpu, reps, |i| {
        gpu.binary(BinaryOp::Add, &*bufs[i % 3], &*bufs[(i + 1) % 3], &*out, n)
    })?;
    let add_bw = gbs(12.0 * n as f64, add);
    rep.line(format!(
        "add 64M f32: {:.3} ms, {add_bw:.0} GB/s = {:.1}% of copy",
        add * 1e3,
        100.0 * add_bw / copy_bw
    ));
    let cols = 4096;
    let rows = n / cols;
    let sm = time_op(&gpu, reps, |i| {
        gpu.softmax(&*bufs[i % 3], &*out, rows, cols)
    })?;
    let sm_bw = gbs(8.0 * n as f64, sm);
    rep.line(format!(
        "softmax [{rows}x{cols}]: {:.3} ms, {sm_bw:.0} GB/s = {:.1}% of copy",
        sm * 1e3,
        100.0 * sm_bw / copy_bw
    ));
    let w = gpu.upload(&rng.vec(cols, 0.5, 1.5))?;
    let rms = time_op(&gpu, reps, |i| {
        gpu.rms_norm(&*bufs[i % 3], &*w, &*out, rows, cols, 1e-6)
    })?;
    let rms_bw = gbs(8.0 * n as f64, rms);
    rep.line(format!(
        "rms_norm [{rows}x{cols}]: {:.3} ms, {rms_bw:.0} GB/s = {:.1}% of copy",
        rms * 1e3,
        100.0 * rms_bw / copy_bw
    ));
    // Spot-check the softmax output of the last run against the CPU.
    let mut row0 = vec![0.0f32; cols];
    gpu.softmax(&*bufs[0], &*out, rows, cols)?;
    gpu.read(&*out, 0, &mut row0)?;
    let want = ringkernel_core::compute::reference::softmax(&data[0][..cols], 1, cols);
    let err = ringkernel_core::util::rel_error(&row0, &want);
    rep.line(format!("  softmax row 0 rel err vs f64: {err:.1e}"));
    drop(bufs);
    drop(out);

    let m = 8192usize;
    let a = gpu.upload(&rng.vec(m * m, -1.0, 1.0))?;
    let b = gpu.upload(&rng.vec(m * m, -1.0, 1.0))?;
    let c = gpu.alloc(m * m)?;
    let dims = MatmulDims {
        batch: 1,
        m,
        k: m,
        n: m,
        b_batched: false,
    };
    let flops = 2.0 * (m as f64).powi(3);
    let mm_reps = if quick { 3 } else { 10 };
    gpu.set_tf32(false);
    let f32t = time_op(&gpu, mm_reps, |_| gpu.matmul(&*a, &*b, &*c, dims))?;
    rep.line(format!(
        "matmul {m}^3 fp32: {:.2} ms, {:.1} TFLOP/s",
        f32t * 1e3,
        flops / f32t / 1e12
    ));
    gpu.set_tf32(true);
    let tf = time_op(&gpu, mm_reps, |_| gpu.matmul(&*a, &*b, &*c, dims))?;
    gpu.set_tf32(false);
    rep.line(format!(
        "matmul {m}^3 tf32: {:.2} ms, {:.1} TFLOP/s",
        tf * 1e3,
        flops / tf / 1e12
    ));
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1).cloned());
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let mut rep = Report {
        text: String::new(),
        out: None,
    };
    match ringkernel_cuda::probe() {
        Ok(d) => rep.line(format!("device: {d}")),
        Err(e) => {
            eprintln!("no CUDA: {e}");
            std::process::exit(2);
        }
    }
    rep.out = out;
    let mut failed = false;
    // A watchdog: a wedged GPU or runtime must not eat the whole device session.
    let watchdog = std::env::var("BENCH_WATCHDOG_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200u64);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(watchdog));
        eprintln!("[bench] watchdog: no end after {watchdog} s, exiting");
        std::process::exit(3);
    });
    if only.is_none() || only.as_deref() == Some("compute") {
        if let Err(e) = compute(&mut rep, quick) {
            rep.line(format!("compute benchmarks FAILED: {e}"));
            failed = true;
        }
    }
    let k2k_only = only.as_deref() == Some("k2k");
    // `--only rt`: the round trip alone (engine and `call`, with the breakdown).
    let rt_only = only.as_deref() == Some("rt");
    // `--only stream`: streaming alone (`BENCH_STREAM_*` shape it, see `stream`).
    let stream_only = only.as_deref() == Some("stream");
    if only.as_deref() != Some("compute") {
        let exec = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        if let Err(e) = exec.block_on(async {
            phase(
                "actor benchmarks",
                150,
                actors(&mut rep, quick, k2k_only, rt_only, stream_only),
            )
            .await
        }) {
            rep.line(format!("actor benchmarks FAILED: {e}"));
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}
