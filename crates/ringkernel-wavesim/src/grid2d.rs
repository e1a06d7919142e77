//! The 2-D CPU engine: structure-of-arrays fields with a one-cell zero halo, rows
//! updated in parallel with rayon.

use crate::kernel::{band_sweep, edge_sweep, rows_2d, Band, Coeffs};
use crate::params::{damping_coeffs, WaveParams};
use crate::source::Source;
use rayon::prelude::*;
use ringkernel_core::{Error, Result};

/// Below this many cells a step runs on the calling thread (a fork-join costs more).
const PAR_MIN_CELLS: usize = 16 * 1024;
/// Cells per rayon task (at least).
const CELLS_PER_TASK: usize = 8 * 1024;
/// Steps [`WaveGrid2D::run`] takes in one sweep over the rows (without sources): about
/// the same CPU time a step as 2 or 4 at 256² (compute-bound there), less at 1024² and
/// 4096² (memory-bound), where deeper sweeps (16) start to lose again.
const SWEEP_STEPS: usize = 8;

/// What a cell is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Material {
    /// The medium with the grid's default speed, lossless.
    Medium,
    /// A medium of its own speed (m/s), lossless.
    Speed(f32),
    /// An absorber: the default speed with damping `sigma` (1/s).
    Absorber(f32),
    /// A reflector: a rigid wall (the field is held at zero).
    Reflector,
}

impl Material {
    /// The cell's update coefficients `(c², a, b)` under `p` on a grid of `dims`
    /// dimensions (see [`damping_coeffs`]). [`Error::InvalidArgument`] for a speed or
    /// damping that is negative or not finite, or a speed that breaks the CFL condition.
    pub(crate) fn coefficients(self, p: &WaveParams, dims: u32) -> Result<(f32, f32, f32)> {
        Ok(match self {
            Material::Medium => (p.c2_of(p.speed), 1.0, 1.0),
            Material::Speed(c) => {
                if !(c.is_finite() && c >= 0.0) {
                    return Err(Error::invalid(format!("speed {c}: must be finite, >= 0")));
                }
                p.check_speed(c, dims)?;
                (p.c2_of(c), 1.0, 1.0)
            }
            Material::Absorber(sigma) => {
                if !(sigma.is_finite() && sigma >= 0.0) {
                    return Err(Error::invalid(format!(
                        "damping {sigma}: must be finite, >= 0"
                    )));
                }
                let (a, b) = damping_coeffs(sigma, p.dt);
                (p.c2_of(p.speed), a, b)
            }
            Material::Reflector => (0.0, 0.0, 0.0),
        })
    }
}

/// A 2-D acoustic wave simulation on the CPU: `u_tt = c²∇²u − 2σu_t`, second-order
/// finite differences in time and space (5-point Laplacian), per-cell speed and damping,
/// zero field outside the grid (a reflecting border unless absorbers line it).
///
/// Fields are padded with a one-cell halo (`(nx + 2) × (ny + 2)` floats, row-major,
/// interior cell `(x, y)` at `(y + 1) * (nx + 2) + x + 1`), the layout of the codegen
/// stencil kernels (`GridPos` with halo 1).
///
/// ```
/// use ringkernel_wavesim::{WaveGrid2D, WaveParams};
/// let mut g = WaveGrid2D::new(64, 48, WaveParams::default())?;
/// g.add_gaussian(32.0, 24.0, 2.0, 1.0);
/// let e0 = g.energy();
/// g.run(100);
/// assert!((g.energy() - e0).abs() < 1e-3 * e0); // a closed, lossless box
/// assert!(g.value(32 + 30, 24).abs() > 0.0 || g.value(32, 24 + 20).abs() > 0.0);
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct WaveGrid2D {
    nx: usize,
    ny: usize,
    params: WaveParams,
    /// Field at the previous step (overwritten with the next one by a step).
    prev: Vec<f32>,
    /// Field at the current step.
    cur: Vec<f32>,
    c2: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    /// Per padded row: every interior cell is the default medium.
    uniform: Vec<bool>,
    sources: Vec<Source>,
    steps: u64,
}

