//! The seed README's K2K and pub/sub examples on GPU runtimes used directly
//! (`WgpuRuntime::new()`, `CudaRuntime::new()`), as `seed_k2k_messaging.rs` and
//! `seed_pubsub.rs` do on `CpuRuntime::new()`: the K2K broker's receipts, a runtime's
//! pub/sub broker delivering into GPU kernels' queues, and the K2K switch.
//!
//! WebGPU runs on any adapter (lavapipe in CI): `cargo test -p ringkernel --features
//! wgpu --test seed_k2k_pubsub_on_gpu`. CUDA needs a GPU: `cargo test -p ringkernel
//! --features cuda --test seed_k2k_pubsub_on_gpu -- --ignored`.

#![cfg(any(feature = "wgpu", feature = "cuda"))]

use ringkernel::prelude::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

async fn reply(k: &KernelHandle) -> Token {
    k.receive_envelope(Some(WAIT))
        .await
        .unwrap()
        .decode()
        .unwrap()
}

/// The broker calls of the two examples against the built-in echo kernel of `runtime`.
async fn brokers_on(runtime: &dyn RingKernelRuntime, tag: &str) {
    let a = runtime
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_name(format!("{tag}.a")),
        )
        .await
        .unwrap();
    let b = runtime
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_name(format!("{tag}.b")),
        )
        .await
        .unwrap();

    // K2K: from a to b by id and by name; b's echo handles each.
    let broker = runtime.k2k_broker().expect("K2K is enabled by default");
    let envelope = Envelope::new(&Token::new(1, 21.0));
    assert_eq!(
        broker.send(a.id(), b.id(), &envelope).await.unwrap(),
        K2kReceipt::Delivered
    );
    let r = reply(&b).await;
    assert_eq!((r.id, r.value, r.hops), (1, 42.0, 1));
    assert_eq!(
        broker
            .send(
                a.id(),
                format!("{tag}.b"),
                Envelope::new(&Token::new(2, 1.5))
            )
            .await
            .unwrap(),
        K2kReceipt::Delivered
    );
    assert_eq!(reply(&b).await.value, 3.0);
    assert_eq!(
        broker.send(a.id(), "nobody", &envelope).await.unwrap(),
        K2kReceipt::NotFound
    );
    assert!(matches!(
        broker.send(KernelId(9_999), b.id(), &envelope).await,
        Err(Error::KernelNotFound(_))
    ));

    // Pub/sub: the runtime's broker delivers into the subscribed GPU kernel's queue.
    let pubsub = runtime.pubsub();
    pubsub
        .subscribe(a.id(), Topic::new("sensors/+/temperature"))
        .unwrap();
    let ts = runtime.core().hlc().tick();
    let report = pubsub
        .publish(
            Topic::new("sensors/room1/temperature"),
            KernelId::HOST,
            Envelope::new(&Token::new(3, 5.0)),
            ts,
        )
        .unwrap();
    assert_eq!(report.delivered, 1);
    let r = reply(&a).await;
    assert_eq!((r.id, r.value), (3, 10.0));

    // The switch: no broker, K2K refused; host traffic unaffected.
    runtime.set_k2k_enabled(false);
    assert!(runtime.k2k_broker().is_none());
    assert!(matches!(
        broker.send(a.id(), b.id(), &envelope).await,
        Err(Error::InvalidArgument(_))
    ));
    let r: Token = b.call(Token::new(4, 2.0), WAIT).await.unwrap();
    assert_eq!(r.value, 4.0);
    runtime.set_k2k_enabled(true);
    runtime.shutdown().await.unwrap();
}

#[cfg(feature = "wgpu")]
#[tokio::test]
async fn brokers_on_wgpu_runtime_new() {
    let runtime = match WgpuRuntime::new().await {
        Ok(rt) => rt,
        Err(Error::BackendUnavailable { reason, .. }) => {
            eprintln!("no WebGPU adapter here ({reason}): nothing to run");
            return;
        }
        Err(e) => panic!("WgpuRuntime::new: {e}"),
    };
    brokers_on(&runtime, "seed.wgpu").await;
}

#[cfg(feature = "cuda")]
#[tokio::test]
#[ignore = "needs CUDA GPU"]
async fn brokers_on_cuda_runtime_new() {
    let runtime = CudaRuntime::new().await.expect("CUDA runtime");
    brokers_on(&runtime, "seed.cuda").await;
}
