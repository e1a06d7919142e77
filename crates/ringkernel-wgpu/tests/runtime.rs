//! WgpuRuntime on the software adapter (lavapipe in CI): the shared behavioural suite
//! (`ringkernel_core::conformance`, the same tests the CPU runtime runs), with message
//! counts sized for CI, plus the exactness of the WGSL built-ins' f64 arithmetic.

use ringkernel_core::builtin::{Token, COUNTER, ECHO, STAGE};
use ringkernel_core::conformance as conf;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_core::util::SplitMix64;
use ringkernel_wgpu::{AdapterSelection, WgpuRuntime};
use std::time::Duration;

fn runtime() -> WgpuRuntime {
    let sel = std::env::var("RINGKERNEL_WGPU_TEST_ADAPTER")
        .map(|s| AdapterSelection::parse(&s))
        .unwrap_or(default_adapter());
    WgpuRuntime::with_selection(KernelRegistry::new(), sel)
        .expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)")
}

ringkernel_core::conformance_tests! {
    runtime: runtime(),
    scale: conf::Scale {
        echo_messages: 20_000,
        pipeline_messages: 2_000,
        callers: 4,
        calls_per_caller: 50,
    },
}

/// Random doubles of every kind the Token arithmetic must get bit-exact: the WGSL f64
/// add/×2/from-int (integer arithmetic on the IEEE bits) against the CPU's.
fn awkward_f64(rng: &mut SplitMix64) -> f64 {
    match rng.below(6) {
        0 => f64::from_bits(rng.next_u64()), // anything, NaN/inf included
        1 => (rng.next_f64() - 0.5) * 4.0,   // near ±1 (cancellation)
        2 => f64::from_bits(rng.next_u64() & 0x000F_FFFF_FFFF_FFFF), // subnormal
        3 => (rng.next_f64() - 0.5) * 1e17,  // where +1 rounds
        4 => -1.0 + (rng.next_f64() - 0.5) * 1e-12,
        _ => f64::MAX * (rng.next_f64() - 0.5),
    }
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_f64_arithmetic_is_bit_exact() {
    let rt = runtime();
    // Room for every request and reply: the test sends all before receiving.
    let opts = LaunchOptions::default().with_queue_capacity(4096);
    let echo = rt.launch(ECHO, opts.clone()).await.unwrap();
    let stage = rt.launch(STAGE, opts).await.unwrap();
    let mut rng = SplitMix64::from_entropy();
    let values: Vec<f64> = (0..3000).map(|_| awkward_f64(&mut rng)).collect();
    for (i, v) in values.iter().enumerate() {
        echo.send(Token::new(i as u64, *v)).await.unwrap();
        stage.send(Token::new(i as u64, *v)).await.unwrap();
    }
    for (i, v) in values.iter().enumerate() {
        let e: Token = echo
            .receive_timeout_as(Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(e.id, i as u64);
        assert!(
            same(e.value, v * 2.0),
            "{v:e} ({:#x}) * 2: got {:e}, want {:e}",
            v.to_bits(),
            e.value,
            v * 2.0
        );
        let s: Token = stage
            .receive_timeout_as(Duration::from_secs(20))
            .await
            .unwrap();
        assert!(
            same(s.value, v + 1.0),
            "{v:e} ({:#x}) + 1: got {:e} ({:#x}), want {:e}",
            v.to_bits(),
            s.value,
            s.value.to_bits(),
            v + 1.0
        );
        assert_eq!((e.hops, s.hops), (1, 1));
        assert!(
            e.stamps[0] > 0 && s.stamps[0] > 0,
            "stamped with the kernel clock"
        );
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_counts_in_order_across_passes() {
    let rt = runtime();
    let c = rt.launch(COUNTER, LaunchOptions::default()).await.unwrap();
    for round in 0..3u64 {
        for i in 0..100u64 {
            c.send(Token::new(i, 0.0)).await.unwrap();
        }
        for i in 0..100u64 {
            let t: Token = c.receive_timeout_as(Duration::from_secs(20)).await.unwrap();
            assert_eq!(t.id, i);
            assert_eq!(t.value, (round * 100 + i + 1) as f64);
        }
    }
    let m = c.metrics();
    assert_eq!((m.received, m.processed, m.dropped), (300, 300, 0));
    rt.shutdown().await.unwrap();
}

/// The batched API through real drain passes: batches larger than the ring (so
/// `send_batch` waits for room), replies taken in batches, in order, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_echo_through_drain_passes_in_order() {
    let rt = runtime();
    let k = rt
        .launch(ECHO, LaunchOptions::default().with_queue_capacity(1024))
        .await
        .unwrap();
    let n = 10_000u64;
    let sender = {
        let k = k.clone();
        tokio::spawn(async move {
            let msgs: Vec<Token> = (0..n).map(|i| Token::new(i, i as f64)).collect();
            let mut ids = Vec::new();
            for chunk in msgs.chunks(3000) {
                ids.extend(k.send_batch(chunk).await.unwrap());
            }
            ids
        })
    };
    let mut got = Vec::new();
    while (got.len() as u64) < n {
        let envs = k
            .receive_batch(n as usize - got.len(), Some(Duration::from_secs(20)))
            .await
            .unwrap();
        got.extend(envs);
    }
    let ids = sender.await.unwrap();
    for (i, env) in got.iter().enumerate() {
        let t: Token = env.decode().unwrap();
        assert_eq!((t.id, t.value), (i as u64, 2.0 * i as f64), "reply {i}");
        assert_eq!(env.header.correlation_id, ids[i]);
    }
    let m = k.metrics();
    assert_eq!((m.received, m.processed, m.dropped), (n, n, 0));
    rt.shutdown().await.unwrap();
}

/// The echo at slot sizes other than the default (the ring stride the drain template
/// and the host's uploads and readbacks follow): every reply comes back, in order,
/// none dropped. A slot too small for a `Token` (72 bytes after the 64-byte header) is
/// a clear error at the send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_at_other_slot_sizes() {
    let rt = runtime();
    let small = LaunchOptions::default().with_slot_size(128);
    let k = rt.launch(ECHO, small).await.unwrap();
    let e = k.send_batch(&[Token::new(1, 1.0)]).await.unwrap_err();
    assert!(
        matches!(e, ringkernel_core::Error::MessageTooLarge { size: 72, .. }),
        "{e}"
    );
    k.terminate().await.unwrap();
    for slot in [512usize, 4096] {
        let opts = LaunchOptions::default()
            .with_queue_capacity(4096)
            .with_slot_size(slot);
        let k = rt.launch(ECHO, opts).await.unwrap();
        let n = 5_000u64;
        let msgs: Vec<Token> = (0..n).map(|i| Token::new(i, i as f64)).collect();
        k.send_batch(&msgs).await.unwrap();
        let mut got: Vec<Token> = Vec::new();
        while (got.len() as u64) < n {
            let left = n as usize - got.len();
            k.receive_batch_into(&mut got, left, Some(Duration::from_secs(20)))
                .await
                .unwrap_or_else(|e| panic!("slot {slot}: {e} after {} replies", got.len()));
        }
        for (i, t) in got.iter().enumerate() {
            assert_eq!(
                (t.id, t.value),
                (i as u64, 2.0 * i as f64),
                "slot {slot}, reply {i}"
            );
        }
        let m = k.metrics();
        assert_eq!(
            (m.received, m.processed, m.dropped),
            (n, n, 0),
            "slot {slot}"
        );
        k.terminate().await.unwrap();
    }
    rt.shutdown().await.unwrap();
}

/// With a sender running ahead of a serial handler, passes overlap (up to three in
/// flight, each with its own readback): the counter's state still sees the messages in
/// order across them, and the replies come back in that order, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_passes_keep_a_serial_handlers_order() {
    let rt = runtime();
    let c = rt.launch(COUNTER, LaunchOptions::default()).await.unwrap();
    let n = 10_000u64;
    let sender = {
        let c = c.clone();
        tokio::spawn(async move {
            for i in 0..n {
                c.send(Token::new(i, 0.0)).await.unwrap();
            }
        })
    };
    for i in 0..n {
        let t: Token = c.receive_timeout_as(Duration::from_secs(20)).await.unwrap();
        assert_eq!((t.id, t.value), (i, (i + 1) as f64), "reply {i}");
    }
    sender.await.unwrap();
    let m = c.metrics();
    assert_eq!(
        (m.received, m.processed, m.emitted, m.dropped),
        (n, n, n, 0)
    );
    rt.shutdown().await.unwrap();
}

/// The serial WGSL counter sees waiting messages highest priority first (FIFO within
/// one), across passes when the ring is smaller than what waits; replies carry the
/// kernel's priority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serial_handler_sees_messages_in_priority_order() {
    use ringkernel_core::priority;
    let rt = runtime();
    let opts = LaunchOptions::default()
        .with_queue_capacity(4)
        .with_priority(priority::HIGH)
        .without_auto_activate();
    let c = rt.launch(COUNTER, opts).await.unwrap();
    for i in 0..4u64 {
        c.send_with_priority(Token::new(i, 0.0), priority::LOW)
            .await
            .unwrap();
    }
    c.send(Token::new(50, 0.0)).await.unwrap();
    c.send_with_priority(Token::new(200, 0.0), priority::CRITICAL)
        .await
        .unwrap();
    c.activate().await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..6 {
        let env = c
            .receive_envelope(Some(Duration::from_secs(20)))
            .await
            .unwrap();
        assert_eq!(env.header.priority(), priority::HIGH);
        let t: Token = env.decode().unwrap();
        seen.push((t.id, t.value));
    }
    assert_eq!(
        seen,
        vec![
            (200, 1.0),
            (50, 2.0),
            (0, 3.0),
            (1, 4.0),
            (2, 5.0),
            (3, 6.0)
        ]
    );
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_message_type_is_dropped_and_counted() {
    let rt = runtime();
    let k = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    k.send_envelope(&ringkernel_core::message::Envelope::from_bytes(
        77,
        &[1, 2, 3, 4],
    ))
    .await
    .unwrap();
    let r: Token = k
        .call(Token::new(5, 2.0), Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(r.value, 4.0);
    let m = k.metrics();
    assert_eq!((m.received, m.processed, m.dropped), (2, 1, 1));
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_wgsl_handler_is_a_compile_error() {
    let reg = KernelRegistry::new();
    reg.register_gpu(ringkernel_core::registry::GpuHandler::new("bad").with_wgsl("fn handle( {"));
    let rt = WgpuRuntime::with_selection(reg, default_adapter()).unwrap();
    let e = rt
        .launch("bad", LaunchOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, ringkernel_core::Error::Compile { .. }), "{e}");
    // The name is free again.
    assert!(rt
        .launch(ECHO, LaunchOptions::default().with_name("bad"))
        .await
        .is_ok());
    rt.shutdown().await.unwrap();
}

/// A WGSL handler sees its kernel's node id (`ctx.node_id`), so it can stamp the full
/// HLC timestamp (time and node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wgsl_handler_sees_its_node_id() {
    const HANDLER: &str = "
fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {
    if (!token_begin(ctx, in_slot, out_slot)) {
        return RK_ERR_TYPE_MISMATCH;
    }
    rk_out_set_u64(out_slot + TOKEN_STAMPS + 2u, (*ctx).node_id);
    rk_reply(ctx, TOKEN_TYPE_ID, TOKEN_BYTES);
    return 0u;
}
";
    let rt = runtime_with_token_handler("node", HANDLER);
    let a = rt.launch("node", LaunchOptions::default()).await.unwrap();
    let b = rt
        .launch("node", LaunchOptions::default().with_name("node.b"))
        .await
        .unwrap();
    for k in [&a, &b] {
        k.send(Token::new(1, 1.0)).await.unwrap();
        let env = k
            .receive_envelope(Some(Duration::from_secs(20)))
            .await
            .unwrap();
        let t: Token = env.decode().unwrap();
        let node = rt.core().kernel_node_id(k.id());
        assert_eq!(t.stamps[1], node, "ctx.node_id of {}", k.name());
        // The host stamps the reply with the same clock.
        assert_eq!(env.header.node_id, node);
    }
    rt.shutdown().await.unwrap();
}

/// A WGSL handler sees each request's own header fields, whether its pass carried the
/// request in a slot or compactly (one header for a run of a batch, which the template
/// advances for each message of the run): batches split over passes, single sends
/// between them. The handler returns the request's message id, correlation id and
/// timestamp in the reply's stamps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wgsl_handler_sees_each_requests_own_header() {
    const HANDLER: &str = "
fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {
    if (!token_begin(ctx, in_slot, out_slot)) {
        return RK_ERR_TYPE_MISMATCH;
    }
    rk_out_set_u64(out_slot + TOKEN_STAMPS + 2u, (*ctx).request.message_id);
    rk_out_set_u64(out_slot + TOKEN_STAMPS + 4u, (*ctx).request.correlation_id);
    rk_out_set_u64(out_slot + TOKEN_STAMPS + 6u, (*ctx).request.timestamp);
    rk_reply(ctx, TOKEN_TYPE_ID, TOKEN_BYTES);
    return 0u;
}
";
    let rt = runtime_with_token_handler("fields", HANDLER);
    let k = rt
        .launch(
            "fields",
            // Room for every request at once (the test sends a batch before it takes
            // its replies); a pass takes at most an eighth of the ring, so the larger
            // batches are split over passes.
            LaunchOptions::default()
                .with_queue_capacity(2048)
                .with_slot_size(144),
        )
        .await
        .unwrap();
    // (first token id, count): batches of several sizes, and single sends.
    let sends = [
        (0u64, 700u64),
        (700, 1),
        (701, 300),
        (1001, 1),
        (1002, 1),
        (1003, 97),
    ];
    let mut ids = Vec::new();
    let mut got: Vec<ringkernel_core::message::Envelope> = Vec::new();
    for &(start, n) in &sends {
        let msgs: Vec<Token> = (start..start + n).map(|i| Token::new(i, 1.0)).collect();
        ids.extend(k.send_batch(&msgs).await.unwrap());
        while (got.len() as u64) < start + n {
            let left = (start + n) as usize - got.len();
            got.extend(
                k.receive_batch(left, Some(Duration::from_secs(20)))
                    .await
                    .unwrap(),
            );
        }
    }
    let mut last_ts = 0u64;
    for &(start, n) in &sends {
        for i in start..start + n {
            let env = &got[i as usize];
            let t: Token = env.decode().unwrap();
            assert_eq!(t.id, i, "reply {i} in order");
            assert_eq!(t.stamps[1], ids[i as usize], "request {i}'s message id");
            assert_eq!(
                t.stamps[2], env.header.correlation_id,
                "request {i}'s correlation id"
            );
            assert_eq!(t.stamps[2], ids[i as usize]);
            // A batch's timestamps are consecutive; later sends' are later.
            if i > start {
                assert_eq!(t.stamps[3], last_ts + 1, "request {i}'s timestamp");
            } else {
                assert!(t.stamps[3] > last_ts, "request {i}'s timestamp");
            }
            last_ts = t.stamps[3];
        }
    }
    rt.shutdown().await.unwrap();
}

