//! The CPU runtime's M:N scheduler beside its peers, all in one run (issue 18's figures):
//!
//! * `call` round trip to `rk.echo`, p50/p99 (peer: a tokio echo task over mpsc +
//!   oneshot);
//! * a token through 3 `rk.stage` kernels one at a time, p50/p99 (peer: a chain of 3
//!   tokio tasks over mpsc);
//! * 1M tokens through the 3 stages, pipelined, tokens/s: with the host sending and
//!   receiving in batches of 256 (`send_batch` / `receive_batch_into`; peer: the tokio
//!   chain with `recv_many` in the stages and the host's receiver), and one at a time
//!   (`send` / `receive`; peer: the tokio chain as is). Ours and the peers alternate,
//!   three rounds, medians;
//! * 100,000 kernels launched: time, and heap bytes per kernel beyond its queues (peer:
//!   100,000 tokio tasks, each owning an mpsc receiver);
//! * `actix` (0.13) as a second peer: a request/response ping-pong to an echo actor, a
//!   token through a chain of 3 actors one at a time, and 1M tokens through the chain
//!   (in windows of 1,000). Actix runs its actors on a single-threaded arbiter (its
//!   design), driven from that same thread.
//!
//! Ours runs twice where it matters: pooled (the default) and with
//! `LaunchOptions::with_dedicated_thread()` (a thread per kernel, the behaviour before
//! the pool). Everything is driven from one 2-worker tokio runtime.
//!
//! `cargo bench -p ringkernel-cpu --bench scheduler` (`-- --test`, as `cargo test
//! --benches` passes, runs a short smoke version). Optional first argument: a section
//! (`call`, `hops`, `pipeline`, `actix`, `kernels`; `pipeline-pooled` and
//! `pipeline-batched` run only our pooled pipeline, one at a time or batched, for a
//! profiler). `RK_TOKENS=n` sets the pipelined runs' token count, `RK_QUEUE=n` their
//! stages' queue capacity (4096), `RK_WORKERS=n` the pool size,
//! `RK_HOST=current_thread` a single-threaded host runtime.

use ringkernel_core::builtin::{Token, ECHO, STAGE};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelHandle, RingKernelRuntime};
use ringkernel_cpu::CpuRuntime;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Counts live heap bytes, to measure what a kernel costs.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `System` with layout `l` (every allocation goes there).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `System` with layout `l`; the caller's contract holds.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const TIMEOUT: Duration = Duration::from_secs(30);

fn pct(v: &mut [u64], q: f64) -> f64 {
    v.sort_unstable();
    v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1] as f64 / 1e3
}

fn row(what: &str, ours: &mut [u64], peer_name: &str, peer: &mut [u64]) {
    let (o50, o99) = (pct(ours, 0.5), pct(ours, 0.99));
    let (p50, p99) = (pct(peer, 0.5), pct(peer, 0.99));
    println!(
        "  {what:<34} p50 {o50:>8.2} µs  p99 {o99:>8.2} µs | {peer_name:<22} p50 {p50:>8.2} µs  p99 {p99:>8.2} µs | ratio p50 {:.2}",
        o50 / p50
    );
}

// ---- peers -------------------------------------------------------------------------

type EchoRequest = (Token, oneshot::Sender<Token>);

fn tokio_echo() -> mpsc::Sender<EchoRequest> {
    let (tx, mut rx) = mpsc::channel::<EchoRequest>(1024);
    tokio::spawn(async move {
        while let Some((mut t, reply)) = rx.recv().await {
            t.value *= 2.0;
            t.hops += 1;
            let _ = reply.send(t);
        }
    });
    tx
}

