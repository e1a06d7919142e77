//! The GPU halo exchange moves exactly what core's host exchange moves (on lavapipe in
//! CI; skipped without an adapter).

use ringkernel_core::halo::HaloExchange;
use ringkernel_core::Error;
use ringkernel_wgpu::{AdapterSelection, GpuContext, HaloExchangeConfig, WgpuHaloExchange};
use wgpu::util::DeviceExt;

fn check(ctx: &std::sync::Arc<GpuContext>, config: HaloExchangeConfig) {
    let len = config.tile_len();
    // Distinct values everywhere, halos included (what is not exchanged must stay).
    let host: Vec<Vec<f32>> = (0..config.tile_count())
        .map(|t| (0..len).map(|i| (t * 100_000 + i) as f32 * 0.5).collect())
        .collect();
    let bufs: Vec<wgpu::Buffer> = host
        .iter()
        .map(|v| {
            ctx.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("tile"),
                    contents: bytemuck::cast_slice(v),
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                })
        })
        .collect();
    let mut exchange = WgpuHaloExchange::new(config);
    assert!(
        exchange.exchange(&bufs).is_err(),
        "exchange before initialize"
    );
    exchange.initialize(ctx).unwrap();
    exchange.exchange(&bufs).unwrap();
    let mut want = host.clone();
    HaloExchange::new(config)
        .unwrap()
        .exchange(&mut want)
        .unwrap();
    for (t, b) in bufs.iter().enumerate() {
        let got: Vec<f32> =
            bytemuck::cast_slice(&ctx.read_bytes(b, 0, len as u64 * 4).unwrap()).to_vec();
        assert_eq!(got, want[t], "tile {t} of {config:?}");
    }
    assert!(matches!(
        exchange.exchange(&bufs[1..]),
        Err(Error::ShapeMismatch(_))
    ));
}

#[test]
fn gpu_exchange_matches_the_host_exchange() {
    let ctx = match GpuContext::shared(&AdapterSelection::from_env()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIPPED: no WebGPU adapter: {e}");
            return;
        }
    };
    check(&ctx, HaloExchangeConfig::new_2d(3, 2, 5, 4, 1));
    check(
        &ctx,
        HaloExchangeConfig::new_2d(1, 2, 6, 3, 2).with_periodic(true),
    ); // same-tile runs
    check(&ctx, HaloExchangeConfig::new_3d([2, 2, 3], [3, 4, 2], 1));
    let mut bad = WgpuHaloExchange::new(HaloExchangeConfig::new_2d(0, 2, 6, 3, 1));
    assert!(bad.initialize(&ctx).is_err());
}
