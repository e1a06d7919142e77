//! The Metal README's "Usage" flow on the other event-driven backend, WebGPU, which
//! shares Metal's host side (the drain engine) and its WGSL kernels and runs here on
//! any adapter (Mesa's lavapipe in CI): a GPU handler registered in the process-wide
//! registry under "compute", `WgpuRuntime::new()`, a default launch, `activate` on the
//! already active kernel, `send_envelope`, a reply within a second, `terminate`,
//! `shutdown`. The Metal test itself (`ringkernel-metal/tests/seed_metal_usage.rs`)
//! can only run this on a Mac.
//!
//! Needs the `wgpu` feature: `cargo test -p ringkernel --features wgpu --test
//! seed_metal_usage_on_wgpu`.

#![cfg(feature = "wgpu")]

use ringkernel::prelude::*;
use std::time::Duration;

#[tokio::test]
async fn metal_usage_flow_on_wgpu() {
    let runtime = match WgpuRuntime::new().await {
        Ok(rt) => rt,
        Err(Error::BackendUnavailable { reason, .. }) => {
            eprintln!("no WebGPU adapter here ({reason}): nothing to run");
            return;
        }
        Err(e) => panic!("WgpuRuntime::new: {e}"),
    };
    // `new()` put the WGSL built-ins into the global registry; "compute" is the echo
    // handler under the name the example launches, registered the way a program would.
    let echo = KernelRegistry::global().gpu(builtin::ECHO).unwrap();
    KernelRegistry::global().register_gpu(GpuHandler {
        name: "compute".into(),
        ..echo
    });

    let kernel = runtime.launch("compute", Default::default()).await.unwrap();
    kernel.activate().await.unwrap();
    assert_eq!(kernel.state(), LifecycleState::Active);
    let envelope = Envelope::new(&Token::new(3, 21.0));
    kernel.send_envelope(&envelope).await.unwrap();
    let response = kernel
        .receive_envelope(Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let reply: Token = response.decode().unwrap();
    assert_eq!((reply.id, reply.value, reply.hops), (3, 42.0, 1));
    kernel.terminate().await.unwrap();
    assert_eq!(kernel.state(), LifecycleState::Terminated);
    runtime.shutdown().await.unwrap();

    // A name nobody registered is a typed error, not a hang.
    let runtime = WgpuRuntime::new().await.unwrap();
    assert!(matches!(
        runtime.launch("seed.nobody", Default::default()).await,
        Err(Error::KernelNotFound(_))
    ));
    runtime.shutdown().await.unwrap();
}