/// Three tokio tasks in a chain (each adds 1, like `rk.stage`); the last sends to `out`.
fn tokio_chain(cap: usize) -> (mpsc::Sender<Token>, mpsc::Receiver<Token>) {
    let (tx0, mut rx) = mpsc::channel::<Token>(cap);
    let (out_tx, out_rx) = mpsc::channel::<Token>(cap);
    for _ in 0..2 {
        let (tx, next_rx) = mpsc::channel::<Token>(cap);
        let mut my_rx = std::mem::replace(&mut rx, next_rx);
        tokio::spawn(async move {
            while let Some(mut t) = my_rx.recv().await {
                t.value += 1.0;
                t.hops += 1;
                if tx.send(t).await.is_err() {
                    break;
                }
            }
        });
    }
    tokio::spawn(async move {
        while let Some(mut t) = rx.recv().await {
            t.value += 1.0;
            t.hops += 1;
            if out_tx.send(t).await.is_err() {
                break;
            }
        }
    });
    (tx0, out_rx)
}

// ---- ours --------------------------------------------------------------------------

async fn stages(rt: &CpuRuntime, tag: &str, opts: &LaunchOptions) -> Vec<KernelHandle> {
    let mut v = Vec::new();
    for i in 0..3 {
        let o = opts.clone().with_name(format!("{tag}{i}"));
        v.push(rt.launch(STAGE, o).await.expect("launch rk.stage"));
    }
    v
}

fn pooled() -> LaunchOptions {
    LaunchOptions::default()
}

fn dedicated() -> LaunchOptions {
    LaunchOptions::default().with_dedicated_thread()
}

async fn section_call(rt: &CpuRuntime, n: usize) {
    let pool = rt
        .launch(ECHO, pooled().with_name("call.pool"))
        .await
        .unwrap();
    let ded = rt
        .launch(ECHO, dedicated().with_name("call.ded"))
        .await
        .unwrap();
    let peer = tokio_echo();
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    let mut wakeups = 0;
    for _block in 0..10 {
        for (k, v) in [(&pool, &mut a), (&ded, &mut b)] {
            let w0 = rt.scheduler_stats().wakeups;
            for i in 0..n / 10 {
                let t0 = Instant::now();
                let r: Token = k.call(Token::new(i as u64, 1.0), TIMEOUT).await.unwrap();
                v.push(t0.elapsed().as_nanos() as u64);
                assert_eq!(r.id, i as u64);
            }
            if k.id() == pool.id() {
                wakeups += rt.scheduler_stats().wakeups - w0;
            }
        }
        for i in 0..n / 10 {
            let t0 = Instant::now();
            let (otx, orx) = oneshot::channel();
            peer.send((Token::new(i as u64, 1.0), otx)).await.unwrap();
            let r = orx.await.unwrap();
            c.push(t0.elapsed().as_nanos() as u64);
            assert_eq!(r.id, i as u64);
        }
    }
    println!(
        "call round trip to an echo kernel ({} each; pooled: {:.1} pool wake-ups per 1,000 calls, search window now {:?}):",
        a.len(),
        1e3 * wakeups as f64 / a.len() as f64,
        rt.scheduler_stats().search_window
    );
    row(
        "pooled kernel",
        &mut a,
        "tokio mpsc+oneshot",
        &mut c.clone(),
    );
    row(
        "dedicated-thread kernel",
        &mut b,
        "tokio mpsc+oneshot",
        &mut c,
    );
    for k in [pool, ded] {
        k.terminate().await.unwrap();
    }
}

