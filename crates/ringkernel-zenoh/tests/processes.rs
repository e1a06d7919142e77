//! Bridges in separate processes on 127.0.0.1: the test process is node `a`; it starts
//! copies of this test binary as children (the ignored `child_process_entry` test,
//! told its role through environment variables), each a runtime with its own bridge.
//! Ports come from the OS (bind port 0, read it back), so parallel tests don't clash.

mod common;
use common::{eventually, free_port, WAIT};

use ringkernel_core::context::KernelContext;
use ringkernel_core::hlc::{HlcClock, HlcTimestamp};
use ringkernel_core::k2k::K2kReceipt;
use ringkernel_core::message::Envelope;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::runtime::{KernelHandle, KernelId, RingKernelRuntime};
use ringkernel_core::Error;
use ringkernel_cpu::CpuRuntime;
use ringkernel_derive::{ring_kernel, RingMessage};
use ringkernel_zenoh::{BridgeConfig, PeerEvent, RemoteReceipt, ZenohBridge};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
#[message(type_id = 0x2E00_0001)]
#[repr(C)]
struct Req {
    seq: u64,
    value: f64,
    /// A timestamp the sender's runtime clock gave just before sending (a lower
    /// bound of the send event's timestamp).
    sent_time: u64,
    sent_node: u64,
}

impl Req {
    fn new(seq: u64, value: f64) -> Self {
        Req {
            seq,
            value,
            sent_time: 0,
            sent_node: 0,
        }
    }
    fn stamped(seq: u64, value: f64, clock: &HlcClock) -> Self {
        let ts = clock.tick();
        Req {
            seq,
            value,
            sent_time: ts.packed(),
            sent_node: ts.node(),
        }
    }
}

/// What a kernel answers: the request's value, its `sent` timestamp, and the
/// receive event's timestamp (the handling kernel's clock after merging the request).
#[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
#[message(type_id = 0x2E00_0002)]
#[repr(C)]
struct Resp {
    seq: u64,
    value: f64,
    sent_time: u64,
    sent_node: u64,
    received_time: u64,
    received_node: u64,
}

impl Resp {
    fn sent(&self) -> HlcTimestamp {
        HlcTimestamp::from_parts(self.sent_time, self.sent_node)
    }
    fn received(&self) -> HlcTimestamp {
        HlcTimestamp::from_parts(self.received_time, self.received_node)
    }
}

fn answer(ctx: &KernelContext<'_>, m: Req, value: f64) -> Resp {
    let ts = ctx.request_timestamp();
    Resp {
        seq: m.seq,
        value,
        sent_time: m.sent_time,
        sent_node: m.sent_node,
        received_time: ts.packed(),
        received_node: ts.node(),
    }
}

/// Doubles the value; the reply goes back to the caller (over the bridge when the
/// kernel is served).
#[ring_kernel(name = "zt.worker")]
fn worker(ctx: &mut KernelContext<'_>, m: Req) -> Option<Resp> {
    Some(answer(ctx, m, m.value * 2.0))
}

/// Keeps what it receives, for the host to read from its output queue.
#[ring_kernel(name = "zt.collect")]
fn collect(ctx: &mut KernelContext<'_>, m: Req) -> Option<Resp> {
    Some(answer(ctx, m, m.value))
}

/// Answers a command publication with a K2K message to the kernel `inbox` of node
/// `a`, from inside a handler.
#[ring_kernel(name = "zt.command")]
fn command(ctx: &mut KernelContext<'_>, m: Req) -> Option<Resp> {
    let r = answer(ctx, m, -m.value);
    let fwd = Req::stamped(1000 + m.seq, r.value, ctx.clock());
    match ctx.send_to("inbox@a", &fwd) {
        Ok(K2kReceipt::Delivered) => None,
        other => panic!("send_to inbox@a: {other:?}"),
    }
}

fn launch_opts(name: &str) -> LaunchOptions {
    LaunchOptions::default()
        .with_name(name)
        .with_queue_capacity(4096)
}

/// A child process, killed if the test ends early.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(node: &str, parent_port: u16) -> ChildGuard {
    spawn_child_with(node, parent_port, &[])
}

