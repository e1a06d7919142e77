//! Physics of the CPU engines: the CFL check, the speed of a pulse, energy conservation,
//! absorbing borders, the 3-D variant, and the update against an f64 reference.

use ringkernel_core::Error;
use ringkernel_wavesim::{Material, Signal, Source, WaveGrid2D, WaveGrid3D, WaveParams};

/// A small deterministic generator (SplitMix64) for random inputs.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn unstable_time_step_is_a_typed_error() {
    // Courant 0.75 > 1/sqrt(2).
    let err = WaveGrid2D::new(32, 32, WaveParams::new(1.5, 1.0, 0.5)).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("CFL")),
        "{err}"
    );
    // The limit itself is stable; 0.65 is stable in 2-D but not in 3-D.
    let p = WaveParams::new(0.65, 1.0, 1.0);
    assert!(WaveGrid2D::new(8, 8, p).is_ok());
    let e3 = WaveGrid3D::new(8, 8, 8, p).unwrap_err();
    assert!(
        matches!(&e3, Error::InvalidArgument(m) if m.contains("CFL")),
        "{e3}"
    );
    let cfl = p.check_speed(0.65, 3).unwrap_err();
    assert!((cfl.courant - 0.65).abs() < 1e-6 && (cfl.limit - 1.0 / 3f32.sqrt()).abs() < 1e-6);
    // A cell too fast for the grid's dt is refused, and the grid is unchanged.
    let mut g = WaveGrid2D::new(16, 16, WaveParams::new(1.0, 1.0, 0.5)).unwrap();
    let err = g.set_speed(3, 3, 2.0).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("CFL")),
        "{err}"
    );
    assert_eq!(g.material(3, 3), Some(Material::Medium));
    // Bad values.
    assert!(WaveGrid2D::new(0, 4, WaveParams::default()).is_err());
    assert!(WaveGrid2D::new(4, 4, WaveParams::new(1.0, 0.0, 0.5)).is_err());
    assert!(WaveGrid2D::new(4, 4, WaveParams::new(f32::NAN, 1.0, 0.5)).is_err());
    assert!(g.set_damping(1, 1, -1.0).is_err());
    assert!(g.set_reflector(16, 0).is_err());
    assert!(g
        .add_source(Source::point(0, 16, Signal::Impulse { at: 0.0 }, 1.0))
        .is_err());
    assert!(g
        .add_source(Source::point(0, 0, Signal::Sine { freq: -1.0 }, 1.0))
        .is_err());
    assert!(g.add_absorbing_border(9, 1.0).is_err());
    assert!(g.set_field(&[0.0; 3]).is_err());
}

/// Position of the largest |u| along the ray from `(cx, cy)` in direction `(dx, dy)`,
/// skipping the first `skip` cells.
fn peak_along(g: &WaveGrid2D, cx: usize, cy: usize, dir: (i64, i64), skip: i64) -> i64 {
    let mut best = (0.0f32, 0i64);
    let mut r = skip;
    loop {
        let (x, y) = (cx as i64 + dir.0 * r, cy as i64 + dir.1 * r);
        if x < 0 || y < 0 || x >= g.nx() as i64 || y >= g.ny() as i64 {
            return best.1;
        }
        let v = g.value(x as usize, y as usize).abs();
        if v > best.0 {
            best = (v, r);
        }
        r += 1;
    }
}

