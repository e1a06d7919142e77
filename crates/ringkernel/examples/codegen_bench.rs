//! Generated kernels against hand-written ones, in the same run, on every backend given.
//!
//! Three kernels are written once in Rust (`#[gpu_kernel]`): saxpy, a row softmax (one
//! block per row, max and sum reduced in shared memory) and a 5-point stencil. Their
//! peers are the same algorithms written by hand in CUDA C and WGSL, with the same
//! parameters and binding layout, and a plain Rust loop for the CPU. Both go through
//! `Device::launch` with device-resident tensors, so a launch times the dispatch and the
//! kernel (no copies). For each (kernel, backend) the table gives the time per launch
//! of the generated and of the hand-written kernel (the best of two interleaved rounds
//! of `--iters` launches each), their ratio, and the first launch's translate + compile
//! time next to a launch from the cache. A second table gives the time to translate
//! the Rust source alone. The outputs of both are compared; a mismatch fails the run.
//!
//! ```text
//! cargo run --release -p ringkernel --example codegen_bench                    # CPU
//! cargo run --release -p ringkernel --features wgpu --example codegen_bench -- --backends cpu,wgpu
//! cargo run --release -p ringkernel --features full --example codegen_bench -- \
//!     --backends cuda,wgpu --scale large --iters 200
//! ```
//!
//! `--backends` (default: every backend compiled in that opens), `--scale small|large`
//! (default small: sizes for CI), `--iters N` (default 20 on a GPU, 2 on the CPU).

mod common;

use ringkernel::codegen::dsl::*;
use ringkernel::codegen::launch::{
    ArgError, FromArg, GpuKernel, KernelArg, StaticParam, StencilInfo,
};
use ringkernel::codegen::{ParamKind, ScalarType};
use ringkernel::compute::{Device, LaunchInfo, Tensor};
use ringkernel::core::util::SplitMix64;
use ringkernel::{args, gpu_kernel, BackendKind, Error, Result};
use std::process::ExitCode;
use std::time::{Duration, Instant};

// ---- the generated kernels ------------------------------------------------------------

/// `y = a·x + y`.
#[gpu_kernel]
fn saxpy(a: f32, x: &[f32], y: &mut [f32], n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        y[i as usize] = a.mul_add(x[i as usize], y[i as usize]);
    }
}

/// Softmax of each row of `cols` values: one block per row (256 threads), the row's
/// maximum and sum reduced in shared memory.
#[gpu_kernel]
fn softmax_rows(x: &[f32], y: &mut [f32], cols: i32) {
    let mut red = shared_array::<f32, 256>();
    let t = thread_idx_x();
    let base = block_idx_x() * cols;
    let mut m = f32::NEG_INFINITY;
    let mut c = t;
    while c < cols {
        m = m.max(x[(base + c) as usize]);
        c += block_dim_x();
    }
    red[t as usize] = m;
    sync_threads();
    let mut s = block_dim_x() / 2;
    while s > 0 {
        if t < s {
            red[t as usize] = red[t as usize].max(red[(t + s) as usize]);
        }
        sync_threads();
        s /= 2;
    }
    let mx = red[0];
    sync_threads();
    let mut sum = 0.0f32;
    c = t;
    while c < cols {
        let e = (x[(base + c) as usize] - mx).exp();
        y[(base + c) as usize] = e;
        sum += e;
        c += block_dim_x();
    }
    red[t as usize] = sum;
    sync_threads();
    s = block_dim_x() / 2;
    while s > 0 {
        if t < s {
            red[t as usize] += red[(t + s) as usize];
        }
        sync_threads();
        s /= 2;
    }
    let inv = 1.0 / red[0];
    c = t;
    while c < cols {
        y[(base + c) as usize] *= inv;
        c += block_dim_x();
    }
}

/// One explicit step of `p + c·∇²p` (5-point Laplacian, halo of one cell).
#[gpu_kernel(halo = 1)]
fn lap5(pos: GridPos, p: &[f32], out: &mut [f32], c: f32) {
    let lap = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) - 4.0 * p[pos.idx()];
    out[pos.idx()] = p[pos.idx()] + c * lap;
}

// ---- the hand-written peers -----------------------------------------------------------

