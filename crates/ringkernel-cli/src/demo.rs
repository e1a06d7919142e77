//! `ringkernel demo`: a verified end-to-end run of the actor runtime.
//!
//! 1. **Pipeline.** Three `rk.stage` kernels chained by K2K. Every token enters stage 1
//!    and leaves stage 3; many are in flight at once (the host sends and receives them
//!    in batches, `send_batch` / `receive_batch_into`). Each must come back exactly once
//!    with `value = id + 3`, `hops = 3`, and HLC stamps that strictly increase along its
//!    path (host send < stage 1 < stage 2 < stage 3 ≤ host receive).
//! 2. **Fan-out.** Four `rk.counter` kernels subscribed with MQTT filters; tokens are
//!    published round-robin to five topics (one a `$`-topic no wildcard may match).
//!    Each subscriber must see exactly the tokens whose topic its filter matches, in
//!    publish order, its count rising by one each time.
//! 3. **Latency.** Round trips through the pipeline one at a time.
//!
//! Then per-kernel metrics are checked (nothing dropped, every message processed) and a
//! throughput/latency table is printed. Any verification failure exits non-zero.

use crate::stats::{self, Percentiles, Table};
use ringkernel::prelude::*;
use std::time::{Duration, Instant};

/// Arguments of `ringkernel demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Backend: auto, cpu, cuda, wgpu or metal.
    #[arg(long, default_value = "auto", value_parser = crate::parse_backend)]
    pub backend: Backend,
    /// Tokens pushed through the 3-stage pipeline.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: u64,
    /// Tokens published to the fan-out, as a percentage of --messages.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub publish_percent: u64,
    /// Most tokens in flight at once (rounded up to a power of two, at most 65536).
    #[arg(long, default_value_t = 4096)]
    pub window: usize,
    /// Round trips measured one at a time after the pipelined run.
    #[arg(long, default_value_t = 2000)]
    pub latency_samples: u64,
    /// How long to wait for progress before declaring the run stalled, in seconds.
    #[arg(long, default_value_t = 30)]
    pub stall_secs: u64,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// Verification failures, with the first few described.
#[derive(Default)]
struct Failures {
    count: u64,
    examples: Vec<String>,
}

impl Failures {
    fn add(&mut self, msg: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < 10 {
            self.examples.push(msg());
        }
    }
}

/// Prints "label: 10% (…)" lines at every tenth of the way.
struct Progress {
    label: &'static str,
    total: u64,
    next_decile: u64,
    start: Instant,
    quiet: bool,
}

