//! Ready-made scenes, the headless run (PNG frames and an APNG animation), and the
//! timing helpers of `ringkernel wavesim bench`.

use crate::image::{encode_apng, encode_png, render_rgb};
use crate::{Signal, Source, WaveGrid2D, WaveParams};
use ringkernel_core::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The demo scene on an `n × n` grid (`n ≥ 32`): unit speed and cells (`dt = 0.5`), an
/// absorbing border `n/16` cells deep, a reflecting wall with a slit right of the
/// centre, and a Ricker source (wavelength about 12 cells) left of the centre.
///
/// ```
/// let g = ringkernel_wavesim::scene::demo_scene(64)?;
/// assert_eq!((g.nx(), g.ny()), (64, 64));
/// assert_eq!(g.sources().len(), 1);
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
pub fn demo_scene(n: usize) -> Result<WaveGrid2D> {
    if n < 32 {
        return Err(Error::invalid(format!(
            "demo scene of {n} cells: at least 32"
        )));
    }
    let mut g = WaveGrid2D::new(n, n, WaveParams::default())?;
    g.add_absorbing_border((n / 16).max(4), 0.6)?;
    let wall = n * 5 / 8;
    for y in n / 8..n - n / 8 {
        if !(n / 2 - n / 32..=n / 2 + n / 32).contains(&y) {
            g.set_reflector(wall, y)?;
        }
    }
    let freq = 1.0 / 12.0;
    g.add_source(Source::point(
        n * 3 / 8,
        n / 2,
        Signal::Ricker {
            freq,
            delay: 1.5 / freq,
        },
        1.0,
    ))?;
    Ok(g)
}

/// What [`run_headless`] wrote.
#[derive(Debug, Clone)]
pub struct HeadlessReport {
    /// The PNG frames, in order.
    pub frames: Vec<PathBuf>,
    /// The animated PNG of all frames.
    pub animation: PathBuf,
    /// Steps run.
    pub steps: u64,
}

/// Runs `grid` for `steps` steps and writes `frames` PNG pictures evenly spaced over
/// the run (`frame_0000.png`, ...; the last one after the last step) and `wavesim.png`,
/// an animated PNG of them all, into `out` (created if missing). Each frame's colour
/// scale is half its largest |field| (so a decaying wave stays visible).
///
/// Errors: [`Error::InvalidArgument`] for no frames or more frames than steps,
/// [`Error::Device`] when a file cannot be written.
pub fn run_headless(
    grid: &mut WaveGrid2D,
    steps: u64,
    frames: usize,
    out: &Path,
) -> Result<HeadlessReport> {
    if frames == 0 || frames as u64 > steps.max(1) {
        return Err(Error::invalid(format!(
            "{frames} frames over {steps} steps: need 1..=steps frames"
        )));
    }
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::Device(format!("{what} {}: {e}", p.display()))
    };
    std::fs::create_dir_all(out).map_err(|e| io("cannot create", out, e))?;
    let (w, h) = (grid.nx() as u32, grid.ny() as u32);
    let mut pictures = Vec::with_capacity(frames);
    let mut paths = Vec::with_capacity(frames);
    let mut done = 0u64;
    for f in 0..frames {
        let target = steps * (f as u64 + 1) / frames as u64;
        grid.run(target - done);
        done = target;
        let rgb = render_rgb(grid, 0.5 * grid.max_abs());
        let path = out.join(format!("frame_{f:04}.png"));
        std::fs::write(&path, encode_png(w, h, &rgb)?).map_err(|e| io("cannot write", &path, e))?;
        paths.push(path);
        pictures.push(rgb);
    }
    let animation = out.join("wavesim.png");
    std::fs::write(&animation, encode_apng(w, h, &pictures, 100)?)
        .map_err(|e| io("cannot write", &animation, e))?;
    Ok(HeadlessReport {
        frames: paths,
        animation,
        steps,
    })
}

/// Steps per second of the CPU engine on an `n × n` grid of the default medium (a pulse
/// at the centre): after a warm-up batch, whole batches of steps until `min_time` has
/// passed. Also returns the sum of the field after the first 100 steps from a unit
/// impulse at the centre (the checksum `scripts/wavesim_numpy.py` prints).
pub fn cpu_steps_per_sec(n: usize, min_time: Duration) -> Result<(f64, f64)> {
    let mut g = WaveGrid2D::new(n, n, WaveParams::default())?;
    let mut one = vec![0.0f32; n * n];
    one[(n / 2) * n + n / 2] = 1.0;
    g.set_field(&one)?;
    g.run(100);
    let checksum: f64 = g.padded().iter().map(|&v| v as f64).sum();
    // Batches of whole sweeps (`run` takes 8 steps a sweep).
    let batch = ((1u64 << 22) / (n * n) as u64).clamp(8, 1000) / 8 * 8;
    g.run(batch);
    let t0 = Instant::now();
    let mut steps = 0u64;
    while t0.elapsed() < min_time || steps < 3 {
        g.run(batch);
        steps += batch;
    }
    Ok((steps as f64 / t0.elapsed().as_secs_f64(), checksum))
}

