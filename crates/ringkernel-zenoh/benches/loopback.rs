//! Loopback throughput and latency of the bridge beside plain Zenoh pub/sub, in the
//! same run, with the same process layout (this process and one child started from
//! the same binary, one TCP connection on 127.0.0.1) and the same 32-byte payload.
//!
//! ```sh
//! cargo bench -p ringkernel-zenoh --bench loopback            # 200k messages, 5k round trips
//! RK_BENCH_MESSAGES=20000 RK_BENCH_ROUND_TRIPS=1000 cargo bench -p ringkernel-zenoh --bench loopback
//! ```
//!
//! * **Throughput.** Bridge: K2K messages from the host to a kernel of the other
//!   process, until every one has its `Delivered` receipt. Plain Zenoh: puts to a key
//!   the other process subscribes to, until it reports the last one back.
//! * **Round trip.** Bridge: `call` on the stand-in of a served kernel that answers
//!   (request and reply each through a kernel queue and the bridge). Plain Zenoh: a put
//!   answered by a put from the other process's subscriber callback.

use ringkernel_core::context::KernelContext;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_cpu::CpuRuntime;
use ringkernel_derive::{ring_kernel, RingMessage};
use ringkernel_zenoh::zenoh::{self, qos::CongestionControl, Wait};
use ringkernel_zenoh::{BridgeConfig, PeerEvent, ZenohBridge};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, RingMessage)]
#[message(type_id = 0x2E00_0101)]
#[repr(C)]
struct Msg {
    seq: u64,
    a: u64,
    b: u64,
    c: u64,
}

#[ring_kernel(name = "bench.sink")]
fn sink(_ctx: &mut KernelContext<'_>, _m: Msg) -> Option<Msg> {
    None
}

#[ring_kernel(name = "bench.echo")]
fn echo(_ctx: &mut KernelContext<'_>, m: Msg) -> Option<Msg> {
    Some(m)
}

