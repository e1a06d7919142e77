//! The Metal README's halo-exchange example, compiled as written after its `use` line,
//! and run: on Apple with a Metal device it exchanges the halos of 8 × 8 tiles of 64 × 64
//! cells and checks them against core's host exchange; everywhere else
//! `is_metal_available()` is false and the test returns early.
//!
//! The example presumes a `device` and the `tile_buffers` (made here, filled with
//! distinct values).

use ringkernel_metal::{HaloExchangeConfig, MetalHaloExchange};

use ringkernel_core::halo::HaloExchange;
use ringkernel_metal::{is_metal_available, MetalBuffer, MetalCompute, MetalDevice};
use std::sync::Arc;

/// The example's lines, unchanged, in a function with what it presumes (its
/// `&tile_buffers` borrows a slice here: allowed as written).
#[allow(clippy::needless_borrow)]
fn halo_usage(
    device: Arc<MetalDevice>,
    tile_buffers: &[MetalBuffer],
) -> Result<(), Box<dyn std::error::Error>> {
    // Create 2D grid with halo exchange
    let config = HaloExchangeConfig::new_2d(
        8, 8, // grid: 8x8 tiles
        64, 64, // tile: 64x64 cells
        1,  // halo: 1 cell
    );
    let mut exchange = MetalHaloExchange::new(config);
    // Initialize on device
    exchange.initialize(&device)?;
    // Perform exchange cycle
    exchange.exchange(&tile_buffers)?;
    Ok(())
}

#[test]
fn metal_halo_exchange_runs_as_written() {
    if !is_metal_available() {
        eprintln!("Metal not available: the example returns early");
        assert!(MetalCompute::new().is_err());
        return;
    }
    let device = MetalCompute::new().unwrap().device().clone();
    let config = HaloExchangeConfig::new_2d(8, 8, 64, 64, 1);
    let len = config.tile_len();
    let host: Vec<Vec<f32>> = (0..config.tile_count())
        .map(|t| (0..len).map(|i| (t * 10_000 + i) as f32).collect())
        .collect();
    let tile_buffers: Vec<MetalBuffer> = host
        .iter()
        .map(|v| {
            let b = device.new_buffer(len * 4).unwrap();
            b.write_bytes(0, bytemuck::cast_slice(v)).unwrap();
            b
        })
        .collect();
    halo_usage(device, &tile_buffers).unwrap();
    let mut want = host;
    HaloExchange::new(config)
        .unwrap()
        .exchange(&mut want)
        .unwrap();
    for (t, b) in tile_buffers.iter().enumerate() {
        let mut got = vec![0u8; len * 4];
        b.read_bytes(0, &mut got).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u8, f32>(&got),
            &want[t][..],
            "tile {t}"
        );
    }
}
