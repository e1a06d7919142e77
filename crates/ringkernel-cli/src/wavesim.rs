//! `ringkernel wavesim`: the wave simulation in an interactive window, headless (PNG
//! frames and an animation), and its benchmark against numpy and PyTorch peers and the
//! memory-bandwidth bound.

use ringkernel::compute::Device;
use ringkernel::Error;
use ringkernel_wavesim::scene::{
    copy_bandwidth, cpu_steps_per_sec, cuda_steps_per_sec, demo_scene, device_copy_bandwidth,
    device_steps_per_sec, run_headless, CudaPath,
};
use ringkernel_wavesim::window::{run_window, WindowOptions};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// `ringkernel wavesim [--headless ...] | wavesim bench ...`
///
/// Without `--headless` a window opens (X11: `DISPLAY`). Mouse: left draws with the tool
/// (keys 1 absorber, 2 reflector, 3 source), right erases. Keys: space pause, s step,
/// r reset, c clear, b backend, +/- steps per frame, q quit.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct WavesimCmd {
    #[command(subcommand)]
    pub sub: Option<WavesimSub>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands of `ringkernel wavesim`.
#[derive(Debug, clap::Subcommand)]
pub enum WavesimSub {
    /// Steps/s and cell updates/s per grid size, with a numpy peer and the bandwidth bound.
    Bench(BenchArgs),
}

/// Options of a simulation run.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Run without a window: write PNG frames and an animated PNG into --out.
    #[arg(long)]
    pub headless: bool,
    /// Steps to run.
    #[arg(long, default_value_t = 600)]
    pub steps: u64,
    /// Output directory of the frames.
    #[arg(long, default_value = "wavesim-out")]
    pub out: PathBuf,
    /// Grid side in cells (the demo scene, at least 32).
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Frames to write, evenly spaced over the run.
    #[arg(long, default_value_t = 12)]
    pub frames: usize,
    /// Window: pixels a cell (0: the window about 512 pixels wide).
    #[arg(long, default_value_t = 0)]
    pub zoom: usize,
    /// Window: backends offered, in the order the `b` key cycles through them (the first
    /// available one starts; unavailable ones are left out).
    #[arg(long, value_delimiter = ',', default_values_t = ["cpu".to_string(), "cuda".to_string(), "wgpu".to_string(), "metal".to_string()])]
    pub backend: Vec<String>,
    /// Window: steps a frame at the start (`+`/`-` change it).
    #[arg(long, default_value_t = 4)]
    pub steps_per_frame: u64,
    /// Window: stop after this many steps, print `wavesim window: N steps done`, keep
    /// the last frame on screen for --linger seconds and close.
    #[arg(long)]
    pub exit_after_steps: Option<u64>,
    /// Window: seconds the last frame stays after --exit-after-steps.
    #[arg(long, default_value_t = 0.0)]
    pub linger: f64,
    /// Window: start paused (space resumes, s steps).
    #[arg(long)]
    pub paused: bool,
}

/// Options of `ringkernel wavesim bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Grid sides to measure.
    #[arg(long, num_args = 1.., default_values_t = [256usize, 512, 1024, 4096])]
    pub sizes: Vec<usize>,
    /// Seconds of timing per size and engine.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Rounds of the CPU engine and numpy, alternating (the rows show the medians and
    /// the range; the ratio is the median of the rounds' ratios).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// The numpy peer script (run with python3; PYTHONPATH as set).
    #[arg(long, default_value = "scripts/wavesim_numpy.py")]
    pub numpy: PathBuf,
    /// Skip the numpy peer.
    #[arg(long)]
    pub no_numpy: bool,
    /// Run the PyTorch peer on the GPU (`--torch-script`, with python3) beside the GPU
    /// rows; skipped with the reason when python3 has no torch or no CUDA device.
    #[arg(long)]
    pub torch: bool,
    /// The PyTorch peer script.
    #[arg(long, default_value = "scripts/wavesim_torch.py")]
    pub torch_script: PathBuf,
    /// The peer's modes (eager: PyTorch's kernels; compile: torch.compile's fused kernel).
    #[arg(long, value_delimiter = ',', default_values_t = ["eager".to_string(), "compile".to_string()])]
    pub torch_modes: Vec<String>,
    /// GPU backends to measure besides the CPU engine (the codegen kernels: 4, 8 and 12
    /// steps a launch, and a launch per step): any of wgpu, cuda, metal, or `none`;
    /// unavailable ones are reported as skipped.
    #[arg(long, value_delimiter = ',', default_values_t = ["wgpu".to_string(), "cuda".to_string()])]
    pub gpu: Vec<String>,
}

