//! The cross-backend behavioural suite (`ringkernel_core::conformance`) on persistent
//! CUDA kernels, plus CUDA-specific checks. Tests run one at a time (a shared lock):
//! persistent kernels hold hardware queues, so many test runtimes at once would measure
//! contention, not behaviour.

use ringkernel_core::builtin::{Token, ECHO, STAGE};
use ringkernel_core::conformance;
use ringkernel_core::hlc::HlcTimestamp;
use ringkernel_core::message::{flags, Envelope, MessageHeader, RingMessage};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::priority;
use ringkernel_core::queue::stamped::stamped_slot_bytes;
use ringkernel_core::registry::{GpuHandler, KernelRegistry};
use ringkernel_core::runtime::{KernelHandle, KernelId, RingKernelRuntime};
use ringkernel_cuda::CudaRuntime;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

mod common;

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `test` on an executor of its own, one test at a time.
fn serially(test: impl std::future::Future<Output = ()>) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let exec = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(test);
}

fn with_runtime<F, Fut>(f: F)
where
    F: FnOnce(CudaRuntime) -> Fut,
    Fut: std::future::Future<Output = ringkernel_core::Result<()>>,
{
    serially(async {
        let rt = runtime().await;
        f(rt).await.unwrap();
    });
}

/// As [`with_runtime`], on a runtime over `reg` (for tests with their own handlers).
fn with_registry<F, Fut>(reg: KernelRegistry, f: F)
where
    F: FnOnce(CudaRuntime) -> Fut,
    Fut: std::future::Future<Output = ringkernel_core::Result<()>>,
{
    serially(async {
        let rt = CudaRuntime::with_registry(reg).await.expect("CUDA runtime");
        f(rt).await.unwrap();
    });
}

/// A CUDA runtime with the built-in kernels.
async fn runtime() -> CudaRuntime {
    let reg = KernelRegistry::new();
    ringkernel_cuda::register_cuda_builtins(&reg);
    CudaRuntime::with_registry(reg).await.expect("CUDA runtime")
}

ringkernel_core::conformance_tests! {
    runtime: runtime().await,
    // RINGKERNEL_CONFORMANCE_SCALE=smoke under compute-sanitizer (scripts/gpu-sanitize.sh).
    scale: conformance::Scale::from_env(conformance::Scale::full()).expect("conformance scale"),
    serial: SERIAL,
    ignore: "needs CUDA GPU",
}

/// Terminate really ends the GPU kernel: its stream goes idle and the kernel id is
/// gone from the runtime; shutdown with kernels still running terminates them.
#[test]
#[ignore = "needs CUDA GPU"]
fn terminate_exits_and_shutdown_drains() {
    with_runtime(|rt| async move {
        let a = rt
            .launch(ECHO, LaunchOptions::default().with_name("a"))
            .await?;
        let b = rt
            .launch(ECHO, LaunchOptions::default().with_name("b"))
            .await?;
        for i in 0..100 {
            a.send(Token::new(i, 1.0)).await?;
        }
        let rep = a.terminate().await?;
        assert!(rep.undelivered.is_empty());
        assert_eq!(
            rep.replies_waiting, 100,
            "every drained reply is still receivable"
        );
        assert!(rt.kernel(&"a".into()).is_none());
        b.deactivate().await?;
        for i in 0..7 {
            b.send(Token::new(i, 1.0)).await?;
        }
        let rep = rt.shutdown().await?;
        assert_eq!(rep.kernels, 1);
        assert_eq!(rep.undelivered, 7);
        Ok(())
    });
}

/// A K2K message to a kernel that is gone is dropped and counted (the handler sees
/// NOT_FOUND), never written into freed memory.
#[test]
#[ignore = "needs CUDA GPU"]
fn k2k_to_a_terminated_kernel_is_counted_as_dropped() {
    with_runtime(|rt| async move {
        let s1 = rt
            .launch(STAGE, LaunchOptions::default().with_name("s1"))
            .await?;
        let s2 = rt
            .launch(STAGE, LaunchOptions::default().with_name("s2"))
            .await?;
        common::k2k_to_a_terminated_kernel_is_dropped(&s1, &s2).await
    });
}

/// Two kernels send into one inbox one message at a time, interleaved: a sender's
/// reservation from its warp's hint (`RkK2kHint`) misses whenever the other one moved
/// the inbox's `reserve` since, and falls back to the ordinary reservation.
/// Every token arrives once, and each sender's tokens in the order it sent them.
#[test]
#[ignore = "needs CUDA GPU"]
fn k2k_from_two_kernels_one_at_a_time_into_one_inbox_loses_nothing() {
    with_runtime(|rt| async move {
        let opts = |name: &str| LaunchOptions::default().with_name(name);
        let a = rt.launch(STAGE, opts("a")).await?;
        let b = rt.launch(STAGE, opts("b")).await?;
        let sink = rt.launch(STAGE, opts("sink")).await?;
        const N: u64 = 400;
        for i in 0..N {
            // Even ids through `a`, odd through `b`; sent without waiting, so both
            // forward into `sink` at the same time.
            let via = if i % 2 == 0 { &a } else { &b };
            via.send(Token::routed(i, 0.0, &[via.id(), sink.id()])?)
                .await?;
        }
        let mut seen = HashSet::new();
        let mut last = [None::<u64>; 2];
        for _ in 0..N {
            let t: Token = sink.receive_timeout_as(Duration::from_secs(10)).await?;
            assert_eq!((t.hops, t.value), (2, 2.0), "token {}", t.id);
            assert!(seen.insert(t.id), "token {} arrived twice", t.id);
            let from = (t.id % 2) as usize;
            assert!(
                last[from].is_none_or(|l| l < t.id),
                "token {} after {:?} from the same sender",
                t.id,
                last[from]
            );
            last[from] = Some(t.id);
        }
        assert_eq!(seen.len() as u64, N);
        assert_eq!(a.metrics().dropped + b.metrics().dropped, 0);
        let (ra, rb, rs) = tokio::join!(a.terminate(), b.terminate(), sink.terminate());
        ra?;
        rb?;
        rs?;
        Ok(())
    });
}

