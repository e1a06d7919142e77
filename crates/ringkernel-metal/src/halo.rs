//! Halo exchange between tile buffers on a Metal device: core's copy plan
//! ([`HaloExchangeConfig::plan`], shared with the WebGPU and host executors and tested
//! there) recorded as blit copies in one command buffer, so halos move between tiles
//! without a trip through the host.

use crate::sys::{MetalBuffer, MetalDevice};
use ringkernel_core::halo::HaloPlan;
pub use ringkernel_core::halo::{HaloExchangeConfig, HaloRun};
use ringkernel_core::{Error, Result};
use std::sync::Arc;

/// Exchanges halos between tiles held in Metal buffers (each a padded tile of f32,
/// [`HaloExchangeConfig::tile_len`] floats).
///
/// ```no_run
/// use ringkernel_metal::{HaloExchangeConfig, MetalCompute, MetalHaloExchange};
/// # fn demo() -> ringkernel_core::Result<()> {
/// let device = MetalCompute::new()?.device().clone();
/// let config = HaloExchangeConfig::new_2d(8, 8, 64, 64, 1);
/// let tile_buffers = (0..config.tile_count())
///     .map(|_| device.new_buffer(config.tile_len() * 4))
///     .collect::<ringkernel_core::Result<Vec<_>>>()?;
/// let mut exchange = MetalHaloExchange::new(config);
/// exchange.initialize(&device)?;
/// exchange.exchange(&tile_buffers)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MetalHaloExchange {
    config: HaloExchangeConfig,
    ready: Option<(Arc<MetalDevice>, HaloPlan)>,
}

impl MetalHaloExchange {
    /// An exchange of this shape, not yet bound to a device.
    pub fn new(config: HaloExchangeConfig) -> Self {
        MetalHaloExchange {
            config,
            ready: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HaloExchangeConfig {
        &self.config
    }

    /// Plans the exchange for `device`. Errors: [`Error::InvalidArgument`] for an invalid
    /// configuration.
    pub fn initialize(&mut self, device: &Arc<MetalDevice>) -> Result<()> {
        let plan = self.config.plan()?;
        self.ready = Some((device.clone(), plan));
        Ok(())
    }

    /// Copies every tile's halo from its neighbours (one command buffer of blits) and
    /// waits for it.
    ///
    /// Errors: [`Error::InvalidArgument`] before [`initialize`](Self::initialize);
    /// [`Error::ShapeMismatch`] for the wrong number of tiles or a buffer smaller than a
    /// padded tile; [`Error::Device`] when the command buffer fails.
    pub fn exchange(&self, tile_buffers: &[MetalBuffer]) -> Result<()> {
        let (device, plan) = self
            .ready
            .as_ref()
            .ok_or_else(|| Error::invalid("MetalHaloExchange::exchange before initialize"))?;
        if tile_buffers.len() != self.config.tile_count() {
            return Err(Error::shape(format!(
                "{} tile buffers for a grid of {} tiles",
                tile_buffers.len(),
                self.config.tile_count()
            )));
        }
        let bytes = plan.tile_len * 4;
        if let Some(i) = tile_buffers.iter().position(|t| t.len() < bytes) {
            return Err(Error::shape(format!(
                "tile buffer {i} has {} bytes, a padded tile {bytes}",
                tile_buffers[i].len()
            )));
        }
        let mut batch = device.batch()?;
        for r in &plan.runs {
            batch.copy(
                &tile_buffers[r.src_tile as usize],
                r.src_offset as usize * 4,
                &tile_buffers[r.dst_tile as usize],
                r.dst_offset as usize * 4,
                r.len as usize * 4,
            )?;
        }
        batch.commit_and_wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_before_initialize_is_an_error() {
        let ex = MetalHaloExchange::new(HaloExchangeConfig::new_2d(8, 8, 64, 64, 1));
        assert_eq!(ex.config().tile_count(), 64);
        assert!(matches!(ex.exchange(&[]), Err(Error::InvalidArgument(_))));
    }
}
