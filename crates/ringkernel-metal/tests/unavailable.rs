//! Without Metal (every non-Apple target), the backend says so with a typed error.

#[cfg(not(target_vendor = "apple"))]
#[test]
fn non_apple_targets_report_backend_unavailable() {
    use ringkernel_core::registry::KernelRegistry;
    use ringkernel_core::{BackendKind, Error};
    use ringkernel_metal::{
        is_metal_available, unavailable_reason, MetalCompute, MetalDevice, MetalRuntime,
    };

    assert!(!is_metal_available());
    let reason = unavailable_reason().expect("a reason");
    assert!(reason.contains("Apple"), "{reason}");
    assert!(reason.contains(std::env::consts::OS), "{reason}");

    match MetalCompute::new() {
        Err(Error::BackendUnavailable {
            backend: BackendKind::Metal,
            reason,
        }) => assert!(reason.contains("Apple")),
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
    for rt in [
        pollster_block_on(MetalRuntime::new()),
        pollster_block_on(MetalRuntime::with_registry(KernelRegistry::new())),
    ] {
        match rt {
            Err(Error::BackendUnavailable {
                backend: BackendKind::Metal,
                ..
            }) => {}
            other => panic!("expected BackendUnavailable, got {other:?}"),
        }
    }
    assert!(matches!(
        MetalDevice::system_default(),
        Err(Error::BackendUnavailable { .. })
    ));
}

/// A minimal executor for one future (the constructor never awaits anything pending).
#[cfg(not(target_vendor = "apple"))]
fn pollster_block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}
