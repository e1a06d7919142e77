//! Sources: what drives the field, and where.

use ringkernel_core::{Error, Result};

/// A source's time signal: the value added to its cells after each step, as a function
/// of the simulated time `t` (seconds) at the end of that step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Signal {
    /// A Ricker wavelet (the second derivative of a Gaussian, negated) of peak frequency
    /// `freq` Hz centred at `delay` seconds: a short, band-limited pulse.
    Ricker {
        /// Peak frequency in Hz.
        freq: f32,
        /// Time of the peak in seconds.
        delay: f32,
    },
    /// A continuous sine of frequency `freq` Hz starting at `t = 0`.
    Sine {
        /// Frequency in Hz.
        freq: f32,
    },
    /// One kick: the amplitude added once, after the first step that ends at or after
    /// `at` seconds.
    Impulse {
        /// When to kick, in seconds.
        at: f32,
    },
}

impl Signal {
    /// The signal at time `t` for a step of length `dt` (an impulse is non-zero in the one
    /// step whose end is the first at or after its time).
    pub fn value(&self, t: f32, dt: f32) -> f32 {
        match *self {
            Signal::Ricker { freq, delay } => {
                let a = std::f32::consts::PI * freq * (t - delay);
                let a2 = a * a;
                (1.0 - 2.0 * a2) * (-a2).exp()
            }
            Signal::Sine { freq } => (2.0 * std::f32::consts::PI * freq * t).sin(),
            Signal::Impulse { at } => {
                if t >= at && t - dt < at {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }

    fn check(&self) -> Result<()> {
        let ok = match *self {
            Signal::Ricker { freq, delay } => freq.is_finite() && freq > 0.0 && delay.is_finite(),
            Signal::Sine { freq } => freq.is_finite() && freq > 0.0,
            Signal::Impulse { at } => at.is_finite(),
        };
        if ok {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "source signal {self:?}: frequencies must be finite and positive, times finite"
            )))
        }
    }
}

/// A source: a set of cells, a signal and an amplitude. After every step the field at
/// each of its cells gets `amplitude * signal(t)` added (a "soft" source: waves pass
/// through it).
///
/// ```
/// use ringkernel_wavesim::{Signal, Source};
/// let point = Source::point(10, 20, Signal::Sine { freq: 0.05 }, 1.0);
/// assert_eq!(point.cells(), &[(10, 20)]);
/// let line = Source::line((0, 0), (3, 3), Signal::Impulse { at: 0.0 }, 2.0);
/// assert_eq!(line.cells().len(), 4);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    cells: Vec<(usize, usize)>,
    /// The time signal.
    pub signal: Signal,
    /// The amplitude the signal is scaled by.
    pub amplitude: f32,
}

impl Source {
    /// A source at one cell `(x, y)`.
    pub fn point(x: usize, y: usize, signal: Signal, amplitude: f32) -> Source {
        Source {
            cells: vec![(x, y)],
            signal,
            amplitude,
        }
    }

    /// A source along the straight line of cells from `from` to `to`, both included
    /// (Bresenham's line).
    pub fn line(
        from: (usize, usize),
        to: (usize, usize),
        signal: Signal,
        amplitude: f32,
    ) -> Source {
        Source {
            cells: line_cells(from, to),
            signal,
            amplitude,
        }
    }

    /// The cells the source drives.
    pub fn cells(&self) -> &[(usize, usize)] {
        &self.cells
    }

    /// What the source adds to each of its cells after a step ending at `t`.
    pub fn value(&self, t: f32, dt: f32) -> f32 {
        self.amplitude * self.signal.value(t, dt)
    }

    /// Checks the signal and that every cell lies in an `nx × ny` grid.
    pub(crate) fn check(&self, nx: usize, ny: usize) -> Result<()> {
        self.signal.check()?;
        if !self.amplitude.is_finite() {
            return Err(Error::invalid("source amplitude must be finite"));
        }
        if let Some(&(x, y)) = self.cells.iter().find(|&&(x, y)| x >= nx || y >= ny) {
            return Err(Error::invalid(format!(
                "source cell ({x}, {y}) is outside the {nx} x {ny} grid"
            )));
        }
        Ok(())
    }
}

/// The cells of the line from `a` to `b` (Bresenham), both ends included.
pub(crate) fn line_cells(a: (usize, usize), b: (usize, usize)) -> Vec<(usize, usize)> {
    let (mut x, mut y) = (a.0 as i64, a.1 as i64);
    let (x1, y1) = (b.0 as i64, b.1 as i64);
    let dx = (x1 - x).abs();
    let dy = -(y1 - y).abs();
    let sx = if x < x1 { 1 } else { -1 };
    let sy = if y < y1 { 1 } else { -1 };
    let mut err = dx + dy;
    let mut out = Vec::with_capacity((dx.max(-dy) + 1) as usize);
    loop {
        out.push((x as usize, y as usize));
        if x == x1 && y == y1 {
            return out;
        }
        let e2 = 2 * err;
        if e2 >= dy {
            err += dy;
            x += sx;
        }
        if e2 <= dx {
            err += dx;
            y += sy;
        }
    }
}
