//! The objc2-metal glue. Kept to what the shared code needs: a device and its command
//! queue, shared-storage buffers, pipelines compiled from MSL source, and command
//! buffers with compute and blit encoders.
//!
//! Compiled for Apple targets in CI (`cargo check`/`clippy --target aarch64-apple-darwin`);
//! not executed by CI, which has no Apple GPU.

use super::Completion;
use crate::{device_err, unavailable};
use block2::RcBlock;
use objc2::rc::Retained;
use objc2::runtime::ProtocolObject;
use objc2_foundation::{NSError, NSString};
use objc2_metal::{
    MTLBlitCommandEncoder, MTLBuffer, MTLCommandBuffer, MTLCommandBufferStatus, MTLCommandEncoder,
    MTLCommandQueue, MTLComputeCommandEncoder, MTLComputePipelineState,
    MTLCreateSystemDefaultDevice, MTLDevice, MTLLibrary, MTLResourceOptions, MTLSize,
};
use ringkernel_core::{BackendKind, Error, Result};
use ringkernel_drain::sizing::PipelineLimits;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Mutex;

// Command-line programs on macOS get no Metal device unless CoreGraphics is linked
// (it registers the GPUs with the process).
#[cfg(target_os = "macos")]
#[link(name = "CoreGraphics", kind = "framework")]
extern "C" {}

/// The block type of `addCompletedHandler`.
type CompletionBlock = RcBlock<dyn Fn(NonNull<ProtocolObject<dyn MTLCommandBuffer>>)>;

fn ns_error(e: &NSError) -> String {
    e.localizedDescription().to_string()
}

/// The system default Metal device and the command queue every op and drain pass of
/// this process goes through.
#[derive(Debug)]
pub struct MetalDevice {
    device: Retained<ProtocolObject<dyn MTLDevice>>,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
}

impl MetalDevice {
    /// The system default device (`MTLCreateSystemDefaultDevice`) with a new command
    /// queue. `BackendUnavailable` when the system has no Metal device.
    pub fn system_default() -> Result<Self> {
        let device = MTLCreateSystemDefaultDevice().ok_or_else(|| {
            unavailable("MTLCreateSystemDefaultDevice returned no device (no Metal-capable GPU)")
        })?;
        let queue = device.newCommandQueue().ok_or_else(|| {
            unavailable(format!(
                "{}: could not create a command queue",
                device.name()
            ))
        })?;
        Ok(MetalDevice { device, queue })
    }

    /// The device's name, e.g. "Apple M2 Pro".
    pub fn name(&self) -> String {
        self.device.name().to_string()
    }

    /// Largest threadgroup per dimension (`maxThreadsPerThreadgroup`).
    pub fn max_threads_per_threadgroup(&self) -> [u32; 3] {
        let s = self.device.maxThreadsPerThreadgroup();
        [s.width, s.height, s.depth].map(|v| v.min(u32::MAX as usize) as u32)
    }

    /// Whether CPU and GPU share memory (every Apple-silicon Mac): shared buffers are
    /// then read and written in place, with no copy.
    pub fn has_unified_memory(&self) -> bool {
        self.device.hasUnifiedMemory()
    }

    /// How much memory the GPU can use without hurting performance, in bytes
    /// (`recommendedMaxWorkingSetSize`).
    pub fn recommended_working_set_size(&self) -> u64 {
        self.device.recommendedMaxWorkingSetSize()
    }

    /// Largest buffer the device can allocate, in bytes.
    pub fn max_buffer_length(&self) -> u64 {
        self.device.maxBufferLength() as u64
    }

    /// A new `StorageModeShared` buffer of `bytes` bytes (`bytes > 0`).
    pub fn new_buffer(&self, bytes: usize) -> Result<MetalBuffer> {
        if bytes == 0 {
            return Err(Error::invalid("a Metal buffer needs at least one byte"));
        }
        if bytes as u64 > self.max_buffer_length() {
            return Err(device_err(format!(
                "buffer of {bytes} bytes exceeds the device's maxBufferLength of {}",
                self.max_buffer_length()
            )));
        }
        let raw = self
            .device
            .newBufferWithLength_options(bytes, MTLResourceOptions::StorageModeShared)
            .ok_or_else(|| {
                device_err(format!(
                    "newBufferWithLength({bytes}) failed (out of memory?)"
                ))
            })?;
        Ok(MetalBuffer {
            raw,
            len: bytes,
            host: Mutex::new(()),
        })
    }