impl WaveGrid2D {
    /// An `nx × ny` grid at rest, all default medium.
    ///
    /// Errors: [`Error::InvalidArgument`] for an empty grid, bad parameters or an
    /// unstable time step (a [`CflError`](crate::CflError)'s text).
    pub fn new(nx: usize, ny: usize, params: WaveParams) -> Result<Self> {
        params.check(2)?;
        if nx == 0 || ny == 0 || nx > 1 << 16 || ny > 1 << 16 {
            return Err(Error::invalid(format!(
                "grid {nx} x {ny}: each side must be 1..=65536 cells"
            )));
        }
        let len = (nx + 2) * (ny + 2);
        let c2u = params.c2_of(params.speed);
        let mut g = WaveGrid2D {
            nx,
            ny,
            params,
            prev: vec![0.0; len],
            cur: vec![0.0; len],
            c2: vec![c2u; len],
            a: vec![1.0; len],
            b: vec![1.0; len],
            uniform: vec![true; ny + 2],
            sources: Vec::new(),
            steps: 0,
        };
        g.zero_halo_coeffs();
        Ok(g)
    }

    fn zero_halo_coeffs(&mut self) {
        let s = self.stride();
        for y in 0..self.ny + 2 {
            for x in 0..s {
                if y == 0 || y == self.ny + 1 || x == 0 || x == s - 1 {
                    let k = y * s + x;
                    self.c2[k] = 0.0;
                    self.a[k] = 0.0;
                    self.b[k] = 0.0;
                }
            }
        }
    }

