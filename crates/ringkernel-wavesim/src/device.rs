//! The update written once with the codegen crate (`#[gpu_kernel(halo = 1)]`), run on
//! any [`Device`]: CUDA (NVRTC), WebGPU (WGSL), Metal (MSL from the WGSL) and the CPU
//! (the Rust function itself). The fields and coefficients stay on the device as
//! [`Tensor`]s, so a run of steps copies nothing to or from the host but the sources'
//! values (a few floats a step, and only when the grid has sources).

use crate::{Source, WaveGrid2D};
use ringkernel::codegen::dsl::*;
use ringkernel::compute::{Device, Tensor};
use ringkernel::{args, gpu_kernel};
use ringkernel_core::{Error, Result};

/// One step of the wave update on a grid with a one-cell halo:
/// `p ← a·(2u + c²·lap(u)) − b·p` (the older field `p` becomes the newer one).
#[gpu_kernel(halo = 1)]
pub fn wave_step(pos: GridPos, u: &[f32], p: &mut [f32], c2: &[f32], a: &[f32], b: &[f32]) {
    let i = pos.idx();
    let lap = pos.west(u) + pos.east(u) + pos.north(u) + pos.south(u) - 4.0 * u[i];
    p[i] = a[i] * (2.0 * u[i] + c2[i] * lap) - b[i] * p[i];
}

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

    /// Advances `steps` steps.
    pub fn run(&mut self, steps: u64) -> Result<()> {
        for _ in 0..steps {
            self.step()?;
        }
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
