//! WaveSim on CUDA through `ringkernel-cuda`'s public API (NVRTC-compiled CUDA C): tile
//! actors inside one persistent kernel that synchronise only with their neighbours (no
//! grid-wide barrier), beside a kernel-per-step baseline. Two kinds of tile actors:
//!
//! * [`CudaWave2D::run_persistent`]: the fields in global memory, each tile waiting on its
//!   four neighbours' step counters (any grid size);
//! * [`CudaWave2D::run_resident`]: the fields in registers for the whole launch (one
//!   block per SM, a tile of 32 × 16R cells each), the border cells exchanged as
//!   {value, step} 64-bit words that carry their own readiness (no fence, no counter):
//!   for grids that fit on chip (up to about 1024² on an H100/H200).
//!
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
    /// The register-resident kernel for this grid; `None` when the grid needs more
    /// tiles than the device has SMs.
    resident: Option<Resident>,
    /// The same exchanging two-cell halos every two steps (`R` <= 4).
    resident_h2: Option<Resident>,
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
        let (nx, ny) = (grid.nx(), grid.ny());
        let c2 = match grid.uniform_c2() {
            Some(c2) if grid.sources().is_empty() => c2,
            _ => {
                return Err(Error::invalid(
                    "CudaWave2D runs the default medium without sources (no absorbers, reflectors, speed changes)",
                ))
            }
        };
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
        let resident = match resident_rows(nx, ny, sms) {
            Some(r) => Some(Resident::new(
                &cuda,
                "wave_resident",
                r,
                nx,
                ny,
                64 + 32 * r,
            )?),
            None => None,
        };
        let resident_h2 = match resident_rows(nx, ny, sms) {
            Some(r) if r <= 4 => Some(Resident::new(
                &cuda,
                "wave_resident_h2",
                r,
                nx,
                ny,
                6 * 32 + 6 * 16 * r,
            )?),
            _ => None,
        };
        Ok(CudaWave2D {
            cuda,
            step_fn,
            tiles_fn,
            resident,
            resident_h2,
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

    /// Rows a thread of [`run_resident`](Self::run_resident) keeps (`R`: a tile is
    /// 32 × 16R cells), or `None` when this grid does not fit on chip.
    pub fn resident_rows(&self) -> Option<usize> {
        self.resident.as_ref().map(|r| r.rows)
    }

    /// Advances `steps` steps in one launch of the register-resident tile actors
    /// (queued; see the [module docs](self)).
    ///
    /// Errors: [`Error::InvalidArgument`] for a grid that needs more tiles than the
    /// device has SMs (every tile must be resident at once) or more than `i32::MAX` steps.
    pub fn run_resident(&mut self, steps: u64) -> Result<()> {
        let Some(k) = &self.resident else {
            return Err(Error::invalid(format!(
                "a {} x {} grid does not fit the register-resident kernel: it needs at most \
                 one tile of 32 x 256 cells per SM",
                self.nx, self.ny
            )));
        };
        self.steps += self.launch_resident(k, steps)?;
        Ok(())
    }

    /// Advances `steps` steps in one launch of the register-resident tile actors that
    /// exchange halos of two cells once every two steps (queued): half the waits for the
    /// neighbours of [`run_resident`](Self::run_resident), the ring of cells around each
    /// tile computed twice. For the grids whose tiles have `R` <= 4 (32 × 64 cells).
    ///
    /// Errors: [`Error::InvalidArgument`] for a grid without such tiles or more than
    /// `i32::MAX` steps.
    pub fn run_resident_h2(&mut self, steps: u64) -> Result<()> {
        let Some(k) = &self.resident_h2 else {
            return Err(Error::invalid(format!(
                "a {} x {} grid does not fit the two-cell-halo resident kernel: it needs at \
                 most one tile of 32 x 64 cells per SM",
                self.nx, self.ny
            )));
        };
        self.steps += self.launch_resident(k, steps)?;
        Ok(())
    }

    /// One launch of a register-resident kernel for `steps` steps (queued). The kernel
    /// writes the newest field back into b1, the one before into b0.
    fn launch_resident(&self, k: &Resident, steps: u64) -> Result<u64> {
        if steps == 0 {
            return Ok(0);
        }
        let steps32 =
            i32::try_from(steps).map_err(|_| Error::invalid("at most i32::MAX steps a launch"))?;
        let tiles = k.tiles_x * self.ny.div_ceil(16 * k.rows);
        self.cuda.launch_function(
            &k.function,
            [tiles as u32, 1, 1],
            [32, 16, 1],
            &[
                CudaArg::Buffer(self.bufs[0].as_ref()),
                CudaArg::Buffer(self.bufs[1].as_ref()),
                CudaArg::Buffer(k.halo.as_ref()),
                CudaArg::I32(self.nx as i32),
                CudaArg::I32(self.ny as i32),
                CudaArg::F32(self.c2),
                // The stamps go on from the step count, above every earlier launch's
                // (wrapping is fine: only equality matters, and the stamps a tile can
                // see in one slot differ).
                CudaArg::U32(self.steps as u32),
                CudaArg::I32(steps32),
                CudaArg::I32(k.tiles_x as i32),
            ],
        )?;
        Ok(steps)
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

/// A register-resident kernel compiled for one grid: the function, its rows per thread
/// `R`, its tiles across, and its halo words (two parities per tile), zeroed so that no
/// stamp matches before its first write (stamps start at 1).
struct Resident {
    function: CudaFunction,
    rows: usize,
    tiles_x: usize,
    halo: BufferRef,
}

impl Resident {
    /// `{prefix}_{r}` from the kernels' source, with `words` halo words a tile and parity.
    fn new(
        cuda: &CudaCompute,
        prefix: &str,
        r: usize,
        nx: usize,
        ny: usize,
        words: usize,
    ) -> Result<Self> {
        let function = cuda.compile_function("wavesim", SRC, &format!("{prefix}_{r}"))?;
        let (tx, ty) = (nx.div_ceil(32), ny.div_ceil(16 * r));
        // 64-bit words as pairs of zero f32s (0.0 has the bits of 0u32).
        let halo = cuda.upload(&vec![0.0f32; tx * ty * 2 * words * 2])?;
        Ok(Resident {
            function,
            rows: r,
            tiles_x: tx,
            halo,
        })
    }
}

/// The rows per thread `R` (1, 2, 4, 8 or 16) of the register-resident kernel for an
/// `nx × ny` grid on a device of `sms` SMs: the smallest whose tiles (32 × 16R cells)
/// number at most `sms`, so that every block has an SM of its own.
pub fn resident_rows(nx: usize, ny: usize, sms: usize) -> Option<usize> {
    [1, 2, 4, 8, 16]
        .into_iter()
        .find(|&r| nx.div_ceil(32) * ny.div_ceil(16 * r) <= sms)
}

#[cfg(test)]
mod tests {
    use super::resident_rows;

    #[test]
    fn resident_tiles_fit_one_per_sm() {
        // H100/H200: 132 SMs.
        assert_eq!(resident_rows(256, 256, 132), Some(1)); // 8 x 16 tiles
        assert_eq!(resident_rows(512, 512, 132), Some(4)); // 16 x 8
        assert_eq!(resident_rows(1024, 1024, 132), Some(16)); // 32 x 4
        assert_eq!(resident_rows(517, 300, 132), Some(4)); // 17 x 5
        assert_eq!(resident_rows(2048, 2048, 132), None);
        assert_eq!(resident_rows(30, 20, 1), Some(2)); // one tile of 32 x 32
        assert_eq!(resident_rows(40, 20, 1), None);
    }
}
