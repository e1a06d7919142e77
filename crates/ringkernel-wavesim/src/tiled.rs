//! The grid split into tiles with halo exchange: each tile a padded block with its own
//! fields and coefficients, halos filled from the neighbours before every step through
//! core's [`HaloExchange`] (the plan every backend runs), tiles stepped in parallel.

use crate::kernel::{rows_2d, Coeffs};
use crate::source::Source;
use crate::WaveGrid2D;
use rayon::prelude::*;
use ringkernel_core::halo::{HaloExchange, HaloExchangeConfig};
use ringkernel_core::{Error, Result};

/// One tile's coefficients (padded like its fields).
#[derive(Debug, Clone)]
pub(crate) struct TileCoeffs {
    pub(crate) c2: Vec<f32>,
    pub(crate) a: Vec<f32>,
    pub(crate) b: Vec<f32>,
    pub(crate) uniform: Vec<bool>,
}

/// A [`WaveGrid2D`] split into `tiles_x × tiles_y` tiles that exchange one-cell halos
/// every step. Steps give the same bits as the untiled grid (the same update per cell,
/// the halo holding the neighbours' current values).
///
/// ```
/// use ringkernel_wavesim::{TiledWave2D, WaveGrid2D, WaveParams};
/// let mut g = WaveGrid2D::new(64, 48, WaveParams::default())?;
/// g.add_gaussian(20.0, 30.0, 2.0, 1.0);
/// let mut tiled = TiledWave2D::from_grid(&g, 4, 3)?; // 16 x 16 cells a tile
/// tiled.run(50);
/// g.run(50);
/// assert_eq!(tiled.field(), g.field());
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TiledWave2D {
    pub(crate) config: HaloExchangeConfig,
    exchange: HaloExchange,
    pub(crate) prev: Vec<Vec<f32>>,
    pub(crate) cur: Vec<Vec<f32>>,
    pub(crate) coeffs: Vec<TileCoeffs>,
    pub(crate) c2u: f32,
    dt: f32,
    sources: Vec<Source>,
    steps: u64,
}

impl TiledWave2D {
    /// Splits `grid` (its fields, materials and sources) into `tiles_x × tiles_y` tiles.
    ///
    /// Errors: [`Error::InvalidArgument`] when the tile counts do not divide the grid's
    /// sides.
    pub fn from_grid(grid: &WaveGrid2D, tiles_x: usize, tiles_y: usize) -> Result<Self> {
        let (nx, ny) = (grid.nx(), grid.ny());
        if tiles_x == 0 || tiles_y == 0 || nx % tiles_x != 0 || ny % tiles_y != 0 {
            return Err(Error::invalid(format!(
                "{tiles_x} x {tiles_y} tiles do not divide a {nx} x {ny} grid"
            )));
        }
        let (tx, ty) = (nx / tiles_x, ny / tiles_y);
        let config =
            HaloExchangeConfig::new_2d(tiles_x as u32, tiles_y as u32, tx as u32, ty as u32, 1);
        let exchange = HaloExchange::new(config)?;
        let p = grid.params();
        let c2u = p.c2_of(p.speed);
        let (gs, ts) = (grid.stride(), tx + 2);
        let (c2, a, b) = grid.coefficients();
        let cut = |src: &[f32], i: usize, halo_too: bool| -> Vec<f32> {
            let (ox, oy) = ((i % tiles_x) * tx, (i / tiles_x) * ty);
            let mut v = vec![0.0f32; ts * (ty + 2)];
            for y in 0..ty + 2 {
                for x in 0..ts {
                    let interior = (1..=tx).contains(&x) && (1..=ty).contains(&y);
                    if interior || halo_too {
                        v[y * ts + x] = src[(oy + y) * gs + ox + x];
                    }
                }
            }
            v
        };
        let n = tiles_x * tiles_y;
        let coeffs = (0..n)
            .map(|i| {
                let (c2, a, b) = (cut(c2, i, false), cut(a, i, false), cut(b, i, false));
                let uniform = (0..ty + 2)
                    .map(|y| {
                        (1..=tx).all(|x| {
                            let k = y * ts + x;
                            c2[k] == c2u && a[k] == 1.0 && b[k] == 1.0
                        })
                    })
                    .collect();
                TileCoeffs { c2, a, b, uniform }
            })
            .collect();
        Ok(TiledWave2D {
            config,
            exchange,
            prev: (0..n)
                .map(|i| cut(grid.padded_previous(), i, false))
                .collect(),
            cur: (0..n).map(|i| cut(grid.padded(), i, false)).collect(),
            coeffs,
            c2u,
            dt: p.dt,
            sources: grid.sources().to_vec(),
            steps: grid.steps(),
        })
    }

    /// The halo-exchange configuration (tiles, tile size, halo 1).
    pub fn config(&self) -> &HaloExchangeConfig {
        &self.config
    }

    /// Steps taken (including the grid's before the split).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Exchanges halos, then advances every tile one step (tiles in parallel).
    pub fn step(&mut self) {
        // The plan's shapes match the buffers by construction.
        if let Err(e) = self.exchange.exchange(&mut self.cur) {
            unreachable!("tile buffers built for this plan: {e}");
        }
        let [tx, _, _] = self.config.tile().map(|v| v as usize);
        let [ts, ty2, _] = self.config.padded_tile();
        let c2u = self.c2u;
        self.prev
            .par_iter_mut()
            .zip(self.cur.par_iter())
            .zip(self.coeffs.par_iter())
            .for_each(|((prev, cur), k)| {
                let k = Coeffs {
                    c2: &k.c2,
                    a: &k.a,
                    b: &k.b,
                    uniform: &k.uniform,
                    c2u,
                };
                rows_2d(&mut prev[ts..ts * (ty2 - 1)], 1, cur, &k, ts, tx);
            });
        std::mem::swap(&mut self.prev, &mut self.cur);
        self.steps += 1;
        self.apply_sources();
    }

    fn apply_sources(&mut self) {
        let t = (self.steps as f64 * self.dt as f64) as f32;
        let [tx, ty, _] = self.config.tile().map(|v| v as usize);
        let gx = self.config.grid()[0] as usize;
        let ts = tx + 2;
        for s in &self.sources {
            let v = s.value(t, self.dt);
            if v != 0.0 {
                for &(x, y) in s.cells() {
                    let tile = (y / ty) * gx + x / tx;
                    self.cur[tile][(y % ty + 1) * ts + x % tx + 1] += v;
                }
            }
        }
    }

    /// Advances `steps` steps.
    pub fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step();
        }
    }

    /// The whole field's interior, row-major (as [`WaveGrid2D::field`]).
    pub fn field(&self) -> Vec<f32> {
        let [gx, gy, _] = self.config.grid().map(|v| v as usize);
        let [tx, ty, _] = self.config.tile().map(|v| v as usize);
        let (nx, ts) = (gx * tx, tx + 2);
        let mut out = vec![0.0f32; nx * gy * ty];
        for (i, t) in self.cur.iter().enumerate() {
            let (ox, oy) = ((i % gx) * tx, (i / gx) * ty);
            for y in 0..ty {
                let row = &t[(y + 1) * ts + 1..(y + 1) * ts + 1 + tx];
                out[(oy + y) * nx + ox..(oy + y) * nx + ox + tx].copy_from_slice(row);
            }
        }
        out
    }
}
