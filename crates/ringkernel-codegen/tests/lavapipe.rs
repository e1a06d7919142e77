//! Generated WGSL executed on a wgpu adapter (lavapipe in CI) and compared with the CPU
//! running the same Rust function, on fresh random inputs of awkward sizes.

mod common;

use common::{assert_close, check_wgsl, gpu, run, Data, Rng};
use ringkernel_codegen::dsl::{launch, stencil_2d, stencil_3d, GridPos, GridPos3};
use ringkernel_codegen::{
    transpile_global_kernel_wgsl, transpile_stencil_kernel_wgsl, ParamValue as P,
    StencilConfig,
};

twin! { saxpy =>
    pub fn saxpy(a: f32, x: &[f32], y: &mut [f32], n: i32) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i < n {
            y[i as usize] = a.mul_add(x[i as usize], y[i as usize]);
        }
    }
}

twin! { branchy =>
    pub fn branchy(x: &[f32], out: &mut [f32], lo: f32, hi: f32, n: i32) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i >= n {
            return;
        }
        let v = x[i as usize];
        let mut r = v.clamp(lo, hi);
        if v < lo {
            r = lo - (lo - v).sqrt();
        } else if v > hi {
            r = hi + (v - hi).min(1.0);
        } else if v.abs() < 0.5 {
            r = 0.0;
        }
        let s = if r > 0.0 { r * 2.0 } else { r.abs().max(0.25) };
        let t = if s > 3.0 && !(v < 0.0) || v.floor() == -2.0 { -s } else { s + 1.0 };
        out[i as usize] = t;
    }
}

twin! { classify =>
    pub fn classify(codes: &[i32], out: &mut [i32], n: i32) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i >= n {
            return;
        }
        let c = codes[i as usize];
        let v = match c {
            0 => 10,
            1 | 2 => {
                let t = c * 3;
                t + 1
            }
            3 => -c,
            -1 => 77,
            _ => c * c,
        };
        let mut w = 0;
        match c & 3 {
            0 => w = 1,
            1 => {
                w = 2;
            }
            _ => {}
        }
        out[i as usize] = v * 4 + w;
    }
}

twin! { loops =>
    pub fn loops(start: &[u32], steps: &mut [u32], n: u32, cap: u32) {
        let i = (block_idx_x() * block_dim_x() + thread_idx_x()) as u32;
        if i >= n {
            return;
        }
        let mut v = start[i as usize];
        let mut k = 0u32;
        loop {
            if v <= 1 {
                break;
            }
            if k >= cap {
                break;
            }
            k += 1;
            if v % 2 == 0 {
                v /= 2;
                continue;
            }
            v = 3 * v + 1;
        }
        let mut odd = 0u32;
        for j in 0..k {
            if j % 3 == 0 {
                continue;
            }
            odd += 1;
            if odd > 50 {
                break;
            }
        }
        let mut w = 0u32;
        while w * w < k {
            w += 1;
        }
        let lim = start[i as usize] % 9;
        let mut m = 0u32;
        loop {
            match (m == lim) as u32 {
                1 => break,
                _ => m += 1,
            }
        }
        let mut stepped = 0u32;
        for s in (1..=k).step_by(4) {
            stepped += s % 5;
        }
        steps[i as usize] = k * 100000 + odd * 1000 + w * 10 + m + stepped % 7 * 100_000_000;
    }
}

twin! { laplace =>
    pub fn laplace(pos: GridPos, p: &[f32], out: &mut [f32], c: f32) {
        let centre = p[pos.idx()];
        let lap = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) - 4.0 * centre;
        let diag = pos.at(p, 1, -1) - pos.at(p, -1, 1);
        out[pos.idx()] = centre + c * lap + 0.125 * diag;
    }
}

twin! { heat3 =>
    pub fn heat3(pos: GridPos3, p: &[f32], out: &mut [f32], c: f32) {
        let centre = p[pos.idx()];
        let sum = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) + pos.up(p)
            + pos.down(p);
        out[pos.idx()] = centre + c * (sum - 6.0 * centre) + 0.01 * pos.at(p, 0, 0, -1);
    }
}

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
        let params = k
            .pack_params(&[P::F32(a), P::I32(n as i32)])
            .unwrap();
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
