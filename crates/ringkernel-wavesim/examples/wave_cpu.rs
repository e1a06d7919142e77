//! The CPU engine alone, for profilers (callgrind, perf): `N` steps of an `n × n` grid
//! of the default medium, then steps/s and a checksum. `run` (the default) is
//! `WaveGrid2D::run` (two steps a sweep), `step` calls `step()` N times (a sweep a
//! step): the same results, bit for bit.
//!
//! ```text
//! cargo run --release -p ringkernel-wavesim --example wave_cpu -- 256 20000 [run|step]
//! RAYON_NUM_THREADS=1 valgrind --tool=callgrind target/release/examples/wave_cpu 256 200
//! ```

use ringkernel_wavesim::{WaveGrid2D, WaveParams};
use std::time::Instant;

fn main() -> Result<(), ringkernel_core::Error> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let steps: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let mut g = WaveGrid2D::new(n, n, WaveParams::default())?;
    g.add_gaussian(n as f32 / 2.0, n as f32 / 2.0, 3.0, 1.0);
    let single = args.next().as_deref() == Some("step");
    let t0 = Instant::now();
    if single {
        for _ in 0..steps {
            g.step();
        }
    } else {
        g.run(steps);
    }
    let el = t0.elapsed().as_secs_f64();
    let sum: f64 = g.field().iter().map(|&v| v as f64).sum();
    println!(
        "{n}x{n} {}: {steps} steps in {el:.3} s, {:.0} steps/s, checksum {sum:.6e}",
        if single { "step" } else { "run" },
        steps as f64 / el
    );
    Ok(())
}
