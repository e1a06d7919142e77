//! The interactive session behind `ringkernel wavesim`'s window, free of any window
//! system: it takes input events ([`Input`]), advances the simulation on the chosen
//! backend ([`Viewer::advance`]) and draws the field and a status bar into a
//! `0x00RRGGBB` frame buffer ([`Viewer::render`]). The X11 window (feature `window`)
//! is thin glue around it; tests drive it directly.
//!
//! ```
//! use ringkernel_wavesim::scene::demo_scene;
//! use ringkernel_wavesim::viewer::{Input, Key, MouseButton, Tool, Viewer};
//! let mut v = Viewer::new(demo_scene(64)?, &["cpu"], 4)?;
//! v.handle(Input::Key(Key::Tool(Tool::Reflector)))?;
//! let (x, y) = v.cell_to_pixel(10, 10); // draw a wall cell with the mouse
//! v.handle(Input::Press { button: MouseButton::Left, x, y })?;
//! v.handle(Input::Release { button: MouseButton::Left })?;
//! v.advance()?; // one frame's steps
//! let mut frame = vec![0u32; v.width() * v.height()];
//! v.render(&mut frame);
//! assert_eq!(frame[y as usize * v.width() + x as usize], 0x00EB_EBEB); // the wall's colour
//! # Ok::<(), ringkernel_core::Error>(())
//! ```

use crate::font::{draw_text, GLYPH_H};
use crate::image::cell_rgb;
use crate::source::line_cells;
use crate::{DeviceWave2D, Material, Signal, Source, WaveGrid2D};
use ringkernel::compute::Device;
use ringkernel_core::{Error, Result};
use std::time::{Duration, Instant};

/// Height of the status bar above the field, in pixels.
pub const STATUS_H: usize = 62;
/// The status bar's background colour.
const BAR: u32 = 0x0008_090E;
const TEXT: u32 = 0x00DD_DDDD;
const DIM: u32 = 0x0090_96A8;
const HOT: u32 = 0x00FF_C430;
/// The most steps a frame may run (`+` doubles the count up to it).
pub const MAX_STEPS_PER_FRAME: u64 = 1 << 16;

/// What the left mouse button draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// Damping cells that swallow waves.
    Absorber,
    /// Rigid walls that reflect them.
    Reflector,
    /// A continuous sine source at the clicked cell.
    Source,
}

impl Tool {
    fn label(self) -> &'static str {
        match self {
            Tool::Absorber => "ABSORBER",
            Tool::Reflector => "REFLECTOR",
            Tool::Source => "SOURCE",
        }
    }
}

/// A mouse button.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MouseButton {
    /// Draws with the current [`Tool`].
    Left,
    /// Erases: back to the plain medium, sources under the brush removed.
    Right,
    /// Unused.
    Middle,
}

/// A command key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Pause or resume (space).
    Pause,
    /// One step, pausing first (`s`, right arrow).
    Step,
    /// The field back to rest, materials and sources kept (`r`).
    Reset,
    /// The whole scene as it started: field, materials, sources (`c`).
    Clear,
    /// The next available backend (`b`).
    Backend,
    /// Pick the drawing tool (`1`, `2`, `3`).
    Tool(Tool),
    /// Twice the steps per frame (`+`, `=`, up arrow).
    Faster,
    /// Half the steps per frame (`-`, down arrow).
    Slower,
    /// Close the window (`q`, Escape).
    Quit,
}

/// An input event, positions in window pixels (the status bar on top, then the field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A button went down at `(x, y)`.
    Press {
        /// Which.
        button: MouseButton,
        /// Pixel column.
        x: i32,
        /// Pixel row.
        y: i32,
    },
    /// A button went up.
    Release {
        /// Which.
        button: MouseButton,
    },
    /// The pointer moved to `(x, y)`.
    Motion {
        /// Pixel column.
        x: i32,
        /// Pixel row.
        y: i32,
    },
    /// A command key.
    Key(Key),
}

/// A backend the viewer can run on.
struct Engine {
    name: String,
    /// `None`: the CPU engine ([`WaveGrid2D`] itself).
    device: Option<Device>,
}

/// Steps counted over a sliding second of wall time.
#[derive(Debug)]
struct Rate {
    start: Instant,
    steps: u64,
    busy: Duration,
    shown: f64,
    shown_engine: f64,
}

