//! Halo exchange between tile buffers on the GPU: core's copy plan
//! ([`HaloExchangeConfig::plan`]) recorded as buffer-to-buffer copies in one command
//! buffer, so halos move from tile to tile without a trip through the host.
//!
//! Runs within one tile (a periodic axis of one tile) go through a scratch buffer, as
//! WebGPU forbids a copy whose source and destination are the same buffer.

use crate::GpuContext;
use ringkernel_core::halo::HaloPlan;
pub use ringkernel_core::halo::{HaloExchangeConfig, HaloRun};
use ringkernel_core::{Error, Result};
use std::borrow::Borrow;
use std::sync::Arc;

/// Exchanges halos between tiles held in wgpu buffers (each a padded tile of f32,
/// [`HaloExchangeConfig::tile_len`] floats, usages `COPY_SRC | COPY_DST`).
///
/// ```no_run
/// use ringkernel_wgpu::halo::{HaloExchangeConfig, WgpuHaloExchange};
/// use ringkernel_wgpu::{AdapterSelection, GpuContext};
/// # fn demo(tile_buffers: Vec<wgpu::Buffer>) -> ringkernel_core::Result<()> {
/// let ctx = GpuContext::shared(&AdapterSelection::from_env())?;
/// let mut exchange = WgpuHaloExchange::new(HaloExchangeConfig::new_2d(8, 8, 64, 64, 1));
/// exchange.initialize(&ctx)?;
/// exchange.exchange(&tile_buffers)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct WgpuHaloExchange {
    config: HaloExchangeConfig,
    ready: Option<Ready>,
}

#[derive(Debug)]
struct Ready {
    ctx: Arc<GpuContext>,
    plan: HaloPlan,
    /// For runs within one tile: (run index, scratch offset in floats).
    scratch: Option<(wgpu::Buffer, Vec<(usize, u64)>)>,
}

impl WgpuHaloExchange {
    /// An exchange of this shape, not yet bound to a device.
    pub fn new(config: HaloExchangeConfig) -> Self {
        WgpuHaloExchange {
            config,
            ready: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HaloExchangeConfig {
        &self.config
    }

    /// Plans the exchange for `ctx`'s device (and allocates its scratch buffer).
    /// Errors: [`Error::InvalidArgument`] for an invalid configuration.
    pub fn initialize(&mut self, ctx: &Arc<GpuContext>) -> Result<()> {
        let plan = self.config.plan()?;
        let mut same = Vec::new();
        let mut at = 0u64;
        for (i, r) in plan.runs.iter().enumerate() {
            if r.src_tile == r.dst_tile {
                same.push((i, at));
                at += r.len as u64;
            }
        }
        let scratch = (!same.is_empty()).then(|| {
            let buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("ringkernel halo scratch"),
                size: at * 4,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            (buf, same)
        });
        self.ready = Some(Ready {
            ctx: ctx.clone(),
            plan,
            scratch,
        });
        Ok(())
    }

    /// Records one exchange into `encoder`.
    ///
    /// Errors: [`Error::InvalidArgument`] before
    /// [`initialize`](Self::initialize); [`Error::ShapeMismatch`] for the wrong number of
    /// tiles or a buffer smaller than a padded tile.
    pub fn encode<B: Borrow<wgpu::Buffer>>(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        tiles: &[B],
    ) -> Result<()> {
        let r = self
            .ready
            .as_ref()
            .ok_or_else(|| Error::invalid("WgpuHaloExchange::exchange before initialize"))?;
        if tiles.len() != self.config.tile_count() {
            return Err(Error::shape(format!(
                "{} tile buffers for a grid of {} tiles",
                tiles.len(),
                self.config.tile_count()
            )));
        }
        let bytes = (r.plan.tile_len * 4) as u64;
        if let Some(i) = tiles.iter().position(|t| t.borrow().size() < bytes) {
            return Err(Error::shape(format!(
                "tile buffer {i} has {} bytes, a padded tile {bytes}",
                tiles[i].borrow().size()
            )));
        }
        let runs = &r.plan.runs;
        if let Some((scratch, same)) = &r.scratch {
            for &(i, at) in same {
                let run = runs[i];
                let t = tiles[run.src_tile as usize].borrow();
                encoder.copy_buffer_to_buffer(
                    t,
                    run.src_offset as u64 * 4,
                    scratch,
                    at * 4,
                    run.len as u64 * 4,
                );
            }
        }
        for run in runs.iter().filter(|run| run.src_tile != run.dst_tile) {
            encoder.copy_buffer_to_buffer(
                tiles[run.src_tile as usize].borrow(),
                run.src_offset as u64 * 4,
                tiles[run.dst_tile as usize].borrow(),
                run.dst_offset as u64 * 4,
                run.len as u64 * 4,
            );
        }
        if let Some((scratch, same)) = &r.scratch {
            for &(i, at) in same {
                let run = runs[i];
                let t = tiles[run.dst_tile as usize].borrow();
                encoder.copy_buffer_to_buffer(
                    scratch,
                    at * 4,
                    t,
                    run.dst_offset as u64 * 4,
                    run.len as u64 * 4,
                );
            }
        }
        Ok(())
    }

    /// Records one exchange and submits it (returns without waiting; later submissions
    /// to the queue see its result). Errors as [`encode`](Self::encode), and the
    /// device's validation errors.
    pub fn exchange<B: Borrow<wgpu::Buffer>>(&self, tiles: &[B]) -> Result<()> {
        let ctx = &self
            .ready
            .as_ref()
            .ok_or_else(|| Error::invalid("WgpuHaloExchange::exchange before initialize"))?
            .ctx;
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("ringkernel halo exchange"),
            });
        self.encode(&mut enc, tiles)?;
        ctx.queue.submit([enc.finish()]);
        ctx.take_error()
    }
}
