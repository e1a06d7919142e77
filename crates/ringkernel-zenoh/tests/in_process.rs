//! Two bridges in one process (two runtimes, a real Zenoh TCP connection on
//! 127.0.0.1): the refusals, counters and edge cases that are easier to provoke here
//! than across processes.

mod common;
use common::{eventually, free_port, WAIT};

use ringkernel_core::builtin::{self, Token};
use ringkernel_core::hlc::{HlcTimestamp, DEFAULT_MAX_DRIFT_MS};
use ringkernel_core::message::{Envelope, MessageHeader, RingMessage};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::runtime::{KernelHandle, KernelId, RingKernelRuntime};
use ringkernel_core::Error;
use ringkernel_cpu::CpuRuntime;
use ringkernel_zenoh::wire::{self, K2kFrame};
use ringkernel_zenoh::zenoh::Wait;
use ringkernel_zenoh::{BridgeConfig, RemoteReceipt, ZenohBridge};
use std::time::Duration;

struct Pair {
    port: u16,
    rt_a: CpuRuntime,
    rt_b: CpuRuntime,
    a: ZenohBridge,
    b: ZenohBridge,
}

async fn pair(config_b: impl FnOnce(BridgeConfig) -> BridgeConfig) -> Pair {
    let port = free_port();
    let rt_a = CpuRuntime::new().await.unwrap();
    let rt_b = CpuRuntime::new().await.unwrap();
    let a = ZenohBridge::start(
        rt_a.core().clone(),
        BridgeConfig::new("a").listen(format!("tcp/127.0.0.1:{port}")),
    )
    .await
    .unwrap();
    let b = ZenohBridge::start(
        rt_b.core().clone(),
        config_b(BridgeConfig::new("b").connect(format!("tcp/127.0.0.1:{port}"))),
    )
    .await
    .unwrap();
    a.wait_for_peer("b", WAIT).await.unwrap();
    b.wait_for_peer("a", WAIT).await.unwrap();
    Pair {
        port,
        rt_a,
        rt_b,
        a,
        b,
    }
}

async fn next_token(k: &KernelHandle) -> Token {
    k.receive_envelope(Some(WAIT))
        .await
        .unwrap()
        .decode()
        .unwrap()
}