    /// Compiles MSL `source` and makes a compute pipeline of function `entry`.
    pub(crate) fn compile(&self, label: &str, source: &str, entry: &str) -> Result<Pipeline> {
        let compile_err = |log: String| Error::Compile {
            backend: BackendKind::Metal,
            log: format!("{label}: {log}"),
        };
        let lib = self
            .device
            .newLibraryWithSource_options_error(&NSString::from_str(source), None)
            .map_err(|e| compile_err(ns_error(&e)))?;
        let function = lib
            .newFunctionWithName(&NSString::from_str(entry))
            .ok_or_else(|| compile_err(format!("no function {entry} in the compiled library")))?;
        let state = self
            .device
            .newComputePipelineStateWithFunction_error(&function)
            .map_err(|e| compile_err(ns_error(&e)))?;
        let limits = PipelineLimits {
            thread_execution_width: state.threadExecutionWidth().min(u32::MAX as usize) as u32,
            max_total_threads: state.maxTotalThreadsPerThreadgroup().min(u32::MAX as usize) as u32,
        };
        Ok(Pipeline { state, limits })
    }

    /// Whether Metal Performance Shaders support the device (always `false` when the
    /// crate is built without its `mps` feature).
    pub fn supports_mps(&self) -> bool {
        #[cfg(feature = "mps")]
        {
            // SAFETY: `self.device` is a valid, retained MTLDevice.
            unsafe { objc2_metal_performance_shaders::MPSSupportsMTLDevice(Some(&self.device)) }
        }
        #[cfg(not(feature = "mps"))]
        {
            false
        }
    }

    /// A new command buffer on the device's queue.
    pub(crate) fn batch(&self) -> Result<CommandBatch> {
        let cmd = self
            .queue
            .commandBuffer()
            .ok_or_else(|| device_err("could not create a command buffer"))?;
        Ok(CommandBatch {
            cmd,
            encoder: Encoder::None,
        })
    }
}

/// A `StorageModeShared` buffer: one allocation that the CPU and GPU both address.
/// Host reads and writes go through `contents()` in place.
#[derive(Debug)]
pub struct MetalBuffer {
    raw: Retained<ProtocolObject<dyn MTLBuffer>>,
    len: usize,
    /// Serialises host copies into and out of the buffer.
    host: Mutex<()>,
}

// SAFETY: Apple documents MTLResource objects (buffers) as thread-safe: they may be
// retained, released and bound to encoders from any thread. The only other access is
// the host copy through `contents()`, which `host` serialises; ordering against GPU
// work is the caller's job (the compute backend waits for queued work first).
unsafe impl Send for MetalBuffer {}
// SAFETY: as above; `&MetalBuffer` only exposes thread-safe getters and the copies
// guarded by `host`.
unsafe impl Sync for MetalBuffer {}

impl MetalBuffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes (never true for a buffer made by this crate).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host address of the contents (valid for [`len`](Self::len) bytes while `self`
    /// lives). Reading or writing through it while GPU work that uses the buffer is in
    /// flight is a data race; wait for that work first.
    pub fn contents(&self) -> *mut u8 {
        self.raw.contents().as_ptr().cast()
    }

    fn check(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::invalid(format!(
                "byte range {offset}..{offset}+{n} outside a Metal buffer of {} bytes",
                self.len
            ))),
        }
    }

    /// Copies `out.len()` bytes from `offset` (in place from shared memory, no staging).
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        let _g = self.host.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `check` keeps the range inside the buffer's `len` bytes, which
        // `contents()` addresses for a shared buffer; `out` is a distinct Rust slice;
        // other host copies are excluded by `host`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.contents().add(offset), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// Copies `data` to `offset` (in place into shared memory, no staging).
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        let _g = self.host.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: as in `read_bytes`, with the copy in the other direction.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.contents().add(offset), data.len())
        };
        Ok(())
    }
}

/// A compiled compute pipeline and its limits.
#[derive(Debug)]
pub(crate) struct Pipeline {
    state: Retained<ProtocolObject<dyn MTLComputePipelineState>>,
    limits: PipelineLimits,
}

impl Pipeline {
    pub(crate) fn limits(&self) -> PipelineLimits {
        self.limits
    }
}

#[derive(Debug)]
enum Encoder {
    None,
    Compute(Retained<ProtocolObject<dyn MTLComputeCommandEncoder>>),
    Blit(Retained<ProtocolObject<dyn MTLBlitCommandEncoder>>),
}

/// A command buffer being recorded: consecutive dispatches share one compute encoder
/// (serial dispatch type, so each sees the previous one's writes).
#[derive(Debug)]
pub(crate) struct CommandBatch {
    cmd: Retained<ProtocolObject<dyn MTLCommandBuffer>>,
    encoder: Encoder,
}

// SAFETY: a command buffer and its encoders may be created on one thread and encoded
// and committed on another, as long as no two threads use them at once. A
// `CommandBatch` is only reachable through `&mut` (or by value), which rules that out.
unsafe impl Send for CommandBatch {}

