//! The update written once with the codegen crate (`#[gpu_kernel(halo = 1)]`), run on
//! any [`Device`]: CUDA (NVRTC), WebGPU (WGSL), Metal (MSL from the WGSL) and the CPU
//! (the Rust function itself). The fields and coefficients stay on the device as
//! [`Tensor`]s, so a run of steps copies nothing to or from the host.

use crate::WaveGrid2D;
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

/// A [`WaveGrid2D`] on a [`Device`]: the same update, one stencil launch per step, the
/// state on the device between steps.
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
    /// Uploads `grid`'s fields and materials to `device`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a grid with sources (not run on devices
    /// yet) or sides above `i32::MAX`; the device's errors for the uploads.
    pub fn from_grid(device: &Device, grid: &WaveGrid2D) -> Result<Self> {
        if !grid.sources().is_empty() {
            return Err(Error::invalid(
                "DeviceWave2D runs fields and materials; sources are applied by the CPU engines only",
            ));
        }
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
}
