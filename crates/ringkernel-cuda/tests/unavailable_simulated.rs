//! Runs on every machine (not ignored): with the driver library made unloadable, every
//! entry point reports `BackendUnavailable` with a reason instead of panicking. This
//! test binary is its own process, so the override below is seen before anything
//! touches the driver.

use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::{BackendKind, Error};

#[test]
fn missing_driver_is_backend_unavailable_everywhere() {
    // SAFETY-free: the only test in this binary sets the variable before any thread
    // reads it.
    std::env::set_var(
        ringkernel_cuda::DRIVER_LIBRARY_ENV,
        "libringkernel-no-such-driver.so.1",
    );
    assert!(!ringkernel_cuda::driver_library_present());

    let check = |what: &str, e: Error| match e {
        Error::BackendUnavailable { backend, reason } => {
            assert_eq!(backend, BackendKind::Cuda, "{what}");
            assert!(
                reason.contains("libringkernel-no-such-driver"),
                "{what}: reason {reason:?} does not name the library"
            );
        }
        other => panic!("{what}: expected BackendUnavailable, got {other:?}"),
    };
    check("probe", ringkernel_cuda::probe().unwrap_err());
    check("device_count", ringkernel_cuda::device_count().unwrap_err());
    check(
        "CudaCompute::new",
        ringkernel_cuda::CudaCompute::new(0).unwrap_err(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r = rt.block_on(ringkernel_cuda::CudaRuntime::with_registry(
        KernelRegistry::new(),
    ));
    check("CudaRuntime::with_registry", r.unwrap_err());
}
