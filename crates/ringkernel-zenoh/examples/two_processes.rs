//! Two processes, two runtimes, one Zenoh connection on 127.0.0.1.
//!
//! ```sh
//! cargo run -p ringkernel-zenoh --example two_processes
//! ```
//!
//! This process is node `hub`: it listens, then starts a copy of itself as node `edge`,
//! which connects. `edge` serves a `doubler` kernel; `hub` calls it by the address
//! `doubler@edge`. `edge` publishes temperatures on `sensors/edge/temp`; a `log`
//! kernel of `hub` is subscribed to `sensors/+/temp`. Every message carries its
//! sender's HLC timestamp, which the receiving runtime merges.

use ringkernel_core::context::KernelContext;
use ringkernel_core::message::Envelope;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::runtime::{KernelId, RingKernelRuntime};
use ringkernel_cpu::CpuRuntime;
use ringkernel_derive::{ring_kernel, RingMessage};
use ringkernel_zenoh::{BridgeConfig, PeerEvent, ZenohBridge};
use std::time::Duration;

#[derive(Clone, Copy, Debug, RingMessage)]
#[message(type_id = 0x2E00_0201)]
#[repr(C)]
struct Reading {
    id: u64,
    value: f64,
}

#[ring_kernel(name = "example.doubler")]
fn doubler(_ctx: &mut KernelContext<'_>, r: Reading) -> Option<Reading> {
    Some(Reading {
        id: r.id,
        value: r.value * 2.0,
    })
}

#[ring_kernel(name = "example.log")]
fn log(_ctx: &mut KernelContext<'_>, r: Reading) -> Option<Reading> {
    Some(r) // to the output queue, where the host reads it
}

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

async fn hub() -> Res<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let rt = CpuRuntime::new().await?;
    let log = rt
        .launch("example.log", LaunchOptions::default().with_name("log"))
        .await?;
    rt.subscribe(log.id(), "sensors/+/temp")?;
    let config = BridgeConfig::new("hub")
        .listen(format!("tcp/127.0.0.1:{port}"))
        .import_topics("sensors/#");
    let bridge = ZenohBridge::start(rt.core().clone(), config).await?;

    let mut edge = std::process::Command::new(std::env::current_exe()?)
        .env("EXAMPLE_EDGE_CONNECT", format!("tcp/127.0.0.1:{port}"))
        .spawn()?;
    bridge
        .wait_for_peer("edge", Duration::from_secs(20))
        .await?;
    println!("hub: edge connected");

    // K2K across processes: a call to the kernel `doubler` of node `edge`.
    let doubler = bridge.remote("doubler@edge")?;
    let sent = rt.core().hlc().tick();
    let r: Reading = doubler
        .call(Reading { id: 1, value: 21.0 }, Duration::from_secs(5))
        .await?;
    println!("hub: doubler@edge answered {} for 21", r.value);
    assert_eq!(r.value, 42.0);

    // Topics across processes: edge publishes three readings.
    for _ in 0..3 {
        let env = log.receive_envelope(Some(Duration::from_secs(5))).await?;
        let r: Reading = env.decode()?;
        println!(
            "hub: log got reading {} = {} (timestamp {})",
            r.id,
            r.value,
            env.header.hlc()
        );
    }
    // The hub's clock has merged everything edge sent: it is now ahead of it all.
    assert!(rt.core().hlc().tick() > sent);

    let stats = bridge.close().await?;
    println!(
        "hub: K2K sent {}, delivered {}, lost {}; publications received {}",
        stats.k2k_sent, stats.k2k_delivered, stats.k2k_lost, stats.topic_received
    );
    assert!(edge.wait()?.success());
    rt.shutdown().await?;
    Ok(())
}

async fn edge(connect: String) -> Res<()> {
    let rt = CpuRuntime::new().await?;
    let doubler = rt
        .launch(
            "example.doubler",
            LaunchOptions::default().with_name("doubler"),
        )
        .await?;
    let bridge = ZenohBridge::start(
        rt.core().clone(),
        BridgeConfig::new("edge").connect(connect),
    )
    .await?;
    let mut events = bridge.events();
    bridge.serve(doubler.id())?; // replies to remote callers go back to them
    bridge.wait_for_peer("hub", Duration::from_secs(20)).await?;
    for id in 0..3u64 {
        let env = Envelope::new(&Reading {
            id,
            value: 20.0 + id as f64 / 10.0,
        });
        bridge.publish("sensors/edge/temp", KernelId::HOST, &env)?;
    }
    // Stay until the hub goes away.
    while let Ok(event) = events.recv().await {
        if let PeerEvent::Lost { node, .. } = event {
            if node == "hub" {
                break;
            }
        }
    }
    println!("edge: hub gone, exiting");
    bridge.close().await?;
    rt.shutdown().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    match std::env::var("EXAMPLE_EDGE_CONNECT") {
        Ok(connect) => edge(connect).await,
        Err(_) => hub().await,
    }
}
