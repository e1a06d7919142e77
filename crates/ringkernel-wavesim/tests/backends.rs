//! Every backend agrees with the CPU engine to 1e-5 relative after 1,000 steps: the
//! codegen stencil on the CPU device, on WebGPU (lavapipe in CI; skipped without an
//! adapter) and on CUDA (ignored: needs a GPU).

use ringkernel::compute::Device;
use ringkernel_core::Error;
use ringkernel_wavesim::{DeviceWave2D, WaveGrid2D, WaveParams, MAX_STEPS_PER_LAUNCH};

/// A grid of awkward size with random pulses and materials.
fn scene() -> WaveGrid2D {
    let mut s = 0x5EED_u64;
    let mut r = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    let (nx, ny) = (53, 37);
    let mut g = WaveGrid2D::new(nx, ny, WaveParams::new(1.0, 1.0, 0.5)).unwrap();
    for _ in 0..4 {
        g.add_gaussian(
            r() * nx as f32,
            r() * ny as f32,
            1.0 + 2.0 * r(),
            2.0 * r() - 1.0,
        );
    }
    for _ in 0..300 {
        let (x, y) = ((r() * nx as f32) as usize, (r() * ny as f32) as usize);
        match (r() * 3.0) as u32 {
            0 => g.set_speed(x, y, 0.3 + r()).unwrap(),
            1 => g.set_damping(x, y, 0.05 * r()).unwrap(),
            _ => g.set_reflector(x, y).unwrap(),
        }
    }
    g
}

/// The scene's pulses in the default medium (the blocked kernel's uniform path).
fn pulses() -> WaveGrid2D {
    let s = scene();
    let mut g = WaveGrid2D::new(s.nx(), s.ny(), s.params()).unwrap();
    g.add_gaussian(20.0, 11.0, 2.5, 1.0);
    g.add_gaussian(41.0, 29.0, 1.5, -0.7);
    g
}

fn agree(dev: &Device) {
    let mut cpu = scene();
    let mut d = DeviceWave2D::from_grid(dev, &cpu).unwrap();
    d.run(1000).unwrap();
    cpu.run(1000);
    let (got, want) = (d.field().unwrap(), cpu.field());
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(scale > 1e-3, "the field must not have died out ({scale})");
    assert!(
        err <= 1e-5 * scale,
        "{}: max error {err} of {scale}",
        dev.kind()
    );
    assert_eq!(d.steps(), 1000);
}

#[test]
fn cpu_device_agrees_with_the_engine() {
    agree(&Device::cpu());
}

