//! The 3-D CPU engine (7-point Laplacian), z-planes updated in parallel with rayon.

use crate::grid2d::Material;
use crate::kernel::{planes_3d, Coeffs};
use crate::params::WaveParams;
use rayon::prelude::*;
use ringkernel_core::{Error, Result};

/// A 3-D acoustic wave simulation on the CPU: the scheme of
/// [`WaveGrid2D`](crate::WaveGrid2D) with a 7-point Laplacian (CFL limit `1/sqrt(3)`).
/// Fields are padded with a one-cell zero halo, x fastest then y then z (the layout of
/// the codegen's `GridPos3` with halo 1).
///
/// ```
/// use ringkernel_wavesim::{WaveGrid3D, WaveParams};
/// let mut g = WaveGrid3D::new(24, 20, 16, WaveParams::default())?;
/// g.add_gaussian([12.0, 10.0, 8.0], 1.5, 1.0);
/// let e0 = g.energy();
/// g.run(50);
/// assert!((g.energy() - e0).abs() < 1e-3 * e0);
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct WaveGrid3D {
    n: [usize; 3],
    params: WaveParams,
    prev: Vec<f32>,
    cur: Vec<f32>,
    c2: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    /// Per padded line `z * (ny + 2) + y`: every interior cell is the default medium.
    uniform: Vec<bool>,
    steps: u64,
}

impl WaveGrid3D {
    /// An `nx × ny × nz` grid at rest, all default medium.
    ///
    /// Errors: [`Error::InvalidArgument`] for an empty grid, bad parameters or an
    /// unstable time step (a [`CflError`](crate::CflError)'s text).
    pub fn new(nx: usize, ny: usize, nz: usize, params: WaveParams) -> Result<Self> {
        params.check(3)?;
        if [nx, ny, nz].iter().any(|&d| d == 0 || d > 4096) {
            return Err(Error::invalid(format!(
                "grid {nx} x {ny} x {nz}: each side must be 1..=4096 cells"
            )));
        }
        let len = (nx + 2) * (ny + 2) * (nz + 2);
        let c2u = params.c2_of(params.speed);
        let mut g = WaveGrid3D {
            n: [nx, ny, nz],
            params,
            prev: vec![0.0; len],
            cur: vec![0.0; len],
            c2: vec![0.0; len],
            a: vec![0.0; len],
            b: vec![0.0; len],
            uniform: vec![true; (ny + 2) * (nz + 2)],
            steps: 0,
        };
        for z in 0..nz {
            for y in 0..ny {
                let k = g.idx(0, y, z);
                g.c2[k..k + nx].fill(c2u);
                g.a[k..k + nx].fill(1.0);
                g.b[k..k + nx].fill(1.0);
            }
        }
        Ok(g)
    }

    /// Interior size `[nx, ny, nz]`.
    pub fn size(&self) -> [usize; 3] {
        self.n
    }
    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    fn idx(&self, x: usize, y: usize, z: usize) -> usize {
        let [nx, ny, _] = self.n;
        ((z + 1) * (ny + 2) + y + 1) * (nx + 2) + x + 1
    }

    /// Makes cell `(x, y, z)` of `material`. Errors as
    /// [`WaveGrid2D::set_material`](crate::WaveGrid2D::set_material).
    pub fn set_material(&mut self, x: usize, y: usize, z: usize, material: Material) -> Result<()> {
        let [nx, ny, nz] = self.n;
        if x >= nx || y >= ny || z >= nz {
            return Err(Error::invalid(format!(
                "cell ({x}, {y}, {z}) is outside the {nx} x {ny} x {nz} grid"
            )));
        }
        let (c2, a, b) = material.coefficients(&self.params, 3)?;
        let k = self.idx(x, y, z);
        self.c2[k] = c2;
        self.a[k] = a;
        self.b[k] = b;
        if material == Material::Reflector {
            self.cur[k] = 0.0;
            self.prev[k] = 0.0;
        }
        let c2u = self.params.c2_of(self.params.speed);
        let r = self.idx(0, y, z)..self.idx(0, y, z) + nx;
        self.uniform[(z + 1) * (ny + 2) + y + 1] = self.c2[r.clone()].iter().all(|&v| v == c2u)
            && self.a[r.clone()].iter().all(|&v| v == 1.0)
            && self.b[r].iter().all(|&v| v == 1.0);
        Ok(())
    }

    /// Adds a Gaussian bump centred at `c` (cells) to the field at rest.
    pub fn add_gaussian(&mut self, c: [f32; 3], radius: f32, amplitude: f32) {
        let inv = 1.0 / (2.0 * radius * radius);
        let [nx, ny, nz] = self.n;
        for z in 0..nz {
            for y in 0..ny {
                for x in 0..nx {
                    let k = self.idx(x, y, z);
                    if self.a[k] == 0.0 {
                        continue;
                    }
                    let d = [x as f32 - c[0], y as f32 - c[1], z as f32 - c[2]];
                    let v = amplitude * (-(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]) * inv).exp();
                    self.cur[k] += v;
                    self.prev[k] += v;
                }
            }
        }
    }

    /// Advances one time step.
    pub fn step(&mut self) {
        let [nx, ny, nz] = self.n;
        let plane = (nx + 2) * (ny + 2);
        let k = Coeffs {
            c2: &self.c2,
            a: &self.a,
            b: &self.b,
            uniform: &self.uniform,
            c2u: self.params.c2_of(self.params.speed),
        };
        let cur = &self.cur;
        let planes = &mut self.prev[plane..plane * (nz + 1)];
        if nx * ny * nz < 16 * 1024 {
            planes_3d(planes, 1, cur, &k, nx, ny);
        } else {
            planes
                .par_chunks_mut(plane)
                .enumerate()
                .for_each(|(i, pl)| planes_3d(pl, 1 + i, cur, &k, nx, ny));
        }
        std::mem::swap(&mut self.prev, &mut self.cur);
        self.steps += 1;
    }

    /// Advances `steps` time steps.
    pub fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step();
        }
    }

    /// The field at `(x, y, z)` (0 outside).
    pub fn value(&self, x: usize, y: usize, z: usize) -> f32 {
        let [nx, ny, nz] = self.n;
        if x < nx && y < ny && z < nz {
            self.cur[self.idx(x, y, z)]
        } else {
            0.0
        }
    }

    /// The current field, padded.
    pub fn padded(&self) -> &[f32] {
        &self.cur
    }

    /// The discrete energy (see [`WaveGrid2D::energy`](crate::WaveGrid2D::energy)), with
    /// the edges of all three axes.
    pub fn energy(&self) -> f64 {
        let [nx, ny, nz] = self.n;
        let (sy, sz) = (nx + 2, (nx + 2) * (ny + 2));
        let (u, p) = (&self.cur, &self.prev);
        let d = |i: usize, j: usize| (u[i] as f64 - u[j] as f64) * (p[i] as f64 - p[j] as f64);
        let mut e = 0.0f64;
        for z in 0..nz + 2 {
            for y in 0..ny + 2 {
                for x in 0..nx + 2 {
                    let k = z * sz + y * sy + x;
                    if self.c2[k] > 0.0 {
                        let v = u[k] as f64 - p[k] as f64;
                        e += v * v / self.c2[k] as f64;
                    }
                    if x + 1 < nx + 2 {
                        e += d(k, k + 1);
                    }
                    if y + 1 < ny + 2 {
                        e += d(k, k + sy);
                    }
                    if z + 1 < nz + 2 {
                        e += d(k, k + sz);
                    }
                }
            }
        }
        e
    }
}