impl CommandBatch {
    fn end_encoder(&mut self) {
        match std::mem::replace(&mut self.encoder, Encoder::None) {
            Encoder::None => {}
            Encoder::Compute(e) => e.endEncoding(),
            Encoder::Blit(e) => e.endEncoding(),
        }
    }

    fn compute(&mut self) -> Result<&ProtocolObject<dyn MTLComputeCommandEncoder>> {
        if !matches!(self.encoder, Encoder::Compute(_)) {
            self.end_encoder();
            let e = self
                .cmd
                .computeCommandEncoder()
                .ok_or_else(|| device_err("could not create a compute encoder"))?;
            self.encoder = Encoder::Compute(e);
        }
        match &self.encoder {
            Encoder::Compute(e) => Ok(e),
            _ => Err(device_err("compute encoder missing")),
        }
    }

    /// Records one dispatch: buffers at their indices (with byte offsets), small
    /// inline blocks (parameters, buffer sizes) with `setBytes`, `groups` threadgroups
    /// of `threads`.
    pub(crate) fn dispatch(
        &mut self,
        p: &Pipeline,
        buffers: &[(u32, &super::MetalBuffer, usize)],
        inline: &[(u32, &[u8])],
        groups: [u32; 3],
        threads: [u32; 3],
    ) -> Result<()> {
        if let Some((_, buf, offset)) = buffers.iter().find(|(_, b, o)| *o >= b.len()) {
            return Err(Error::invalid(format!(
                "offset {offset} outside a buffer of {} bytes",
                buf.len()
            )));
        }
        if let Some((index, bytes)) = inline.iter().find(|(_, b)| b.is_empty() || b.len() > 4096) {
            return Err(Error::invalid(format!(
                "inline block of {} bytes at index {index} (1..=4096 allowed)",
                bytes.len()
            )));
        }
        let enc = self.compute()?;
        enc.setComputePipelineState(&p.state);
        for (index, buf, offset) in buffers {
            // SAFETY: `buf.raw` is a live buffer of this device, retained by the
            // command buffer until it completes; `offset` was checked to lie inside it;
            // the index comes from the kernel's binding table (below 31, Metal's limit,
            // checked by the plan tests).
            unsafe { enc.setBuffer_offset_atIndex(Some(&buf.raw), *offset, *index as usize) };
        }
        for &(index, bytes) in inline {
            // SAFETY: `bytes` is a live, non-empty slice of at most 4 KiB (the limit of
            // setBytes); Metal copies it before returning.
            unsafe {
                enc.setBytes_length_atIndex(
                    NonNull::from(bytes).cast::<c_void>(),
                    bytes.len(),
                    index as usize,
                )
            };
        }
        let size = |v: [u32; 3]| MTLSize {
            width: v[0] as usize,
            height: v[1] as usize,
            depth: v[2] as usize,
        };
        enc.dispatchThreadgroups_threadsPerThreadgroup(size(groups), size(threads));
        Ok(())
    }

    /// Records a buffer-to-buffer copy (blit), ordered after the dispatches before it.
    pub(crate) fn copy(
        &mut self,
        src: &super::MetalBuffer,
        src_offset: usize,
        dst: &super::MetalBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        src.check(src_offset, bytes)?;
        dst.check(dst_offset, bytes)?;
        if !matches!(self.encoder, Encoder::Blit(_)) {
            self.end_encoder();
            let e = self
                .cmd
                .blitCommandEncoder()
                .ok_or_else(|| device_err("could not create a blit encoder"))?;
            self.encoder = Encoder::Blit(e);
        }
        if let Encoder::Blit(e) = &self.encoder {
            // SAFETY: both ranges were checked to lie inside their buffers; the buffers
            // are retained by the command buffer until it completes.
            unsafe {
                e.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size(
                    &src.raw, src_offset, &dst.raw, dst_offset, bytes,
                )
            };
        }
        Ok(())
    }