const F32S: ParamKind = ParamKind::Slice {
    elem: ScalarType::F32,
    mutable: false,
};
const F32S_MUT: ParamKind = ParamKind::Slice {
    elem: ScalarType::F32,
    mutable: true,
};
const F32: ParamKind = ParamKind::Scalar(ScalarType::F32);
const I32: ParamKind = ParamKind::Scalar(ScalarType::I32);

fn arg<'a, T: FromArg<'a>>(
    a: &'a mut KernelArg<'_>,
    name: &'static str,
) -> std::result::Result<T, ArgError> {
    T::from_arg(a, name)
}

fn count(kernel: &'static str, expected: usize, got: usize) -> ArgError {
    ArgError::Count {
        kernel,
        expected,
        got,
    }
}

fn saxpy_cpu(
    _: [u32; 3],
    _: [u32; 3],
    args: &mut [KernelArg<'_>],
) -> std::result::Result<(), ArgError> {
    let got = args.len();
    let [a, x, y, n] = args else {
        return Err(count("saxpy_hand", 4, got));
    };
    let (a, x, y, n): (f32, &[f32], &mut [f32], i32) =
        (arg(a, "a")?, arg(x, "x")?, arg(y, "y")?, arg(n, "n")?);
    for (y, x) in y.iter_mut().zip(x).take(n.max(0) as usize) {
        *y = a.mul_add(*x, *y);
    }
    Ok(())
}

const SAXPY_HAND: GpuKernel = GpuKernel {
    name: "saxpy_hand",
    params: &[
        StaticParam {
            name: "a",
            kind: F32,
        },
        StaticParam {
            name: "x",
            kind: F32S,
        },
        StaticParam {
            name: "y",
            kind: F32S_MUT,
        },
        StaticParam {
            name: "n",
            kind: I32,
        },
    ],
    rust_source: "",
    cuda_source: r#"
extern "C" __global__ void saxpy_hand(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaf(a, x[i], y[i]);
}
"#,
    wgsl_source: Ok(r#"
struct P { a: f32, n: i32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> prm: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256, 1, 1)
fn saxpy_hand(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>,
              @builtin(num_workgroups) nw: vec3<u32>) {
    // Launched as (65535, k) workgroups when n needs more than 65535 of them.
    let i = (w.x + w.y * nw.x) * 256u + l.x;
    if (i32(i) < prm.n) {
        y[i] = fma(prm.a, x[i], y[i]);
    }
}
"#),
    cpu: saxpy_cpu,
    stencil: None,
};

fn softmax_cpu(
    grid: [u32; 3],
    _: [u32; 3],
    args: &mut [KernelArg<'_>],
) -> std::result::Result<(), ArgError> {
    let got = args.len();
    let [x, y, cols] = args else {
        return Err(count("softmax_hand", 3, got));
    };
    let (x, y, cols): (&[f32], &mut [f32], i32) = (arg(x, "x")?, arg(y, "y")?, arg(cols, "cols")?);
    let cols = cols as usize;
    for r in 0..grid[0] as usize {
        let (xr, yr) = (
            &x[r * cols..(r + 1) * cols],
            &mut y[r * cols..(r + 1) * cols],
        );
        let m = xr.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (y, x) in yr.iter_mut().zip(xr) {
            *y = (x - m).exp();
            sum += *y;
        }
        let inv = 1.0 / sum;
        yr.iter_mut().for_each(|y| *y *= inv);
    }
    Ok(())
}

const SOFTMAX_HAND: GpuKernel = GpuKernel {
    name: "softmax_hand",
    params: &[
        StaticParam {
            name: "x",
            kind: F32S,
        },
        StaticParam {
            name: "y",
            kind: F32S_MUT,
        },
        StaticParam {
            name: "cols",
            kind: I32,
        },
    ],
    rust_source: "",
    cuda_source: r#"
extern "C" __global__ void softmax_hand(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float red[256];
    const int t = threadIdx.x;
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float m = __int_as_float(0xff800000);  // -inf (NVRTC has no math.h macros)
    for (int c = t; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    red[t] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) red[t] = fmaxf(red[t], red[t + s]);
        __syncthreads();
    }
    const float mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = t; c < cols; c += blockDim.x) {
        float e = expf(xr[c] - mx);
        yr[c] = e;
        sum += e;
    }
    red[t] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) red[t] += red[t + s];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    for (int c = t; c < cols; c += blockDim.x) yr[c] *= inv;
}
"#,
    wgsl_source: Ok(r#"
struct P { cols: i32, p0: u32, p1: u32, p2: u32 }
@group(0) @binding(0) var<uniform> prm: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
var<workgroup> red: array<f32, 256>;
@compute @workgroup_size(256, 1, 1)
fn softmax_hand(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    let cols = u32(prm.cols);
    let base = wid.x * cols;
    var m = -bitcast<f32>(0x7f800000u);
    for (var c = t; c < cols; c += 256u) { m = max(m, x[base + c]); }
    red[t] = m;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (t < s) { red[t] = max(red[t], red[t + s]); }
        workgroupBarrier();
    }
    let mx = red[0];
    workgroupBarrier();
    var sum = 0.0;
    for (var c = t; c < cols; c += 256u) {
        let e = exp(x[base + c] - mx);
        y[base + c] = e;
        sum += e;
    }
    red[t] = sum;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (t < s) { red[t] += red[t + s]; }
        workgroupBarrier();
    }
    let inv = 1.0 / red[0];
    for (var c = t; c < cols; c += 256u) { y[base + c] *= inv; }
}
"#),
    cpu: softmax_cpu,
    stencil: None,
};