fn spawn_child_with(node: &str, parent_port: u16, env: &[(&str, &str)]) -> ChildGuard {
    let exe = std::env::current_exe().expect("test binary");
    let child = Command::new(exe)
        .envs(env.iter().copied())
        .args([
            "child_process_entry",
            "--exact",
            "--include-ignored",
            "--nocapture",
        ])
        .env("RK_ZENOH_CHILD_NODE", node)
        .env(
            "RK_ZENOH_CHILD_CONNECT",
            format!("tcp/127.0.0.1:{parent_port}"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    ChildGuard(child)
}

async fn parent(port: u16, imports: &[&str]) -> (CpuRuntime, ZenohBridge) {
    let rt = CpuRuntime::new().await.unwrap();
    let mut config = BridgeConfig::new("a").listen(format!("tcp/127.0.0.1:{port}"));
    for f in imports {
        config = config.import_topics(*f);
    }
    let bridge = ZenohBridge::start(rt.core().clone(), config).await.unwrap();
    (rt, bridge)
}

async fn receive_resps(k: &KernelHandle, n: usize) -> Vec<(Envelope, Resp)> {
    let mut out = Vec::new();
    while out.len() < n {
        let env = k.receive_envelope(Some(WAIT)).await.unwrap();
        let r: Resp = env.decode().unwrap();
        out.push((env, r));
    }
    out
}

/// Waits for the report that `node` was lost; returns how many K2K messages to it were
/// still in flight.
async fn lost_event(events: &mut tokio::sync::broadcast::Receiver<PeerEvent>, node: &str) -> u64 {
    loop {
        let event = tokio::time::timeout(WAIT, events.recv())
            .await
            .unwrap()
            .unwrap();
        if let PeerEvent::Lost {
            node: n,
            in_flight_lost,
        } = event
        {
            if n == node {
                return in_flight_lost;
            }
        }
    }
}

/// Waits until every K2K message sent has its receipt (a reply can overtake the
/// receipt of its request).
async fn settle(bridge: &ZenohBridge) {
    eventually("receipts come", || bridge.stats().k2k_in_flight == 0).await;
}

fn wait_exit(mut child: ChildGuard) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(status.success(), "child failed: {status}");
            return;
        }
        assert!(Instant::now() < deadline, "child did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2k_and_topics_cross_both_ways_in_order_with_causal_clocks() {
    let port = free_port();
    let (rt, bridge) = parent(port, &["sensors/#"]).await;
    let inbox = rt.launch("zt.collect", launch_opts("inbox")).await.unwrap();
    let temps = rt.launch("zt.collect", launch_opts("temps")).await.unwrap();
    rt.subscribe(temps.id(), "sensors/+/temp").unwrap();
    let child = spawn_child("b", port);
    bridge.wait_for_peer("b", WAIT).await.unwrap();

    // a -> b: a call through the stand-in of b's served kernel.
    let worker = bridge.remote("worker@b").unwrap();
    let r: Resp = worker.call(Req::new(7, 21.0), WAIT).await.unwrap();
    assert_eq!((r.seq, r.value), (7, 42.0));

    // Causality, a -> b -> a: a's send, b's worker receiving it, b's reply, a after
    // receiving the reply, each strictly after the one before.
    let a_clock = rt.core().hlc();
    let a_node = a_clock.node_id() >> 32;
    let sent_id = worker.send(Req::stamped(8, 1.0, a_clock)).await.unwrap();
    let (env, r) = receive_resps(&worker, 1).await.remove(0);
    assert_eq!((env.header.correlation_id, r.seq), (sent_id, 8));
    let reply_ts = env.header.hlc();
    assert_eq!(r.sent().node() >> 32, a_node, "sent on a");
    assert_ne!(r.received().node() >> 32, a_node, "received on b");
    assert_ne!(reply_ts.node() >> 32, a_node, "replied on b");
    assert!(r.sent() < r.received(), "received after sent");
    assert!(r.received() < reply_ts, "replied after received");
    assert!(reply_ts < a_clock.tick(), "a's clock merged the reply");

    // Per-sender order, both directions: 2000 requests, their replies in order.
    let n = 2000;
    for i in 0..n {
        worker.send(Req::new(100 + i, i as f64)).await.unwrap();
    }
    let replies = receive_resps(&worker, n as usize).await;
    let seqs: Vec<u64> = replies.iter().map(|(_, r)| r.seq).collect();
    assert_eq!(seqs, (100..100 + n).collect::<Vec<_>>());
    assert!(replies
        .windows(2)
        .all(|w| w[0].0.header.hlc() < w[1].0.header.hlc()));

    // b -> a: 100 K2K messages from b's host with receipts, 10 publications on a
    // subscribed topic, 1 on a topic nobody here subscribes to, then the command
    // below; b's child checks its receipts itself.
    let got = receive_resps(&inbox, 100).await;
    for (i, (_, r)) in got.iter().enumerate() {
        assert_eq!(r.seq, i as u64, "b's messages in order");
        assert_ne!(r.sent().node() >> 32, a_node, "sent on b");
        assert_eq!(r.received().node() >> 32, a_node, "received on a");
        assert!(r.sent() < r.received(), "b -> a: received after sent");
    }
    let pubs = receive_resps(&temps, 10).await;
    assert_eq!(
        pubs.iter().map(|(_, r)| r.seq).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );

    // a -> b on a topic: b's `command` kernel answers from its handler with
    // send_to("inbox@a").
    let report = bridge
        .publish(
            "cmd/b/go",
            KernelId::HOST,
            &Envelope::new(&Req::new(5, 3.0)),
        )
        .unwrap();
    assert_eq!(report.delivered, 0, "no local subscriber");
    let (_, r) = receive_resps(&inbox, 1).await.remove(0);
    assert_eq!((r.seq, r.value), (1005, -3.0));
    assert!(
        r.sent() < r.received(),
        "b's handler -> a: received after sent"
    );

    settle(&bridge).await;
    let s = bridge.stats();
    assert_eq!(s.topic_received, 11);
    assert_eq!(s.topic_delivered, 10);
    assert_eq!(s.topic_unmatched, 1, "the humidity publication");
    assert_eq!(s.sequence_gaps, 0);
    assert_eq!(s.k2k_received, 101 + 2 + n, "100 sends, 1 command, replies");
    assert_eq!(s.k2k_sent, 2 + n);
    assert_eq!(s.k2k_lost, 0);
    assert_eq!(s.malformed, 0);

    // Closing a makes b see it lost; b then exits by itself, successfully.
    bridge.close().await.unwrap();
    wait_exit(child);
    rt.shutdown().await.unwrap();
}

fn signal(child: &ChildGuard, sig: libc::c_int) {
    // SAFETY: kill(2) with the pid of a child this test spawned and has not reaped
    // (the guard waits for it only on drop); it touches no memory of ours.
    let rc = unsafe { libc::kill(child.0.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({sig})");
}

/// Waits until every thread of the child is stopped (a signal takes effect
/// asynchronously: until then the child may still answer).
fn wait_stopped(child: &ChildGuard) {
    let tasks = format!("/proc/{}/task", child.0.id());
    let deadline = Instant::now() + WAIT;
    loop {
        let stopped = std::fs::read_dir(&tasks).unwrap().all(|t| {
            let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        });
        if stopped {
            return;
        }
        assert!(Instant::now() < deadline, "child did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_peer_is_reported_and_its_in_flight_messages_counted() {
    let port = free_port();
    let (_rt, bridge) = parent(port, &[]).await;
    let mut events = bridge.events();
    let doomed = spawn_child("c", port);
    let survivor = spawn_child("d", port);
    bridge.wait_for_peer("c", WAIT).await.unwrap();
    bridge.wait_for_peer("d", WAIT).await.unwrap();
    let to_c = bridge.remote("worker@c").unwrap();
    let to_d = bridge.remote("worker@d").unwrap();
    let r: Resp = to_c.call(Req::new(1, 1.0), WAIT).await.unwrap();
    assert_eq!(r.value, 2.0);
    settle(&bridge).await;
    let acked = bridge.stats();
    assert_eq!(
        acked.k2k_sent, acked.k2k_delivered,
        "everything acknowledged so far"
    );

    // Freeze c (its connection stays open, it answers nothing), send, then kill it.
    signal(&doomed, libc::SIGSTOP);
    wait_stopped(&doomed);
    let in_flight = 50;
    for i in 0..in_flight {
        to_c.send(Req::new(i, 0.0)).await.unwrap();
    }
    let killed_at = Instant::now();
    signal(&doomed, libc::SIGKILL);
    let lost = lost_event(&mut events, "c").await;
    let detection = killed_at.elapsed();
    eprintln!("peer c reported lost {detection:?} after SIGKILL");
    assert_eq!(lost, in_flight);
    let s = bridge.stats();
    assert_eq!(s.k2k_lost, in_flight);
    assert_eq!(s.k2k_in_flight, 0);
    assert_eq!(
        s.k2k_sent,
        s.k2k_delivered + s.k2k_refused + s.k2k_lost + s.k2k_in_flight
    );
    assert_eq!(s.peers_lost, 1);
    assert_eq!(bridge.peers(), vec!["d".to_string()]);

    // Sends to c are refused now, visibly; d still works.
    assert!(matches!(
        to_c.try_send(&Req::new(0, 0.0)),
        Err(Error::KernelTerminated(_))
    ));
    assert_eq!(bridge.stats().k2k_unreachable, 1);
    let receipt = bridge
        .send(
            KernelId::HOST,
            "nobody@d",
            &Envelope::new(&Req::new(0, 0.0)),
        )
        .await
        .unwrap();
    assert_eq!(
        receipt,
        RemoteReceipt::NotFound,
        "d answers for a kernel it lacks"
    );
    let r: Resp = to_d.call(Req::new(2, 4.0), WAIT).await.unwrap();
    assert_eq!(r.value, 8.0);
    settle(&bridge).await;
    let s = bridge.stats();
    assert_eq!((s.k2k_refused, s.k2k_lost), (1, in_flight));
    assert_eq!(
        s.k2k_sent,
        s.k2k_delivered + s.k2k_refused + s.k2k_lost + s.k2k_in_flight
    );

    drop(doomed);
    bridge.close().await.unwrap();
    wait_exit(survivor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_peer_is_reported_when_its_lease_runs_out() {
    let port = free_port();
    let rt = CpuRuntime::new().await.unwrap();
    let lease = Duration::from_millis(1000);
    let bridge = ZenohBridge::start(
        rt.core().clone(),
        BridgeConfig::new("a")
            .listen(format!("tcp/127.0.0.1:{port}"))
            .lease(lease),
    )
    .await
    .unwrap();
    let mut events = bridge.events();
    let hung = spawn_child_with("h", port, &[("RK_ZENOH_CHILD_LEASE_MS", "1000")]);
    bridge.wait_for_peer("h", WAIT).await.unwrap();
    let to_h = bridge.remote("worker@h").unwrap();
    let r: Resp = to_h.call(Req::new(1, 1.0), WAIT).await.unwrap();
    assert_eq!(r.value, 2.0);
    settle(&bridge).await;
    // Frozen: its connection stays open, but it sends nothing, keep-alives included.
    signal(&hung, libc::SIGSTOP);
    wait_stopped(&hung);
    for i in 0..5 {
        to_h.send(Req::new(i, 0.0)).await.unwrap();
    }
    let stopped_at = Instant::now();
    let lost = lost_event(&mut events, "h").await;
    let after = stopped_at.elapsed();
    eprintln!("hung peer h reported lost {after:?} after it froze (lease {lease:?})");
    assert_eq!(lost, 5);
    assert!(after < lease * 5, "{after:?}");
    let s = bridge.stats();
    assert_eq!(
        s.k2k_sent,
        s.k2k_delivered + s.k2k_refused + s.k2k_lost + s.k2k_in_flight
    );
    drop(hung);
    bridge.close().await.unwrap();
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_is_a_clear_error() {
    let rt = CpuRuntime::new().await.unwrap();
    let core = rt.core().clone();
    let start = |c: BridgeConfig| ZenohBridge::start(core.clone(), c);

    let e = start(BridgeConfig::new("x").listen("tcp/127.0.0.1:notaport"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = start(BridgeConfig::new("x").connect("carrier-pigeon/a:1"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");

    // A port another program holds.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let e = start(BridgeConfig::new("x").listen(format!("tcp/127.0.0.1:{port}")))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.contains("listen")),
        "{e}"
    );
    drop(held);

    // A peer that does not answer: a clear timeout, in about the time asked for.
    let silent = free_port();
    let t = Instant::now();
    let e = start(
        BridgeConfig::new("x")
            .connect(format!("tcp/127.0.0.1:{silent}"))
            .connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert_eq!(e, Error::Timeout(Duration::from_millis(500)));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

    // Two bridges with one name.
    let port = free_port();
    let first = start(BridgeConfig::new("twin").listen(format!("tcp/127.0.0.1:{port}")))
        .await
        .unwrap();
    let rt2 = CpuRuntime::new().await.unwrap();
    let e = ZenohBridge::start(
        rt2.core().clone(),
        BridgeConfig::new("twin").connect(format!("tcp/127.0.0.1:{port}")),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.contains("twin")),
        "{e}"
    );
    first.close().await.unwrap();
}

/// The child's side: a runtime with a served `worker`, a `command` kernel subscribed
/// to `cmd/<node>/+`, and a bridge connected to node `a`. It sends 100 messages to
/// `inbox@a` (checking each receipt) and 11 publications, then waits until `a`
/// disappears and exits (non-zero on any failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process entry: the other tests of this file start it"]
async fn child_process_entry() {
    let (Ok(node), Ok(connect)) = (
        std::env::var("RK_ZENOH_CHILD_NODE"),
        std::env::var("RK_ZENOH_CHILD_CONNECT"),
    ) else {
        return; // run by hand, not as a child
    };
    let rt = CpuRuntime::new().await.unwrap();
    let worker = rt.launch("zt.worker", launch_opts("worker")).await.unwrap();
    let command = rt
        .launch("zt.command", launch_opts("command"))
        .await
        .unwrap();
    rt.subscribe(command.id(), &format!("cmd/{node}/+"))
        .unwrap();
    let mut config = BridgeConfig::new(node.clone())
        .connect(connect)
        .import_topics("cmd/#");
    if let Ok(ms) = std::env::var("RK_ZENOH_CHILD_LEASE_MS") {
        config = config.lease(Duration::from_millis(ms.parse().unwrap()));
    }
    let bridge = ZenohBridge::start(rt.core().clone(), config).await.unwrap();
    let mut events = bridge.events();
    bridge.serve(worker.id()).unwrap();
    bridge.remote("inbox@a").unwrap();
    bridge.wait_for_peer("a", WAIT).await.unwrap();

    if node == "b" {
        for i in 0..100u64 {
            let env = Envelope::new(&Req::stamped(i, i as f64, rt.core().hlc()));
            let r = bridge.send(KernelId::HOST, "inbox@a", &env).await.unwrap();
            assert_eq!(r, RemoteReceipt::Delivered);
        }
        for i in 0..10u64 {
            let env = Envelope::new(&Req::stamped(i, 20.0 + i as f64, rt.core().hlc()));
            bridge
                .publish(&format!("sensors/{node}/temp"), KernelId::HOST, &env)
                .unwrap();
        }
        let env = Envelope::new(&Req::new(99, 0.0));
        bridge
            .publish(&format!("sensors/{node}/humidity"), KernelId::HOST, &env)
            .unwrap();
    }
    loop {
        match tokio::time::timeout(Duration::from_secs(120), events.recv()).await {
            Ok(Ok(PeerEvent::Lost { node, .. })) if node == "a" => break,
            Ok(_) => {}
            Err(_) => panic!("node a never went away"),
        }
    }
    let s = bridge.stats();
    assert_eq!(s.sequence_gaps, 0);
    assert_eq!(s.malformed, 0);
    bridge.close().await.unwrap();
    rt.shutdown().await.unwrap();
}
