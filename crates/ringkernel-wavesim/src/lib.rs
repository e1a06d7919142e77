//! # ringkernel-wavesim
//!
//! A 2-D (and 3-D) acoustic wave simulation, RingKernel's showcase: the wave equation
//! `u_tt = c²∇²u − 2σu_t` with second-order finite differences (leapfrog in time, a
//! 5-point Laplacian in 2-D, 7-point in 3-D), per-cell speed and damping (absorbers,
//! reflectors), point and line sources, and a CFL check that refuses an unstable time
//! step with a typed error ([`CflError`], an [`Error::InvalidArgument`](ringkernel_core::Error)).
//!
//! * [`WaveGrid2D`], [`WaveGrid3D`]: the CPU engines (structure of arrays, inner loops
//!   the compiler vectorises, AVX2 picked at run time, rows spread over rayon).
//! * [`viewer::Viewer`]: the interactive session (mouse drawing, keys, backend switch,
//!   a status bar) drawn into a frame buffer; `window::run_window` (feature `window`)
//!   shows it in an X11 window.
//!
//! ```
//! use ringkernel_wavesim::{Signal, Source, WaveGrid2D, WaveParams};
//! let mut sim = WaveGrid2D::new(128, 128, WaveParams::new(343.0, 0.1, 1e-4))?;
//! sim.add_absorbing_border(16, 2000.0)?;
//! sim.set_reflector(64, 40)?;
//! sim.add_source(Source::point(64, 64, Signal::Ricker { freq: 500.0, delay: 2e-3 }, 1.0))?;
//! sim.run(200);
//! assert!(sim.max_abs() > 0.0);
//! // An unstable time step is an error:
//! assert!(WaveGrid2D::new(64, 64, WaveParams::new(343.0, 0.1, 1e-3)).is_err());
//! # Ok::<(), ringkernel_core::Error>(())
//! ```

#![warn(missing_docs)]

mod actors;
pub mod cuda;
mod device;
mod font;
mod grid2d;
mod grid3d;
mod kernel;
mod params;
mod source;
mod tiled;

pub use actors::run_tile_actors;
pub use device::{
    add_sources, wave_step, wave_steps, DeviceWave2D, ADD_SOURCES, BLOCK_REGION,
    DEFAULT_STEPS_PER_LAUNCH, MAX_STEPS_PER_LAUNCH, WAVE_STEP, WAVE_STEPS,
};
pub use grid2d::{Material, WaveGrid2D};
pub use grid3d::WaveGrid3D;
pub use params::{cfl_limit, CflError, WaveParams};
pub use source::{Signal, Source};
pub use tiled::TiledWave2D;
pub mod image;
pub mod scene;
pub mod viewer;
#[cfg(feature = "window")]
pub mod window;