/// The host's copy bandwidth in bytes per second (read plus write) of a `bytes`-sized
/// buffer copy, the best of a few: the bound of a step that moves 12 bytes a cell.
pub fn copy_bandwidth(bytes: usize) -> f64 {
    let n = (bytes / 4).max(1024);
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (2 * n * 4) as f64 / best
}

/// The copy bandwidth of `device` in bytes per second (read plus write): the best of a
/// few device-to-device copies of a `bytes`-sized buffer (or a half or quarter of it,
/// where the device limits buffers), synchronised. The bound of a
/// GPU step that moves 12 bytes a cell.
pub fn device_copy_bandwidth(device: &ringkernel::compute::Device, bytes: usize) -> Result<f64> {
    let b = device.backend();
    // The largest of `bytes`, its half, its quarter that the device takes in one buffer
    // (wgpu's default storage-buffer limit is 128 MiB).
    let mut n = (bytes / 4).max(1024);
    let (src, dst) = loop {
        match (b.alloc(n), b.alloc(n)) {
            (Ok(s), Ok(d)) => break (s, d),
            (Err(e), _) | (_, Err(e)) if n <= (bytes / 16).max(1024) => return Err(e),
            _ => n /= 2,
        }
    };
    b.copy(src.as_ref(), 0, dst.as_ref(), 0, n)?;
    b.synchronize()?;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        b.copy(src.as_ref(), 0, dst.as_ref(), 0, n)?;
        b.synchronize()?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok((2 * n * 4) as f64 / best)
}

/// Steps per second of [`DeviceWave2D`](crate::DeviceWave2D) (the codegen stencils) on
/// `device` for an `n × n` grid of the default medium: a launch a step
/// ([`run_per_step`](crate::DeviceWave2D::run_per_step)) with `k` `None`, else
/// [`run_blocked`](crate::DeviceWave2D::run_blocked) with `k` steps a launch. 16 warm-up steps
/// (compiling the kernel), then batches of at least 64 steps until `min_time` has
/// passed, the device synchronised after each batch and before the clock stops.
pub fn device_steps_per_sec(
    device: &ringkernel::compute::Device,
    n: usize,
    min_time: Duration,
    k: Option<u32>,
) -> Result<f64> {
    let mut g = WaveGrid2D::new(n, n, WaveParams::default())?;
    g.add_gaussian(n as f32 / 2.0, n as f32 / 2.0, 3.0, 1.0);
    let mut d = crate::DeviceWave2D::from_grid(device, &g)?;
    if let Some(k) = k {
        d.set_steps_per_launch(k)?;
    }
    let run = |d: &mut crate::DeviceWave2D, n: u64| match k {
        Some(_) => d.run_blocked(n),
        None => d.run_per_step(n),
    };
    run(&mut d, 16)?;
    device.synchronize()?;
    let batch = ((1u64 << 24) / (n * n) as u64).clamp(64, 1024);
    let t0 = Instant::now();
    let mut steps = 0u64;
    while t0.elapsed() < min_time || steps < 3 * batch {
        run(&mut d, batch)?;
        steps += batch;
        device.synchronize()?;
    }
    Ok(steps as f64 / t0.elapsed().as_secs_f64())
}

/// Which [`CudaWave2D`](crate::cuda::CudaWave2D) path [`cuda_steps_per_sec`] times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaPath {
    /// [`run_per_step`](crate::cuda::CudaWave2D::run_per_step): a launch a step.
    PerStep,
    /// [`run_persistent`](crate::cuda::CudaWave2D::run_persistent): tile actors over
    /// global memory in one launch.
    Tiles,
    /// [`run_resident`](crate::cuda::CudaWave2D::run_resident): tile actors with the
    /// fields in registers in one launch.
    Resident,
    /// [`run_resident_h2`](crate::cuda::CudaWave2D::run_resident_h2): the same,
    /// exchanging two-cell halos every two steps.
    ResidentH2,
}

/// Steps per second of [`CudaWave2D`](crate::cuda::CudaWave2D) on device 0 for an
/// `n × n` grid along `path` (batches of steps per launch for the one-launch paths),
/// after a warm-up, synchronised before the clock stops.
pub fn cuda_steps_per_sec(n: usize, min_time: Duration, path: CudaPath) -> Result<f64> {
    let mut g = WaveGrid2D::new(n, n, WaveParams::default())?;
    g.add_gaussian(n as f32 / 2.0, n as f32 / 2.0, 3.0, 1.0);
    let mut d = crate::cuda::CudaWave2D::new(&g, 0)?;
    let run = |d: &mut crate::cuda::CudaWave2D, k: u64| match path {
        CudaPath::PerStep => d.run_per_step(k),
        CudaPath::Tiles => d.run_persistent(k),
        CudaPath::Resident => d.run_resident(k),
        CudaPath::ResidentH2 => d.run_resident_h2(k),
    };
    run(&mut d, 10)?;
    d.synchronize()?;
    let batch = ((1u64 << 28) / (n * n) as u64).clamp(10, 20_000);
    let t0 = Instant::now();
    let mut steps = 0u64;
    while t0.elapsed() < min_time || steps < 3 {
        run(&mut d, batch)?;
        steps += batch;
        d.synchronize()?;
    }
    Ok(steps as f64 / t0.elapsed().as_secs_f64())
}
