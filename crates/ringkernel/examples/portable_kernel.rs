//! Kernels written once in Rust, run on the backend you pick.
//!
//! Each `#[gpu_kernel]` function below (three global kernels and a stencil) is ordinary Rust (the CPU runs it as it is) and is
//! translated at compile time to CUDA C and WGSL (Metal gets naga's MSL of the WGSL).
//! The example launches them with the same inputs on `--backend cpu|wgpu|cuda|metal`,
//! prints the results (the same lines on every backend) and checks them against the CPU;
//! the time to translate and compile each kernel on first use, and from the cache, goes
//! to stderr.
//!
//! ```text
//! cargo run -p ringkernel --example portable_kernel                                 # CPU
//! cargo run -p ringkernel --features wgpu --example portable_kernel -- --backend wgpu
//! cargo run -p ringkernel --features cuda --example portable_kernel -- --backend cuda
//! ```

mod common;

use ringkernel::codegen::dsl::*;
use ringkernel::compute::{Device, LaunchInfo};
use ringkernel::core::util::SplitMix64;
use ringkernel::{args, gpu_kernel, Error, Result};
use std::process::ExitCode;

/// `y = a·x + y`, one thread per element.
#[gpu_kernel]
fn saxpy(a: f32, x: &[f32], y: &mut [f32], n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        y[i as usize] = a.mul_add(x[i as usize], y[i as usize]);
    }
}

/// Counts values into `bins` buckets with atomic adds.
#[gpu_kernel]
fn histogram(data: &[u32], hist: &mut [u32], bins: u32, n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i >= n {
        return;
    }
    atomic_add(&mut hist[(data[i as usize] % bins) as usize], 1u32);
}

/// Clamps each value of a 2-D grid into `[lo, hi]` and marks where it had to, with a
/// 2-D launch.
#[gpu_kernel]
fn clamp_grid(v: &mut [f32], clamped: &mut [u32], lo: f32, hi: f32, w: i32, h: i32) {
    let x = block_idx_x() * block_dim_x() + thread_idx_x();
    let y = block_idx_y() * block_dim_y() + thread_idx_y();
    if x >= w || y >= h {
        return;
    }
    let i = (y * w + x) as usize;
    let c = v[i].clamp(lo, hi);
    clamped[i] = if c != v[i] { 1u32 } else { 0u32 };
    v[i] = c;
}

/// One explicit diffusion step on a grid with a one-cell halo (a stencil kernel).
#[gpu_kernel(halo = 1)]
fn diffuse(pos: GridPos, p: &[f32], out: &mut [f32], c: f32) {
    let lap = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) - 4.0 * p[pos.idx()];
    out[pos.idx()] = p[pos.idx()] + c * lap;
}

struct Outputs {
    y: Vec<f32>,
    hist: Vec<u32>,
    grid: Vec<f32>,
    clamped: Vec<u32>,
    heat: Vec<f32>,
}

fn timing(dev: &Device, name: &str, first: LaunchInfo, again: LaunchInfo) {
    eprintln!(
        "timing: {name} on {}: first launch {:?} (translate + compile {:?}), second launch {:?} ({})",
        dev.kind(),
        first.total_time,
        first.compile_time,
        again.total_time,
        if again.compiled { "compiled again" } else { "from the cache" },
    );
}

fn run_all(dev: &Device, report: bool) -> Result<Outputs> {
    let mut r = SplitMix64::new(2026);
    let n = 1000;
    let x = r.vec(n, -1.0, 1.0);
    let mut y = r.vec(n, -1.0, 1.0);
    let g = [(n as u32).div_ceil(64), 1, 1];
    let first = dev.launch(
        &SAXPY,
        g,
        [64, 1, 1],
        &mut args![0.5f32, &x, &mut y, n as i32],
    )?;
    let again = dev.launch(
        &SAXPY,
        g,
        [64, 1, 1],
        &mut args![0.5f32, &x, &mut y, n as i32],
    )?;
    if report {
        timing(dev, "saxpy", first, again);
    }

    let data: Vec<u32> = (0..5000).map(|_| r.next_u64() as u32).collect();
    let mut hist = vec![0u32; 10];
    dev.launch(
        &HISTOGRAM,
        [(data.len() as u32).div_ceil(128), 1, 1],
        [128, 1, 1],
        &mut args![&data, &mut hist, 10u32, data.len() as i32],
    )?;

    let (w, h) = (37usize, 23usize);
    let mut grid = r.vec(w * h, -2.0, 2.0);
    let mut clamped = vec![0u32; w * h];
    dev.launch(
        &CLAMP_GRID,
        [(w as u32).div_ceil(8), (h as u32).div_ceil(8), 1],
        [8, 8, 1],
        &mut args![&mut grid, &mut clamped, -1.0f32, 1.0f32, w as i32, h as i32],
    )?;

    // A hot spot spreading for 20 steps on a 30 x 20 grid (halo kept at 0).
    let (nx, ny) = (30u32, 20u32);
    let len = DIFFUSE.stencil.map_or(0, |s| s.buffer_len([nx, ny, 1]));
    let mut heat = vec![0.0f32; len];
    heat[11 * (nx as usize + 2) + 16] = 100.0;
    let mut next = heat.clone();
    for _ in 0..20 {
        dev.launch_stencil(&DIFFUSE, [nx, ny, 1], &mut args![&heat, &mut next, 0.2f32])?;
        std::mem::swap(&mut heat, &mut next);
    }
    Ok(Outputs {
        y,
        hist,
        grid,
        clamped,
        heat,
    })
}

fn run() -> Result<()> {
    let backend = common::backend_arg()?;
    let dev = Device::from_name(backend.as_str())?;
    eprintln!("device: {dev}");
    let out = run_all(&dev, true)?;
    let sum: f64 = out.y.iter().map(|&v| v as f64).sum();
    println!("saxpy: y[0..4] = {:.5?}, sum = {sum:.4}", &out.y[..4]);
    println!("histogram of 5000 values in 10 bins: {:?}", out.hist);
    let n_clamped: u32 = out.clamped.iter().sum();
    let gsum: f64 = out.grid.iter().map(|&v| v as f64).sum();
    println!("clamp 37x23 grid into [-1, 1]: {n_clamped} values clamped, sum = {gsum:.4}");
    let total: f64 = out.heat.iter().map(|&v| v as f64).sum();
    let peak = out.heat.iter().fold(0.0f32, |m, &v| m.max(v));
    println!("diffusion, 20 steps on 30x20: total heat {total:.3}, peak {peak:.3}");

    // The CPU ran the same Rust: the GPU must agree with it.
    if dev.kind() != ringkernel::BackendKind::Cpu {
        let want = run_all(&Device::cpu(), false)?;
        let close = out
            .y
            .iter()
            .zip(&want.y)
            .all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs().max(1.0));
        let heat_close = out
            .heat
            .iter()
            .zip(&want.heat)
            .all(|(a, b)| (a - b).abs() <= 1e-4);
        if !close
            || !heat_close
            || out.hist != want.hist
            || out.clamped != want.clamped
            || out.grid != want.grid
        {
            return Err(Error::Device(format!(
                "{} results differ from the CPU running the same Rust",
                dev.kind()
            )));
        }
    }
    println!("same results as the Rust functions on the CPU");
    Ok(())
}

fn main() -> ExitCode {
    common::exit(run())
}