fn lap5_cpu(
    grid: [u32; 3],
    _: [u32; 3],
    args: &mut [KernelArg<'_>],
) -> std::result::Result<(), ArgError> {
    let got = args.len();
    let [p, out, c] = args else {
        return Err(count("lap5_hand", 3, got));
    };
    let (p, out, c): (&[f32], &mut [f32], f32) = (arg(p, "p")?, arg(out, "out")?, arg(c, "c")?);
    let (nx, ny) = (grid[0] as usize, grid[1] as usize);
    let sy = nx + 2;
    for y in 1..=ny {
        for x in 1..=nx {
            let i = y * sy + x;
            let lap = p[i - sy] + p[i + sy] + p[i - 1] + p[i + 1] - 4.0 * p[i];
            out[i] = p[i] + c * lap;
        }
    }
    Ok(())
}

const LAP5_HAND: GpuKernel = GpuKernel {
    name: "lap5_hand",
    params: &[
        StaticParam {
            name: "pos",
            kind: ParamKind::GridPos { dims: 2 },
        },
        StaticParam {
            name: "p",
            kind: F32S,
        },
        StaticParam {
            name: "out",
            kind: F32S_MUT,
        },
        StaticParam {
            name: "c",
            kind: F32,
        },
    ],
    rust_source: "",
    cuda_source: r#"
extern "C" __global__ void lap5_hand(const float* __restrict__ p, float* __restrict__ out, float c, int nx, int ny) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= nx || y >= ny) return;
    size_t sy = (size_t)nx + 2;
    size_t i = (size_t)(y + 1) * sy + (size_t)(x + 1);
    float lap = p[i - sy] + p[i + sy] + p[i - 1] + p[i + 1] - 4.0f * p[i];
    out[i] = p[i] + c * lap;
}
"#,
    wgsl_source: Ok(r#"
struct P { c: f32, nx: i32, ny: i32, p0: u32 }
@group(0) @binding(0) var<uniform> prm: P;
@group(0) @binding(1) var<storage, read> p: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(16, 16, 1)
fn lap5_hand(@builtin(global_invocation_id) g: vec3<u32>) {
    if (i32(g.x) >= prm.nx || i32(g.y) >= prm.ny) { return; }
    let sy = u32(prm.nx) + 2u;
    let i = (g.y + 1u) * sy + g.x + 1u;
    let lap = p[i - sy] + p[i + sy] + p[i - 1u] + p[i + 1u] - 4.0 * p[i];
    out[i] = p[i] + prm.c * lap;
}
"#),
    cpu: lap5_cpu,
    stencil: Some(StencilInfo { dims: 2, halo: 1 }),
};

// ---- the runs -------------------------------------------------------------------------

type Launch<'d> = Box<dyn Fn(&GpuKernel, &mut Tensor) -> Result<LaunchInfo> + 'd>;

/// A kernel and its peer with their inputs on one device.
struct Prepared<'d> {
    name: &'static str,
    size: String,
    generated: &'static GpuKernel,
    hand: &'static GpuKernel,
    out_init: Vec<f32>,
    launch: Launch<'d>,
}

