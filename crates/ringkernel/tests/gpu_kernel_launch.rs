//! `#[gpu_kernel]` functions launched through `Device`: the CPU runs the Rust itself,
//! wgpu (lavapipe here) the generated WGSL, CUDA the generated CUDA C; results must
//! match on fresh random inputs of awkward sizes.

// Without a GPU feature only the CPU tests are compiled.
#![cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]

use ringkernel::codegen::dsl::*;
use ringkernel::compute::Device;
use ringkernel::core::util::SplitMix64;
use ringkernel::{args, gpu_fn, gpu_kernel, Error};

#[gpu_kernel]
fn saxpy(a: f32, x: &[f32], y: &mut [f32], n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        y[i as usize] = a.mul_add(x[i as usize], y[i as usize]);
    }
}

#[gpu_kernel]
fn histogram(data: &[u32], hist: &mut [u32], bins: u32, n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i >= n {
        return;
    }
    let b = data[i as usize] % bins;
    atomic_add(&mut hist[b as usize], 1u32);
}

/// Integer work with `while`, `match`, a `bool` parameter and early exits.
#[gpu_kernel]
fn collatz(seeds: &[i32], steps: &mut [i32], cap: i32, count_all: bool, n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i >= n {
        return;
    }
    let mut v = seeds[i as usize];
    let mut k = 0;
    while v != 1 && k < cap {
        match v % 2 {
            0 => v /= 2,
            _ => {
                v = 3 * v + 1;
                if !count_all {
                    continue;
                }
            }
        }
        k += 1;
    }
    steps[i as usize] = k;
}

/// A 2-D grid: the y indices and block sizes matter.
#[gpu_kernel]
fn transpose(src: &[f32], dst: &mut [f32], w: i32, h: i32) {
    let x = block_idx_x() * block_dim_x() + thread_idx_x();
    let y = block_idx_y() * block_dim_y() + thread_idx_y();
    if x < w && y < h {
        dst[(x * h + y) as usize] = src[(y * w + x) as usize];
    }
}

/// f64: CUDA and CPU only.
#[gpu_kernel]
fn scale64(x: &mut [f64], k: f64, n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        x[i as usize] *= k;
    }
}

/// Reads past the end when `n` is larger than the slice.
#[gpu_kernel]
fn copy_n(src: &[f32], dst: &mut [f32], n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        dst[i as usize] = src[i as usize];
    }
}

fn rng() -> (SplitMix64, u64) {
    let seed = SplitMix64::from_entropy().next_u64();
    (SplitMix64::new(seed), seed)
}

fn blocks(n: usize, block: u32) -> u32 {
    (n as u32).div_ceil(block).max(1)
}

