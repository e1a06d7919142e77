//! Tiles with halo exchange give the untiled result.

use ringkernel_wavesim::{Signal, Source, TiledWave2D, WaveGrid2D, WaveParams};

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
fn tiled_equals_untiled_with_materials_and_sources() {
    let mut rng = Rng(7);
    // Awkward sizes; tiles from 1 x 1 to many small ones; non-square tiles.
    for (nx, ny, tx, ty) in [
        (63, 45, 3, 5),
        (40, 40, 1, 1),
        (96, 34, 8, 2),
        (21, 77, 7, 11),
    ] {
        let mut g = WaveGrid2D::new(nx, ny, WaveParams::new(1.0, 1.0, 0.5)).unwrap();
        for _ in 0..4 {
            let (x, y) = (rng.f32(0.0, nx as f32), rng.f32(0.0, ny as f32));
            g.add_gaussian(x, y, rng.f32(1.0, 3.0), rng.f32(-1.0, 1.0));
        }
        for _ in 0..nx * ny / 8 {
            let (x, y) = (rng.below(nx), rng.below(ny));
            match rng.below(3) {
                0 => g.set_speed(x, y, rng.f32(0.3, 1.4)).unwrap(),
                1 => g.set_damping(x, y, rng.f32(0.0, 0.3)).unwrap(),
                _ => g.set_reflector(x, y).unwrap(),
            }
        }
        let src = Source::line(
            (0, ny / 2),
            (nx - 1, ny / 3),
            Signal::Sine { freq: 0.07 },
            0.2,
        );
        g.add_source(src).unwrap();
        g.run(3); // split a grid that has already run
        let mut t = TiledWave2D::from_grid(&g, tx, ty).unwrap();
        assert_eq!(t.config().tile_count(), tx * ty);
        for _ in 0..4 {
            g.run(250);
            t.run(250);
            assert_eq!(
                t.field(),
                g.field(),
                "{nx}x{ny} in {tx}x{ty} tiles after {}",
                g.steps()
            );
        }
        assert_eq!(t.steps(), 1003);
        assert!(g.max_abs() > 1e-3);
    }
    let g = WaveGrid2D::new(30, 20, WaveParams::default()).unwrap();
    assert!(TiledWave2D::from_grid(&g, 4, 2).is_err());
    assert!(TiledWave2D::from_grid(&g, 0, 2).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tile_actors_through_k2k_equal_the_untiled_grid() {
    let mut rng = Rng(99);
    for (nx, ny, tx, ty, steps) in [
        (60, 36, 4, 3, 300),
        (33, 50, 3, 5, 1000),
        (16, 16, 1, 1, 10),
    ] {
        let mut g = WaveGrid2D::new(nx, ny, WaveParams::new(1.0, 1.0, 0.5)).unwrap();
        for _ in 0..3 {
            let (x, y) = (rng.f32(0.0, nx as f32), rng.f32(0.0, ny as f32));
            g.add_gaussian(x, y, rng.f32(1.0, 3.0), rng.f32(-1.0, 1.0));
        }
        for _ in 0..nx * ny / 8 {
            let (x, y) = (rng.below(nx), rng.below(ny));
            match rng.below(3) {
                0 => g.set_speed(x, y, rng.f32(0.3, 1.4)).unwrap(),
                1 => g.set_damping(x, y, rng.f32(0.0, 0.3)).unwrap(),
                _ => g.set_reflector(x, y).unwrap(),
            }
        }
        let field = ringkernel_wavesim::run_tile_actors(&g, tx, ty, steps)
            .await
            .unwrap();
        g.run(steps);
        assert_eq!(
            field,
            g.field(),
            "{nx}x{ny} as {tx}x{ty} tile actors, {steps} steps"
        );
    }
    let mut g = WaveGrid2D::new(16, 16, WaveParams::default()).unwrap();
    assert!(ringkernel_wavesim::run_tile_actors(&g, 3, 1, 5)
        .await
        .is_err());
    g.add_source(Source::point(1, 1, Signal::Sine { freq: 0.1 }, 1.0))
        .unwrap();
    assert!(ringkernel_wavesim::run_tile_actors(&g, 2, 2, 5)
        .await
        .is_err());
}