/// A runtime with the WGSL handler `name` registered: `handler` after the `Token`
/// helpers (`token_begin`, `TOKEN_STAMPS`, ...).
fn runtime_with_token_handler(name: &str, handler: &str) -> WgpuRuntime {
    let reg = KernelRegistry::new();
    reg.register_gpu(
        ringkernel_core::registry::GpuHandler::new(name).with_wgsl(format!(
            "{}\n{handler}",
            ringkernel_shaders::drain::TOKEN_LIB
        )),
    );
    WgpuRuntime::with_selection(reg, default_adapter()).unwrap()
}

/// lavapipe in CI; the GPU on the device machine (whose bundle sets RINGKERNEL_REQUIRE_GPU).
fn default_adapter() -> AdapterSelection {
    if std::env::var("RINGKERNEL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        AdapterSelection::Hardware
    } else {
        AdapterSelection::Software
    }
}

/// The drain template skips a request whose header is not a valid message (the host
/// invalidates one whose timestamp is too far ahead of the kernel's clock): it is
/// dropped without reaching the handler, and the kernel goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_too_far_ahead_of_the_clock_is_dropped() {
    use ringkernel_core::hlc::HlcTimestamp;
    use ringkernel_core::message::{MessageHeader, RingMessage};
    let rt = runtime();
    let k = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut h = MessageHeader::new(Token::TYPE_ID, 72);
    h.timestamp = HlcTimestamp::new(now_ms + 3_600_000, 0).as_u64();
    k.engine()
        .try_enqueue(&h, bytemuck::bytes_of(&Token::new(1, 1.0)))
        .unwrap();
    let r: Token = k
        .call(Token::new(2, 4.0), Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(r.value, 8.0);
    let m = k.metrics();
    assert_eq!((m.received, m.processed, m.dropped), (2, 1, 1));
    assert_eq!(
        m.latency.count, 1,
        "the refused request never reached the handler"
    );
    assert!(k.try_receive::<Token>().unwrap().is_none());
    rt.shutdown().await.unwrap();
}