async fn section_hops(rt: &CpuRuntime, n: usize) {
    let pool = stages(rt, "hop.pool", &pooled()).await;
    let ded = stages(rt, "hop.ded", &dedicated()).await;
    let (ptx, mut prx) = tokio_chain(1024);
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    let mut wakeups = 0;
    for _block in 0..10 {
        for (ks, v) in [(&pool, &mut a), (&ded, &mut b)] {
            let w0 = rt.scheduler_stats().wakeups;
            let route: Vec<_> = ks.iter().map(|k| k.id()).collect();
            for i in 0..n / 10 {
                let t0 = Instant::now();
                ks[0]
                    .send(Token::routed(i as u64, 0.0, &route).unwrap())
                    .await
                    .unwrap();
                let r: Token = ks[2].receive_timeout_as(TIMEOUT).await.unwrap();
                v.push(t0.elapsed().as_nanos() as u64);
                assert_eq!((r.id, r.value), (i as u64, 3.0));
            }
            if ks[0].id() == pool[0].id() {
                wakeups += rt.scheduler_stats().wakeups - w0;
            }
        }
        for i in 0..n / 10 {
            let t0 = Instant::now();
            ptx.send(Token::new(i as u64, 0.0)).await.unwrap();
            let r = prx.recv().await.unwrap();
            c.push(t0.elapsed().as_nanos() as u64);
            assert_eq!((r.id, r.value), (i as u64, 3.0));
        }
    }
    println!(
        "a token through 3 stages, one at a time ({} each; pooled: {:.1} pool wake-ups per 1,000 tokens, search window now {:?}):",
        a.len(),
        1e3 * wakeups as f64 / a.len() as f64,
        rt.scheduler_stats().search_window
    );
    row(
        "pooled stages",
        &mut a,
        "3 tokio tasks, mpsc",
        &mut c.clone(),
    );
    row(
        "dedicated-thread stages",
        &mut b,
        "3 tokio tasks, mpsc",
        &mut c,
    );
    for k in pool.into_iter().chain(ded) {
        k.terminate().await.unwrap();
    }
}

/// CPU time (ns) this process's threads have used so far: the pool's workers and the
/// rest (the host's threads, the pool's monitor), from `/proc/self/task/*/schedstat`
/// (zeros where that does not exist).
fn cpu_ns() -> (u64, u64) {
    let (mut pool, mut rest) = (0, 0);
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    for t in dir.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        if comm.starts_with("rk-worker") {
            pool += ns;
        } else {
            rest += ns;
        }
    }
    (pool, rest)
}

/// Where the pooled pipeline's time went: CPU per token on the pool's workers and on
/// the host's threads, messages per turn, OS wake-ups per 1,000 tokens.
struct Breakdown {
    pool_ns: f64,
    search_ns: f64,
    host_ns: f64,
    per_turn: f64,
    wakeups_per_k: f64,
}

impl std::fmt::Display for Breakdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU per token: pool workers {:.0} ns (idle workers spinning for work {:.0} ns, wall time), host threads {:.0} ns; {:.1} messages per turn; {:.1} wake-ups per 1,000 tokens",
            self.pool_ns, self.search_ns, self.host_ns, self.per_turn, self.wakeups_per_k
        )
    }
}

/// Runs [`pipeline_ours`] on pooled kernels and measures its [`Breakdown`].
async fn pipeline_measured(rt: &CpuRuntime, ks: &[KernelHandle], n: u64) -> (f64, Breakdown) {
    // Threads that exited meanwhile (an extra worker retiring) are not counted.
    let (s0, c0) = (rt.scheduler_stats(), cpu_ns());
    let rate = pipeline_ours(ks, n).await;
    let (s1, c1) = (rt.scheduler_stats(), cpu_ns());
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / n as f64;
    let turns = (s1.turns - s0.turns).max(1) as f64;
    (
        rate,
        Breakdown {
            pool_ns: per(c0.0, c1.0),
            search_ns: (s1.search_time - s0.search_time).as_nanos() as f64 / n as f64,
            host_ns: per(c0.1, c1.1),
            per_turn: 3.0 * n as f64 / turns,
            wakeups_per_k: 1e3 * (s1.wakeups - s0.wakeups) as f64 / n as f64,
        },
    )
}

/// Tokens/s of `n` tokens pushed through `ks` (a sender task) and received at the end.
async fn pipeline_ours(ks: &[KernelHandle], n: u64) -> f64 {
    let route: Vec<_> = ks.iter().map(|k| k.id()).collect();
    let first = ks[0].clone();
    let t0 = Instant::now();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            first
                .send(Token::routed(i, 0.0, &route).unwrap())
                .await
                .unwrap();
        }
    });
    for i in 0..n {
        let r: Token = ks[2].receive_timeout_as(TIMEOUT).await.unwrap();
        assert_eq!(r.id, i, "order kept");
    }
    sender.await.unwrap();
    n as f64 / t0.elapsed().as_secs_f64()
}