    /// Interior width.
    pub fn nx(&self) -> usize {
        self.nx
    }
    /// Interior height.
    pub fn ny(&self) -> usize {
        self.ny
    }
    /// Padded row length, `nx + 2`.
    pub fn stride(&self) -> usize {
        self.nx + 2
    }
    /// The parameters.
    pub fn params(&self) -> WaveParams {
        self.params
    }
    /// Steps taken since creation or the last [`reset`](Self::reset).
    pub fn steps(&self) -> u64 {
        self.steps
    }
    /// Sets the step count (the clock of the sources), e.g. with a state from
    /// [`set_state`](Self::set_state).
    pub fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }
    /// Simulated time, `steps · dt` seconds.
    pub fn time(&self) -> f64 {
        self.steps as f64 * self.params.dt as f64
    }

    fn idx(&self, x: usize, y: usize) -> usize {
        (y + 1) * self.stride() + x + 1
    }

    fn check_cell(&self, x: usize, y: usize) -> Result<()> {
        if x < self.nx && y < self.ny {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "cell ({x}, {y}) is outside the {} x {} grid",
                self.nx, self.ny
            )))
        }
    }

    /// Makes cell `(x, y)` of `material`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a cell outside the grid, a speed or damping
    /// that is negative or not finite, or a speed that breaks the CFL condition.
    pub fn set_material(&mut self, x: usize, y: usize, material: Material) -> Result<()> {
        self.check_cell(x, y)?;
        let (c2, a, b) = material.coefficients(&self.params, 2)?;
        let k = self.idx(x, y);
        self.c2[k] = c2;
        self.a[k] = a;
        self.b[k] = b;
        if material == Material::Reflector {
            self.cur[k] = 0.0;
            self.prev[k] = 0.0;
        }
        self.refresh_row(y + 1);
        Ok(())
    }

    /// [`set_material`](Self::set_material) with [`Material::Speed`].
    pub fn set_speed(&mut self, x: usize, y: usize, speed: f32) -> Result<()> {
        self.set_material(x, y, Material::Speed(speed))
    }

    /// [`set_material`](Self::set_material) with [`Material::Absorber`].
    pub fn set_damping(&mut self, x: usize, y: usize, sigma: f32) -> Result<()> {
        self.set_material(x, y, Material::Absorber(sigma))
    }

    /// [`set_material`](Self::set_material) with [`Material::Reflector`].
    pub fn set_reflector(&mut self, x: usize, y: usize) -> Result<()> {
        self.set_material(x, y, Material::Reflector)
    }

    /// The material of cell `(x, y)` as stored (a medium cell of the default speed reads
    /// [`Material::Medium`]); `None` outside the grid.
    pub fn material(&self, x: usize, y: usize) -> Option<Material> {
        self.check_cell(x, y).ok()?;
        let k = self.idx(x, y);
        let c2u = self.params.c2_of(self.params.speed);
        Some(if self.a[k] == 0.0 {
            Material::Reflector
        } else if self.a[k] != 1.0 {
            let g = (1.0 / self.a[k] - 1.0) as f64;
            Material::Absorber((2.0 * g / self.params.dt as f64) as f32)
        } else if self.c2[k] == c2u {
            Material::Medium
        } else {
            let c = self.c2[k].sqrt() * self.params.dx / self.params.dt;
            Material::Speed(c)
        })
    }

    fn refresh_row(&mut self, y: usize) {
        let s = self.stride();
        let c2u = self.params.c2_of(self.params.speed);
        let r = y * s + 1..y * s + 1 + self.nx;
        self.uniform[y] = self.c2[r.clone()].iter().all(|&v| v == c2u)
            && self.a[r.clone()].iter().all(|&v| v == 1.0)
            && self.b[r].iter().all(|&v| v == 1.0);
    }

    /// Lines the grid's four sides with an absorbing layer `width` cells deep whose
    /// damping grows quadratically from 0 to `sigma_max` (1/s) at the edge (a sponge
    /// layer: outgoing waves die in it instead of reflecting off the border).
    ///
    /// Errors: [`Error::InvalidArgument`] for a `sigma_max` that is negative or not
    /// finite, or a layer deeper than half the grid.
    pub fn add_absorbing_border(&mut self, width: usize, sigma_max: f32) -> Result<()> {
        if width == 0 {
            return Ok(());
        }
        if 2 * width > self.nx.min(self.ny) {
            return Err(Error::invalid(format!(
                "absorbing border of {width} cells does not fit a {} x {} grid",
                self.nx, self.ny
            )));
        }
        for y in 0..self.ny {
            for x in 0..self.nx {
                let d = x.min(y).min(self.nx - 1 - x).min(self.ny - 1 - y);
                if d < width {
                    let f = (width - d) as f32 / width as f32;
                    self.set_material(x, y, Material::Absorber(sigma_max * f * f))?;
                }
            }
        }
        Ok(())
    }

    /// Adds a source (applied after every step).
    ///
    /// Errors: [`Error::InvalidArgument`] for a cell outside the grid or a bad signal.
    pub fn add_source(&mut self, source: Source) -> Result<()> {
        source.check(self.nx, self.ny)?;
        self.sources.push(source);
        Ok(())
    }

    /// Keeps only the sources for which `keep` returns true.
    pub fn retain_sources(&mut self, keep: impl FnMut(&Source) -> bool) {
        self.sources.retain(keep);
    }

    /// Removes every source.
    pub fn clear_sources(&mut self) {
        self.sources.clear();
    }

    /// The sources.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Adds a Gaussian bump `amplitude · exp(−r²/(2·radius²))` centred at `(cx, cy)` (in
    /// cells) to the field at rest (zero velocity: both time levels get it); reflector
    /// cells stay zero.
    pub fn add_gaussian(&mut self, cx: f32, cy: f32, radius: f32, amplitude: f32) {
        let inv = 1.0 / (2.0 * radius * radius);
        for y in 0..self.ny {
            for x in 0..self.nx {
                let k = self.idx(x, y);
                if self.a[k] == 0.0 {
                    continue;
                }
                let (dx, dy) = (x as f32 - cx, y as f32 - cy);
                let v = amplitude * (-(dx * dx + dy * dy) * inv).exp();
                self.cur[k] += v;
                self.prev[k] += v;
            }
        }
    }

    /// Sets both time levels of the interior from `field` (row-major `nx × ny`): the
    /// field at rest. Errors: [`Error::ShapeMismatch`] for a wrong length.
    pub fn set_field(&mut self, field: &[f32]) -> Result<()> {
        if field.len() != self.nx * self.ny {
            return Err(Error::shape(format!(
                "field of {} values for a {} x {} grid",
                field.len(),
                self.nx,
                self.ny
            )));
        }
        for y in 0..self.ny {
            let k = self.idx(0, y);
            let row = &field[y * self.nx..(y + 1) * self.nx];
            self.cur[k..k + self.nx].copy_from_slice(row);
            self.prev[k..k + self.nx].copy_from_slice(row);
        }
        Ok(())
    }

    /// Sets the field to rest (zero) and the step count to 0; materials and sources stay.
    pub fn reset(&mut self) {
        self.cur.fill(0.0);
        self.prev.fill(0.0);
        self.steps = 0;
    }

    /// Removes every absorber, reflector and speed change (all default medium).
    pub fn clear_materials(&mut self) {
        let c2u = self.params.c2_of(self.params.speed);
        self.c2.fill(c2u);
        self.a.fill(1.0);
        self.b.fill(1.0);
        self.zero_halo_coeffs();
        self.uniform.fill(true);
    }

    /// The update coefficients, and the two fields (previous, current) to update.
    fn parts(&mut self) -> (Coeffs<'_>, &mut [f32], &mut [f32]) {
        let c2u = self.params.c2_of(self.params.speed);
        let k = Coeffs {
            c2: &self.c2,
            a: &self.a,
            b: &self.b,
            uniform: &self.uniform,
            c2u,
        };
        (k, &mut self.prev, &mut self.cur)
    }

    /// Advances one time step.
    pub fn step(&mut self) {
        let (nx, ny, s) = (self.nx, self.ny, self.stride());
        let (k, prev, cur) = self.parts();
        let cur = &*cur;
        let rows = &mut prev[s..s * (ny + 1)];
        if nx * ny < PAR_MIN_CELLS {
            rows_2d(rows, 1, cur, &k, s, nx);
        } else {
            let per = CELLS_PER_TASK.div_ceil(nx).max(1);
            rows.par_chunks_mut(per * s)
                .enumerate()
                .for_each(|(i, chunk)| rows_2d(chunk, 1 + i * per, cur, &k, s, nx));
        }
        std::mem::swap(&mut self.prev, &mut self.cur);
        self.steps += 1;
        self.apply_sources();
    }

    fn apply_sources(&mut self) {
        if self.sources.is_empty() {
            return;
        }
        let t = self.time() as f32;
        let dt = self.params.dt;
        let s = self.stride();
        for src in &self.sources {
            let v = src.value(t, dt);
            if v != 0.0 {
                for &(x, y) in src.cells() {
                    self.cur[(y + 1) * s + x + 1] += v;
                }
            }
        }
    }

    /// Advances `steps` time steps. Without sources, eight steps at a time in
    /// one sweep over the rows (temporal blocking: the same results as single
    /// [`step`](Self::step)s, bit for bit, with a fraction of the memory traffic and of
    /// the fork-joins).
    pub fn run(&mut self, steps: u64) {
        let mut left = steps;
        if self.sources.is_empty() {
            let bands = if self.nx * self.ny < PAR_MIN_CELLS {
                1
            } else {
                rayon::current_num_threads()
            };
            for depth in [SWEEP_STEPS, 4, 2] {
                while left >= depth as u64 && self.sweep(depth, bands) {
                    left -= depth as u64;
                }
            }
        }
        for _ in 0..left {
            self.step();
        }
    }

    /// `depth` steps (even) in one sweep, the rows cut into at most `bands` bands of
    /// `2·depth − 2` rows or more. Returns false (and does nothing) when the grid has too
    /// few rows for one such band.
    fn sweep(&mut self, depth: usize, bands: usize) -> bool {
        let (ny, s) = (self.ny, self.stride());
        let min_rows = 2 * depth - 2;
        if depth < 2 || depth % 2 == 1 || ny < min_rows {
            return false;
        }
        let nbands = bands.clamp(1, ny / min_rows);
        let (k, all_prev, all_cur) = self.parts();
        // Band j: padded rows starts[j]..starts[j + 1].
        let starts: Vec<usize> = (0..=nbands).map(|j| 1 + j * ny / nbands).collect();
        let copy = |y: usize| all_cur[y * s..(y + 1) * s].to_vec();
        let halos: Vec<(Vec<f32>, Vec<f32>)> = starts
            .windows(2)
            .map(|w| (copy(w[0] - 1), copy(w[1])))
            .collect();
        let mut bands = Vec::with_capacity(nbands);
        let (mut prev, mut cur) = (&mut all_prev[s..], &mut all_cur[s..]);
        for (w, (above, below)) in starts.windows(2).zip(halos) {
            let len = (w[1] - w[0]) * s;
            let (p, p_rest) = std::mem::take(&mut prev).split_at_mut(len);
            let (c, c_rest) = std::mem::take(&mut cur).split_at_mut(len);
            (prev, cur) = (p_rest, c_rest);
            bands.push(Band {
                y0: w[0],
                prev: p,
                cur: c,
                above,
                below,
            });
        }
        if nbands == 1 {
            band_sweep(&mut bands[0], &k, depth);
        } else {
            bands.par_iter_mut().for_each(|b| band_sweep(b, &k, depth));
        }
        drop(bands);
        edge_sweep(all_prev, all_cur, &k, (s, ny), &starts, depth);
        self.steps += depth as u64;
        true
    }

    /// The field at interior cell `(x, y)` (0 outside).
    pub fn value(&self, x: usize, y: usize) -> f32 {
        if x < self.nx && y < self.ny {
            self.cur[self.idx(x, y)]
        } else {
            0.0
        }
    }

    /// The current field's interior, row-major `nx × ny`.
    pub fn field(&self) -> Vec<f32> {
        interior(&self.cur, self.nx, self.ny)
    }

    /// The current field, padded (`(nx + 2) × (ny + 2)`).
    pub fn padded(&self) -> &[f32] {
        &self.cur
    }

    /// The previous step's field, padded.
    pub fn padded_previous(&self) -> &[f32] {
        &self.prev
    }

    /// `Some(c²)` of the default medium when every interior cell is that medium (its
    /// speed, no damping, no reflector), else `None`: the case the uniform-medium GPU
    /// kernels handle without coefficient arrays.
    pub fn uniform_c2(&self) -> Option<f32> {
        self.uniform[1..=self.ny]
            .iter()
            .all(|&u| u)
            .then(|| self.params.c2_of(self.params.speed))
    }

    /// The padded coefficient arrays `(c², a, b)` of the update
    /// `u⁺ = a·(2u + c²·lap) − b·u⁻` (zero in the halo).
    pub fn coefficients(&self) -> (&[f32], &[f32], &[f32]) {
        (&self.c2, &self.a, &self.b)
    }

    /// Overwrites both time levels (padded layout), e.g. with the result of a device run.
    /// Errors: [`Error::ShapeMismatch`] for a wrong length.
    pub fn set_state(&mut self, previous: &[f32], current: &[f32]) -> Result<()> {
        let len = self.cur.len();
        if previous.len() != len || current.len() != len {
            return Err(Error::shape(format!(
                "state of {} and {} values for a padded grid of {len}",
                previous.len(),
                current.len()
            )));
        }
        self.prev.copy_from_slice(previous);
        self.cur.copy_from_slice(current);
        Ok(())
    }

    /// The largest absolute value of the field.
    pub fn max_abs(&self) -> f32 {
        self.cur.iter().fold(0.0f32, |m, v| m.max(v.abs()))
    }

    /// The discrete energy of the last step, conserved exactly (up to rounding) by the
    /// scheme in a lossless medium:
    /// `Σ (u − u⁻)²/c²ₖ + Σ_edges (u_i − u_j)(u⁻_i − u⁻_j)`, in units of `dx²/dt²`
    /// (the second sum runs over neighbouring pairs, the zero halo included; reflector
    /// cells have no kinetic term). Computed in f64.
    pub fn energy(&self) -> f64 {
        energy_2d(&self.cur, &self.prev, &self.c2, self.nx, self.ny)
    }
}