pub fn run(cmd: &WavesimCmd) -> Result<(), Error> {
    match &cmd.sub {
        Some(WavesimSub::Bench(b)) => bench(b),
        None if cmd.run.headless => headless(&cmd.run),
        None => window(&cmd.run),
    }
}

fn window(a: &RunArgs) -> Result<(), Error> {
    if !(a.linger.is_finite() && (0.0..=3600.0).contains(&a.linger)) {
        return Err(Error::invalid("--linger must be 0..=3600 seconds"));
    }
    let opts = WindowOptions {
        zoom: a.zoom,
        backends: a.backend.clone(),
        steps_per_frame: a.steps_per_frame,
        exit_after_steps: a.exit_after_steps,
        linger: Duration::from_secs_f64(a.linger),
        paused: a.paused,
        ..WindowOptions::default()
    };
    let r = run_window(demo_scene(a.size)?, &opts)?;
    println!(
        "wavesim window closed: {} steps, {} frames, backend {}",
        r.steps, r.frames, r.backend
    );
    Ok(())
}

fn headless(a: &RunArgs) -> Result<(), Error> {
    let mut g = demo_scene(a.size)?;
    let r = run_headless(&mut g, a.steps, a.frames, &a.out)?;
    println!(
        "wavesim: {} steps on {}x{}; {} frames and {} written",
        r.steps,
        a.size,
        a.size,
        r.frames.len(),
        r.animation.display()
    );
    Ok(())
}

/// Runs a peer script with python3: its stdout, or why it failed.
fn python(script: &std::path::Path, args: &[String]) -> Result<String, String> {
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("failed").to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The value of `key` (`n=`, `steps/s=`) in a peer's output line.
fn field<'a>(l: &'a str, key: &str) -> Option<&'a str> {
    l.split_whitespace().find_map(|w| w.strip_prefix(key))
}

/// numpy's steps/s and checksum at size `n`, from the peer script; or why there are none.
fn numpy_peer(b: &BenchArgs, n: usize) -> Result<(f64, f64), String> {
    let args = [
        "--seconds".to_string(),
        b.seconds.to_string(),
        "--sizes".to_string(),
        n.to_string(),
    ];
    let text = python(&b.numpy, &args)?;
    text.lines()
        .filter_map(parse_numpy_line)
        .find(|r| r.0 == n)
        .map(|r| (r.1, r.2))
        .ok_or_else(|| format!("no line for n={n} in its output"))
}

/// `numpy n=256 steps/s=4055.4 cells/s=... checksum=1.0e0` -> (256, 4055.4, 1.0).
fn parse_numpy_line(l: &str) -> Option<(usize, f64, f64)> {
    Some((
        field(l, "n=")?.parse().ok()?,
        field(l, "steps/s=")?.parse().ok()?,
        field(l, "checksum=")?.parse().ok()?,
    ))
}

/// The PyTorch peer's figures: its copy bandwidth and, per size and mode, steps/s and
/// the checksum; and its SKIPPED / FAILED lines.
#[derive(Debug, Default, PartialEq)]
struct TorchPeer {
    copy_bytes_per_s: Option<f64>,
    runs: Vec<(usize, String, f64, f64)>,
    notes: Vec<String>,
}