#[test]
fn pulse_reaches_distance_d_after_d_over_c() {
    // A plane pulse (a Gaussian ridge) splits into two halves that travel at c without
    // changing shape: after t = d/c the peaks are d away. Two parameter sets: unit
    // cells, and a physical one (c = 2 m/s, 0.5 m cells). Both axes.
    for (params, cells_per_sec) in [
        (WaveParams::new(1.0, 1.0, 0.5), 1.0f64),
        (WaveParams::new(2.0, 0.5, 0.125), 4.0),
    ] {
        for axis in [0, 1] {
            let (nx, ny) = if axis == 0 { (263, 201) } else { (201, 251) };
            let (cx, cy) = (nx / 2, ny / 2);
            let mut g = WaveGrid2D::new(nx, ny, params).unwrap();
            let ridge: Vec<f32> = (0..nx * ny)
                .map(|k| {
                    let r = if axis == 0 { k % nx } else { k / nx } as f32;
                    let c = if axis == 0 { cx } else { cy } as f32;
                    (-(r - c) * (r - c) / 18.0).exp()
                })
                .collect();
            g.set_field(&ridge).unwrap();
            let mut done = 0u64;
            for d in [30i64, 55, 90] {
                let t = d as f64 / cells_per_sec;
                let steps = (t / params.dt as f64).round() as u64;
                g.run(steps - done);
                done = steps;
                let dirs: [(i64, i64); 2] = if axis == 0 {
                    [(1, 0), (-1, 0)]
                } else {
                    [(0, 1), (0, -1)]
                };
                for dir in dirs {
                    let r = peak_along(&g, cx, cy, dir, d / 2);
                    assert!(
                        (r - d).abs() <= 1,
                        "d = {d}, dir {dir:?}: peak at {r} ({params:?})"
                    );
                }
            }
        }
    }
    // A point pulse spreads as a ring: the same distance in all four directions.
    let mut g = WaveGrid2D::new(121, 121, WaveParams::default()).unwrap();
    g.add_gaussian(60.0, 60.0, 1.5, 1.0);
    g.run(80);
    let r = peak_along(&g, 60, 60, (1, 0), 10);
    for dir in [(-1, 0), (0, 1), (0, -1)] {
        assert_eq!(peak_along(&g, 60, 60, dir, 10), r);
    }
    assert!((r - 40).abs() <= 4, "ring at {r}, front at 40");
}

fn random_box(rng: &mut Rng, nx: usize, ny: usize, params: WaveParams) -> WaveGrid2D {
    let mut g = WaveGrid2D::new(nx, ny, params).unwrap();
    for _ in 0..5 {
        let (x, y) = (rng.f32(5.0, nx as f32 - 5.0), rng.f32(5.0, ny as f32 - 5.0));
        g.add_gaussian(x, y, rng.f32(1.0, 3.0), rng.f32(-1.0, 1.0));
    }
    g
}

#[test]
fn energy_is_conserved_in_a_closed_lossless_box() {
    let mut rng = Rng(14);
    // Uniform medium, awkward sizes.
    let mut g = random_box(&mut rng, 97, 83, WaveParams::new(1.0, 1.0, 0.6));
    let e0 = g.energy();
    assert!(e0 > 0.0);
    let mut worst = 0.0f64;
    for _ in 0..10 {
        g.run(100);
        worst = worst.max((g.energy() - e0).abs() / e0);
    }
    assert!(worst < 1e-3, "relative energy drift {worst}");
    assert!(g.max_abs() > 1e-3, "the field must still be moving");

    // Two speeds and a reflecting wall inside: still lossless.
    let mut g = random_box(&mut rng, 131, 77, WaveParams::new(1.0, 1.0, 0.5));
    for y in 0..77 {
        for x in 70..131 {
            g.set_speed(x, y, 1.35).unwrap();
        }
        if y % 9 != 0 {
            g.set_reflector(40, y).unwrap();
        }
    }
    let e0 = g.energy();
    g.run(1000);
    let drift = (g.energy() - e0).abs() / e0;
    assert!(drift < 1e-3, "relative energy drift {drift} with materials");

    // Damping takes energy out.
    let mut g = random_box(&mut rng, 64, 64, WaveParams::default());
    g.add_absorbing_border(10, 0.5).unwrap();
    let e0 = g.energy();
    g.run(500);
    assert!(g.energy() < 0.5 * e0);
}

/// Squared L2 distance of two grids' interiors over the window `[lo, hi)²`.
fn dist2(a: &WaveGrid2D, ax: usize, b: &WaveGrid2D, bx: usize, n: usize) -> f64 {
    let mut s = 0.0f64;
    for y in 0..n {
        for x in 0..n {
            let d = a.value(ax + x, ax + y) as f64 - b.value(bx + x, bx + y) as f64;
            s += d * d;
        }
    }
    s
}