/// Runs every kernel on `dev` and on the CPU with the same fresh inputs and compares.
fn matches_cpu(dev: &Device) {
    let cpu = Device::cpu();
    let (mut r, seed) = rng();
    for &n in &[1usize, 63, 65, 1000, 4099] {
        let ctx = format!("n = {n}, seed {seed:#x}, device {dev}");
        // saxpy
        let x = r.vec(n, -3.0, 3.0);
        let y0 = r.vec(n, -3.0, 3.0);
        let a = r.uniform(-2.0, 2.0);
        let (mut yc, mut yg) = (y0.clone(), y0.clone());
        let g = [blocks(n, 64), 1, 1];
        cpu.launch(&SAXPY, g, [64, 1, 1], &mut args![a, &x, &mut yc, n as i32])
            .unwrap();
        dev.launch(&SAXPY, g, [64, 1, 1], &mut args![a, &x, &mut yg, n as i32])
            .unwrap();
        for (i, (c, w)) in yc.iter().zip(&yg).enumerate() {
            assert!(
                (c - w).abs() <= 1e-6 * c.abs().max(1.0),
                "saxpy[{i}] {c} vs {w}: {ctx}"
            );
        }
        assert_ne!(yc, y0, "{ctx}");

        // histogram (atomics), 128 threads per block
        let data: Vec<u32> = (0..n).map(|_| r.next_u64() as u32).collect();
        let bins = 1 + r.below(37) as u32;
        let (mut hc, mut hg) = (vec![0u32; bins as usize], vec![0u32; bins as usize]);
        let g = [blocks(n, 128), 1, 1];
        cpu.launch(
            &HISTOGRAM,
            g,
            [128, 1, 1],
            &mut args![&data, &mut hc, bins, n as i32],
        )
        .unwrap();
        dev.launch(
            &HISTOGRAM,
            g,
            [128, 1, 1],
            &mut args![&data, &mut hg, bins, n as i32],
        )
        .unwrap();
        assert_eq!(hc, hg, "histogram: {ctx}");
        assert_eq!(hc.iter().sum::<u32>() as usize, n, "{ctx}");

        // collatz (integers, while, match, bool)
        let seeds: Vec<i32> = (0..n).map(|_| 1 + r.below(10_000) as i32).collect();
        let count_all = r.below(2) == 0;
        let (mut sc, mut sg) = (vec![-1i32; n], vec![-1i32; n]);
        let g = [blocks(n, 32), 1, 1];
        cpu.launch(
            &COLLATZ,
            g,
            [32, 1, 1],
            &mut args![&seeds, &mut sc, 300, count_all, n as i32],
        )
        .unwrap();
        dev.launch(
            &COLLATZ,
            g,
            [32, 1, 1],
            &mut args![&seeds, &mut sg, 300, count_all, n as i32],
        )
        .unwrap();
        assert_eq!(sc, sg, "collatz: {ctx}");
        assert!(sc.iter().all(|&s| s >= 0), "{ctx}");
    }
    // transpose on awkward 2-D sizes, 8 x 8 blocks
    for &(w, h) in &[(1usize, 1usize), (7, 13), (33, 9), (100, 61)] {
        let src = r.vec(w * h, -1.0, 1.0);
        let (mut dc, mut dg) = (vec![0.0f32; w * h], vec![0.0f32; w * h]);
        let g = [blocks(w, 8), blocks(h, 8), 1];
        cpu.launch(
            &TRANSPOSE,
            g,
            [8, 8, 1],
            &mut args![&src, &mut dc, w as i32, h as i32],
        )
        .unwrap();
        dev.launch(
            &TRANSPOSE,
            g,
            [8, 8, 1],
            &mut args![&src, &mut dg, w as i32, h as i32],
        )
        .unwrap();
        assert_eq!(dc, dg, "transpose {w}x{h}, seed {seed:#x}");
        assert_eq!(dc[0], src[0]);
        assert_eq!(dc[(w - 1) * h + (h - 1)], src[(h - 1) * w + (w - 1)]);
    }
}

#[test]
fn cpu_runs_the_rust_function() {
    let dev = Device::cpu();
    let x: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let mut y = vec![1.0f32; 100];
    let info = dev
        .launch(
            &SAXPY,
            [2, 1, 1],
            [64, 1, 1],
            &mut args![2.0f32, &x, &mut y, 100],
        )
        .unwrap();
    assert!(!info.compiled);
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, 2.0 * i as f32 + 1.0);
    }
    // f64 runs on the CPU
    let mut d = vec![1.5f64; 10];
    dev.launch(
        &SCALE64,
        [1, 1, 1],
        [16, 1, 1],
        &mut args![&mut d, 3.0f64, 10],
    )
    .unwrap();
    assert!(d.iter().all(|&v| v == 4.5));
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dev = Device::cpu();
    let x = vec![0.0f32; 4];
    let mut y = vec![0.0f32; 4];
    let e = dev
        .launch(&SAXPY, [1, 1, 1], [4, 1, 1], &mut args![2.0f32, &x, &mut y])
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("takes 4 arguments, 3")),
        "{e}"
    );
    // a read-only slice where the kernel writes
    let e = dev
        .launch(&SAXPY, [1, 1, 1], [4, 1, 1], &mut args![2.0f32, &x, &y, 4])
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("`y`") && m.contains("&mut [f32]")),
        "{e}"
    );
    // a u32 where an i32 goes
    let e = dev
        .launch(
            &SAXPY,
            [1, 1, 1],
            [4, 1, 1],
            &mut args![2.0f32, &x, &mut y, 4u32],
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("`n`")),
        "{e}"
    );
    // an index past the end panics in Rust: a Device error, not a panic of the caller
    let e = dev
        .launch(&COPY_N, [1, 1, 1], [8, 1, 1], &mut args![&x, &mut y, 8])
        .unwrap_err();
    assert!(
        matches!(&e, Error::Device(m) if m.contains("copy_n") && m.contains("panicked")),
        "{e}"
    );
}

