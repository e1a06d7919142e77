//! Stand-ins for the Metal types on targets without Metal. None of them can be
//! constructed: [`MetalDevice::system_default`] is the only way in, and it always
//! returns `BackendUnavailable`, so every method below is statically unreachable.

use super::Completion;
use ringkernel_core::Result;
use ringkernel_drain::sizing::PipelineLimits;
use std::convert::Infallible;

/// The Metal device. Not available on this target: [`system_default`](Self::system_default)
/// always returns `BackendUnavailable`.
#[derive(Debug)]
pub struct MetalDevice {
    never: Infallible,
}

impl MetalDevice {
    /// `BackendUnavailable`: Metal exists only on Apple platforms.
    pub fn system_default() -> Result<Self> {
        Err(crate::unavailable(format!(
            "Metal exists only on Apple platforms (macOS, iOS); this build targets {} ({})",
            std::env::consts::OS,
            std::env::consts::ARCH
        )))
    }
    /// Device name.
    pub fn name(&self) -> String {
        match self.never {}
    }
    /// Largest threadgroup per dimension.
    pub fn max_threads_per_threadgroup(&self) -> [u32; 3] {
        match self.never {}
    }
    /// Whether CPU and GPU share memory.
    pub fn has_unified_memory(&self) -> bool {
        match self.never {}
    }
    /// Recommended working set size in bytes.
    pub fn recommended_working_set_size(&self) -> u64 {
        match self.never {}
    }
    /// Largest buffer in bytes.
    pub fn max_buffer_length(&self) -> u64 {
        match self.never {}
    }
    /// A new shared-storage buffer.
    pub fn new_buffer(&self, _bytes: usize) -> Result<MetalBuffer> {
        match self.never {}
    }
    pub(crate) fn compile(&self, _label: &str, _msl: &str, _entry: &str) -> Result<Pipeline> {
        match self.never {}
    }
    pub(crate) fn batch(&self) -> Result<CommandBatch> {
        match self.never {}
    }
    /// Whether Metal Performance Shaders support the device.
    pub fn supports_mps(&self) -> bool {
        match self.never {}
    }
}

/// A shared-storage Metal buffer. Not available on this target.
#[derive(Debug)]
pub struct MetalBuffer {
    never: Infallible,
}

impl MetalBuffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self.never {}
    }
    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
    /// Host pointer to the contents.
    pub fn contents(&self) -> *mut u8 {
        match self.never {}
    }
    /// Copies bytes out.
    pub fn read_bytes(&self, _offset: usize, _out: &mut [u8]) -> Result<()> {
        match self.never {}
    }
    /// Copies bytes in.
    pub fn write_bytes(&self, _offset: usize, _data: &[u8]) -> Result<()> {
        match self.never {}
    }
}

/// A compiled compute pipeline. Not available on this target.
#[derive(Debug)]
pub(crate) struct Pipeline {
    never: Infallible,
}

impl Pipeline {
    pub(crate) fn limits(&self) -> PipelineLimits {
        match self.never {}
    }
}

/// A command buffer being recorded. Not available on this target.
#[derive(Debug)]
pub(crate) struct CommandBatch {
    never: Infallible,
}

impl CommandBatch {
    pub(crate) fn dispatch(
        &mut self,
        _p: &Pipeline,
        _buffers: &[(u32, &MetalBuffer, usize)],
        _inline: &[(u32, &[u8])],
        _groups: [u32; 3],
        _threads: [u32; 3],
    ) -> Result<()> {
        match self.never {}
    }
    pub(crate) fn copy(
        &mut self,
        _src: &MetalBuffer,
        _so: usize,
        _dst: &MetalBuffer,
        _do: usize,
        _bytes: usize,
    ) -> Result<()> {
        match self.never {}
    }
    pub(crate) fn matmul_mps(
        &mut self,
        _device: &MetalDevice,
        _a: &MetalBuffer,
        _b: &MetalBuffer,
        _out: &MetalBuffer,
        _d: ringkernel_core::compute::MatmulDims,
    ) -> Result<()> {
        match self.never {}
    }
    pub(crate) fn commit(self, _done: Option<Completion>) {
        match self.never {}
    }
    pub(crate) fn commit_and_wait(self) -> Result<()> {
        match self.never {}
    }
}
