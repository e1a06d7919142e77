//! The seed README's "Kernel Lifecycle" example (manual lifecycle control), compiled as
//! written after `use ringkernel::prelude::*;` and run on the CPU backend.
//!
//! The fragment presumes a `runtime` and a handler named "worker"; this file provides
//! both (a `#[ring_kernel]` handler that counts what it handled) and checks that the
//! kernel really went `Launched → Active → Deactivated → Active → Terminated`, that it
//! handled nothing before its first activation and that pausing kept queued messages.

use ringkernel::prelude::*;
use std::time::Duration;

/// Doubles a token's value; `hops` reports how many messages this kernel handled.
#[ring_kernel(name = "worker")]
fn worker(_ctx: &mut KernelContext<'_>, handled: &mut u32, t: Token) -> Option<Token> {
    *handled += 1;
    let mut out = Token::new(t.id, t.value * 2.0);
    out.hops = *handled;
    Some(out)
}

/// The fragment, unchanged, inside an async fn that receives the `runtime` it presumes.
/// Returns the kernel handle so the caller can look at what happened.
async fn lifecycle(runtime: &RingKernel) -> Result<KernelHandle, Box<dyn std::error::Error>> {
    let kernel = runtime
        .launch("worker", LaunchOptions::default().without_auto_activate())
        .await?;

    kernel.activate().await?;
    kernel.deactivate().await?;
    kernel.activate().await?;
    kernel.terminate().await?;
    Ok(kernel)
}

async fn cpu() -> RingKernel {
    RingKernel::builder()
        .backend(Backend::Cpu)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn manual_lifecycle_runs_as_written() {
    let runtime = cpu().await;
    let kernel = lifecycle(&runtime).await.expect("the lifecycle example");
    assert_eq!(kernel.state(), LifecycleState::Terminated);
    assert_eq!(kernel.name(), "worker");
    // Terminated kernels leave the runtime's table.
    assert!(runtime.kernel(kernel.id()).is_none());
    assert!(kernel.send(Token::new(1, 1.0)).await.is_err());
    runtime.shutdown().await.unwrap();
}

/// The same steps, checking the state after each and what a message does in it.
#[tokio::test]
async fn each_lifecycle_step_takes_effect() {
    let runtime = cpu().await;
    let kernel = runtime
        .launch("worker", LaunchOptions::default().without_auto_activate())
        .await
        .unwrap();
    // Not activated: launched, and a message waits without being handled.
    assert_eq!(kernel.state(), LifecycleState::Launched);
    kernel.send(Token::new(1, 1.0)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(kernel.metrics().processed, 0);
    assert!(kernel.try_receive::<Token>().unwrap().is_none());
    // Deactivating a kernel that never ran is an invalid transition.
    assert!(matches!(
        kernel.deactivate().await,
        Err(Error::InvalidState { .. })
    ));

    kernel.activate().await.unwrap();
    assert_eq!(kernel.state(), LifecycleState::Active);
    let first: Token = kernel
        .receive_envelope(Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!((first.id, first.value, first.hops), (1, 2.0, 1));

    kernel.deactivate().await.unwrap();
    assert_eq!(kernel.state(), LifecycleState::Deactivated);
    kernel.send(Token::new(2, 5.0)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(kernel.metrics().processed, 1, "paused: nothing handled");

    kernel.activate().await.unwrap();
    let second: Token = kernel
        .receive_envelope(Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .decode()
        .unwrap();
    // Same kernel state across the pause: this is its second message.
    assert_eq!((second.id, second.value, second.hops), (2, 10.0, 2));

    let report = kernel.terminate().await.unwrap();
    assert!(report.undelivered.is_empty());
    assert_eq!(kernel.state(), LifecycleState::Terminated);
    assert!(matches!(
        kernel.activate().await,
        Err(Error::InvalidState { .. })
    ));
    runtime.shutdown().await.unwrap();
}
