//! Telemetry: per-kernel counters, handler latency percentiles, runtime-wide totals.
//!
//! ```text
//! cargo run -p ringkernel --example telemetry                              # CPU
//! cargo run -p ringkernel --features wgpu --example telemetry -- --backend wgpu
//! cargo run -p ringkernel --features full --example telemetry -- --backend auto
//! ```
//!
//! `--backend` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".

mod common;

use ringkernel::prelude::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn print(m: &KernelMetrics) {
    println!(
        "  {:<10} {:?}: received {:>4}, processed {:>4}, dropped {:>3}, emitted {:>4}, queue {} / out {}, handler p50 {} ns, p99 {} ns ({} samples)",
        m.name,
        m.state,
        m.received,
        m.processed,
        m.dropped,
        m.emitted,
        m.queue_depth,
        m.output_depth,
        m.latency.p50_ns,
        m.latency.p99_ns,
        m.latency.count
    );
}

common::example_main!(run);

async fn run() -> Result<()> {
    let rt = common::builder()?
        // Refuses negative values: the error drops the message, counted in `dropped`.
        .register_fn(
            "validate",
            |_ctx: &mut KernelContext<'_>, t: Token| -> Result<Option<Token>> {
                if t.value < 0.0 {
                    Err(Error::invalid(format!(
                        "token {} has a negative value",
                        t.id
                    )))
                } else {
                    Ok(Some(t))
                }
            },
        )
        .build()
        .await?;
    println!("runtime on {}", rt.backend());

    // A built-in kernel: 200 calls.
    let echo = rt.launch(builtin::ECHO, LaunchOptions::default()).await?;
    for i in 0..200 {
        let _: Token = echo.call(Token::new(i, 1.0), WAIT).await?;
    }
    let m = common::settled(&echo).await;
    assert_eq!(
        (m.received, m.processed, m.dropped, m.emitted),
        (200, 200, 0, 200)
    );
    assert_eq!((m.queue_depth, m.output_depth), (0, 0));
    // Every backend times each message's handler (CUDA on the device clock).
    assert_eq!(m.latency.count, 200);
    assert!(m.latency.p50_ns <= m.latency.p99_ns && m.latency.p99_ns <= m.latency.max_ns);

    // A handler that refuses some messages (CPU backend: a Rust closure).
    if rt.backend() == BackendKind::Cpu {
        let v = rt.launch("validate", LaunchOptions::default()).await?;
        for i in 0..100u64 {
            let value = if i % 10 == 0 { -1.0 } else { i as f64 };
            v.send(Token::new(i, value)).await?;
        }
        for _ in 0..90 {
            let t: Token = v.receive_timeout_as(WAIT).await?;
            assert!(t.value >= 0.0 && !t.id.is_multiple_of(10));
        }
        let m = common::settled(&v).await;
        assert_eq!((m.received, m.processed, m.dropped), (100, 90, 10));
        assert_eq!(m.latency.count, 100, "refused messages are timed too");
    }

    // Runtime-wide snapshot: per kernel, and totals.
    let snap = rt.metrics();
    println!("metrics after {:?} on {}:", snap.uptime, snap.backend);
    for k in &snap.kernels {
        print(k);
    }
    println!(
        "  totals: received {}, processed {}, dropped {}",
        snap.total_received, snap.total_processed, snap.total_dropped
    );
    assert_eq!(
        snap.total_received,
        snap.kernels.iter().map(|k| k.received).sum::<u64>()
    );
    assert_eq!(
        snap.total_processed,
        snap.kernels.iter().map(|k| k.processed).sum::<u64>()
    );
    assert_eq!(
        snap.total_dropped,
        snap.kernels.iter().map(|k| k.dropped).sum::<u64>()
    );
    let expected_kernels = if rt.backend() == BackendKind::Cpu {
        2
    } else {
        1
    };
    assert_eq!(snap.kernels.len(), expected_kernels);

    rt.shutdown().await?;
    assert!(
        rt.metrics().kernels.is_empty(),
        "terminated kernels leave the snapshot"
    );
    println!("ok");
    Ok(())
}