#[test]
fn the_descriptor_carries_both_translations() {
    assert_eq!(SAXPY.name, "saxpy");
    assert_eq!(SAXPY.params.len(), 4);
    assert!(SAXPY
        .cuda_source
        .contains("__global__ void saxpy(float a, const float* x, float* y, int n)"));
    assert!(SAXPY
        .wgsl_source
        .unwrap()
        .contains("@compute @workgroup_size(64, 1, 1)"));
    // WGSL for another block size, translated from the Rust source
    let k = TRANSPOSE.wgsl([8, 8, 1]).unwrap();
    assert!(
        k.source.contains("@workgroup_size(8, 8, 1)"),
        "{}",
        k.source
    );
    let e = SCALE64.wgsl_source.unwrap_err();
    assert!(e.contains("f64"), "{e}");
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;

    fn device() -> Device {
        Device::wgpu().expect("a wgpu adapter (lavapipe on CI)")
    }

    #[test]
    fn wgpu_matches_the_cpu() {
        matches_cpu(&device());
    }

    #[test]
    fn wgpu_compiles_once_per_block_size() {
        let dev = device();
        let x = vec![1.0f32; 130];
        let mut y = vec![0.0f32; 130];
        let first = dev
            .launch(
                &SAXPY,
                [3, 1, 1],
                [64, 1, 1],
                &mut args![1.0f32, &x, &mut y, 130],
            )
            .unwrap();
        let again = dev
            .launch(
                &SAXPY,
                [3, 1, 1],
                [64, 1, 1],
                &mut args![1.0f32, &x, &mut y, 130],
            )
            .unwrap();
        assert!(first.compiled && !again.compiled);
        assert!(first.compile_time > again.compile_time);
        assert_eq!(dev.cached_kernels(), 1);
        let other = dev
            .launch(
                &SAXPY,
                [2, 1, 1],
                [128, 1, 1],
                &mut args![1.0f32, &x, &mut y, 130],
            )
            .unwrap();
        assert!(other.compiled);
        assert_eq!(dev.cached_kernels(), 2);
        assert!(y.iter().all(|&v| v == 3.0), "{y:?}");
        println!(
            "saxpy on {dev}: translate + compile {:?} first use, {:?} cached",
            first.compile_time, again.compile_time
        );
    }

    #[test]
    fn wgpu_refuses_what_it_cannot_run() {
        let dev = device();
        let mut d = vec![1.0f64; 4];
        let e = dev
            .launch(
                &SCALE64,
                [1, 1, 1],
                [4, 1, 1],
                &mut args![&mut d, 2.0f64, 4],
            )
            .unwrap_err();
        assert!(
            matches!(&e, Error::Compile { log, .. } if log.contains("f64")),
            "{e}"
        );
        assert_eq!(d, vec![1.0; 4], "untouched");
        let x = vec![0.0f32; 4];
        let mut y = vec![0.0f32; 4];
        let e = dev
            .launch(
                &SAXPY,
                [1, 1, 1],
                [1024, 1, 1],
                &mut args![1.0f32, &x, &mut y, 4],
            )
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;

    fn device() -> Device {
        Device::cuda(0).expect("a CUDA GPU")
    }

    #[test]
    #[ignore = "needs CUDA GPU"]
    fn cuda_matches_the_cpu() {
        matches_cpu(&device());
        // f64 runs on CUDA
        let dev = device();
        let mut d: Vec<f64> = (0..1001).map(|i| i as f64 * 0.5).collect();
        let want: Vec<f64> = d.iter().map(|v| v * 1.25).collect();
        dev.launch(
            &SCALE64,
            [8, 1, 1],
            [128, 1, 1],
            &mut args![&mut d, 1.25f64, 1001],
        )
        .unwrap();
        assert_eq!(d, want);
    }

    #[test]
    #[ignore = "needs CUDA GPU"]
    fn cuda_compiles_once() {
        let dev = device();
        let x = vec![1.0f32; 10];
        let mut y = vec![0.0f32; 10];
        let first = dev
            .launch(
                &SAXPY,
                [1, 1, 1],
                [32, 1, 1],
                &mut args![1.0f32, &x, &mut y, 10],
            )
            .unwrap();
        let again = dev
            .launch(
                &SAXPY,
                [1, 1, 1],
                [64, 1, 1],
                &mut args![1.0f32, &x, &mut y, 10],
            )
            .unwrap();
        assert!(
            first.compiled && !again.compiled,
            "CUDA takes the block at launch"
        );
        assert_eq!(y, vec![2.0; 10]);
        println!(
            "saxpy on {dev}: translate + compile {:?} first use, {:?} cached",
            first.compile_time, again.compile_time
        );
    }

    #[test]
    #[ignore = "needs CUDA GPU"]
    fn cuda_compile_error_carries_source_and_log() {
        let mut bad = SAXPY;
        bad.params = &SAXPY.params[..1];
        bad.cuda_source = "extern \"C\" __global__ void saxpy(float a) { undefined_name; }";
        let dev = device();
        let e = dev
            .launch(&bad, [1, 1, 1], [1, 1, 1], &mut args![1.0f32])
            .unwrap_err();
        assert!(
            matches!(&e, Error::Compile { log, .. } if log.contains("undefined_name") && log.contains("generated CUDA C")),
            "{e}"
        );
    }
}

/// A slice and a scalar the body never reads still take their places.
#[gpu_kernel]
fn ignores_some(_unused: &[f32], out: &mut [i32], _skip: f32, n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        out[i as usize] = i * 2;
    }
}