impl Progress {
    fn new(label: &'static str, total: u64, quiet: bool) -> Self {
        Progress {
            label,
            total,
            next_decile: 1,
            start: Instant::now(),
            quiet,
        }
    }
    fn update(&mut self, done: u64) {
        // One line per update, for the highest tenth reached.
        let mut crossed = false;
        while self.next_decile <= 10 && done * 10 >= self.total * self.next_decile {
            self.next_decile += 1;
            crossed = true;
        }
        if crossed && !self.quiet {
            eprintln!(
                "  {:<9} {:>3}%  {:>13} / {}  {:>8.2} s",
                self.label,
                (self.next_decile - 1) * 10,
                stats::count(done),
                stats::count(self.total),
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

const TOPICS: [&str; 5] = [
    "demo/sensors/tick",
    "demo/actuators/tick",
    "demo/sensors/tock",
    "demo/status",
    "$SYS/sensors/tock",
];
const FILTERS: [&str; 4] = ["demo/+/tick", "demo/#", "demo/sensors/#", "+/+/tock"];
/// `MATCHES[topic][subscriber]`, worked out by hand from the MQTT rules (not computed
/// by the broker under test).
const MATCHES: [[bool; 4]; 5] = [
    [true, true, true, false],    // demo/sensors/tick
    [true, true, false, false],   // demo/actuators/tick
    [false, true, true, true],    // demo/sensors/tock
    [false, true, false, false],  // demo/status
    [false, false, false, false], // $SYS/...: leading wildcards never match `$` topics
];

struct PipelineResult {
    elapsed: Duration,
    loaded_latency: Vec<u64>,
}

struct FanoutResult {
    publishes: u64,
    deliveries: u64,
    elapsed: Duration,
}

/// Turns a failed wait into the demo's error; on a timeout, first prints what every
/// kernel was doing, so a stall can be diagnosed.
fn stalled(rt: &RingKernel, what: &str, secs: u64, e: Error) -> Error {
    match e {
        Error::Timeout(_) => {
            eprintln!("no progress for {secs} s: {what}; kernels at that moment:");
            for k in rt.metrics().kernels {
                eprintln!(
                    "  {:<12} {:?}: received {}, processed {}, dropped {}, emitted {}, input queue {}, output queue {}",
                    k.name, k.state, k.received, k.processed, k.dropped, k.emitted, k.queue_depth, k.output_depth
                );
            }
            Error::Timeout(Duration::from_secs(secs))
        }
        other => Error::Device(format!("{what}: {other}")),
    }
}

/// Runs the demo; `Ok(true)` when every check passed.
pub async fn run(args: &DemoArgs) -> Result<bool> {
    if args.messages == 0 {
        return Err(Error::invalid("--messages must be at least 1"));
    }
    if args.window == 0 {
        return Err(Error::invalid("--window must be at least 1"));
    }
    if args.stall_secs == 0 {
        return Err(Error::invalid("--stall-secs must be at least 1"));
    }
    let window = args.window.next_power_of_two().min(1 << 16);
    // Room for the whole window in every queue, so no stage or subscriber can overflow.
    let capacity = (window * 2).max(64);

    let rt = RingKernel::builder().backend(args.backend).build().await?;
    println!("RingKernel demo");
    println!("  backend   {}", rt.selection());
    println!("  device    {}", rt.device_info());
    println!(
        "  plan      {} tokens through 3 K2K stages, {} publishes to {} subscribers, window {window}",
        stats::count(args.messages),
        stats::count(args.messages * args.publish_percent / 100),
        FILTERS.len()
    );

    let mut failures = Failures::default();
    let result = run_phases(&rt, args, window, capacity, &mut failures).await;
    let shutdown = rt.shutdown().await;
    let (pipe, fan, unloaded, metrics) = result?;
    let report = shutdown?;
    if report.undelivered != 0 {
        failures.add(|| {
            format!(
                "shutdown handed back {} undelivered messages",
                report.undelivered
            )
        });
    }

    println!();
    let mut t = Table::new(&["phase", "messages", "time", "throughput", "note"]).left(4);
    t.row(vec![
        "pipeline, 3 stages".into(),
        stats::count(args.messages),
        stats::secs(pipe.elapsed),
        stats::rate(args.messages as f64 / pipe.elapsed.as_secs_f64()),
        format!(
            "{} kernel hops/s; host sends/receives {HOST_BATCH} at a time",
            stats::rate(3.0 * args.messages as f64 / pipe.elapsed.as_secs_f64())
        ),
    ]);
    if fan.publishes > 0 {
        t.row(vec![
            "pub/sub fan-out".into(),
            stats::count(fan.publishes),
            stats::secs(fan.elapsed),
            stats::rate(fan.publishes as f64 / fan.elapsed.as_secs_f64()),
            format!(
                "{} deliveries, {}",
                stats::count(fan.deliveries),
                stats::rate(fan.deliveries as f64 / fan.elapsed.as_secs_f64())
            ),
        ]);
    }
    println!("{}", t.render());

    println!();
    let mut t = Table::new(&[
        "end-to-end latency (host → 3 stages → host)",
        "samples",
        "p50",
        "p99",
        "max",
    ]);
    let mut loaded = pipe.loaded_latency;
    let p = Percentiles::of(&mut loaded);
    t.row(vec![
        format!("pipelined, up to {window} in flight"),
        stats::count(p.count as u64),
        stats::ns(p.p50),
        stats::ns(p.p99),
        stats::ns(p.max),
    ]);
    let mut unloaded = unloaded;
    let p = Percentiles::of(&mut unloaded);
    if p.count > 0 {
        t.row(vec![
            "one at a time".into(),
            stats::count(p.count as u64),
            stats::ns(p.p50),
            stats::ns(p.p99),
            stats::ns(p.max),
        ]);
    }
    println!("{}", t.render());

    println!();
    let mut t = Table::new(&[
        "kernel",
        "processed",
        "dropped",
        "handler p50",
        "handler p99",
    ]);
    for k in &metrics.kernels {
        // A backend that does not time its handlers reports no samples.
        let (p50, p99) = if k.latency.count == 0 {
            ("not recorded".to_string(), "not recorded".to_string())
        } else {
            (stats::ns(k.latency.p50_ns), stats::ns(k.latency.p99_ns))
        };
        t.row(vec![
            k.name.clone(),
            stats::count(k.processed),
            stats::count(k.dropped),
            p50,
            p99,
        ]);
    }
    println!("{}", t.render());

    println!();
    if failures.count == 0 {
        println!(
            "verified: every token came back exactly once with the expected value, every subscriber saw exactly its topics, HLC order held on every path"
        );
        Ok(true)
    } else {
        eprintln!("VERIFICATION FAILED: {} problem(s)", failures.count);
        for e in &failures.examples {
            eprintln!("  - {e}");
        }
        Ok(false)
    }
}

async fn run_phases(
    rt: &RingKernel,
    args: &DemoArgs,
    window: usize,
    capacity: usize,
    failures: &mut Failures,
) -> Result<(PipelineResult, FanoutResult, Vec<u64>, RuntimeMetrics)> {
    let opts = |name: &str| {
        LaunchOptions::default()
            .with_queue_capacity(capacity)
            .with_name(name)
    };
    let stages = [
        rt.launch(builtin::STAGE, opts("demo.stage1")).await?,
        rt.launch(builtin::STAGE, opts("demo.stage2")).await?,
        rt.launch(builtin::STAGE, opts("demo.stage3")).await?,
    ];
    let mut counters = Vec::with_capacity(FILTERS.len());
    for (i, f) in FILTERS.iter().enumerate() {
        let k = rt
            .launch(builtin::COUNTER, opts(&format!("demo.sub{}", i + 1)))
            .await?;
        rt.subscribe(k.id(), f)?;
        counters.push(k);
    }

    let stall = Duration::from_secs(args.stall_secs);
    let pipe = pipeline(
        rt,
        &stages,
        args.messages,
        window,
        stall,
        args.quiet,
        failures,
    )
    .await?;
    let publishes = args.messages * args.publish_percent / 100;
    let fan = fanout(
        rt, &counters, publishes, window, stall, args.quiet, failures,
    )
    .await?;
    let unloaded = one_at_a_time(
        rt,
        &stages,
        args.messages,
        args.latency_samples,
        stall,
        failures,
    )
    .await?;

    // Metrics: nothing dropped anywhere, every message handled by every stage. Counters
    // are updated just after a handler returns, so first wait (briefly) until every
    // accepted message is accounted for.
    let deadline = Instant::now() + stall;
    let settled = |m: &RuntimeMetrics| {
        m.kernels
            .iter()
            .all(|k| k.processed + k.dropped >= k.received)
    };
    while !settled(&rt.metrics()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let metrics = rt.metrics();
    let expect_stage = args.messages + args.latency_samples;
    for k in &metrics.kernels {
        if k.dropped != 0 {
            failures.add(|| format!("kernel {} dropped {} messages", k.name, k.dropped));
        }
        if k.name.starts_with("demo.stage") && k.processed != expect_stage {
            failures.add(|| {
                format!(
                    "kernel {} processed {} messages, expected {expect_stage}",
                    k.name, k.processed
                )
            });
        }
    }
    for (i, c) in counters.iter().enumerate() {
        let m = c.metrics();
        let expected = expected_count(publishes, i);
        if m.processed != expected {
            failures.add(|| {
                format!(
                    "subscriber {} processed {}, expected {expected}",
                    m.name, m.processed
                )
            });
        }
    }
    Ok((pipe, fan, unloaded, metrics))
}

/// How many of `publishes` round-robin publishes subscriber `sub` matches.
fn expected_count(publishes: u64, sub: usize) -> u64 {
    (0..TOPICS.len() as u64)
        .filter(|&t| MATCHES[t as usize][sub])
        .map(|t| {
            if publishes > t {
                (publishes - t).div_ceil(TOPICS.len() as u64)
            } else {
                0
            }
        })
        .sum()
}

/// Tokens the host sends (`send_batch`) and takes back (`receive_batch`) at a time in
/// the pipelined phase.
const HOST_BATCH: u64 = 256;

/// What the pipeline phase tracks per token.
struct PipeState {
    n: u64,
    stride: u64,
    /// The host clock just before each send; a token's first stamp must be later.
    sent_ts: Vec<u64>,
    seen: Vec<bool>,
    sent_at: Vec<Option<Instant>>,
    loaded_latency: Vec<u64>,
}

impl PipeState {
    /// Checks one token that left the last stage; `host_now` is the host clock after
    /// receiving it.
    fn check(&mut self, t: Token, host_now: u64, failures: &mut Failures) {
        let now = Instant::now();
        let Some(i) = usize::try_from(t.id).ok().filter(|&i| i < self.n as usize) else {
            failures.add(|| format!("pipeline returned unknown token id {}", t.id));
            return;
        };
        if std::mem::replace(&mut self.seen[i], true) {
            failures.add(|| format!("token {} came back twice", t.id));
            return;
        }
        if t.value != t.id as f64 + 3.0 || t.hops != 3 {
            failures.add(|| {
                format!(
                    "token {}: value {} hops {}, expected {} and 3",
                    t.id,
                    t.value,
                    t.hops,
                    t.id + 3
                )
            });
        }
        let path = [self.sent_ts[i], t.stamps[0], t.stamps[1], t.stamps[2]];
        if !(path.windows(2).all(|w| w[0] < w[1]) && t.stamps[2] <= host_now) {
            failures.add(|| {
                format!(
                    "token {}: HLC order broken: send {} stages {:?} host now {host_now}",
                    t.id,
                    path[0],
                    &path[1..]
                )
            });
        }
        if t.id.is_multiple_of(self.stride) {
            if let Some(at) = self.sent_at[(t.id / self.stride) as usize] {
                self.loaded_latency
                    .push(now.duration_since(at).as_nanos() as u64);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn pipeline(
    rt: &RingKernel,
    stages: &[KernelHandle; 3],
    n: u64,
    window: usize,
    stall: Duration,
    quiet: bool,
    failures: &mut Failures,
) -> Result<PipelineResult> {
    let route = [stages[0].id(), stages[1].id(), stages[2].id()];
    let (first, last) = (&stages[0], &stages[2]);
    let window = window as u64;
    // Every `stride`-th token's send time is kept, for latency under load.
    let stride = (n / 20_000).max(1);
    let mut st = PipeState {
        n,
        stride,
        sent_ts: vec![0u64; n as usize],
        seen: vec![false; n as usize],
        sent_at: vec![None; n.div_ceil(stride) as usize],
        loaded_latency: Vec::with_capacity(n.div_ceil(stride) as usize),
    };
    let (mut sent, mut received) = (0u64, 0u64);
    let mut progress = Progress::new("pipeline", n, quiet);
    let start = Instant::now();

    let mut batch: Vec<Token> = Vec::with_capacity(HOST_BATCH as usize);
    let mut back: Vec<Token> = Vec::with_capacity(HOST_BATCH as usize);
    while received < n {
        // Send what the window allows, a batch at a time (one id block and one clock
        // reservation per batch; the queues hold the whole window, so it never waits).
        let room = window - (sent - received);
        if sent < n && room > 0 {
            let k = room.min(n - sent).min(HOST_BATCH);
            batch.clear();
            for id in sent..sent + k {
                batch.push(Token::routed(id, id as f64, &route)?);
            }
            let before = rt.clock().peek().packed();
            let at = Instant::now();
            first.send_batch(&batch).await?;
            for id in sent..sent + k {
                st.sent_ts[id as usize] = before;
                if id % stride == 0 {
                    st.sent_at[(id / stride) as usize] = Some(at);
                }
            }
            sent += k;
        }
        // Take what came back; wait only when the window is full (or all is sent).
        let can_send = sent < n && sent - received < window;
        let got = if can_send && last.engine().output_depth() == 0 {
            Ok(0)
        } else {
            let wait = if can_send { Duration::ZERO } else { stall };
            last.receive_batch_into(&mut back, HOST_BATCH as usize, Some(wait))
                .await
        };
        match got {
            Ok(_) => {}
            Err(Error::Timeout(_)) if can_send => {}
            Err(e) => {
                return Err(stalled(
                    rt,
                    &format!("pipeline stalled: {sent} of {n} tokens sent, {received} back"),
                    stall.as_secs(),
                    e,
                ))
            }
        }
        let host_now = rt.clock().peek().packed();
        for t in back.drain(..) {
            st.check(t, host_now, failures);
            received += 1;
        }
        progress.update(received);
    }
    let elapsed = start.elapsed();
    let missing = st.seen.iter().filter(|s| !**s).count();
    if missing != 0 {
        failures.add(|| format!("{missing} tokens never came back"));
    }
    Ok(PipelineResult {
        elapsed,
        loaded_latency: st.loaded_latency,
    })
}

/// What the fan-out phase tracks per subscriber.
struct FanState {
    publishes: u64,
    /// The host clock just before each publish.
    pub_ts: Vec<u64>,
    got: Vec<u64>,
    last_id: Vec<Option<u64>>,
    last_stamp: Vec<u64>,
}

impl FanState {
    /// Checks one reply of subscriber `s`.
    fn check(&mut self, s: usize, t: Token, failures: &mut Failures) {
        self.got[s] += 1;
        let Some(i) = usize::try_from(t.id)
            .ok()
            .filter(|&i| i < self.publishes as usize)
        else {
            failures.add(|| format!("subscriber {} got unknown token id {}", s + 1, t.id));
            return;
        };
        let topic = i % TOPICS.len();
        if !MATCHES[topic][s] {
            failures.add(|| {
                format!(
                    "subscriber {} ({}) got token {} of topic {}",
                    s + 1,
                    FILTERS[s],
                    t.id,
                    TOPICS[topic]
                )
            });
        }
        if self.last_id[s].is_some_and(|l| t.id <= l) {
            let last = self.last_id[s];
            failures.add(|| {
                format!(
                    "subscriber {}: token {} after {last:?}: lost, repeated or reordered",
                    s + 1,
                    t.id
                )
            });
        }
        self.last_id[s] = Some(t.id);
        let count = self.got[s];
        if t.value != count as f64 || t.hops != 1 {
            failures.add(|| {
                format!(
                    "subscriber {}: count {} hops {}, expected {count} and 1",
                    s + 1,
                    t.value,
                    t.hops
                )
            });
        }
        let (stamp, published, previous) = (t.stamps[0], self.pub_ts[i], self.last_stamp[s]);
        if stamp <= published {
            failures.add(|| {
                format!(
                    "subscriber {}: token {} HLC stamp {stamp} not after its publish ({published})",
                    s + 1,
                    t.id
                )
            });
        }
        if stamp <= previous {
            failures.add(|| {
                format!(
                    "subscriber {}: token {} HLC stamp {stamp} not after the stamp of its previous message ({previous})",
                    s + 1,
                    t.id
                )
            });
        }
        self.last_stamp[s] = t.stamps[0];
    }
}

#[allow(clippy::too_many_arguments)]
async fn fanout(
    rt: &RingKernel,
    subs: &[KernelHandle],
    publishes: u64,
    window: usize,
    stall: Duration,
    quiet: bool,
    failures: &mut Failures,
) -> Result<FanoutResult> {
    let window = window as u64;
    let nsub = subs.len();
    let mut st = FanState {
        publishes,
        pub_ts: vec![0u64; publishes as usize],
        got: vec![0u64; nsub],
        last_id: vec![None; nsub],
        last_stamp: vec![0u64; nsub],
    };
    let mut delivered = vec![0u64; nsub];
    let expected_total: u64 = (0..nsub).map(|s| expected_count(publishes, s)).sum();
    let mut progress = Progress::new("fan-out", expected_total.max(1), quiet);
    let start = Instant::now();
    let mut next = 0u64;

    loop {
        // Publish while every subscriber the next topic reaches has room.
        while next < publishes {
            let topic = (next % TOPICS.len() as u64) as usize;
            let targets = MATCHES[topic];
            if (0..nsub).any(|s| targets[s] && delivered[s] - st.got[s] >= window) {
                break;
            }
            st.pub_ts[next as usize] = rt.clock().peek().packed();
            let report = rt.publish(TOPICS[topic], &Token::new(next, 0.0))?;
            let want = targets.iter().filter(|m| **m).count();
            if report.delivered != want
                || !report.queue_full.is_empty()
                || !report.not_found.is_empty()
            {
                failures.add(|| {
                    format!(
                        "publish of token {next} to {}: {report:?}, expected {want} deliveries",
                        TOPICS[topic]
                    )
                });
            }
            for (s, m) in targets.iter().enumerate() {
                if *m {
                    delivered[s] += 1;
                }
            }
            next += 1;
        }
        let mut any = false;
        for (s, k) in subs.iter().enumerate() {
            while let Some(t) = k.try_receive::<Token>()? {
                st.check(s, t, failures);
                any = true;
            }
        }
        let total_got: u64 = st.got.iter().sum();
        progress.update(total_got);
        if next == publishes && (0..nsub).all(|s| st.got[s] >= delivered[s]) {
            break;
        }
        if !any {
            // Wait on the subscriber furthest behind.
            let s = (0..nsub)
                .max_by_key(|&s| delivered[s] - st.got[s])
                .unwrap_or(0);
            if delivered[s] > st.got[s] {
                let t = subs[s]
                    .receive_timeout_as::<Token>(stall)
                    .await
                    .map_err(|e| {
                        stalled(
                            rt,
                            &format!("fan-out stalled on subscriber {}", s + 1),
                            stall.as_secs(),
                            e,
                        )
                    })?;
                st.check(s, t, failures);
            }
        }
    }
    let elapsed = start.elapsed();
    for (s, (&got, filter)) in st.got.iter().zip(FILTERS).enumerate() {
        let expected = expected_count(publishes, s);
        if got != expected {
            failures.add(|| {
                format!(
                    "subscriber {} ({filter}) saw {got} tokens, expected {expected}",
                    s + 1
                )
            });
        }
    }
    Ok(FanoutResult {
        publishes,
        deliveries: st.got.iter().sum(),
        elapsed,
    })
}

async fn one_at_a_time(
    rt: &RingKernel,
    stages: &[KernelHandle; 3],
    first_id: u64,
    samples: u64,
    stall: Duration,
    failures: &mut Failures,
) -> Result<Vec<u64>> {
    let route = [stages[0].id(), stages[1].id(), stages[2].id()];
    let mut lat = Vec::with_capacity(samples as usize);
    for i in 0..samples {
        let id = first_id + i;
        let before = rt.clock().peek().packed();
        let t0 = Instant::now();
        stages[0].send(Token::routed(id, 0.5, &route)?).await?;
        let t: Token = stages[2]
            .receive_timeout_as(stall)
            .await
            .map_err(|e| stalled(rt, "latency round trip", stall.as_secs(), e))?;
        lat.push(t0.elapsed().as_nanos() as u64);
        if t.id != id || t.value != 3.5 || t.hops != 3 {
            failures.add(|| {
                format!(
                    "round trip {id}: got token {} value {} hops {}",
                    t.id, t.value, t.hops
                )
            });
        }
        if !(before < t.stamps[0] && t.stamps[0] < t.stamps[1] && t.stamps[1] < t.stamps[2]) {
            failures.add(|| format!("round trip {id}: HLC order broken: {before} {:?}", t.stamps));
        }
    }
    Ok(lat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_counts_follow_round_robin() {
        // 10 publishes: each topic twice.
        assert_eq!(expected_count(10, 0), 4); // two tick topics
        assert_eq!(expected_count(10, 1), 8); // every demo/ topic
        assert_eq!(expected_count(10, 2), 4);
        assert_eq!(expected_count(10, 3), 2);
        // 3 publishes: topics 0, 1, 2 once.
        assert_eq!(expected_count(3, 0), 2);
        assert_eq!(expected_count(3, 3), 1);
        assert_eq!(expected_count(0, 1), 0);
    }

    #[test]
    fn match_table_agrees_with_the_broker() {
        for (t, topic) in TOPICS.iter().enumerate() {
            for (s, filter) in FILTERS.iter().enumerate() {
                let f = ringkernel::core::pubsub::TopicFilter::new(filter).unwrap();
                assert_eq!(f.matches(topic), MATCHES[t][s], "{filter} vs {topic}");
            }
        }
    }
}
