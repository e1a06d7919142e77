//! CUDA: both tile-actor kernels (global memory, register-resident) and the
//! kernel-per-step baseline agree with the CPU engine to 1e-5 relative after 1,000 steps
//! (ignored: needs a GPU).

use ringkernel_wavesim::cuda::CudaWave2D;
use ringkernel_wavesim::scene::CudaPath;
use ringkernel_wavesim::{WaveGrid2D, WaveParams};

fn check(nx: usize, ny: usize, path: CudaPath) {
    let mut g = WaveGrid2D::new(nx, ny, WaveParams::new(1.0, 1.0, 0.5)).unwrap();
    g.add_gaussian(nx as f32 * 0.3, ny as f32 * 0.6, 3.0, 1.0);
    g.add_gaussian(nx as f32 * 0.7, ny as f32 * 0.2, 2.0, -0.5);
    let mut d = CudaWave2D::new(&g, 0).unwrap();
    match path {
        CudaPath::PerStep => d.run_per_step(1000).unwrap(),
        // Two launches (odd counts) to cover the buffer swap and the stamps going on.
        CudaPath::Tiles => {
            d.run_persistent(333).unwrap();
            d.run_persistent(667).unwrap();
        }
        CudaPath::Resident => {
            if d.resident_rows().is_none() {
                eprintln!("SKIPPED: {nx}x{ny} does not fit this GPU's SMs resident");
                return;
            }
            d.run_resident(333).unwrap();
            d.run_resident(667).unwrap();
        }
        CudaPath::ResidentH2 => {
            if !matches!(d.resident_rows(), Some(r) if r <= 4) {
                assert!(d.run_resident_h2(2).is_err());
                eprintln!("SKIPPED: {nx}x{ny} has no two-cell-halo resident kernel");
                return;
            }
            // Odd counts: a period of one step ends the first launch; the second goes on
            // from an odd step count (its stamps from there), then a one-step launch.
            d.run_resident_h2(333).unwrap();
            d.run_resident_h2(666).unwrap();
            d.run_resident_h2(1).unwrap();
        }
    }
    d.synchronize().unwrap();
    g.run(1000);
    let (got, want) = (d.field().unwrap(), g.field());
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(scale > 1e-3);
    assert!(
        err <= 1e-5 * scale,
        "{nx}x{ny} {path:?} (tile {}, resident rows {:?}): max error {err} of {scale}",
        d.tile(),
        d.resident_rows()
    );
}

#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_tile_actors_and_per_step_agree_with_the_cpu() {
    for (nx, ny) in [
        (256, 256),
        (517, 300),
        (1024, 1024),
        (40, 20),
        (512, 512),
        (100, 37),
    ] {
        for path in [
            CudaPath::Tiles,
            CudaPath::PerStep,
            CudaPath::Resident,
            CudaPath::ResidentH2,
        ] {
            check(nx, ny, path);
        }
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn a_grid_too_large_for_the_resident_kernel_is_an_error() {
    let g = WaveGrid2D::new(4096, 4096, WaveParams::default()).unwrap();
    let mut d = CudaWave2D::new(&g, 0).unwrap();
    assert_eq!(d.resident_rows(), None);
    assert!(matches!(
        d.run_resident(10),
        Err(ringkernel_core::Error::InvalidArgument(_))
    ));
}

#[test]
fn materials_are_refused() {
    let mut g = WaveGrid2D::new(64, 64, WaveParams::default()).unwrap();
    g.set_reflector(3, 3).unwrap();
    // Refused before any CUDA call, so this holds with or without a GPU.
    assert!(matches!(
        CudaWave2D::new(&g, 0),
        Err(ringkernel_core::Error::InvalidArgument(_))
    ));
}