impl Rate {
    fn new() -> Rate {
        Rate {
            start: Instant::now(),
            steps: 0,
            busy: Duration::ZERO,
            shown: 0.0,
            shown_engine: 0.0,
        }
    }

    fn add(&mut self, steps: u64, busy: Duration) {
        self.steps += steps;
        self.busy += busy;
        let el = self.start.elapsed();
        if el >= Duration::from_millis(500) {
            self.shown = self.steps as f64 / el.as_secs_f64();
            // The engine's pace is the last one measured while it ran.
            if !self.busy.is_zero() {
                self.shown_engine = self.steps as f64 / self.busy.as_secs_f64();
            }
            self.start = Instant::now();
            self.steps = 0;
            self.busy = Duration::ZERO;
        }
    }
}

/// The interactive session (see the [module docs](self)).
pub struct Viewer {
    /// Materials and sources always; the field too after every [`advance`](Self::advance).
    grid: WaveGrid2D,
    initial: WaveGrid2D,
    engines: Vec<Engine>,
    current: usize,
    device: Option<DeviceWave2D>,
    /// The grid changed (an edit, a reset) since the device got it.
    stale: bool,
    zoom: usize,
    paused: bool,
    pending: u64,
    tool: Tool,
    drag: Option<(MouseButton, (usize, usize))>,
    steps_per_frame: u64,
    scale: f32,
    /// The step count the colour scale was last updated at.
    scaled_at: Option<u64>,
    rate: Rate,
    message: Option<(String, Instant)>,
    quit: bool,
}

impl std::fmt::Debug for Viewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Viewer")
            .field("backend", &self.backend())
            .field("steps", &self.steps())
            .field("paused", &self.paused)
            .field("tool", &self.tool)
            .finish()
    }
}

impl Viewer {
    /// A session on `grid` (kept as the scene [`Key::Clear`] goes back to), each cell
    /// drawn as a `zoom × zoom` square. `backends` are the names to offer, in the order
    /// [`Key::Backend`] cycles through them: `cpu` (the CPU engine), any name
    /// [`Device::from_name`] knows, and `cpu-device` (the codegen stencil run by the
    /// CPU device: slow, for tests); the first one that works is where it starts, and
    /// names that are not compiled in or find no device are left out.
    ///
    /// Errors: [`Error::InvalidArgument`] for a zoom of 0 or above 64, or when none of
    /// `backends` is available (with each one's reason).
    pub fn new(grid: WaveGrid2D, backends: &[&str], zoom: usize) -> Result<Viewer> {
        if !(1..=64).contains(&zoom) {
            return Err(Error::invalid(format!("zoom {zoom}: must be 1..=64")));
        }
        let mut engines = Vec::new();
        let mut why = Vec::new();
        for &name in backends {
            if name == "cpu" {
                engines.push(Engine {
                    name: "cpu".into(),
                    device: None,
                });
                continue;
            }
            let dev = if name == "cpu-device" {
                Ok(Device::cpu())
            } else {
                Device::from_name(name)
            };
            match dev {
                Ok(d) => engines.push(Engine {
                    name: name.to_string(),
                    device: Some(d),
                }),
                Err(e) => why.push(format!("{name}: {e}")),
            }
        }
        if engines.is_empty() {
            return Err(Error::invalid(format!(
                "no backend available for the viewer ({})",
                why.join("; ")
            )));
        }
        let mut v = Viewer {
            initial: grid.clone(),
            grid,
            engines,
            current: 0,
            device: None,
            stale: false,
            zoom,
            paused: false,
            pending: 0,
            tool: Tool::Absorber,
            drag: None,
            steps_per_frame: 4,
            scale: 0.0,
            scaled_at: None,
            rate: Rate::new(),
            message: None,
            quit: false,
        };
        v.switch_to(0)?;
        Ok(v)
    }

    /// Frame width in pixels.
    pub fn width(&self) -> usize {
        self.grid.nx() * self.zoom
    }

    /// Frame height in pixels (status bar and field).
    pub fn height(&self) -> usize {
        STATUS_H + self.grid.ny() * self.zoom
    }

    /// The grid (its field is the one of the last [`advance`](Self::advance)).
    pub fn grid(&self) -> &WaveGrid2D {
        &self.grid
    }

    /// Steps taken since the start or the last reset.
    pub fn steps(&self) -> u64 {
        self.grid.steps()
    }

    /// The backend running the simulation.
    pub fn backend(&self) -> &str {
        &self.engines[self.current].name
    }