/// Runs `check` on the WebGPU device; SKIPPED without an adapter.
fn on_wgpu(check: fn(&Device)) {
    match Device::wgpu() {
        Ok(dev) => check(&dev),
        Err(e @ Error::BackendUnavailable { .. }) => eprintln!("SKIPPED: no WebGPU adapter: {e}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn wgpu_agrees_with_the_cpu_engine() {
    on_wgpu(agree);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_agrees_with_the_cpu_engine() {
    agree(&Device::cuda(0).unwrap());
}

/// A grid with a point source and a line source that share a cell, run on `dev` and on
/// the CPU engine: the sources are applied alike (time, amplitude, the shared cell).
fn sources_agree(dev: &Device) {
    use ringkernel_wavesim::{Signal, Source};
    let mut cpu = scene();
    let freq = 1.0 / 10.0;
    cpu.add_source(Source::point(20, 17, Signal::Sine { freq }, 0.5))
        .unwrap();
    cpu.add_source(Source::line(
        (5, 30),
        (40, 30),
        Signal::Ricker { freq, delay: 15.0 },
        2.0,
    ))
    .unwrap();
    cpu.add_source(Source::point(12, 30, Signal::Impulse { at: 3.0 }, -1.0))
        .unwrap();
    cpu.run(7); // the device takes the step count over
    let mut d = DeviceWave2D::from_grid(dev, &cpu).unwrap();
    d.run(300).unwrap();
    cpu.run(300);
    let (got, want) = (d.field().unwrap(), cpu.field());
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        scale > 0.1,
        "the sources must have driven the field ({scale})"
    );
    assert!(
        err <= 1e-5 * scale,
        "{}: max error {err} of {scale}",
        dev.kind()
    );
    // And back: the device's state continues on the CPU engine as if it never left.
    let mut back = cpu.clone();
    back.reset();
    d.store_into(&mut back).unwrap();
    assert_eq!(back.steps(), cpu.steps());
    back.run(10);
    cpu.run(10);
    let err = back
        .field()
        .iter()
        .zip(cpu.field())
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= 1e-5 * scale, "after store_into: {err}");
}

#[test]
fn sources_run_on_the_cpu_device() {
    sources_agree(&Device::cpu());
}

#[test]
fn sources_run_on_wgpu() {
    on_wgpu(sources_agree);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn sources_run_on_cuda() {
    sources_agree(&Device::cuda(0).unwrap());
}

#[test]
fn a_state_of_another_size_is_refused() {
    let g = scene();
    let d = DeviceWave2D::from_grid(&Device::cpu(), &g).unwrap();
    let mut other = WaveGrid2D::new(10, 10, WaveParams::default()).unwrap();
    assert!(matches!(
        d.store_into(&mut other),
        Err(Error::ShapeMismatch(_))
    ));
}

/// Tilings of the blocked kernel give the launch-a-step result, with step counts that
/// are not multiples of `k`, and leave both time levels right (the state continues on
/// the CPU engine).
fn blockings_agree(dev: &Device, ks: &[u32], runs: &[u64]) {
    for uniform in [false, true] {
        // The scene has materials; the uniform one only its pulses (no coefficient arrays).
        let start = if uniform { pulses() } else { scene() };
        blockings_agree_on(dev, &start, ks, runs);
    }
}

fn blockings_agree_on(dev: &Device, start: &WaveGrid2D, ks: &[u32], runs: &[u64]) {
    let start = start.clone();
    let total: u64 = runs.iter().sum();
    let mut reference = DeviceWave2D::from_grid(dev, &start).unwrap();
    reference.run_per_step(total).unwrap();
    let want_u = reference.field().unwrap();
    let mut want = start.clone();
    reference.store_into(&mut want).unwrap();
    want.run(5);
    let scale = want_u.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(scale > 1e-3, "the field must not have died out ({scale})");
    for &b in ks {
        let mut d = DeviceWave2D::from_grid(dev, &start).unwrap();
        d.set_steps_per_launch(b).unwrap();
        for &n in runs {
            d.run_blocked(n).unwrap();
        }
        assert_eq!(d.steps(), start.steps() + total);
        let got = d.field().unwrap();
        // The kernel's output fields start NaN inside: a cell it missed stays NaN.
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{}, {b}: a cell was not written",
            dev.kind()
        );
        let err = got
            .iter()
            .zip(&want_u)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-6 * scale,
            "{}, {b}: max error {err} of {scale}",
            dev.kind()
        );
        let mut back = start.clone();
        d.store_into(&mut back).unwrap();
        back.run(5);
        let err = back
            .field()
            .iter()
            .zip(want.field())
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-6 * scale,
            "{}, {b}: after store_into: {err}",
            dev.kind()
        );
    }
}

/// Steps per launch (tiles of (64 - 2k) x (32 - 2k) cells), runs below and at `k`.
const KS: [u32; 5] = [4, 1, 3, 8, MAX_STEPS_PER_LAUNCH];

#[test]
fn blocked_steps_match_single_steps_on_the_cpu_device() {
    // The CPU device runs workgroups with emulated barriers: fewer steps here.
    blockings_agree(&Device::cpu(), &KS[2..4], &[1, 9, 2]);
}

#[test]
fn blocked_steps_match_single_steps_on_wgpu() {
    on_wgpu(|d| blockings_agree(d, &KS, &[1, 50, 2, 70]));
}

#[test]
#[ignore = "needs CUDA GPU"]
fn blocked_steps_match_single_steps_on_cuda() {
    blockings_agree(&Device::cuda(0).unwrap(), &KS, &[1, 50, 2, 70]);
}

#[test]
fn blocked_runs_refuse_sources() {
    use ringkernel_wavesim::{Signal, Source};
    let mut g = scene();
    g.add_source(Source::point(3, 4, Signal::Impulse { at: 1.0 }, 1.0))
        .unwrap();
    let mut d = DeviceWave2D::from_grid(&Device::cpu(), &g).unwrap();
    assert!(matches!(d.run_blocked(3), Err(Error::InvalidArgument(_))));
    assert_eq!(d.steps(), g.steps());
}

#[test]
fn bad_steps_per_launch_are_refused() {
    let mut d = DeviceWave2D::from_grid(&Device::cpu(), &scene()).unwrap();
    let k = d.steps_per_launch();
    for bad in [0, MAX_STEPS_PER_LAUNCH + 1] {
        assert!(
            matches!(d.set_steps_per_launch(bad), Err(Error::InvalidArgument(_))),
            "{bad}"
        );
    }
    assert_eq!(d.steps_per_launch(), k);
}