#[test]
fn absorbing_border_cuts_reflections_by_20_db() {
    // Interior 120² inside a 30-cell sponge (180² in all); a pulse at the centre. After
    // t = 180 the wave reflected by a plain wall at distance 90 is back at the centre.
    let p = WaveParams::new(1.0, 1.0, 0.5);
    let (n, w, steps) = (180usize, 30usize, 360u64);
    let run = |size: usize, sponge: bool| {
        let mut g = WaveGrid2D::new(size, size, p).unwrap();
        if sponge {
            g.add_absorbing_border(w, 0.6).unwrap();
        }
        let c = (size / 2) as f32;
        g.add_gaussian(c, c, 2.0, 1.0);
        g.run(steps);
        g
    };
    let walls = run(n, false);
    let sponge = run(n, true);
    // No reflection reaches the window in time on a 420² grid.
    let big = 420;
    let reference = run(big, false);
    let off = big / 2 - n / 2;
    let refl_walls = dist2(&walls, w, &reference, off + w, n - 2 * w);
    let refl_sponge = dist2(&sponge, w, &reference, off + w, n - 2 * w);
    let db = 10.0 * (refl_walls / refl_sponge).log10();
    assert!(refl_walls > 1e-3, "the walls must reflect ({refl_walls})");
    eprintln!("absorbing border: reflections cut by {db:.1} dB");
    assert!(db >= 20.0, "the sponge cuts reflections by {db:.1} dB only");
}

#[test]
fn sources_drive_the_field() {
    let p = WaveParams::default();
    let mut g = WaveGrid2D::new(40, 30, p).unwrap();
    g.add_source(Source::point(5, 7, Signal::Impulse { at: 0.5 }, 2.5))
        .unwrap();
    g.step();
    assert_eq!(g.value(5, 7), 2.5);
    assert_eq!(g.value(6, 7), 0.0);
    g.step();
    // The next step spreads it by the stencil: c² = 0.25 to each neighbour.
    assert!((g.value(6, 7) - 0.25 * 2.5).abs() < 1e-6);
    // A line source drives every cell of its line at once.
    let mut g = WaveGrid2D::new(40, 30, p).unwrap();
    let line = Source::line((2, 3), (30, 20), Signal::Sine { freq: 0.05 }, 1.0);
    let cells = line.cells().to_vec();
    assert_eq!(cells.first(), Some(&(2, 3)));
    assert_eq!(cells.last(), Some(&(30, 20)));
    assert_eq!(cells.len(), 29);
    g.add_source(line).unwrap();
    g.step();
    let want = (2.0 * std::f32::consts::PI * 0.05 * 0.5).sin();
    for &(x, y) in &cells {
        assert!((g.value(x, y) - want).abs() < 1e-6);
    }
    // Ricker: peaks at its delay.
    let r = Signal::Ricker {
        freq: 2.0,
        delay: 1.0,
    };
    assert_eq!(r.value(1.0, 0.1), 1.0);
    assert!(r.value(0.0, 0.1).abs() < 1e-6);
    // Reset: back to rest, materials kept.
    g.set_reflector(1, 1).unwrap();
    g.reset();
    assert_eq!(g.max_abs(), 0.0);
    assert_eq!(g.steps(), 0);
    assert_eq!(g.material(1, 1), Some(Material::Reflector));
}

/// The update in f64, naive: the reference for the vectorised, parallel f32 one.
fn reference_steps(g: &WaveGrid2D, steps: usize) -> Vec<f64> {
    let (nx, ny, s) = (g.nx(), g.ny(), g.stride());
    let (c2, a, b) = g.coefficients();
    let mut u: Vec<f64> = g.padded().iter().map(|&v| v as f64).collect();
    let mut p: Vec<f64> = g.padded_previous().iter().map(|&v| v as f64).collect();
    for _ in 0..steps {
        let mut q = vec![0.0f64; u.len()];
        for y in 1..=ny {
            for x in 1..=nx {
                let k = y * s + x;
                let lap = u[k - 1] + u[k + 1] + u[k - s] + u[k + s] - 4.0 * u[k];
                q[k] = a[k] as f64 * (2.0 * u[k] + c2[k] as f64 * lap) - b[k] as f64 * p[k];
            }
        }
        p = std::mem::replace(&mut u, q);
    }
    u
}