    /// The backends offered, in [`Key::Backend`] order.
    pub fn backends(&self) -> Vec<&str> {
        self.engines.iter().map(|e| e.name.as_str()).collect()
    }

    /// Whether the simulation is paused.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Pauses or resumes.
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    /// The drawing tool.
    pub fn tool(&self) -> Tool {
        self.tool
    }

    /// Steps run by each [`advance`](Self::advance) while not paused.
    pub fn steps_per_frame(&self) -> u64 {
        self.steps_per_frame
    }

    /// Sets the steps per frame (clamped to `1..=`[`MAX_STEPS_PER_FRAME`]).
    pub fn set_steps_per_frame(&mut self, n: u64) {
        self.steps_per_frame = n.clamp(1, MAX_STEPS_PER_FRAME);
    }

    /// Whether [`Key::Quit`] was pressed.
    pub fn quit_requested(&self) -> bool {
        self.quit
    }

    /// The centre pixel of cell `(x, y)` in the frame.
    pub fn cell_to_pixel(&self, x: usize, y: usize) -> (i32, i32) {
        let z = self.zoom;
        ((x * z + z / 2) as i32, (STATUS_H + y * z + z / 2) as i32)
    }

    /// The cell under pixel `(x, y)`, `None` over the status bar or outside.
    pub fn pixel_to_cell(&self, x: i32, y: i32) -> Option<(usize, usize)> {
        if x < 0 || y < STATUS_H as i32 {
            return None;
        }
        let (cx, cy) = (x as usize / self.zoom, (y as usize - STATUS_H) / self.zoom);
        (cx < self.grid.nx() && cy < self.grid.ny()).then_some((cx, cy))
    }

    fn say(&mut self, msg: impl Into<String>) {
        self.message = Some((msg.into(), Instant::now()));
    }

    /// Runs on engine `i`: the state moves over from the grid.
    fn switch_to(&mut self, i: usize) -> Result<()> {
        self.device = match &self.engines[i].device {
            None => None,
            Some(dev) => Some(DeviceWave2D::from_grid(dev, &self.grid)?),
        };
        self.current = i;
        self.stale = false;
        self.rate = Rate::new();
        Ok(())
    }

    /// Applies one input event. Errors come from a backend (a device that fails while
    /// the state moves to or from it).
    pub fn handle(&mut self, input: Input) -> Result<()> {
        match input {
            Input::Key(k) => self.key(k)?,
            Input::Press { button, x, y } => {
                if let Some(cell) = self.pixel_to_cell(x, y) {
                    self.drag = Some((button, cell));
                    self.paint(button, cell, cell, true)?;
                }
            }
            Input::Motion { x, y } => {
                if let (Some((button, last)), Some(cell)) = (self.drag, self.pixel_to_cell(x, y)) {
                    self.paint(button, last, cell, false)?;
                    self.drag = Some((button, cell));
                }
            }
            Input::Release { .. } => self.drag = None,
        }
        Ok(())
    }

    fn key(&mut self, k: Key) -> Result<()> {
        match k {
            Key::Pause => self.paused = !self.paused,
            Key::Step => {
                self.paused = true;
                self.pending += 1;
            }
            Key::Reset => {
                self.grid.reset();
                self.scale = 0.0;
                self.scaled_at = None;
                self.stale = true;
            }
            Key::Clear => {
                self.grid = self.initial.clone();
                self.scale = 0.0;
                self.scaled_at = None;
                self.stale = true;
            }
            Key::Backend => {
                let mut next = (self.current + 1) % self.engines.len();
                while next != self.current {
                    match self.switch_to(next) {
                        Ok(()) => {
                            let name = self.backend().to_uppercase();
                            self.say(format!("NOW ON {name}"));
                            return Ok(());
                        }
                        Err(e) => {
                            let name = self.engines[next].name.to_uppercase();
                            self.say(format!("{name} FAILED: {e}"));
                            next = (next + 1) % self.engines.len();
                        }
                    }
                }
                self.switch_to(self.current)?;
            }
            Key::Tool(t) => self.tool = t,
            Key::Faster => self.set_steps_per_frame(self.steps_per_frame * 2),
            Key::Slower => self.set_steps_per_frame(self.steps_per_frame / 2),
            Key::Quit => self.quit = true,
        }
        Ok(())
    }

