//! The platform layer: the only code that talks to Metal.
//!
//! On Apple targets [`apple`] wraps objc2-metal; everywhere else [`unsupported`]
//! provides the same types, which cannot be constructed (every constructor returns
//! `BackendUnavailable`). Both expose exactly the same names and signatures, so the
//! shared code above (ops, runtime, pool) is compiled and linted on every target.

#[cfg(target_vendor = "apple")]
mod apple;
#[cfg(target_vendor = "apple")]
pub use apple::*;

#[cfg(not(target_vendor = "apple"))]
mod unsupported;
#[cfg(not(target_vendor = "apple"))]
pub use unsupported::*;

use ringkernel_core::Result;
use ringkernel_drain::pool::PoolAllocator;
use std::sync::Arc;

/// Completion callback of a committed command buffer (called on a Metal thread).
pub(crate) type Completion = Box<dyn FnOnce(Result<()>) + Send + 'static>;

/// Allocates shared-storage buffers of one device, for the [`BufferPool`](ringkernel_drain::pool::BufferPool).
#[derive(Debug, Clone)]
pub struct MetalAllocator {
    device: Arc<MetalDevice>,
}

impl MetalAllocator {
    /// An allocator on `device`.
    pub fn new(device: Arc<MetalDevice>) -> Self {
        MetalAllocator { device }
    }
}

impl PoolAllocator for MetalAllocator {
    type Buffer = MetalBuffer;
    fn allocate(&self, bytes: usize) -> Result<MetalBuffer> {
        self.device.new_buffer(bytes)
    }
    fn size_of(buf: &MetalBuffer) -> usize {
        buf.len()
    }
}
