//! WaveSim on CUDA through `ringkernel-cuda`'s public API (NVRTC-compiled CUDA C): tile
//! actors inside one persistent kernel that synchronise only with their neighbours
//! (per-tile step counters, no grid-wide barrier), beside a kernel-per-step baseline.
//! The kernels are in `cuda_wave.cu` beside this file; they run the default medium
//! (uniform speed, no damping) with a zero border, the update of the CPU engine's
//! uniform rows.

use crate::WaveGrid2D;
use ringkernel_core::compute::{BufferRef, ComputeBackend};
use ringkernel_core::{Error, Result};
use ringkernel_cuda::{CudaArg, CudaCompute, CudaFunction};

const SRC: &str = include_str!("cuda_wave.cu");
/// Threads per block: 32 × 8.
const BLOCK: [u32; 3] = [32, 8, 1];
/// Blocks kept resident per SM by the persistent launch (256 threads each; a
/// conservative figure, so every block is resident and the neighbour waits cannot
/// deadlock).
const BLOCKS_PER_SM: u32 = 2;

/// A 2-D wave grid on a CUDA device (see the [module docs](self)).
pub struct CudaWave2D {
    cuda: CudaCompute,
    step_fn: CudaFunction,
    tiles_fn: CudaFunction,
    /// `bufs[0]` holds the older field, `bufs[1]` the current one.
    bufs: [BufferRef; 2],
    flags: BufferRef,
    nx: usize,
    ny: usize,
    c2: f32,
    tile: usize,
    steps: u64,
}

impl std::fmt::Debug for CudaWave2D {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaWave2D")
            .field("nx", &self.nx)
            .field("ny", &self.ny)
            .field("tile", &self.tile)
            .field("steps", &self.steps)
            .finish()
    }
}

impl CudaWave2D {
    /// Uploads `grid` to CUDA device `ordinal` and compiles the kernels.
    ///
    /// Errors: [`Error::BackendUnavailable`] without CUDA; [`Error::InvalidArgument`] for
    /// a grid with materials other than the default medium, or with sources;
    /// [`Error::Compile`] when NVRTC refuses the kernels.
    pub fn new(grid: &WaveGrid2D, ordinal: usize) -> Result<Self> {
        let p = grid.params();
        let c2 = p.c2_of(p.speed);
        let (nx, ny) = (grid.nx(), grid.ny());
        let (cc2, a, b) = grid.coefficients();
        let s = nx + 2;
        let uniform = (1..=ny).all(|y| {
            (1..=nx).all(|x| {
                let k = y * s + x;
                cc2[k] == c2 && a[k] == 1.0 && b[k] == 1.0
            })
        });
        if !uniform || !grid.sources().is_empty() {
            return Err(Error::invalid(
                "CudaWave2D runs the default medium without sources (no absorbers, reflectors, speed changes)",
            ));
        }
        let cuda = CudaCompute::new(ordinal)?;
        let step_fn = cuda.compile_function("wavesim", SRC, "wave_step")?;
        let tiles_fn = cuda.compile_function("wavesim", SRC, "wave_tiles")?;
        let sms = cuda.device_info().sm_count as usize;
        // Tiles of 32 cells when that still gives every SM two tiles, else 16.
        let tile = if nx.div_ceil(32) * ny.div_ceil(32) >= 2 * sms {
            32
        } else {
            16
        };
        let tiles = nx.div_ceil(tile) * ny.div_ceil(tile);
        let bufs = [
            cuda.upload(grid.padded_previous())?,
            cuda.upload(grid.padded())?,
        ];
        let flags = cuda.upload(&vec![0.0f32; tiles])?; // 0.0 has the bits of 0u32
        Ok(CudaWave2D {
            cuda,
            step_fn,
            tiles_fn,
            bufs,
            flags,
            nx,
            ny,
            c2,
            tile,
            steps: grid.steps(),
        })
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The tile side of the persistent kernel (16 or 32 cells).
    pub fn tile(&self) -> usize {
        self.tile
    }

    /// Advances `steps` steps with one kernel launch per step (queued; see
    /// [`synchronize`](Self::synchronize)).
    pub fn run_per_step(&mut self, steps: u64) -> Result<()> {
        let grid = [
            (self.nx as u32).div_ceil(BLOCK[0]),
            (self.ny as u32).div_ceil(BLOCK[1]),
            1,
        ];
        for _ in 0..steps {
            self.cuda.launch_function(
                &self.step_fn,
                grid,
                BLOCK,
                &[
                    CudaArg::Buffer(self.bufs[1].as_ref()),
                    CudaArg::Buffer(self.bufs[0].as_ref()),
                    CudaArg::I32(self.nx as i32),
                    CudaArg::I32(self.ny as i32),
                    CudaArg::F32(self.c2),
                ],
            )?;
            self.bufs.swap(0, 1);
            self.steps += 1;
        }
        Ok(())
    }

    /// Advances `steps` steps in one launch of the persistent tile kernel (queued).
    ///
    /// Errors: [`Error::InvalidArgument`] for more than `i32::MAX` steps.
    pub fn run_persistent(&mut self, steps: u64) -> Result<()> {
        if steps == 0 {
            return Ok(());
        }
        let steps32 =
            i32::try_from(steps).map_err(|_| Error::invalid("at most i32::MAX steps a launch"))?;
        let (tx, ty) = (self.nx.div_ceil(self.tile), self.ny.div_ceil(self.tile));
        let tiles = tx * ty;
        let resident = (self.cuda.device_info().sm_count * BLOCKS_PER_SM) as usize;
        let blocks = tiles.min(resident) as u32;
        self.flags = self.cuda.upload(&vec![0.0f32; tiles])?;
        // Step k of the kernel reads its second buffer argument's role from k's parity:
        // it takes (older, current) = (b0, b1).
        self.cuda.launch_function(
            &self.tiles_fn,
            [blocks, 1, 1],
            BLOCK,
            &[
                CudaArg::Buffer(self.bufs[0].as_ref()),
                CudaArg::Buffer(self.bufs[1].as_ref()),
                CudaArg::Buffer(self.flags.as_ref()),
                CudaArg::I32(self.nx as i32),
                CudaArg::I32(self.ny as i32),
                CudaArg::F32(self.c2),
                CudaArg::I32(steps32),
                CudaArg::I32(tx as i32),
                CudaArg::I32(ty as i32),
                CudaArg::I32(self.tile as i32),
            ],
        )?;
        // After an odd number of steps the newest field is in b0.
        if steps % 2 == 1 {
            self.bufs.swap(0, 1);
        }
        self.steps += steps;
        Ok(())
    }

    /// Waits for the queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.cuda.synchronize()
    }

    /// The current field's interior, row-major `nx × ny`.
    pub fn field(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; (self.nx + 2) * (self.ny + 2)];
        self.cuda.read(self.bufs[1].as_ref(), 0, &mut out)?;
        Ok(crate::grid2d::interior(&out, self.nx, self.ny))
    }
}