    /// The brush radius in cells.
    fn brush(&self) -> usize {
        (self.grid.nx().min(self.grid.ny()) / 96).max(1)
    }

    /// Paints the stroke from cell `from` to `to` with `button`'s action (`press`: the
    /// stroke starts here, where a source is placed).
    fn paint(
        &mut self,
        button: MouseButton,
        from: (usize, usize),
        to: (usize, usize),
        press: bool,
    ) -> Result<()> {
        let p = self.grid.params();
        let material = match (button, self.tool) {
            (MouseButton::Left, Tool::Absorber) => Material::Absorber(0.4 / p.dt),
            (MouseButton::Left, Tool::Reflector) => Material::Reflector,
            (MouseButton::Left, Tool::Source) => {
                if press {
                    // A wavelength of 12 cells at the default speed.
                    let freq = p.speed / (12.0 * p.dx);
                    self.grid
                        .add_source(Source::point(to.0, to.1, Signal::Sine { freq }, 0.5))?;
                    self.stale = true;
                }
                return Ok(());
            }
            (MouseButton::Right, _) => Material::Medium,
            (MouseButton::Middle, _) => return Ok(()),
        };
        let r = self.brush() as i64;
        let (nx, ny) = (self.grid.nx() as i64, self.grid.ny() as i64);
        for (cx, cy) in line_cells(from, to) {
            for dy in -r + 1..r {
                for dx in -r + 1..r {
                    let (x, y) = (cx as i64 + dx, cy as i64 + dy);
                    if (0..nx).contains(&x) && (0..ny).contains(&y) {
                        self.grid.set_material(x as usize, y as usize, material)?;
                    }
                }
            }
            if button == MouseButton::Right {
                let r = r as usize;
                self.grid.retain_sources(|s| {
                    !s.cells()
                        .iter()
                        .any(|&(x, y)| x.abs_diff(cx) < r + 1 && y.abs_diff(cy) < r + 1)
                });
            }
        }
        self.stale = true;
        Ok(())
    }

    /// One frame's worth of simulation: [`steps_per_frame`](Self::steps_per_frame)
    /// steps (or the pending single steps while paused) on the current backend, then the
    /// field back in [`grid`](Self::grid). Returns the steps run.
    pub fn advance(&mut self) -> Result<u64> {
        let n = if self.paused {
            std::mem::take(&mut self.pending)
        } else {
            self.steps_per_frame
        };
        if let (Some(dev), true) = (&self.engines[self.current].device, self.stale) {
            self.device = Some(DeviceWave2D::from_grid(dev, &self.grid)?);
        }
        self.stale = false;
        let t0 = Instant::now();
        match &mut self.device {
            None => self.grid.run(n),
            Some(d) => {
                if n > 0 {
                    d.run(n)?;
                    d.store_into(&mut self.grid)?;
                }
            }
        }
        if n > 0 {
            self.rate.add(n, t0.elapsed());
        } else {
            self.rate.add(0, Duration::ZERO);
        }
        Ok(n)
    }

    /// Draws the status bar and the field into `frame` (`width() × height()` pixels,
    /// `0x00RRGGBB`).
    ///
    /// # Panics
    /// When `frame` is not `width() * height()` long (a caller's bug).
    pub fn render(&mut self, frame: &mut [u32]) {
        let (w, z) = (self.width(), self.zoom);
        assert_eq!(frame.len(), w * self.height(), "frame of the wrong size");
        // Colour scale: half the peak, falling slowly (step by step, so a paused picture
        // stays still) so that a fading wave stays visible.
        if self.scaled_at != Some(self.grid.steps()) {
            let target = 0.5 * self.grid.max_abs();
            self.scale = if target >= self.scale {
                target
            } else {
                (self.scale * 0.97).max(target)
            };
            self.scaled_at = Some(self.grid.steps());
        }
        let inv = if self.scale > 1e-12 {
            1.0 / self.scale
        } else {
            0.0
        };
        let (nx, ny, s) = (self.grid.nx(), self.grid.ny(), self.grid.stride());
        let u = self.grid.padded();
        let (_, a, _) = self.grid.coefficients();
        for y in 0..ny {
            let row0 = (STATUS_H + y * z) * w;
            for x in 0..nx {
                let k = (y + 1) * s + x + 1;
                let [r, g, b] = cell_rgb(u[k], a[k], inv);
                let px = (r as u32) << 16 | (g as u32) << 8 | b as u32;
                frame[row0 + x * z..row0 + (x + 1) * z].fill(px);
            }
            for dy in 1..z {
                frame.copy_within(row0..row0 + w, row0 + dy * w);
            }
        }
        self.draw_status(frame);
    }

