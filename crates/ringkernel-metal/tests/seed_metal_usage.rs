//! The Metal README's "Usage" example, compiled as written after the `use` line it
//! shows, and run: on Apple with a Metal device it launches a "compute" kernel, sends
//! it a message and checks the reply; everywhere else `is_metal_available()` is false,
//! the example returns early as it says, and `MetalRuntime::new()` is
//! `BackendUnavailable`.
//!
//! The example presumes a handler named "compute" (registered here, before the runtime
//! starts, in the process-wide registry that `MetalRuntime::new()` resolves names
//! through), an `envelope` to send, and `Duration` in scope.

use ringkernel_metal::{is_metal_available, MetalRuntime};

use ringkernel_core::builtin::Token;
use ringkernel_core::message::Envelope;
use ringkernel_core::registry::{GpuHandler, KernelRegistry};
use ringkernel_core::{BackendKind, Error};
use std::time::Duration;

/// Registers "compute": the token-doubling WGSL handler of the built-in echo kernel,
/// under the name the example launches.
fn register_compute() {
    let wgsl = format!(
        "{}\n{}",
        ringkernel_shaders::drain::TOKEN_LIB,
        ringkernel_shaders::drain::ECHO
    );
    KernelRegistry::global().register_gpu(GpuHandler::new("compute").with_wgsl(wgsl));
}

/// The example's `main` as an async fn: its lines unchanged, plus one line (marked) that
/// hands the response to the test.
async fn metal_usage(
    envelope: Envelope,
    got: &mut Option<Envelope>,
) -> Result<(), Box<dyn std::error::Error>> {
    if !is_metal_available() {
        eprintln!("Metal not available");
        return Ok(());
    }

    let runtime = MetalRuntime::new().await?;

    let kernel = runtime.launch("compute", Default::default()).await?;
    kernel.activate().await?;

    kernel.send_envelope(envelope).await?;

    let response = kernel.receive_timeout(Duration::from_secs(1)).await?;
    *got = Some(response); // added by the test

    kernel.terminate().await?;
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn metal_usage_runs_as_written() {
    register_compute();
    let mut got = None;
    metal_usage(Envelope::new(&Token::new(3, 21.0)), &mut got)
        .await
        .expect("the Metal usage example");
    if is_metal_available() {
        let reply: Token = got.expect("a response").decode().unwrap();
        assert_eq!((reply.id, reply.value, reply.hops), (3, 42.0, 1));
    } else {
        assert!(got.is_none(), "without Metal the example returns early");
    }
}

#[tokio::test]
async fn without_metal_new_is_backend_unavailable() {
    if is_metal_available() {
        return;
    }
    match MetalRuntime::new().await {
        Err(Error::BackendUnavailable {
            backend: BackendKind::Metal,
            reason,
        }) => assert!(!reason.is_empty()),
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
}
