//! The interactive window (feature `window`): a [`Viewer`] shown in an X11 window
//! (X.Org, Xvfb, XWayland) through `x11rb`, a pure-Rust client of the X protocol, so
//! nothing but a display is needed: no C library at build or run time.
//!
//! Controls: the left mouse button draws with the current tool (`1` absorber,
//! `2` reflector, `3` source), the right one erases; space pauses, `s` or → steps once,
//! `r` resets the field, `c` restores the scene, `b` switches backend, `+`/`-` (or the
//! wheel) change the steps per frame, `q` or Escape closes.
//!
//! ```no_run
//! use ringkernel_wavesim::scene::demo_scene;
//! use ringkernel_wavesim::window::{run_window, WindowOptions};
//! let report = run_window(demo_scene(256)?, &WindowOptions::default())?;
//! println!("{} steps", report.steps);
//! # Ok::<(), ringkernel_core::Error>(())
//! ```

use crate::viewer::{Input, Key, MouseButton, Tool, Viewer};
use crate::WaveGrid2D;
use ringkernel_core::{Error, Result};
use std::time::{Duration, Instant};
use x11rb::connection::{Connection, RequestConnection as _};
use x11rb::protocol::xproto::{
    AtomEnum, ConnectionExt as _, CreateGCAux, CreateWindowAux, EventMask, ImageFormat, ImageOrder,
    PropMode, VisualClass, WindowClass,
};
use x11rb::protocol::Event;
use x11rb::wrapper::ConnectionExt as _;

/// How [`run_window`] runs.
#[derive(Debug, Clone)]
pub struct WindowOptions {
    /// Pixels a cell (each side); 0 picks one that makes the window about 512 pixels
    /// wide.
    pub zoom: usize,
    /// Backends offered, in the order `b` cycles through them (see [`Viewer::new`]); the
    /// first available one runs first.
    pub backends: Vec<String>,
    /// Steps a frame at the start.
    pub steps_per_frame: u64,
    /// Stop stepping after this many steps, print a line saying so, keep the last frame
    /// on screen for [`linger`](Self::linger) and close (for scripts and tests).
    pub exit_after_steps: Option<u64>,
    /// See [`exit_after_steps`](Self::exit_after_steps).
    pub linger: Duration,
    /// The most frames a second.
    pub max_fps: u32,
    /// Start paused (space resumes, `s` steps).
    pub paused: bool,
    /// The X display (`:0`, `host:1.0`); `None`: the `DISPLAY` variable's.
    pub display: Option<String>,
}

impl Default for WindowOptions {
    fn default() -> Self {
        WindowOptions {
            zoom: 0,
            backends: ["cpu", "cuda", "wgpu", "metal"].map(String::from).to_vec(),
            steps_per_frame: 4,
            exit_after_steps: None,
            linger: Duration::ZERO,
            max_fps: 60,
            paused: false,
            display: None,
        }
    }
}

/// What a [`run_window`] session did.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowReport {
    /// Steps on the clock when the window closed.
    pub steps: u64,
    /// Frames drawn.
    pub frames: u64,
    /// The backend it ended on.
    pub backend: String,
}

fn x11(e: impl std::fmt::Display) -> Error {
    Error::Device(format!("X11: {e}"))
}

/// The zoom [`WindowOptions::zoom`] 0 stands for.
pub fn auto_zoom(nx: usize) -> usize {
    (512 / nx.max(1)).clamp(1, 8)
}

/// How the server wants a `0x00RRGGBB` pixel: shifts and widths of the channels in a
/// 32-bit pixel, and the byte order.
struct PixelFormat {
    shift: [u32; 3],
    bits: [u32; 3],
    lsb_first: bool,
}

impl PixelFormat {
    fn pack(&self, px: u32) -> [u8; 4] {
        let mut v = 0u32;
        for (i, c) in [(px >> 16) & 0xFF, (px >> 8) & 0xFF, px & 0xFF]
            .into_iter()
            .enumerate()
        {
            v |= (c >> (8 - self.bits[i])) << self.shift[i];
        }
        if self.lsb_first {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        }
    }
}