/// A sender keeps forwarding to a kernel while that kernel terminates: its sends right
/// after the terminate may still reserve from its hint (the route was valid a moment
/// before), and the terminating kernel drains what they reserved, so its terminate
/// ends. Every message the sender handled was either delivered or dropped (NOT_FOUND).
#[test]
#[ignore = "needs CUDA GPU"]
fn k2k_sends_while_the_destination_terminates_end_delivered_or_dropped() {
    with_runtime(|rt| async move {
        let opts = |name: &str| LaunchOptions::default().with_name(name);
        let a = rt.launch(STAGE, opts("a")).await?;
        let b = rt.launch(STAGE, opts("b")).await?;
        // The hint is fresh: one token through first.
        a.send(Token::routed(0, 0.0, &[a.id(), b.id()])?).await?;
        let t: Token = b.receive_timeout_as(Duration::from_secs(10)).await?;
        assert_eq!(t.hops, 2);
        const N: u64 = 300;
        let sending = async {
            for i in 1..=N {
                a.send(Token::routed(i, 0.0, &[a.id(), b.id()])?).await?;
            }
            Ok::<_, ringkernel_core::Error>(())
        };
        let ending = async {
            tokio::time::sleep(Duration::from_micros(200)).await;
            tokio::time::timeout(Duration::from_secs(20), b.terminate()).await
        };
        let (sent, ended) = tokio::join!(sending, ending);
        sent?;
        let report = ended.expect("the destination's terminate ended")?;
        // `a` handles all of them: each one went into b's inbox or was dropped.
        let start = std::time::Instant::now();
        loop {
            let m = a.metrics();
            if m.processed + m.dropped > N {
                assert_eq!(m.processed + m.dropped, N + 1, "{m:?}");
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a handled only {m:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let delivered = a.metrics().processed - 1;
        // What reached b was handled by it (before the terminate or in its drain) and
        // replied; its replies stay receivable.
        let mut replies = 0u64;
        while let Some(t) = b.try_receive::<Token>()? {
            assert_eq!(t.hops, 2);
            replies += 1;
        }
        assert!(
            report.undelivered.is_empty(),
            "b was active: nothing is handed back"
        );
        assert_eq!(replies, delivered, "every delivered token was handled by b");
        a.terminate().await?;
        Ok(())
    });
}

/// A kernel routes K2K messages to a kernel launched after it (the receiver's inbox
/// comes from the runtime's inbox pool, which existed before the sender launched: under
/// compute-sanitizer's memcheck, the sender's access is in bounds).
#[test]
#[ignore = "needs CUDA GPU"]
fn k2k_routes_to_a_kernel_launched_after_the_sender() {
    with_runtime(|rt| async move {
        let s1 = rt
            .launch(STAGE, LaunchOptions::default().with_name("early"))
            .await?;
        // s1 runs (it has handled a message) before s2 exists.
        s1.send(Token::routed(7, 1.0, &[s1.id()])?).await?;
        let t: Token = s1.receive_timeout_as(Duration::from_secs(10)).await?;
        assert_eq!((t.id, t.hops), (7, 1));
        let s2 = rt
            .launch(STAGE, LaunchOptions::default().with_name("late"))
            .await?;
        for i in 0..20u64 {
            s1.send(Token::routed(i, 1.0, &[s1.id(), s2.id()])?).await?;
            let t: Token = s2.receive_timeout_as(Duration::from_secs(10)).await?;
            assert_eq!((t.id, t.hops, t.value), (i, 2, 3.0), "message {i}");
        }
        assert_eq!(s1.metrics().dropped, 0);
        // Both told to end before either is waited for, so this test also finishes under
        // compute-sanitizer (see `terminate_together`).
        terminate_together(&s1, &s2).await
    });
}

/// The runtime's K2K inbox pool is bounded: a launch whose inbox does not fit any more
/// is a clear error (the kernels before it keep running), and a terminated kernel's
/// inbox is not handed out again (a sender may still hold its address).
#[test]
#[ignore = "needs CUDA GPU"]
fn a_full_inbox_pool_is_an_error_at_launch() {
    serially(async {
        let opts = |name: &str| {
            LaunchOptions::default()
                .with_queue_capacity(64)
                .with_name(name)
        };
        let o = opts("x");
        // One kernel's inbox: a header line and its stamped slots, in 256-byte steps.
        let inbox = (128 + o.queue_capacity * stamped_slot_bytes(o.slot_size)).div_ceil(256) * 256;
        let reg = KernelRegistry::new();
        ringkernel_cuda::register_cuda_builtins(&reg);
        let rt = CudaRuntime::with_inbox_pool(reg, 0, 2 * inbox + inbox / 2)
            .await
            .expect("CUDA runtime");
        let a = rt.launch(ECHO, opts("a")).await.expect("first inbox fits");
        let b = rt.launch(ECHO, opts("b")).await.expect("second inbox fits");
        let full = |r: ringkernel_core::Result<KernelHandle>| match r {
            Err(ringkernel_core::Error::Device(m)) if m.contains("inbox pool") => {}
            Err(e) => panic!("expected the inbox pool error, got {e}"),
            Ok(k) => panic!("kernel {} launched past the inbox pool", k.name()),
        };
        full(rt.launch(ECHO, opts("c")).await);
        // The kernels before it still work.
        let r: Token = a
            .call(Token::new(1, 2.0), Duration::from_secs(10))
            .await
            .unwrap();
        // rk.echo doubles the value
        assert_eq!((r.id, r.value), (1, 4.0));
        b.terminate().await.unwrap();
        full(rt.launch(ECHO, opts("c")).await);
        assert!(CudaRuntime::with_inbox_pool(KernelRegistry::new(), 0, 0)
            .await
            .is_err());
        rt.shutdown().await.unwrap();
    });
}

/// A user handler with its own state and a parallel (non-serial) body: a running sum
/// kept with atomics, replies in input order.
#[test]
#[ignore = "needs CUDA GPU"]
fn user_handler_with_state() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let reg = KernelRegistry::new();
    reg.register_gpu(
        GpuHandler::new("sum")
            .with_cuda(
                r#"
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    if (in_hdr->payload_len != 8) return -3;
    unsigned long long v = *(const unsigned long long*)in_payload;
    unsigned long long before = atomicAdd((unsigned long long*)state, v);
    *(unsigned long long*)out_payload = v * 3ull;
    (void)before; (void)ctx; (void)out_hdr;
    return 1;
}
"#,
            )
            .with_state_bytes(8),
    );
    let exec = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(async {
        let rt = CudaRuntime::with_registry(reg).await.unwrap();
        let k = rt
            .launch("sum", LaunchOptions::default().with_block_size(256))
            .await
            .unwrap();
        let n = 5000u64;
        let mut got = 0u64;
        let mut sent = 0u64;
        while got < n {
            while sent < n && sent - got < 512 {
                let env = ringkernel_core::message::Envelope::from_bytes(77, &sent.to_le_bytes());
                match k.send_envelope(&env).await {
                    Ok(_) => sent += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            let r = k
                .receive_envelope(Some(Duration::from_secs(10)))
                .await
                .unwrap();
            let v = u64::from_le_bytes(r.payload[..8].try_into().unwrap());
            assert_eq!(v, got * 3, "reply {got} out of order");
            got += 1;
        }
        let m = k.metrics();
        assert_eq!((m.processed, m.dropped), (n, 0));
        // A bad payload is dropped and counted, and the kernel goes on.
        k.send_envelope(&ringkernel_core::message::Envelope::from_bytes(
            77,
            &[1, 2, 3],
        ))
        .await
        .unwrap();
        let env = ringkernel_core::message::Envelope::from_bytes(77, &9u64.to_le_bytes());
        k.send_envelope(&env).await.unwrap();
        let r = k
            .receive_envelope(Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(u64::from_le_bytes(r.payload[..8].try_into().unwrap()), 27);
        assert_eq!(k.metrics().dropped, 1);
        rt.shutdown().await.unwrap();
    });
}

/// Sends `t` to `k` with priority `p`, stamped as `KernelHandle::send` stamps (message
/// id, host source, host clock), through the engine.
fn send_with_priority(
    rt: &CudaRuntime,
    k: &KernelHandle,
    t: Token,
    p: u8,
) -> ringkernel_core::Result<()> {
    let mut h = host_header(rt, k);
    h.set_priority(p);
    k.engine().try_enqueue(&h, bytemuck::bytes_of(&t))
}

/// The header of a `Token` request from the host to `k`, as `send` stamps one: a fresh
/// message id (also the correlation id), the host as source, the runtime clock's tick.
fn host_header(rt: &CudaRuntime, k: &KernelHandle) -> MessageHeader {
    let mut h = MessageHeader::new(Token::TYPE_ID, std::mem::size_of::<Token>());
    h.message_id = rt.core().next_message_id();
    h.correlation_id = h.message_id;
    h.source_kernel = KernelId::HOST.0;
    h.dest_kernel = k.id().0;
    h.set_hlc(rt.core().hlc().tick());
    h
}

/// Priority lanes: with the kernel not yet active, LOW messages then a HIGH and a
/// CRITICAL one wait in its input. Once activated, the CRITICAL and then the HIGH
/// reply come before every LOW one, and the LOW ones in the order they were sent.
/// Every reply carries the kernel's clock node id and the kernel's own priority.
#[test]
#[ignore = "needs CUDA GPU"]
fn higher_priorities_overtake_waiting_low_ones() {
    with_runtime(|rt| async move {
        let k = rt
            .launch(
                ECHO,
                LaunchOptions::default()
                    .with_priority(priority::HIGH)
                    .without_auto_activate(),
            )
            .await?;
        const N: u64 = 300;
        for i in 0..N {
            send_with_priority(&rt, &k, Token::new(i, 1.0), priority::LOW)?;
        }
        send_with_priority(&rt, &k, Token::new(1_000, 1.0), priority::HIGH)?;
        send_with_priority(&rt, &k, Token::new(2_000, 1.0), priority::CRITICAL)?;
        // All of them wait (one lane per level: 300 LOW fit the LOW lane alone).
        assert_eq!(k.metrics().queue_depth, N as usize + 2);
        assert_eq!(
            k.engine().input_capacity(),
            LaunchOptions::default().queue_capacity,
            "input_capacity is one lane's"
        );
        k.activate().await?;
        let node = rt.core().kernel_node_id(k.id());
        let mut order = Vec::new();
        let mut last: Option<HlcTimestamp> = None;
        for _ in 0..N + 2 {
            let env = k.receive_envelope(Some(Duration::from_secs(10))).await?;
            assert_eq!(
                env.header.node_id, node,
                "reply stamped by the kernel's clock"
            );
            assert_eq!(
                env.header.priority(),
                priority::HIGH,
                "the kernel's priority"
            );
            assert_ne!(env.header.flags & flags::REPLY, 0);
            // One clock: its stamps strictly increase in reply order.
            let ts = env.header.hlc();
            assert!(last.is_none_or(|l| l < ts), "{last:?} then {ts:?}");
            last = Some(ts);
            let t: Token = env.decode()?;
            assert_eq!(t.value, 2.0);
            order.push(t.id);
        }
        assert_eq!(&order[..2], &[2_000, 1_000], "CRITICAL, then HIGH, first");
        let low: Vec<u64> = (0..N).collect();
        assert_eq!(&order[2..], &low[..], "LOW replies in FIFO order");
        // The host merged the replies into its clock: its next tick is later than all.
        assert!(rt.core().hlc().tick() > last.unwrap());
        let m = k.metrics();
        assert_eq!((m.processed, m.dropped), (N + 2, 0), "{m:?}");
        // The device frees a lane's slots just after publishing the batch's replies.
        let start = std::time::Instant::now();
        while k.metrics().queue_depth != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "input slots never freed: {:?}",
                k.metrics()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        rt.shutdown().await?;
        Ok(())
    });
}

/// Requests that carry a payload checksum (`flags::CHECKSUM`, filled in by the host) are
/// verified on the device and answered, one at a time (the one-message loop) and in a
/// burst (group rounds); each reply carries its request's correlation id and goes back to
/// the request's source. A header field the kernel read wrong (checksum, flags, payload
/// length, correlation id, source) fails here: a checksum mismatch drops the message.
#[test]
#[ignore = "needs CUDA GPU"]
fn checksummed_requests_are_verified_on_the_device_and_answered() {
    with_runtime(|rt| async move {
        let k = rt.launch(ECHO, LaunchOptions::default()).await?;
        let send = |i: u64| {
            let t = Token::new(i, i as f64 + 0.25);
            let mut h = host_header(&rt, &k);
            h.correlation_id = 0xC0DE_0000_0000 + i;
            h.flags |= flags::CHECKSUM;
            k.engine().try_enqueue(&h, bytemuck::bytes_of(&t))
        };
        let check = |env: &Envelope, i: u64| -> ringkernel_core::Result<()> {
            assert_eq!(env.header.correlation_id, 0xC0DE_0000_0000 + i);
            assert_eq!(
                env.header.dest_kernel,
                KernelId::HOST.0,
                "back to its source"
            );
            assert_ne!(env.header.flags & flags::REPLY, 0);
            let t: Token = env.decode()?;
            assert_eq!((t.id, t.value, t.hops), (i, 2.0 * (i as f64 + 0.25), 1));
            Ok(())
        };
        const ONE_BY_ONE: u64 = 100;
        const BURST: u64 = 200;
        for i in 0..ONE_BY_ONE {
            send(i)?;
            let env = k.receive_envelope(Some(Duration::from_secs(10))).await?;
            check(&env, i)?;
        }
        for i in ONE_BY_ONE..ONE_BY_ONE + BURST {
            send(i)?;
        }
        for i in ONE_BY_ONE..ONE_BY_ONE + BURST {
            let env = k.receive_envelope(Some(Duration::from_secs(10))).await?;
            check(&env, i)?;
        }
        let m = k.metrics();
        assert_eq!((m.processed, m.dropped), (ONE_BY_ONE + BURST, 0), "{m:?}");
        rt.shutdown().await?;
        Ok(())
    });
}

/// Messages left in several lanes of an inactive kernel come back from terminate,
/// highest lane first and FIFO within a lane; a full lane refuses more while the
/// others still accept.
#[test]
#[ignore = "needs CUDA GPU"]
fn terminate_returns_every_lane() {
    with_runtime(|rt| async move {
        let k = rt
            .launch(
                ECHO,
                LaunchOptions::default()
                    .with_queue_capacity(4)
                    .without_auto_activate(),
            )
            .await?;
        for i in 0..4 {
            send_with_priority(&rt, &k, Token::new(i, 1.0), priority::LOW)?;
        }
        match send_with_priority(&rt, &k, Token::new(9, 1.0), priority::LOW) {
            Err(ringkernel_core::Error::QueueFull { capacity }) => assert_eq!(capacity, 4),
            other => panic!("a full LOW lane must refuse, got {other:?}"),
        }
        send_with_priority(&rt, &k, Token::new(10, 1.0), priority::NORMAL)?;
        send_with_priority(&rt, &k, Token::new(20, 1.0), priority::CRITICAL)?;
        send_with_priority(&rt, &k, Token::new(11, 1.0), priority::NORMAL)?;
        assert_eq!(k.metrics().queue_depth, 7);
        let rep = k.terminate().await?;
        let ids: Vec<u64> = rep
            .undelivered
            .iter()
            .map(|e| e.decode::<Token>().map(|t| t.id))
            .collect::<ringkernel_core::Result<_>>()?;
        assert_eq!(ids, vec![20, 10, 11, 0, 1, 2, 3]);
        assert_eq!(rep.drained, 0);
        rt.shutdown().await?;
        Ok(())
    });
}

/// Two kernels' clocks carry different node ids, so they never produce equal
/// timestamps, even for equal packed times.
#[test]
#[ignore = "needs CUDA GPU"]
fn two_kernels_never_produce_equal_timestamps() {
    with_runtime(|rt| async move {
        let a = rt
            .launch(ECHO, LaunchOptions::default().with_name("a"))
            .await?;
        let b = rt
            .launch(ECHO, LaunchOptions::default().with_name("b"))
            .await?;
        let (na, nb) = (
            rt.core().kernel_node_id(a.id()),
            rt.core().kernel_node_id(b.id()),
        );
        assert_ne!(na, nb);
        assert_eq!(na >> 32, u64::from(rt.core().node_number()));
        const N: u64 = 500;
        for i in 0..N {
            a.send(Token::new(i, 1.0)).await?;
            b.send(Token::new(i, 1.0)).await?;
        }
        let mut seen = HashSet::new();
        for (k, node) in [(&a, na), (&b, nb)] {
            for _ in 0..N {
                let env = k.receive_envelope(Some(Duration::from_secs(10))).await?;
                assert_eq!(env.header.node_id, node);
                let ts = env.header.hlc();
                assert!(seen.insert(ts), "timestamp {ts:?} produced twice");
                // The kernel's own stamp of the token (rk.echo writes ctx->now, the
                // packed time after merging the request) is its node's too.
                let t: Token = env.decode()?;
                assert!(t.stamps[0] != 0 && t.stamps[0] <= ts.packed());
            }
        }
        assert_eq!(seen.len(), 2 * N as usize);
        rt.shutdown().await?;
        Ok(())
    });
}

/// K2K sends on the device carry the sending kernel's node id and priority: kernel
/// `a` (CRITICAL) forwards to `b` (LOW), which reports the header it received.
#[test]
#[ignore = "needs CUDA GPU"]
fn k2k_sends_carry_the_senders_node_id_and_priority() {
    let reg = KernelRegistry::new();
    reg.register_gpu(GpuHandler::new("hdr-probe").with_cuda(
        r#"
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state;
    if (!ctx->from_inbox) {
        /* From the host: forward this kernel's node id to the kernel named in the payload. */
        if (in_hdr->payload_len != 8) return -(int)RK_ERR_HANDLER;
        rk_u32 dest = (rk_u32)*(const rk_u64*)in_payload;
        rk_u64 mine = ctx->node_id;
        return rk_send_to(ctx, dest, in_hdr->type_id, &mine, 8) == RK_K2K_DELIVERED ? 0 : -(int)RK_ERR_HANDLER;
    }
    /* From another kernel: report the header it came with. */
    rk_u64* o = (rk_u64*)out_payload;
    o[0] = in_hdr->node_id;
    o[1] = in_hdr->flags;
    o[2] = in_hdr->timestamp;
    o[3] = *(const rk_u64*)in_payload;
    out_hdr->payload_len = 32;
    return 1;
}
"#,
    ));
    with_registry(reg, |rt| async move {
        rt.preload("hdr-probe")?;
        let a = rt
            .launch(
                "hdr-probe",
                LaunchOptions::default()
                    .with_name("a")
                    .with_priority(priority::CRITICAL),
            )
            .await?;
        let b = rt
            .launch(
                "hdr-probe",
                LaunchOptions::default()
                    .with_name("b")
                    .with_priority(priority::LOW),
            )
            .await?;
        let (na, nb) = (
            rt.core().kernel_node_id(a.id()),
            rt.core().kernel_node_id(b.id()),
        );
        a.send_envelope(&Envelope::from_bytes(
            77,
            &u64::from(b.id().0).to_le_bytes(),
        ))
        .await?;
        let env = b.receive_envelope(Some(Duration::from_secs(10))).await?;
        let word = |i: usize| u64::from_le_bytes(env.payload[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(env.payload.len(), 32);
        assert_eq!(word(0), na, "the K2K header names a's clock");
        assert_eq!(word(3), na, "a's handler saw its node id in ctx->node_id");
        let k2k_flags = word(1) as u32;
        assert_ne!(k2k_flags & flags::K2K, 0);
        let h = MessageHeader {
            flags: k2k_flags,
            ..Default::default()
        };
        assert_eq!(h.priority(), priority::CRITICAL, "a's priority");
        assert_ne!(word(2), 0, "the K2K send is stamped");
        // b's reply: b's clock, b's priority, later than the K2K stamp it merged.
        assert_eq!(env.header.node_id, nb);
        assert_eq!(env.header.priority(), priority::LOW);
        assert!(env.header.timestamp > word(2));
        assert_eq!(a.metrics().dropped, 0);
        terminate_together(&a, &b).await?;
        rt.shutdown().await?;
        Ok(())
    });
}

/// Terminates two kernels together: both are told to end before either is waited for.
/// Under compute-sanitizer the end of a kernel is seen only once no other kernel runs
/// (`scripts/sanitizer_probe.cu`, mode `end-beside`), so ending them one after the other
/// never finishes there; this way the K2K tests' device code gets checked by the tool.
async fn terminate_together(a: &KernelHandle, b: &KernelHandle) -> ringkernel_core::Result<()> {
    let (ra, rb) = tokio::join!(a.terminate(), b.terminate());
    ra?;
    rb?;
    Ok(())
}

/// Echoes any payload byte for byte; each message spins for `(first byte % 8) * 250`
/// ns first, so messages of one batch finish at different times.
const COPY_SRC: &str = r#"
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)ctx; (void)out_hdr; (void)state;
    if (in_hdr->payload_len > 0) {
        unsigned long long t0 = rk_globaltimer_ns();
        while (rk_globaltimer_ns() - t0 < (unsigned long long)(in_payload[0] % 8u) * 250ull) {}
    }
    for (unsigned i = 0; i < in_hdr->payload_len; i++) out_payload[i] = in_payload[i];
    return 1;
}
"#;

/// Payload `i`: a length from 0 to the slot's maximum and bytes derived from `i`.
fn torture_payload(i: u64, max: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let len = (x % (max as u64 + 1)) as usize;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Streams `n` messages of random sizes (every unit count a slot allows) through `k`
/// with the batch API while taking replies, and checks every reply byte for byte and in
/// input order: nothing lost, duplicated, torn or reordered.
async fn stream_and_check(rt: &CudaRuntime, k: &KernelHandle, n: u64, slot: usize) {
    let s = rt.streamer(k).unwrap();
    let max = slot - ringkernel_core::message::HEADER_SIZE;
    let (mut sent, mut got) = (0u64, 0u64);
    let start = std::time::Instant::now();
    while got < n {
        if sent < n {
            let batch: Vec<(MessageHeader, Vec<u8>)> = (sent..n.min(sent + 256))
                .map(|i| {
                    let p = torture_payload(i, max);
                    let mut h = MessageHeader::new(0x51, p.len());
                    h.message_id = i + 1;
                    (h, p)
                })
                .collect();
            sent += s
                .try_send_batch(batch.iter().map(|(h, p)| (h, &p[..])))
                .unwrap() as u64;
        }
        let mut bad = None;
        let mut next = got;
        s.try_receive_batch(usize::MAX, &mut |_h, p| {
            if p != &torture_payload(next, max)[..] && bad.is_none() {
                bad = Some(next);
            }
            next += 1;
        })
        .unwrap();
        got = next;
        assert!(
            bad.is_none(),
            "reply {} differs from its request",
            bad.unwrap()
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{got} of {n} replies after 60 s"
        );
    }
    assert_eq!(got, n);
    let m = k.metrics();
    assert_eq!((m.processed, m.dropped), (n, 0), "{m:?}");
}

/// Host lanes and replies are stamped slots: payloads of every length (every number of
/// units), across many laps of small rings, arrive whole and in order.
#[test]
#[ignore = "needs CUDA GPU"]
fn stamped_slots_of_every_size_arrive_whole_and_in_order() {
    let reg = KernelRegistry::new();
    reg.register_gpu(GpuHandler::new("copy").with_cuda(COPY_SRC));
    with_registry(reg, |rt| async move {
        for (slot, block) in [(128usize, 64u32), (256, 128), (512, 32)] {
            let k = rt
                .launch(
                    "copy",
                    LaunchOptions::default()
                        .with_slot_size(slot)
                        .with_block_size(block)
                        .with_queue_capacity(64)
                        .with_output_capacity(64),
                )
                .await?;
            stream_and_check(&rt, &k, 20_000, slot).await;
            k.terminate().await?;
        }
        rt.shutdown().await?;
        Ok(())
    });
}

/// Several threads stream through one kernel at once with `CudaStreamer` batches long
/// enough to be encoded and decoded outside the locks: every message comes back exactly
/// once, and each consumer thread sees each producer's replies in the order it sent
/// them (a claim is a run of the output in order). Then the kernel terminates with
/// nothing left behind.
#[test]
#[ignore = "needs CUDA GPU"]
fn several_threads_stream_through_one_kernel_without_loss() {
    const PRODUCERS: u32 = 3;
    const PER: u32 = 40_000;
    let reg = KernelRegistry::new();
    reg.register_gpu(GpuHandler::new("copy").with_cuda(COPY_SRC));
    with_registry(reg, |rt| async move {
        let k = rt
            .launch(
                "copy",
                LaunchOptions::default()
                    .with_slot_size(128)
                    .with_grid_size(2)
                    .with_block_size(128)
                    .with_queue_capacity(1024)
                    .with_output_capacity(1024),
            )
            .await?;
        let s = rt.streamer(&k)?;
        let total = u64::from(PRODUCERS * PER);
        let taken = std::sync::atomic::AtomicU64::new(0);
        let seen = Mutex::new(vec![0u8; total as usize]);
        std::thread::scope(|scope| {
            for p in 0..PRODUCERS {
                let s = s.clone();
                scope.spawn(move || {
                    let mut next = 0u32;
                    let start = std::time::Instant::now();
                    while next < PER {
                        // Batches of 300..=1,000 (all past the split length), sizes varied.
                        let n = (300 + (next * 7 + p * 131) % 701).min(PER - next);
                        let batch: Vec<(MessageHeader, Vec<u8>)> = (next..next + n)
                            .map(|i| {
                                let mut b = [p.to_le_bytes(), i.to_le_bytes()].concat();
                                b.resize(8 + (i % 50) as usize, (i % 251) as u8);
                                (MessageHeader::new(0x51, b.len()), b)
                            })
                            .collect();
                        next += s
                            .try_send_batch(batch.iter().map(|(h, b)| (h, &b[..])))
                            .unwrap() as u32;
                        assert!(
                            start.elapsed() < Duration::from_secs(60),
                            "producer {p} stuck at {next}"
                        );
                    }
                });
            }
            for c in 0..2 {
                let (s, taken, seen) = (s.clone(), &taken, &seen);
                scope.spawn(move || {
                    let mut last = [None::<u32>; PRODUCERS as usize];
                    let start = std::time::Instant::now();
                    while taken.load(std::sync::atomic::Ordering::Relaxed) < total {
                        let mut ids = Vec::new();
                        let n = s
                            .try_receive_batch(usize::MAX, &mut |_h, b| {
                                let p = u32::from_le_bytes(b[..4].try_into().unwrap());
                                let i = u32::from_le_bytes(b[4..8].try_into().unwrap());
                                assert_eq!(b.len(), 8 + (i % 50) as usize, "reply {p}/{i} length");
                                assert!(
                                    b[8..].iter().all(|&x| x == (i % 251) as u8),
                                    "reply {p}/{i} torn"
                                );
                                ids.push((p, i));
                            })
                            .unwrap();
                        let mut seen = seen.lock().unwrap();
                        for (p, i) in ids {
                            let l = &mut last[p as usize];
                            assert!(l.is_none_or(|l| l < i), "consumer {c}: {p}/{i} after {l:?}");
                            *l = Some(i);
                            seen[(p * PER + i) as usize] += 1;
                        }
                        taken.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                        assert!(
                            start.elapsed() < Duration::from_secs(60),
                            "consumer {c} stuck"
                        );
                    }
                });
            }
        });
        let seen = seen.into_inner().unwrap();
        let missing = seen.iter().filter(|&&c| c == 0).count();
        let twice = seen.iter().filter(|&&c| c > 1).count();
        assert_eq!((missing, twice), (0, 0), "messages missing, seen twice");
        let m = k.metrics();
        assert_eq!((m.processed, m.dropped), (total, 0), "{m:?}");
        let report = k.terminate().await?;
        assert!(report.undelivered.is_empty());
        rt.shutdown().await?;
        Ok(())
    });
}

/// A kernel of several blocks: every block takes messages from the same lanes, handlers
/// finish out of order, and the replies still leave in input order, none lost.
#[test]
#[ignore = "needs CUDA GPU"]
fn a_kernel_of_several_blocks_keeps_order_and_loses_nothing() {
    let reg = KernelRegistry::new();
    reg.register_gpu(GpuHandler::new("copy").with_cuda(COPY_SRC));
    with_registry(reg, |rt| async move {
        let k = rt
            .launch(
                "copy",
                LaunchOptions::default()
                    .with_grid_size(4)
                    .with_block_size(128)
                    .with_queue_capacity(1024)
                    .with_output_capacity(1024),
            )
            .await?;
        stream_and_check(&rt, &k, 100_000, 256).await;
        // One at a time through `call` too (each block may take the next one).
        for i in 0..200u64 {
            let r: Token = k.call(Token::new(i, 1.0), Duration::from_secs(10)).await?;
            assert_eq!((r.id, r.value), (i, 1.0));
        }
        let rep = k.terminate().await?;
        assert!(rep.undelivered.is_empty());
        // More blocks than multiprocessors cannot all run at once: refused.
        let err = rt
            .launch("copy", LaunchOptions::default().with_grid_size(100_000))
            .await
            .expect_err("a grid larger than the GPU");
        assert!(
            matches!(err, ringkernel_core::Error::InvalidArgument(_)),
            "{err}"
        );
        rt.shutdown().await?;
        Ok(())
    });
}

/// CUDA for the K2K senders below: `send_all` sends the `n` messages of `len` bytes at
/// `buf` to kernel `dest`, one a call (`per` 1: `rk_send_to`, so `n` is 1) or as many as
/// fit with one reservation a try (`rk_send_many_to`), retrying what a full inbox
/// refused. False when `dest` takes no K2K messages.
const K2K_SEND_ALL_SRC: &str = r#"
__device__ bool send_all(RkContext* ctx, unsigned dest, unsigned type_id, const unsigned char* buf, unsigned len,
                         unsigned n, unsigned per) {
    for (unsigned done = 0; done < n;) {
        if (per == 1) {
            const int r = rk_send_to(ctx, dest, type_id, buf, len);
            if (r == RK_K2K_NOT_FOUND) return false;
            if (r == RK_K2K_DELIVERED) done = 1;
        } else {
            const int r = rk_send_many_to(ctx, dest, type_id, buf + done * len, len, n - done);
            if (r < 0) return false;
            done += (unsigned)r;
        }
        if (done < n) __nanosleep(128);
    }
    return true;
}
"#;

/// A trigger {dest, count, max, per} makes the handling thread send `count` K2K messages
/// of type 0x52 to kernel `dest`, `per` at a time: one by one through `rk_send_to` when
/// `per` is 1, else with `rk_send_many_to`, retrying what did not fit a full inbox.
/// Message i has the length and bytes `k2k_payload(i, max, per)` gives (the length is
/// equal within each group of `per`). It replies when all are delivered.
const K2K_GEN_SRC: &str = r#"
struct Gen { unsigned dest; unsigned count; unsigned max; unsigned per; };
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state; (void)out_payload;
    if (ctx->from_inbox || in_hdr->payload_len != sizeof(Gen)) return -(int)RK_ERR_HANDLER;
    const Gen g = *(const Gen*)in_payload;
    unsigned char buf[1024];
    if (g.per == 0 || g.per * g.max > sizeof(buf)) return -(int)RK_ERR_HANDLER;
    for (unsigned i = 0; i < g.count; i += g.per) {
        const unsigned n = g.count - i < g.per ? g.count - i : g.per;
        const unsigned len = ((i / g.per) * 37u + 11u) % (g.max + 1u);
        for (unsigned m = 0; m < n; m++)
            for (unsigned j = 0; j < len; j++) buf[m * len + j] = (unsigned char)((i + m) * 131u + j * 7u + 3u);
        if (!send_all(ctx, g.dest, 0x52u, buf, len, n, g.per)) return -(int)RK_ERR_HANDLER;
    }
    out_hdr->payload_len = 0;
    return 1;
}
"#;

/// Payload of K2K message `i` of `K2K_GEN_SRC` with `max` and `per`.
fn k2k_payload(i: u32, max: u32, per: u32) -> Vec<u8> {
    let len = ((i / per).wrapping_mul(37).wrapping_add(11)) % (max + 1);
    (0..len)
        .map(|j| (i.wrapping_mul(131).wrapping_add(j * 7).wrapping_add(3)) as u8)
        .collect()
}

/// K2K inboxes read in windows: messages of every length from one sender thread, one at
/// a time and several per reservation (`rk_send_many_to`), through a small inbox (many
/// laps, full-inbox retries), reach a copying kernel of one block and of several, whole
/// and in order. The windows read only the units the last window's
/// slots used, and take the complete prefix of a window still being written; a longer
/// message than the window read is taken by the next round. Two sinks give most of
/// their block to the inbox (`inbox_threads`: larger windows, one warp left for the
/// host's input, which still answers after the stream).
#[test]
#[ignore = "needs CUDA GPU"]
fn k2k_messages_of_every_size_arrive_whole_and_in_order() {
    #[repr(C)]
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    struct Gen {
        dest: u32,
        count: u32,
        max: u32,
        per: u32,
    }
    let reg = KernelRegistry::new();
    reg.register_gpu(GpuHandler::new("copy").with_cuda(COPY_SRC));
    reg.register_gpu(
        GpuHandler::new("k2k-gen").with_cuda(format!("{K2K_SEND_ALL_SRC}{K2K_GEN_SRC}")),
    );
    with_registry(reg, |rt| async move {
        // A sender's own slot bounds what it sends (`RkContext::max_payload`).
        let gen = rt
            .launch("k2k-gen", LaunchOptions::default().with_slot_size(512))
            .await?;
        for (slot, grid, block, per, inbox) in [
            (256usize, 1u32, 128u32, 1u32, None),
            (512, 1, 512, 1, None),
            (256, 4, 128, 1, None),
            (256, 1, 128, 4, None),
            (512, 4, 128, 2, None),
            (256, 1, 512, 4, Some(480u32)),
            (128, 4, 128, 1, Some(96)),
        ] {
            let mut opts = LaunchOptions::default()
                .with_slot_size(slot)
                .with_grid_size(grid)
                .with_block_size(block)
                .with_queue_capacity(64)
                .with_output_capacity(4096);
            opts.inbox_threads = inbox;
            let sink = rt.launch("copy", opts).await?;
            let max = (slot - ringkernel_core::message::HEADER_SIZE) as u32;
            let count = 6_000u32;
            let g = Gen {
                dest: sink.id().0,
                count,
                max,
                per,
            };
            gen.send_envelope(Envelope::from_bytes(0x61, bytemuck::bytes_of(&g)))
                .await?;
            for i in 0..count {
                let r = match sink.receive_envelope(Some(Duration::from_secs(20))).await {
                    Ok(r) => r,
                    Err(e) => panic!("slot {slot}, grid {grid}, {per} at a time: reply {i}: {e}"),
                };
                assert_eq!(
                    r.header.type_id, 0x52,
                    "slot {slot}, grid {grid}: reply {i}"
                );
                let want = k2k_payload(i, max, per);
                assert!(
                    r.payload == want,
                    "slot {slot}, grid {grid}, {per} at a time: reply {i} differs from what was sent ({} bytes, expected {})",
                    r.payload.len(),
                    want.len()
                );
            }
            let done = gen.receive_envelope(Some(Duration::from_secs(20))).await?;
            assert_eq!(done.payload.len(), 0);
            // The host's input is still served (by one warp, for the sinks above).
            sink.send_envelope(Envelope::from_bytes(0x63, &[2, 4, 6]))
                .await?;
            let r = sink.receive_envelope(Some(Duration::from_secs(20))).await?;
            assert_eq!(
                (r.header.type_id, r.payload.as_slice()),
                (0x63, &[2u8, 4, 6][..]),
                "slot {slot}, grid {grid}, inbox {inbox:?}: the host's message"
            );
            let m = sink.metrics();
            assert_eq!(m.dropped, 0, "{m:?}");
            sink.terminate().await?;
        }
        gen.terminate().await?;
        rt.shutdown().await?;
        Ok(())
    });
}

/// A trigger {dest, sender, count, per} makes the handling thread send `count` K2K
/// messages of type 0x53 to kernel `dest`, `per` a reservation (`send_all` above).
/// Message i carries {sender, i, check(sender, i), 0xA5A5A5A5}. It replies when all are
/// delivered.
const K2K_MANY_SRC: &str = r#"
struct Many { unsigned dest; unsigned sender; unsigned count; unsigned per; };
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state; (void)out_payload;
    if (ctx->from_inbox || in_hdr->payload_len != sizeof(Many)) return -(int)RK_ERR_HANDLER;
    const Many g = *(const Many*)in_payload;
    unsigned buf[8 * 4];
    if (g.per == 0 || g.per > 8) return -(int)RK_ERR_HANDLER;
    for (unsigned i = 0; i < g.count; i += g.per) {
        const unsigned n = g.count - i < g.per ? g.count - i : g.per;
        for (unsigned m = 0; m < n; m++) {
            buf[m * 4] = g.sender;
            buf[m * 4 + 1] = i + m;
            buf[m * 4 + 2] = (g.sender * 2654435761u) ^ ((i + m) * 40503u);
            buf[m * 4 + 3] = 0xA5A5A5A5u;
        }
        if (!send_all(ctx, g.dest, 0x53u, (const unsigned char*)buf, 16, n, g.per)) return -(int)RK_ERR_HANDLER;
    }
    out_hdr->payload_len = 0;
    return 1;
}
"#;

/// Many warps of one sender block send to two small inboxes at once, one message and
/// several a reservation: every message arrives once, whole, and in its sender's order.
/// The warps' reservations race (compare-and-swap on the inbox's `reserve`) against each
/// other and against the sinks moving their heads through many laps of 32 slots; a room
/// computed from a wrong head would let a sender overwrite a slot before it is read, and
/// a message would be lost or repeated.
#[test]
#[ignore = "needs CUDA GPU"]
fn k2k_from_many_warps_into_small_inboxes_loses_nothing() {
    #[repr(C)]
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    struct Many {
        dest: u32,
        sender: u32,
        count: u32,
        per: u32,
    }
    let reg = KernelRegistry::new();
    reg.register_gpu(GpuHandler::new("copy").with_cuda(COPY_SRC));
    reg.register_gpu(
        GpuHandler::new("k2k-many").with_cuda(format!("{K2K_SEND_ALL_SRC}{K2K_MANY_SRC}")),
    );
    with_registry(reg, |rt| async move {
        let gen = rt
            .launch(
                "k2k-many",
                LaunchOptions::default()
                    .with_block_size(256)
                    .with_queue_capacity(256),
            )
            .await?;
        let sink_opts = || {
            LaunchOptions::default()
                .with_block_size(128)
                .with_queue_capacity(32)
                // Every reply of a round fits: the host reads one sink after the other,
                // and a sink whose output is full would stop taking from its inbox.
                .with_output_capacity(16384)
        };
        let sinks = [
            rt.launch("copy", sink_opts().with_name("sink-a")).await?,
            rt.launch("copy", sink_opts().with_name("sink-b")).await?,
        ];
        // Smaller under compute-sanitizer (scripts/gpu-sanitize.sh sets the smoke scale).
        let smoke = conformance::Scale::from_env(conformance::Scale::full())?
            == conformance::Scale::smoke();
        let (senders, count) = if smoke { (16u32, 20u32) } else { (96, 250) };
        for per in [1u32, 3] {
            for s in 0..senders {
                let g = Many {
                    dest: sinks[(s % 2) as usize].id().0,
                    sender: s,
                    count,
                    per,
                };
                gen.send_envelope(Envelope::from_bytes(0x61, bytemuck::bytes_of(&g)))
                    .await?;
            }
            for (k, sink) in sinks.iter().enumerate() {
                // Next message expected from each sender of this sink.
                let mut next = vec![0u32; senders as usize];
                for n in 0..(senders / 2) * count {
                    let r = match sink.receive_envelope(Some(Duration::from_secs(20))).await {
                        Ok(r) => r,
                        Err(e) => panic!("{per} a reservation, sink {k}: message {n}: {e}"),
                    };
                    let w: Vec<u32> = r
                        .payload
                        .chunks_exact(4)
                        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                        .collect();
                    assert_eq!(w.len(), 4, "{per} a reservation, sink {k}: message {n}");
                    let (s, i) = (w[0], w[1]);
                    assert!(
                        s < senders && s % 2 == k as u32,
                        "{per} a reservation, sink {k}: message {n} from sender {s}"
                    );
                    assert_eq!(
                        (i, w[2], w[3]),
                        (
                            next[s as usize],
                            s.wrapping_mul(2654435761) ^ next[s as usize].wrapping_mul(40503),
                            0xA5A5_A5A5
                        ),
                        "{per} a reservation, sink {k}: sender {s}'s next message"
                    );
                    next[s as usize] += 1;
                }
            }
            for _ in 0..senders {
                let done = gen.receive_envelope(Some(Duration::from_secs(20))).await?;
                assert_eq!(done.payload.len(), 0, "a sender failed: {:?}", done.header);
            }
        }
        for sink in &sinks {
            let m = sink.metrics();
            assert_eq!(m.dropped, 0, "{m:?}");
        }
        assert_eq!(gen.metrics().dropped, 0);
        // All three at once (see `terminate_together`): the test then also runs to its
        // end under compute-sanitizer.
        let [a, b] = &sinks;
        let (sinks_done, gen_done) = tokio::join!(terminate_together(a, b), gen.terminate());
        sinks_done?;
        gen_done?;
        rt.shutdown().await?;
        Ok(())
    });
}
