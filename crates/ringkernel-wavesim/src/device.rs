//! The update written once with the codegen crate, run on any [`Device`]: CUDA (NVRTC),
//! WebGPU (WGSL), Metal (MSL from the WGSL) and the CPU (the Rust function itself). The
//! fields and coefficients stay on the device as [`Tensor`]s, so a run of steps copies
//! nothing to or from the host but the sources' values (a few floats a step, and only
//! when the grid has sources).
//!
//! Two kernels: [`wave_step`] (`#[gpu_kernel(halo = 1)]`, one launch a step) and
//! [`wave_steps`], which takes up to `k` steps in one launch by temporal blocking: each
//! block loads its tile with a halo of `k` cells into workgroup memory and steps it there,
//! the valid region shrinking by one cell a step, so a launch reads and writes the fields
//! once for `k` steps (less memory traffic on large grids, fewer launches on small ones).
//! [`DeviceWave2D::run`] uses it for grids without sources.

use crate::{Source, WaveGrid2D};
use ringkernel::codegen::dsl::*;
use ringkernel::compute::{Device, Tensor};
use ringkernel::{args, gpu_kernel};
use ringkernel_core::{BackendKind, Error, Result};

/// One step of the wave update on a grid with a one-cell halo:
/// `p ← a·(2u + c²·lap(u)) − b·p` (the older field `p` becomes the newer one).
#[gpu_kernel(halo = 1)]
pub fn wave_step(pos: GridPos, u: &[f32], p: &mut [f32], c2: &[f32], a: &[f32], b: &[f32]) {
    let i = pos.idx();
    let lap = pos.west(u) + pos.east(u) + pos.north(u) + pos.south(u) - 4.0 * u[i];
    p[i] = a[i] * (2.0 * u[i] + c2[i] * lap) - b[i] * p[i];
}

/// The region a block of [`wave_steps`] holds in workgroup memory: 64 × 32 cells (two
/// fields of 2,048 floats: 16 KiB, WebGPU's default limit), a tile of
/// `(64 − 2k) × (32 − 2k)` cells and its halo of `k`.
pub const BLOCK_REGION: [u32; 2] = [64, 32];

/// The most steps one launch of [`wave_steps`] takes (a tile of 40 × 8 cells).
pub const MAX_STEPS_PER_LAUNCH: u32 = 12;

/// `steps` (at most `k`) steps of the update for one tile, in workgroup memory: a block
/// of 32 × 8 threads loads the 64 × 32 region around its tile of `(64 − 2k) × (32 − 2k)`
/// cells (the current field `u` and the older `p`; outside the padded grid, zeros), step
/// `j` updates the interior cells at least `j` cells inside the region (those whose
/// inputs are still exact), and the tile's cells of the two newest levels go to `u_out`
/// and `p_out`. Each thread owns the same 8 cells of the region throughout, so their
/// coefficients stay in registers; with `uniform` non-zero the medium is the default one
/// (`c²` = `c2u`, no damping) and the coefficient arrays are not read. The arithmetic is
/// [`wave_step`]'s, in the same order.
#[gpu_kernel]
#[allow(clippy::too_many_arguments)]
pub fn wave_steps(
    u: &[f32],
    p: &[f32],
    c2: &[f32],
    a: &[f32],
    b: &[f32],
    u_out: &mut [f32],
    p_out: &mut [f32],
    nx: i32,
    ny: i32,
    k: i32,
    steps: i32,
    uniform: i32,
    c2u: f32,
) {
    // Two fields of 64 x 32 cells: [0, 2048) and [2048, 4096); `cur` is the current one's.
    let mut s = shared_array::<f32, 4096>();
    let tx = thread_idx_x();
    let ty = thread_idx_y();
    let stride = nx + 2;
    // Padded coordinates of the region's first cell.
    let x0 = block_idx_x() * (64 - 2 * k) + 1 - k;
    let y0 = block_idx_y() * (32 - 2 * k) + 1 - k;
    // Per owned cell (ex = tx + 32i, ey = ty + 8j, q = 2j + i): its distance from the
    // region's edge (-1 outside the grid's interior: never updated) and coefficients.
    let mut ring = [0i32; 8];
    let mut ca = [1.0f32; 8];
    let mut cb = [1.0f32; 8];
    let mut cc = [0.0f32; 8];
    for q in 0..8 {
        let ex = tx + 32 * (q % 2);
        let ey = ty + 8 * (q / 2);
        let e = ey * 64 + ex;
        let gx = x0 + ex;
        let gy = y0 + ey;
        let g = (gy * stride + gx) as usize;
        if gx >= 0 && gx <= nx + 1 && gy >= 0 && gy <= ny + 1 {
            s[e as usize] = u[g];
            s[(2048 + e) as usize] = p[g];
        } else {
            s[e as usize] = 0.0;
            s[(2048 + e) as usize] = 0.0;
        }
        ring[q as usize] = -1;
        if gx >= 1 && gx <= nx && gy >= 1 && gy <= ny {
            ring[q as usize] = ex.min(ey).min((63 - ex).min(31 - ey));
            if uniform != 0 {
                cc[q as usize] = c2u;
            } else {
                ca[q as usize] = a[g];
                cb[q as usize] = b[g];
                cc[q as usize] = c2[g];
            }
        }
    }
    sync_threads();
    let mut cur = 0;
    let mut j = 1;
    while j <= steps {
        let old = 2048 - cur;
        for q in 0..8 {
            if ring[q as usize] >= j {
                let e = (ty + 8 * (q / 2)) * 64 + tx + 32 * (q % 2);
                let c = s[(cur + e) as usize];
                let lap = s[(cur + e - 1) as usize]
                    + s[(cur + e + 1) as usize]
                    + s[(cur + e - 64) as usize]
                    + s[(cur + e + 64) as usize]
                    - 4.0 * c;
                s[(old + e) as usize] = ca[q as usize] * (2.0 * c + cc[q as usize] * lap)
                    - cb[q as usize] * s[(old + e) as usize];
            }
        }
        sync_threads();
        cur = old;
        j += 1;
    }
    // The tile: the owned cells at least k inside the region.
    for q in 0..8 {
        if ring[q as usize] >= k {
            let ex = tx + 32 * (q % 2);
            let ey = ty + 8 * (q / 2);
            let e = ey * 64 + ex;
            let g = ((y0 + ey) * stride + x0 + ex) as usize;
            u_out[g] = s[(cur + e) as usize];
            p_out[g] = s[(2048 - cur + e) as usize];
        }
    }
}

