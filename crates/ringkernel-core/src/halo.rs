//! Halo exchange for 2-D and 3-D grids of tiles: the configuration
//! ([`HaloExchangeConfig`]), the copy plan every backend executes ([`HaloPlan`]: which
//! runs of cells go from which tile to which), and the host executor ([`HaloExchange`]).
//!
//! A tile is stored padded: its `tile` interior cells with `halo` extra cells on every
//! side (x fastest, then y, then z; in 2-D there is no z padding). An exchange fills each
//! tile's halo faces with the neighbouring tiles' border cells (4 neighbours in 2-D, 6 in
//! 3-D, found through [`RoutingTable2D`] / [`RoutingTable3D`]); faces at the edge of a
//! non-periodic grid are left as they are (zero for a Dirichlet boundary). Corner and
//! edge cells of the halo are not exchanged (5- and 7-point stencils do not read them).
//!
//! ```
//! use ringkernel_core::halo::{HaloExchange, HaloExchangeConfig};
//! let config = HaloExchangeConfig::new_2d(2, 1, 4, 3, 1); // 2 x 1 tiles of 4 x 3 cells
//! let ex = HaloExchange::new(config)?;
//! let len = config.tile_len(); // (4 + 2) * (3 + 2)
//! let mut tiles = vec![vec![1.0f32; len], vec![2.0f32; len]];
//! ex.exchange(&mut tiles)?;
//! // Tile 0's east halo column (x = 5) now holds tile 1's westmost interior column.
//! assert_eq!(tiles[0][6 + 5], 2.0);
//! assert_eq!(tiles[1][6], 1.0); // and the other way round
//! # Ok::<(), ringkernel_core::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::ids::KernelId;
use crate::k2k::{Dir2, Dir3, RoutingTable2D, RoutingTable3D};

/// The shape of a halo exchange: a grid of `grid` tiles of `tile` interior cells each,
/// with a halo `halo` cells wide, in 2 or 3 dimensions, optionally periodic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HaloExchangeConfig {
    dims: u32,
    grid: [u32; 3],
    tile: [u32; 3],
    halo: u32,
    periodic: bool,
}

/// One contiguous run of a halo copy: `len` floats from `src_tile` at `src_offset` to
/// `dst_tile` at `dst_offset` (offsets in floats within a padded tile). Laid out for GPU
/// upload (five `u32`s).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HaloRun {
    /// Tile read from.
    pub src_tile: u32,
    /// First float read.
    pub src_offset: u32,
    /// Tile written.
    pub dst_tile: u32,
    /// First float written.
    pub dst_offset: u32,
    /// Floats copied.
    pub len: u32,
}

/// Every copy of one exchange, in a fixed order (tile by tile, then direction by
/// direction in the routing table's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaloPlan {
    /// The runs.
    pub runs: Vec<HaloRun>,
    /// Floats per padded tile.
    pub tile_len: usize,
    /// Floats moved by one exchange.
    pub floats: usize,
}

impl HaloExchangeConfig {
    /// A 2-D grid of `grid_x × grid_y` tiles of `tile_x × tile_y` cells, halo `halo`.
    pub fn new_2d(grid_x: u32, grid_y: u32, tile_x: u32, tile_y: u32, halo: u32) -> Self {
        HaloExchangeConfig {
            dims: 2,
            grid: [grid_x, grid_y, 1],
            tile: [tile_x, tile_y, 1],
            halo,
            periodic: false,
        }
    }

    /// A 3-D grid of `grid` tiles of `tile` cells, halo `halo`.
    pub fn new_3d(grid: [u32; 3], tile: [u32; 3], halo: u32) -> Self {
        HaloExchangeConfig {
            dims: 3,
            grid,
            tile,
            halo,
            periodic: false,
        }
    }

    /// The same with wrap-around at the grid's edges.
    pub fn with_periodic(mut self, periodic: bool) -> Self {
        self.periodic = periodic;
        self
    }

