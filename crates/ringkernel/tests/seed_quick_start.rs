//! The seed README's "Quick Start" example, compiled as written after
//! `use ringkernel::prelude::*;` and run on the CPU backend.
//!
//! The example launches a handler named "processor" that it does not define; this file
//! defines one with `#[ring_kernel]` whose state counts launches, so the test can tell
//! that the example really launched it, and a second test walks the same calls while
//! checking every lifecycle state and that messages are processed only while active.

use ringkernel::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How many "processor" kernels were launched (one state value per launch).
static LAUNCHED: AtomicU64 = AtomicU64::new(0);

/// Held by each test while it runs, so the launch count is not raced by the other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The "processor" kernel's state: counts the messages it handled.
struct Processed(u64);

impl Default for Processed {
    fn default() -> Self {
        LAUNCHED.fetch_add(1, Ordering::SeqCst);
        Processed(0)
    }
}

/// Doubles a token's value and reports how many messages this kernel has handled.
#[ring_kernel(name = "processor")]
fn processor(_ctx: &mut KernelContext<'_>, seen: &mut Processed, t: Token) -> Option<Token> {
    seen.0 += 1;
    let mut out = Token::new(t.id, t.value * 2.0);
    out.hops = seen.0 as u32;
    Some(out)
}

/// The example's `main`, as an async fn (its body unchanged).
async fn quick_start() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let runtime = RingKernel::builder().backend(Backend::Cpu).build().await?;

    let kernel = runtime
        .launch("processor", LaunchOptions::default())
        .await?;

    println!("State: {:?}", kernel.state());

    kernel.deactivate().await?;
    kernel.activate().await?;
    kernel.terminate().await?;

    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn quick_start_runs_as_written() {
    let _serial = SERIAL.lock().await;
    let before = LAUNCHED.load(Ordering::SeqCst);
    quick_start().await.expect("the quick start example");
    assert_eq!(
        LAUNCHED.load(Ordering::SeqCst),
        before + 1,
        "the example launched the \"processor\" handler exactly once"
    );
}

/// The same calls, checking what each one did.
#[tokio::test]
async fn quick_start_steps_do_what_they_say() {
    let _serial = SERIAL.lock().await;
    let runtime = RingKernel::builder()
        .backend(Backend::Cpu)
        .build()
        .await
        .unwrap();
    assert_eq!(runtime.backend(), BackendKind::Cpu);
    let kernel = runtime
        .launch("processor", LaunchOptions::default())
        .await
        .unwrap();
    // Launched with the default options: active right away, ready for messages.
    assert_eq!(kernel.state(), LifecycleState::Active);
    let r: Token = kernel
        .call(Token::new(1, 1.5), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((r.id, r.value, r.hops), (1, 3.0, 1));

    kernel.deactivate().await.unwrap();
    assert_eq!(kernel.state(), LifecycleState::Deactivated);
    // Paused: a message waits in the queue and is not handled.
    kernel.send(Token::new(2, 10.0)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(kernel.try_receive::<Token>().unwrap().is_none());
    assert_eq!(kernel.metrics().processed, 1);

    kernel.activate().await.unwrap();
    assert_eq!(kernel.state(), LifecycleState::Active);
    // Resumed: the waiting message is handled now, by the same kernel state.
    let env = kernel
        .receive_envelope(Some(Duration::from_secs(5)))
        .await
        .unwrap();
    let r: Token = env.decode().unwrap();
    assert_eq!((r.id, r.value, r.hops), (2, 20.0, 2));

    let report = kernel.terminate().await.unwrap();
    assert!(report.undelivered.is_empty());
    assert_eq!(kernel.state(), LifecycleState::Terminated);
    assert!(kernel.send(Token::new(3, 1.0)).await.is_err());
    // A second terminate is an invalid transition, not a panic.
    assert!(kernel.terminate().await.is_err());

    runtime.shutdown().await.unwrap();
    assert!(runtime.metrics().kernels.is_empty());
}
