//! The Metal runtime's host side (queues in shared memory, drain scheduling,
//! completion handling, lifecycle, K2K routing) run on Linux against the CPU stand-in
//! for the GPU in `tests/common` (the drain template's protocol).

use ringkernel_core::builtin::Token;
use ringkernel_core::control::ControlBlock;
use ringkernel_core::hlc::HlcTimestamp;
use ringkernel_core::lifecycle::LifecycleState;
use ringkernel_core::message::{MessageHeader, RingMessage};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelEngine, KernelHandle, RuntimeCore};
use ringkernel_core::{BackendKind, Error};
use ringkernel_drain::engine::{DrainConfig, DrainEngine, DrainTarget};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{CpuTarget, Handler};

/// Terminates `k`, checks that nothing was left undelivered and returns the report.
async fn terminate_clean(k: &KernelHandle) -> ringkernel_core::runtime::TerminateReport {
    let r = k.terminate().await.unwrap();
    assert!(r.undelivered.is_empty());
    r
}

fn launch(
    core: &Arc<RuntimeCore>,
    name: &str,
    handler: Handler,
    opts: LaunchOptions,
) -> (KernelHandle, Arc<DrainEngine<CpuTarget>>) {
    launch_overlapped(core, name, handler, opts, 1)
}

/// `launch` with a stand-in that allows `in_flight` passes at once.
fn launch_overlapped(
    core: &Arc<RuntimeCore>,
    name: &str,
    handler: Handler,
    opts: LaunchOptions,
    in_flight: usize,
) -> (KernelHandle, Arc<DrainEngine<CpuTarget>>) {
    launch_with(core, name, handler, opts, in_flight, Staging::Ring)
}

/// Where the engine writes a pass's requests (see `CpuTarget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Staging {
    /// Into the input ring.
    Ring,
    /// Into a staging buffer, in slots (`DrainTarget::stage_input`).
    Slots,
    /// Into a compact pass's buffer (`DrainTarget::stage_compact`).
    Compact,
}

const STAGINGS: [Staging; 3] = [Staging::Ring, Staging::Slots, Staging::Compact];

/// `launch_with`, with [`DrainConfig::sender_fills`] set.
fn launch_sender_fills(
    core: &Arc<RuntimeCore>,
    opts: LaunchOptions,
    stage: Staging,
) -> (KernelHandle, Arc<DrainEngine<CpuTarget>>) {
    launch_config(core, "echo", Handler::Echo, opts, 3, stage, true)
}

/// `launch_overlapped`, with the pass's requests written as `stage` says.
fn launch_with(
    core: &Arc<RuntimeCore>,
    name: &str,
    handler: Handler,
    opts: LaunchOptions,
    in_flight: usize,
    stage: Staging,
) -> (KernelHandle, Arc<DrainEngine<CpuTarget>>) {
    launch_config(core, name, handler, opts, in_flight, stage, false)
}

fn launch_config(
    core: &Arc<RuntimeCore>,
    name: &str,
    handler: Handler,
    opts: LaunchOptions,
    in_flight: usize,
    stage: Staging,
    sender_fills: bool,
) -> (KernelHandle, Arc<DrainEngine<CpuTarget>>) {
    let id = core.reserve(name).unwrap();
    let mut target = CpuTarget::new(opts.queue_capacity, opts.slot_size, handler);
    target.in_flight = in_flight;
    target.stage = stage == Staging::Slots;
    target.compact = stage == Staging::Compact;
    let cfg = DrainConfig {
        id,
        name: name.into(),
        capacity: opts.queue_capacity,
        output_capacity: opts.output_capacity,
        slot_size: opts.slot_size,
        serial: false,
        state_words: 4,
        priority: opts.priority,
        inputs: Vec::new(),
        sender_fills,
    };
    let engine = DrainEngine::new(cfg, target, core).unwrap();
    core.insert(engine.clone());
    if opts.auto_activate {
        engine.activate().unwrap();
    }
    (core.handle(engine.clone(), &opts), engine)
}

