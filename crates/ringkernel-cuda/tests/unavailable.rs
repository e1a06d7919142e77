//! Runs on every machine (not ignored). Without the NVIDIA driver (CI), every entry
//! point must return `BackendUnavailable`; with it (the GPU machine), `probe` must
//! describe a GPU. Either way nothing panics.

use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::{BackendKind, Error};

#[test]
fn probe_matches_driver_presence() {
    let present = ringkernel_cuda::driver_library_present();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if !present {
        for (what, r) in [
            ("probe", ringkernel_cuda::probe().map(|_| ())),
            (
                "CudaCompute::new",
                ringkernel_cuda::CudaCompute::new(0).map(|_| ()),
            ),
            (
                "CudaRuntime::new",
                rt.block_on(ringkernel_cuda::CudaRuntime::new()).map(|_| ()),
            ),
            (
                "CudaRuntime::with_registry",
                rt.block_on(ringkernel_cuda::CudaRuntime::with_registry(
                    KernelRegistry::new(),
                ))
                .map(|_| ()),
            ),
        ] {
            match r {
                Err(Error::BackendUnavailable {
                    backend: BackendKind::Cuda,
                    reason,
                }) => {
                    assert!(!reason.is_empty(), "{what}: empty reason")
                }
                other => {
                    panic!("{what} without a driver: expected BackendUnavailable, got {other:?}")
                }
            }
        }
        println!("no NVIDIA driver here: BackendUnavailable as expected");
    } else {
        match ringkernel_cuda::probe() {
            Ok(desc) => {
                println!("probe: {desc}");
                assert!(
                    desc.contains("sm_"),
                    "probe must name the architecture: {desc}"
                );
            }
            // A driver without a usable GPU (a container without the device) is still
            // a clean BackendUnavailable, unless the GPU machine says a GPU must be there.
            Err(Error::BackendUnavailable { reason, .. })
                if std::env::var_os("RINGKERNEL_REQUIRE_GPU").is_none() =>
            {
                println!("driver present but unusable: {reason}")
            }
            Err(e) => panic!("probe with a driver present: {e}"),
        }
    }
    // An ordinal that does not exist is an error, never a panic.
    assert!(ringkernel_cuda::CudaCompute::new(1 << 20).is_err());
}
