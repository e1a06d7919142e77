//! The seed README's "Hybrid Logical Clocks" example, compiled as written after
//! `use ringkernel::prelude::*;` and run.
//!
//! The fragment presumes a `node_id` and a `receive_timestamp()`; here the remote
//! timestamp comes from a second clock (another node) running a little ahead, so the
//! merge has something to do. The other tests pin down the order the example relies
//! on: (physical, logical, node), distinct nodes never tie, drift is refused.

use ringkernel::core::hlc::system_clock_ms;
use ringkernel::prelude::*;
use std::time::Duration;

/// A remote node whose wall clock runs 20 ms ahead of ours (well inside the drift
/// allowed by default).
const REMOTE_NODE: u64 = 0xBEEF;

fn remote_wall_clock() -> u64 {
    system_clock_ms() + 20
}

/// A timestamp "received" from the remote node.
fn receive_timestamp() -> HlcTimestamp {
    HlcClock::with_physical_clock(REMOTE_NODE, remote_wall_clock, 1_000).tick()
}

/// What the fragment computed.
struct Stamps {
    ts1: HlcTimestamp,
    ts2: HlcTimestamp,
    remote_ts: HlcTimestamp,
    synced: HlcTimestamp,
    after: HlcTimestamp,
}

/// The fragment, unchanged, with the `node_id` it presumes.
fn hlc_example(node_id: u64) -> Result<Stamps, Box<dyn std::error::Error>> {
    let clock = HlcClock::new(node_id);

    let ts1 = clock.tick();
    let ts2 = clock.tick();
    assert!(ts1 < ts2);

    let remote_ts = receive_timestamp();
    let synced = clock.update(&remote_ts)?;

    Ok(Stamps {
        ts1,
        ts2,
        remote_ts,
        synced,
        after: clock.tick(),
    })
}

#[test]
fn hlc_example_runs_as_written() {
    let node_id = 7;
    let s = hlc_example(node_id).expect("the HLC example");
    assert!(s.ts1 < s.ts2);
    for ts in [s.ts1, s.ts2, s.synced, s.after] {
        assert_eq!(ts.node(), node_id, "local stamps carry the local node id");
    }
    assert_eq!(s.remote_ts.node(), REMOTE_NODE);
    // The merge lands after both the remote stamp and everything local before it,
    // and the clock keeps counting from there.
    assert!(s.synced > s.remote_ts);
    assert!(s.synced > s.ts2);
    assert!(s.after > s.synced);
    // The remote clock was ahead, so the merged physical part is the remote one.
    assert!(s.synced.physical_ms() >= s.remote_ts.physical_ms());
}

fn frozen() -> u64 {
    1_000
}

#[test]
fn clocks_of_two_nodes_never_tie() {
    // Same physical time, same counter: only the node tells the stamps apart.
    let a = HlcClock::with_physical_clock(1, frozen, 50);
    let b = HlcClock::with_physical_clock(2, frozen, 50);
    for _ in 0..1_000 {
        let (x, y) = (a.tick(), b.tick());
        assert_ne!(x, y);
        assert_eq!(x.packed(), y.packed());
        assert!(x < y, "equal (physical, logical): ordered by node");
    }
    // Physical time first, then the logical counter, then the node.
    assert!(HlcTimestamp::new(5, 9).with_node(99) < HlcTimestamp::new(6, 0).with_node(0));
    assert!(HlcTimestamp::new(5, 1).with_node(99) < HlcTimestamp::new(5, 2).with_node(0));
}

#[test]
fn a_remote_stamp_too_far_ahead_is_refused() {
    let clock = HlcClock::with_max_drift(3, 100);
    let before = clock.tick();
    let far = HlcTimestamp::new(system_clock_ms() + 60_000, 0).with_node(4);
    assert!(matches!(
        clock.update(&far),
        Err(Error::ClockDrift {
            max_drift_ms: 100,
            ..
        })
    ));
    // Refused means unchanged: the next stamp follows the last local one, not `far`.
    let next = clock.tick();
    assert!(next > before && next < far);
}

#[tokio::test]
async fn a_runtime_orders_request_and_reply_by_its_clocks() {
    let runtime = CpuRuntime::new().await.unwrap();
    let kernel = runtime
        .launch(builtin::ECHO, LaunchOptions::default())
        .await
        .unwrap();
    let sent = runtime.core().hlc().peek();
    let reply: Token = kernel
        .call(Token::new(1, 1.0), Duration::from_secs(5))
        .await
        .unwrap();
    // The echo handler writes its clock's reading into the token: after the host's
    // send, and the host clock merged the reply (so it is after that too).
    assert!(reply.stamps[0] > sent.packed());
    assert!(runtime.core().hlc().peek().packed() > reply.stamps[0]);
    runtime.shutdown().await.unwrap();
}