fn unused_params_and_empty_slices(dev: &Device) {
    let mut out = vec![0i32; 5];
    dev.launch(
        &IGNORES_SOME,
        [1, 1, 1],
        [8, 1, 1],
        &mut args![&[] as &[f32], &mut out, 1.0f32, 5],
    )
    .unwrap();
    assert_eq!(out, vec![0, 2, 4, 6, 8]);
    // an empty output and a zero grid
    let mut none: Vec<i32> = Vec::new();
    dev.launch(
        &IGNORES_SOME,
        [0, 1, 1],
        [8, 1, 1],
        &mut args![&[1.0f32], &mut none, 1.0f32, 0],
    )
    .unwrap();
}

#[test]
fn cpu_unused_params_and_empty_slices() {
    unused_params_and_empty_slices(&Device::cpu());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_unused_params_and_empty_slices() {
    unused_params_and_empty_slices(&Device::wgpu().unwrap());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_unused_params_and_empty_slices() {
    unused_params_and_empty_slices(&Device::cuda(0).unwrap());
}

/// A 5-point diffusion step (2-D stencil, halo 1).
#[gpu_kernel(halo = 1)]
fn diffuse(pos: GridPos, p: &[f32], out: &mut [f32], c: f32) {
    let lap = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) - 4.0 * p[pos.idx()];
    out[pos.idx()] = p[pos.idx()] + c * lap;
}

/// A 3-D stencil reaching two cells out (halo 2), with the GridPos not first.
#[gpu_kernel(halo = 2)]
fn reach3(a: &[f32], out: &mut [f32], pos: GridPos3, w: f32) {
    let s = pos.at(a, -2, 0, 0) + pos.at(a, 0, 2, 0) + pos.at(a, 0, 0, -2) + pos.up(a);
    out[pos.idx()] = w * s + a[pos.idx()];
}

fn stencils_match_cpu(dev: &Device) {
    let cpu = Device::cpu();
    let (mut r, seed) = rng();
    for &(nx, ny) in &[(1u32, 1u32), (17, 5), (33, 31), (64, 3)] {
        let len = DIFFUSE.stencil.unwrap().buffer_len([nx, ny, 1]);
        let p = r.vec(len, -1.0, 1.0);
        let c = r.uniform(0.0, 0.25);
        let out0 = vec![9.0f32; len];
        let (mut oc, mut og) = (out0.clone(), out0.clone());
        cpu.launch_stencil(&DIFFUSE, [nx, ny, 1], &mut args![&p, &mut oc, c])
            .unwrap();
        dev.launch_stencil(&DIFFUSE, [nx, ny, 1], &mut args![&p, &mut og, c])
            .unwrap();
        for (i, (a, b)) in oc.iter().zip(&og).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5,
                "diffuse {nx}x{ny} [{i}] {a} vs {b}, seed {seed:#x}"
            );
        }
        // the halo stays as it was, every interior cell was written
        let sx = (nx + 2) as usize;
        assert_eq!(oc[0], 9.0);
        assert_ne!(oc[sx + 1], 9.0);
    }
    for &size in &[[1u32, 1, 1], [9, 5, 3], [17, 8, 6]] {
        let len = REACH3.stencil.unwrap().buffer_len(size);
        let a = r.vec(len, -1.0, 1.0);
        let (mut oc, mut og) = (vec![0.0f32; len], vec![0.0f32; len]);
        cpu.launch_stencil(&REACH3, size, &mut args![&a, &mut oc, 0.5f32])
            .unwrap();
        dev.launch_stencil(&REACH3, size, &mut args![&a, &mut og, 0.5f32])
            .unwrap();
        for (i, (x, y)) in oc.iter().zip(&og).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5,
                "reach3 {size:?} [{i}] {x} vs {y}, seed {seed:#x}"
            );
        }
        assert!(oc.iter().any(|&v| v != 0.0));
    }
}