    /// Records `out[b] = a[b] · b[b]` (row-major f32, packed) with Metal Performance
    /// Shaders' `MPSMatrixMultiplication`. The caller checked buffer lengths and that
    /// every dimension is non-zero; a shared (non-batched) B is encoded per batch.
    #[cfg(feature = "mps")]
    pub(crate) fn matmul_mps(
        &mut self,
        device: &MetalDevice,
        a: &super::MetalBuffer,
        b: &super::MetalBuffer,
        out: &super::MetalBuffer,
        d: ringkernel_core::compute::MatmulDims,
    ) -> Result<()> {
        use objc2::AllocAnyThread;
        use objc2_metal_performance_shaders::{
            MPSDataType, MPSMatrix, MPSMatrixDescriptor, MPSMatrixMultiplication,
        };
        let f = 4usize;
        let (a_bytes, b_bytes, c_bytes) = (d.m * d.k * f, d.k * d.n * f, d.m * d.n * f);
        a.check(0, d.batch * a_bytes)?;
        b.check(
            0,
            if d.b_batched {
                d.batch * b_bytes
            } else {
                b_bytes
            },
        )?;
        out.check(0, d.batch * c_bytes)?;
        // MPS encodes with its own encoder: close ours first.
        self.end_encoder();
        let desc = |rows: usize, cols: usize, matrices: usize| {
            // SAFETY: plain class constructor; sizes are non-zero and rowBytes/matrixBytes
            // are exact multiples of the element size and of rowBytes.
            unsafe {
                MPSMatrixDescriptor::matrixDescriptorWithRows_columns_matrices_rowBytes_matrixBytes_dataType(
                    rows,
                    cols,
                    matrices,
                    cols * f,
                    rows * cols * f,
                    MPSDataType::Float32,
                )
            }
        };
        let matrix = |buf: &super::MetalBuffer, offset: usize, desc: &MPSMatrixDescriptor| {
            // SAFETY: `buf.raw` is a live buffer retained by the command buffer once
            // encoded; the checks above keep every matrix inside it.
            unsafe {
                MPSMatrix::initWithBuffer_offset_descriptor(
                    MPSMatrix::alloc(),
                    &buf.raw,
                    offset,
                    desc,
                )
            }
        };
        // SAFETY: valid device; dimensions are non-zero (checked by the caller).
        let kernel = unsafe {
            MPSMatrixMultiplication::initWithDevice_transposeLeft_transposeRight_resultRows_resultColumns_interiorColumns_alpha_beta(
                MPSMatrixMultiplication::alloc(),
                &device.device,
                false,
                false,
                d.m,
                d.n,
                d.k,
                1.0,
                0.0,
            )
        };
        let passes: Vec<(usize, usize)> = if d.b_batched {
            vec![(0, d.batch)]
        } else {
            (0..d.batch).map(|i| (i, 1)).collect()
        };
        for (start, count) in passes {
            let left = matrix(a, start * a_bytes, &desc(d.m, d.k, count));
            let right = matrix(b, 0, &desc(d.k, d.n, if d.b_batched { count } else { 1 }));
            let result = matrix(out, start * c_bytes, &desc(d.m, d.n, count));
            // SAFETY: the matrices describe ranges inside live buffers; the command
            // buffer has no open encoder; batch range within every matrix.
            unsafe {
                kernel.setBatchStart(0);
                kernel.setBatchSize(count);
                kernel.encodeToCommandBuffer_leftMatrix_rightMatrix_resultMatrix(
                    &self.cmd, &left, &right, &result,
                );
            }
        }
        Ok(())
    }

    /// Without the `mps` feature there is no MPS path.
    #[cfg(not(feature = "mps"))]
    pub(crate) fn matmul_mps(
        &mut self,
        _device: &MetalDevice,
        _a: &super::MetalBuffer,
        _b: &super::MetalBuffer,
        _out: &super::MetalBuffer,
        _d: ringkernel_core::compute::MatmulDims,
    ) -> Result<()> {
        Err(unavailable("built without the `mps` feature"))
    }

    fn status(cmd: &ProtocolObject<dyn MTLCommandBuffer>) -> Result<()> {
        if cmd.status() == MTLCommandBufferStatus::Error {
            let why = cmd
                .error()
                .map(|e| ns_error(&e))
                .unwrap_or_else(|| "unknown error".into());
            Err(device_err(format!("command buffer failed: {why}")))
        } else {
            Ok(())
        }
    }

    /// Commits; `done` runs on a Metal completion thread when the GPU has finished
    /// (never blocks the caller).
    pub(crate) fn commit(mut self, done: Option<Completion>) {
        self.end_encoder();
        if let Some(done) = done {
            let slot = Mutex::new(Some(done));
            let block: CompletionBlock =
                RcBlock::new(move |cb: NonNull<ProtocolObject<dyn MTLCommandBuffer>>| {
                    // SAFETY: Metal passes the command buffer that completed, alive for
                    // the duration of the handler.
                    let cb = unsafe { cb.as_ref() };
                    let result = Self::status(cb);
                    let f = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(f) = f {
                        f(result);
                    }
                });
            // SAFETY: `block` is a valid block; Metal copies it (Block_copy) before
            // returning, so dropping our reference afterwards is fine. The handler is
            // added before `commit`, as Metal requires.
            unsafe { self.cmd.addCompletedHandler(RcBlock::as_ptr(&block)) };
        }
        self.cmd.commit();
    }

    /// Commits and waits for the GPU (for the synchronous `read`/`synchronize` of the
    /// compute API; never called from the actor runtime).
    pub(crate) fn commit_and_wait(mut self) -> Result<()> {
        self.end_encoder();
        self.cmd.commit();
        self.cmd.waitUntilCompleted();
        Self::status(&self.cmd)
    }
}