    /// 2 or 3.
    pub fn dims(&self) -> u32 {
        self.dims
    }
    /// Tiles per axis (`z` is 1 in 2-D).
    pub fn grid(&self) -> [u32; 3] {
        self.grid
    }
    /// Interior cells of a tile per axis (`z` is 1 in 2-D).
    pub fn tile(&self) -> [u32; 3] {
        self.tile
    }
    /// Halo width in cells.
    pub fn halo(&self) -> u32 {
        self.halo
    }
    /// Whether the grid wraps around.
    pub fn periodic(&self) -> bool {
        self.periodic
    }
    /// Number of tiles.
    pub fn tile_count(&self) -> usize {
        self.grid.iter().map(|&g| g as usize).product()
    }
    /// A padded tile's extent per axis.
    pub fn padded_tile(&self) -> [usize; 3] {
        let h = self.halo as usize;
        let z = if self.dims == 3 {
            self.tile[2] as usize + 2 * h
        } else {
            1
        };
        [
            self.tile[0] as usize + 2 * h,
            self.tile[1] as usize + 2 * h,
            z,
        ]
    }
    /// Floats per padded tile.
    pub fn tile_len(&self) -> usize {
        self.padded_tile().iter().product()
    }
    /// The whole grid's interior extent in cells.
    pub fn global_size(&self) -> [usize; 3] {
        [0, 1, 2].map(|a| self.grid[a] as usize * self.tile[a] as usize)
    }
    /// The grid coordinates of tile `i` (x fastest).
    pub fn tile_coords(&self, i: usize) -> [u32; 3] {
        let [gx, gy, _] = self.grid.map(|g| g as usize);
        [
            (i % gx) as u32,
            ((i / gx) % gy) as u32,
            (i / (gx * gy)) as u32,
        ]
    }
    /// Offset in a padded tile of the cell at padded coordinates `p`.
    pub fn offset(&self, p: [usize; 3]) -> usize {
        let [px, py, _] = self.padded_tile();
        (p[2] * py + p[1]) * px + p[0]
    }

    /// Checks the shape: 2 or 3 dimensions, no empty axis, a halo of 1 or more that is no
    /// wider than a tile, and tiles small enough for 32-bit offsets.
    /// Errors: [`Error::InvalidArgument`].
    pub fn validate(&self) -> Result<()> {
        let axes = self.dims as usize;
        let bad = |why: &str| Err(Error::invalid(format!("halo exchange {self:?}: {why}")));
        if !(2..=3).contains(&self.dims) {
            return bad("2 or 3 dimensions");
        }
        if self.grid.contains(&0) || self.tile.contains(&0) {
            return bad("every axis needs at least one tile and one cell");
        }
        if self.halo == 0 || (0..axes).any(|a| self.halo > self.tile[a]) {
            return bad("the halo must be 1..=the tile's smallest side");
        }
        let len = self
            .padded_tile()
            .iter()
            .try_fold(1u64, |m, &d| m.checked_mul(d as u64));
        if len.is_none_or(|l| l > u32::MAX as u64) || self.tile_count() > u32::MAX as usize {
            return bad("too large for 32-bit offsets");
        }
        Ok(())
    }

    fn ids(&self) -> Vec<KernelId> {
        (0..self.tile_count() as u32).map(KernelId).collect()
    }

    /// The 2-D routing table of the tiles (tile `i` is `KernelId(i)`).
    /// Errors: [`Error::InvalidArgument`] for a 3-D or invalid configuration.
    pub fn routing_2d(&self) -> Result<RoutingTable2D> {
        self.validate()?;
        if self.dims != 2 {
            return Err(Error::invalid("routing_2d of a 3-D halo exchange"));
        }
        RoutingTable2D::new(self.grid[0], self.grid[1], self.ids(), self.periodic)
    }

    /// The 3-D routing table of the tiles (tile `i` is `KernelId(i)`).
    /// Errors: [`Error::InvalidArgument`] for a 2-D or invalid configuration.
    pub fn routing_3d(&self) -> Result<RoutingTable3D> {
        self.validate()?;
        if self.dims != 3 {
            return Err(Error::invalid("routing_3d of a 2-D halo exchange"));
        }
        RoutingTable3D::new(self.grid, self.ids(), self.periodic)
    }

    /// The neighbours of tile `i`: `(axis, +1 or -1, neighbour tile)` for each present.
    fn neighbours(
        &self,
        i: usize,
        t2: Option<&RoutingTable2D>,
        t3: Option<&RoutingTable3D>,
    ) -> Vec<(usize, i32, usize)> {
        let c = self.tile_coords(i);
        let mut out = Vec::with_capacity(6);
        if let Some(t) = t2 {
            for d in Dir2::ALL {
                let (axis, sign) = match d {
                    Dir2::North => (1, -1),
                    Dir2::South => (1, 1),
                    Dir2::East => (0, 1),
                    Dir2::West => (0, -1),
                };
                if let Some(n) = t.neighbour(c[0], c[1], d) {
                    out.push((axis, sign, n.0 as usize));
                }
            }
        }
        if let Some(t) = t3 {
            for d in Dir3::ALL {
                let (axis, sign) = match d {
                    Dir3::PosX => (0, 1),
                    Dir3::NegX => (0, -1),
                    Dir3::PosY => (1, 1),
                    Dir3::NegY => (1, -1),
                    Dir3::PosZ => (2, 1),
                    Dir3::NegZ => (2, -1),
                };
                if let Some(n) = t.neighbour(c, d) {
                    out.push((axis, sign, n.0 as usize));
                }
            }
        }
        out
    }