#[derive(Clone, Copy, PartialEq)]
enum Scale {
    Small,
    Large,
}

fn prepare(dev: &Device, scale: Scale) -> Result<Vec<Prepared<'_>>> {
    let mut r = SplitMix64::new(13);
    let large = scale == Scale::Large;
    let n = if large { 1 << 24 } else { 100_003 };
    let x = Tensor::from_slice(dev, &r.vec(n, -1.0, 1.0), &[n])?;
    let saxpy = Prepared {
        name: "saxpy",
        size: format!("n={n}"),
        generated: &SAXPY,
        hand: &SAXPY_HAND,
        out_init: r.vec(n, -1.0, 1.0),
        launch: Box::new(move |k, out| {
            let groups = (n as u32).div_ceil(256);
            // Over WebGPU's 65,535 workgroups per dimension the launcher folds the grid of
            // a generated kernel itself; the hand-written peer is launched folded.
            let g =
                if k.rust_source.is_empty() && dev.kind() == BackendKind::Wgpu && groups > 65_535 {
                    [65_535, groups.div_ceil(65_535), 1]
                } else {
                    [groups, 1, 1]
                };
            dev.launch(k, g, [256, 1, 1], &mut args![0.5f32, &x, out, n as i32])
        }),
    };
    let (rows, cols) = if large { (4096, 4096) } else { (16, 1000) };
    let xs = Tensor::from_slice(dev, &r.vec(rows * cols, -8.0, 8.0), &[rows * cols])?;
    let softmax = Prepared {
        name: "softmax row",
        size: format!("{rows}x{cols}"),
        generated: &SOFTMAX_ROWS,
        hand: &SOFTMAX_HAND,
        out_init: vec![0.0; rows * cols],
        launch: Box::new(move |k, out| {
            dev.launch(
                k,
                [rows as u32, 1, 1],
                [256, 1, 1],
                &mut args![&xs, out, cols as i32],
            )
        }),
    };
    let (nx, ny) = if large {
        (4096u32, 4096u32)
    } else {
        (256, 256)
    };
    let len = (nx as usize + 2) * (ny as usize + 2);
    let p = Tensor::from_slice(dev, &r.vec(len, 0.0, 1.0), &[len])?;
    let stencil = Prepared {
        name: "5-point stencil",
        size: format!("{nx}x{ny}"),
        generated: &LAP5,
        hand: &LAP5_HAND,
        out_init: vec![0.0; len],
        launch: Box::new(move |k, out| {
            dev.launch_stencil(k, [nx, ny, 1], &mut args![&p, out, 0.2f32])
        }),
    };
    Ok(vec![saxpy, softmax, stencil])
}

/// What one variant measured.
struct Measured {
    first: LaunchInfo,
    cached: LaunchInfo,
    best: Duration,
    output: Vec<f32>,
}

/// `iters` launches, then a wait for the device: the time per launch.
fn timed(
    dev: &Device,
    p: &Prepared<'_>,
    k: &GpuKernel,
    out: &mut Tensor,
    iters: u32,
) -> Result<Duration> {
    dev.synchronize()?;
    let t = Instant::now();
    for _ in 0..iters {
        (p.launch)(k, out)?;
    }
    dev.synchronize()?;
    Ok(t.elapsed() / iters)
}

/// Both variants of `p`: first and cached launches, then two interleaved rounds.
fn measure(dev: &Device, p: &Prepared<'_>, iters: u32) -> Result<(Measured, Measured)> {
    let mut outs = [
        Tensor::from_slice(dev, &p.out_init, &[p.out_init.len()])?,
        Tensor::from_slice(dev, &p.out_init, &[p.out_init.len()])?,
    ];
    let kernels = [p.generated, p.hand];
    let mut firsts = Vec::new();
    for (k, out) in kernels.iter().zip(outs.iter_mut()) {
        let first = (p.launch)(k, out)?;
        let cached = (p.launch)(k, out)?;
        firsts.push((first, cached));
    }
    let mut best = [Duration::MAX; 2];
    for _round in 0..2 {
        for (v, (k, out)) in kernels.iter().zip(outs.iter_mut()).enumerate() {
            best[v] = best[v].min(timed(dev, p, k, out, iters)?);
        }
    }
    let [g, h] = outs;
    Ok((
        Measured {
            first: firsts[0].0,
            cached: firsts[0].1,
            best: best[0],
            output: g.to_vec()?,
        },
        Measured {
            first: firsts[1].0,
            cached: firsts[1].1,
            best: best[1],
            output: h.to_vec()?,
        },
    ))
}

