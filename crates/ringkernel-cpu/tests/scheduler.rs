//! The M:N worker pool of the CPU runtime beyond the shared conformance suite (which
//! runs on it): backpressure between kernels sharing busy workers, blocked handlers,
//! fairness, wake-ups under contention, idle workers parked, dedicated threads.

use ringkernel_core::builtin::{Token, ECHO, STAGE};
use ringkernel_core::context::KernelContext;
use ringkernel_core::error::Result;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelHandle, RingKernelRuntime};
use ringkernel_cpu::CpuRuntime;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

async fn runtime(reg: KernelRegistry, workers: usize) -> CpuRuntime {
    CpuRuntime::with_registry(reg)
        .await
        .unwrap()
        .with_workers(workers)
        .unwrap()
}

/// Launches a 3-stage `rk.stage` chain with tiny input queues (downstream fills at once).
async fn chain(rt: &CpuRuntime, tag: &str) -> Vec<KernelHandle> {
    let mut v = Vec::new();
    for i in 0..3 {
        v.push(launch_stage(rt, &format!("{tag}.{i}"), stage_opts(2)).await);
    }
    v
}

/// Options of a chain's stage: `capacity` input slots, a large output queue.
fn stage_opts(capacity: usize) -> LaunchOptions {
    LaunchOptions::default()
        .with_queue_capacity(capacity)
        .with_output_capacity(4096)
}

async fn launch_stage(rt: &CpuRuntime, name: &str, opts: LaunchOptions) -> KernelHandle {
    rt.launch(STAGE, opts.with_name(name)).await.unwrap()
}

/// Pushes `n` tokens through `stages` and checks every one comes out of the last stage
/// once, in order.
async fn pump(stages: Vec<KernelHandle>, n: u64) {
    let route: Vec<_> = stages.iter().map(|k| k.id()).collect();
    let first = stages[0].clone();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            first
                .send(Token::routed(i, 0.0, &route).unwrap())
                .await
                .unwrap();
        }
    });
    for i in 0..n {
        let t: Token = stages[2].receive_timeout_as(T).await.unwrap();
        assert_eq!(t.id, i, "tokens of one sender keep their order");
        assert_eq!(t.value, 3.0);
    }
    sender.await.unwrap();
}

/// One worker, a stage whose downstream queue holds two messages: the stage's handler
/// spins on `QueueFull` (the built-in retries, never drops) while the downstream kernel
/// waits on the same, only, worker. A pool that only runs queued tasks on its fixed
/// workers deadlocks here; ours notices the blocked turn and adds a worker.
///
/// Deterministic: the first stage is only activated once eight tokens wait in its
/// queue, so its first turn sends two into the downstream queue and blocks on the
/// third before the downstream kernel (queued behind it on the one worker) can run,
/// however fast or slow the machine is. (Pumping tokens one at a time instead left it
/// to timing whether a turn ever held three, and on a loaded machine some runs never
/// blocked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2k_backpressure_on_a_single_busy_worker_does_not_deadlock() {
    const FIRST: u64 = 8;
    let rt = runtime(KernelRegistry::new(), 1).await;
    let stages = vec![
        launch_stage(
            &rt,
            "one.0",
            stage_opts(FIRST as usize).without_auto_activate(),
        )
        .await,
        launch_stage(&rt, "one.1", stage_opts(2)).await,
        launch_stage(&rt, "one.2", stage_opts(2)).await,
    ];
    let route: Vec<_> = stages.iter().map(|k| k.id()).collect();
    for i in 0..FIRST {
        stages[0]
            .send(Token::routed(i, 0.0, &route).unwrap())
            .await
            .unwrap();
    }
    assert_eq!(rt.scheduler_stats().extra_started, 0);
    stages[0].activate().await.unwrap();
    tokio::time::timeout(T, async {
        for i in 0..FIRST {
            let t: Token = stages[2].receive_timeout_as(T).await.unwrap();
            assert_eq!((t.id, t.value), (i, 3.0));
        }
    })
    .await
    .expect("the blocked stage deadlocked the pool");
    let stats = rt.scheduler_stats();
    assert!(
        stats.extra_started >= 1,
        "the blocked turn was not compensated: {stats:?}"
    );
    // And it keeps flowing with the host pumping more tokens through.
    tokio::time::timeout(T, pump(stages, 2_000)).await.unwrap();
    rt.shutdown().await.unwrap();
}