    /// The copy plan of one exchange. Errors: [`Error::InvalidArgument`] for an invalid
    /// configuration.
    pub fn plan(&self) -> Result<HaloPlan> {
        self.validate()?;
        let (t2, t3) = if self.dims == 2 {
            (Some(self.routing_2d()?), None)
        } else {
            (None, Some(self.routing_3d()?))
        };
        let h = self.halo as usize;
        let t = self.tile.map(|v| v as usize);
        let axes = self.dims as usize;
        let mut runs = Vec::new();
        let mut floats = 0usize;
        for i in 0..self.tile_count() {
            for (axis, sign, n) in self.neighbours(i, t2.as_ref(), t3.as_ref()) {
                // Ranges per axis of the destination halo slab and the source slab.
                let mut dst = [(0usize, 1usize); 3];
                let mut src = [(0usize, 1usize); 3];
                for a in 0..axes {
                    dst[a] = (h, h + t[a]);
                    src[a] = (h, h + t[a]);
                }
                if sign > 0 {
                    dst[axis] = (h + t[axis], 2 * h + t[axis]);
                    src[axis] = (h, 2 * h);
                } else {
                    dst[axis] = (0, h);
                    src[axis] = (t[axis], t[axis] + h);
                }
                let len = dst[0].1 - dst[0].0;
                for z in 0..dst[2].1 - dst[2].0 {
                    for y in 0..dst[1].1 - dst[1].0 {
                        runs.push(HaloRun {
                            src_tile: n as u32,
                            src_offset: self.offset([src[0].0, src[1].0 + y, src[2].0 + z]) as u32,
                            dst_tile: i as u32,
                            dst_offset: self.offset([dst[0].0, dst[1].0 + y, dst[2].0 + z]) as u32,
                            len: len as u32,
                        });
                        floats += len;
                    }
                }
            }
        }
        Ok(HaloPlan {
            runs,
            tile_len: self.tile_len(),
            floats,
        })
    }
}

/// The host executor of a [`HaloPlan`]: exchanges halos between tiles held in host
/// memory (the CPU backend's tiles; the reference for the GPU executors).
#[derive(Debug, Clone)]
pub struct HaloExchange {
    config: HaloExchangeConfig,
    plan: HaloPlan,
}

impl HaloExchange {
    /// Plans the exchange. Errors: [`Error::InvalidArgument`] for an invalid configuration.
    pub fn new(config: HaloExchangeConfig) -> Result<Self> {
        let plan = config.plan()?;
        Ok(HaloExchange { config, plan })
    }

    /// The configuration.
    pub fn config(&self) -> &HaloExchangeConfig {
        &self.config
    }

    /// The copy plan.
    pub fn plan(&self) -> &HaloPlan {
        &self.plan
    }

