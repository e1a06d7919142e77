//! Actor `call` round-trip latency on the CPU runtime (the design goal: p50 ≤ 10 µs).
//!
//! Timing-sensitive, so ignored by default; run it on a quiet machine with
//! `cargo test --release -p ringkernel-cpu --test runtime_latency -- --ignored --nocapture`.

use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_cpu::CpuRuntime;
use std::time::{Duration, Instant};

fn percentile(sorted: &[u64], q: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing: run in release on a quiet machine"]
async fn call_round_trip_p50_is_at_most_10us() {
    let rt = CpuRuntime::new(KernelRegistry::new()).await.unwrap();
    let k = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    const WARMUP: u64 = 5_000;
    const N: u64 = 50_000;
    let mut samples = Vec::with_capacity(N as usize);
    for i in 0..WARMUP + N {
        let t0 = Instant::now();
        let r: Token = k
            .call(Token::new(i, 1.0), Duration::from_secs(5))
            .await
            .unwrap();
        let ns = t0.elapsed().as_nanos() as u64;
        assert_eq!(r.id, i);
        if i >= WARMUP {
            samples.push(ns);
        }
    }
    samples.sort_unstable();

    // Peer in the same run: a tokio task behind an mpsc channel replying on a oneshot.
    let (tx, mut rx) =
        tokio::sync::mpsc::channel::<(Token, tokio::sync::oneshot::Sender<Token>)>(1024);
    tokio::spawn(async move {
        while let Some((mut t, reply)) = rx.recv().await {
            t.value *= 2.0;
            let _ = reply.send(t);
        }
    });
    let mut peer = Vec::with_capacity(N as usize);
    for i in 0..WARMUP + N {
        let t0 = Instant::now();
        let (otx, orx) = tokio::sync::oneshot::channel();
        tx.send((Token::new(i, 1.0), otx)).await.unwrap();
        let r = orx.await.unwrap();
        let ns = t0.elapsed().as_nanos() as u64;
        assert_eq!(r.id, i);
        if i >= WARMUP {
            peer.push(ns);
        }
    }
    peer.sort_unstable();
    println!(
        "tokio mpsc + oneshot echo (peer, same run): p50 {} ns, p90 {} ns, p99 {} ns",
        percentile(&peer, 0.5),
        percentile(&peer, 0.9),
        percentile(&peer, 0.99)
    );
    let (p50, p90, p99) = (
        percentile(&samples, 0.5),
        percentile(&samples, 0.9),
        percentile(&samples, 0.99),
    );
    println!("CPU actor call round trip over {N} calls: p50 {p50} ns, p90 {p90} ns, p99 {p99} ns");
    rt.shutdown().await.unwrap();
    assert!(p50 <= 10_000, "p50 {p50} ns exceeds the 10 µs goal");
}