fn us(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}

fn ms_or_dash(info: &LaunchInfo) -> String {
    if info.compiled {
        format!("{:.2}", info.compile_time.as_secs_f64() * 1e3)
    } else {
        "-".into()
    }
}

/// Largest difference relative to the values' scale.
fn max_rel_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs() / (x.abs().max(y.abs()) as f64).max(1e-3))
        .fold(0.0, f64::max)
}

fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let long = format!("--{name}");
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&format!("{long}="))
            .map(str::to_string)
            .or_else(|| (*a == long).then(|| args.get(i + 1).cloned()).flatten())
    })
}

/// Time to parse and translate each generated kernel's Rust source to WGSL (what a first
/// launch on wgpu/Metal does before compiling; CUDA C is translated at build time).
fn translation_table() -> Result<()> {
    println!();
    println!("translate only (parse the Rust + translate to WGSL, on this CPU, mean of 50):");
    println!("{:<18} {:>12}", "kernel", "µs");
    for k in [&SAXPY, &SOFTMAX_ROWS, &LAP5] {
        let reps = 50;
        let block = k.stencil.map_or([256, 1, 1], |s| s.config().workgroup_size);
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(k.wgsl(block).map_err(Error::invalid)?);
        }
        println!("{:<18} {:>12}", k.name, us(t.elapsed() / reps));
    }
    Ok(())
}

fn run() -> Result<bool> {
    let scale = match flag("scale").as_deref() {
        None | Some("small") => Scale::Small,
        Some("large") => Scale::Large,
        Some(other) => return Err(Error::invalid(format!("--scale small|large, not {other}"))),
    };
    let iters_flag: Option<u32> = flag("iters")
        .map(|v| {
            v.parse()
                .map_err(|_| Error::invalid(format!("--iters {v}: not a number")))
        })
        .transpose()?;
    let explicit = flag("backends");
    let names: Vec<String> = match &explicit {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None if scale == Scale::Large => vec!["cuda".into(), "wgpu".into(), "metal".into()],
        None => vec!["cpu".into(), "cuda".into(), "wgpu".into(), "metal".into()],
    };
    let mut devices = Vec::new();
    for n in &names {
        match Device::from_name(n) {
            Ok(d) => devices.push(d),
            // Only backends asked for by name must open.
            Err(e) if explicit.is_some() => return Err(e),
            Err(_) => {}
        }
    }
    println!(
        "generated (#[gpu_kernel]) vs hand-written kernels; time per launch, best of 2 rounds; \
         tensors stay on the device"
    );
    println!(
        "{:<16} {:<8} {:<12} {:>12} {:>12} {:>9} {:>14} {:>14} {:>12}",
        "kernel",
        "backend",
        "size",
        "generated µs",
        "hand µs",
        "gen/hand",
        "1st use ms gen",
        "1st use ms hand",
        "cached µs"
    );
    let mut ok = true;
    for dev in &devices {
        let iters = iters_flag
            .unwrap_or(if dev.kind().to_string() == "cpu" {
                3
            } else {
                20
            })
            .max(1);
        for p in prepare(dev, scale)? {
            let (g, h) = measure(dev, &p, iters)?;
            let diff = max_rel_diff(&g.output, &h.output);
            println!(
                "{:<16} {:<8} {:<12} {:>12} {:>12} {:>9.3} {:>14} {:>14} {:>12}",
                p.name,
                dev.kind().to_string(),
                p.size,
                us(g.best),
                us(h.best),
                g.best.as_secs_f64() / h.best.as_secs_f64(),
                ms_or_dash(&g.first),
                ms_or_dash(&h.first),
                us(g.cached.total_time),
            );
            if diff > 1e-4 {
                eprintln!(
                    "MISMATCH: {} on {}: generated and hand-written outputs differ by {diff:.2e}",
                    p.name,
                    dev.kind()
                );
                ok = false;
            }
        }
    }
    translation_table()?;
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => common::exit(Err(e)),
    }
}