/// Steps per launch of [`DeviceWave2D::run_blocked`] unless set.
pub const DEFAULT_STEPS_PER_LAUNCH: u32 = 4;

/// Adds `vals[i]` to `u[cells[i]]` for every `i < n`, a thread a cell (the cells are
/// distinct, so no two threads write the same one): the sources after a step.
#[gpu_kernel]
pub fn add_sources(u: &mut [f32], cells: &[u32], vals: &[f32], n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        let k = cells[i as usize] as usize;
        u[k] += vals[i as usize];
    }
}

/// The grid's sources as the device applies them: distinct padded cell indices and,
/// per source, which of them it drives.
#[derive(Debug, Clone, Default)]
struct DeviceSources {
    sources: Vec<Source>,
    /// Distinct padded indices of every source cell.
    cells: Vec<u32>,
    /// Per source, its cells' positions in `cells`.
    slots: Vec<Vec<usize>>,
}

impl DeviceSources {
    fn new(grid: &WaveGrid2D) -> Result<Self> {
        let s = grid.stride();
        let mut at = std::collections::HashMap::new();
        let mut cells = Vec::new();
        let mut slots = Vec::new();
        for src in grid.sources() {
            let mut mine = Vec::with_capacity(src.cells().len());
            for &(x, y) in src.cells() {
                let k = u32::try_from((y + 1) * s + x + 1)
                    .map_err(|_| Error::invalid("grid too large for device sources"))?;
                let slot = *at.entry(k).or_insert_with(|| {
                    cells.push(k);
                    cells.len() - 1
                });
                mine.push(slot);
            }
            slots.push(mine);
        }
        Ok(DeviceSources {
            sources: grid.sources().to_vec(),
            cells,
            slots,
        })
    }

    /// The value to add to each cell after a step ending at `t` (summed over the sources
    /// that share a cell), or `None` when every source is silent.
    fn values(&self, t: f32, dt: f32) -> Option<Vec<f32>> {
        let mut vals = vec![0.0f32; self.cells.len()];
        let mut any = false;
        for (src, slots) in self.sources.iter().zip(&self.slots) {
            let v = src.value(t, dt);
            if v != 0.0 {
                any = true;
                for &j in slots {
                    vals[j] += v;
                }
            }
        }
        any.then_some(vals)
    }
}