fn token(id: u64, v: f64) -> Envelope {
    Envelope::new(&Token::new(id, v))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_say_what_became_of_each_message() {
    let p = pair(|c| c).await;
    let opts = LaunchOptions::default()
        .with_name("echo")
        .with_queue_capacity(2);
    let echo = p
        .rt_b
        .launch(builtin::ECHO, opts.without_auto_activate())
        .await
        .unwrap();

    let send = |to: &'static str, v: f64| {
        let a = &p.a;
        async move { a.send(KernelId::HOST, to, &token(1, v)).await.unwrap() }
    };
    assert_eq!(send("echo@b", 1.0).await, RemoteReceipt::Delivered);
    assert_eq!(send("missing@b", 1.0).await, RemoteReceipt::NotFound);
    // The deactivated kernel's lane holds 2: the third finds it full.
    assert_eq!(send("echo@b", 2.0).await, RemoteReceipt::Delivered);
    assert_eq!(send("echo@b", 3.0).await, RemoteReceipt::QueueFull);
    let s = p.a.stats();
    assert_eq!((s.k2k_sent, s.k2k_delivered, s.k2k_refused), (4, 2, 2));
    assert_eq!(s.k2k_in_flight, 0);

    // A payload larger than the destination's slots: refused there, not lost.
    let big = Envelope::from_bytes(<Token as RingMessage>::TYPE_ID, &[0u8; 4096]);
    assert_eq!(
        p.a.send(KernelId::HOST, "echo@b", &big).await.unwrap(),
        RemoteReceipt::Rejected
    );
    // ... and one larger than this bridge's limit: an error here, nothing sent.
    let huge = Envelope::from_bytes(1, &vec![0u8; 64 * 1024 + 1]);
    assert!(matches!(
        p.a.send(KernelId::HOST, "echo@b", &huge).await,
        Err(Error::MessageTooLarge { .. })
    ));
    assert_eq!(p.a.stats().k2k_sent, 5);

    // The two delivered messages are really there, with a's clock merged into b's.
    echo.activate().await.unwrap();
    for _ in 0..2 {
        let env = echo.receive_envelope(Some(WAIT)).await.unwrap();
        assert_eq!(
            env.header.hlc().node() >> 32,
            p.rt_b.core().node_number() as u64
        );
    }
    close(p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_addresses_and_arguments_are_errors() {
    let p = pair(|c| c).await;
    for bad in ["worker", "@b", "worker@", "worker@b/c", "worker@*"] {
        assert!(
            matches!(p.a.remote(bad), Err(Error::InvalidArgument(_))),
            "{bad:?}"
        );
    }
    assert!(matches!(
        p.a.send(KernelId(999), "x@b", &token(1, 1.0)).await,
        Err(Error::KernelNotFound(_))
    ));
    assert!(matches!(p.a.serve("nobody"), Err(Error::KernelNotFound(_))));
    assert!(matches!(
        p.a.publish("a/+", KernelId::HOST, &token(1, 1.0)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        p.a.import_topics("a/#/b").await,
        Err(Error::InvalidArgument(_))
    ));
    // Not connected: refused before sending, counted.
    let ghost = p.a.remote("worker@ghost").unwrap();
    assert!(matches!(
        ghost.try_send(&Token::new(1, 1.0)),
        Err(Error::KernelTerminated(_))
    ));
    assert_eq!(p.a.stats().k2k_unreachable, 1);
    assert_eq!(p.a.stats().k2k_sent, 0);
    close(p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_imports_deliver_once_and_the_dollar_rule_holds() {
    let p = pair(|c| {
        c.import_topics("s/#")
            .import_topics("s/+/t")
            .import_topics("#")
    })
    .await;
    let k = p
        .rt_b
        .launch(builtin::ECHO, LaunchOptions::default().with_name("k"))
        .await
        .unwrap();
    p.rt_b.subscribe(k.id(), "s/+/t").unwrap();
    p.rt_b.subscribe(k.id(), "#").unwrap();
    p.a.publish("s/x/t", KernelId::HOST, &token(1, 1.0))
        .unwrap();
    p.a.publish("$SYS/x", KernelId::HOST, &token(2, 2.0))
        .unwrap();
    p.a.publish("s/x/t", KernelId::HOST, &token(3, 3.0))
        .unwrap();
    eventually("publications arrive", || p.b.stats().topic_received == 3).await;
    let s = p.b.stats();
    assert_eq!(
        s.topic_delivered, 2,
        "once each, though three imports match"
    );
    assert_eq!(s.topic_unmatched, 1, "`#` does not reach `$SYS/x`");
    assert_eq!(s.sequence_gaps, 0);
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(next_token(&k).await.id);
    }
    assert_eq!(ids, vec![1, 3]);
    close(p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_joiner_counts_no_gap_for_what_came_before_it() {
    let p = pair(|c| c.import_topics("t")).await;
    for i in 0..5 {
        p.a.publish("t", KernelId::HOST, &token(i, 0.0)).unwrap();
    }
    eventually("b got the first five", || p.b.stats().topic_received == 5).await;
    let rt_c = CpuRuntime::new().await.unwrap();
    let k = rt_c
        .launch(builtin::ECHO, LaunchOptions::default().with_name("k"))
        .await
        .unwrap();
    rt_c.subscribe(k.id(), "t").unwrap();
    let c = ZenohBridge::start(
        rt_c.core().clone(),
        BridgeConfig::new("c")
            .connect(format!("tcp/127.0.0.1:{}", p.port))
            .import_topics("t"),
    )
    .await
    .unwrap();
    p.a.wait_for_peer("c", WAIT).await.unwrap();
    p.a.publish("t", KernelId::HOST, &token(5, 0.0)).unwrap();
    assert_eq!(next_token(&k).await.id, 5);
    eventually("b got the sixth", || p.b.stats().topic_received == 6).await;
    let (sb, sc) = (p.b.stats(), c.stats());
    assert_eq!((sc.topic_received, sc.sequence_gaps), (1, 0));
    assert_eq!(sb.sequence_gaps, 0);
    c.close().await.unwrap();
    rt_c.shutdown().await.unwrap();
    close(p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_frames_are_counted_never_delivered() {
    let p = pair(|c| c).await;
    let k = p
        .rt_b
        .launch(builtin::ECHO, LaunchOptions::default().with_name("k"))
        .await
        .unwrap();
    let key = "ringkernel/k2k/b/a";
    // Garbage.
    p.a.session().put(key, vec![1u8, 2, 3]).wait().unwrap();
    // A timestamp an hour ahead of every clock: b's clock refuses it.
    let payload = bytemuck::bytes_of(&Token::new(9, 9.0)).to_vec();
    let mut h = MessageHeader::new(<Token as RingMessage>::TYPE_ID, payload.len());
    let future = ringkernel_core::hlc::system_clock_ms() + 3_600_000;
    h.set_hlc(HlcTimestamp::new(future, 0).with_node(1 << 32));
    let mut frame = Vec::new();
    wire::encode_k2k(
        &mut frame,
        &K2kFrame {
            epoch: 1,
            seq: 0,
            src_kernel: 0,
            src_name: "",
            dest_id: 0,
            dest_name: "k",
            header: h,
            payload: &payload,
        },
    )
    .unwrap();
    p.a.session().put(key, frame).wait().unwrap();
    eventually("both frames seen", || {
        let s = p.b.stats();
        s.malformed == 1 && s.clock_rejected == 1
    })
    .await;
    const { assert!(DEFAULT_MAX_DRIFT_MS < 3_600_000) };
    assert!(
        p.rt_b.core().hlc().tick().physical_ms() < future,
        "b's clock not dragged ahead"
    );
    assert!(k
        .receive_envelope(Some(Duration::from_millis(200)))
        .await
        .is_err());
    // b answered the forged frame with a receipt for an epoch a never used.
    eventually("stale receipt counted", || p.a.stats().late_receipts == 1).await;
    close(p).await;
}

async fn close(p: Pair) {
    let sa = p.a.close().await.unwrap();
    let sb = p.b.close().await.unwrap();
    for s in [sa, sb] {
        assert_eq!(
            s.k2k_sent,
            s.k2k_delivered + s.k2k_refused + s.k2k_lost + s.k2k_in_flight
        );
    }
    p.rt_a.shutdown().await.unwrap();
    p.rt_b.shutdown().await.unwrap();
}