/// Host batch of the batched pipeline runs (ours and the peer's).
const HOST_BATCH: usize = 256;

/// As [`pipeline_ours`], with the host sending `HOST_BATCH` tokens per
/// `send_batch` and receiving with `receive_batch_into` (decoded in place).
async fn pipeline_ours_batched(ks: &[KernelHandle], n: u64) -> f64 {
    let route: Vec<_> = ks.iter().map(|k| k.id()).collect();
    let first = ks[0].clone();
    let t0 = Instant::now();
    let sender = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(HOST_BATCH);
        let mut i = 0;
        while i < n {
            batch.clear();
            let end = (i + HOST_BATCH as u64).min(n);
            batch.extend((i..end).map(|j| Token::routed(j, 0.0, &route).unwrap()));
            first.send_batch(&batch).await.unwrap();
            i = end;
        }
    });
    let mut next = 0;
    let mut got: Vec<Token> = Vec::with_capacity(HOST_BATCH);
    while next < n {
        ks[2]
            .receive_batch_into(&mut got, HOST_BATCH, Some(TIMEOUT))
            .await
            .unwrap();
        for r in got.drain(..) {
            assert_eq!(r.id, next, "order kept");
            next += 1;
        }
    }
    sender.await.unwrap();
    n as f64 / t0.elapsed().as_secs_f64()
}

/// The tokio chain with the host receiving `HOST_BATCH` at a time (`recv_many`) and
/// each stage taking what waits (up to 64) before it forwards it.
async fn pipeline_tokio_batched(n: u64) -> f64 {
    let cap = 1024;
    let (tx0, mut rx) = mpsc::channel::<Token>(cap);
    for _ in 0..3 {
        let (tx, next_rx) = mpsc::channel::<Token>(cap);
        let mut my_rx = std::mem::replace(&mut rx, next_rx);
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(64);
            while my_rx.recv_many(&mut buf, 64).await > 0 {
                for mut t in buf.drain(..) {
                    t.value += 1.0;
                    t.hops += 1;
                    if tx.send(t).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    let t0 = Instant::now();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            tx0.send(Token::new(i, 0.0)).await.unwrap();
        }
    });
    let mut buf = Vec::with_capacity(HOST_BATCH);
    let mut next = 0;
    while next < n {
        rx.recv_many(&mut buf, HOST_BATCH).await;
        for r in buf.drain(..) {
            assert_eq!(r.id, next);
            next += 1;
        }
    }
    sender.await.unwrap();
    n as f64 / t0.elapsed().as_secs_f64()
}

async fn pipeline_tokio(n: u64) -> f64 {
    let (tx, mut rx) = tokio_chain(1024);
    let t0 = Instant::now();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            tx.send(Token::new(i, 0.0)).await.unwrap();
        }
    });
    for i in 0..n {
        let r = rx.recv().await.unwrap();
        assert_eq!(r.id, i);
    }
    sender.await.unwrap();
    n as f64 / t0.elapsed().as_secs_f64()
}