/// A [`WaveGrid2D`] on a [`Device`]: the same update, one stencil launch per step (and
/// one more for the sources, when the grid has any), the state on the device between
/// steps.
///
/// ```
/// use ringkernel::compute::Device;
/// use ringkernel_wavesim::{DeviceWave2D, WaveGrid2D, WaveParams};
/// let mut g = WaveGrid2D::new(40, 30, WaveParams::default())?;
/// g.add_gaussian(20.0, 15.0, 2.0, 1.0);
/// let mut d = DeviceWave2D::from_grid(&Device::cpu(), &g)?;
/// d.run(20)?;
/// g.run(20);
/// let (got, want) = (d.field()?, g.field());
/// assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-6));
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
pub struct DeviceWave2D {
    device: Device,
    nx: usize,
    ny: usize,
    u: Tensor,
    p: Tensor,
    c2: Tensor,
    a: Tensor,
    b: Tensor,
    sources: DeviceSources,
    dt: f32,
    steps: u64,
    /// Steps per launch of [`wave_steps`] (`k`).
    k: u32,
    /// `Some(c²)` when every interior cell is the default medium.
    uniform: Option<f32>,
    /// The blocked kernel's output fields (allocated on its first launch).
    spare: Option<(Tensor, Tensor)>,
}

impl std::fmt::Debug for DeviceWave2D {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWave2D")
            .field("device", &self.device.kind())
            .field("nx", &self.nx)
            .field("ny", &self.ny)
            .field("steps", &self.steps)
            .finish()
    }
}