    /// Fills every tile's halo from its neighbours.
    ///
    /// Errors: [`Error::ShapeMismatch`] when `tiles` is not one padded tile
    /// ([`HaloExchangeConfig::tile_len`] floats) per tile of the grid.
    pub fn exchange<T: AsMut<[f32]>>(&self, tiles: &mut [T]) -> Result<()> {
        let len = self.plan.tile_len;
        if tiles.len() != self.config.tile_count() {
            return Err(Error::shape(format!(
                "{} tile buffers for a grid of {} tiles",
                tiles.len(),
                self.config.tile_count()
            )));
        }
        if let Some(i) = tiles.iter_mut().position(|t| t.as_mut().len() != len) {
            return Err(Error::shape(format!(
                "tile buffer {i} has {} floats, a padded tile {len}",
                tiles[i].as_mut().len()
            )));
        }
        for r in &self.plan.runs {
            let (s, d, n) = (r.src_offset as usize, r.dst_offset as usize, r.len as usize);
            let (st, dt) = (r.src_tile as usize, r.dst_tile as usize);
            if st == dt {
                tiles[dt].as_mut().copy_within(s..s + n, d);
            } else if st < dt {
                let (lo, hi) = tiles.split_at_mut(dt);
                hi[0].as_mut()[d..d + n].copy_from_slice(&lo[st].as_mut()[s..s + n]);
            } else {
                let (lo, hi) = tiles.split_at_mut(st);
                lo[dt].as_mut()[d..d + n].copy_from_slice(&hi[0].as_mut()[s..s + n]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiles of a global field `f(x, y, z)`: each tile's interior and halo filled from
    /// the global function (zero outside a non-periodic grid); the exchange must
    /// reproduce the faces exactly from interiors alone.
    fn check(config: HaloExchangeConfig) {
        let ex = HaloExchange::new(config).unwrap();
        let [px, py, pz] = config.padded_tile();
        let h = config.halo() as i64;
        let g = config.global_size().map(|v| v as i64);
        let f = |x: i64, y: i64, z: i64| (1 + x + 1000 * y + 1_000_000 * z) as f32;
        let value = |tile: usize, p: [usize; 3], with_faces: bool| -> f32 {
            let c = config.tile_coords(tile);
            let t = config.tile();
            let zh = if config.dims() == 3 { h } else { 0 };
            let q = [p[0] as i64 - h, p[1] as i64 - h, p[2] as i64 - zh];
            let inside = |a: usize| q[a] >= 0 && q[a] < t[a] as i64;
            let outside: Vec<usize> = (0..3).filter(|&a| !inside(a)).collect();
            if outside.len() > 1 || (!with_faces && !outside.is_empty()) {
                return 0.0;
            }
            let mut gl = [0; 3];
            for a in 0..3 {
                gl[a] = c[a] as i64 * t[a] as i64 + q[a];
                if config.periodic() {
                    gl[a] = gl[a].rem_euclid(g[a]);
                } else if gl[a] < 0 || gl[a] >= g[a] {
                    return 0.0;
                }
            }
            f(gl[0], gl[1], gl[2])
        };
        let fill = |with_faces: bool| -> Vec<Vec<f32>> {
            (0..config.tile_count())
                .map(|i| {
                    let mut v = vec![0.0; config.tile_len()];
                    for z in 0..pz {
                        for y in 0..py {
                            for x in 0..px {
                                v[config.offset([x, y, z])] = value(i, [x, y, z], with_faces);
                            }
                        }
                    }
                    v
                })
                .collect()
        };
        let mut tiles = fill(false);
        ex.exchange(&mut tiles).unwrap();
        assert_eq!(tiles, fill(true), "{config:?}");
    }

    #[test]
    fn exchange_reproduces_the_global_field() {
        check(HaloExchangeConfig::new_2d(3, 2, 5, 4, 1));
        check(HaloExchangeConfig::new_2d(2, 3, 4, 3, 2));
        check(HaloExchangeConfig::new_2d(3, 1, 3, 2, 1).with_periodic(true));
        check(HaloExchangeConfig::new_2d(1, 1, 3, 3, 1).with_periodic(true));
        check(HaloExchangeConfig::new_3d([2, 3, 2], [3, 2, 4], 1));
        check(HaloExchangeConfig::new_3d([2, 1, 2], [3, 3, 3], 2).with_periodic(true));
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(HaloExchange::new(HaloExchangeConfig::new_2d(0, 1, 4, 4, 1)).is_err());
        assert!(HaloExchange::new(HaloExchangeConfig::new_2d(1, 1, 4, 4, 0)).is_err());
        assert!(HaloExchange::new(HaloExchangeConfig::new_2d(1, 1, 4, 2, 3)).is_err());
        let ex = HaloExchange::new(HaloExchangeConfig::new_2d(2, 2, 4, 4, 1)).unwrap();
        assert!(matches!(
            ex.exchange(&mut vec![vec![0.0; 36]; 3]),
            Err(Error::ShapeMismatch(_))
        ));
        assert!(matches!(
            ex.exchange(&mut vec![vec![0.0; 35]; 4]),
            Err(Error::ShapeMismatch(_))
        ));
        assert!(HaloExchangeConfig::new_2d(2, 2, 4, 4, 1)
            .routing_3d()
            .is_err());
        let plan = HaloExchangeConfig::new_2d(8, 8, 64, 64, 1).plan().unwrap();
        // Interior edges: 2 * 8 * 7 faces of 64 cells each, moved both ways.
        assert_eq!(plan.floats, 2 * 2 * 8 * 7 * 64);
    }
}