/// Every worker busy with a stage blocked on a full downstream queue, several chains at
/// once: all tokens still come through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2k_backpressure_with_every_worker_busy_does_not_deadlock() {
    let rt = runtime(KernelRegistry::new(), 2).await;
    let mut pumps = Vec::new();
    for c in 0..4 {
        let stages = chain(&rt, &format!("c{c}")).await;
        pumps.push(tokio::spawn(pump(stages, 1_000)));
    }
    tokio::time::timeout(T, async {
        for p in pumps {
            p.await.unwrap();
        }
    })
    .await
    .unwrap();
    rt.shutdown().await.unwrap();
    // The extra workers retire once idle.
    let start = Instant::now();
    while rt.scheduler_stats().threads > 2 {
        assert!(
            start.elapsed() < T,
            "extra workers stay: {:?}",
            rt.scheduler_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A handler that sleeps does not hold up other kernels, even with a single worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_handler_does_not_stall_the_others() {
    let reg = KernelRegistry::new();
    reg.register_fn(
        "test.sleepy",
        |_ctx: &mut KernelContext<'_>, t: Token| -> Result<Option<Token>> {
            std::thread::sleep(Duration::from_millis(1_000));
            Ok(Some(t))
        },
    );
    let (rt, waited) = echo_wait_behind(reg, "test.sleepy").await;
    assert!(
        // Without the extra worker it would wait ~980 ms; a loaded machine may delay
        // the monitor and the new thread, hence the loose bound.
        waited < Duration::from_millis(500),
        "the echo waited {waited:?} behind a sleeping handler"
    );
    rt.shutdown().await.unwrap();
}

/// On a one-worker pool: sends one token to kernel `slow` of `reg`, lets its handler
/// start, then calls an echo kernel queued behind it. Returns the runtime and how long
/// the call waited, after checking both replies.
async fn echo_wait_behind(reg: KernelRegistry, slow: &str) -> (CpuRuntime, Duration) {
    let rt = runtime(reg, 1).await;
    let slow = rt.launch(slow, LaunchOptions::default()).await.unwrap();
    let echo = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    slow.send(Token::new(1, 1.0)).await.unwrap();
    // Let the worker enter the slow handler.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t0 = Instant::now();
    let r: Token = echo.call(Token::new(2, 4.0), T).await.unwrap();
    let waited = t0.elapsed();
    assert_eq!(r.value, 8.0);
    let r: Token = slow.receive_timeout_as(T).await.unwrap();
    assert_eq!(r.id, 1);
    (rt, waited)
}

/// Registers `test.compute`: each message keeps its handler computing (runnable, not
/// blocked) for `ms` milliseconds of wall time.
fn compute_registry(ms: u64) -> KernelRegistry {
    let reg = KernelRegistry::new();
    reg.register_fn(
        "test.compute",
        move |_ctx: &mut KernelContext<'_>, t: Token| -> Result<Option<Token>> {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(ms) {
                std::hint::spin_loop();
            }
            Ok(Some(t))
        },
    );
    reg
}

/// A turn that computes for longer than the blocked-turn threshold (`STALL`, 4 ms) is
/// not taken for a blocked one: its thread is runnable, and another thread would only
/// compete with it for the core (on a machine with more threads than cores a
/// preempted worker looks the same). No extra worker starts; the echo waits its turn.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_computing_turn_is_not_taken_for_a_blocked_one() {
    let (rt, _) = echo_wait_behind(compute_registry(40), "test.compute").await;
    let stats = rt.scheduler_stats();
    assert_eq!(
        stats.extra_started, 0,
        "a 40 ms computing turn started an extra worker: {stats:?}"
    );
    rt.shutdown().await.unwrap();
}

/// A turn that computes for much longer (past `RUNNABLE_STALL`, 50 ms) while others
/// wait does get an extra worker: the echo is answered long before the turn ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_computing_turn_gets_an_extra_worker() {
    let (rt, waited) = echo_wait_behind(compute_registry(1_000), "test.compute").await;
    assert!(
        // Without the extra worker it would wait ~980 ms; a loaded machine delays the
        // monitor and the new thread, hence the loose bound.
        waited < Duration::from_millis(600),
        "the echo waited {waited:?} behind a computing turn"
    );
    assert!(rt.scheduler_stats().extra_started >= 1);
    rt.shutdown().await.unwrap();
}