fn parse_torch(text: &str) -> TorchPeer {
    let mut t = TorchPeer::default();
    for l in text.lines().filter(|l| l.starts_with("torch ")) {
        if let Some(v) = field(l, "GB/s=").and_then(|v| v.parse::<f64>().ok()) {
            t.copy_bytes_per_s = Some(v * 1e9);
        } else if let (Some(n), Some(mode), Some(sps), Some(sum)) = (
            field(l, "n=").and_then(|v| v.parse().ok()),
            field(l, "mode="),
            field(l, "steps/s=").and_then(|v| v.parse().ok()),
            field(l, "checksum=").and_then(|v| v.parse().ok()),
        ) {
            t.runs.push((n, mode.to_string(), sps, sum));
        } else if l.contains("SKIPPED") || l.contains("FAILED") {
            t.notes.push(l.to_string());
        }
    }
    t
}

fn torch_peer(b: &BenchArgs) -> Result<TorchPeer, String> {
    let mut args = vec!["--seconds".to_string(), b.seconds.to_string()];
    args.push("--sizes".into());
    args.extend(b.sizes.iter().map(|s| s.to_string()));
    args.push("--modes".into());
    args.extend(b.torch_modes.iter().cloned());
    let text = python(&b.torch_script, &args)?;
    if let Some(l) = text.lines().next() {
        println!("{l}");
    }
    Ok(parse_torch(&text))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// One table row.
struct Row<'a> {
    size: &'a str,
    name: &'a str,
    steps_per_s: f64,
    cells: f64,
    /// Steps/s at the bandwidth bound.
    bound: Option<f64>,
    /// Against the peer (numpy for the CPU, the faster PyTorch mode for GPUs).
    ratio: Option<f64>,
    note: &'a str,
}

impl Row<'_> {
    fn print(&self) {
        let (b, pct) = match self.bound {
            Some(b) => (
                format!("{b:.0}"),
                format!("{:.0}%", 100.0 * self.steps_per_s / b),
            ),
            None => (String::new(), String::new()),
        };
        let r = self.ratio.map_or(String::new(), |r| format!("{r:.2}"));
        println!(
            "{:>6}  {:>10}  {:>12.0}  {:>9.3}  {b:>11}  {pct:>6}  {r:>7}  {}",
            self.size,
            self.name,
            self.steps_per_s,
            self.steps_per_s * self.cells / 1e9,
            self.note
        );
    }
}

