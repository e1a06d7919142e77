//! Batch processing: keep many messages in flight instead of one call at a time.
//!
//! ```text
//! cargo run -p ringkernel --example batch_processor                              # CPU
//! cargo run -p ringkernel --features wgpu --example batch_processor -- --backend wgpu
//! cargo run -p ringkernel --features full --example batch_processor -- --backend auto
//! ```
//!
//! `--backend` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".
//!
//! Sends a batch of tokens through an `rk.echo` kernel while receiving replies, with
//! at most a window of them in flight, checks that every one came back exactly once,
//! and shows the two kinds of backpressure: `send` waits for space, `try_send` (or a
//! kernel launched with `with_wait_when_full(false)`) says `QueueFull` at once.

mod common;

use ringkernel::prelude::*;
use std::time::{Duration, Instant};

const BATCH: u64 = 20_000;
const WINDOW: u64 = 512;

common::example_main!(run);

async fn run() -> Result<()> {
    let rt = common::start(common::builder()?).await?;
    let k = rt
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_queue_capacity(1024),
        )
        .await?;

    let mut seen = vec![false; BATCH as usize];
    let (mut sent, mut received) = (0u64, 0u64);
    let start = Instant::now();
    while received < BATCH {
        // Fill the window without waiting.
        while sent < BATCH && sent - received < WINDOW {
            match k.try_send(&Token::new(sent, sent as f64)) {
                Ok(_) => sent += 1,
                Err(Error::QueueFull { .. }) => break,
                Err(e) => return Err(e),
            }
        }
        // Take whatever replies are there; wait for one only when none are.
        let mut got = 0;
        while let Some(t) = k.try_receive::<Token>()? {
            record(&mut seen, t);
            got += 1;
        }
        if got == 0 {
            record(
                &mut seen,
                k.receive_timeout_as(Duration::from_secs(10)).await?,
            );
            got = 1;
        }
        received += got;
    }
    let elapsed = start.elapsed();
    assert!(seen.iter().all(|s| *s), "every token came back");
    println!(
        "{BATCH} tokens, window {WINDOW}: {:.1} ms, {:.0} msgs/s, each exactly once",
        elapsed.as_secs_f64() * 1e3,
        BATCH as f64 / elapsed.as_secs_f64()
    );
    let m = common::settled(&k).await;
    assert_eq!((m.received, m.processed, m.dropped), (BATCH, BATCH, 0));

    // Backpressure without waiting: a paused kernel with a 4-slot queue.
    let small = rt
        .launch(
            builtin::ECHO,
            LaunchOptions::default()
                .with_name("small")
                .with_queue_capacity(4)
                .with_auto_activate(false)
                .with_wait_when_full(false),
        )
        .await?;
    for i in 0..4 {
        small.send(Token::new(i, 1.0)).await?;
    }
    match small.send(Token::new(4, 1.0)).await {
        Err(Error::QueueFull { capacity }) => {
            println!("fifth send into a full 4-slot queue: QueueFull (capacity {capacity})")
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
    assert!(matches!(
        small.try_send(&Token::new(5, 1.0)),
        Err(Error::QueueFull { .. })
    ));
    // Nothing was lost or corrupted: the four queued tokens are processed on activate.
    small.activate().await?;
    for i in 0..4 {
        let t: Token = small.receive_timeout_as(Duration::from_secs(5)).await?;
        assert_eq!((t.id, t.value), (i, 2.0));
    }
    println!("after activate the 4 queued tokens came back in order");

    rt.shutdown().await?;
    println!("ok");
    Ok(())
}

fn record(seen: &mut [bool], t: Token) {
    let i = t.id as usize;
    assert!(i < seen.len(), "unknown id {}", t.id);
    assert!(!seen[i], "token {} came back twice", t.id);
    assert_eq!(t.value, 2.0 * t.id as f64, "token {} value", t.id);
    seen[i] = true;
}