/// A flooded kernel cannot starve another on the same (single) worker: a call to a
/// second kernel is answered while the flooded one still has most of its backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_kernel_does_not_starve_the_others() {
    const FLOOD: u64 = 16_000;
    let reg = KernelRegistry::new();
    reg.register_fn(
        "test.busy",
        |_ctx: &mut KernelContext<'_>, _t: Token| -> Result<Option<Token>> {
            // About 10 µs of work per message: the backlog takes ~160 ms.
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_micros(10) {
                std::hint::spin_loop();
            }
            Ok(None)
        },
    );
    let rt = runtime(reg, 1).await;
    let busy = rt
        .launch(
            "test.busy",
            LaunchOptions::default().with_queue_capacity(16_384),
        )
        .await
        .unwrap();
    let echo = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    for i in 0..FLOOD {
        busy.try_send(&Token::new(i, 0.0)).unwrap();
    }
    let t0 = Instant::now();
    for i in 0..5 {
        let r: Token = echo.call(Token::new(i, 1.0), T).await.unwrap();
        assert_eq!(r.id, i);
    }
    let waited = t0.elapsed();
    let done = busy.metrics().processed;
    assert!(
        done < FLOOD / 2,
        "5 calls took {waited:?}: the flooded kernel had handled {done} of {FLOOD} meanwhile"
    );
    rt.shutdown().await.unwrap();
    assert_eq!(busy.metrics().processed, FLOOD, "shutdown drains the flood");
}

/// Many host threads calling many kernels, with pauses long enough for the workers to
/// park in between: a lost wake-up would leave a call waiting for its timeout (the pool
/// has no timed safety net).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_wake_ups_under_contention() {
    const KERNELS: usize = 32;
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 60;
    let rt = runtime(KernelRegistry::new(), 2).await;
    let mut ks = Vec::new();
    for i in 0..KERNELS {
        let o = LaunchOptions::default().with_name(format!("w{i}"));
        ks.push(rt.launch(ECHO, o).await.unwrap());
    }
    let mut joins = Vec::new();
    for th in 0..THREADS {
        let ks = ks.clone();
        joins.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async {
                for round in 0..ROUNDS {
                    for (j, k) in ks.iter().enumerate() {
                        if !(j as u64 + th).is_multiple_of(3) {
                            continue;
                        }
                        let id = th << 40 | round << 20 | j as u64;
                        let r: Token = k
                            .call(Token::new(id, 1.0), Duration::from_secs(5))
                            .await
                            .expect("a call was not answered: lost wake-up?");
                        assert_eq!(r.id, id);
                    }
                    if round.is_multiple_of(4) {
                        // Let every worker park.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            });
        }));
    }
    for j in joins {
        j.join().unwrap();
    }
    rt.shutdown().await.unwrap();
}

/// Names and states of this process's threads (Linux `/proc`).
#[cfg(target_os = "linux")]
fn threads() -> Vec<(String, char)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "tid (comm) S ..."
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let state = stat[close + 2..].chars().next().unwrap_or('?');
        v.push((name, state));
    }
    v
}