#[test]
fn update_matches_an_f64_reference_on_random_materials() {
    let mut rng = Rng(2026);
    // Sizes around the parallel threshold and odd widths (vector tails).
    for (nx, ny) in [(37, 23), (129, 131), (203, 97)] {
        let mut g = random_box(&mut rng, nx, ny, WaveParams::new(1.0, 1.0, 0.5));
        for _ in 0..nx * ny / 6 {
            let (x, y) = (rng.below(nx), rng.below(ny));
            match rng.below(3) {
                0 => g.set_speed(x, y, rng.f32(0.3, 1.4)).unwrap(),
                1 => g.set_damping(x, y, rng.f32(0.0, 0.4)).unwrap(),
                _ => g.set_reflector(x, y).unwrap(),
            }
        }
        let want = reference_steps(&g, 200);
        g.run(200);
        let got = g.padded();
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f64, |m, (&g, &w)| m.max((g as f64 - w).abs()));
        assert!(scale > 1e-3);
        assert!(err <= 1e-4 * scale, "{nx}x{ny}: max error {err} of {scale}");
    }
}

#[test]
fn three_d_variant_sanity() {
    let p = WaveParams::new(1.0, 1.0, 0.5);
    let n = 61;
    let c = 30usize;
    let mut g = WaveGrid3D::new(n, n, n, p).unwrap();
    g.add_gaussian([c as f32; 3], 1.5, 1.0);
    let e0 = g.energy();
    g.run(40); // t = 20: the front at distance 20
               // Symmetric in the three axes (up to the rounding of the sum's order).
    let vx = g.value(c + 12, c, c);
    assert!(vx.abs() > 1e-4);
    for v in [
        g.value(c, c + 12, c),
        g.value(c, c, c + 12),
        g.value(c - 12, c, c),
    ] {
        assert!((v - vx).abs() <= 1e-4 * vx.abs(), "{v} vs {vx}");
    }
    // The front: in 3-D a displacement pulse arrives as (r − ct)·f(r − ct)/2r, two lobes
    // of opposite sign around r = ct; their zero crossing is at r = 20 (within a cell).
    let v: Vec<f32> = (0..c).map(|r| g.value(c + r, c, c)).collect();
    let cross = (10..c - 1)
        .filter(|&r| v[r] * v[r + 1] < 0.0)
        .max_by(|&a, &b| {
            let (sa, sb) = (v[a].abs() + v[a + 1].abs(), v[b].abs() + v[b + 1].abs());
            sa.total_cmp(&sb)
        })
        .map(|r| r as f32 + v[r] / (v[r] - v[r + 1]))
        .expect("a sign change along +x");
    assert!((cross - 20.0).abs() <= 1.0, "3-D front at {cross}");
    // Lossless box: energy kept; then a 3-D absorber takes energy out.
    g.run(160);
    let drift = (g.energy() - e0).abs() / e0;
    assert!(drift < 1e-3, "3-D energy drift {drift}");
    let mut d = WaveGrid3D::new(20, 20, 20, p).unwrap();
    d.add_gaussian([10.0; 3], 1.5, 1.0);
    for z in 0..20 {
        for y in 0..20 {
            d.set_material(0, y, z, Material::Absorber(1.0)).unwrap();
            d.set_material(19, y, z, Material::Absorber(1.0)).unwrap();
        }
    }
    let e0 = d.energy();
    d.run(300);
    assert!(d.energy() < 0.5 * e0);
    assert!(d.set_material(20, 0, 0, Material::Reflector).is_err());
}