#[test]
fn cpu_stencils() {
    stencils_match_cpu(&Device::cpu());
    // the wrong launch for the kind of kernel
    let p = vec![0.0f32; 9];
    let mut o = vec![0.0f32; 9];
    let e = Device::cpu()
        .launch(
            &DIFFUSE,
            [1, 1, 1],
            [1, 1, 1],
            &mut args![&p, &mut o, 0.1f32],
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("launch_stencil")),
        "{e}"
    );
    let e = Device::cpu()
        .launch_stencil(&SAXPY, [1, 1, 1], &mut args![1.0f32, &p, &mut o, 1])
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("not a stencil")),
        "{e}"
    );
    let e = Device::cpu()
        .launch_stencil(&DIFFUSE, [1, 1, 2], &mut args![&p, &mut o, 0.1f32])
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("2-D")),
        "{e}"
    );
    // a grid buffer too short for the size: the CPU's bounds check, as an error
    let e = Device::cpu()
        .launch_stencil(&DIFFUSE, [4, 4, 1], &mut args![&p, &mut o, 0.1f32])
        .unwrap_err();
    assert!(
        matches!(&e, Error::Device(m) if m.contains("panicked")),
        "{e}"
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_stencils_match_the_cpu() {
    stencils_match_cpu(&Device::wgpu().unwrap());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_stencils_match_the_cpu() {
    stencils_match_cpu(&Device::cuda(0).unwrap());
}

/// Tensors are bound in place on a GPU (staged through the host on the CPU) and mix
/// with host slices.
fn tensors_as_arguments(dev: &Device) {
    use ringkernel::compute::Tensor;
    let (mut r, seed) = rng();
    let n = 777;
    let x = r.vec(n, -1.0, 1.0);
    let y0 = r.vec(n, -1.0, 1.0);
    let xt = Tensor::from_slice(dev, &x, &[n]).unwrap();
    let mut yt = Tensor::from_slice(dev, &y0, &[n]).unwrap();
    let g = [blocks(n, 64), 1, 1];
    dev.launch(
        &SAXPY,
        g,
        [64, 1, 1],
        &mut args![1.5f32, &xt, &mut yt, n as i32],
    )
    .unwrap();
    // the same with host slices on the CPU
    let mut want = y0.clone();
    Device::cpu()
        .launch(
            &SAXPY,
            g,
            [64, 1, 1],
            &mut args![1.5f32, &x, &mut want, n as i32],
        )
        .unwrap();
    let got = yt.to_vec().unwrap();
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6,
            "[{i}] {a} vs {b}, seed {seed:#x}, {dev}"
        );
    }
    // a read-only tensor where the kernel writes, a tensor for an i32 slice
    let e = dev
        .launch(
            &SAXPY,
            g,
            [64, 1, 1],
            &mut args![1.5f32, &xt, &yt, n as i32],
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("&Tensor")),
        "{e}"
    );
    let e = dev
        .launch(
            &IGNORES_SOME,
            [1, 1, 1],
            [4, 1, 1],
            &mut args![&xt, &mut yt, 1.0f32, 4],
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("`out`")),
        "{e}"
    );
}

