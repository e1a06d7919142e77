//! 1-D grids of more workgroups than a dimension takes (WebGPU guarantees 65,535): the
//! wgpu launcher folds them into two dimensions and the kernel's WGSL, translated for the
//! fold, computes the linear block index and the true grid size. Checked against the CPU
//! just over the limit (lavapipe in CI); CUDA takes such grids as they are.

#![cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]

use ringkernel::codegen::dsl::*;
use ringkernel::compute::Device;
use ringkernel::{args, gpu_kernel};

/// Every element learns its block, the grid size and the (always 0) y block index.
#[gpu_kernel]
fn stamp(out: &mut [u32], n: i32) {
    let b = block_idx_x();
    let i = b * block_dim_x() + thread_idx_x();
    if i < n {
        out[i as usize] =
            (grid_dim_x() - b) as u32 + (block_idx_y() * 1000 + grid_dim_y()) as u32 * 100000;
    }
}

/// A barrier after the fold's early exit: shared memory per block.
#[gpu_kernel]
fn pair_swap(x: &[f32], out: &mut [f32], n: i32) {
    let mut s = shared_array::<f32, 2>();
    let t = thread_idx_x();
    let i = block_idx_x() * block_dim_x() + t;
    s[t as usize] = if i < n { x[i as usize] } else { 0.0 };
    sync_threads();
    if i < n {
        out[i as usize] = s[(1 - t) as usize];
    }
}

fn large_grids(dev: &Device) {
    for groups in [65_535u32, 65_536, 65_537 + 4_000] {
        let n = (2 * groups - 1) as usize;
        // What the Rust computes (`cpu_large_grid` runs it for a small grid).
        let want: Vec<u32> = (0..n).map(|i| groups - (i / 2) as u32 + 100_000).collect();
        let mut out = vec![u32::MAX; n + 1];
        dev.launch(
            &STAMP,
            [groups, 1, 1],
            [2, 1, 1],
            &mut args![&mut out, n as i32],
        )
        .unwrap();
        assert_eq!(out[n], u32::MAX, "past the end stays");
        if let Some(i) = (0..n).find(|&i| out[i] != want[i]) {
            panic!(
                "{groups} workgroups on {dev}: out[{i}] = {} (want {})",
                out[i], want[i]
            );
        }
        let x: Vec<f32> = (0..n).map(|v| v as f32 * 0.5).collect();
        let want: Vec<f32> = (0..n)
            .map(|i| if i ^ 1 < n { x[i ^ 1] } else { 0.0 })
            .collect();
        let mut got = vec![f32::NAN; n];
        dev.launch(
            &PAIR_SWAP,
            [groups, 1, 1],
            [2, 1, 1],
            &mut args![&x, &mut got, n as i32],
        )
        .unwrap();
        assert_eq!(got, want, "{groups} workgroups on {dev}");
    }
}

#[test]
fn cpu_large_grid() {
    let mut out = vec![0u32; 4];
    Device::cpu()
        .launch(&STAMP, [2, 1, 1], [2, 1, 1], &mut args![&mut out, 4])
        .unwrap();
    assert_eq!(out, [2 + 100_000, 2 + 100_000, 1 + 100_000, 1 + 100_000]);
    let x = [1.0f32, 2.0, 3.0];
    let mut got = vec![f32::NAN; 3];
    Device::cpu()
        .launch(
            &PAIR_SWAP,
            [2, 1, 1],
            [2, 1, 1],
            &mut args![&x, &mut got, 3],
        )
        .unwrap();
    assert_eq!(got, [2.0, 1.0, 0.0]);
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_folds_large_1d_grids() {
    large_grids(&Device::wgpu().unwrap());
    // A 2-D grid over the limit is still refused with the limit named.
    let mut out = vec![0u32; 4];
    let e = Device::wgpu()
        .unwrap()
        .launch(&STAMP, [70_000, 2, 1], [1, 1, 1], &mut args![&mut out, 4])
        .unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_large_1d_grids() {
    large_grids(&Device::cuda(0).unwrap());
}