    fn draw_status(&mut self, frame: &mut [u32]) {
        let w = self.width();
        frame[..STATUS_H * w].fill(BAR);
        let line = |i: usize| 4 + i * (GLYPH_H + 3);
        let mut x = draw_text(
            frame,
            w,
            4,
            4,
            &format!(
                "{} {:.0} STEPS/S",
                self.backend().to_uppercase(),
                self.rate.shown
            ),
            2,
            TEXT,
        );
        if self.paused {
            x = draw_text(frame, w, x + 12, 4, "PAUSED", 2, HOT);
        }
        let _ = x;
        let second = format!(
            "STEP {}  {}/FRAME  ENGINE {:.0} STEPS/S  TOOL {}",
            self.grid.steps(),
            self.steps_per_frame,
            self.rate.shown_engine,
            self.tool.label()
        );
        draw_text(frame, w, 4, line(2) + 2, &second, 1, TEXT);
        match &self.message {
            Some((m, at)) if at.elapsed() < Duration::from_secs(4) => {
                draw_text(frame, w, 4, line(3) + 2, m, 1, HOT);
            }
            _ => {
                draw_text(
                    frame,
                    w,
                    4,
                    line(3) + 2,
                    "1 ABSORBER 2 REFLECTOR 3 SOURCE  LEFT DRAW  RIGHT ERASE",
                    1,
                    DIM,
                );
            }
        }
        draw_text(
            frame,
            w,
            4,
            line(4) + 2,
            "SPACE PAUSE S STEP R RESET C CLEAR B BACKEND +/- SPEED Q QUIT",
            1,
            DIM,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{BACKGROUND, REFLECTOR};
    use crate::WaveParams;

    fn rgb(p: u32) -> [u8; 3] {
        [(p >> 16) as u8, (p >> 8) as u8, p as u8]
    }

    fn viewer(backends: &[&str]) -> Viewer {
        let mut g = WaveGrid2D::new(48, 40, WaveParams::default()).unwrap();
        g.add_source(Source::point(
            12,
            20,
            Signal::Ricker {
                freq: 0.1,
                delay: 15.0,
            },
            1.0,
        ))
        .unwrap();
        Viewer::new(g, backends, 3).unwrap()
    }

    #[test]
    fn keys_pause_step_reset_and_change_speed() {
        let mut v = viewer(&["cpu"]);
        assert_eq!(v.advance().unwrap(), 4);
        v.handle(Input::Key(Key::Pause)).unwrap();
        assert!(v.paused());
        assert_eq!(v.advance().unwrap(), 0);
        assert_eq!(v.steps(), 4);
        v.handle(Input::Key(Key::Step)).unwrap();
        v.handle(Input::Key(Key::Step)).unwrap();
        assert_eq!(v.advance().unwrap(), 2);
        assert_eq!(v.advance().unwrap(), 0);
        v.handle(Input::Key(Key::Pause)).unwrap();
        v.handle(Input::Key(Key::Faster)).unwrap();
        assert_eq!(v.advance().unwrap(), 8);
        for _ in 0..30 {
            v.handle(Input::Key(Key::Faster)).unwrap();
        }
        assert_eq!(v.steps_per_frame(), MAX_STEPS_PER_FRAME);
        for _ in 0..30 {
            v.handle(Input::Key(Key::Slower)).unwrap();
        }
        assert_eq!(v.steps_per_frame(), 1);
        v.set_steps_per_frame(40);
        v.advance().unwrap();
        assert!(v.grid().max_abs() > 0.0);
        v.handle(Input::Key(Key::Reset)).unwrap();
        assert_eq!((v.steps(), v.grid().max_abs()), (0, 0.0));
        assert!(!v.quit_requested());
        v.handle(Input::Key(Key::Quit)).unwrap();
        assert!(v.quit_requested());
    }

    #[test]
    fn the_mouse_draws_walls_and_absorbers_and_erases_them() {
        let mut v = viewer(&["cpu"]);
        v.handle(Input::Key(Key::Tool(Tool::Reflector))).unwrap();
        let (x0, y0) = v.cell_to_pixel(30, 5);
        let (x1, y1) = v.cell_to_pixel(30, 30);
        v.handle(Input::Press {
            button: MouseButton::Left,
            x: x0,
            y: y0,
        })
        .unwrap();
        // One motion event across 25 cells: the stroke has no gaps.
        v.handle(Input::Motion { x: x1, y: y1 }).unwrap();
        v.handle(Input::Release {
            button: MouseButton::Left,
        })
        .unwrap();
        for y in 5..=30 {
            assert_eq!(v.grid().material(30, y), Some(Material::Reflector), "{y}");
        }
        // Motion without a button held draws nothing.
        v.handle(Input::Motion { x: 0, y: y0 }).unwrap();
        assert_eq!(v.grid().material(0, 5), Some(Material::Medium));
        v.handle(Input::Key(Key::Tool(Tool::Absorber))).unwrap();
        let (x, y) = v.cell_to_pixel(5, 35);
        v.handle(Input::Press {
            button: MouseButton::Left,
            x,
            y,
        })
        .unwrap();
        assert!(matches!(
            v.grid().material(5, 35),
            Some(Material::Absorber(_))
        ));
        // Pixels over the status bar are no cell.
        assert_eq!(v.pixel_to_cell(10, 3), None);
        v.handle(Input::Press {
            button: MouseButton::Right,
            x: x0,
            y: y0,
        })
        .unwrap();
        assert_eq!(v.grid().material(30, 5), Some(Material::Medium));
        // The picture shows the wall and the background.
        v.advance().unwrap();
        let mut f = vec![0u32; v.width() * v.height()];
        v.render(&mut f);
        let (px, py) = v.cell_to_pixel(30, 20);
        assert_eq!(rgb(f[py as usize * v.width() + px as usize]), REFLECTOR);
        let (px, py) = v.cell_to_pixel(44, 2);
        assert_eq!(rgb(f[py as usize * v.width() + px as usize]), BACKGROUND);
        // The status bar has text on it.
        assert!(f[..STATUS_H * v.width()].contains(&TEXT));
    }

    #[test]
    fn sources_are_placed_and_erased() {
        let mut v = viewer(&["cpu"]);
        v.handle(Input::Key(Key::Tool(Tool::Source))).unwrap();
        let (x, y) = v.cell_to_pixel(40, 10);
        v.handle(Input::Press {
            button: MouseButton::Left,
            x,
            y,
        })
        .unwrap();
        assert_eq!(v.grid().sources().len(), 2);
        v.set_steps_per_frame(30);
        v.advance().unwrap();
        assert!(v.grid().value(40, 10) != 0.0);
        v.handle(Input::Press {
            button: MouseButton::Right,
            x,
            y,
        })
        .unwrap();
        assert_eq!(v.grid().sources().len(), 1);
        v.handle(Input::Key(Key::Clear)).unwrap();
        assert_eq!(v.grid().sources().len(), 1);
        assert_eq!(v.steps(), 0);
    }

    #[test]
    fn backends_switch_and_carry_the_state() {
        // The CPU device runs the codegen stencil: a second backend on any machine.
        let mut v = viewer(&["cpu", "cpu-device", "no-such-backend"]);
        assert_eq!(v.backends(), ["cpu", "cpu-device"]);
        let mut reference = v.grid().clone();
        v.set_steps_per_frame(50);
        v.advance().unwrap();
        v.handle(Input::Key(Key::Backend)).unwrap();
        assert_eq!(v.backend(), "cpu-device");
        v.advance().unwrap();
        // An edit while on the device reaches it.
        v.handle(Input::Key(Key::Tool(Tool::Reflector))).unwrap();
        let (x, y) = v.cell_to_pixel(30, 20);
        v.handle(Input::Press {
            button: MouseButton::Left,
            x,
            y,
        })
        .unwrap();
        v.advance().unwrap();
        v.handle(Input::Key(Key::Backend)).unwrap();
        assert_eq!(v.backend(), "cpu");
        v.advance().unwrap();
        reference.run(100);
        reference.set_reflector(30, 20).unwrap();
        reference.run(100);
        assert_eq!(v.steps(), 200);
        let err = v
            .grid()
            .field()
            .iter()
            .zip(reference.field())
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err < 1e-5, "{err}");
        assert!(Viewer::new(reference.clone(), &["nothing"], 2).is_err());
        assert!(Viewer::new(reference, &["cpu"], 0).is_err());
    }
}