/// Names of this process's threads (Linux; empty elsewhere).
fn thread_names() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

/// Passes of at least a thousand messages are recorded on the runtime's launcher
/// threads (several at once with `RINGKERNEL_WGPU_LAUNCHER=N`, as `scripts/test.sh`
/// runs this test too) and submitted in launch order, small ones on the calling
/// thread unless passes wait there; passes are finished on several threads. Large
/// batches through a serial counter (each reply carries how many messages the kernel
/// had seen, so a pass submitted or queued out of order shows) while another kernel of
/// the same runtime answers calls: every reply comes back, in order and right, and the
/// calls are answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_passes_on_the_launcher_thread_keep_order_beside_calls() {
    let rt = runtime();
    let big = rt
        .launch(COUNTER, LaunchOptions::default().with_queue_capacity(16384))
        .await
        .unwrap();
    let small = rt
        .launch(ECHO, LaunchOptions::default().with_name("small"))
        .await
        .unwrap();
    let n = 30_000u64;
    let sender = {
        let k = big.clone();
        tokio::spawn(async move {
            let msgs: Vec<Token> = (0..n).map(|i| Token::new(i, i as f64 + 0.25)).collect();
            let mut ids = Vec::new();
            for chunk in msgs.chunks(8192) {
                ids.extend(k.send_batch(chunk).await.unwrap());
            }
            ids
        })
    };
    let caller = {
        let k = small.clone();
        tokio::spawn(async move {
            for i in 0..40u64 {
                let r: Token = k
                    .call(Token::new(i, i as f64), Duration::from_secs(20))
                    .await
                    .unwrap();
                assert_eq!((r.id, r.value, r.hops), (i, 2.0 * i as f64, 1), "call {i}");
            }
        })
    };
    let mut got = Vec::new();
    while (got.len() as u64) < n {
        let envs = big
            .receive_batch(n as usize - got.len(), Some(Duration::from_secs(20)))
            .await
            .unwrap();
        got.extend(envs);
    }
    let ids = sender.await.unwrap();
    caller.await.unwrap();
    for (i, env) in got.iter().enumerate() {
        let t: Token = env.decode().unwrap();
        assert_eq!(
            (t.id, t.value, t.hops),
            (i as u64, (i + 1) as f64, 1),
            "reply {i}"
        );
        assert_eq!(env.header.correlation_id, ids[i]);
    }
    assert!(got
        .windows(2)
        .all(|w| w[1].header.hlc() > w[0].header.hlc()));
    let m = big.metrics();
    assert_eq!((m.received, m.processed, m.dropped), (n, n, 0));
    // (Unless the environment turns the threads off, for measuring them.)
    let unset = |v: &str| std::env::var_os(v).is_none();
    if cfg!(target_os = "linux")
        && unset(ringkernel_wgpu::runtime::LAUNCHER_ENV)
        && unset(ringkernel_wgpu::runtime::FINISHER_ENV)
    {
        use ringkernel_wgpu::runtime::{FINISHER_THREAD, LAUNCHERS, LAUNCHER_THREAD};
        let names = thread_names();
        let count = |name: &str| names.iter().filter(|t| *t == name).count();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if !ringkernel_wgpu::runtime::small_host(cpus, rt.context().info.software) {
            assert!(
                count(LAUNCHER_THREAD) >= LAUNCHERS,
                "large passes went through the launcher threads: {names:?}"
            );
            assert!(count(FINISHER_THREAD) >= 1, "a finisher thread: {names:?}");
        } else {
            // A small host: passes launched and finished without threads of their own.
            assert_eq!(
                (count(LAUNCHER_THREAD), count(FINISHER_THREAD)),
                (0, 0),
                "no launcher or finisher threads on {cpus} CPUs: {names:?}"
            );
        }
    }
    rt.shutdown().await.unwrap();
}
