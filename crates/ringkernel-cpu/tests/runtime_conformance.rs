//! The cross-backend behavioural tests (`ringkernel_core::conformance`) on the CPU
//! runtime, one test per check, plus CPU-specific tests.

use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::conformance as conf;
use ringkernel_core::context::KernelContext;
use ringkernel_core::error::{Error, Result};
use ringkernel_core::hlc::{system_clock_ms, HlcTimestamp};
use ringkernel_core::k2k::{K2kReceipt, KernelTarget};
use ringkernel_core::lifecycle::LifecycleState;
use ringkernel_core::message::{Envelope, MessageHeader, RingMessage};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::{CpuHandler, KernelRegistry};
use ringkernel_core::runtime::{KernelId, RingKernelRuntime};
use ringkernel_cpu::CpuRuntime;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// Volume of the echo and pipeline tests: the full million messages (a few seconds
/// even in a debug build).
fn scale() -> conf::Scale {
    conf::Scale::full()
}

async fn runtime() -> CpuRuntime {
    CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .expect("CPU runtime")
}

ringkernel_core::conformance_tests! {
    runtime: runtime().await,
    scale: scale(),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_on_one_runtime() {
    let rt = runtime().await;
    conf::run_all(&rt, conf::Scale::quick()).await.unwrap();
    let report = rt.shutdown().await.unwrap();
    assert_eq!(
        report.kernels, 0,
        "the conformance tests left kernels running"
    );
}

/// What a receipt is, as a number a handler can put into a reply.
fn receipt_code(r: K2kReceipt) -> f64 {
    match r {
        K2kReceipt::Delivered => 1.0,
        K2kReceipt::QueueFull => 2.0,
        K2kReceipt::NotFound => 3.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2k_to_a_missing_kernel_is_not_found() {
    let reg = KernelRegistry::new();
    // Sends to the target named by the request: by id (id field) or by name (id 0).
    reg.register_fn(
        "test.k2k",
        |ctx: &mut KernelContext<'_>, mut t: Token| -> Result<Option<Token>> {
            let receipt = if t.id == 0 {
                ctx.send_to("no.such.kernel", &t)?
            } else {
                ctx.send_to(KernelId(t.id as u32), &t)?
            };
            t.value = receipt_code(receipt);
            Ok(Some(t))
        },
    );
    let rt = CpuRuntime::with_registry(reg).await.unwrap();
    let k = rt
        .launch("test.k2k", LaunchOptions::default())
        .await
        .unwrap();
    let by_name: Token = k.call(Token::new(0, 0.0), T).await.unwrap();
    assert_eq!(by_name.value, receipt_code(K2kReceipt::NotFound));
    let by_id: Token = k.call(Token::new(9999, 0.0), T).await.unwrap();
    assert_eq!(by_id.value, receipt_code(K2kReceipt::NotFound));

    // A live target is Delivered; once it has terminated it is NotFound again.
    let sink = rt
        .launch(ECHO, LaunchOptions::default().with_name("sink"))
        .await
        .unwrap();
    let live: Token = k
        .call(Token::new(sink.id().0 as u64, 0.0), T)
        .await
        .unwrap();
    assert_eq!(live.value, receipt_code(K2kReceipt::Delivered));
    sink.terminate().await.unwrap();
    let gone: Token = k
        .call(Token::new(sink.id().0 as u64, 0.0), T)
        .await
        .unwrap();
    assert_eq!(gone.value, receipt_code(K2kReceipt::NotFound));
    // The host-side routing answers the same way.
    let r = rt
        .core()
        .deliver(
            &KernelTarget::Name("no.such.kernel".into()),
            MessageHeader::new(Token::TYPE_ID, 72),
            &[0u8; 72],
        )
        .unwrap();
    assert_eq!(r, K2kReceipt::NotFound);
    let m = settled(&k, 4).await;
    assert_eq!((m.processed, m.dropped), (4, 0));
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_errors_and_panics_are_counted_as_dropped() {
    let reg = KernelRegistry::new();
    reg.register_fn(
        "test.picky",
        |_ctx: &mut KernelContext<'_>, t: Token| -> Result<Option<Token>> {
            if t.id == 7 {
                panic!("token 7 makes this handler panic");
            }
            if t.id % 2 == 1 {
                return Err(Error::invalid(format!("odd token {}", t.id)));
            }
            Ok(Some(t))
        },
    );
    let rt = CpuRuntime::with_registry(reg).await.unwrap();
    let k = rt
        .launch("test.picky", LaunchOptions::default())
        .await
        .unwrap();
    for i in 0..10u64 {
        k.send(Token::new(i, i as f64)).await.unwrap();
    }
    // A message of another type is refused by the typed handler (TypeMismatch).
    k.send_envelope(&Envelope::from_bytes(0xDEAD, &[1, 2, 3, 4]))
        .await
        .unwrap();
    k.send(Token::new(10, 10.0)).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..6 {
        let t: Token = k.receive_timeout_as(T).await.unwrap();
        got.push(t.id);
    }
    assert_eq!(
        got,
        vec![0, 2, 4, 6, 8, 10],
        "even tokens are replied in order, the kernel survives the panic"
    );
    let m = settled(&k, 12).await;
    assert_eq!(m.received, 12);
    assert_eq!(m.processed, 6);
    assert_eq!(
        m.dropped, 6,
        "5 odd tokens (one panicking) and one wrong type"
    );
    assert_eq!(k.state(), LifecycleState::Active);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_counters_are_consistent() {
    let rt = runtime().await;
    let k = rt
        .launch(ECHO, LaunchOptions::default().with_name("telemetry"))
        .await
        .unwrap();
    const N: u64 = 2_000;
    for i in 0..N {
        let r: Token = k.call(Token::new(i, 1.0), T).await.unwrap();
        assert_eq!(r.id, i);
    }
    // A reply is visible before the worker counts its message as processed (the
    // handler returns after emitting): wait until the counters catch up.
    let m = settled(&k, N).await;
    assert_eq!(m.name, "telemetry");
    assert_eq!(m.state, LifecycleState::Active);
    assert_eq!(m.received, N);
    assert_eq!(m.processed, N);
    assert_eq!(m.emitted, N);
    assert_eq!(m.dropped, 0);
    assert_eq!(m.queue_depth, 0);
    assert_eq!(m.output_depth, 0);
    assert_eq!(m.latency.count, N);
    assert!(m.latency.p50_ns > 0, "p50 {:?}", m.latency);
    assert!(
        m.latency.p50_ns <= m.latency.p99_ns && m.latency.p99_ns <= m.latency.max_ns,
        "{:?}",
        m.latency
    );

    // Queued but not processed: received counts them, processed does not.
    k.deactivate().await.unwrap();
    for i in 0..5 {
        k.send(Token::new(i, 0.0)).await.unwrap();
    }
    let m = k.metrics();
    assert_eq!((m.received, m.processed, m.queue_depth), (N + 5, N, 5));
    let all = rt.metrics();
    assert_eq!(all.kernels.len(), 1);
    assert_eq!(all.total_received, N + 5);
    assert_eq!(all.total_processed, N);

    // After activation and a draining terminate everything received was processed.
    k.activate().await.unwrap();
    let report = k.terminate().await.unwrap();
    let m = k.metrics();
    assert_eq!(m.state, LifecycleState::Terminated);
    assert_eq!(m.received, m.processed, "{m:?} / {report:?}");
    assert_eq!(m.output_depth, 5);
    assert_eq!(report.replies_waiting, m.output_depth);
    assert!(
        rt.metrics().kernels.is_empty(),
        "a terminated kernel leaves the runtime table"
    );
    rt.shutdown().await.unwrap();
}

/// Metrics once `processed + dropped` has reached `n` (at most a few seconds).
async fn settled(
    k: &ringkernel_core::runtime::KernelHandle,
    n: u64,
) -> ringkernel_core::telemetry::KernelMetrics {
    let start = Instant::now();
    loop {
        let m = k.metrics();
        if m.processed + m.dropped >= n || start.elapsed() > Duration::from_secs(5) {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The async API never blocks the executor: on a single-threaded executor a ticker
/// task keeps running while `call`, a backpressured `send` and `terminate` wait.
#[tokio::test(flavor = "current_thread")]
async fn async_api_never_blocks_the_executor() {
    let reg = KernelRegistry::new();
    reg.register_fn("test.slow", |_ctx: &mut KernelContext<'_>, t: Token| {
        std::thread::sleep(Duration::from_millis(60));
        Some(t)
    });
    let rt = CpuRuntime::with_registry(reg).await.unwrap();
    let ticks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (ticks, stop) = (ticks.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(2)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    // A slow call: the ticker runs while we wait for the reply.
    let k = rt
        .launch(
            "test.slow",
            LaunchOptions::default()
                .with_queue_capacity(2)
                .with_output_capacity(8),
        )
        .await
        .unwrap();
    let before = ticks.load(Ordering::Relaxed);
    let r: Token = k.call(Token::new(1, 1.0), T).await.unwrap();
    assert_eq!(r.id, 1);
    assert!(
        ticks.load(Ordering::Relaxed) >= before + 5,
        "the executor was blocked during call"
    );

    // Many fast round trips on one thread.
    let echo = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    for i in 0..2_000u64 {
        let r: Token = echo.call(Token::new(i, 2.0), T).await.unwrap();
        assert_eq!((r.id, r.value), (i, 4.0));
    }

    // A send that waits for queue space (deactivated kernel, full queue) does not
    // block either: another task activates the kernel.
    k.deactivate().await.unwrap();
    k.send(Token::new(2, 0.0)).await.unwrap();
    k.send(Token::new(3, 0.0)).await.unwrap();
    let activator = {
        let k = k.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            k.activate().await.unwrap();
        })
    };
    let before = ticks.load(Ordering::Relaxed);
    k.send(Token::new(4, 0.0)).await.unwrap();
    assert!(
        ticks.load(Ordering::Relaxed) > before,
        "the executor was blocked during a waiting send"
    );
    activator.await.unwrap();

    // Terminating a kernel with slow messages queued drains them without blocking.
    let before = ticks.load(Ordering::Relaxed);
    let report = k.terminate().await.unwrap();
    // Whatever was still queued is drained (on a fast scheduler the handler may have
    // finished all of them before terminate: then their replies wait); none is lost.
    assert!(report.undelivered.is_empty(), "{report:?}");
    assert!(
        report.drained + report.replies_waiting as u64 >= 1,
        "{report:?}"
    );
    assert!(
        ticks.load(Ordering::Relaxed) >= before + 5,
        "the executor was blocked during terminate"
    );
    for id in [2, 3, 4] {
        let t: Token = k.receive_timeout_as(T).await.unwrap();
        assert_eq!(t.id, id);
    }
    stop.store(true, Ordering::Relaxed);
    ticker.await.unwrap();
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_active_and_returns_queued_messages() {
    let rt = runtime().await;
    let a = rt
        .launch(ECHO, LaunchOptions::default().with_name("a"))
        .await
        .unwrap();
    let b = rt
        .launch(ECHO, LaunchOptions::default().with_name("b"))
        .await
        .unwrap();
    let c = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_name("c")
                .with_auto_activate(false),
        )
        .await
        .unwrap();
    b.deactivate().await.unwrap();
    for i in 0..50 {
        a.send(Token::new(i, 0.0)).await.unwrap();
    }
    for i in 0..7 {
        b.send(Token::new(i, 0.0)).await.unwrap();
        c.send(Token::new(i, 0.0)).await.unwrap();
    }
    let report = rt.shutdown().await.unwrap();
    assert_eq!(report.kernels, 3);
    assert_eq!(report.undelivered, 14, "{report:?}");
    for k in [&a, &b, &c] {
        assert_eq!(k.state(), LifecycleState::Terminated);
    }
    assert_eq!(a.metrics().processed, 50);
    for i in 0..50 {
        let t: Token = a.receive_timeout_as(T).await.unwrap();
        assert_eq!(t.id, i);
    }
    assert!(matches!(
        a.try_send(&Token::new(0, 0.0)),
        Err(Error::KernelTerminated(_))
    ));
    assert!(rt.metrics().kernels.is_empty());
    // A second shutdown has nothing left to do.
    assert_eq!(rt.shutdown().await.unwrap().kernels, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_names_are_unique_while_live() {
    let rt = runtime().await;
    let k = rt
        .launch(ECHO, LaunchOptions::default().with_name("dup"))
        .await
        .unwrap();
    let e = rt
        .launch(ECHO, LaunchOptions::default().with_name("dup"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(matches!(
        rt.launch(ECHO, LaunchOptions::default().with_name(""))
            .await,
        Err(Error::InvalidArgument(_))
    ));
    // The default instance name is the handler name; lookups find it by name.
    let e2 = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    assert_eq!(e2.name(), ECHO);
    assert_eq!(
        rt.kernel(&KernelTarget::Name(ECHO.into())).map(|h| h.id()),
        Some(e2.id())
    );
    k.terminate().await.unwrap();
    let again = rt
        .launch(ECHO, LaunchOptions::default().with_name("dup"))
        .await
        .unwrap();
    assert_ne!(again.id(), k.id(), "ids are never reused");
    let r: Token = again.call(Token::new(1, 1.0), T).await.unwrap();
    assert_eq!(r.value, 2.0);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_output_queue_applies_backpressure_without_loss() {
    let rt = runtime().await;
    let k = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_queue_capacity(64)
                .with_output_capacity(2),
        )
        .await
        .unwrap();
    for i in 0..40u64 {
        k.send(Token::new(i, 1.0)).await.unwrap();
    }
    // The worker is stuck on the full output queue; nothing is lost meanwhile.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(k.metrics().dropped, 0);
    for i in 0..40u64 {
        let t: Token = k.receive_timeout_as(T).await.unwrap();
        assert_eq!(t.id, i);
    }
    let m = settled(&k, 40).await;
    assert_eq!((m.processed, m.dropped), (40, 0));
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_with_nobody_reading_counts_dropped_replies() {
    let rt = runtime().await;
    let k = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_queue_capacity(64)
                .with_output_capacity(2),
        )
        .await
        .unwrap();
    for i in 0..10u64 {
        k.send(Token::new(i, 1.0)).await.unwrap();
    }
    let start = Instant::now();
    let report = k.terminate().await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "terminate hung on a full output queue"
    );
    let m = k.metrics();
    assert_eq!(report.replies_waiting, 2);
    assert_eq!(m.received, 10);
    assert_eq!(
        m.processed + m.dropped,
        10,
        "every message is either processed or counted as dropped: {m:?}"
    );
    assert_eq!(m.dropped, 8, "{m:?}");
    for i in 0..2u64 {
        let t: Token = k.receive_timeout_as(T).await.unwrap();
        assert_eq!(t.id, i);
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_drift_is_dropped_and_counted() {
    let rt = runtime().await;
    let k = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    let mut h = MessageHeader::new(Token::TYPE_ID, 72);
    h.message_id = 1;
    h.correlation_id = 1;
    // Ten minutes ahead of this machine's clock: beyond the default maximum drift.
    h.timestamp = HlcTimestamp::new(system_clock_ms() + 600_000, 0).packed();
    k.engine()
        .try_enqueue(&h, bytemuck::bytes_of(&Token::new(1, 1.0)))
        .unwrap();
    let r: Token = k.call(Token::new(2, 1.0), T).await.unwrap();
    assert_eq!(
        r.id, 2,
        "the kernel goes on after refusing a drifting timestamp"
    );
    let m = settled(&k, 2).await;
    assert_eq!((m.received, m.processed, m.dropped), (2, 1, 1));
    assert!(k.try_receive::<Token>().unwrap().is_none());
    rt.shutdown().await.unwrap();
}

/// A handler whose drop is observable (the worker thread drops it when it exits).
struct DropFlag(Arc<AtomicBool>);

impl CpuHandler for DropFlag {
    fn handle(&mut self, _ctx: &mut KernelContext<'_>, _msg: &Envelope) -> Result<()> {
        Ok(())
    }
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_runtime_stops_its_threads() {
    let dropped = Arc::new(AtomicBool::new(false));
    let reg = KernelRegistry::new();
    let flag = dropped.clone();
    reg.register_cpu("test.flag", move || Box::new(DropFlag(flag.clone())));
    let rt = CpuRuntime::with_registry(reg).await.unwrap();
    let k = rt
        .launch("test.flag", LaunchOptions::default())
        .await
        .unwrap();
    k.send(Token::new(1, 1.0)).await.unwrap();
    drop(k);
    drop(rt);
    let start = Instant::now();
    while !dropped.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the kernel thread outlived its runtime"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn probe_describes_the_cpu() {
    let s = ringkernel_cpu::probe().unwrap();
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(s.contains(&format!("{cores} logical cores")), "{s}");
    let rt = runtime().await;
    assert_eq!(rt.device_info(), s);
    assert_eq!(rt.backend(), ringkernel_core::BackendKind::Cpu);
}

/// Several OS threads send into one kernel at once (the MPSC input queue, the
/// `sleeping`/unpark hand-off and output backpressure under contention): every message
/// is answered exactly once and each sender's messages keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_senders_lose_nothing() {
    const THREADS: u64 = 4;
    const PER: u64 = 25_000;
    let rt = runtime().await;
    let k = rt
        .launch(ECHO, LaunchOptions::default().with_queue_capacity(256))
        .await
        .unwrap();
    let senders: Vec<_> = (0..THREADS)
        .map(|t| {
            let k = k.clone();
            std::thread::spawn(move || {
                for i in 0..PER {
                    let tok = Token::new((t << 32) | i, 1.0);
                    loop {
                        match k.try_send(&tok) {
                            Ok(_) => break,
                            Err(Error::QueueFull { .. }) => std::thread::yield_now(),
                            Err(e) => panic!("sender {t}: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    let mut next = [0u64; THREADS as usize];
    for _ in 0..THREADS * PER {
        let r: Token = k.receive_timeout_as(T).await.unwrap();
        let (t, i) = ((r.id >> 32) as usize, r.id & 0xFFFF_FFFF);
        assert_eq!(i, next[t], "sender {t}: reply {i} out of order");
        next[t] += 1;
    }
    for s in senders {
        s.join().unwrap();
    }
    assert!(next.iter().all(|&n| n == PER), "{next:?}");
    assert!(k.try_receive::<Token>().unwrap().is_none());
    let m = settled(&k, THREADS * PER).await;
    assert_eq!(
        (m.received, m.processed, m.dropped),
        (THREADS * PER, THREADS * PER, 0)
    );
    rt.shutdown().await.unwrap();
}

/// Senders racing with `terminate`: every send that returned `Ok` is answered (the
/// drain takes it), every later one is `KernelTerminated`; nothing is lost in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_racing_terminate_are_answered_or_refused() {
    const THREADS: u64 = 2;
    const PER: u64 = 20_000;
    let rt = runtime().await;
    let k = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_queue_capacity(256)
                .with_output_capacity(1 << 16),
        )
        .await
        .unwrap();
    let senders: Vec<_> = (0..THREADS)
        .map(|t| {
            let k = k.clone();
            std::thread::spawn(move || {
                let mut ok = 0u64;
                for i in 0..PER {
                    loop {
                        match k.try_send(&Token::new((t << 32) | i, 1.0)) {
                            Ok(_) => {
                                ok += 1;
                                break;
                            }
                            Err(Error::QueueFull { .. }) => std::thread::yield_now(),
                            Err(Error::KernelTerminated(_)) => return ok,
                            Err(e) => panic!("sender {t}: {e}"),
                        }
                    }
                }
                ok
            })
        })
        .collect();
    // Terminate mid-stream: once the kernel is under way (a fixed sleep was too long
    // once the kernel handled 40,000 echoes in under 5 ms).
    let start = std::time::Instant::now();
    while k.metrics().processed < 1_000 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the senders made no progress"
        );
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    let report = k.terminate().await.unwrap();
    let accepted: u64 = senders.into_iter().map(|s| s.join().unwrap()).sum();
    assert!(
        accepted < THREADS * PER,
        "terminate came after the senders had finished: no race exercised"
    );
    assert!(report.undelivered.is_empty());
    let mut answered = 0u64;
    while let Some(_t) = k.try_receive::<Token>().unwrap() {
        answered += 1;
    }
    let m = k.metrics();
    assert_eq!(
        answered, accepted,
        "accepted {accepted}, answered {answered}, {m:?}"
    );
    assert_eq!(
        (m.received, m.processed, m.dropped),
        (accepted, accepted, 0)
    );
    rt.shutdown().await.unwrap();
}