/// `lo..hi over N rounds` of `v`, or nothing for one round.
fn spread(v: &[f64]) -> String {
    if v.len() < 2 {
        return String::new();
    }
    let lo = v.iter().copied().fold(f64::MAX, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    format!("{lo:.0}..{hi:.0} over {} rounds", v.len())
}

fn bench(b: &BenchArgs) -> Result<(), Error> {
    if b.sizes.iter().any(|&s| !(8..=16384).contains(&s))
        || !(b.seconds.is_finite() && b.seconds > 0.0)
        || !(1..=100).contains(&b.rounds)
    {
        return Err(Error::invalid(
            "sizes must be 8..=16384, --seconds positive, --rounds 1..=100",
        ));
    }
    let bw = copy_bandwidth(256 << 20);
    println!(
        "wavesim bench: 2-D 5-point wave update, f32, two buffers; CPU engine on {} threads; \
         host copy bandwidth {:.1} GB/s; bound: 12 B/cell/step at the copy bandwidth",
        rayon_threads(),
        bw / 1e9
    );
    let mut gpus = Vec::new();
    for name in b.gpu.iter().filter(|n| !n.is_empty() && *n != "none") {
        let dev = Device::from_name(name)
            .and_then(|d| device_copy_bandwidth(&d, 256 << 20).map(|bw| (d, bw)));
        match dev {
            Ok((d, gbw)) => {
                println!("{name}: {d}; copy bandwidth {:.1} GB/s", gbw / 1e9);
                gpus.push((name.clone(), d, gbw));
            }
            Err(e) => println!("{name}: SKIPPED ({e})"),
        }
    }
    let torch = if b.torch {
        torch_peer(b)
    } else {
        Err("no --torch".to_string())
    };
    match &torch {
        Ok(t) => {
            if let Some(c) = t.copy_bytes_per_s {
                println!("torch: copy bandwidth {:.1} GB/s", c / 1e9);
            }
            for n in &t.notes {
                println!("{n}");
            }
        }
        Err(why) if b.torch => println!("torch peer: SKIPPED ({why})"),
        Err(_) => {}
    }
    let secs = Duration::from_secs_f64(b.seconds);
    println!(
        "{:>6}  {:>10}  {:>12}  {:>9}  {:>11}  {:>6}  {:>7}",
        "size", "backend", "steps/s", "Gcells/s", "bound st/s", "%bound", "x peer"
    );
    let mut numpy_off = b.no_numpy;
    for &n in &b.sizes {
        let cells = (n * n) as f64;
        // The CPU engine and numpy, alternating.
        let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut checksum = 0.0;
        for _ in 0..b.rounds {
            let (sps, sum) = cpu_steps_per_sec(n, secs)?;
            checksum = sum;
            ours.push(sps);
            if numpy_off {
                continue;
            }
            match numpy_peer(b, n) {
                Ok((np, check)) => {
                    if (check - sum).abs() > 1e-4 * sum.abs().max(1.0) {
                        return Err(Error::Device(format!(
                            "numpy and the CPU engine disagree at {n}²: checksum {check} vs {sum}"
                        )));
                    }
                    theirs.push(np);
                    ratios.push(sps / np);
                }
                Err(why) => {
                    println!("numpy peer: SKIPPED ({why})");
                    numpy_off = true;
                }
            }
        }
        let (ours_spread, theirs_spread) = (spread(&ours), spread(&theirs));
        let size = format!("{n}²");
        Row {
            size: &size,
            name: "cpu",
            steps_per_s: median(&mut ours),
            cells,
            bound: Some(bw / (12.0 * cells)),
            ratio: (!ratios.is_empty()).then(|| median(&mut ratios)),
            note: &ours_spread,
        }
        .print();
        if !theirs.is_empty() {
            Row {
                size: "",
                name: "numpy",
                steps_per_s: median(&mut theirs),
                cells,
                bound: Some(bw / (12.0 * cells)),
                ratio: None,
                note: &theirs_spread,
            }
            .print();
        }
        // The GPU rows, each against the faster PyTorch mode at this size.
        let peer = torch.as_ref().ok().and_then(|t| {
            t.runs
                .iter()
                .filter(|r| r.0 == n)
                .map(|r| r.2)
                .max_by(f64::total_cmp)
        });
        for (name, dev, gbw) in &gpus {
            let gpu_row = |label: &str, r: Result<f64, Error>, note: &str| match r {
                Ok(g) => Row {
                    size: "",
                    name: label,
                    steps_per_s: g,
                    cells,
                    bound: Some(gbw / (12.0 * cells)),
                    ratio: peer.map(|p| g / p),
                    note,
                }
                .print(),
                Err(e) => println!("{:>6}  {label:>10}  failed: {e}", ""),
            };
            for k in [4, 8, 12] {
                let label = if k == 4 {
                    name.clone()
                } else {
                    format!("{name}-k{k}")
                };
                gpu_row(
                    &label,
                    device_steps_per_sec(dev, n, secs, Some(k)),
                    &format!(
                        "codegen, {k} steps a launch ({}x{} tiles)",
                        64 - 2 * k,
                        32 - 2 * k
                    ),
                );
            }
            gpu_row(
                &format!("{name}-1"),
                device_steps_per_sec(dev, n, secs, None),
                "codegen stencil, a launch a step",
            );
            if name == "cuda" {
                gpu_row(
                    "cuda-step",
                    cuda_steps_per_sec(n, secs, CudaPath::PerStep),
                    "CUDA C, a launch a step",
                );
                gpu_row(
                    "cuda-tile",
                    cuda_steps_per_sec(n, secs, CudaPath::Tiles),
                    "tile actors over global memory, one launch",
                );
                gpu_row(
                    "cuda-reg",
                    cuda_steps_per_sec(n, secs, CudaPath::Resident),
                    "tile actors in registers, one launch",
                );
                gpu_row(
                    "cuda-reg2",
                    cuda_steps_per_sec(n, secs, CudaPath::ResidentH2),
                    "the same, two-cell halos every two steps",
                );
            }
        }
        if let Ok(t) = &torch {
            for (_, mode, sps, check) in t.runs.iter().filter(|r| r.0 == n) {
                if (check - checksum).abs() > 1e-3 * checksum.abs().max(1.0) {
                    return Err(Error::Device(format!(
                        "PyTorch ({mode}) and the CPU engine disagree at {n}²: checksum {check} vs {checksum}"
                    )));
                }
                Row {
                    size: "",
                    name: &format!("torch-{mode}"),
                    steps_per_s: *sps,
                    cells,
                    bound: t.copy_bytes_per_s.map(|c| c / (12.0 * cells)),
                    ratio: None,
                    note: "peer",
                }
                .print();
            }
        }
    }
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringkernel_wavesim::image::{decode_png, BACKGROUND};

    #[test]
    fn numpy_lines_parse() {
        let l = "numpy n=256 steps/s=4055.4 cells/s=2.6578e+08 checksum=1.000035e+00";
        assert_eq!(parse_numpy_line(l), Some((256, 4055.4, 1.000035)));
        assert_eq!(parse_numpy_line("Traceback"), None);
    }

    #[test]
    fn torch_lines_parse() {
        let text = "torch 2.9.0 on NVIDIA H200\n\
                    torch copy GB/s=3900.5\n\
                    torch mode=compile SKIPPED (BackendCompilerFailed: no triton)\n\
                    torch n=512 mode=eager steps/s=41000.0 cells/s=1.07e+10 checksum=1.000035e+00\n\
                    torch n=4096 mode=eager FAILED (OutOfMemoryError: ...)\n";
        let t = parse_torch(text);
        assert_eq!(t.copy_bytes_per_s, Some(3900.5e9));
        assert_eq!(t.runs, vec![(512, "eager".to_string(), 41000.0, 1.000035)]);
        assert_eq!(t.notes.len(), 2);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(spread(&[3.0]), "");
        assert_eq!(spread(&[3.0, 1.0]), "1..3 over 2 rounds");
    }

    #[test]
    fn headless_run_writes_frames_that_show_the_wave() {
        let dir = std::env::temp_dir().join(format!("rk-wavesim-cli-{}", std::process::id()));
        let a = RunArgs {
            headless: true,
            steps: 120,
            out: dir.clone(),
            size: 96,
            frames: 3,
            zoom: 0,
            backend: vec!["cpu".into()],
            steps_per_frame: 4,
            exit_after_steps: None,
            linger: 0.0,
            paused: false,
        };
        headless(&a).unwrap();
        let (w, h, rgb) = decode_png(&std::fs::read(dir.join("frame_0002.png")).unwrap()).unwrap();
        assert_eq!((w, h), (96, 96));
        // Around the source (x = 36, y = 48) the pixels are not the background.
        let lit = (20..52)
            .flat_map(|y| (20..52).map(move |x| (x, y)))
            .filter(|&(x, y)| {
                let k = (y * 96 + x) * 3;
                rgb[k..k + 3] != BACKGROUND
            })
            .count();
        assert!(lit > 200, "only {lit} lit pixels near the source");
        std::fs::remove_dir_all(&dir).ok();
    }
}