fn channel(mask: u32) -> Result<(u32, u32)> {
    let (shift, bits) = (mask.trailing_zeros(), mask.count_ones());
    if mask == 0 || bits > 8 || (mask >> shift) != (1 << bits) - 1 {
        return Err(Error::Device(format!(
            "X11: unsupported colour mask {mask:#x}"
        )));
    }
    Ok((shift, bits))
}

/// Opens a window on the X display (`DISPLAY`) and runs a [`Viewer`] of `grid` in it
/// until it is closed (`q`, Escape, the window manager's close button) or
/// [`WindowOptions::exit_after_steps`] says. A frame runs the viewer's steps, draws the
/// picture and sleeps what is left of `1 / max_fps`. Prints one line when the window is shown
/// (`wavesim window 0x…: W x H px, backend NAME`) and one when the step limit is
/// reached (`wavesim window: N steps done`).
///
/// Errors: [`Error::Device`] when there is no X display (with what to do instead) or the
/// server fails, or offers no 24/32-bit true-colour visual; the [`Viewer`]'s errors.
pub fn run_window(grid: WaveGrid2D, opts: &WindowOptions) -> Result<WindowReport> {
    let (conn, screen_num) = x11rb::connect(opts.display.as_deref()).map_err(|e| {
        Error::Device(format!(
            "cannot open the WaveSim window: no X display ({e}); set DISPLAY to an X \
             server (or Xvfb), or run `ringkernel wavesim --headless`"
        ))
    })?;
    let zoom = if opts.zoom == 0 {
        auto_zoom(grid.nx())
    } else {
        opts.zoom
    };
    let names: Vec<&str> = opts.backends.iter().map(String::as_str).collect();
    let mut viewer = Viewer::new(grid, &names, zoom)?;
    viewer.set_steps_per_frame(opts.steps_per_frame);
    viewer.set_paused(opts.paused);
    let (w, h) = (viewer.width(), viewer.height());
    if w > u16::MAX as usize || h > u16::MAX as usize {
        return Err(Error::invalid(format!(
            "a window of {w} x {h} pixels: lower the zoom"
        )));
    }

    let setup = conn.setup();
    let screen = &setup.roots[screen_num];
    let visual = screen
        .allowed_depths
        .iter()
        .flat_map(|d| d.visuals.iter())
        .find(|v| v.visual_id == screen.root_visual)
        .ok_or_else(|| x11("the root visual is not listed"))?;
    let bpp = setup
        .pixmap_formats
        .iter()
        .find(|f| f.depth == screen.root_depth)
        .map(|f| f.bits_per_pixel);
    if visual.class != VisualClass::TRUE_COLOR || bpp != Some(32) {
        return Err(Error::Device(format!(
            "X11: the screen is depth {} ({:?}, {:?} bits a pixel); the window needs \
             24/32-bit true colour",
            screen.root_depth, visual.class, bpp
        )));
    }
    let (rs, rb) = channel(visual.red_mask)?;
    let (gs, gb) = channel(visual.green_mask)?;
    let (bs, bb) = channel(visual.blue_mask)?;
    let format = PixelFormat {
        shift: [rs, gs, bs],
        bits: [rb, gb, bb],
        lsb_first: setup.image_byte_order == ImageOrder::LSB_FIRST,
    };

    let win = conn.generate_id().map_err(x11)?;
    let aux = CreateWindowAux::new()
        .background_pixel(screen.black_pixel)
        .event_mask(
            EventMask::EXPOSURE
                | EventMask::KEY_PRESS
                | EventMask::BUTTON_PRESS
                | EventMask::BUTTON_RELEASE
                | EventMask::BUTTON_MOTION
                | EventMask::STRUCTURE_NOTIFY,
        );
    conn.create_window(
        screen.root_depth,
        win,
        screen.root,
        0,
        0,
        w as u16,
        h as u16,
        0,
        WindowClass::INPUT_OUTPUT,
        screen.root_visual,
        &aux,
    )
    .map_err(x11)?;
    let title = b"RingKernel WaveSim";
    conn.change_property8(
        PropMode::REPLACE,
        win,
        AtomEnum::WM_NAME,
        AtomEnum::STRING,
        title,
    )
    .map_err(x11)?;
    let atom = |name: &[u8]| -> Result<u32> {
        Ok(conn
            .intern_atom(false, name)
            .map_err(x11)?
            .reply()
            .map_err(x11)?
            .atom)
    };
    let (protocols, delete) = (atom(b"WM_PROTOCOLS")?, atom(b"WM_DELETE_WINDOW")?);
    conn.change_property32(PropMode::REPLACE, win, protocols, AtomEnum::ATOM, &[delete])
        .map_err(x11)?;
    let gc = conn.generate_id().map_err(x11)?;
    conn.create_gc(gc, win, &CreateGCAux::new()).map_err(x11)?;
    conn.map_window(win).map_err(x11)?;
    conn.flush().map_err(x11)?;

    let (min_kc, max_kc) = (setup.min_keycode, setup.max_keycode);
    let km = conn
        .get_keyboard_mapping(min_kc, max_kc - min_kc + 1)
        .map_err(x11)?
        .reply()
        .map_err(x11)?;
    let per = km.keysyms_per_keycode.max(1) as usize;
    let keysym = |kc: u8| -> u32 {
        km.keysyms
            .get((kc.saturating_sub(min_kc)) as usize * per)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "wavesim window {win:#x}: {w} x {h} px, backend {}",
        viewer.backend()
    );

    let rows_per_put = ((conn.maximum_request_bytes() - 64) / (w * 4)).clamp(1, h);
    let mut frame = vec![0u32; w * h];
    let mut bytes = vec![0u8; w * h * 4];
    let frame_time = Duration::from_secs_f64(1.0 / opts.max_fps.max(1) as f64);
    let mut frames = 0u64;
    let mut done_at: Option<Instant> = None;
    let mut announced = false;
    let mut closed = false;
    while !closed && !viewer.quit_requested() {
        let t0 = Instant::now();
        while let Some(ev) = conn.poll_for_event().map_err(x11)? {
            let input = match ev {
                Event::KeyPress(k) => key_of(keysym(k.detail)).map(Input::Key),
                Event::ButtonPress(b) => match b.detail {
                    1..=3 => Some(Input::Press {
                        button: button_of(b.detail),
                        x: b.event_x as i32,
                        y: b.event_y as i32,
                    }),
                    4 => Some(Input::Key(Key::Faster)),
                    5 => Some(Input::Key(Key::Slower)),
                    _ => None,
                },
                Event::ButtonRelease(b) if (1..=3).contains(&b.detail) => Some(Input::Release {
                    button: button_of(b.detail),
                }),
                Event::MotionNotify(m) => Some(Input::Motion {
                    x: m.event_x as i32,
                    y: m.event_y as i32,
                }),
                Event::ClientMessage(c) if c.format == 32 && c.data.as_data32()[0] == delete => {
                    closed = true;
                    None
                }
                Event::DestroyNotify(_) => {
                    closed = true;
                    None
                }
                Event::Error(e) => return Err(x11(format!("{e:?}"))),
                _ => None,
            };
            if let Some(i) = input {
                viewer.handle(i)?;
            }
        }
        if let Some(limit) = opts.exit_after_steps {
            let left = limit.saturating_sub(viewer.steps());
            if left == 0 && done_at.is_none() {
                viewer.set_paused(true);
                done_at = Some(Instant::now());
            } else if left > 0 && left < viewer.steps_per_frame() && !viewer.paused() {
                viewer.set_steps_per_frame(left);
            }
        }
        viewer.advance()?;
        viewer.render(&mut frame);
        for (px, out) in frame.iter().zip(bytes.chunks_exact_mut(4)) {
            out.copy_from_slice(&format.pack(*px));
        }
        for y0 in (0..h).step_by(rows_per_put) {
            let rows = rows_per_put.min(h - y0);
            conn.put_image(
                ImageFormat::Z_PIXMAP,
                win,
                gc,
                w as u16,
                rows as u16,
                0,
                y0 as i16,
                0,
                screen.root_depth,
                &bytes[y0 * w * 4..(y0 + rows) * w * 4],
            )
            .map_err(x11)?;
        }
        conn.flush().map_err(x11)?;
        frames += 1;
        if let Some(at) = done_at {
            if !announced {
                // A round trip: the server has drawn the last frame before we say so.
                conn.get_input_focus().map_err(x11)?.reply().map_err(x11)?;
                println!("wavesim window: {} steps done", viewer.steps());
                use std::io::Write as _;
                std::io::stdout().flush().ok();
                announced = true;
            }
            if at.elapsed() >= opts.linger {
                break;
            }
        }
        if let Some(rest) = frame_time.checked_sub(t0.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(WindowReport {
        steps: viewer.steps(),
        frames,
        backend: viewer.backend().to_string(),
    })
}

fn button_of(detail: u8) -> MouseButton {
    match detail {
        1 => MouseButton::Left,
        3 => MouseButton::Right,
        _ => MouseButton::Middle,
    }
}

/// The command of an X keysym (see the [module docs](self)).
fn key_of(keysym: u32) -> Option<Key> {
    Some(match keysym {
        0x20 | 0x70 => Key::Pause,         // space, p
        0x73 | 0xff53 => Key::Step,        // s, Right
        0x72 => Key::Reset,                // r
        0x63 => Key::Clear,                // c
        0x62 => Key::Backend,              // b
        0x31 => Key::Tool(Tool::Absorber), // 1
        0x32 => Key::Tool(Tool::Reflector),
        0x33 => Key::Tool(Tool::Source),
        0x2b | 0x3d | 0xffab | 0xff52 => Key::Faster, // + = KP_Add Up
        0x2d | 0xffad | 0xff54 => Key::Slower,        // - KP_Subtract Down
        0x71 | 0xff1b => Key::Quit,                   // q, Escape
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixels_are_packed_for_the_server() {
        let f = PixelFormat {
            shift: [16, 8, 0],
            bits: [8, 8, 8],
            lsb_first: true,
        };
        assert_eq!(f.pack(0x0011_2233), [0x33, 0x22, 0x11, 0]);
        let f = PixelFormat {
            shift: [0, 8, 16],
            bits: [8, 8, 8],
            lsb_first: false,
        };
        assert_eq!(f.pack(0x0011_2233), [0, 0x33, 0x22, 0x11]);
        assert_eq!(channel(0xFF00).unwrap(), (8, 8));
        assert!(channel(0).is_err());
        assert!(channel(0xF0F).is_err());
    }

    #[test]
    fn keys_map_to_commands() {
        assert_eq!(key_of(0x20), Some(Key::Pause));
        assert_eq!(key_of(0x32), Some(Key::Tool(Tool::Reflector)));
        assert_eq!(key_of(0xff1b), Some(Key::Quit));
        assert_eq!(key_of(0x61), None);
        assert_eq!(auto_zoom(128), 4);
        assert_eq!(auto_zoom(4096), 1);
    }

    #[test]
    fn no_display_is_a_clear_error() {
        // An X display that does not exist: no server has display 999's socket (and
        // `unix/` keeps the client off TCP).
        let opts = WindowOptions {
            display: Some("unix/:999".into()),
            ..WindowOptions::default()
        };
        let g = crate::scene::demo_scene(32).unwrap();
        let e = run_window(g, &opts).unwrap_err();
        assert!(e.to_string().contains("no X display"), "{e}");
    }
}