/// Hundreds of kernels run on the pool's few threads; a kernel that asks for a
/// dedicated thread gets one; once idle, every worker sleeps (no CPU spent).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernels_share_workers_and_idle_workers_sleep() {
    let rt = runtime(KernelRegistry::new(), 2).await;
    let before = threads().len();
    let mut ks = Vec::new();
    for i in 0..500 {
        let k = rt
            .launch(
                ECHO,
                LaunchOptions::default()
                    .with_queue_capacity(4)
                    .with_name(format!("e{i}")),
            )
            .await
            .unwrap();
        ks.push(k);
    }
    for (i, k) in ks.iter().enumerate() {
        let r: Token = k.call(Token::new(i as u64, 1.0), T).await.unwrap();
        assert_eq!(r.id, i as u64);
    }
    // Other tests of this binary start threads meanwhile: a loose bound, far below the
    // 500 a thread per kernel would add.
    let grown = threads().len().saturating_sub(before);
    assert!(grown < 100, "500 pooled kernels added {grown} threads");
    let ded = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_dedicated_thread()
                .with_name("dedicated"),
        )
        .await
        .unwrap();
    let r: Token = ded.call(Token::new(7, 2.0), T).await.unwrap();
    assert_eq!(r.value, 4.0);
    assert!(
        threads().iter().any(|(n, _)| n == "rk-dedicated"),
        "no thread of its own for the dedicated kernel: {:?}",
        threads()
    );
    // Idle: after their spin, the workers park.
    let start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let workers: Vec<_> = threads()
            .into_iter()
            .filter(|(n, _)| n.starts_with("rk-worker") || n == "rk-monitor")
            .collect();
        assert!(!workers.is_empty());
        if workers.iter().all(|(_, s)| *s == 'S') {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "idle workers keep running: {workers:?}"
        );
    }
    let report = rt.shutdown().await.unwrap();
    assert_eq!(report.kernels, 501);
    // Terminated kernels' threads exit right after (they are not joined).
    let start = Instant::now();
    while threads().iter().any(|(n, _)| n == "rk-dedicated") {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the dedicated thread outlived its kernel"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A dedicated kernel keeps today's behaviour next to pooled ones: K2K both ways, and
/// termination drains it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedicated_and_pooled_kernels_talk_both_ways() {
    let rt = runtime(KernelRegistry::new(), 1).await;
    let a = rt.launch(STAGE, LaunchOptions::default()).await.unwrap();
    let b = rt
        .launch(
            STAGE,
            LaunchOptions::default()
                .with_dedicated_thread()
                .with_name("ded.stage"),
        )
        .await
        .unwrap();
    let c = rt
        .launch(STAGE, LaunchOptions::default().with_name("pooled.last"))
        .await
        .unwrap();
    let route = [a.id(), b.id(), c.id()];
    for i in 0..200 {
        a.send(Token::routed(i, 0.0, &route).unwrap())
            .await
            .unwrap();
    }
    for i in 0..200 {
        let t: Token = c.receive_timeout_as(T).await.unwrap();
        assert_eq!((t.id, t.value), (i, 3.0));
    }
    b.send(Token::new(9, 1.0)).await.unwrap();
    b.terminate().await.unwrap();
    assert_eq!(
        b.metrics().processed,
        201,
        "the last message is handled or drained"
    );
    rt.shutdown().await.unwrap();
}

/// The worker count is checked, and fixed once the pool runs.
#[tokio::test(flavor = "current_thread")]
async fn worker_count_is_validated() {
    let rt = CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap();
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(rt.scheduler_stats().workers, cores);
    assert_eq!(rt.scheduler_stats().threads, 0, "the pool starts on demand");
    assert!(CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap()
        .with_workers(0)
        .is_err());
    let rt = rt.with_workers(1).unwrap();
    let k = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    let _: Token = k.call(Token::new(1, 1.0), T).await.unwrap();
    assert_eq!(rt.scheduler_stats().threads, 1);
    assert!(rt.with_workers(2).is_err(), "the pool already runs");
}