const PAYLOAD: usize = std::mem::size_of::<Msg>();

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn plain_config(listen: Option<u16>, connect: Option<u16>) -> zenoh::Config {
    let mut c = zenoh::Config::default();
    c.insert_json5("mode", "\"peer\"").unwrap();
    c.insert_json5("scouting/multicast/enabled", "false")
        .unwrap();
    if let Some(p) = listen {
        c.insert_json5("listen/endpoints", &format!("[\"tcp/127.0.0.1:{p}\"]"))
            .unwrap();
    }
    if let Some(p) = connect {
        c.insert_json5("connect/endpoints", &format!("[\"tcp/127.0.0.1:{p}\"]"))
            .unwrap();
    }
    c
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The child: a bridge with a `sink` and a served `echo` kernel, and a plain Zenoh
/// session that counts puts and answers pings. Exits when the parent's bridge goes.
async fn child(bridge_port: u16, plain_port: u16) {
    let rt = CpuRuntime::new().await.unwrap();
    let opts = |n: &str| {
        LaunchOptions::default()
            .with_name(n)
            .with_queue_capacity(8192)
    };
    rt.launch("bench.sink", opts("sink")).await.unwrap();
    let echo = rt.launch("bench.echo", opts("echo")).await.unwrap();
    let bridge = ZenohBridge::start(
        rt.core().clone(),
        BridgeConfig::new("child").connect(format!("tcp/127.0.0.1:{bridge_port}")),
    )
    .await
    .unwrap();
    bridge.serve(echo.id()).unwrap();
    let mut events = bridge.events();

    let plain = zenoh::open(plain_config(None, Some(plain_port)))
        .await
        .unwrap();
    let pong = plain
        .declare_publisher("bench/plain/pong")
        .congestion_control(CongestionControl::Block)
        .await
        .unwrap();
    let _ping = plain
        .declare_subscriber("bench/plain/ping")
        .callback(move |s| pong.put(s.payload().clone()).wait().unwrap())
        .await
        .unwrap();
    let done = plain
        .declare_publisher("bench/plain/done")
        .congestion_control(CongestionControl::Block)
        .await
        .unwrap();
    let expected = env_usize("RK_BENCH_MESSAGES", 200_000) as u64;
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    let _sink = plain
        .declare_subscriber("bench/plain/sink")
        .callback(move |_| {
            if c.fetch_add(1, Ordering::Relaxed) + 1 == expected {
                done.put(vec![1u8]).wait().unwrap();
            }
        })
        .await
        .unwrap();
    // Plain Zenoh is ready once its subscribers are declared; the bridge announces
    // itself now, after them.
    let _ready = plain
        .liveliness()
        .declare_token("bench/plain/child")
        .await
        .unwrap();
    loop {
        match events.recv().await {
            Ok(PeerEvent::Lost { node, .. }) if node == "parent" => break,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    plain.close().await.unwrap();
    bridge.close().await.unwrap();
}

async fn parent(messages: usize, round_trips: usize) {
    let bridge_port = free_port();
    let plain_port = free_port();
    let rt = CpuRuntime::new().await.unwrap();
    let bridge = ZenohBridge::start(
        rt.core().clone(),
        BridgeConfig::new("parent")
            .listen(format!("tcp/127.0.0.1:{bridge_port}"))
            .max_in_flight(8192),
    )
    .await
    .unwrap();
    let plain = zenoh::open(plain_config(Some(plain_port), None))
        .await
        .unwrap();
    let liveliness = plain
        .liveliness()
        .declare_subscriber("bench/plain/child")
        .history(true)
        .await
        .unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("RK_BENCH_CHILD", format!("{bridge_port}:{plain_port}"))
        .env("RK_BENCH_MESSAGES", messages.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    bridge
        .wait_for_peer("child", Duration::from_secs(30))
        .await
        .unwrap();
    liveliness.recv_async().await.unwrap();

    // --- Throughput -------------------------------------------------------------
    let msg = |seq: u64| Msg {
        seq,
        a: 1,
        b: 2,
        c: 3,
    };
    let sink = bridge.remote("sink@child").unwrap();
    let t = Instant::now();
    for i in 0..messages as u64 {
        sink.send(msg(i)).await.unwrap();
    }
    while bridge.stats().k2k_delivered < messages as u64 {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let bridge_tput = messages as f64 / t.elapsed().as_secs_f64();
    let s = bridge.stats();
    assert_eq!((s.k2k_refused, s.k2k_lost), (0, 0));

    let done = plain.declare_subscriber("bench/plain/done").await.unwrap();
    let put = plain
        .declare_publisher("bench/plain/sink")
        .congestion_control(CongestionControl::Block)
        .await
        .unwrap();
    let payload = bytemuck::bytes_of(&msg(0)).to_vec();
    let t = Instant::now();
    for _ in 0..messages {
        put.put(payload.clone()).await.unwrap();
    }
    done.recv_async().await.unwrap();
    let plain_tput = messages as f64 / t.elapsed().as_secs_f64();

    // --- Round trip -------------------------------------------------------------
    let echo = bridge.remote("echo@child").unwrap();
    let mut bridge_rtt = Vec::with_capacity(round_trips);
    for i in 0..(round_trips + round_trips / 10) as u64 {
        let t = Instant::now();
        let r: Msg = echo.call(msg(i), Duration::from_secs(5)).await.unwrap();
        assert_eq!(r.seq, i);
        if i as usize >= round_trips / 10 {
            bridge_rtt.push(t.elapsed()); // after a 10% warm-up
        }
    }
    let pong = plain.declare_subscriber("bench/plain/pong").await.unwrap();
    let ping = plain
        .declare_publisher("bench/plain/ping")
        .congestion_control(CongestionControl::Block)
        .await
        .unwrap();
    let mut plain_rtt = Vec::with_capacity(round_trips);
    for i in 0..round_trips + round_trips / 10 {
        let t = Instant::now();
        ping.put(payload.clone()).await.unwrap();
        pong.recv_async().await.unwrap();
        if i >= round_trips / 10 {
            plain_rtt.push(t.elapsed());
        }
    }
    bridge_rtt.sort();
    plain_rtt.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (b50, b99) = (
        us(percentile(&bridge_rtt, 0.5)),
        us(percentile(&bridge_rtt, 0.99)),
    );
    let (p50, p99) = (
        us(percentile(&plain_rtt, 0.5)),
        us(percentile(&plain_rtt, 0.99)),
    );
    println!("loopback, {PAYLOAD}-byte payload, {messages} messages, {round_trips} round trips");
    println!("| what | bridge | plain zenoh | bridge/plain |");
    println!("|---|---|---|---|");
    println!(
        "| throughput (msgs/s) | {bridge_tput:.0} | {plain_tput:.0} | {:.2}x |",
        bridge_tput / plain_tput
    );
    println!(
        "| round trip p50 (us) | {b50:.1} | {p50:.1} | {:.2}x |",
        b50 / p50
    );
    println!(
        "| round trip p99 (us) | {b99:.1} | {p99:.1} | {:.2}x |",
        b99 / p99
    );
    bridge.close().await.unwrap();
    plain.close().await.unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
    rt.shutdown().await.unwrap();
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this as a smoke test.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(ports) = std::env::var("RK_BENCH_CHILD") {
        let (b, p) = ports.split_once(':').unwrap();
        rt.block_on(child(b.parse().unwrap(), p.parse().unwrap()));
        return;
    }
    let (messages, round_trips) = if smoke {
        (2_000, 100)
    } else {
        (
            env_usize("RK_BENCH_MESSAGES", 200_000),
            env_usize("RK_BENCH_ROUND_TRIPS", 5_000),
        )
    };
    rt.block_on(parent(messages, round_trips));
}
