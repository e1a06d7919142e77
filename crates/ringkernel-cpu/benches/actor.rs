//! CPU actor `call` round trip (`rk.echo`) beside a tokio mpsc + oneshot echo task, both
//! driven from the same two-worker tokio runtime in the same run.
//!
//! `cargo bench -p ringkernel-cpu --bench actor`. Criterion reports the mean time per
//! round trip; afterwards the bench times 20,000 single round trips of each and prints
//! p50/p99 (the figure the target "p50 ≤ 10 µs" is about).

use criterion::{BenchmarkId, Criterion, Throughput};
use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelHandle, RingKernelRuntime};
use ringkernel_cpu::CpuRuntime;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

const TIMEOUT: Duration = Duration::from_secs(10);

type Request = (Token, oneshot::Sender<Token>);

/// The peer: an echo task behind an mpsc channel, replying on a oneshot.
fn spawn_tokio_echo(rt: &tokio::runtime::Runtime) -> mpsc::Sender<Request> {
    let (tx, mut rx) = mpsc::channel::<Request>(1024);
    rt.spawn(async move {
        while let Some((mut t, reply)) = rx.recv().await {
            t.value *= 2.0;
            t.hops += 1;
            let _ = reply.send(t);
        }
    });
    tx
}

async fn tokio_call(tx: &mpsc::Sender<Request>, t: Token) -> Token {
    let (otx, orx) = oneshot::channel();
    tx.send((t, otx)).await.expect("echo task alive");
    orx.await.expect("echo task replies")
}

async fn ours_call(k: &KernelHandle, t: Token) -> Token {
    k.call(t, TIMEOUT).await.expect("rk.echo replies")
}

struct Setup {
    rt: tokio::runtime::Runtime,
    ours: CpuRuntime,
    echo: KernelHandle,
    peer: mpsc::Sender<Request>,
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ours = rt
        .block_on(CpuRuntime::with_registry(KernelRegistry::new()))
        .expect("CPU runtime");
    let echo = rt
        .block_on(ours.launch(ECHO, LaunchOptions::default()))
        .expect("launch rk.echo");
    let peer = spawn_tokio_echo(&rt);
    // Both answer correctly before anything is timed.
    let a = rt.block_on(ours_call(&echo, Token::new(1, 2.0)));
    let b = rt.block_on(tokio_call(&peer, Token::new(1, 2.0)));
    assert_eq!((a.value, b.value), (4.0, 4.0));
    Setup {
        rt,
        ours,
        echo,
        peer,
    }
}

fn round_trip(c: &mut Criterion, s: &Setup) {
    let mut g = c.benchmark_group("actor_round_trip");
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("ringkernel_cpu_call", "rk.echo"), |b| {
        b.iter_custom(|iters| {
            s.rt.block_on(async {
                let start = Instant::now();
                for i in 0..iters {
                    std::hint::black_box(ours_call(&s.echo, Token::new(i, 1.0)).await);
                }
                start.elapsed()
            })
        })
    });
    g.bench_function(BenchmarkId::new("tokio_mpsc_oneshot", "echo"), |b| {
        b.iter_custom(|iters| {
            s.rt.block_on(async {
                let start = Instant::now();
                for i in 0..iters {
                    std::hint::black_box(tokio_call(&s.peer, Token::new(i, 1.0)).await);
                }
                start.elapsed()
            })
        })
    });
    g.finish();
}

/// p50/p99 of single round trips, ours and the peer's, interleaved in blocks so both
/// see the same machine load.
fn percentiles(s: &Setup, n: usize) {
    let (mut ours, mut peer) = (Vec::with_capacity(n), Vec::with_capacity(n));
    s.rt.block_on(async {
        for block in 0..10 {
            for i in 0..n / 10 {
                let t0 = Instant::now();
                let r = ours_call(&s.echo, Token::new(i as u64, 1.0)).await;
                ours.push(t0.elapsed().as_nanos() as u64);
                assert_eq!(r.id, i as u64, "block {block}");
            }
            for i in 0..n / 10 {
                let t0 = Instant::now();
                let r = tokio_call(&s.peer, Token::new(i as u64, 1.0)).await;
                peer.push(t0.elapsed().as_nanos() as u64);
                assert_eq!(r.id, i as u64);
            }
        }
    });
    let pct = |v: &mut Vec<u64>, q: f64| {
        v.sort_unstable();
        v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
    };
    let (o50, o99) = (pct(&mut ours, 0.5), pct(&mut ours, 0.99));
    let (p50, p99) = (pct(&mut peer, 0.5), pct(&mut peer, 0.99));
    println!(
        "actor_round_trip percentiles over {} round trips each:",
        ours.len()
    );
    println!(
        "  ringkernel_cpu_call  p50 {:>8.2} µs  p99 {:>8.2} µs",
        o50 as f64 / 1e3,
        o99 as f64 / 1e3
    );
    println!(
        "  tokio_mpsc_oneshot   p50 {:>8.2} µs  p99 {:>8.2} µs",
        p50 as f64 / 1e3,
        p99 as f64 / 1e3
    );
    println!(
        "  ratio ours/peer      p50 {:>8.2}     p99 {:>8.2}",
        o50 as f64 / p50.max(1) as f64,
        o99 as f64 / p99.max(1) as f64
    );
}

fn main() {
    let s = setup();
    let mut c = Criterion::default().configure_from_args();
    round_trip(&mut c, &s);
    c.final_summary();
    // `cargo test --benches` runs each bench once as a smoke test: keep that short.
    let quick = std::env::args().any(|a| a == "--test");
    percentiles(&s, if quick { 100 } else { 20_000 });
    s.rt.block_on(s.ours.shutdown()).expect("shutdown");
}