/// A handler that panics on every message shares the only worker with an echo kernel:
/// the panics stay with their kernel (counted as dropped) and the echo keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_kernel_does_not_take_down_its_worker() {
    let reg = KernelRegistry::new();
    reg.register_fn(
        "test.panics",
        |_ctx: &mut KernelContext<'_>, t: Token| -> Result<Option<Token>> {
            if t.id < u64::MAX {
                panic!("handler panic for token {}", t.id);
            }
            Ok(Some(t))
        },
    );
    let rt = runtime(reg, 1).await;
    let bad = rt
        .launch("test.panics", LaunchOptions::default())
        .await
        .unwrap();
    let echo = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    for i in 0..20 {
        bad.send(Token::new(i, 1.0)).await.unwrap();
        let r: Token = echo.call(Token::new(i, 2.0), T).await.unwrap();
        assert_eq!((r.id, r.value), (i, 4.0));
    }
    let start = Instant::now();
    while bad.metrics().dropped < 20 {
        assert!(start.elapsed() < T, "panicking kernel: {:?}", bad.metrics());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // On a loaded machine the monitor may have taken a preempted turn for a blocked one
    // and started an extra worker; extras retire after `RETIRE_AFTER` idle. What must
    // remain is the pool's own worker.
    let start = Instant::now();
    while rt.scheduler_stats().threads != 1 {
        let s = rt.scheduler_stats();
        assert!(
            s.threads > 1 && start.elapsed() < T,
            "the worker survived: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rt.shutdown().await.unwrap();
}

/// A pooled kernel whose output queue is full does not hold its worker: with one
/// worker, an echo kernel whose four output slots nobody drains leaves that worker to
/// the other kernels (no extra worker is started), and once its receiver drains the
/// queue it goes on where it stopped, every reply kept, in order. A design that waits
/// for room inside the turn blocks the only worker until the monitor adds a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_output_queue_does_not_hold_a_worker() {
    let rt = runtime(KernelRegistry::new(), 1).await;
    let stuck = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_queue_capacity(1024)
                .with_output_capacity(4)
                .with_name("full.out"),
        )
        .await
        .unwrap();
    let other = rt
        .launch(ECHO, LaunchOptions::default().with_name("other"))
        .await
        .unwrap();
    const N: u64 = 1000;
    for i in 0..N {
        stuck.send(Token::new(i, 1.0)).await.unwrap();
    }
    let before = rt.scheduler_stats();
    for i in 0..50 {
        let r: Token = other.call(Token::new(i, 3.0), T).await.unwrap();
        assert_eq!((r.id, r.value), (i, 6.0));
    }
    // Longer than the monitor's `STALL`: a blocked turn would have been noticed.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let m = stuck.metrics();
    assert!(
        m.processed <= 4,
        "only the four replies that fit were made: {m:?}"
    );
    let after = rt.scheduler_stats();
    assert_eq!(after.extra_started, 0, "no worker was blocked: {after:?}");
    assert!(
        after.turns > before.turns,
        "the other kernel ran: {after:?}"
    );
    for i in 0..N {
        let r: Token = stuck.receive_timeout_as(T).await.unwrap();
        assert_eq!((r.id, r.value), (i, 2.0), "replies in order, none lost");
    }
    assert_eq!(stuck.metrics().dropped, 0);
    assert_eq!(rt.scheduler_stats().extra_started, 0);
    rt.shutdown().await.unwrap();
}

/// A pooled handler sees its request stamped with the time merged into the kernel's
/// clock (`request_timestamp`, and the header's own timestamp), not the sender's: the
/// worker stamps the context in place (`KernelContext::set_request_timestamp`). The
/// handler reports what it saw; a handler returning an error still counts as dropped
/// (the worker takes the handler's error inside its unwinding guard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_see_the_merged_request_timestamp_and_their_errors_count() {
    let reg = KernelRegistry::new();
    reg.register_fn(
        "test.stamps",
        |ctx: &mut KernelContext<'_>, mut t: Token| -> Result<Option<Token>> {
            if t.id % 2 == 1 {
                return Err(ringkernel_core::error::Error::invalid("odd token refused"));
            }
            t.stamps = [
                ctx.request_timestamp().packed(),
                ctx.request().timestamp,
                ctx.clock().peek().packed(),
                0,
            ];
            Ok(Some(t))
        },
    );
    let rt = runtime(reg, 1).await;
    let k = rt
        .launch("test.stamps", LaunchOptions::default())
        .await
        .unwrap();
    for i in 0..40u64 {
        let before = rt.core().hlc().tick().packed();
        k.send(Token::new(i, 0.0)).await.unwrap();
        if i % 2 == 1 {
            continue;
        }
        let r: Token = k.receive_timeout_as(T).await.unwrap();
        assert_eq!(r.id, i);
        let [seen, header, clock, _] = r.stamps;
        assert_eq!(seen, header, "request_timestamp and the header agree");
        assert_eq!(
            seen, clock,
            "the request carries the merged time: the clock's"
        );
        // The sender's stamp is later than `before`; the merge is later still.
        assert!(
            seen > before + 1,
            "merged {seen} not after the send at {before}"
        );
    }
    let start = Instant::now();
    while k.metrics().dropped < 20 {
        assert!(start.elapsed() < T, "errors counted: {:?}", k.metrics());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(k.metrics().processed, 20);
    rt.shutdown().await.unwrap();
}
