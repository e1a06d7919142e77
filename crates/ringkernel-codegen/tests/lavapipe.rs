//! Generated WGSL executed on a wgpu adapter (lavapipe in CI) and compared with the CPU
//! running the same Rust function, on fresh random inputs of awkward sizes.

mod common;
mod kernels;

use common::{assert_close, check_wgsl, gpu, run, Data, Rng};
use kernels::*;
use ringkernel_codegen::dsl::{
    launch, launch_with_barriers, stencil_2d, stencil_3d, GridPos, GridPos3,
};
use ringkernel_codegen::{
    transpile_global_kernel_wgsl, transpile_global_kernel_wgsl_with, transpile_stencil_kernel_wgsl,
    ParamValue as P, StencilConfig,
};

/// Workgroups for `n` threads of 64.
fn groups(n: usize) -> [u32; 3] {
    [n.div_ceil(64).max(1) as u32, 1, 1]
}

#[test]
fn saxpy_matches_cpu() {
    let Some(ctx) = gpu("saxpy_matches_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("saxpy");
    let k = transpile_global_kernel_wgsl(&saxpy::source()).unwrap();
    check_wgsl(&k);
    for _ in 0..3 {
        let n = rng.usize(1, 5000);
        let a = rng.f32(-3.0, 3.0);
        let x = rng.vec_f32(n, -10.0, 10.0);
        let y = rng.vec_f32(n + 3, -10.0, 10.0);
        let mut cpu = y.clone();
        let g = groups(n);
        launch(g, [64, 1, 1], || saxpy::saxpy(a, &x, &mut cpu, n as i32));
        let mut data = [Data::F32(x.clone()), Data::F32(y.clone())];
        let params = k.pack_params(&[P::F32(a), P::I32(n as i32)]).unwrap();
        run(&ctx, &k, &params, &mut data, g);
        assert_close("saxpy", data[1].f32(), &cpu, 1e-5);
        // The tail past n is untouched on both.
        assert_eq!(&data[1].f32()[n..], &y[n..]);
    }
}

#[test]
fn branchy_matches_cpu() {
    let Some(ctx) = gpu("branchy_matches_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("branchy");
    let k = transpile_global_kernel_wgsl(&branchy::source()).unwrap();
    check_wgsl(&k);
    let n = rng.usize(100, 3000);
    let x = rng.vec_f32(n, -8.0, 8.0);
    let (lo, hi) = (rng.f32(-4.0, -1.0), rng.f32(1.0, 4.0));
    let mut cpu = vec![0.0f32; n];
    launch(groups(n), [64, 1, 1], || {
        branchy::branchy(&x, &mut cpu, lo, hi, n as i32)
    });
    let mut data = [Data::F32(x.clone()), Data::F32(vec![0.0; n])];
    let params = k
        .pack_params(&[P::F32(lo), P::F32(hi), P::I32(n as i32)])
        .unwrap();
    run(&ctx, &k, &params, &mut data, groups(n));
    assert_close("branchy", data[1].f32(), &cpu, 1e-5);
}

#[test]
fn match_matches_cpu() {
    let Some(ctx) = gpu("match_matches_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("match");
    let k = transpile_global_kernel_wgsl(&classify::source()).unwrap();
    check_wgsl(&k);
    let n = rng.usize(1, 2000);
    let codes = rng.vec_i32(n, -5, 9);
    let mut cpu = vec![0i32; n];
    launch(groups(n), [64, 1, 1], || {
        classify::classify(&codes, &mut cpu, n as i32)
    });
    let mut data = [Data::I32(codes.clone()), Data::I32(vec![0; n])];
    let params = k.pack_params(&[P::I32(n as i32)]).unwrap();
    run(&ctx, &k, &params, &mut data, groups(n));
    assert_eq!(data[1].i32(), &cpu[..]);
}

#[test]
fn loops_match_cpu() {
    let Some(ctx) = gpu("loops_match_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("loops");
    let k = transpile_global_kernel_wgsl(&loops::source()).unwrap();
    check_wgsl(&k);
    let n = rng.usize(1, 1500);
    let start: Vec<u32> = (0..n).map(|_| rng.i32(0, 10000) as u32).collect();
    let cap = rng.i32(50, 200) as u32;
    let mut cpu = vec![0u32; n];
    launch(groups(n), [64, 1, 1], || {
        loops::loops(&start, &mut cpu, n as u32, cap)
    });
    let mut data = [Data::U32(start.clone()), Data::U32(vec![0; n])];
    let params = k.pack_params(&[P::U32(n as u32), P::U32(cap)]).unwrap();
    run(&ctx, &k, &params, &mut data, groups(n));
    let Data::U32(gpu_out) = &data[1] else {
        unreachable!()
    };
    assert_eq!(gpu_out, &cpu);
}

#[test]
fn stencil_2d_matches_cpu() {
    let Some(ctx) = gpu("stencil_2d_matches_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("stencil_2d");
    let cfg = StencilConfig::new(1);
    let k = transpile_stencil_kernel_wgsl(&laplace::source(), &cfg).unwrap();
    check_wgsl(&k);
    let (nx, ny) = (rng.usize(1, 70) as u32, rng.usize(1, 50) as u32);
    let len = GridPos::buffer_len(nx, ny, 1);
    let p = rng.vec_f32(len, -1.0, 1.0);
    let out0 = rng.vec_f32(len, -1.0, 1.0);
    let c = rng.f32(0.05, 0.25);
    let mut cpu = out0.clone();
    stencil_2d(nx, ny, 1, |pos| laplace::laplace(pos, &p, &mut cpu, c));
    let mut data = [Data::F32(p.clone()), Data::F32(out0.clone())];
    let params = k
        .pack_params(&[P::F32(c), P::I32(nx as i32), P::I32(ny as i32)])
        .unwrap();
    let g = [nx.div_ceil(16), ny.div_ceil(16), 1];
    run(&ctx, &k, &params, &mut data, g);
    assert_close("laplace", data[1].f32(), &cpu, 1e-5);
}

#[test]
fn stencil_3d_matches_cpu() {
    let Some(ctx) = gpu("stencil_3d_matches_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("stencil_3d");
    let cfg = StencilConfig::new_3d(1);
    let k = transpile_stencil_kernel_wgsl(&heat3::source(), &cfg).unwrap();
    check_wgsl(&k);
    let (nx, ny, nz) = (
        rng.usize(1, 21) as u32,
        rng.usize(1, 19) as u32,
        rng.usize(1, 11) as u32,
    );
    let len = GridPos3::buffer_len(nx, ny, nz, 1);
    let p = rng.vec_f32(len, -1.0, 1.0);
    let out0 = vec![0.5f32; len];
    let c = rng.f32(0.05, 0.15);
    let mut cpu = out0.clone();
    stencil_3d(nx, ny, nz, 1, |pos| heat3::heat3(pos, &p, &mut cpu, c));
    let mut data = [Data::F32(p.clone()), Data::F32(out0.clone())];
    let params = k
        .pack_params(&[
            P::F32(c),
            P::I32(nx as i32),
            P::I32(ny as i32),
            P::I32(nz as i32),
        ])
        .unwrap();
    let g = [nx.div_ceil(8), ny.div_ceil(8), nz.div_ceil(4)];
    run(&ctx, &k, &params, &mut data, g);
    assert_close("heat3", data[1].f32(), &cpu, 1e-5);
}

#[test]
fn mixed_constructs_match_cpu() {
    let Some(ctx) = gpu("mixed_constructs_match_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("mixed");
    let k = transpile_global_kernel_wgsl(&mixed::source()).unwrap();
    check_wgsl(&k);
    for flip in [false, true] {
        let n = rng.usize(1, 1000);
        let x = rng.vec_f32(n, -3.0, 3.0);
        let bits: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
        let scale = rng.f32(0.5, 1.0);
        let (mut out, mut iout) = (vec![0.0f32; n], vec![0i32; n]);
        launch(groups(n), [64, 1, 1], || {
            mixed::mixed(&x, &bits, &mut out, &mut iout, n as i32, scale, flip)
        });
        let mut data = [
            Data::F32(x.clone()),
            Data::U32(bits.clone()),
            Data::F32(vec![0.0; n]),
            Data::I32(vec![0; n]),
        ];
        let params = k
            .pack_params(&[P::I32(n as i32), P::F32(scale), P::Bool(flip)])
            .unwrap();
        run(&ctx, &k, &params, &mut data, groups(n));
        // Transcendentals on a GPU are allowed a few ULP (Vulkan's precision rules).
        assert_close("mixed.out", data[2].f32(), &out, 5e-3);
        assert_eq!(data[3].i32(), &iout[..]);
    }
}

#[test]
fn atomics_match_cpu() {
    let Some(ctx) = gpu("atomics_match_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("atomics");
    let k = transpile_global_kernel_wgsl(&histogram::source()).unwrap();
    check_wgsl(&k);
    let n = rng.usize(1, 5000);
    let bins = rng.usize(1, 40) as u32;
    let vals: Vec<u32> = (0..n).map(|_| rng.i32(0, 1_000_000) as u32).collect();
    let extremes0 = vec![i32::MIN, i32::MAX, 0, 0];
    let (mut hist, mut extremes) = (vec![0u32; bins as usize], extremes0.clone());
    launch(groups(n), [64, 1, 1], || {
        histogram::histogram(&vals, &mut hist, &mut extremes, n as u32, bins)
    });
    assert_eq!(hist.iter().sum::<u32>(), n as u32);
    let mut data = [
        Data::U32(vals.clone()),
        Data::U32(vec![0; bins as usize]),
        Data::I32(extremes0),
    ];
    let params = k.pack_params(&[P::U32(n as u32), P::U32(bins)]).unwrap();
    run(&ctx, &k, &params, &mut data, groups(n));
    assert_eq!(data[1], Data::U32(hist));
    assert_eq!(data[2].i32(), &extremes[..]);
}

#[test]
fn control_flow_matches_cpu() {
    let Some(ctx) = gpu("control_flow_matches_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("control");
    let k = transpile_global_kernel_wgsl(&control::source()).unwrap();
    check_wgsl(&k);
    let n = rng.usize(1, 3000);
    let a = rng.vec_i32(n, -1000, 1000);
    let mut cpu = vec![0i32; n];
    launch(groups(n), [64, 1, 1], || {
        control::control(&a, &mut cpu, n as i32)
    });
    let mut data = [Data::I32(a.clone()), Data::I32(vec![0; n])];
    let params = k.pack_params(&[P::I32(n as i32)]).unwrap();
    run(&ctx, &k, &params, &mut data, groups(n));
    assert_eq!(data[1].i32(), &cpu[..]);
}

/// Block sums and maxima through shared memory and barriers: the CPU (threads of a block
/// interleaved at the barriers) against an f64 reference, then the GPU against the CPU.
#[test]
fn shared_memory_reduction_matches_cpu_and_reference() {
    let mut rng = Rng::fresh("block_reduce");
    for block in [64u32, 256, 32] {
        let n = rng.usize(1, 3000);
        let x = rng.vec_f32(n, -10.0, 10.0);
        let blocks = n.div_ceil(block as usize);
        let (mut sums, mut maxes) = (vec![0.0f32; blocks], vec![0.0f32; blocks]);
        launch_with_barriers([blocks as u32, 1, 1], [block, 1, 1], || {
            block_reduce::block_reduce(&x, &mut sums, &mut maxes, n as i32)
        });
        for (b, chunk) in x.chunks(block as usize).enumerate() {
            let want: f64 = chunk.iter().map(|&v| v as f64).sum();
            let bound = 1e-5 * chunk.iter().map(|v| v.abs() as f64).sum::<f64>() + 1e-6;
            assert!(
                (sums[b] as f64 - want).abs() <= bound,
                "block {b}: {} vs {want}",
                sums[b]
            );
            let m = chunk.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(maxes[b], m, "block {b} max");
        }
        let Some(ctx) = gpu("shared_memory_reduction_matches_cpu_and_reference") else {
            continue;
        };
        let k = transpile_global_kernel_wgsl_with(&block_reduce::source(), [block, 1, 1]).unwrap();
        check_wgsl(&k);
        let mut data = [
            Data::F32(x.clone()),
            Data::F32(vec![0.0; blocks]),
            Data::F32(vec![0.0; blocks]),
        ];
        let params = k.pack_params(&[P::I32(n as i32)]).unwrap();
        run(&ctx, &k, &params, &mut data, [blocks as u32, 1, 1]);
        assert_close("block sums", data[1].f32(), &sums, 1e-5);
        assert_eq!(data[2].f32(), &maxes[..]);
    }
}

/// A shared 16 x 16 tile with 2-D thread indices: an exact transpose on the CPU and
/// the GPU.
#[test]
fn shared_tile_transpose_matches_cpu() {
    let mut rng = Rng::fresh("tile_transpose");
    let (w, h) = (rng.usize(1, 90), rng.usize(1, 70));
    let a: Vec<u32> = (0..w * h).map(|_| rng.i32(0, i32::MAX) as u32).collect();
    let grid = [w.div_ceil(16) as u32, h.div_ceil(16) as u32, 1];
    let mut cpu = vec![0u32; w * h];
    launch_with_barriers(grid, [16, 16, 1], || {
        tile_transpose::tile_transpose(&a, &mut cpu, w as i32, h as i32)
    });
    for y in 0..h {
        for x in 0..w {
            assert_eq!(cpu[x * h + y], a[y * w + x], "({x}, {y})");
        }
    }
    let Some(ctx) = gpu("shared_tile_transpose_matches_cpu") else {
        return;
    };
    let k = transpile_global_kernel_wgsl_with(&tile_transpose::source(), [16, 16, 1]).unwrap();
    check_wgsl(&k);
    let mut data = [Data::U32(a.clone()), Data::U32(vec![0; w * h])];
    let params = k
        .pack_params(&[P::I32(w as i32), P::I32(h as i32)])
        .unwrap();
    run(&ctx, &k, &params, &mut data, grid);
    assert_eq!(data[1], Data::U32(cpu));
}

/// Helper functions (device functions), one calling another, with early returns, a
/// `match` value, a `mut` parameter and a `bool` result.
#[test]
fn helper_functions_match_cpu() {
    let mut rng = Rng::fresh("with_helpers");
    let n = rng.usize(1, 3000);
    let x = rng.vec_f32(n, -4.0, 4.0);
    let codes = rng.vec_i32(n, -50, 50);
    let mut cpu = vec![0.0f32; n];
    launch(groups(n), [64, 1, 1], || {
        with_helpers::with_helpers(&x, &codes, &mut cpu, n as i32)
    });
    // An independent f64 evaluation of the same formulas.
    for i in 0..n {
        let (v, c) = (x[i] as f64, codes[i]);
        let smooth = |v: f64, k: f64| {
            if v.abs() < k {
                0.5 * v * v / k
            } else {
                v.abs() - 0.5 * k
            }
        };
        let w = match c.rem_euclid(4) {
            0 => 1.0,
            1 | 2 => 0.25,
            _ => -1.5,
        };
        let (mut s, mut k) = (c.abs() + 1, 0);
        while s > 1 && k < 40 {
            s = if s % 2 == 0 { s / 2 } else { 3 * s + 1 };
            k += 1;
        }
        let mut r = smooth(v, 0.75) * w + k as f64;
        if smooth(v, 1.0) > 2.0 {
            r = -r;
        }
        assert!(
            (cpu[i] as f64 - r).abs() <= 1e-5 * r.abs().max(1.0),
            "{i}: {} vs {r}",
            cpu[i]
        );
    }
    let Some(ctx) = gpu("helper_functions_match_cpu") else {
        return;
    };
    let k = transpile_global_kernel_wgsl(&with_helpers::source()).unwrap();
    check_wgsl(&k);
    let mut data = [
        Data::F32(x.clone()),
        Data::I32(codes.clone()),
        Data::F32(vec![0.0; n]),
    ];
    let params = k.pack_params(&[P::I32(n as i32)]).unwrap();
    run(&ctx, &k, &params, &mut data, groups(n));
    assert_close("helpers", data[2].f32(), &cpu, 1e-5);
}