fn core() -> Arc<RuntimeCore> {
    RuntimeCore::new(BackendKind::Metal, KernelRegistry::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_round_trip_and_control_block() {
    let core = core();
    let (k, engine) = launch(
        &core,
        "echo",
        Handler::Echo,
        LaunchOptions::default().with_queue_capacity(16),
    );
    let r: Token = k
        .call(Token::new(5, 21.0), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((r.id, r.value, r.hops), (5, 42.0, 1));
    // The stand-in advanced the worker line the way the drain template does.
    // SAFETY: the target's control block is 128 readable bytes (DrainTarget contract),
    // the pass has completed (its reply arrived), and the read is unaligned.
    let cb: ControlBlock = unsafe { std::ptr::read_unaligned(engine.target().control().cast()) };
    assert_eq!((cb.input_head, cb.output_tail, cb.processed), (1, 1, 1));
    assert_eq!(cb.kernel_id, k.id().0);
    assert_eq!(cb.input_tail, 1, "host line carries the producer index");
    assert_eq!(cb.state, LifecycleState::Active as u32);
    let m = k.metrics();
    assert_eq!(
        (m.received, m.processed, m.emitted, m.dropped),
        (1, 1, 1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_messages_through_a_small_ring_in_order() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(8);
    let (k, engine) = launch(&core, "echo", Handler::Echo, opts);
    let n = 500u64;
    let sender = {
        let k = k.clone();
        tokio::spawn(async move {
            for i in 0..n {
                k.send(Token::new(i, i as f64)).await.unwrap();
            }
        })
    };
    for i in 0..n {
        let t: Token = k.receive_timeout_as(Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            (t.id, t.value),
            (i, 2.0 * i as f64),
            "replies arrive in order, none lost"
        );
    }
    sender.await.unwrap();
    let passes = engine.target().passes.load(Ordering::SeqCst);
    assert!(
        passes < n,
        "messages were batched into passes ({passes} passes for {n} messages)"
    );
    terminate_clean(&k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapped_passes_finish_in_launch_order() {
    let core = core();
    // A ring of 512 slots: while a pass runs, another starts once 256 messages wait.
    let opts = LaunchOptions::default().with_queue_capacity(512);
    let (k, engine) = launch_overlapped(&core, "counter", Handler::Counter, opts, 3);
    let n = 6000u64;
    // With the passes held, the first send starts a pass and the 128 after it (a
    // quarter of the ring) a second one, while the first is still in flight.
    let target = engine.target();
    target.hold.store(true, Ordering::SeqCst);
    let first = 400;
    for i in 0..first {
        k.send(Token::new(i, 0.0)).await.unwrap();
    }
    assert!(
        target.running.load(Ordering::SeqCst) >= 2,
        "a second pass started while the first was in flight"
    );
    target.hold.store(false, Ordering::SeqCst);
    let sender = {
        let k = k.clone();
        tokio::spawn(async move {
            for i in first..n {
                k.send(Token::new(i, 0.0)).await.unwrap();
            }
        })
    };
    for i in 0..n {
        let t: Token = k.receive_timeout_as(Duration::from_secs(10)).await.unwrap();
        // The counter's state sees the messages in order, and the replies come back
        // in that order although every third pass reports its completion late.
        assert_eq!((t.id, t.value), (i, (i + 1) as f64), "reply {i}");
    }
    sender.await.unwrap();
    assert!(target.most_running.load(Ordering::SeqCst) <= 3);
    let m = k.metrics();
    assert_eq!(
        (m.received, m.processed, m.emitted, m.dropped),
        (n, n, n, 0)
    );
    assert_eq!(m.latency.count, n, "one latency sample per message");
    terminate_clean(&k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivated_kernels_keep_and_return_messages() {
    let core = core();
    let opts = LaunchOptions::default()
        .with_queue_capacity(4)
        .with_auto_activate(false)
        .with_wait_when_full(false);
    let (k, engine) = launch(&core, "echo", Handler::Echo, opts);
    assert_eq!(k.state(), LifecycleState::Launched);
    for i in 0..4 {
        k.send(Token::new(i, 1.0)).await.unwrap();
    }
    assert!(matches!(
        k.send(Token::new(9, 1.0)).await,
        Err(Error::QueueFull { capacity: 4 })
    ));
    assert_eq!(
        engine.target().passes.load(Ordering::SeqCst),
        0,
        "nothing runs before activation"
    );
    assert!(k.try_receive::<Token>().unwrap().is_none());
    // Invalid transition is an error, not a panic.
    assert!(matches!(
        k.deactivate().await,
        Err(Error::InvalidState { .. })
    ));
    let r = k.terminate().await.unwrap();
    let ids: Vec<u64> = r
        .undelivered
        .iter()
        .map(|e| e.decode::<Token>().unwrap().id)
        .collect();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    assert_eq!(r.drained, 0);
    assert!(matches!(
        k.send(Token::new(1, 1.0)).await,
        Err(Error::KernelTerminated(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_waiting_in_an_inactive_kernel_comes_back_whole() {
    // A batch waits as a run (one header); handed back, each message has its own.
    let core = core();
    let opts = LaunchOptions::default()
        .with_queue_capacity(64)
        .with_auto_activate(false);
    let (k, _) = launch(&core, "echo", Handler::Echo, opts);
    let batch: Vec<Token> = (0..40).map(|i| Token::new(i, i as f64)).collect();
    let sent = k.send_batch(&batch).await.unwrap();
    let r = k.terminate().await.unwrap();
    assert_eq!(r.undelivered.len(), 40);
    for (i, (env, id)) in r.undelivered.iter().zip(sent).enumerate() {
        assert!(env.header.is_valid(), "message {i}");
        assert_eq!((env.header.message_id, env.header.correlation_id), (id, id));
        assert_eq!(env.decode::<Token>().unwrap(), batch[i]);
    }
    assert!(r
        .undelivered
        .windows(2)
        .all(|w| w[1].header.hlc() > w[0].header.hlc()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_drains_an_active_kernel() {
    let core = core();
    let (k, _e) = launch(
        &core,
        "echo",
        Handler::Echo,
        LaunchOptions::default().with_queue_capacity(64),
    );
    k.deactivate().await.unwrap();
    for i in 0..20 {
        k.send(Token::new(i, 1.0)).await.unwrap();
    }
    k.activate().await.unwrap();
    let r = terminate_clean(&k).await;
    assert!(r.drained <= 20);
    assert_eq!(k.metrics().processed, 20);
    // Replies produced by the drain can still be received after termination.
    let mut got = 0;
    while let Some(t) = k.try_receive::<Token>().unwrap() {
        assert_eq!(t.value, 2.0);
        got += 1;
    }
    assert_eq!(got, 20);
    assert_eq!(k.state(), LifecycleState::Terminated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2k_pipeline_routes_between_passes() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(16);
    let (a, _) = launch(&core, "a", Handler::Stage, opts.clone());
    let (b, _) = launch(&core, "b", Handler::Stage, opts.clone());
    let (c, _) = launch(&core, "c", Handler::Stage, opts);
    let route = [a.id(), b.id(), c.id()];
    for i in 0..10 {
        a.send(Token::routed(i, 0.0, &route).unwrap())
            .await
            .unwrap();
    }
    for _ in 0..10 {
        let t: Token = c.receive_timeout_as(Duration::from_secs(5)).await.unwrap();
        assert_eq!((t.value, t.hops), (3.0, 3));
    }
    assert_eq!(a.metrics().emitted, 10);
    assert_eq!(a.output_depth_for_test(), 0);
}

trait Depth {
    fn output_depth_for_test(&self) -> usize;
}
impl Depth for KernelHandle {
    fn output_depth_for_test(&self) -> usize {
        self.engine().output_depth()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_wrong_types_and_oversize_are_reported() {
    let core = core();
    let (k, _) = launch(
        &core,
        "refuse",
        Handler::Refuse,
        LaunchOptions::default().with_queue_capacity(8),
    );
    k.send(Token::new(1, 1.0)).await.unwrap();
    assert!(matches!(
        k.receive_timeout_as::<Token>(Duration::from_millis(300))
            .await,
        Err(Error::Timeout(_))
    ));
    assert_eq!(k.metrics().dropped, 1);
    assert_eq!(
        k.metrics().processed,
        0,
        "a refused message is not processed"
    );

    let (e, _) = launch(
        &core,
        "echo",
        Handler::Echo,
        LaunchOptions::default().with_queue_capacity(8),
    );
    e.send_envelope(&ringkernel_core::message::Envelope::from_bytes(
        99, &[0u8; 72],
    ))
    .await
    .unwrap();
    let r: Token = e
        .call(Token::new(2, 1.0), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(r.value, 2.0);
    assert_eq!(
        e.metrics().dropped,
        1,
        "the wrong-type message was refused by the handler"
    );
    let big = vec![0u8; 256];
    let err = e
        .send_envelope(&ringkernel_core::message::Envelope::from_bytes(1, &big))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::MessageTooLarge {
                size: 256,
                max: 192
            }
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_launch_is_reported_not_hung() {
    let core = core();
    let opts = LaunchOptions::default()
        .with_queue_capacity(8)
        .with_auto_activate(false);
    let (k, engine) = launch(&core, "echo", Handler::Echo, opts);
    engine.target().fail_launch.store(true, Ordering::SeqCst);
    k.send(Token::new(1, 1.0)).await.unwrap();
    k.activate().await.unwrap();
    let err = k
        .receive_timeout_as::<Token>(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Device(_)), "{err}");
    assert!(matches!(
        k.send(Token::new(2, 1.0)).await,
        Err(Error::Device(_))
    ));
    assert!(k.terminate().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_after_deactivate_accounts_for_every_message() {
    for round in 0..20 {
        let core = core();
        let (k, _) = launch(
            &core,
            "echo",
            Handler::Echo,
            LaunchOptions::default().with_queue_capacity(64),
        );
        for i in 0..16 {
            k.send(Token::new(i, 1.0)).await.unwrap();
        }
        // A pass may be running right now; deactivation lets it finish.
        k.deactivate().await.unwrap();
        for i in 16..32 {
            k.send(Token::new(i, 1.0)).await.unwrap();
        }
        let r = k.terminate().await.unwrap();
        let mut ids: Vec<u64> = r
            .undelivered
            .iter()
            .map(|e| e.decode::<Token>().unwrap().id)
            .collect();
        while let Some(t) = k.try_receive::<Token>().unwrap() {
            ids.push(t.id);
        }
        ids.sort();
        assert_eq!(
            ids,
            (0..32).collect::<Vec<_>>(),
            "round {round}: every message processed or returned, once"
        );
        assert!(r.undelivered.len() >= 16, "round {round}: nothing sent after deactivation ran: {} undelivered, drained {}, ids {:?}", r.undelivered.len(), r.drained, r.undelivered.iter().map(|e| e.decode::<Token>().unwrap().id).collect::<Vec<_>>());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2k_to_a_full_destination_waits_and_keeps_order() {
    let core = core();
    let (a, _) = launch(
        &core,
        "a",
        Handler::Stage,
        LaunchOptions::default().with_queue_capacity(64),
    );
    let small = LaunchOptions::default()
        .with_queue_capacity(4)
        .with_auto_activate(false);
    let (b, _) = launch(&core, "b", Handler::Stage, small);
    let route = [a.id(), b.id()];
    for i in 0..40 {
        a.send(Token::routed(i, 0.0, &route).unwrap())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // B is not active: its 4 slots fill, the rest waits at A (nothing dropped).
    assert_eq!(b.metrics().received, 4);
    assert_eq!(a.metrics().dropped, 0);
    b.activate().await.unwrap();
    for i in 0..40 {
        let t: Token = b.receive_timeout_as(Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            (t.id, t.hops, t.value),
            (i, 2, 2.0),
            "K2K kept its order through the backlog"
        );
    }
    assert_eq!(a.metrics().emitted, 40);
}

#[test]
fn a_target_too_small_for_the_rings_is_refused() {
    let core = core();
    let cfg = |capacity, slot_size| DrainConfig {
        id: ringkernel_core::runtime::KernelId(7),
        name: "small".into(),
        capacity,
        output_capacity: capacity,
        slot_size,
        serial: false,
        state_words: 4,
        priority: ringkernel_core::priority::NORMAL,
        inputs: Vec::new(),
        sender_fills: false,
    };
    let e =
        DrainEngine::new(cfg(8, 256), CpuTarget::new(4, 256, Handler::Echo), &core).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e =
        DrainEngine::new(cfg(4, 100), CpuTarget::new(4, 256, Handler::Echo), &core).unwrap_err();
    assert!(e.to_string().contains("slot_size"), "{e}");
    let e =
        DrainEngine::new(cfg(3, 256), CpuTarget::new(4, 256, Handler::Echo), &core).unwrap_err();
    assert!(e.to_string().contains("power of two"), "{e}");
    assert!(DrainEngine::new(cfg(4, 256), CpuTarget::new(4, 256, Handler::Echo), &core).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_each_message_once_with_a_latency_sample() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(64);
    let k = launch(&core, "echo", Handler::Echo, opts).0;
    let replies = k.call_many((0..50).map(|i| Token::new(i, 1.0))).await;
    assert_eq!(replies, 50);
    let m = k.metrics();
    assert_eq!(
        (m.received, m.processed, m.dropped, m.emitted),
        (50, 50, 0, 50)
    );
    assert_eq!(
        m.latency.count, 50,
        "one handler latency sample per message"
    );

    // Refused: dropped, not processed; it still reached the handler (a sample).
    let (r, _) = launch(
        &core,
        "refuse",
        Handler::Refuse,
        LaunchOptions::default().with_queue_capacity(8),
    );
    for i in 0..3 {
        r.send(Token::new(i, 1.0)).await.unwrap();
    }
    let r2 = r.clone();
    wait_until(move || r2.metrics().dropped == 3).await;
    let m = r.metrics();
    assert_eq!(
        (m.received, m.processed, m.dropped, m.emitted),
        (3, 0, 3, 0)
    );
    assert_eq!(m.latency.count, 3);
}

async fn wait_until(cond: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "condition not reached"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_too_far_ahead_of_the_clock_is_dropped_before_the_handler() {
    for stage in STAGINGS {
        request_too_far_ahead_is_dropped(stage).await;
    }
}

async fn request_too_far_ahead_is_dropped(stage: Staging) {
    let core = core();
    let (k, engine) = launch_with(
        &core,
        "echo",
        Handler::Echo,
        LaunchOptions::default().with_queue_capacity(8),
        1,
        stage,
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut h = MessageHeader::new(Token::TYPE_ID, 72);
    h.timestamp = HlcTimestamp::new(now_ms + 3_600_000, 0).as_u64();
    engine
        .try_enqueue(&h, bytemuck::bytes_of(&Token::new(1, 1.0)))
        .unwrap();
    let r: Token = k
        .call(Token::new(2, 4.0), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(r.value, 8.0, "the kernel goes on");
    let m = k.metrics();
    assert_eq!((m.received, m.processed, m.dropped), (2, 1, 1));
    assert_eq!(
        m.latency.count, 1,
        "the refused request never reached the handler"
    );
    assert!(
        k.try_receive::<Token>().unwrap().is_none(),
        "no reply for it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2k_to_a_terminated_kernel_is_dropped_not_processed() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(16);
    let (a, _) = launch(&core, "a", Handler::Stage, opts.clone());
    let (b, _) = launch(&core, "b", Handler::Stage, opts);
    let route = [a.id().0, b.id().0];
    b.terminate().await.unwrap();
    for i in 0..5 {
        let mut t = Token::new(i, 0.0);
        t.route[..2].copy_from_slice(&route);
        t.route_len = 2;
        a.send(t).await.unwrap();
    }
    let a2 = a.clone();
    wait_until(move || a2.metrics().dropped == 5).await;
    let m = a.metrics();
    assert_eq!(
        (m.received, m.processed, m.dropped, m.emitted),
        (5, 0, 5, 0)
    );
}

/// Sends `msgs` and receives as many replies; returns how many came back.
trait CallMany {
    async fn call_many(&self, msgs: impl Iterator<Item = Token>) -> usize;
}
impl CallMany for KernelHandle {
    async fn call_many(&self, msgs: impl Iterator<Item = Token>) -> usize {
        let mut n = 0;
        for m in msgs {
            self.send(m).await.unwrap();
            n += 1;
        }
        for _ in 0..n {
            let _: Token = self
                .receive_timeout_as(Duration::from_secs(5))
                .await
                .unwrap();
        }
        n
    }
}

/// Priority ordering happens where the host fills the input ring for a pass: waiting
/// messages go in highest lane first, FIFO within a lane, across as many passes as the
/// ring needs, so a serial handler sees them (and the replies leave) in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_take_the_highest_lanes_first() {
    use ringkernel_core::priority;
    let core = core();
    let opts = LaunchOptions::default()
        .with_queue_capacity(4)
        .with_output_capacity(64)
        .with_wait_when_full(false)
        .without_auto_activate();
    let (k, engine) = launch(&core, "counter", Handler::Counter, opts);
    for i in 0..4 {
        k.send_with_priority(Token::new(i, 1.0), priority::LOW)
            .await
            .unwrap();
    }
    // The LOW lane is full; the others are not.
    assert!(matches!(
        k.send_with_priority(Token::new(9, 1.0), priority::LOW)
            .await,
        Err(Error::QueueFull { capacity: 4 })
    ));
    for i in 100..103 {
        k.send_with_priority(Token::new(i, 1.0), priority::HIGH)
            .await
            .unwrap();
    }
    k.send_with_priority(Token::new(200, 1.0), priority::CRITICAL)
        .await
        .unwrap();
    assert_eq!(k.metrics().queue_depth, 8, "every lane counts in the depth");
    k.activate().await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..8 {
        let t: Token = k.receive_timeout_as(Duration::from_secs(10)).await.unwrap();
        seen.push((t.id, t.value));
    }
    // The counter's value is the order the handler saw the messages in.
    assert_eq!(
        seen,
        vec![
            (200, 1.0),
            (100, 2.0),
            (101, 3.0),
            (102, 4.0),
            (0, 5.0),
            (1, 6.0),
            (2, 7.0),
            (3, 8.0)
        ]
    );
    // A ring of 4 slots: the CRITICAL and HIGH messages in one pass, the LOW in the next.
    assert_eq!(engine.target().passes.load(Ordering::SeqCst), 2);
    assert_eq!(k.metrics().queue_depth, 0);
    k.terminate().await.unwrap();
}

/// Outputs carry the kernel's priority, whatever the request's was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_carry_the_kernels_priority() {
    use ringkernel_core::priority;
    let core = core();
    let opts = LaunchOptions::default().with_priority(priority::CRITICAL);
    let (k, _) = launch(&core, "echo", Handler::Echo, opts);
    k.send_with_priority(Token::new(1, 1.0), priority::LOW)
        .await
        .unwrap();
    let env = k
        .receive_envelope(Some(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(env.header.priority(), priority::CRITICAL);
    assert_eq!(env.decode::<Token>().unwrap().value, 2.0);
    k.terminate().await.unwrap();
}

/// Messages that arrive while a pass runs wait for the next one, and there a HIGH
/// message goes before the LOW ones that arrived earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_message_overtakes_lows_waiting_behind_a_running_pass() {
    use ringkernel_core::priority;
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(16);
    let (k, engine) = launch(&core, "counter", Handler::Counter, opts);
    engine.target().hold.store(true, Ordering::SeqCst);
    k.send(Token::new(1, 0.0)).await.unwrap();
    assert_eq!(engine.target().passes.load(Ordering::SeqCst), 1);
    for i in 10..13 {
        k.send_with_priority(Token::new(i, 0.0), priority::LOW)
            .await
            .unwrap();
    }
    k.send_with_priority(Token::new(99, 0.0), priority::HIGH)
        .await
        .unwrap();
    assert_eq!(
        engine.target().passes.load(Ordering::SeqCst),
        1,
        "no second pass while one runs"
    );
    engine.target().hold.store(false, Ordering::SeqCst);
    let mut seen = Vec::new();
    for _ in 0..5 {
        let t: Token = k.receive_timeout_as(Duration::from_secs(10)).await.unwrap();
        seen.push((t.id, t.value));
    }
    assert_eq!(
        seen,
        vec![(1, 1.0), (99, 2.0), (10, 3.0), (11, 4.0), (12, 5.0)]
    );
    assert_eq!(engine.target().passes.load(Ordering::SeqCst), 2);
    k.terminate().await.unwrap();
}

/// Sends `n` tokens with `send_batch` in batches of `batch`, takes the replies with
/// `receive_batch`, and checks ids, order and values.
async fn batched_echo(k: &KernelHandle, n: u64, batch: u64) {
    let sender = {
        let k = k.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut next = 0;
            while next < n {
                let end = (next + batch).min(n);
                let msgs: Vec<Token> = (next..end).map(|i| Token::new(i, i as f64)).collect();
                let r = k.send_batch(&msgs).await.unwrap();
                assert_eq!(r.end - r.start, end - next, "one id per message");
                ids.extend(r);
                next = end;
            }
            ids
        })
    };
    let mut got = Vec::new();
    while (got.len() as u64) < n {
        let max = 37.min(n as usize - got.len());
        let envs = k
            .receive_batch(max, Some(Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(!envs.is_empty() && envs.len() <= max);
        got.extend(envs);
    }
    let ids = sender.await.unwrap();
    assert!(ids.windows(2).all(|w| w[1] > w[0]), "ids increase");
    for (i, env) in got.iter().enumerate() {
        let t: Token = env.decode().unwrap();
        assert_eq!(
            (t.id, t.value),
            (i as u64, 2.0 * i as f64),
            "reply {i} in order"
        );
        assert_eq!(
            env.header.correlation_id, ids[i],
            "reply {i} answers request {i}"
        );
    }
    // Timestamps of a batch are distinct and increasing, like one-by-one sends.
    assert!(got
        .windows(2)
        .all(|w| w[1].header.hlc() > w[0].header.hlc()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_sends_and_receives_through_a_small_ring_in_order() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(8);
    let (k, engine) = launch_overlapped(&core, "echo", Handler::Echo, opts, 3);
    // Batches larger than the queue: send_batch waits for room and goes on.
    batched_echo(&k, 1000, 300).await;
    let passes = engine.target().passes.load(Ordering::SeqCst);
    assert!(passes < 1000, "{passes} passes");
    assert_eq!(k.metrics().received, 1000);
    // Empty batches.
    assert_eq!(k.send_batch::<Token>(&[]).await.unwrap().count(), 0);
    assert!(k.receive_batch(0, None).await.unwrap().is_empty());
    // Nothing waiting: a timeout, not a hang.
    let e = k
        .receive_batch(5, Some(Duration::from_millis(20)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    k.terminate().await.unwrap();
    let e = k.send_batch(&[Token::new(1, 1.0)]).await.unwrap_err();
    assert!(matches!(e, Error::KernelTerminated(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_and_compact_passes_carry_the_same_messages_as_the_ring() {
    // The engine writes each pass where the target stages it (as into wgpu's upload
    // buffers) instead of the input ring: in slots, or compact (payloads at their
    // stride, one header a run, which the stand-in rebuilds each request's header from
    // as the drain template does). Batches larger than the ring (runs split across
    // passes and lanes), single calls between them (runs of one), passes in flight:
    // ids, order, values, timestamps and correlation ids as in the ring.
    for stage in [Staging::Slots, Staging::Compact] {
        let core = core();
        let opts = LaunchOptions::default().with_queue_capacity(16);
        let (k, engine) = launch_with(&core, "echo", Handler::Echo, opts, 3, stage);
        batched_echo(&k, 2000, 300).await;
        for i in 0..40u64 {
            let r: Token = k
                .call(Token::new(i, i as f64), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!((r.id, r.value), (i, 2.0 * i as f64), "{stage:?}");
        }
        batched_echo(&k, 500, 7).await;
        let passes = engine.target().passes.load(Ordering::SeqCst);
        assert_eq!(
            engine.target().staged_passes.load(Ordering::SeqCst),
            passes,
            "every pass staged ({stage:?})"
        );
        let m = k.metrics();
        assert_eq!((m.received, m.processed, m.dropped), (2540, 2540, 0));
        k.terminate().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_pass_gives_each_request_of_a_run_its_own_size_and_header() {
    // A run whose payloads differ in size: in a compact pass each size change starts a
    // run entry of its own, so every request is rebuilt with its own length, id,
    // correlation id and timestamp, and its own bytes. With the sender filling passes
    // (the run goes straight into the pass) and without (it waits in a lane first).
    use ringkernel_core::message::Payload;
    let lens = [72usize, 72, 80, 16, 16, 16, 72, 8, 8, 64];
    for sender_fills in [false, true] {
        let core = core();
        let opts = LaunchOptions::default().with_queue_capacity(64);
        let (k, engine) = launch_config(
            &core,
            "refuse",
            Handler::Refuse,
            opts,
            1,
            Staging::Compact,
            sender_fills,
        );
        let mut first = MessageHeader::new(0x5EED, 0);
        (first.message_id, first.correlation_id, first.timestamp) = (1000, 70, 5);
        let bytes: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (i * 31 + b) as u8).collect())
            .collect();
        let payloads: Vec<Payload<'_>> = bytes.iter().map(|b| Payload::Borrowed(b)).collect();
        assert_eq!(
            engine.try_enqueue_run(&first, &payloads).unwrap(),
            lens.len()
        );
        let k2 = k.clone();
        wait_until(move || k2.metrics().dropped == lens.len() as u64).await;
        let seen = engine.target().seen.lock().unwrap().clone();
        assert_eq!(seen.len(), lens.len(), "sender_fills {sender_fills}");
        for (i, (h, payload)) in seen.iter().enumerate() {
            let want = first.nth_of_run(i as u64, lens[i]);
            assert_eq!(h, &want, "request {i}, sender_fills {sender_fills}");
            assert_eq!(payload, &bytes[i], "request {i}'s bytes");
        }
        k.terminate().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_into_a_full_queue_takes_what_fits() {
    let core = core();
    let opts = LaunchOptions::default()
        .with_queue_capacity(8)
        .with_auto_activate(false)
        .with_wait_when_full(false);
    let (k, engine) = launch(&core, "echo", Handler::Echo, opts);
    let msgs: Vec<Token> = (0..20).map(|i| Token::new(i, 1.0)).collect();
    let e = k.send_batch(&msgs).await.unwrap_err();
    assert!(matches!(e, Error::QueueFull { capacity: 8 }), "{e}");
    assert_eq!(k.metrics().received, 8, "the first 8 were taken");
    // The engine's own batch call reports how many it took.
    let mut h = MessageHeader::new(Token::TYPE_ID, 32);
    h.set_priority(ringkernel_core::priority::NORMAL);
    h.dest_kernel = k.id().0;
    let p = [0u8; 32];
    let e = engine.try_enqueue_batch(&[(h, &p[..])]).unwrap_err();
    assert!(matches!(e, Error::QueueFull { .. }), "{e}");
    let big = vec![0u8; 1 << 20];
    let e = engine.try_enqueue_batch(&[(h, &big[..])]).unwrap_err();
    assert!(matches!(e, Error::MessageTooLarge { .. }), "{e}");
    let r = k.terminate().await.unwrap();
    assert_eq!(r.undelivered.len(), 8);
}

/// An engine that only forwards the one-message calls: the trait's default batch
/// methods (what the CPU and CUDA engines use) run over it.
struct OneByOne(Arc<dyn KernelEngine>);

impl KernelEngine for OneByOne {
    fn id(&self) -> ringkernel_core::runtime::KernelId {
        self.0.id()
    }
    fn name(&self) -> &str {
        self.0.name()
    }
    fn state(&self) -> LifecycleState {
        self.0.state()
    }
    fn slot_size(&self) -> usize {
        self.0.slot_size()
    }
    fn input_capacity(&self) -> usize {
        self.0.input_capacity()
    }
    fn try_enqueue(&self, header: &MessageHeader, payload: &[u8]) -> ringkernel_core::Result<()> {
        self.0.try_enqueue(header, payload)
    }
    fn try_dequeue(&self) -> ringkernel_core::Result<Option<ringkernel_core::message::Envelope>> {
        self.0.try_dequeue()
    }
    fn output_depth(&self) -> usize {
        self.0.output_depth()
    }
    fn activate(&self) -> ringkernel_core::Result<()> {
        self.0.activate()
    }
    fn deactivate(&self) -> ringkernel_core::Result<()> {
        self.0.deactivate()
    }
    fn terminate(
        &self,
    ) -> ringkernel_core::util::BoxFuture<
        '_,
        ringkernel_core::Result<ringkernel_core::runtime::TerminateReport>,
    > {
        self.0.terminate()
    }
    fn events(&self) -> &ringkernel_core::runtime::KernelEvents {
        self.0.events()
    }
    fn metrics(&self) -> ringkernel_core::telemetry::KernelMetrics {
        self.0.metrics()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_batch_methods_loop_over_single_messages() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(8);
    let (_, engine) = launch(&core, "echo", Handler::Echo, opts.clone());
    let k = core.handle(Arc::new(OneByOne(engine)), &opts);
    batched_echo(&k, 300, 50).await;
    // Batches over `RUN_BLOCK`: the default `try_enqueue_run` goes block by block.
    let big = 2 * ringkernel_core::runtime::RUN_BLOCK as u64 + 7;
    batched_echo(&k, big + 100, big).await;
}

/// The next `n` replies, taken with `receive_batch` (10 s each at most).
/// Sends the tokens `0..n` (each valued as its id) in batches of `chunk` from a task of
/// its own, which returns the messages' ids.
fn spawn_sends(k: &KernelHandle, n: u64, chunk: usize) -> tokio::task::JoinHandle<Vec<u64>> {
    let k = k.clone();
    tokio::spawn(async move {
        let msgs: Vec<Token> = (0..n).map(|i| Token::new(i, i as f64)).collect();
        let mut ids = Vec::new();
        for part in msgs.chunks(chunk) {
            ids.extend(k.send_batch(part).await.unwrap());
        }
        ids
    })
}

async fn receive_n(k: &KernelHandle, n: usize) -> Vec<ringkernel_core::message::Envelope> {
    let mut got = Vec::new();
    while got.len() < n {
        got.extend(
            k.receive_batch(n - got.len(), Some(Duration::from_secs(10)))
                .await
                .unwrap(),
        );
    }
    got
}

/// A batch that arrives at once is split into passes that overlap: with three passes
/// allowed in flight, each takes at most a third of the ring, and all three start from
/// the one `send_batch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_becomes_overlapping_passes() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(512);
    let (k, engine) = launch_overlapped(&core, "counter", Handler::Counter, opts, 3);
    let target = engine.target();
    target.hold.store(true, Ordering::SeqCst);
    let msgs: Vec<Token> = (0..500).map(|i| Token::new(i, 0.0)).collect();
    k.send_batch(&msgs).await.unwrap();
    assert_eq!(
        target.running.load(Ordering::SeqCst),
        3,
        "three passes from one batch"
    );
    assert_eq!(target.passes.load(Ordering::SeqCst), 3);
    target.hold.store(false, Ordering::SeqCst);
    let got = receive_n(&k, 500).await;
    for (i, env) in got.iter().enumerate() {
        let t: Token = env.decode().unwrap();
        assert_eq!((t.id, t.value), (i as u64, (i + 1) as f64), "reply {i}");
    }
    assert!(target.most_running.load(Ordering::SeqCst) <= 3);
    // 500 messages, at most 512 / 3 = 170 per pass.
    assert!(target.passes.load(Ordering::SeqCst) >= 3);
}

/// A run sent while nothing waits goes straight from the caller's payloads into the
/// passes that can start (here three, held running), and what they cannot take waits
/// in the lane behind them; a later run joins that lane. The replies keep the order of
/// the sends, every message counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_split_between_passes_and_the_lane_keeps_its_order() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(512);
    let (k, engine) = launch_overlapped(&core, "echo", Handler::Echo, opts, 3);
    let target = engine.target();
    target.hold.store(true, Ordering::SeqCst);
    let msgs: Vec<Token> = (0..700).map(|i| Token::new(i, i as f64)).collect();
    // 512 fit the lane's room: 3 passes take 170 each, 2 wait; then 188 more wait.
    let ids = k.send_batch(&msgs).await.unwrap();
    assert_eq!(target.running.load(Ordering::SeqCst), 3);
    assert_eq!(k.metrics().received, 700);
    let more: Vec<Token> = (700..800).map(|i| Token::new(i, i as f64)).collect();
    // (Not consecutive with the first batch's ids: the passes launched meanwhile took
    // their outputs' ids.)
    let ids2 = k.send_batch(&more).await.unwrap();
    target.hold.store(false, Ordering::SeqCst);
    let got = receive_n(&k, 800).await;
    for (i, env) in got.iter().enumerate() {
        let t: Token = env.decode().unwrap();
        assert_eq!((t.id, t.value), (i as u64, 2.0 * i as f64), "reply {i}");
        let id = if i < 700 {
            ids.start + i as u64
        } else {
            ids2.start + i as u64 - 700
        };
        assert_eq!(env.header.correlation_id, id, "reply {i}");
    }
    let m = k.metrics();
    assert_eq!((m.received, m.processed, m.dropped), (800, 800, 0));
    k.terminate().await.unwrap();
}

/// Passes whose completions come out of launch order (the stand-in reports every third
/// late, each on a thread of its own) are read as they complete and queued in launch
/// order: the replies come in send order, answer their own requests, and their ids and
/// timestamps (reserved for each pass at launch) rise across passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_completed_out_of_order_are_queued_in_launch_order() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(256);
    let (k, engine) = launch_overlapped(&core, "echo", Handler::Echo, opts, 4);
    let sender = spawn_sends(&k, 3000, 250);
    let got = receive_n(&k, 3000).await;
    let ids = sender.await.unwrap();
    for (i, env) in got.iter().enumerate() {
        let t: Token = env.decode().unwrap();
        assert_eq!((t.id, t.value), (i as u64, 2.0 * i as f64), "reply {i}");
        assert_eq!(env.header.correlation_id, ids[i], "reply {i}");
    }
    assert!(got
        .windows(2)
        .all(|w| w[1].header.message_id > w[0].header.message_id));
    assert!(got
        .windows(2)
        .all(|w| w[1].header.hlc() > w[0].header.hlc()));
    let order = engine.target().done_order.lock().unwrap().clone();
    assert!(order.len() >= 8, "{} passes", order.len());
    assert!(
        order.windows(2).any(|w| w[1] < w[0]),
        "some pass completed before an earlier one: {order:?}"
    );
    let m = k.metrics();
    assert_eq!((m.received, m.processed, m.dropped), (3000, 3000, 0));
    k.terminate().await.unwrap();
}

/// `receive_batch_into` takes the drain engine's replies a run at a time
/// (`KernelEngine::try_dequeue_runs_with`): batches bounded by `max` end inside runs and
/// across passes, and every reply comes out once, in order, decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_batch_into_takes_runs_in_pieces_in_order() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(256);
    let (k, _engine) = launch_overlapped(&core, "echo", Handler::Echo, opts, 3);
    let sender = spawn_sends(&k, 1500, 333);
    let mut got: Vec<Token> = Vec::new();
    let mut calls = 0;
    while got.len() < 1500 {
        let before = got.len();
        let max = [37, 1, 200][calls % 3].min(1500 - before);
        let n = k
            .receive_batch_into(&mut got, max, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(n, got.len() - before);
        assert!((1..=max).contains(&n), "{n} of at most {max}");
        calls += 1;
    }
    sender.await.unwrap();
    for (i, t) in got.iter().enumerate() {
        assert_eq!((t.id, t.value), (i as u64, 2.0 * i as f64), "reply {i}");
    }
    assert!(matches!(
        k.receive_batch_into(&mut got, 8, Some(Duration::from_millis(10)))
            .await,
        Err(Error::Timeout(_))
    ));
    k.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_sender_that_fills_the_passes_keeps_order_and_loses_nothing() {
    for stage in STAGINGS {
        let core = core();
        // A lane of 16 messages: the sender waits for room most of the time, and the
        // passes completions leave to it are started when it comes back.
        let opts = LaunchOptions::default().with_queue_capacity(16);
        let (k, engine) = launch_sender_fills(&core, opts, stage);
        batched_echo(&k, 3000, 100).await;
        let m = k.metrics();
        assert_eq!(
            (m.received, m.processed, m.emitted, m.dropped),
            (3000, 3000, 3000, 0)
        );
        assert!(engine.target().most_running.load(Ordering::SeqCst) <= 3);
        if stage != Staging::Ring {
            assert_eq!(
                engine.target().staged_passes.load(Ordering::SeqCst),
                engine.target().passes.load(Ordering::SeqCst)
            );
        }
        terminate_clean(&k).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_that_stops_waiting_does_not_stall_the_passes_left_to_it() {
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(16);
    let (k, engine) = launch_sender_fills(&core, opts, Staging::Ring);
    // Passes held: the lane fills and the sender waits for room, then gives up (its
    // future dropped while the engine counts on it to come back).
    engine.target().hold.store(true, Ordering::SeqCst);
    let msgs: Vec<Token> = (0..200).map(|i| Token::new(i, i as f64)).collect();
    let sent = tokio::time::timeout(Duration::from_millis(100), k.send_batch(&msgs)).await;
    assert!(sent.is_err(), "the sender was still waiting for room");
    let accepted = k.metrics().received;
    assert!(accepted >= 16, "{accepted} accepted");
    engine.target().hold.store(false, Ordering::SeqCst);
    // Every accepted message still comes back, in order, with no further send.
    for i in 0..accepted {
        let t: Token = k.receive_timeout_as(Duration::from_secs(5)).await.unwrap();
        assert_eq!((t.id, t.value), (i, 2.0 * i as f64), "reply {i}");
    }
    assert_eq!(k.metrics().processed, accepted);
    terminate_clean(&k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_of_one_pass_keep_their_own_ids_across_runs_and_k2k() {
    // One pass holds a batch (consecutive correlation ids: its replies are queued as a
    // run), a K2K send in its middle (which breaks the run and takes an id and a
    // timestamp of its own) and single sends whose ids are not consecutive: every reply
    // answers its own request, and ids and timestamps stay distinct and increasing.
    let core = core();
    let opts = LaunchOptions::default()
        .with_queue_capacity(32)
        .with_auto_activate(false);
    let (a, engine) = launch(&core, "a", Handler::Stage, opts);
    let (b, _) = launch(
        &core,
        "b",
        Handler::Echo,
        LaunchOptions::default().with_queue_capacity(32),
    );
    let to_b = [a.id(), b.id()];
    let mut batch: Vec<Token> = (0..4)
        .map(|i| Token::routed(i, i as f64, &[a.id()]).unwrap())
        .collect();
    batch.push(Token::routed(4, 4.0, &to_b).unwrap());
    batch.extend((5..9).map(|i| Token::routed(i, i as f64, &[a.id()]).unwrap()));
    let mut requests: Vec<u64> = a.send_batch(&batch).await.unwrap().collect();
    for i in 9..12 {
        // An id taken in between: these requests' ids are not consecutive.
        b.send(Token::new(100 + i, 0.0)).await.unwrap();
        requests.push(
            a.send(Token::routed(i, i as f64, &[a.id()]).unwrap())
                .await
                .unwrap(),
        );
    }
    a.activate().await.unwrap();
    let mut got = Vec::new();
    while got.len() < 11 {
        got.extend(
            a.receive_batch(11 - got.len(), Some(Duration::from_secs(5)))
                .await
                .unwrap(),
        );
    }
    assert_eq!(engine.target().passes.load(Ordering::SeqCst), 1, "one pass");
    let want: Vec<(u64, u64)> = (0..12u64)
        .filter(|&i| i != 4)
        .map(|i| (i, requests[i as usize]))
        .collect();
    let seen: Vec<(u64, u64)> = got
        .iter()
        .map(|e| (e.decode::<Token>().unwrap().id, e.header.correlation_id))
        .collect();
    assert_eq!(seen, want, "each reply answers its own request, in order");
    for e in &got {
        let t: Token = e.decode().unwrap();
        assert_eq!((t.value, t.hops), (t.id as f64 + 1.0, 1));
    }
    assert!(got
        .windows(2)
        .all(|w| w[1].header.message_id > w[0].header.message_id));
    assert!(got
        .windows(2)
        .all(|w| w[1].header.hlc() > w[0].header.hlc()));
    // The K2K send reached b (echoed there), with an id none of the replies has.
    let mut from_b = Vec::new();
    while from_b.len() < 4 {
        from_b.extend(
            b.receive_batch(4 - from_b.len(), Some(Duration::from_secs(5)))
                .await
                .unwrap(),
        );
    }
    let routed = from_b
        .iter()
        .find(|e| e.decode::<Token>().unwrap().id == 4)
        .expect("the K2K send arrived");
    assert_eq!(routed.decode::<Token>().unwrap().value, 10.0);
    assert_eq!(a.metrics().processed, 12);
    terminate_clean(&a).await;
    terminate_clean(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_passes_in_flight_over_a_small_ring_still_overlap() {
    // Six passes allowed over 16 slots: a pass takes at most 2 messages (its share of
    // the ring), so a further pass must not wait for more than that (a quarter of the
    // ring, 4, is more than a pass may ever take).
    let core = core();
    let opts = LaunchOptions::default().with_queue_capacity(16);
    let (k, engine) = launch_overlapped(&core, "counter", Handler::Counter, opts, 6);
    let target = engine.target();
    target.hold.store(true, Ordering::SeqCst);
    for i in 0..12 {
        k.send(Token::new(i, 0.0)).await.unwrap();
    }
    assert!(
        target.running.load(Ordering::SeqCst) >= 2,
        "passes overlap: {} running",
        target.running.load(Ordering::SeqCst)
    );
    target.hold.store(false, Ordering::SeqCst);
    for i in 0..12 {
        let t: Token = k.receive_timeout_as(Duration::from_secs(10)).await.unwrap();
        assert_eq!((t.id, t.value), (i, (i + 1) as f64), "reply {i}");
    }
    assert!(target.most_running.load(Ordering::SeqCst) <= 6);
    terminate_clean(&k).await;
}