impl DeviceWave2D {
    /// Uploads `grid`'s fields, materials and sources to `device` (its step count
    /// comes along: the sources' time goes on from it).
    ///
    /// Errors: the device's errors for the uploads; [`Error::InvalidArgument`] for a
    /// grid of more than `u32::MAX` padded cells with sources.
    pub fn from_grid(device: &Device, grid: &WaveGrid2D) -> Result<Self> {
        let len = grid.padded().len();
        let up = |v: &[f32]| Tensor::from_slice(device, v, &[len]);
        let (c2, a, b) = grid.coefficients();
        Ok(DeviceWave2D {
            device: device.clone(),
            nx: grid.nx(),
            ny: grid.ny(),
            u: up(grid.padded())?,
            p: up(grid.padded_previous())?,
            c2: up(c2)?,
            a: up(a)?,
            b: up(b)?,
            sources: DeviceSources::new(grid)?,
            dt: grid.params().dt,
            steps: grid.steps(),
            k: DEFAULT_STEPS_PER_LAUNCH,
            uniform: grid.uniform_c2(),
            spare: None,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Advances one step (one stencil launch; returns when it is queued or done, as the
    /// device does; [`Device::synchronize`] waits).
    pub fn step(&mut self) -> Result<()> {
        let size = [self.nx as u32, self.ny as u32, 1];
        self.device.launch_stencil(
            &WAVE_STEP,
            size,
            &mut args![&self.u, &mut self.p, &self.c2, &self.a, &self.b],
        )?;
        std::mem::swap(&mut self.u, &mut self.p);
        self.steps += 1;
        // As the CPU engine does: after the step, at the time it ends.
        let t = (self.steps as f64 * self.dt as f64) as f32;
        if let Some(vals) = self.sources.values(t, self.dt) {
            let n = vals.len() as u32;
            self.device.launch(
                &ADD_SOURCES,
                [n.div_ceil(64), 1, 1],
                [64, 1, 1],
                &mut args![&mut self.u, &self.sources.cells[..], &vals[..], n as i32],
            )?;
        }
        Ok(())
    }

    /// Advances `steps` steps: on a GPU, `k` at a time with [`wave_steps`]
    /// ([`run_blocked`](Self::run_blocked)) when the grid has no sources; otherwise a
    /// launch a step ([`run_per_step`](Self::run_per_step); the CPU device emulates
    /// workgroup barriers slowly, and sources are added after every step).
    pub fn run(&mut self, steps: u64) -> Result<()> {
        if !self.sources.cells.is_empty() || self.device.kind() == BackendKind::Cpu {
            return self.run_per_step(steps);
        }
        self.run_blocked(steps)
    }

    /// Advances `steps` steps, `k` at a time with [`wave_steps`].
    ///
    /// Errors: [`Error::InvalidArgument`] for a grid with sources (they act after every
    /// step); the device's errors.
    pub fn run_blocked(&mut self, steps: u64) -> Result<()> {
        if !self.sources.cells.is_empty() {
            return Err(Error::invalid(
                "run_blocked: the grid has sources, which act after every step: use run or run_per_step",
            ));
        }
        let mut left = steps;
        while left > 0 {
            let n = left.min(self.k as u64);
            self.launch_blocked(n as u32)?;
            left -= n;
        }
        Ok(())
    }

    /// Advances `steps` steps, one launch of [`wave_step`] each.
    pub fn run_per_step(&mut self, steps: u64) -> Result<()> {
        for _ in 0..steps {
            self.step()?;
        }
        Ok(())
    }

    /// Steps per launch of [`run_blocked`](Self::run_blocked).
    pub fn steps_per_launch(&self) -> u32 {
        self.k
    }

    /// Sets the steps per launch `k` of [`run_blocked`](Self::run_blocked): tiles of
    /// `(64 − 2k) × (32 − 2k)` cells (the results are the same for every `k`).
    ///
    /// Errors: [`Error::InvalidArgument`] unless `1 <= k <=`
    /// [`MAX_STEPS_PER_LAUNCH`].
    pub fn set_steps_per_launch(&mut self, k: u32) -> Result<()> {
        if !(1..=MAX_STEPS_PER_LAUNCH).contains(&k) {
            return Err(Error::invalid(format!(
                "steps per launch must be 1..={MAX_STEPS_PER_LAUNCH}, got {k}"
            )));
        }
        self.k = k;
        Ok(())
    }

    /// One launch of [`wave_steps`] for `n` (1..=k) steps.
    fn launch_blocked(&mut self, n: u32) -> Result<()> {
        let k = self.k;
        let [rw, rh] = BLOCK_REGION;
        let (tw, th) = (rw - 2 * k, rh - 2 * k);
        if self.spare.is_none() {
            // The padding ring zero (the kernel never writes it), the interior NaN: the
            // kernel writes every interior cell, and a cell it missed would show.
            let (nx, ny) = (self.nx, self.ny);
            let poisoned: Vec<f32> = (0..(nx + 2) * (ny + 2))
                .map(|k| {
                    let (x, y) = (k % (nx + 2), k / (nx + 2));
                    if (1..=nx).contains(&x) && (1..=ny).contains(&y) {
                        f32::NAN
                    } else {
                        0.0
                    }
                })
                .collect();
            let len = poisoned.len();
            self.spare = Some((
                Tensor::from_slice(&self.device, &poisoned, &[len])?,
                Tensor::from_slice(&self.device, &poisoned, &[len])?,
            ));
        }
        let (u_out, p_out) = self.spare.as_mut().expect("allocated above");
        let grid = [
            (self.nx as u32).div_ceil(tw),
            (self.ny as u32).div_ceil(th),
            1,
        ];
        self.device.launch(
            &WAVE_STEPS,
            grid,
            [32, 8, 1],
            &mut args![
                &self.u,
                &self.p,
                &self.c2,
                &self.a,
                &self.b,
                u_out,
                p_out,
                self.nx as i32,
                self.ny as i32,
                k as i32,
                n as i32,
                self.uniform.is_some() as i32,
                self.uniform.unwrap_or(0.0)
            ],
        )?;
        let (u_out, p_out) = self.spare.take().expect("allocated above");
        let (u, p) = (
            std::mem::replace(&mut self.u, u_out),
            std::mem::replace(&mut self.p, p_out),
        );
        self.spare = Some((u, p));
        self.steps += n as u64;
        Ok(())
    }

    /// The current field's interior, row-major `nx × ny` (copied to the host).
    pub fn field(&self) -> Result<Vec<f32>> {
        Ok(crate::grid2d::interior(&self.u.to_vec()?, self.nx, self.ny))
    }

    /// Copies the device's state (both time levels and the step count) into `grid`, the
    /// grid this one was made from (or one of its size): the way back to the CPU engine.
    ///
    /// Errors: [`Error::ShapeMismatch`] for a grid of another size; the device's errors
    /// for the reads.
    pub fn store_into(&self, grid: &mut WaveGrid2D) -> Result<()> {
        if (grid.nx(), grid.ny()) != (self.nx, self.ny) {
            return Err(Error::shape(format!(
                "device grid {} x {} stored into a {} x {} grid",
                self.nx,
                self.ny,
                grid.nx(),
                grid.ny()
            )));
        }
        grid.set_state(&self.p.to_vec()?, &self.u.to_vec()?)?;
        grid.set_steps(self.steps);
        Ok(())
    }
}
