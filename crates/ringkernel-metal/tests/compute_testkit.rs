//! Every compute op through the shared test kit (`ringkernel_core::compute::testkit`),
//! the same suite the CPU, WebGPU and CUDA backends pass.
//!
//! On a Mac with a Metal device this runs the whole suite on the GPU
//! (`cargo test -p ringkernel-metal --test compute_testkit`). Everywhere else — CI
//! included, which has no Apple GPU — it checks that `MetalCompute::new()` reports the
//! backend as unavailable instead.

use ringkernel_core::compute::testkit;
use ringkernel_core::Error;
use ringkernel_metal::{is_metal_available, MetalCompute};

#[test]
fn every_op_matches_the_reference_or_metal_is_unavailable() {
    match MetalCompute::new() {
        Ok(metal) => {
            let report = testkit::check_all(&metal).unwrap_or_else(|e| panic!("{e}"));
            println!("{report:?}");
        }
        Err(Error::BackendUnavailable { reason, .. }) => {
            assert!(
                !is_metal_available(),
                "Metal reports a device but MetalCompute::new() failed: {reason}"
            );
        }
        Err(e) => panic!("unexpected error from MetalCompute::new(): {e}"),
    }
}