/// The interior of a padded `(nx + 2) × (ny + 2)` field.
pub(crate) fn interior(padded: &[f32], nx: usize, ny: usize) -> Vec<f32> {
    let s = nx + 2;
    (1..=ny)
        .flat_map(|y| padded[y * s + 1..y * s + 1 + nx].iter().copied())
        .collect()
}

pub(crate) fn energy_2d(u: &[f32], p: &[f32], c2: &[f32], nx: usize, ny: usize) -> f64 {
    let s = nx + 2;
    let mut kin = 0.0f64;
    let mut pot = 0.0f64;
    for y in 0..ny + 2 {
        for x in 0..s {
            let k = y * s + x;
            if c2[k] > 0.0 {
                let v = u[k] as f64 - p[k] as f64;
                kin += v * v / c2[k] as f64;
            }
            if x + 1 < s {
                pot += (u[k] as f64 - u[k + 1] as f64) * (p[k] as f64 - p[k + 1] as f64);
            }
            if y + 1 < ny + 2 {
                pot += (u[k] as f64 - u[k + s] as f64) * (p[k] as f64 - p[k + s] as f64);
            }
        }
    }
    kin + pot
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Signal, Source};

    #[test]
    fn uniform_c2_follows_the_materials() {
        let p = WaveParams::default();
        let mut g = WaveGrid2D::new(20, 9, p).unwrap();
        assert_eq!(g.uniform_c2(), Some(p.c2_of(p.speed)));
        g.set_reflector(19, 8).unwrap();
        assert_eq!(g.uniform_c2(), None);
        g.clear_materials();
        assert_eq!(g.uniform_c2(), Some(p.c2_of(p.speed)));
        g.set_damping(0, 0, 0.01).unwrap();
        assert_eq!(g.uniform_c2(), None);
        g.clear_materials();
        g.set_speed(5, 4, p.speed * 0.5).unwrap();
        assert_eq!(g.uniform_c2(), None);
    }

    /// A grid with materials on some rows and a pulse.
    fn grid(nx: usize, ny: usize) -> WaveGrid2D {
        let mut g = WaveGrid2D::new(nx, ny, WaveParams::default()).unwrap();
        g.add_gaussian(nx as f32 / 3.0, ny as f32 / 2.0, 2.5, 1.0);
        for y in ny / 4..ny / 2 {
            g.set_reflector(nx * 2 / 3, y).unwrap();
        }
        g.add_absorbing_border(3.min(nx / 2).min(ny / 2), 0.3)
            .unwrap();
        g
    }

    #[test]
    fn sweeps_equal_single_steps_bit_for_bit() {
        for (nx, ny) in [(7, 3), (31, 9), (64, 48), (53, 101)] {
            for depth in [2, 4, 6] {
                for bands in [1, 2, 3, 5, 40] {
                    let (mut a, mut b) = (grid(nx, ny), grid(nx, ny));
                    let mut done = 0;
                    for _ in 0..6 {
                        if b.sweep(depth, bands) {
                            done += depth;
                        }
                    }
                    for _ in 0..done {
                        a.step();
                    }
                    assert_eq!(a.steps(), b.steps());
                    let what = format!("{nx} x {ny}, depth {depth}, {bands} bands");
                    assert_eq!(a.padded(), b.padded(), "{what}");
                    assert_eq!(a.padded_previous(), b.padded_previous(), "{what}");
                    assert_eq!(done > 0, ny >= 2 * depth - 2, "{what}");
                }
            }
        }
        assert!(!grid(10, 10).sweep(3, 1), "odd depths are refused");
    }

    #[test]
    fn run_takes_single_steps_with_sources_and_odd_counts() {
        let (mut a, mut b) = (grid(40, 30), grid(40, 30));
        for _ in 0..11 {
            a.step();
        }
        b.run(11);
        assert_eq!(a.padded(), b.padded());
        let src = Source::point(5, 5, Signal::Sine { freq: 0.1 }, 1.0);
        a.add_source(src.clone()).unwrap();
        b.add_source(src).unwrap();
        for _ in 0..10 {
            a.step();
        }
        b.run(10);
        assert_eq!(a.padded(), b.padded());
        assert_eq!(a.steps(), 21);
    }
}
