//! A kernel's lifecycle: `Launched → Active ⇄ Deactivated → Terminating → Terminated`.
//!
//! ```text
//! cargo run -p ringkernel --example kernel_states                              # CPU
//! cargo run -p ringkernel --features wgpu --example kernel_states -- --backend wgpu
//! cargo run -p ringkernel --features full --example kernel_states -- --backend auto
//! ```
//!
//! `--backend` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".
//!
//! Messages sent to a kernel that is not active wait in its queue; nothing is lost.
//! Every transition the state machine does not allow is an `InvalidState` error, and a
//! terminated kernel refuses messages with `KernelTerminated`.

mod common;

use ringkernel::prelude::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

common::example_main!(run);

async fn run() -> Result<()> {
    let rt = common::start(common::builder()?).await?;

    // Launched but not active: messages queue up.
    let k = rt
        .launch(
            builtin::COUNTER,
            LaunchOptions::default().with_auto_activate(false),
        )
        .await?;
    println!("launched:     {:?}", k.state());
    assert_eq!(k.state(), LifecycleState::Launched);
    for i in 0..3 {
        k.send(Token::new(i, 0.0)).await?;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        k.try_receive::<Token>()?.is_none(),
        "a launched kernel must not process"
    );
    assert!(matches!(
        k.deactivate().await,
        Err(Error::InvalidState { .. })
    ));

    // Active: the three queued tokens are processed, in order.
    k.activate().await?;
    println!("activated:    {:?}", k.state());
    assert_eq!(k.state(), LifecycleState::Active);
    for i in 0..3 {
        let t: Token = k.receive_timeout_as(WAIT).await?;
        assert_eq!(
            (t.id, t.value),
            (i, (i + 1) as f64),
            "counter replies with the count so far"
        );
    }
    // Activating an active kernel is a no-op (so is deactivating a deactivated one).
    k.activate().await?;
    assert_eq!(k.state(), LifecycleState::Active);

    // Deactivated: paused, queue kept.
    k.deactivate().await?;
    println!("deactivated:  {:?}", k.state());
    assert_eq!(k.state(), LifecycleState::Deactivated);
    for i in 3..5 {
        k.send(Token::new(i, 0.0)).await?;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        k.try_receive::<Token>()?.is_none(),
        "a deactivated kernel must not process"
    );
    assert_eq!(k.metrics().processed, 3);

    // Reactivated: the paused messages are processed; the counter's state survived.
    k.activate().await?;
    println!("reactivated:  {:?}", k.state());
    for i in 3..5 {
        let t: Token = k.receive_timeout_as(WAIT).await?;
        assert_eq!((t.id, t.value), (i, (i + 1) as f64));
    }

    // Terminated while deactivated with messages queued: they come back in the report.
    k.deactivate().await?;
    k.send(Token::new(99, 0.0)).await?;
    let report = k.terminate().await?;
    println!(
        "terminated:   {:?}, {} undelivered message(s) handed back",
        k.state(),
        report.undelivered.len()
    );
    assert_eq!(k.state(), LifecycleState::Terminated);
    assert_eq!(report.undelivered.len(), 1);
    let back: Token = report.undelivered[0].decode()?;
    assert_eq!(back.id, 99);

    // A terminated kernel refuses messages and transitions.
    match k.send(Token::new(100, 0.0)).await {
        Err(Error::KernelTerminated(name)) => {
            println!("send after terminate: KernelTerminated({name})")
        }
        other => panic!("expected KernelTerminated, got {other:?}"),
    }
    assert!(matches!(
        k.activate().await,
        Err(Error::InvalidState { .. })
    ));

    // An active kernel drains its queue on terminate: nothing is dropped.
    let k2 = rt
        .launch(builtin::ECHO, LaunchOptions::default().with_name("echo2"))
        .await?;
    for i in 0..10 {
        k2.send(Token::new(i, 1.0)).await?;
    }
    let report = k2.terminate().await?;
    let mut replies = 0;
    while k2.try_receive::<Token>()?.is_some() {
        replies += 1;
    }
    println!(
        "terminate while active: drained {}, {replies} replies still received",
        report.drained
    );
    assert!(report.undelivered.is_empty());
    assert_eq!(replies, 10);

    rt.shutdown().await?;
    println!("ok");
    Ok(())
}
