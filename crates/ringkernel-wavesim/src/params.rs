//! Physical parameters, the CFL stability condition and its error.

use ringkernel_core::{Error, Result};

/// The parameters of a simulation: the default wave speed (m/s), the cell size (m) and
/// the time step (s). Cells can have their own speed
/// ([`WaveGrid2D::set_speed`](crate::WaveGrid2D::set_speed)); every speed must satisfy
/// the CFL condition with this `dx` and `dt`.
///
/// ```
/// use ringkernel_wavesim::WaveParams;
/// let p = WaveParams::new(343.0, 0.1, 1e-4);
/// assert!((p.courant() - 0.343).abs() < 1e-6);
/// assert!(p.check(2).is_ok());
/// assert!(WaveParams::new(343.0, 0.1, 1e-3).check(2).is_err()); // Courant 3.43
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WaveParams {
    /// Default wave speed in m/s.
    pub speed: f32,
    /// Cell size in m.
    pub dx: f32,
    /// Time step in s.
    pub dt: f32,
}

impl Default for WaveParams {
    /// Unit speed and cells, `dt = 0.5`: Courant number 0.5, stable in 2-D and 3-D.
    fn default() -> Self {
        WaveParams {
            speed: 1.0,
            dx: 1.0,
            dt: 0.5,
        }
    }
}

/// The CFL limit on the Courant number `c·dt/dx` of the explicit second-order scheme in
/// `dims` dimensions: `1/sqrt(dims)`.
pub fn cfl_limit(dims: u32) -> f32 {
    1.0 / (dims.max(1) as f32).sqrt()
}

/// An unstable time step: the Courant number exceeds the CFL limit. Converts into
/// [`Error::InvalidArgument`] (with this text) where a [`ringkernel_core::Error`] is due.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CflError {
    /// The speed that breaks the limit, m/s.
    pub speed: f32,
    /// Its Courant number `speed·dt/dx`.
    pub courant: f32,
    /// The limit, `1/sqrt(dims)`.
    pub limit: f32,
    /// The number of dimensions.
    pub dims: u32,
}

impl std::fmt::Display for CflError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unstable time step (CFL): speed {} m/s gives Courant number {:.4} > {:.4} \
             (1/sqrt({})); lower dt or the speed, or enlarge dx",
            self.speed, self.courant, self.limit, self.dims
        )
    }
}

impl std::error::Error for CflError {}

impl From<CflError> for Error {
    fn from(e: CflError) -> Error {
        Error::InvalidArgument(e.to_string())
    }
}

impl WaveParams {
    /// Parameters with these values (checked by [`WaveParams::check`] when a grid is made).
    pub fn new(speed: f32, dx: f32, dt: f32) -> Self {
        WaveParams { speed, dx, dt }
    }

    /// The Courant number `speed·dt/dx` of the default speed.
    pub fn courant(&self) -> f32 {
        self.speed * self.dt / self.dx
    }

    /// The largest stable time step for `speed` in `dims` dimensions.
    pub fn max_stable_dt(speed: f32, dx: f32, dims: u32) -> f32 {
        cfl_limit(dims) * dx / speed
    }

    /// `(c·dt/dx)²` for a cell of speed `speed`: the coefficient of the Laplacian.
    pub fn c2_of(&self, speed: f32) -> f32 {
        let c = speed * self.dt / self.dx;
        c * c
    }

    /// Checks that `speed` is stable with this `dx` and `dt` in `dims` dimensions.
    pub fn check_speed(&self, speed: f32, dims: u32) -> std::result::Result<(), CflError> {
        let courant = speed * self.dt / self.dx;
        let limit = cfl_limit(dims);
        if courant <= limit {
            Ok(())
        } else {
            Err(CflError {
                speed,
                courant,
                limit,
                dims,
            })
        }
    }

    /// Checks the values (finite; `dx`, `dt` positive; the speed non-negative) and the
    /// CFL condition in `dims` dimensions. Errors: [`Error::InvalidArgument`].
    pub fn check(&self, dims: u32) -> Result<()> {
        let fine = self.speed.is_finite()
            && self.speed >= 0.0
            && self.dx.is_finite()
            && self.dx > 0.0
            && self.dt.is_finite()
            && self.dt > 0.0;
        if !fine {
            return Err(Error::invalid(format!(
                "wave parameters {self:?}: dx and dt must be finite and positive, the speed \
                 finite and non-negative"
            )));
        }
        self.check_speed(self.speed, dims)?;
        Ok(())
    }
}

/// The update coefficients `(a, b)` of a cell with damping `sigma` (1/s): the damped
/// wave equation `u_tt + 2σ·u_t = c²∇²u` with central differences gives
/// `u⁺ = a·(2u + c²·lap) − b·u⁻`, `a = 1/(1+g)`, `b = (1−g)/(1+g)`, `g = σ·dt/2`.
pub(crate) fn damping_coeffs(sigma: f32, dt: f32) -> (f32, f32) {
    let g = sigma * dt * 0.5;
    (1.0 / (1.0 + g), (1.0 - g) / (1.0 + g))
}
