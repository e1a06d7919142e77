//! Generated CUDA C compiled by NVRTC and run on the GPU, compared with the CPU running
//! the same Rust on fresh random inputs (the kernels of the lavapipe tests). Needs a CUDA
//! GPU: `cargo test -p ringkernel-codegen --test cuda -- --ignored`.

mod common;
mod kernels;

use common::{assert_close, Rng};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use kernels::*;
use ringkernel_codegen::dsl::{
    launch, launch_with_barriers, stencil_2d, stencil_3d, GridPos, GridPos3,
};
use ringkernel_codegen::{transpile_global_kernel, transpile_stencil_kernel, StencilConfig};
use std::sync::Arc;

/// Translates, compiles with NVRTC and loads `f`'s kernel.
fn load(cuda: &str, name: &str) -> (Arc<CudaStream>, CudaFunction) {
    let ctx = CudaContext::new(0).expect("CUDA device 0");
    let ptx = cudarc::nvrtc::compile_ptx(cuda)
        .unwrap_or_else(|e| panic!("NVRTC rejected the generated code: {e:?}\n{cuda}"));
    let module = ctx.load_module(ptx).expect("load module");
    let f = module.load_function(name).expect("kernel function");
    (ctx.default_stream(), f)
}

fn cfg_1d(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(64).max(1) as u32, 1, 1),
        block_dim: (64, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_saxpy_matches_cpu() {
    let mut rng = Rng::fresh("cuda_saxpy");
    let src = transpile_global_kernel(&saxpy::source()).unwrap();
    let (stream, f) = load(&src, "saxpy");
    let n = rng.usize(1, 100_000);
    let a = rng.f32(-3.0, 3.0);
    let x = rng.vec_f32(n, -10.0, 10.0);
    let y = rng.vec_f32(n, -10.0, 10.0);
    let mut cpu = y.clone();
    let cfg = cfg_1d(n);
    launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
        saxpy::saxpy(a, &x, &mut cpu, n as i32)
    });
    let xd = stream.clone_htod(&x).unwrap();
    let mut yd = stream.clone_htod(&y).unwrap();
    let ni = n as i32;
    let mut b = stream.launch_builder(&f);
    b.arg(&a).arg(&xd).arg(&mut yd).arg(&ni);
    // SAFETY: the arguments match the generated signature (float, const float*, float*,
    // int) and both buffers hold n floats, the range the kernel touches.
    unsafe { b.launch(cfg) }.unwrap();
    let got = stream.clone_dtoh(&yd).unwrap();
    assert_close("cuda saxpy", &got, &cpu, 1e-5);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_branchy_match_loops_mixed_match_cpu() {
    let mut rng = Rng::fresh("cuda_mixed");
    // branchy
    {
        let src = transpile_global_kernel(&branchy::source()).unwrap();
        let (stream, f) = load(&src, "branchy");
        let n = rng.usize(100, 10_000);
        let x = rng.vec_f32(n, -8.0, 8.0);
        let (lo, hi) = (rng.f32(-4.0, -1.0), rng.f32(1.0, 4.0));
        let mut cpu = vec![0.0f32; n];
        let cfg = cfg_1d(n);
        launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
            branchy::branchy(&x, &mut cpu, lo, hi, n as i32)
        });
        let xd = stream.clone_htod(&x).unwrap();
        let mut od = stream.alloc_zeros::<f32>(n).unwrap();
        let ni = n as i32;
        let mut b = stream.launch_builder(&f);
        b.arg(&xd).arg(&mut od).arg(&lo).arg(&hi).arg(&ni);
        // SAFETY: (const float*, float*, float, float, int) as generated; n elements each.
        unsafe { b.launch(cfg) }.unwrap();
        assert_close("cuda branchy", &stream.clone_dtoh(&od).unwrap(), &cpu, 1e-5);
    }
    // match
    {
        let src = transpile_global_kernel(&classify::source()).unwrap();
        let (stream, f) = load(&src, "classify");
        let n = rng.usize(1, 10_000);
        let codes = rng.vec_i32(n, -5, 9);
        let mut cpu = vec![0i32; n];
        let cfg = cfg_1d(n);
        launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
            classify::classify(&codes, &mut cpu, n as i32)
        });
        let cd = stream.clone_htod(&codes).unwrap();
        let mut od = stream.alloc_zeros::<i32>(n).unwrap();
        let ni = n as i32;
        let mut b = stream.launch_builder(&f);
        b.arg(&cd).arg(&mut od).arg(&ni);
        // SAFETY: (const int*, int*, int) as generated; n elements each.
        unsafe { b.launch(cfg) }.unwrap();
        assert_eq!(stream.clone_dtoh(&od).unwrap(), cpu);
    }
    // loops
    {
        let src = transpile_global_kernel(&loops::source()).unwrap();
        let (stream, f) = load(&src, "loops");
        let n = rng.usize(1, 10_000);
        let start: Vec<u32> = (0..n).map(|_| rng.i32(0, 10000) as u32).collect();
        let cap = rng.i32(50, 200) as u32;
        let mut cpu = vec![0u32; n];
        let cfg = cfg_1d(n);
        launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
            loops::loops(&start, &mut cpu, n as u32, cap)
        });
        let sd = stream.clone_htod(&start).unwrap();
        let mut od = stream.alloc_zeros::<u32>(n).unwrap();
        let nu = n as u32;
        let mut b = stream.launch_builder(&f);
        b.arg(&sd).arg(&mut od).arg(&nu).arg(&cap);
        // SAFETY: (const unsigned*, unsigned*, unsigned, unsigned); n elements each.
        unsafe { b.launch(cfg) }.unwrap();
        assert_eq!(stream.clone_dtoh(&od).unwrap(), cpu);
    }
    // mixed
    {
        let src = transpile_global_kernel(&mixed::source()).unwrap();
        let (stream, f) = load(&src, "mixed");
        let n = rng.usize(1, 10_000);
        let x = rng.vec_f32(n, -3.0, 3.0);
        let bits: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
        let scale = rng.f32(0.5, 1.0);
        let flip = true;
        let (mut out, mut iout) = (vec![0.0f32; n], vec![0i32; n]);
        let cfg = cfg_1d(n);
        launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
            mixed::mixed(&x, &bits, &mut out, &mut iout, n as i32, scale, flip)
        });
        let xd = stream.clone_htod(&x).unwrap();
        let bd = stream.clone_htod(&bits).unwrap();
        let mut od = stream.alloc_zeros::<f32>(n).unwrap();
        let mut id = stream.alloc_zeros::<i32>(n).unwrap();
        let ni = n as i32;
        let mut b = stream.launch_builder(&f);
        b.arg(&xd)
            .arg(&bd)
            .arg(&mut od)
            .arg(&mut id)
            .arg(&ni)
            .arg(&scale)
            .arg(&flip);
        // SAFETY: (const float*, const unsigned*, float*, int*, int, float, bool) as
        // generated; n elements each.
        unsafe { b.launch(cfg) }.unwrap();
        assert_close("cuda mixed", &stream.clone_dtoh(&od).unwrap(), &out, 5e-3);
        assert_eq!(stream.clone_dtoh(&id).unwrap(), iout);
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_stencils_match_cpu() {
    let mut rng = Rng::fresh("cuda_stencils");
    {
        let src = transpile_stencil_kernel(&laplace::source(), &StencilConfig::new(1)).unwrap();
        let (stream, f) = load(&src, "laplace");
        let (nx, ny) = (rng.usize(1, 300) as u32, rng.usize(1, 200) as u32);
        let len = GridPos::buffer_len(nx, ny, 1);
        let p = rng.vec_f32(len, -1.0, 1.0);
        let out0 = rng.vec_f32(len, -1.0, 1.0);
        let c = rng.f32(0.05, 0.25);
        let mut cpu = out0.clone();
        stencil_2d(nx, ny, 1, |pos| laplace::laplace(pos, &p, &mut cpu, c));
        let pd = stream.clone_htod(&p).unwrap();
        let mut od = stream.clone_htod(&out0).unwrap();
        let (nxi, nyi) = (nx as i32, ny as i32);
        let mut b = stream.launch_builder(&f);
        b.arg(&pd).arg(&mut od).arg(&c).arg(&nxi).arg(&nyi);
        let cfg = LaunchConfig {
            grid_dim: (nx.div_ceil(16), ny.div_ceil(16), 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (const float*, float*, float, int, int) as generated; both buffers hold
        // the grid with its halo.
        unsafe { b.launch(cfg) }.unwrap();
        assert_close("cuda laplace", &stream.clone_dtoh(&od).unwrap(), &cpu, 1e-5);
    }
    {
        let src = transpile_stencil_kernel(&heat3::source(), &StencilConfig::new_3d(1)).unwrap();
        let (stream, f) = load(&src, "heat3");
        let (nx, ny, nz) = (
            rng.usize(1, 60) as u32,
            rng.usize(1, 50) as u32,
            rng.usize(1, 40) as u32,
        );
        let len = GridPos3::buffer_len(nx, ny, nz, 1);
        let p = rng.vec_f32(len, -1.0, 1.0);
        let out0 = vec![0.5f32; len];
        let c = rng.f32(0.05, 0.15);
        let mut cpu = out0.clone();
        stencil_3d(nx, ny, nz, 1, |pos| heat3::heat3(pos, &p, &mut cpu, c));
        let pd = stream.clone_htod(&p).unwrap();
        let mut od = stream.clone_htod(&out0).unwrap();
        let (nxi, nyi, nzi) = (nx as i32, ny as i32, nz as i32);
        let mut b = stream.launch_builder(&f);
        b.arg(&pd)
            .arg(&mut od)
            .arg(&c)
            .arg(&nxi)
            .arg(&nyi)
            .arg(&nzi);
        let cfg = LaunchConfig {
            grid_dim: (nx.div_ceil(8), ny.div_ceil(8), nz.div_ceil(4)),
            block_dim: (8, 8, 4),
            shared_mem_bytes: 0,
        };
        // SAFETY: (const float*, float*, float, int, int, int) as generated; both buffers
        // hold the grid with its halo.
        unsafe { b.launch(cfg) }.unwrap();
        assert_close("cuda heat3", &stream.clone_dtoh(&od).unwrap(), &cpu, 1e-5);
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_atomics_match_cpu() {
    let mut rng = Rng::fresh("cuda_atomics");
    let src = transpile_global_kernel(&histogram::source()).unwrap();
    let (stream, f) = load(&src, "histogram");
    let n = rng.usize(1, 200_000);
    let bins = rng.usize(1, 40) as u32;
    let vals: Vec<u32> = (0..n).map(|_| rng.i32(0, 1_000_000) as u32).collect();
    let extremes0 = vec![i32::MIN, i32::MAX, 0, 0];
    let (mut hist, mut extremes) = (vec![0u32; bins as usize], extremes0.clone());
    let cfg = cfg_1d(n);
    launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
        histogram::histogram(&vals, &mut hist, &mut extremes, n as u32, bins)
    });
    let vd = stream.clone_htod(&vals).unwrap();
    let mut hd = stream.alloc_zeros::<u32>(bins as usize).unwrap();
    let mut ed = stream.clone_htod(&extremes0).unwrap();
    let nu = n as u32;
    let mut b = stream.launch_builder(&f);
    b.arg(&vd).arg(&mut hd).arg(&mut ed).arg(&nu).arg(&bins);
    // SAFETY: (const unsigned*, unsigned*, int*, unsigned, unsigned) as generated; vals
    // holds n values, hist `bins` and extremes 4, the ranges the kernel touches.
    unsafe { b.launch(cfg) }.unwrap();
    assert_eq!(stream.clone_dtoh(&hd).unwrap(), hist);
    assert_eq!(stream.clone_dtoh(&ed).unwrap(), extremes);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_control_flow_matches_cpu() {
    let mut rng = Rng::fresh("cuda_control");
    let src = transpile_global_kernel(&control::source()).unwrap();
    let (stream, f) = load(&src, "control");
    let n = rng.usize(1, 100_000);
    let a = rng.vec_i32(n, -1000, 1000);
    let mut cpu = vec![0i32; n];
    let cfg = cfg_1d(n);
    launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
        control::control(&a, &mut cpu, n as i32)
    });
    let ad = stream.clone_htod(&a).unwrap();
    let mut od = stream.alloc_zeros::<i32>(n).unwrap();
    let ni = n as i32;
    let mut b = stream.launch_builder(&f);
    b.arg(&ad).arg(&mut od).arg(&ni);
    // SAFETY: (const int*, int*, int) as generated; n elements each.
    unsafe { b.launch(cfg) }.unwrap();
    assert_eq!(stream.clone_dtoh(&od).unwrap(), cpu);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_shared_memory_reduction_matches_cpu() {
    let mut rng = Rng::fresh("cuda_block_reduce");
    let src = transpile_global_kernel(&block_reduce::source()).unwrap();
    let (stream, f) = load(&src, "block_reduce");
    for block in [64u32, 256, 32] {
        let n = rng.usize(1, 200_000);
        let x = rng.vec_f32(n, -10.0, 10.0);
        let blocks = n.div_ceil(block as usize);
        let (mut sums, mut maxes) = (vec![0.0f32; blocks], vec![0.0f32; blocks]);
        launch_with_barriers([blocks as u32, 1, 1], [block, 1, 1], || {
            block_reduce::block_reduce(&x, &mut sums, &mut maxes, n as i32)
        });
        let xd = stream.clone_htod(&x).unwrap();
        let mut sd = stream.alloc_zeros::<f32>(blocks).unwrap();
        let mut md = stream.alloc_zeros::<f32>(blocks).unwrap();
        let ni = n as i32;
        let mut b = stream.launch_builder(&f);
        b.arg(&xd).arg(&mut sd).arg(&mut md).arg(&ni);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (const float*, float*, float*, int) as generated; x holds n floats and
        // the outputs one per block, the ranges the kernel touches.
        unsafe { b.launch(cfg) }.unwrap();
        assert_close(
            "cuda block sums",
            &stream.clone_dtoh(&sd).unwrap(),
            &sums,
            1e-5,
        );
        assert_eq!(stream.clone_dtoh(&md).unwrap(), maxes);
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_helper_functions_match_cpu() {
    let mut rng = Rng::fresh("cuda_with_helpers");
    let src = transpile_global_kernel(&with_helpers::source()).unwrap();
    let (stream, f) = load(&src, "with_helpers");
    let n = rng.usize(1, 100_000);
    let x = rng.vec_f32(n, -4.0, 4.0);
    let codes = rng.vec_i32(n, -50, 50);
    let mut cpu = vec![0.0f32; n];
    let cfg = cfg_1d(n);
    launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
        with_helpers::with_helpers(&x, &codes, &mut cpu, n as i32)
    });
    let xd = stream.clone_htod(&x).unwrap();
    let cd = stream.clone_htod(&codes).unwrap();
    let mut od = stream.alloc_zeros::<f32>(n).unwrap();
    let ni = n as i32;
    let mut b = stream.launch_builder(&f);
    b.arg(&xd).arg(&cd).arg(&mut od).arg(&ni);
    // SAFETY: (const float*, const int*, float*, int) as generated; n elements each.
    unsafe { b.launch(cfg) }.unwrap();
    assert_close("cuda helpers", &stream.clone_dtoh(&od).unwrap(), &cpu, 1e-5);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_struct_kernel_matches_cpu() {
    use particles::{Params, Particle};
    let mut rng = Rng::fresh("cuda_structs");
    let src = transpile_global_kernel(&particles::source()).unwrap();
    let (stream, f) = load(&src, "step");
    let n = rng.usize(1, 20_000);
    let ps = random_particles(&mut rng, n);
    let params = Params {
        dt: 0.05,
        gravity: 9.81,
        floor: 0.2,
        n: n as u32,
    };
    let (mut cpu_ps, mut cpu_out) = (ps.clone(), vec![Particle::default(); n]);
    let cfg = cfg_1d(n);
    launch([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
        particles::step(&mut cpu_ps, params, &mut cpu_out)
    });
    // Structs travel as their 32-bit words.
    let words = |v: &[Particle]| -> Vec<u32> { bytemuck::cast_slice(v).to_vec() };
    let mut psd = stream.clone_htod(&words(&ps)).unwrap();
    let prd = stream
        .clone_htod(bytemuck::cast_slice::<Params, u32>(&[params]))
        .unwrap();
    let mut outd = stream.alloc_zeros::<u32>(n * 10).unwrap();
    let mut b = stream.launch_builder(&f);
    b.arg(&mut psd).arg(&prd).arg(&mut outd);
    // SAFETY: the signature is (Particle*, const Params*, Particle*); the buffers hold n
    // Particles (40 bytes = 10 words each) and one Params, what the kernel touches.
    unsafe { b.launch(cfg) }.unwrap();
    for (what, d, want) in [("ps", &psd, &cpu_ps), ("out", &outd, &cpu_out)] {
        let got_words = stream.clone_dtoh(d).unwrap();
        let got: &[Particle] = bytemuck::cast_slice(&got_words);
        for (i, (g, c)) in got.iter().zip(want.iter()).enumerate() {
            assert_eq!((g.id, g.hits), (c.id, c.hits), "{what}[{i}]");
            let gf: Vec<f32> = g
                .pos
                .iter()
                .chain(&g.vel)
                .chain([&g.mass])
                .copied()
                .collect();
            let cf: Vec<f32> = c
                .pos
                .iter()
                .chain(&c.vel)
                .chain([&c.mass])
                .copied()
                .collect();
            assert_close(what, &gf, &cf, 1e-5);
        }
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_barrier_kernels_match_cpu() {
    let mut rng = Rng::fresh("cuda_barriers");
    let src = transpile_global_kernel(&neighbour_sum::source()).unwrap();
    let (stream, f) = load(&src, "neighbour_sum");
    let n = rng.usize(100, 50_000);
    let x = rng.vec_f32(n, -4.0, 4.0);
    let mut cpu = vec![0.0f32; n];
    let cfg = cfg_1d(n);
    launch_with_barriers([cfg.grid_dim.0, 1, 1], [64, 1, 1], || {
        neighbour_sum::neighbour_sum(&x, &mut cpu, n as i32)
    });
    let xd = stream.clone_htod(&x).unwrap();
    let mut od = stream.alloc_zeros::<f32>(n).unwrap();
    let ni = n as i32;
    let mut b = stream.launch_builder(&f);
    b.arg(&xd).arg(&mut od).arg(&ni);
    // SAFETY: (const float*, float*, int), both buffers n floats.
    unsafe { b.launch(cfg) }.unwrap();
    assert_close(
        "cuda neighbour_sum",
        &stream.clone_dtoh(&od).unwrap(),
        &cpu,
        1e-6,
    );

    let src = transpile_global_kernel(&row_softmax::source()).unwrap();
    let (stream, f) = load(&src, "row_softmax");
    let (rows, cols) = (rng.usize(1, 300), rng.usize(1, 3000));
    let x = rng.vec_f32(rows * cols, -6.0, 6.0);
    let mut cpu = vec![0.0f32; rows * cols];
    launch_with_barriers([rows as u32, 1, 1], [64, 1, 1], || {
        row_softmax::row_softmax(&x, &mut cpu, cols as i32)
    });
    let xd = stream.clone_htod(&x).unwrap();
    let mut yd = stream.alloc_zeros::<f32>(rows * cols).unwrap();
    let ci = cols as i32;
    let mut b = stream.launch_builder(&f);
    b.arg(&xd).arg(&mut yd).arg(&ci);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: (const float*, float*, int), both buffers rows * cols floats.
    unsafe { b.launch(cfg) }.unwrap();
    assert_close(
        "cuda row_softmax",
        &stream.clone_dtoh(&yd).unwrap(),
        &cpu,
        1e-5,
    );
}

/// Generated actor handlers compiled by NVRTC inside the persistent template of
/// `ringkernel-cuda`, as its runtime composes them (the facade's `portable_handler` test
/// runs them).
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_handlers_compile_in_the_persistent_template() {
    const HEADER: &str = include_str!("../../ringkernel-cuda/kernels/ringkernel.cuh");
    const TEMPLATE: &str = include_str!("../../ringkernel-cuda/kernels/persistent.cu");
    let handlers: [syn::ItemFn; 2] = [
        syn::parse_quote! {
            fn stats(_ctx: &mut KernelContext<'_>, s: &mut Stats, m: Reading) -> Option<Summary> {
                struct Reading { id: u64, values: [f32; 4], kind: u32, pad: u32 }
                struct Stats { total: i64, seen: u32, peak: f32 }
                struct Summary { id: u64, peak: f32, seen: u32 }
                s.seen += 1;
                s.total += m.kind as i64;
                for k in 0..4usize {
                    s.peak = s.peak.max(m.values[k]);
                }
                if m.kind == 99 { None } else { Some(Summary { id: m.id, peak: s.peak, seen: s.seen }) }
            }
        },
        syn::parse_quote! {
            fn route(ctx: &mut KernelContext<'_>, m: Job) -> Option<Job> {
                struct Job { id: u64, hops: u32, to: u32 }
                if m.hops < 3 {
                    let _ = ctx.send_to(KernelId(m.to), &Job { hops: m.hops + 1, ..m });
                    return None;
                }
                Some(m)
            }
        },
    ];
    let ctx = CudaContext::new(0).expect("CUDA device 0");
    let (major, minor) = ctx.compute_capability().expect("compute capability");
    // As the runtime compiles it: for the device's architecture (the template uses
    // `__nanosleep`, sm_70 and later), C++17.
    let opts = || cudarc::nvrtc::CompileOptions {
        options: vec![
            format!("--gpu-architecture=sm_{major}{minor}"),
            "--std=c++17".into(),
        ],
        ..Default::default()
    };
    for f in &handlers {
        let h = ringkernel_codegen::transpile_handler(f).unwrap();
        let ids: Vec<(&str, u32)> = h.type_ids.iter().map(|n| (n.as_str(), 0x77)).collect();
        let src = format!(
            "{HEADER}\n{}{}\n{TEMPLATE}",
            ringkernel_codegen::handler_prelude(ringkernel_codegen::Target::Cuda, &ids),
            h.cuda
        );
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(&src, opts())
            .unwrap_or_else(|e| panic!("NVRTC rejected handler {}: {e:?}\n{}", h.name, h.cuda));
        let module = ctx.load_module(ptx).expect("load module");
        module
            .load_function("rk_persistent")
            .expect("the persistent kernel");
    }
}
