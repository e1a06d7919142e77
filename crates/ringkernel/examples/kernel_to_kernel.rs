//! Kernel-to-kernel (K2K) messaging: kernels send to each other by id or by name,
//! without going through the host.
//!
//! ```text
//! cargo run -p ringkernel --example kernel_to_kernel                              # CPU
//! cargo run -p ringkernel --features wgpu --example kernel_to_kernel -- --backend wgpu
//! cargo run -p ringkernel --features full --example kernel_to_kernel -- --backend auto
//! ```
//!
//! `--backend` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".
//!
//! 1. A three-stage pipeline of built-in `rk.stage` kernels: the route travels in the
//!    token, each stage stamps it with its HLC clock and forwards it.
//! 2. On the CPU backend, a handler that forwards by instance name and reports the
//!    K2K receipt (`Delivered`, `QueueFull`, `NotFound`) back to the host.

mod common;

use ringkernel::prelude::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

common::example_main!(run);

async fn run() -> Result<()> {
    let rt = common::builder()?
        // Forwards a token to the kernel named "sink" and tells the host what happened.
        .register_fn(
            "forwarder",
            |ctx: &mut KernelContext<'_>, mut t: Token| -> Result<Option<Token>> {
                let receipt = ctx.send_to("sink", &t)?;
                t.value = match receipt {
                    K2kReceipt::Delivered => 1.0,
                    K2kReceipt::QueueFull => 2.0,
                    K2kReceipt::NotFound => 3.0,
                };
                Ok(Some(t))
            },
        )
        .build()
        .await?;
    println!("runtime on {}", rt.backend());

    // 1. The pipeline.
    let opts = |name: &str| LaunchOptions::default().with_name(name);
    let s1 = rt.launch(builtin::STAGE, opts("stage1")).await?;
    let s2 = rt.launch(builtin::STAGE, opts("stage2")).await?;
    let s3 = rt.launch(builtin::STAGE, opts("stage3")).await?;
    let route = [s1.id(), s2.id(), s3.id()];
    let n = 1000u64;
    for i in 0..n {
        s1.send(Token::routed(i, i as f64, &route)?).await?;
    }
    for i in 0..n {
        let t: Token = s3.receive_timeout_as(WAIT).await?;
        assert_eq!(t.id, i, "one pipeline keeps order");
        assert_eq!((t.value, t.hops), (i as f64 + 3.0, 3));
        assert!(
            t.stamps[0] < t.stamps[1] && t.stamps[1] < t.stamps[2],
            "HLC order along the path"
        );
    }
    let (m1, m3) = (common::settled(&s1).await, common::settled(&s3).await);
    println!("pipeline: {n} tokens through 3 stages, in order, HLC stamps increasing at every hop");
    assert_eq!((m1.processed, m3.processed), (n, n));
    assert!(
        s1.try_receive::<Token>()?.is_none(),
        "inner stages reply to nobody"
    );

    // 2. K2K by name, with receipts.
    if rt.backend() == BackendKind::Cpu {
        let fwd = rt.launch("forwarder", LaunchOptions::default()).await?;
        let t: Token = fwd.call(Token::new(1, 0.0), WAIT).await?;
        println!(
            "forward to a missing kernel: receipt {}",
            if t.value == 3.0 { "NotFound" } else { "?" }
        );
        assert_eq!(t.value, 3.0);

        let sink = rt
            .launch(builtin::ECHO, LaunchOptions::default().with_name("sink"))
            .await?;
        let t: Token = fwd.call(Token::new(2, 5.0), WAIT).await?;
        assert_eq!(t.value, 1.0, "Delivered");
        let echoed: Token = sink.receive_timeout_as(WAIT).await?;
        assert_eq!((echoed.id, echoed.value), (2, 10.0));
        println!(
            "forward to \"sink\": receipt Delivered, sink echoed {}",
            echoed.value
        );

        // A deactivated sink with a 2-slot queue fills up: the third forward is QueueFull.
        sink.terminate().await?;
        let sink = rt
            .launch(
                builtin::ECHO,
                LaunchOptions::default()
                    .with_name("sink")
                    .with_queue_capacity(2)
                    .with_auto_activate(false),
            )
            .await?;
        let mut receipts = Vec::new();
        for i in 0..3 {
            let t: Token = fwd.call(Token::new(10 + i, 0.0), WAIT).await?;
            receipts.push(t.value);
        }
        println!("forward into a full queue: receipts {receipts:?} (1 = Delivered, 2 = QueueFull)");
        assert_eq!(receipts, vec![1.0, 1.0, 2.0]);
        sink.activate().await?;
        for _ in 0..2 {
            let _: Token = sink.receive_timeout_as(WAIT).await?;
        }
    }

    rt.shutdown().await?;
    println!("ok");
    Ok(())
}
