//! `ringkernel wavesim`'s window on a real X server: each test starts its own Xvfb,
//! runs the binary in it, reads the picture back from the server (GetImage of the root
//! window: what a screen would show) and drives the program with synthetic input (the
//! XTEST extension: the same events a mouse and keyboard make).
//!
//! The Xvfb tests are ignored by default (they need the `Xvfb` program);
//! `scripts/test.sh` installs it and runs them with `--ignored`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    ConnectionExt as _, ImageFormat, InputFocus, Window, BUTTON_PRESS_EVENT, BUTTON_RELEASE_EVENT,
    KEY_PRESS_EVENT, KEY_RELEASE_EVENT, MOTION_NOTIFY_EVENT,
};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;

const BIN: &str = env!("CARGO_BIN_EXE_ringkernel");
// The colour map (ringkernel_wavesim::image) and the viewer's status bar height.
const BACKGROUND: [u8; 3] = [16, 18, 28];
const REFLECTOR: [u8; 3] = [235, 235, 235];
const STATUS_H: i32 = 62;

/// An Xvfb server on a free display, stopped on drop.
struct Xvfb {
    child: Child,
    display: String,
}

impl Xvfb {
    fn start() -> Xvfb {
        // -displayfd: Xvfb picks a free display number and writes it to stdout.
        let mut child = Command::new("Xvfb")
            .args([
                "-displayfd",
                "1",
                "-screen",
                "0",
                "800x720x24",
                "-nolisten",
                "tcp",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot run Xvfb: install it (apt-get install xvfb); scripts/test.sh does");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let n: u32 = line.trim().parse().expect("Xvfb printed no display number");
        Xvfb {
            child,
            display: format!(":{n}"),
        }
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// The program under test, its stdout lines arriving on a channel.
struct App {
    child: Child,
    lines: Receiver<String>,
}

impl App {
    fn start(display: &str, args: &[&str]) -> App {
        let mut child = Command::new(BIN)
            .arg("wavesim")
            .args(args)
            .env("DISPLAY", display)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        App { child, lines }
    }

    /// The first stdout line that starts with `prefix`, within `secs` seconds.
    fn line(&self, prefix: &str, secs: u64) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => {}
                Err(e) => panic!("no line `{prefix}...` within {secs} s ({e})"),
            }
        }
    }

    /// Waits for the program to end; its exit status.
    fn wait(&mut self, secs: u64) -> std::process::ExitStatus {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < end,
                "the program did not end within {secs} s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// A client of the test's own: screenshots and synthetic input.
struct Screen {
    conn: RustConnection,
    root: Window,
    win: Window,
    /// The window's top-left corner on the root window.
    origin: (i32, i32),
    size: (i32, i32),
    /// Bit shift of red, green, blue in a pixel of the root visual.
    shifts: [u32; 3],
}

impl Screen {
    /// Attaches to the window the program announced (`wavesim window 0x…: W x H px, …`).
    fn attach(display: &str, open_line: &str) -> Screen {
        let (conn, n) = x11rb::connect(Some(display)).unwrap();
        let words: Vec<&str> = open_line.split_whitespace().collect();
        let win = u32::from_str_radix(words[2].trim_end_matches(':').trim_start_matches("0x"), 16)
            .unwrap();
        let size = (words[3].parse().unwrap(), words[5].parse().unwrap());
        let screen = &conn.setup().roots[n];
        let root = screen.root;
        let visual = screen
            .allowed_depths
            .iter()
            .flat_map(|d| d.visuals.iter())
            .find(|v| v.visual_id == screen.root_visual)
            .unwrap();
        let shifts = [
            visual.red_mask.trailing_zeros(),
            visual.green_mask.trailing_zeros(),
            visual.blue_mask.trailing_zeros(),
        ];
        let t = conn
            .translate_coordinates(win, root, 0, 0)
            .unwrap()
            .reply()
            .unwrap();
        Screen {
            conn,
            root,
            win,
            origin: (t.dst_x as i32, t.dst_y as i32),
            size,
            shifts,
        }
    }

    /// What the screen shows over the window: RGB rows of `size.0` pixels.
    fn shot(&self) -> Vec<[u8; 3]> {
        let (w, h) = self.size;
        let img = self
            .conn
            .get_image(
                ImageFormat::Z_PIXMAP,
                self.root,
                self.origin.0 as i16,
                self.origin.1 as i16,
                w as u16,
                h as u16,
                !0,
            )
            .unwrap()
            .reply()
            .unwrap();
        assert_eq!(
            img.data.len(),
            (w * h * 4) as usize,
            "expected 32 bits a pixel"
        );
        let lsb =
            self.conn.setup().image_byte_order == x11rb::protocol::xproto::ImageOrder::LSB_FIRST;
        img.data
            .chunks_exact(4)
            .map(|b| {
                let b: [u8; 4] = b.try_into().unwrap();
                let v = if lsb {
                    u32::from_le_bytes(b)
                } else {
                    u32::from_be_bytes(b)
                };
                self.shifts.map(|s| (v >> s) as u8)
            })
            .collect()
    }

    fn sync(&self) {
        self.conn.get_input_focus().unwrap().reply().unwrap();
    }

    fn fake(&self, kind: u8, detail: u8, x: i32, y: i32) {
        self.conn
            .xtest_fake_input(kind, detail, 0, self.root, x as i16, y as i16, 0)
            .unwrap();
        self.sync();
        std::thread::sleep(Duration::from_millis(15));
    }

    /// Moves the pointer to window pixel `(x, y)`.
    fn move_to(&self, (x, y): (i32, i32)) {
        self.fake(MOTION_NOTIFY_EVENT, 0, self.origin.0 + x, self.origin.1 + y);
    }

    /// A drag with the left button through the window pixels `points`.
    fn drag(&self, points: &[(i32, i32)]) {
        self.move_to(points[0]);
        self.fake(BUTTON_PRESS_EVENT, 1, 0, 0);
        for &p in &points[1..] {
            self.move_to(p);
        }
        self.fake(BUTTON_RELEASE_EVENT, 1, 0, 0);
    }

    /// Presses and releases the key of `keysym` (the window has the focus).
    fn key(&self, keysym: u32) {
        let s = self.conn.setup();
        let (min, max) = (s.min_keycode, s.max_keycode);
        let km = self
            .conn
            .get_keyboard_mapping(min, max - min + 1)
            .unwrap()
            .reply()
            .unwrap();
        let per = km.keysyms_per_keycode as usize;
        let i = km
            .keysyms
            .chunks(per)
            .position(|syms| syms[0] == keysym)
            .unwrap_or_else(|| panic!("no key for keysym {keysym:#x}"));
        let code = min + i as u8;
        self.fake(KEY_PRESS_EVENT, code, 0, 0);
        self.fake(KEY_RELEASE_EVENT, code, 0, 0);
    }

    fn focus(&self) {
        self.move_to((self.size.0 / 2, self.size.1 / 2));
        self.conn
            .set_input_focus(InputFocus::POINTER_ROOT, self.win, 0u32)
            .unwrap();
        self.sync();
    }
}

/// Saves `img` as a PNG into `$WAVESIM_SHOTS` (when set), to look at.
fn keep(img: &[[u8; 3]], size: (i32, i32), name: &str) {
    if let Some(dir) = std::env::var_os("WAVESIM_SHOTS") {
        let rgb: Vec<u8> = img.iter().flatten().copied().collect();
        let png =
            ringkernel_wavesim::image::encode_png(size.0 as u32, size.1 as u32, &rgb).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(name), png).unwrap();
    }
}

/// The pixel of the field cell `(x, y)` (its centre) in a screenshot.
fn cell(img: &[[u8; 3]], width: i32, zoom: i32, (x, y): (i32, i32)) -> [u8; 3] {
    img[((STATUS_H + y * zoom + zoom / 2) * width + x * zoom + zoom / 2) as usize]
}

/// Wave colours: towards the colour map's positive (orange) or negative (blue) end. The
/// background (and an absorber's green tint of it) has blue 12 above red.
fn positive(p: [u8; 3]) -> bool {
    p[0] as i32 > p[2] as i32 + 40
}
fn negative(p: [u8; 3]) -> bool {
    p[2] as i32 > p[0] as i32 + 30 && p != REFLECTOR
}

fn cells_within(c: (i32, i32), r0: i32, r1: i32) -> impl Iterator<Item = (i32, i32)> {
    (c.1 - r1..=c.1 + r1)
        .flat_map(move |y| (c.0 - r1..=c.0 + r1).map(move |x| (x, y)))
        .filter(move |&(x, y)| {
            let d2 = (x - c.0).pow(2) + (y - c.1).pow(2);
            d2 >= r0 * r0 && d2 <= r1 * r1
        })
}

#[test]
#[ignore = "needs Xvfb: scripts/test.sh installs it and runs this"]
fn the_window_shows_the_wave() {
    let x = Xvfb::start();
    // The demo scene at 128²: a Ricker pulse from cell (48, 64), a wall at x = 80 with a
    // slit at the middle, an absorbing border 8 cells deep. After 100 steps (t = 50,
    // the pulse left the source at t ≈ 18) its ring is about 32 cells out.
    let mut app = App::start(
        &x.display,
        &[
            "--size",
            "128",
            "--zoom",
            "3",
            "--backend",
            "cpu",
            "--exit-after-steps",
            "100",
            "--linger",
            "30",
        ],
    );
    let open = app.line("wavesim window 0x", 30);
    assert!(open.ends_with("backend cpu"), "{open}");
    app.line("wavesim window: 100 steps done", 60);
    let s = Screen::attach(&x.display, &open);
    assert_eq!(s.size, (384, 384 + STATUS_H));
    let img = s.shot();
    keep(&img, s.size, "window_wave.png");
    let px = |c| cell(&img, s.size.0, 3, c);
    // The ring: both ends of the colour map around the source.
    let ring: Vec<[u8; 3]> = cells_within((48, 64), 20, 40)
        .filter(|&(x, y)| (9..78).contains(&x) && (9..119).contains(&y))
        .map(px)
        .collect();
    let (pos, neg) = (
        ring.iter().filter(|&&p| positive(p)).count(),
        ring.iter().filter(|&&p| negative(p)).count(),
    );
    assert!(
        pos > 100 && neg > 100,
        "ring of {}: {pos} positive, {neg} negative",
        ring.len()
    );
    // Behind the wall, away from the slit, the wave has not arrived: background.
    let calm: Vec<[u8; 3]> = (12..50)
        .flat_map(|y| (88..118).map(move |x| (x, y)))
        .map(px)
        .collect();
    let bg = calm.iter().filter(|&&p| p == BACKGROUND).count();
    assert!(
        bg * 100 >= calm.len() * 95,
        "{bg} of {} background",
        calm.len()
    );
    // The wall, and text in the status bar.
    for y in 20..56 {
        assert_eq!(px((80, y)), REFLECTOR, "wall at y = {y}");
    }
    let bar = &img[..(STATUS_H * s.size.0) as usize];
    assert!(bar.iter().filter(|&&p| p == [0xDD; 3]).count() > 200);
    // q closes it.
    s.focus();
    s.key(0x71);
    assert!(app.wait(20).success());
    let closed = app.line("wavesim window closed: 100 steps", 5);
    assert!(closed.ends_with("backend cpu"), "{closed}");
}

#[test]
#[ignore = "needs Xvfb: scripts/test.sh installs it and runs this"]
fn mouse_and_keys_draw_pause_and_step() {
    let x = Xvfb::start();
    // 96²: the demo pulse from (36, 48), its wall at x = 60, a border 6 cells deep.
    let zoom = 4;
    let mut app = App::start(
        &x.display,
        &[
            "--size",
            "96",
            "--zoom",
            "4",
            "--backend",
            "cpu",
            "--paused",
        ],
    );
    let open = app.line("wavesim window 0x", 30);
    let s = Screen::attach(&x.display, &open);
    let at = |x: i32, y: i32| (x * zoom + zoom / 2, STATUS_H + y * zoom + zoom / 2);
    s.focus();
    let before = s.shot();
    // 2: reflector; a wall from (20, 15) to (20, 35).
    s.key(0x32);
    s.drag(&[at(20, 15), at(20, 25), at(20, 35)]);
    // 1: absorber; a strip from (10, 80) to (30, 80).
    s.key(0x31);
    s.drag(&[at(10, 80), at(30, 80)]);
    // 3: a sine source at (80, 20).
    s.key(0x33);
    s.drag(&[at(80, 20)]);
    // 40 single steps (s).
    for _ in 0..40 {
        s.key(0x73);
    }
    std::thread::sleep(Duration::from_millis(400));
    let a = s.shot();
    keep(&a, s.size, "window_drawn.png");
    std::thread::sleep(Duration::from_millis(500));
    let b = s.shot();
    let field = (STATUS_H * s.size.0) as usize;
    assert!(a[field..] == b[field..], "paused, yet the picture changed");
    let px = |img: &[[u8; 3]], c| cell(img, s.size.0, zoom, c);
    for y in 15..=35 {
        assert_eq!(px(&before, (20, y)), BACKGROUND);
        assert_eq!(px(&a, (20, y)), REFLECTOR, "drawn wall at y = {y}");
    }
    for x in 10..=30 {
        let p = px(&a, (x, 80));
        // An absorber is the background tinted green.
        assert!(
            p[1] >= BACKGROUND[1] + 30 && p[0] < 60 && p[2] < 60,
            "absorber at x = {x}: {p:?}"
        );
        assert_eq!(px(&before, (x, 80)), BACKGROUND);
    }
    // The placed source has been ringing for 40 steps (20 time units): waves around it.
    let around: Vec<[u8; 3]> = cells_within((80, 20), 2, 14)
        .filter(|&(x, y)| x < 90 && y > 5)
        .map(|c| px(&a, c))
        .collect();
    let waves = around
        .iter()
        .filter(|&&p| positive(p) || negative(p))
        .count();
    assert!(waves > 40, "{waves} wave pixels around the placed source");
    assert!(before[field..]
        .iter()
        .all(|&p| !positive(p) && !negative(p)));
    // Space resumes: the picture moves.
    s.key(0x20);
    std::thread::sleep(Duration::from_millis(500));
    let c = s.shot();
    assert!(c[field..] != b[field..], "running, yet the picture stayed");
    s.key(0x71);
    assert!(app.wait(20).success());
    let closed = app.line("wavesim window closed: ", 5);
    let steps: u64 = closed
        .split_whitespace()
        .nth(3)
        .unwrap()
        .trim_end_matches(',')
        .parse()
        .unwrap();
    assert!(steps > 40, "{closed}");
}

#[test]
fn without_a_display_the_window_is_a_clear_error() {
    let out = Command::new(BIN)
        .args(["wavesim", "--size", "64"])
        .env_remove("DISPLAY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no X display") && err.contains("--headless"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
