//! An actor handler written once in Rust, run on the backend you pick.
//!
//! Two kernels make a pipeline: `convert` turns each Celsius reading into Fahrenheit and
//! sends it on to the `stats` kernel (kernel to kernel, no host in between); `stats` keeps
//! a running count, mean, minimum and maximum in its state and replies with them. Both
//! are ordinary Rust functions: the CPU runs them as they are, and `#[ring_kernel(gpu)]`
//! translates them at compile time into the CUDA handler of the persistent kernel and the
//! WGSL handler of the drain template (Metal runs naga's MSL of it). The example prints
//! the same lines on `--backend cpu|wgpu|cuda|metal` and checks them against a host
//! computation; which backend ran goes to stderr.
//!
//! ```text
//! cargo run -p ringkernel --example portable_handler                                 # CPU
//! cargo run -p ringkernel --features wgpu --example portable_handler -- --backend wgpu
//! cargo run -p ringkernel --features cuda --example portable_handler -- --backend cuda
//! ```

mod common;

use ringkernel::core::util::SplitMix64;
use ringkernel::prelude::*;
use ringkernel::{ring_kernel, GpuType, RingKernel, RingMessage};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// A sensor reading; `sink` is the id of the kernel that gets the converted value.
#[derive(Clone, Copy, Debug, Default, RingMessage, GpuType)]
#[message(type_id = 0x5048_0001)]
#[repr(C)]
struct Reading {
    id: u64,
    value: f32,
    sink: u32,
}

/// The running statistics after one more reading.
#[derive(Clone, Copy, Debug, Default, RingMessage, GpuType)]
#[message(type_id = 0x5048_0002)]
#[repr(C)]
struct Summary {
    id: u64,
    count: u32,
    mean: f32,
    min: f32,
    max: f32,
}

/// The `stats` kernel's state: zero by default, as a GPU starts it.
#[derive(Clone, Copy, Debug, Default, GpuType)]
#[repr(C)]
struct Stats {
    count: u32,
    sum: f32,
    min: f32,
    max: f32,
}

/// Celsius to Fahrenheit, sent on to kernel `sink`.
#[ring_kernel(name = "convert", gpu)]
fn convert(ctx: &mut KernelContext<'_>, r: Reading) {
    let f = r.value.mul_add(1.8, 32.0);
    let _ = ctx.send_to(KernelId(r.sink), &Reading { value: f, ..r });
}

/// Running count, mean, minimum and maximum of the readings it gets.
#[ring_kernel(name = "stats", gpu)]
fn stats(_ctx: &mut KernelContext<'_>, s: &mut Stats, r: Reading) -> Option<Summary> {
    if s.count == 0 {
        s.min = r.value;
        s.max = r.value;
    } else {
        s.min = s.min.min(r.value);
        s.max = s.max.max(r.value);
    }
    s.count += 1;
    s.sum += r.value;
    Some(Summary {
        id: r.id,
        count: s.count,
        mean: s.sum / s.count as f32,
        min: s.min,
        max: s.max,
    })
}

common::example_main!(run);

async fn run() -> Result<()> {
    let rt = RingKernel::builder()
        .backend(common::backend_arg()?)
        .build()
        .await?;
    eprintln!("runtime on {}", rt.backend());
    let stats_k = rt.launch("stats", LaunchOptions::default()).await?;
    let convert_k = rt.launch("convert", LaunchOptions::default()).await?;

    // The same readings on every backend.
    let mut rng = SplitMix64::new(2026);
    let readings: Vec<f32> = (0..12).map(|_| rng.uniform(-10.0, 35.0)).collect();
    let (mut count, mut sum, mut min, mut max) = (0u32, 0.0f32, f32::MAX, f32::MIN);
    for (id, &c) in readings.iter().enumerate() {
        convert_k
            .send(Reading {
                id: id as u64,
                value: c,
                sink: stats_k.id().0,
            })
            .await?;
        let s: Summary = stats_k.receive_timeout(WAIT).await?.decode()?;
        println!(
            "reading {id:2}: {c:6.2} °C -> {} readings, mean {:6.2} °F, min {:6.2} °F, max {:6.2} °F",
            s.count, s.mean, s.min, s.max
        );
        // The host's own computation of the same statistics.
        let f = c.mul_add(1.8, 32.0);
        count += 1;
        sum += f;
        min = min.min(f);
        max = max.max(f);
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
        if s.id != id as u64
            || s.count != count
            || !close(s.mean, sum / count as f32)
            || !close(s.min, min)
            || !close(s.max, max)
        {
            return Err(Error::Device(format!(
                "reading {id}: the kernels answered {s:?}, the host computes count {count}, \
                 mean {}, min {min}, max {max}",
                sum / count as f32
            )));
        }
    }
    println!("the same statistics as the host's");
    rt.shutdown().await?;
    Ok(())
}
