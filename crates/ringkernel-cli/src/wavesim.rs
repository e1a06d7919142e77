//! `ringkernel wavesim`: the wave simulation, headless (PNG frames and an animation) and
//! its benchmark against a numpy peer and the memory-bandwidth bound.

use ringkernel::compute::Device;
use ringkernel::Error;
use ringkernel_wavesim::scene::{
    copy_bandwidth, cpu_steps_per_sec, cuda_steps_per_sec, demo_scene, device_steps_per_sec,
    run_headless,
};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// `ringkernel wavesim [--headless ...] | wavesim bench ...`
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
    /// The numpy peer script (run with python3; PYTHONPATH as set).
    #[arg(long, default_value = "scripts/wavesim_numpy.py")]
    pub numpy: PathBuf,
    /// Skip the numpy peer.
    #[arg(long)]
    pub no_numpy: bool,
    /// GPU backends to measure besides the CPU engine (the codegen stencil, a launch
    /// per step): any of wgpu, cuda, metal; unavailable ones are reported as skipped.
    #[arg(long, value_delimiter = ',', default_values_t = ["wgpu".to_string(), "cuda".to_string()])]
    pub gpu: Vec<String>,
}

pub fn run(cmd: &WavesimCmd) -> Result<(), Error> {
    match &cmd.sub {
        Some(WavesimSub::Bench(b)) => bench(b),
        None if cmd.run.headless => headless(&cmd.run),
        None => Err(Error::invalid(
            "the interactive window is not in this build yet: run with --headless \
             (--steps N --out DIR) to write PNG frames",
        )),
    }
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

/// numpy's steps/s per size, from the peer script's lines; or why there are none.
fn numpy_peer(b: &BenchArgs) -> Result<Vec<(usize, f64, f64)>, String> {
    let mut cmd = Command::new("python3");
    cmd.arg(&b.numpy)
        .arg("--seconds")
        .arg(b.seconds.to_string())
        .arg("--sizes");
    for s in &b.sizes {
        cmd.arg(s.to_string());
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("failed").to_string());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().filter_map(parse_numpy_line).collect())
}

/// `numpy n=256 steps/s=4055.4 cells/s=... checksum=1.0e0` -> (256, 4055.4, 1.0).
fn parse_numpy_line(l: &str) -> Option<(usize, f64, f64)> {
    let field = |k: &str| l.split_whitespace().find_map(|w| w.strip_prefix(k));
    Some((
        field("n=")?.parse().ok()?,
        field("steps/s=")?.parse().ok()?,
        field("checksum=")?.parse().ok()?,
    ))
}

fn bench(b: &BenchArgs) -> Result<(), Error> {
    if b.sizes.iter().any(|&s| !(8..=16384).contains(&s)) || b.seconds.is_nan() || b.seconds <= 0.0
    {
        return Err(Error::invalid(
            "sizes must be 8..=16384 and --seconds positive",
        ));
    }
    let bw = copy_bandwidth(256 << 20);
    println!(
        "wavesim bench: 2-D 5-point wave update, f32, CPU engine on {} rayon threads; \
         host copy bandwidth {:.1} GB/s (bound: 12 B/cell/step)",
        rayon_threads(),
        bw / 1e9
    );
    let peer = if b.no_numpy {
        Err("--no-numpy".to_string())
    } else {
        numpy_peer(b)
    };
    if let Err(why) = &peer {
        println!("numpy peer: SKIPPED ({why})");
    }
    println!(
        "{:>6}  {:>8}  {:>12}  {:>12}  {:>12}  {:>10}  {:>9}",
        "size", "backend", "steps/s", "Mcells/s", "bound st/s", "% of bound", "x numpy"
    );
    let mut gpus = Vec::new();
    for name in &b.gpu {
        match Device::from_name(name) {
            Ok(d) => {
                println!("{name}: {d}");
                gpus.push((name.clone(), d));
            }
            Err(e) => println!("{name}: SKIPPED ({e})"),
        }
    }
    for &n in &b.sizes {
        let (sps, sum) = cpu_steps_per_sec(n, Duration::from_secs_f64(b.seconds))?;
        let cells = (n * n) as f64;
        let bound = bw / (12.0 * cells);
        let np = peer.as_ref().ok().and_then(|v| v.iter().find(|r| r.0 == n));
        let ratio = np.map_or("-".to_string(), |r| format!("{:.1}", sps / r.1));
        println!(
            "{:>6}  {:>8}  {:>12.0}  {:>12.1}  {:>12.0}  {:>9.0}%  {:>9}",
            format!("{n}²"),
            "cpu",
            sps,
            sps * cells / 1e6,
            bound,
            100.0 * sps / bound,
            ratio
        );
        if let Some(r) = np {
            println!(
                "{:>6}  {:>8}  {:>12.0}  {:>12.1}  {:>12}  {:>10}  {:>9}",
                "",
                "numpy",
                r.1,
                r.1 * cells / 1e6,
                "",
                "",
                "1.0"
            );
            if (r.2 - sum).abs() > 1e-4 * sum.abs().max(1.0) {
                return Err(Error::Device(format!(
                    "numpy and the CPU engine disagree at {n}²: checksum {} vs {sum}",
                    r.2
                )));
            }
        }
        for (name, dev) in &gpus {
            match device_steps_per_sec(dev, n, Duration::from_secs_f64(b.seconds)) {
                Ok(g) => println!(
                    "{:>6}  {:>8}  {:>12.0}  {:>12.1}  {:>12}  {:>10}  {:>9}",
                    "",
                    name,
                    g,
                    g * cells / 1e6,
                    "",
                    "",
                    np.map_or("-".to_string(), |r| format!("{:.1}", g / r.1))
                ),
                Err(e) => println!("{:>6}  {name}: failed: {e}", ""),
            }
            if name == "cuda" {
                for (label, persistent) in [("cuda-step", false), ("cuda-tile", true)] {
                    match cuda_steps_per_sec(n, Duration::from_secs_f64(b.seconds), persistent) {
                        Ok(g) => println!(
                            "{:>6}  {:>10}  {:>10.0}  {:>12.1}  {:>12}  {:>10}  {:>9}",
                            "",
                            label,
                            g,
                            g * cells / 1e6,
                            "",
                            "",
                            np.map_or("-".to_string(), |r| format!("{:.1}", g / r.1))
                        ),
                        Err(e) => println!("{:>6}  {label}: failed: {e}", ""),
                    }
                }
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
    fn headless_run_writes_frames_that_show_the_wave() {
        let dir = std::env::temp_dir().join(format!("rk-wavesim-cli-{}", std::process::id()));
        let a = RunArgs {
            headless: true,
            steps: 120,
            out: dir.clone(),
            size: 96,
            frames: 3,
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
        let bad = WavesimCmd {
            sub: None,
            run: RunArgs {
                headless: false,
                ..a
            },
        };
        assert!(run(&bad).is_err());
    }
}