/// Median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn section_pipeline(rt: &CpuRuntime, n: u64, rounds: usize) {
    let opts = LaunchOptions::default().with_queue_capacity(pipeline_capacity());
    let pool = stages(rt, "pipe.pool", &opts).await;
    let ded = stages(rt, "pipe.ded", &opts.clone().with_dedicated_thread()).await;
    // Ours and the peers alternate, `rounds` times; medians are reported.
    let (mut a, mut ab, mut b, mut c, mut cb) = (vec![], vec![], vec![], vec![], vec![]);
    let mut bd = None;
    for _ in 0..rounds {
        ab.push(pipeline_ours_batched(&pool, n).await);
        cb.push(pipeline_tokio_batched(n).await);
        let (r, d) = pipeline_measured(rt, &pool, n).await;
        a.push(r);
        bd = Some(d);
        c.push(pipeline_tokio(n).await);
        b.push(pipeline_ours(&ded, n).await);
    }
    let show = |v: &[f64]| {
        v.iter()
            .map(|r| format!("{:.2}", r / 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("{n} tokens through 3 stages, pipelined (M tokens/s, median of {rounds} alternating runs; 3 hops each):");
    println!(
        "  host sends/receives in batches of {HOST_BATCH}: pooled {:.3} M/s ({}) | 3 tokio tasks, host recv_many {:.3} M/s ({}) | ratio {:.2}",
        median(&mut ab.clone()) / 1e6,
        show(&ab),
        median(&mut cb.clone()) / 1e6,
        show(&cb),
        median(&mut ab) / median(&mut cb)
    );
    println!(
        "  host sends/receives one at a time:  pooled {:.3} M/s ({}) | 3 tokio tasks over mpsc {:.3} M/s ({}) | ratio {:.2} | dedicated threads {:.3} M/s",
        median(&mut a.clone()) / 1e6,
        show(&a),
        median(&mut c.clone()) / 1e6,
        show(&c),
        median(&mut a) / median(&mut c),
        median(&mut b) / 1e6
    );
    if let Some(bd) = bd {
        println!("  pooled, one at a time (last run): {bd}");
    }
    for k in pool.into_iter().chain(ded) {
        k.terminate().await.unwrap();
    }
}

async fn section_kernels(rt: &CpuRuntime, n: usize) {
    // The smallest queues: 2 input slots (one lane open) and 2 output slots of 256 B
    // (a `Token` needs more than the 64 payload bytes of a 128-B slot).
    let opts = LaunchOptions::default().with_queue_capacity(2);
    let queue_bytes = (2 + 2) * opts.slot_size;
    let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let live0 = LIVE.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut ks = Vec::with_capacity(n);
    for name in &names {
        ks.push(
            rt.launch(ECHO, opts.clone().with_name(name.as_str()))
                .await
                .unwrap(),
        );
    }
    let launch = t0.elapsed();
    let bytes = (LIVE.load(Ordering::Relaxed) - live0) as f64 / n as f64;
    let t1 = Instant::now();
    for (i, k) in ks.iter().enumerate() {
        k.send(Token::new(i as u64, 1.0)).await.unwrap();
    }
    for (i, k) in ks.iter().enumerate() {
        let r: Token = k.receive_timeout_as(TIMEOUT).await.unwrap();
        assert_eq!(r.id, i as u64);
    }
    let one_each = t1.elapsed();
    let t2 = Instant::now();
    rt.shutdown().await.unwrap();
    drop(ks);
    let down = t2.elapsed();

    // Peer: tasks each owning an mpsc receiver of capacity 2, answering on an mpsc.
    let live1 = LIVE.load(Ordering::Relaxed);
    let t3 = Instant::now();
    let (out_tx, mut out_rx) = mpsc::channel::<Token>(1024);
    let mut txs = Vec::with_capacity(n);
    for _ in 0..n {
        let (tx, mut rx) = mpsc::channel::<Token>(2);
        let out = out_tx.clone();
        tokio::spawn(async move {
            while let Some(mut t) = rx.recv().await {
                t.value *= 2.0;
                let _ = out.send(t).await;
            }
        });
        txs.push(tx);
    }
    let peer_launch = t3.elapsed();
    let peer_bytes = (LIVE.load(Ordering::Relaxed) - live1) as f64 / n as f64;
    let t4 = Instant::now();
    let recv = tokio::spawn(async move {
        for _ in 0..n {
            out_rx.recv().await.unwrap();
        }
    });
    for (i, tx) in txs.iter().enumerate() {
        tx.send(Token::new(i as u64, 1.0)).await.unwrap();
    }
    recv.await.unwrap();
    let peer_one_each = t4.elapsed();
    drop(txs);

    println!("{n} echo kernels (queues: {queue_bytes} B each):");
    println!(
        "  launch {:.3} s ({:.2} µs each), {:.0} B heap per kernel, {:.0} B beyond its queues; one message each {:.3} s; shutdown {:.3} s",
        launch.as_secs_f64(),
        launch.as_secs_f64() * 1e6 / n as f64,
        bytes,
        bytes - queue_bytes as f64,
        one_each.as_secs_f64(),
        down.as_secs_f64()
    );
    println!(
        "  peer, {n} tokio tasks each with an mpsc(2): spawn {:.3} s, {:.0} B heap per task; one message each {:.3} s",
        peer_launch.as_secs_f64(),
        peer_bytes,
        peer_one_each.as_secs_f64()
    );
}

mod actix_peer {
    use super::{pct, Token};
    use actix::prelude::*;
    use std::time::Instant;
    use tokio::sync::mpsc;

    struct Echo;
    impl Actor for Echo {
        type Context = Context<Self>;
    }
    struct Req(Token);
    impl Message for Req {
        type Result = Token;
    }
    impl Handler<Req> for Echo {
        type Result = MessageResult<Req>;
        fn handle(&mut self, m: Req, _: &mut Context<Self>) -> Self::Result {
            let mut t = m.0;
            t.value *= 2.0;
            t.hops += 1;
            MessageResult(t)
        }
    }

    struct Hop(Token);
    impl Message for Hop {
        type Result = ();
    }
    struct Stage {
        next: Option<Recipient<Hop>>,
        out: Option<mpsc::UnboundedSender<Token>>,
    }
    impl Actor for Stage {
        type Context = Context<Self>;
    }
    impl Handler<Hop> for Stage {
        type Result = ();
        fn handle(&mut self, m: Hop, _: &mut Context<Self>) {
            let mut t = m.0;
            t.value += 1.0;
            t.hops += 1;
            match (&self.next, &self.out) {
                (Some(n), _) => n.do_send(Hop(t)),
                (None, Some(o)) => {
                    let _ = o.send(t);
                }
                (None, None) => {}
            }
        }
    }

    /// Runs the actix peer on its own thread; prints its figures.
    pub fn run(n: usize, tokens: u64) {
        std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let echo = Echo.start();
                let mut lat = Vec::with_capacity(n);
                for i in 0..n as u64 {
                    let t0 = Instant::now();
                    let r = echo.send(Req(Token::new(i, 1.0))).await.unwrap();
                    lat.push(t0.elapsed().as_nanos() as u64);
                    assert_eq!(r.id, i);
                }
                let (tx, mut rx) = mpsc::unbounded_channel();
                let s3 = Stage {
                    next: None,
                    out: Some(tx),
                }
                .start();
                let s2 = Stage {
                    next: Some(s3.recipient()),
                    out: None,
                }
                .start();
                let s1 = Stage {
                    next: Some(s2.recipient()),
                    out: None,
                }
                .start();
                let mut hops = Vec::with_capacity(n);
                for i in 0..n as u64 {
                    let t0 = Instant::now();
                    s1.do_send(Hop(Token::new(i, 0.0)));
                    let r = rx.recv().await.unwrap();
                    hops.push(t0.elapsed().as_nanos() as u64);
                    assert_eq!((r.id, r.value), (i, 3.0));
                }
                let t0 = Instant::now();
                let mut next = 0u64;
                while next < tokens {
                    let end = (next + 1000).min(tokens);
                    for i in next..end {
                        s1.do_send(Hop(Token::new(i, 0.0)));
                    }
                    for i in next..end {
                        let r = rx.recv().await.unwrap();
                        assert_eq!(r.id, i);
                    }
                    next = end;
                }
                let rate = tokens as f64 / t0.elapsed().as_secs_f64();
                println!("actix 0.13 peer (one single-threaded arbiter):");
                println!(
                    "  ping-pong (send().await to an echo actor)   p50 {:>8.2} µs  p99 {:>8.2} µs",
                    pct(&mut lat, 0.5),
                    pct(&mut lat, 0.99)
                );
                println!(
                    "  chain of 3 actors, one at a time            p50 {:>8.2} µs  p99 {:>8.2} µs",
                    pct(&mut hops, 0.5),
                    pct(&mut hops, 0.99)
                );
                println!(
                    "  {tokens} tokens through the chain (windows of 1,000): {:.3} M/s",
                    rate / 1e6
                );
                System::current().stop();
            });
        })
        .join()
        .expect("actix peer");
    }
}

