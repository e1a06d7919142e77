//! Priority lanes on the CPU runtime beyond the shared conformance cases
//! (`priority_order`, `priority_lanes`, `kernel_priority`): wake-ups through lanes opened
//! while the worker sleeps, concurrent senders on every lane, depth over all lanes.

use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::context::KernelContext;
use ringkernel_core::error::Result;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::priority::{CRITICAL, HIGH, LOW, NORMAL};
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{RingKernelRuntime, RuntimeExt};
use ringkernel_cpu::CpuRuntime;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

async fn runtime() -> CpuRuntime {
    CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap()
}

/// The first message of a lane opens it while the worker is parked: the worker must
/// wake at once, not at its 100 ms safety-net timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_into_a_new_lane_wakes_a_parked_worker() {
    let rt = runtime().await;
    let k = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    let _: Token = k.call(Token::new(0, 1.0), T).await.unwrap();
    let mut slowest = Duration::ZERO;
    for (i, p) in [LOW, HIGH, CRITICAL, LOW].into_iter().enumerate() {
        // Long enough for the worker to stop spinning and park.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t0 = Instant::now();
        k.send_with_priority(Token::new(i as u64 + 1, 1.0), p)
            .await
            .unwrap();
        let env = k.receive_envelope(Some(T)).await.unwrap();
        slowest = slowest.max(t0.elapsed());
        assert_eq!(env.decode::<Token>().unwrap().id, i as u64 + 1);
        assert_eq!(env.header.priority(), NORMAL, "the kernel's priority");
    }
    assert!(
        slowest < Duration::from_millis(60),
        "a lane's first message waited {slowest:?}: the wake-up was lost"
    );
    rt.shutdown().await.unwrap();
}

/// Senders on every lane at once, while the kernel runs: nothing is lost or handled
/// twice, and each sender's messages of one priority keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_senders_on_every_lane_lose_nothing() {
    const SENDERS: u64 = 4;
    const EACH: u64 = 2_000;
    let rt = runtime().await;
    let k = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_queue_capacity(64)
                .with_output_capacity(16_384),
        )
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let p = [LOW, NORMAL, HIGH, CRITICAL][((i + s) % 4) as usize];
                k.send_with_priority(Token::new(s << 32 | i, 1.0), p)
                    .await
                    .unwrap();
            }
        }));
    }
    // Receive while the senders run (the output queue is large enough anyway).
    let mut last: HashMap<(u64, usize), u64> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..SENDERS * EACH {
        let env = k.receive_envelope(Some(T)).await.unwrap();
        let id = env.decode::<Token>().unwrap().id;
        assert!(seen.insert(id), "message {id:#x} handled twice");
        let (s, i) = (id >> 32, id & 0xFFFF_FFFF);
        let lane = ((i + s) % 4) as usize;
        if let Some(prev) = last.insert((s, lane), i) {
            assert!(prev < i, "sender {s}, lane {lane}: {i} after {prev}");
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let m = k.metrics();
    assert_eq!(m.received, SENDERS * EACH);
    assert_eq!(m.processed, SENDERS * EACH);
    assert_eq!(m.queue_depth, 0);
    rt.shutdown().await.unwrap();
}

/// `queue_depth` counts every lane; `input_capacity` is one lane's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_counts_every_lane() {
    let rt = runtime().await;
    let k = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_queue_capacity(8)
                .without_auto_activate(),
        )
        .await
        .unwrap();
    for i in 0..2 {
        k.send_with_priority(Token::new(i, 1.0), LOW).await.unwrap();
    }
    for i in 2..5 {
        k.send_with_priority(Token::new(i, 1.0), HIGH)
            .await
            .unwrap();
    }
    k.send(Token::new(5, 1.0)).await.unwrap();
    assert_eq!(k.metrics().queue_depth, 6);
    assert_eq!(k.engine().input_capacity(), 8);
    k.activate().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..6 {
        let t: Token = k.receive_timeout_as(T).await.unwrap();
        ids.push(t.id);
    }
    assert_eq!(ids, vec![2, 3, 4, 5, 0, 1]);
    rt.shutdown().await.unwrap();
}

/// A kernel's publishes carry its priority (host publishes are NORMAL): at a
/// subscriber with LOW messages waiting, the CRITICAL kernel's publish comes first,
/// then the host's, then the LOW ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_carry_the_publishing_kernels_priority() {
    let reg = KernelRegistry::new();
    reg.register_fn(
        "test.publisher",
        |ctx: &mut KernelContext<'_>, t: Token| -> Result<Option<Token>> {
            assert_eq!(ctx.priority(), CRITICAL);
            ctx.publish("prio/news", &t)?;
            Ok(None)
        },
    );
    let rt = CpuRuntime::with_registry(reg).await.unwrap();
    let publisher = rt
        .launch(
            "test.publisher",
            LaunchOptions::default().with_priority(CRITICAL),
        )
        .await
        .unwrap();
    let sub = rt
        .launch(ECHO, LaunchOptions::default().without_auto_activate())
        .await
        .unwrap();
    rt.subscribe(sub.id(), "prio/#").unwrap();
    for i in 0..3 {
        sub.send_with_priority(Token::new(i, 1.0), LOW)
            .await
            .unwrap();
    }
    publisher.send(Token::new(100, 1.0)).await.unwrap();
    let deadline = Instant::now() + T;
    while sub.metrics().received < 4 {
        assert!(Instant::now() < deadline, "the publish never arrived");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let report = rt.publish("prio/host", &Token::new(50, 1.0)).unwrap();
    assert_eq!(report.delivered, 1);
    sub.activate().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let t: Token = sub.receive_timeout_as(T).await.unwrap();
        ids.push(t.id);
    }
    assert_eq!(ids, vec![100, 50, 0, 1, 2]);
    rt.shutdown().await.unwrap();
}