#[test]
fn cpu_tensors_as_arguments() {
    tensors_as_arguments(&Device::cpu());
    // a tensor of another device
    let other = Device::cpu();
    let t = ringkernel::compute::Tensor::from_slice(&other, &[1.0], &[1]).unwrap();
    let mut y = vec![0.0f32; 1];
    let e = Device::cpu()
        .launch(
            &SAXPY,
            [1, 1, 1],
            [1, 1, 1],
            &mut args![1.0f32, &t, &mut y, 1],
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::Device(m) if m.contains("to_device")),
        "{e}"
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_tensors_as_arguments() {
    tensors_as_arguments(&Device::wgpu().unwrap());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_tensors_as_arguments() {
    tensors_as_arguments(&Device::cuda(0).unwrap());
}

/// Dot product partials: each block reduces its products in shared memory (barriers
/// between the tree's levels) and writes one sum.
#[gpu_kernel]
fn dot_partials(x: &[f32], y: &[f32], partial: &mut [f32], n: i32) {
    let mut acc = shared_array::<f32, 256>();
    let t = thread_idx_x();
    let i = block_idx_x() * block_dim_x() + t;
    acc[t as usize] = if i < n {
        x[i as usize] * y[i as usize]
    } else {
        0.0
    };
    sync_threads();
    let mut s = block_dim_x() / 2;
    while s > 0 {
        if t < s {
            acc[t as usize] += acc[(t + s) as usize];
        }
        sync_threads();
        s /= 2;
    }
    if t == 0 {
        partial[block_idx_x() as usize] = acc[0];
    }
}

/// `dot_partials` on `dev` against an f64 reference, for several block sizes.
fn shared_memory_dot(dev: &Device) {
    let (mut r, seed) = rng();
    for (&n, block) in [1usize, 100, 1000, 4099].iter().zip([32u32, 64, 128, 256]) {
        let x = r.vec(n, -2.0, 2.0);
        let y = r.vec(n, -2.0, 2.0);
        let g = blocks(n, block);
        let mut partial = vec![0.0f32; g as usize];
        dev.launch(
            &DOT_PARTIALS,
            [g, 1, 1],
            [block, 1, 1],
            &mut args![&x, &y, &mut partial, n as i32],
        )
        .unwrap();
        for (b, p) in partial.iter().enumerate() {
            let lo = b * block as usize;
            let hi = (lo + block as usize).min(n);
            let want: f64 = (lo..hi).map(|i| x[i] as f64 * y[i] as f64).sum();
            let scale: f64 = (lo..hi).map(|i| (x[i] as f64 * y[i] as f64).abs()).sum();
            assert!(
                (*p as f64 - want).abs() <= 1e-5 * scale + 1e-6,
                "block {b} of n = {n}: {p} vs {want} (seed {seed:#x}, {dev})"
            );
        }
    }
}

#[test]
fn cpu_shared_memory_and_barriers() {
    shared_memory_dot(&Device::cpu());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_shared_memory_and_barriers() {
    shared_memory_dot(&Device::wgpu().unwrap());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_shared_memory_and_barriers() {
    shared_memory_dot(&Device::cuda(0).unwrap());
}

/// `#[gpu_fn]` helpers of the module: `logistic` calls `clamp_unit`; the kernel calls
/// `logistic` and a helper of its own body.
#[gpu_fn]
fn clamp_unit(v: f32) -> f32 {
    v.clamp(0.0, 1.0)
}

#[gpu_fn]
fn logistic(v: f32, k: f32) -> f32 {
    clamp_unit(1.0 / (1.0 + (-k * v).exp()))
}

#[gpu_kernel]
fn squash(x: &[f32], out: &mut [f32], k: f32, n: i32) {
    fn twice(v: f32) -> f32 {
        v + v
    }
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        out[i as usize] = twice(logistic(x[i as usize], k));
    }
}

fn module_helpers(dev: &Device) {
    let (mut r, seed) = rng();
    let n = 1 + r.below(3000) as usize;
    let x = r.vec(n, -6.0, 6.0);
    let k = r.uniform(0.5, 2.0);
    let mut out = vec![0.0f32; n];
    dev.launch(
        &SQUASH,
        [blocks(n, 64), 1, 1],
        [64, 1, 1],
        &mut args![&x, &mut out, k, n as i32],
    )
    .unwrap();
    for (i, (&v, &o)) in x.iter().zip(&out).enumerate() {
        let want = 2.0 / (1.0 + (-(k as f64) * v as f64).exp());
        assert!(
            (o as f64 - want).abs() <= 1e-5,
            "{i}: {o} vs {want} (seed {seed:#x}, {dev})"
        );
    }
}

#[test]
fn cpu_module_helpers() {
    assert!(SQUASH
        .cuda_source
        .contains("__device__ float rk_fn_clamp_unit(float v)"));
    assert!(SQUASH
        .wgsl_source
        .unwrap()
        .contains("fn rk_fn_twice(v: f32) -> f32"));
    module_helpers(&Device::cpu());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_module_helpers() {
    module_helpers(&Device::wgpu().unwrap());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_module_helpers() {
    module_helpers(&Device::cuda(0).unwrap());
}

/// 64-bit integers (CUDA and CPU): a mixing hash over u64 and an i64 running offset.
#[gpu_kernel]
fn mix64(keys: &[u64], out: &mut [u64], delta: &mut [i64], seed: u64, base: i64, n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        let mut h = keys[i as usize] ^ seed;
        h = (h ^ (h >> 33u32)).wrapping_mul(0xff51afd7ed558ccdu64);
        h = (h ^ (h >> 33u32)).wrapping_mul(0xc4ceb9fe1a85ec53u64);
        out[i as usize] = h ^ (h >> 33u32);
        delta[i as usize] = base - (i as i64) * 4294967296i64;
    }
}

fn wide_integers(dev: &Device) {
    let (mut r, seed) = rng();
    let n = 1 + r.below(2000) as usize;
    let keys: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
    let s = r.next_u64();
    let base = r.next_u64() as i64 >> 2;
    let (mut out, mut delta) = (vec![0u64; n], vec![0i64; n]);
    dev.launch(
        &MIX64,
        [blocks(n, 64), 1, 1],
        [64, 1, 1],
        &mut args![&keys, &mut out, &mut delta, s, base, n as i32],
    )
    .unwrap();
    for i in 0..n {
        let mut h = keys[i] ^ s;
        h = (h ^ (h >> 33)).wrapping_mul(0xff51afd7ed558ccd);
        h = (h ^ (h >> 33)).wrapping_mul(0xc4ceb9fe1a85ec53);
        assert_eq!(out[i], h ^ (h >> 33), "{i} (seed {seed:#x}, {dev})");
        assert_eq!(
            delta[i],
            base - i as i64 * (1 << 32),
            "{i} (seed {seed:#x}, {dev})"
        );
    }
}

#[test]
fn cpu_wide_integers() {
    assert!(MIX64
        .cuda_source
        .contains("unsigned long long seed, long long base"));
    assert!(MIX64
        .wgsl_source
        .unwrap_err()
        .contains("`u64` is not available in WGSL"));
    wide_integers(&Device::cpu());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_refuses_wide_integers() {
    let mut out = vec![0u64; 1];
    let mut delta = vec![0i64; 1];
    let e = Device::wgpu()
        .unwrap()
        .launch(
            &MIX64,
            [1, 1, 1],
            [64, 1, 1],
            &mut args![&[1u64][..], &mut out, &mut delta, 1u64, 0i64, 1],
        )
        .unwrap_err();
    assert!(e.to_string().contains("u64"), "{e}");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_wide_integers() {
    wide_integers(&Device::cuda(0).unwrap());
}

/// A hand-written kernel (empty `rust_source`): its own WGSL and CUDA C with the layout
/// of its parameters, and a Rust function for the CPU.
const ADD_ONE_HAND: ringkernel::codegen::launch::GpuKernel =
    ringkernel::codegen::launch::GpuKernel {
        name: "add_one_hand",
        params: &[
            ringkernel::codegen::launch::StaticParam {
                name: "x",
                kind: ringkernel::codegen::ParamKind::Slice {
                    elem: ringkernel::codegen::ScalarType::F32,
                    mutable: true,
                },
            },
            ringkernel::codegen::launch::StaticParam {
                name: "n",
                kind: ringkernel::codegen::ParamKind::Scalar(ringkernel::codegen::ScalarType::I32),
            },
        ],
        rust_source: "",
        cuda_source: "extern \"C\" __global__ void add_one_hand(float* x, int n) { \
                  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }",
        wgsl_source: Ok("struct P { n: i32, a: u32, b: u32, c: u32 }
@group(0) @binding(0) var<uniform> prm: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(32, 1, 1)
fn add_one_hand(@builtin(global_invocation_id) g: vec3<u32>) {
    if (i32(g.x) < prm.n) { x[g.x] += 1.0; }
}"),
        cpu: |_, _, args| {
            use ringkernel::codegen::launch::FromArg;
            let [x, n] = args else {
                return Err(ringkernel::codegen::launch::ArgError::Count {
                    kernel: "add_one_hand",
                    expected: 2,
                    got: args.len(),
                });
            };
            let n = i32::from_arg(n, "n")?;
            let x = <&mut [f32]>::from_arg(x, "x")?;
            x.iter_mut().take(n as usize).for_each(|v| *v += 1.0);
            Ok(())
        },
        stencil: None,
    };

fn hand_written(dev: &Device) {
    let mut x: Vec<f32> = (0..77).map(|v| v as f32).collect();
    dev.launch(&ADD_ONE_HAND, [3, 1, 1], [32, 1, 1], &mut args![&mut x, 70])
        .unwrap();
    let want: Vec<f32> = (0..77)
        .map(|v| v as f32 + if v < 70 { 1.0 } else { 0.0 })
        .collect();
    assert_eq!(x, want, "{dev}");
}

#[test]
fn cpu_hand_written_kernel() {
    hand_written(&Device::cpu());
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_hand_written_kernel() {
    let dev = Device::wgpu().unwrap();
    hand_written(&dev);
    // Its WGSL is fixed: another block size is refused.
    let mut x = vec![0.0f32; 4];
    let e = dev
        .launch(&ADD_ONE_HAND, [1, 1, 1], [64, 1, 1], &mut args![&mut x, 4])
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("@workgroup_size(64, 1, 1)"), "{e}");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_hand_written_kernel() {
    hand_written(&Device::cuda(0).unwrap());
}