/// Queue capacity of the pipelined runs' stages: 4096, or `RK_QUEUE`.
fn pipeline_capacity() -> usize {
    std::env::var("RK_QUEUE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096)
}

/// Tokens of the pipelined runs: 1M (10,000 with `--test`), or `RK_TOKENS`.
fn tokens(quick: bool) -> u64 {
    std::env::var("RK_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 10_000 } else { 1_000_000 })
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let only: Option<String> = std::env::args().skip(1).find(|a| {
        [
            "call",
            "hops",
            "pipeline",
            "pipeline-pooled",
            "pipeline-batched",
            "kernels",
            "actix",
        ]
        .contains(&a.as_str())
    });
    let want = |s: &str| only.as_deref().is_none_or(|o| o == s);
    // `RK_HOST=current_thread`: drive everything from a single-threaded tokio runtime
    // (as the CLI demo does) instead of a 2-worker one.
    let tokio_rt = if std::env::var("RK_HOST").is_ok_and(|v| v == "current_thread") {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    }
    .enable_all()
    .build()
    .expect("tokio runtime");
    tokio_rt.block_on(async {
        let mut rt = CpuRuntime::with_registry(KernelRegistry::new())
            .await
            .unwrap();
        // `RK_WORKERS=n`: another pool size than one worker per core.
        if let Some(n) = std::env::var("RK_WORKERS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            rt = rt.with_workers(n).unwrap();
        }
        println!(
            "CPU runtime: {} pool workers; {}",
            rt.scheduler_stats().workers,
            rt.device_info()
        );
        if want("call") {
            section_call(&rt, if quick { 100 } else { 20_000 }).await;
        }
        if want("hops") {
            section_hops(&rt, if quick { 100 } else { 20_000 }).await;
        }
        if only.as_deref() == Some("pipeline-pooled") {
            // Only our pooled pipeline (for profiling it alone).
            let opts = LaunchOptions::default().with_queue_capacity(pipeline_capacity());
            let ks = stages(&rt, "prof", &opts).await;
            let (r, bd) = pipeline_measured(&rt, &ks, tokens(quick)).await;
            println!("pooled pipeline alone: {:.3} M tokens/s; {bd}", r / 1e6);
        }
        if only.as_deref() == Some("pipeline-batched") {
            // Only our pooled pipeline with a batching host (for profiling it alone).
            let opts = LaunchOptions::default().with_queue_capacity(pipeline_capacity());
            let ks = stages(&rt, "prof", &opts).await;
            let n = tokens(quick);
            let (s0, c0) = (rt.scheduler_stats(), cpu_ns());
            let r = pipeline_ours_batched(&ks, n).await;
            let (s1, c1) = (rt.scheduler_stats(), cpu_ns());
            println!(
                "pooled pipeline, batching host: {:.3} M tokens/s; CPU per token: pool workers {:.0} ns (idle workers spinning for work {:.0} ns, wall time), host threads {:.0} ns; {:.1} messages per turn; {:.1} wake-ups per 1,000 tokens; {} extra workers started",
                r / 1e6,
                (c1.0 - c0.0) as f64 / n as f64,
                (s1.search_time - s0.search_time).as_nanos() as f64 / n as f64,
                (c1.1 - c0.1) as f64 / n as f64,
                3.0 * n as f64 / (s1.turns - s0.turns).max(1) as f64,
                1e3 * (s1.wakeups - s0.wakeups) as f64 / n as f64,
                s1.extra_started - s0.extra_started
            );
        }
        if want("pipeline") {
            section_pipeline(&rt, tokens(quick), if quick { 1 } else { 3 }).await;
        }
        if want("actix") {
            let n = if quick { 100 } else { 20_000 };
            let tokens = if quick { 10_000 } else { 1_000_000 };
            tokio::task::spawn_blocking(move || actix_peer::run(n, tokens))
                .await
                .unwrap();
        }
        if want("kernels") {
            section_kernels(&rt, if quick { 1_000 } else { 100_000 }).await;
        } else {
            rt.shutdown().await.unwrap();
        }
    });
}
