//! [`CudaCompute`]: every [`ComputeBackend`] op on one CUDA device.
//!
//! The kernels are in `kernels/ops.cu`, compiled once by NVRTC for the device's own
//! architecture (and cached on disk, see [`crate::nvrtc`]). Matmul goes through cuBLAS
//! (`cublasSgemmStridedBatched`, row-major through the transpose identity
//! `Cᵀ = Bᵀ·Aᵀ`), in strict FP32 unless [`CudaCompute::set_tf32`] asks for TF32.
//!
//! All work is queued on one non-blocking stream, in order; `read` and `synchronize`
//! wait for it. Buffers are allocated stream-ordered (`cuMemAllocAsync`) and freed the
//! same way when the last reference goes, so a buffer dropped while a kernel still uses
//! it stays valid until that kernel has run.
//!
//! On sm_90 and newer the op kernels go out with programmatic dependent launch: each
//! waits for the kernel before it as its first instruction, so only the launch overlaps
//! (a decode step is hundreds of small kernels). `RINGKERNEL_CUDA_PDL=0` launches them
//! plainly, for measuring the difference.

use crate::driver::{
    dev_err, ensure_cublas, ensure_nvrtc, Device, DeviceMemory, MappedMemory, Module, Stream,
};
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as cu, sys};
use ringkernel_core::compute::{
    checks, downcast, AttentionDims, BinaryOp, BroadcastDims, BufferRef, ComputeBackend, DType,
    DeviceBuffer, EmbeddingDims, KvDims, MatmulDims, PendingRead, QMatmulDims, ReduceDims,
    ReduceOp, RopeDims, UnaryOp, WeightFormat,
};
use ringkernel_core::util::lock;
use ringkernel_core::{BackendKind, Error, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

mod model;
mod program;
pub use program::CudaProgram;

/// Source of the op kernels (`ops.cu`, then the model ops of `model.cu`, which use its
/// helpers).
pub(crate) const OPS_SRC: &str = concat!(
    include_str!("../kernels/ops.cu"),
    include_str!("../kernels/model.cu"),
    include_str!("../kernels/program.cu")
);

/// Largest `head_dim` the fused attention kernel handles (32 lanes × 8).
const FUSED_MAX_HEAD_DIM: usize = 256;
/// Largest grid y/z dimension.
const MAX_GRID_YZ: usize = 65535;

struct Func(sys::CUfunction);
// SAFETY: a CUfunction handle is immutable and usable from any thread with the context
// current; the module it belongs to outlives it (both live in ComputeInner).
unsafe impl Send for Func {}
// SAFETY: as above.
unsafe impl Sync for Func {}

struct Cublas(blas_sys::cublasHandle_t);
// SAFETY: the handle is only used under the Mutex in ComputeInner.
unsafe impl Send for Cublas {}

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: destroys the handle created in `cublas`, exactly once.
        unsafe {
            let _ = blas::destroy_handle(self.0);
        }
    }
}

pub(crate) struct ComputeInner {
    // Field order matters for Drop: handles and module before the stream and device.
    cublas: Mutex<Option<Cublas>>,
    funcs: Mutex<HashMap<String, Arc<Func>>>,
    module: Module,
    /// Scratch of the split decode attention (`rk_rope_attention_kv_split`: the blocks'
    /// partial results and a counter per head), allocated with the backend so that a
    /// captured graph can use it; freed in the order of `stream`.
    attn_scratch: DeviceMemory,
    /// Pinned buffers and events of finished `read_async`s, for the next ones.
    staging: Mutex<Vec<Staging>>,
    stream: Arc<Stream>,
    dev: Arc<Device>,
    tf32: AtomicBool,
    /// Launch the op kernels with programmatic dependent launch (see `pdl_wanted`).
    pdl: bool,
    /// The device byte ranges (start, length) that the last work queued on the stream
    /// writes, when that work is an op kernel that declared them
    /// ([`CudaCompute::launch_writing`]); `None` after anything else (a copy, cuBLAS,
    /// NCCL, a graph, a program, a kernel without the declaration, the raw stream handed
    /// out). An op kernel launched next may load what that work does not write before
    /// its programmatic-dependent-launch wait (`early`, see `rk_pdl_wait` in
    /// `kernels/ops.cu`): the kernel ahead of that one has finished by then.
    last_writes: Mutex<Option<Vec<(u64, u64)>>>,
    /// Early loads allowed at all: `RINGKERNEL_CUDA_EARLY` not `0` (the switch exists to
    /// measure with and without them).
    early: bool,
    /// The program being recorded, if any (see `compute/program.rs`), and whether there
    /// is one (checked first, without the lock, by every op).
    recording: Mutex<Option<program::Recording>>,
    recording_any: AtomicBool,
    /// The grid size of the chained feed-forward kernel (`rk_ffn_qkv_*`) on this backend,
    /// 0 before the first: its blocks meet on one count in the scratch, which only works
    /// for one size (see `model::claim_chain_grid`).
    chain_grid: AtomicU32,
}

/// A pinned host buffer and an event: where one `read_async` lands and how its reader
/// knows it has.
struct Staging {
    host: MappedMemory,
    event: sys::CUevent,
    dev: Arc<Device>,
}

// SAFETY: the event handle is only used through the driver API, which is thread-safe;
// the host memory is written by the copy and read after the event, one reader at a time
// (a Staging is owned by one pending read or sits in the pool).
unsafe impl Send for Staging {}

impl Staging {
    /// Kept at most this many in the pool.
    const POOL: usize = 8;

    fn new(dev: &Arc<Device>, bytes: usize) -> Result<Staging> {
        let host = MappedMemory::new(dev, bytes.max(256))?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the context is bound (MappedMemory::new bound it); the out pointer is a
        // local.
        unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        }
        .result()
        .map_err(dev_err("cuEventCreate"))?;
        Ok(Staging {
            host,
            event,
            dev: dev.clone(),
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: the event was created by Staging::new and is destroyed once, here.
            // A pending read dropped without `wait` may still have its copy going into
            // `host`, which is freed right after this body: waiting for the event first
            // keeps the copy off freed memory (an event never recorded, or already
            // waited for, returns at once).
            unsafe {
                let _ = sys::cuEventSynchronize(self.event);
                let _ = sys::cuEventDestroy_v2(self.event);
            }
        }
    }
}

/// Threads of `rk_argmax`'s one block (`ARGMAX_THREADS` in `kernels/ops.cu`).
pub(super) const ARGMAX_THREADS: u32 = 1024;

impl ComputeInner {
    /// The stream, for work other than an op kernel that declares its writes: what the
    /// next op kernel may load early is no longer known (see `last_writes`).
    fn stream_op(&self) -> sys::CUstream {
        *lock(&self.last_writes) = None;
        self.stream.raw
    }
}

/// Whether a kernel launched with programmatic dependent launch (`pdl`) may load the
/// device byte ranges `reads` (start, length) before its wait, after work that writes
/// `last_writes` (`None`: unknown, anything).
fn may_load_early(pdl: bool, last_writes: Option<&[(u64, u64)]>, reads: &[(u64, u64)]) -> bool {
    let overlaps = |(a, an): (u64, u64), (b, bn): (u64, u64)| a < b + bn && b < a + an;
    pdl && last_writes
        .is_some_and(|w| !w.iter().any(|&wr| reads.iter().any(|&rd| overlaps(wr, rd))))
}

/// Whether the op kernels go out with programmatic dependent launch: sm_90 or newer, a
/// driver whose stream capture keeps the programmatic edges in a graph (12.3), and
/// `RINGKERNEL_CUDA_PDL` not `0` (the switch exists to measure with and without it). The
/// kernels wait for their predecessor first thing (`rk_pdl_enter` in `kernels/ops.cu`),
/// so what changes is only that a kernel's launch overlaps the one before it.
fn pdl_wanted(info: &crate::DeviceInfo) -> bool {
    info.cc.0 >= 9
        && info.driver_version >= 12030
        && std::env::var("RINGKERNEL_CUDA_PDL").map_or(true, |v| v != "0")
}

/// CUDA implementation of [`ComputeBackend`] on one device.
///
/// ```no_run
/// use ringkernel_core::compute::{ComputeBackend, BinaryOp};
/// let gpu = ringkernel_cuda::CudaCompute::new(0)?;
/// let a = gpu.upload(&[1.0, 2.0, 3.0])?;
/// let b = gpu.upload(&[10.0, 20.0, 30.0])?;
/// let out = gpu.alloc(3)?;
/// gpu.binary(BinaryOp::Add, &*a, &*b, &*out, 3)?;
/// let mut host = [0.0f32; 3];
/// gpu.read(&*out, 0, &mut host)?;
/// assert_eq!(host, [11.0, 22.0, 33.0]);
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
#[derive(Clone)]
pub struct CudaCompute {
    inner: Arc<ComputeInner>,
}

impl std::fmt::Debug for CudaCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCompute")
            .field("device", &self.inner.dev.info.name)
            .finish()
    }
}

/// A device-resident f32 buffer of [`CudaCompute`].
pub struct CudaBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    owner: Arc<ComputeInner>,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("len", &self.len)
            .finish()
    }
}

impl CudaBuffer {
    /// The device address (for interoperation with other CUDA code).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

ringkernel_core::impl_device_buffer!(CudaBuffer, BackendKind::Cuda);

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.owner.dev.bind().is_ok() {
            // SAFETY: ptr was allocated by malloc_async on this stream; freeing it in
            // stream order waits for the work queued before, which may still use it.
            unsafe {
                let _ = cu::free_async(self.ptr, self.owner.stream.raw);
            }
        }
    }
}

fn arg<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

fn grid_1d(n: usize, threads: u32, sms: u32) -> u32 {
    // Grid-stride kernels: enough blocks to fill the GPU several times over, no more.
    let want = n.div_ceil(threads as usize).max(1);
    want.min(sms as usize * 32).max(1) as u32
}

impl CudaCompute {
    /// Opens device `ordinal` and compiles (or loads from the cache) the op kernels.
    /// [`Error::BackendUnavailable`] without a driver, a GPU or NVRTC;
    /// [`Error::InvalidArgument`] while persistent kernels run in this process (a module
    /// load would wait for them: create the compute backend first).
    pub fn new(ordinal: usize) -> Result<Self> {
        let dev = Device::open(ordinal)?;
        ensure_nvrtc()?;
        let cubin =
            crate::nvrtc::compile_cubin(OPS_SRC, "ops", dev.info.cc, dev.info.driver_version)?;
        let module = dev.load_module(&cubin)?;
        let stream = Arc::new(dev.new_stream()?);
        let attn_scratch = DeviceMemory::zeroed(&stream, model::ATTN_SCRATCH_BYTES)?;
        let pdl = pdl_wanted(&dev.info);
        Ok(CudaCompute {
            inner: Arc::new(ComputeInner {
                cublas: Mutex::new(None),
                funcs: Mutex::new(HashMap::new()),
                module,
                attn_scratch,
                staging: Mutex::new(Vec::new()),
                stream,
                dev,
                tf32: AtomicBool::new(false),
                pdl,
                last_writes: Mutex::new(None),
                early: std::env::var("RINGKERNEL_CUDA_EARLY").map_or(true, |v| v != "0"),
                recording: Mutex::new(None),
                recording_any: AtomicBool::new(false),
                chain_grid: AtomicU32::new(0),
            }),
        })
    }

    /// Allows (true) or forbids (false, the default) TF32 tensor-core math in matmul:
    /// about 8× faster on Ampere and later, with about 1e-3 relative error.
    pub fn set_tf32(&self, allow: bool) {
        self.inner.tf32.store(allow, Ordering::Relaxed);
    }

    /// Whether TF32 is allowed in matmul.
    pub fn tf32(&self) -> bool {
        self.inner.tf32.load(Ordering::Relaxed)
    }

    /// Facts about the device.
    pub fn device_info(&self) -> &crate::DeviceInfo {
        &self.inner.dev.info
    }

    /// The raw stream all ops are queued on (for graph capture and interop). The next op
    /// assumes that work queued on it wrote every buffer (so it loads nothing before the
    /// work ahead of it is done): call this again before each op that follows work you
    /// queue on the stream yourself.
    pub fn raw_stream(&self) -> sys::CUstream {
        self.inner.stream_op()
    }

    /// Records every op `f` queues into a CUDA graph instead of running it, and returns
    /// the graph ready to be replayed with [`CudaGraph::launch`]. Buffers used by the
    /// ops must outlive the graph. Ops that allocate temporaries (reductions, dot,
    /// unfused attention) and `read` cannot be captured.
    pub fn capture(&self, f: impl FnOnce(&CudaCompute) -> Result<()>) -> Result<CudaGraph> {
        let inner = &self.inner;
        inner.dev.bind()?;
        // SAFETY: valid stream; thread-local capture mode so other threads' CUDA calls
        // are unaffected.
        unsafe {
            cu::stream::begin_capture(
                inner.stream_op(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(dev_err("begin capture"))?;
        let r = f(self);
        // SAFETY: ends the capture begun above on the same stream.
        let graph =
            unsafe { cu::stream::end_capture(inner.stream_op()) }.map_err(dev_err("end capture"));
        r?;
        let graph = graph?;
        // SAFETY: graph was just captured and is valid.
        let exec = unsafe { cu::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
        let exec = match exec {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: destroys the graph captured above.
                unsafe {
                    let _ = cu::graph::destroy(graph);
                }
                return Err(Error::Device(format!("CUDA graph instantiate: {e}")));
            }
        };
        Ok(CudaGraph {
            graph,
            exec,
            owner: self.inner.clone(),
        })
    }

    fn func(&self, name: &str) -> Result<Arc<Func>> {
        let mut funcs = self
            .inner
            .funcs
            .lock()
            .map_err(|_| Error::Device("function table poisoned".into()))?;
        if let Some(f) = funcs.get(name) {
            return Ok(f.clone());
        }
        let f = Arc::new(Func(self.inner.module.function(name)?));
        funcs.insert(name.to_string(), f.clone());
        Ok(f)
    }

    fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.refuse_in_program(name)?;
        let f = self.func(name)?;
        self.inner.dev.bind()?;
        let launched = if self.inner.pdl {
            // SAFETY: an all-zero CUlaunchAttribute is a valid plain C struct (id 0,
            // value bytes zero); both fields are set below.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block.0,
                blockDimY: block.1,
                blockDimZ: block.2,
                sharedMemBytes: smem,
                hStream: self.inner.stream.raw,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as for cuLaunchKernel below; `config` and `attr` outlive the call,
            // which copies them. Every kernel of the module begins with rk_pdl_enter, so
            // none touches memory before the kernel ahead of it in the stream is done.
            unsafe { sys::cuLaunchKernelEx(&config, f.0, args.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
        } else {
            // SAFETY: `f` is a kernel of our module whose parameter list matches `args`
            // (each call site passes pointers to locals of the exact C types, in order);
            // every buffer pointer was length-checked by the caller against what the
            // kernel touches; the stream is valid.
            unsafe { cu::launch_kernel(f.0, grid, block, smem, self.inner.stream.raw, args) }
        };
        // An undeclared kernel may write anything (see `last_writes`).
        *lock(&self.inner.last_writes) = None;
        launched.map_err(|e| Error::Device(format!("CUDA launch of {name}: {e}")))
    }

    /// [`launch`](Self::launch) of an op kernel that writes only the device byte ranges
    /// `writes` (start, length): the op kernel launched after it may load anything else
    /// early ([`early_loads`](Self::early_loads)).
    fn launch_writing(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &mut [*mut c_void],
        writes: &[(u64, u64)],
    ) -> Result<()> {
        self.launch(name, grid, block, 0, args)?;
        *lock(&self.inner.last_writes) = Some(writes.to_vec());
        Ok(())
    }

    /// The device byte range (start, length) of `b`, a buffer of this backend.
    fn span(&self, b: &dyn DeviceBuffer) -> Result<(u64, u64)> {
        let c = self.buf(b)?;
        Ok((c.ptr, c.len as u64 * 4))
    }

    /// Whether an op kernel queued next may load the device byte ranges `reads` (start,
    /// length) before its programmatic-dependent-launch wait: only when the work ahead
    /// of it is an op kernel that declared its writes and writes none of them (see
    /// `last_writes`). 1 or 0, the kernels' `early` parameter.
    fn early_loads(&self, reads: &[(u64, u64)]) -> i32 {
        let known = lock(&self.inner.last_writes);
        i32::from(may_load_early(
            self.inner.pdl && self.inner.early,
            known.as_deref(),
            reads,
        ))
    }

    /// The device address of `b`, checked to be a buffer of this backend (for the NCCL
    /// glue, which queues on this backend's stream).
    pub(crate) fn device_ptr_of(&self, b: &dyn DeviceBuffer) -> Result<u64> {
        Ok(self.buf(b)?.ptr)
    }

    /// The device addresses of `bufs`, in order, each checked as by
    /// [`device_ptr_of`](Self::device_ptr_of) (a foreign buffer is an error before any
    /// other check of an op looks at the buffers' identities).
    pub(crate) fn device_ptrs(&self, bufs: &[&dyn DeviceBuffer]) -> Result<Vec<u64>> {
        bufs.iter().map(|b| self.device_ptr_of(*b)).collect()
    }

    /// Whether two handles share one backend (one device, context and stream).
    pub(crate) fn same_backend(&self, other: &CudaCompute) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn buf<'a>(&self, b: &'a dyn DeviceBuffer) -> Result<&'a CudaBuffer> {
        let cb = downcast::<CudaBuffer>(b, BackendKind::Cuda)?;
        if !Arc::ptr_eq(&cb.owner, &self.inner) {
            return Err(Error::Device(
                "buffer belongs to another CUDA device or context".into(),
            ));
        }
        Ok(cb)
    }

    fn sms(&self) -> u32 {
        self.inner.dev.info.sm_count.max(1)
    }

    fn raw_alloc(&self, len: usize) -> Result<CudaBuffer> {
        self.refuse_in_program("alloc")?;
        self.inner.dev.bind()?;
        if len == 0 {
            return Ok(CudaBuffer {
                ptr: 0,
                len: 0,
                owner: self.inner.clone(),
            });
        }
        let bytes = len
            .checked_mul(4)
            .ok_or_else(|| Error::invalid("allocation size overflows"))?;
        // SAFETY: stream-ordered allocation of `bytes` on our valid stream.
        let ptr = unsafe { cu::malloc_async(self.inner.stream.raw, bytes) }
            .map_err(dev_err("cuMemAllocAsync"))?;
        Ok(CudaBuffer {
            ptr,
            len,
            owner: self.inner.clone(),
        })
    }

    fn with_cublas<R>(&self, f: impl FnOnce(blas_sys::cublasHandle_t) -> Result<R>) -> Result<R> {
        self.refuse_in_program("cuBLAS")?;
        ensure_cublas()?;
        let mut guard = self
            .inner
            .cublas
            .lock()
            .map_err(|_| Error::Device("cuBLAS handle poisoned".into()))?;
        if guard.is_none() {
            self.inner.dev.bind()?;
            let h =
                blas::create_handle().map_err(|e| Error::Device(format!("cublasCreate: {e:?}")))?;
            let h = Cublas(h);
            // SAFETY: valid handle and stream.
            unsafe { blas::set_stream(h.0, self.inner.stream.raw as blas_sys::cudaStream_t) }
                .map_err(|e| Error::Device(format!("cublasSetStream: {e:?}")))?;
            *guard = Some(h);
        }
        let h = guard
            .as_ref()
            .map(|h| h.0)
            .ok_or_else(|| Error::Device("cuBLAS handle missing".into()))?;
        self.inner.dev.bind()?;
        f(h)
    }

    fn elementwise_grid(&self, len: usize) -> u32 {
        grid_1d(len.div_ceil(4), 256, self.sms())
    }

    fn row_threads(cols: usize) -> u32 {
        let per = if cols.is_multiple_of(4) {
            cols / 4
        } else {
            cols
        };
        let t = per.div_ceil(4).div_ceil(32) * 32;
        t.clamp(64, 1024) as u32
    }

    /// Dynamic shared memory for caching a row of `cols` floats, or 0 when it does not fit.
    fn row_cache_bytes(&self, name: &str, cols: usize) -> Result<u32> {
        let bytes = cols.saturating_mul(4);
        let limit = (self.inner.dev.info.max_smem_optin as usize)
            .saturating_sub(1024)
            .min(64 * 1024);
        if bytes == 0 || bytes > limit {
            return Ok(0);
        }
        if bytes > 48 * 1024 {
            let f = self.func(name)?;
            // SAFETY: valid function; raises its dynamic shared memory limit within the
            // device's opt-in maximum.
            unsafe {
                cu::function::set_function_attribute(
                    f.0,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
            }
            .map_err(dev_err("set shared memory limit"))?;
        }
        Ok(bytes as u32)
    }

    fn reduce_impl(
        &self,
        op: ReduceOp,
        x: &CudaBuffer,
        out: &CudaBuffer,
        dims: ReduceDims,
    ) -> Result<()> {
        let (kname, scale) = match op {
            ReduceOp::Sum => ("sum", 1.0f32),
            ReduceOp::Mean => ("sum", 1.0 / dims.axis as f32),
            ReduceOp::Max => ("max", 1.0),
            ReduceOp::Min => ("min", 1.0),
        };
        let sms = self.sms() as usize;
        if dims.inner > 1 {
            let total = dims.outer * dims.inner;
            let (mut px, mut po) = (x.ptr, out.ptr);
            let (mut o, mut a, mut i, mut s) = (
                dims.outer as u64,
                dims.axis as u64,
                dims.inner as u64,
                scale,
            );
            return self.launch(
                &format!("rk_reduce_cols_{kname}"),
                (grid_1d(total, 256, self.sms()), 1, 1),
                (256, 1, 1),
                0,
                &mut [
                    arg(&mut px),
                    arg(&mut po),
                    arg(&mut o),
                    arg(&mut a),
                    arg(&mut i),
                    arg(&mut s),
                ],
            );
        }
        let threads = 256u32;
        if dims.outer >= 2 * sms || dims.axis < 65536 || dims.outer > MAX_GRID_YZ {
            let (mut px, mut po) = (x.ptr, out.ptr);
            let (mut r, mut c, mut s) = (dims.outer as u64, dims.axis as u64, scale);
            return self.launch(
                &format!("rk_reduce_rows_{kname}"),
                ((dims.outer.min(1 << 30)) as u32, 1, 1),
                (threads, 1, 1),
                0,
                &mut [
                    arg(&mut px),
                    arg(&mut po),
                    arg(&mut r),
                    arg(&mut c),
                    arg(&mut s),
                ],
            );
        }
        // Few long rows: split each row over several blocks, then reduce the partials.
        let mut parts = (sms * 8).div_ceil(dims.outer).min(dims.axis / 4096).max(1);
        // Keep chunks a multiple of 4 floats so the vector path stays aligned.
        while parts > 1 && !dims.axis.div_ceil(parts).is_multiple_of(4) {
            parts -= 1;
        }
        let partial = self.raw_alloc(dims.outer * parts)?;
        {
            let (mut px, mut pp) = (x.ptr, partial.ptr);
            let (mut c, mut p) = (dims.axis as u64, parts as u64);
            self.launch(
                &format!("rk_reduce_partial_{kname}"),
                (parts as u32, dims.outer as u32, 1),
                (threads, 1, 1),
                0,
                &mut [arg(&mut px), arg(&mut pp), arg(&mut c), arg(&mut p)],
            )?;
        }
        let (mut pp, mut po) = (partial.ptr, out.ptr);
        let (mut r, mut c, mut s) = (dims.outer as u64, parts as u64, scale);
        self.launch(
            &format!("rk_reduce_rows_{kname}"),
            (dims.outer as u32, 1, 1),
            (threads, 1, 1),
            0,
            &mut [
                arg(&mut pp),
                arg(&mut po),
                arg(&mut r),
                arg(&mut c),
                arg(&mut s),
            ],
        )
        // `partial` is freed stream-ordered after the kernels.
    }

    #[allow(clippy::too_many_arguments)]
    fn scores_impl(&self, q: u64, k: u64, out: u64, dims: &AttentionDims) -> Result<()> {
        let mut b0 = 0usize;
        while b0 < dims.batch_heads {
            let nb = (dims.batch_heads - b0).min(MAX_GRID_YZ);
            let (mut pq, mut pk, mut po) = (
                q + (b0 * dims.q_len * dims.head_dim * 4) as u64,
                k + (b0 * dims.kv_stride * dims.head_dim * 4) as u64,
                out + (b0 * dims.q_len * dims.kv_len * 4) as u64,
            );
            let (mut ql, mut kl, mut ks, mut hd) = (
                dims.q_len as u64,
                dims.kv_len as u64,
                dims.kv_stride as u64,
                dims.head_dim as u64,
            );
            let (mut sc, mut ca, mut qo) = (dims.scale, dims.causal as i32, dims.q_offset as u64);
            let gy = dims.q_len.div_ceil(8);
            if gy > MAX_GRID_YZ {
                return Err(Error::shape(format!(
                    "attention: q_len {} too long for one launch",
                    dims.q_len
                )));
            }
            self.launch(
                "rk_attn_scores",
                (dims.kv_len.div_ceil(32) as u32, gy as u32, nb as u32),
                (32, 8, 1),
                0,
                &mut [
                    arg(&mut pq),
                    arg(&mut pk),
                    arg(&mut po),
                    arg(&mut ql),
                    arg(&mut kl),
                    arg(&mut ks),
                    arg(&mut hd),
                    arg(&mut sc),
                    arg(&mut ca),
                    arg(&mut qo),
                ],
            )?;
            b0 += nb;
        }
        Ok(())
    }

    fn weighted_sum_impl(&self, p: u64, v: u64, out: u64, dims: &AttentionDims) -> Result<()> {
        let mut b0 = 0usize;
        while b0 < dims.batch_heads {
            let nb = (dims.batch_heads - b0).min(MAX_GRID_YZ);
            let (mut pp, mut pv, mut po) = (
                p + (b0 * dims.q_len * dims.kv_len * 4) as u64,
                v + (b0 * dims.kv_stride * dims.head_dim * 4) as u64,
                out + (b0 * dims.q_len * dims.head_dim * 4) as u64,
            );
            let (mut ql, mut kl, mut ks, mut hd) = (
                dims.q_len as u64,
                dims.kv_len as u64,
                dims.kv_stride as u64,
                dims.head_dim as u64,
            );
            let gy = dims.q_len.div_ceil(8);
            if gy > MAX_GRID_YZ {
                return Err(Error::shape(format!(
                    "attention: q_len {} too long for one launch",
                    dims.q_len
                )));
            }
            self.launch(
                "rk_attn_weighted_sum",
                (dims.head_dim.div_ceil(32) as u32, gy as u32, nb as u32),
                (32, 8, 1),
                0,
                &mut [
                    arg(&mut pp),
                    arg(&mut pv),
                    arg(&mut po),
                    arg(&mut ql),
                    arg(&mut kl),
                    arg(&mut ks),
                    arg(&mut hd),
                ],
            )?;
            b0 += nb;
        }
        Ok(())
    }

    fn softmax_impl(&self, x: u64, out: u64, rows: usize, cols: usize) -> Result<()> {
        let smem = self.row_cache_bytes("rk_softmax", cols)?;
        let (mut px, mut po) = (x, out);
        let (mut r, mut c, mut cached) = (rows as u64, cols as u64, (smem > 0) as i32);
        self.launch(
            "rk_softmax",
            (rows.min(1 << 30) as u32, 1, 1),
            (Self::row_threads(cols), 1, 1),
            smem,
            &mut [
                arg(&mut px),
                arg(&mut po),
                arg(&mut r),
                arg(&mut c),
                arg(&mut cached),
            ],
        )
    }
}

/// A captured, instantiated CUDA graph of ops (see [`CudaCompute::capture`]).
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    owner: Arc<ComputeInner>,
}

// SAFETY: graph handles may be launched from any thread with the context current.
unsafe impl Send for CudaGraph {}
// SAFETY: launching does not mutate the handle.
unsafe impl Sync for CudaGraph {}

impl std::fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGraph").finish()
    }
}

impl CudaGraph {
    /// Replays the graph on the compute stream (asynchronously, like any op).
    pub fn launch(&self) -> Result<()> {
        self.owner.dev.bind()?;
        // SAFETY: valid executable graph and stream of the same context.
        unsafe { cu::graph::launch(self.exec, self.owner.stream_op()) }
            .map_err(dev_err("graph launch"))
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.owner.dev.bind().is_ok() {
            // SAFETY: destroys the handles created in capture, exactly once; pending
            // launches keep their own references inside the driver.
            unsafe {
                let _ = cu::graph::exec_destroy(self.exec);
                let _ = cu::graph::destroy(self.graph);
            }
        }
    }
}

impl ComputeBackend for CudaCompute {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_name(&self) -> String {
        let i = &self.inner.dev.info;
        format!("{} (sm_{}{}, {} SMs)", i.name, i.cc.0, i.cc.1, i.sm_count)
    }

    fn alloc(&self, len: usize) -> Result<BufferRef> {
        Ok(Arc::new(self.raw_alloc(len)?))
    }

    fn upload(&self, data: &[f32]) -> Result<BufferRef> {
        let b = self.raw_alloc(data.len())?;
        if !data.is_empty() {
            // SAFETY: b.ptr holds data.len() floats; the pageable source is staged by the
            // driver before the call returns.
            unsafe { cu::memcpy_htod_async(b.ptr, data, self.inner.stream_op()) }
                .map_err(dev_err("upload"))?;
        }
        Ok(Arc::new(b))
    }

    fn write(&self, buf: &dyn DeviceBuffer, offset: usize, data: &[f32]) -> Result<()> {
        let b = self.buf(buf)?;
        checks::range(buf, offset, data.len(), "write")?;
        self.refuse_in_program("write")?;
        if data.is_empty() {
            return Ok(());
        }
        self.inner.dev.bind()?;
        // SAFETY: range checked above; pageable source staged before return.
        unsafe { cu::memcpy_htod_async(b.ptr + (offset * 4) as u64, data, self.inner.stream_op()) }
            .map_err(dev_err("write"))
    }

    fn read(&self, buf: &dyn DeviceBuffer, offset: usize, out: &mut [f32]) -> Result<()> {
        let b = self.buf(buf)?;
        checks::range(buf, offset, out.len(), "read")?;
        self.refuse_in_program("read")?;
        if out.is_empty() {
            return self.synchronize();
        }
        self.inner.dev.bind()?;
        // SAFETY: range checked above; the copy into pageable memory completes before
        // the call returns, and we synchronise the stream anyway.
        unsafe { cu::memcpy_dtoh_async(out, b.ptr + (offset * 4) as u64, self.inner.stream_op()) }
            .map_err(dev_err("read"))?;
        self.synchronize()
    }

    fn read_async(&self, buf: &dyn DeviceBuffer, offset: usize, len: usize) -> Result<PendingRead> {
        let b = self.buf(buf)?;
        checks::range(buf, offset, len, "read_async")?;
        self.refuse_in_program("read_async")?;
        self.inner.dev.bind()?;
        let stream = self.inner.stream_op();
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: valid stream; the out pointer is a local.
        unsafe { sys::cuStreamIsCapturing(stream, &mut status) }
            .result()
            .map_err(dev_err("cuStreamIsCapturing"))?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::invalid("read_async cannot be recorded"));
        }
        if len == 0 {
            return Ok(PendingRead::ready(Vec::new()));
        }
        let bytes = len * 4;
        let pooled = {
            let mut pool = lock(&self.inner.staging);
            let at = pool.iter().position(|s| s.host.len() >= bytes);
            at.map(|i| pool.swap_remove(i))
        };
        let st = match pooled {
            Some(s) => s,
            None => Staging::new(&self.inner.dev, bytes)?,
        };
        // SAFETY: the source range was checked above; the destination is pinned memory of
        // at least `bytes` owned by `st`, which the pending read holds until the event
        // after the copy has completed; the event belongs to this context.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                st.host.host_ptr() as *mut c_void,
                b.ptr + (offset * 4) as u64,
                bytes,
                stream,
            )
            .result()
            .map_err(dev_err("read_async copy"))?;
            sys::cuEventRecord(st.event, stream)
                .result()
                .map_err(dev_err("read_async event"))?;
        }
        let inner = self.inner.clone();
        Ok(PendingRead::from_fn(move || {
            inner.dev.bind()?;
            // SAFETY: the event was recorded after the copy on this backend's stream.
            unsafe { sys::cuEventSynchronize(st.event) }
                .result()
                .map_err(dev_err("read_async wait"))?;
            let mut out = vec![0f32; len];
            // SAFETY: the copy into the first `bytes` bytes of the pinned buffer has
            // completed (the event above); `out` holds `len` floats = `bytes` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    st.host.host_ptr() as *const u8,
                    out.as_mut_ptr() as *mut u8,
                    bytes,
                )
            };
            let mut pool = lock(&inner.staging);
            if pool.len() < Staging::POOL {
                pool.push(st);
            }
            Ok(out)
        }))
    }

    fn increment(&self, buf: &dyn DeviceBuffer, offset: usize, len: usize, by: u32) -> Result<()> {
        let b = self.buf(buf)?;
        checks::range(buf, offset, len, "increment")?;
        if len == 0 {
            return Ok(());
        }
        let (mut p, mut n, mut by) = (b.ptr + (offset * 4) as u64, len as u64, by);
        let blocks = len.div_ceil(256).min(self.sms() as usize * 8) as u32;
        self.launch_writing(
            "rk_increment",
            (blocks, 1, 1),
            (256, 1, 1),
            &mut [arg(&mut p), arg(&mut n), arg(&mut by)],
            &[(p, len as u64 * 4)],
        )
    }

    fn copy(
        &self,
        src: &dyn DeviceBuffer,
        src_offset: usize,
        dst: &dyn DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        let s = self.buf(src)?;
        let d = self.buf(dst)?;
        checks::copy((src, src_offset), (dst, dst_offset), len)?;
        self.refuse_in_program("copy")?;
        if len == 0 {
            return Ok(());
        }
        self.inner.dev.bind()?;
        // SAFETY: both ranges checked above and do not overlap.
        unsafe {
            cu::memcpy_dtod_async(
                d.ptr + (dst_offset * 4) as u64,
                s.ptr + (src_offset * 4) as u64,
                len * 4,
                self.inner.stream_op(),
            )
        }
        .map_err(dev_err("copy"))
    }

    fn synchronize(&self) -> Result<()> {
        self.refuse_in_program("synchronize")?;
        self.inner.stream.synchronize()
    }

    fn unary(
        &self,
        op: UnaryOp,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (xb, ob) = (self.buf(x)?, self.buf(out)?);
        checks::unary(len).check(&[x, out])?;
        if len == 0 {
            return Ok(());
        }
        let (mut px, mut po, mut n) = (xb.ptr, ob.ptr, len as u64);
        self.launch(
            &format!("rk_unary_{}", op.name()),
            (self.elementwise_grid(len), 1, 1),
            (256, 1, 1),
            0,
            &mut [arg(&mut px), arg(&mut po), arg(&mut n)],
        )
    }

    fn binary(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (ab, bb, ob) = (self.buf(a)?, self.buf(b)?, self.buf(out)?);
        checks::binary(len).check(&[a, b, out])?;
        if len == 0 {
            return Ok(());
        }
        let (mut pa, mut pb, mut po, mut n) = (ab.ptr, bb.ptr, ob.ptr, len as u64);
        self.launch(
            &format!("rk_binary_{}", op.name()),
            (self.elementwise_grid(len), 1, 1),
            (256, 1, 1),
            0,
            &mut [arg(&mut pa), arg(&mut pb), arg(&mut po), arg(&mut n)],
        )
    }

    fn binary_scalar(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        s: f32,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (ab, ob) = (self.buf(a)?, self.buf(out)?);
        checks::binary_scalar(len).check(&[a, out])?;
        if len == 0 {
            return Ok(());
        }
        let (mut pa, mut sv, mut po, mut n) = (ab.ptr, s, ob.ptr, len as u64);
        self.launch(
            &format!("rk_scalar_{}", op.name()),
            (self.elementwise_grid(len), 1, 1),
            (256, 1, 1),
            0,
            &mut [arg(&mut pa), arg(&mut sv), arg(&mut po), arg(&mut n)],
        )
    }

    fn matmul(
        &self,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: MatmulDims,
    ) -> Result<()> {
        let (ab, bb, ob) = (self.buf(a)?, self.buf(b)?, self.buf(out)?);
        let MatmulDims {
            batch,
            m,
            k,
            n,
            b_batched,
        } = dims;
        checks::matmul(dims)?.check(&[a, b, out])?;
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            self.refuse_in_program("matmul")?;
            self.inner.dev.bind()?;
            // SAFETY: out holds batch*m*n floats (checked); zero them as the empty sum.
            return unsafe {
                cu::memset_d8_async(ob.ptr, 0, batch * m * n * 4, self.inner.stream_op())
            }
            .map_err(dev_err("memset"));
        }
        let to_i32 = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| {
                Error::shape(format!(
                    "matmul: {what} = {v} exceeds cuBLAS's 32-bit limit"
                ))
            })
        };
        let (mi, ni, ki, bi) = (
            to_i32(m, "m")?,
            to_i32(n, "n")?,
            to_i32(k, "k")?,
            to_i32(batch, "batch")?,
        );
        let tf32 = self.tf32();
        self.with_cublas(|h| {
            let mode = if tf32 {
                blas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
            } else {
                blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH
            };
            // SAFETY: valid handle; the mode is a valid enum value.
            unsafe { blas_sys::cublasSetMathMode(h, mode) }
                .result()
                .map_err(|e| Error::Device(format!("cublasSetMathMode: {e:?}")))?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            // cuBLAS queues on the stream (set on its handle).
            self.inner.stream_op();
            // Row-major C[m,n] = A[m,k]·B[k,n] is column-major Cᵀ[n,m] = Bᵀ[n,k]·Aᵀ[k,m],
            // and a row-major X is its column-major transpose with the same memory.
            // SAFETY: all three buffers were length-checked for the strides and counts
            // below; alpha/beta are host scalars (default pointer mode).
            unsafe {
                blas::sgemm_strided_batched(
                    h,
                    blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    ni,
                    mi,
                    ki,
                    &alpha,
                    bb.ptr as *const f32,
                    ni,
                    if b_batched { (k * n) as i64 } else { 0 },
                    ab.ptr as *const f32,
                    ki,
                    (m * k) as i64,
                    &beta,
                    ob.ptr as *mut f32,
                    ni,
                    (m * n) as i64,
                    bi,
                )
            }
            .map_err(|e| Error::Device(format!("cublasSgemmStridedBatched: {e:?}")))
        })
    }

    fn matvec(
        &self,
        a: &dyn DeviceBuffer,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        m: usize,
        k: usize,
    ) -> Result<()> {
        let (ab, xb, ob) = (self.buf(a)?, self.buf(x)?, self.buf(out)?);
        checks::matvec(m, k)?.check(&[a, x, out])?;
        if m == 0 {
            return Ok(());
        }
        let (mut pa, mut px, mut po, mut mm, mut kk) = (ab.ptr, xb.ptr, ob.ptr, m as u64, k as u64);
        self.launch(
            "rk_matvec",
            (m.div_ceil(8).min(i32::MAX as usize) as u32, 1, 1),
            (256, 1, 1),
            0,
            &mut [
                arg(&mut pa),
                arg(&mut px),
                arg(&mut po),
                arg(&mut mm),
                arg(&mut kk),
            ],
        )
    }

    fn argmax(&self, x: &dyn DeviceBuffer, len: usize, out: &dyn DeviceBuffer) -> Result<()> {
        let (xb, ob) = (self.buf(x)?, self.buf(out)?);
        checks::argmax(len)?.check(&[x, out])?;
        checks::distinct("argmax", out, &[x])?;
        let (mut px, mut n, mut po) = (xb.ptr, len as u64, ob.ptr);
        self.launch_writing(
            "rk_argmax",
            (1, 1, 1),
            (ARGMAX_THREADS, 1, 1),
            &mut [arg(&mut px), arg(&mut n), arg(&mut po)],
            &[self.span(out)?],
        )
    }

    fn dot(
        &self,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (ab, bb, ob) = (self.buf(a)?, self.buf(b)?, self.buf(out)?);
        checks::dot(len).check(&[a, b, out])?;
        let parts = (self.sms() as usize * 4).min(len.div_ceil(4096)).max(1);
        let partial = self.raw_alloc(parts)?;
        {
            let (mut pa, mut pb, mut pp, mut n) = (ab.ptr, bb.ptr, partial.ptr, len as u64);
            self.launch(
                "rk_dot_partial",
                (parts as u32, 1, 1),
                (256, 1, 1),
                0,
                &mut [arg(&mut pa), arg(&mut pb), arg(&mut pp), arg(&mut n)],
            )?;
        }
        let (mut pp, mut po, mut r, mut c, mut s) =
            (partial.ptr, ob.ptr, 1u64, parts as u64, 1.0f32);
        self.launch(
            "rk_reduce_rows_sum",
            (1, 1, 1),
            (256, 1, 1),
            0,
            &mut [
                arg(&mut pp),
                arg(&mut po),
                arg(&mut r),
                arg(&mut c),
                arg(&mut s),
            ],
        )
    }

    fn reduce(
        &self,
        op: ReduceOp,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: ReduceDims,
    ) -> Result<()> {
        let (xb, ob) = (self.buf(x)?, self.buf(out)?);
        checks::reduce(dims)?.check(&[x, out])?;
        if dims.outer == 0 || dims.inner == 0 {
            return Ok(());
        }
        self.reduce_impl(op, xb, ob, dims)
    }

    fn softmax(
        &self,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let (xb, ob) = (self.buf(x)?, self.buf(out)?);
        let needs = checks::softmax(rows, cols)?;
        needs.check(&[x, out])?;
        let n = needs.elems(0);
        if n == 0 {
            return Ok(());
        }
        self.softmax_impl(xb.ptr, ob.ptr, rows, cols)
    }

    fn rms_norm(
        &self,
        x: &dyn DeviceBuffer,
        weight: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        let (xb, wb, ob) = (self.buf(x)?, self.buf(weight)?, self.buf(out)?);
        let needs = checks::rms_norm(rows, cols)?;
        needs.check(&[x, weight, out])?;
        let n = needs.elems(0);
        if n == 0 {
            return Ok(());
        }
        let smem = self.row_cache_bytes("rk_rms_norm", cols)?;
        let (mut px, mut pw, mut po) = (xb.ptr, wb.ptr, ob.ptr);
        let (mut r, mut c, mut e, mut cached) = (rows as u64, cols as u64, eps, (smem > 0) as i32);
        self.launch(
            "rk_rms_norm",
            (rows.min(1 << 30) as u32, 1, 1),
            (Self::row_threads(cols), 1, 1),
            smem,
            &mut [
                arg(&mut px),
                arg(&mut pw),
                arg(&mut po),
                arg(&mut r),
                arg(&mut c),
                arg(&mut e),
                arg(&mut cached),
            ],
        )
    }

    fn layer_norm(
        &self,
        x: &dyn DeviceBuffer,
        weight: &dyn DeviceBuffer,
        bias: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        let (xb, wb, bb, ob) = (
            self.buf(x)?,
            self.buf(weight)?,
            self.buf(bias)?,
            self.buf(out)?,
        );
        let needs = checks::layer_norm(rows, cols)?;
        needs.check(&[x, weight, bias, out])?;
        let n = needs.elems(0);
        if n == 0 {
            return Ok(());
        }
        let smem = self.row_cache_bytes("rk_layer_norm", cols)?;
        let (mut px, mut pw, mut pb, mut po) = (xb.ptr, wb.ptr, bb.ptr, ob.ptr);
        let (mut r, mut c, mut e, mut cached) = (rows as u64, cols as u64, eps, (smem > 0) as i32);
        let threads = (cols.div_ceil(4).div_ceil(32) * 32).clamp(64, 1024) as u32;
        self.launch(
            "rk_layer_norm",
            (rows.min(1 << 30) as u32, 1, 1),
            (threads, 1, 1),
            smem,
            &mut [
                arg(&mut px),
                arg(&mut pw),
                arg(&mut pb),
                arg(&mut po),
                arg(&mut r),
                arg(&mut c),
                arg(&mut e),
                arg(&mut cached),
            ],
        )
    }

    fn rope(
        &self,
        x: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: RopeDims,
    ) -> Result<()> {
        let (xb, pb, ob) = (self.buf(x)?, self.buf(positions)?, self.buf(out)?);
        let needs = checks::rope(dims)?;
        needs.check(&[x, positions, out])?;
        let n = needs.elems(0);
        if n == 0 {
            return Ok(());
        }
        let (mut px, mut pp, mut po) = (xb.ptr, pb.ptr, ob.ptr);
        let (mut s, mut h, mut d, mut base) = (
            dims.seq as u64,
            dims.heads as u64,
            dims.head_dim as u64,
            dims.base,
        );
        self.launch(
            "rk_rope",
            (grid_1d(n / 2, 256, self.sms()), 1, 1),
            (256, 1, 1),
            0,
            &mut [
                arg(&mut px),
                arg(&mut pp),
                arg(&mut po),
                arg(&mut s),
                arg(&mut h),
                arg(&mut d),
                arg(&mut base),
            ],
        )
    }

    fn attention_scores(
        &self,
        q: &dyn DeviceBuffer,
        k: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()> {
        let (qb, kb, ob) = (self.buf(q)?, self.buf(k)?, self.buf(out)?);
        let needs = checks::attention_scores(&dims)?;
        needs.check(&[q, k, out])?;
        if needs.elems(2) == 0 {
            return Ok(());
        }
        self.scores_impl(qb.ptr, kb.ptr, ob.ptr, &dims)
    }

    fn attention_weighted_sum(
        &self,
        p: &dyn DeviceBuffer,
        v: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()> {
        let (pb, vb, ob) = (self.buf(p)?, self.buf(v)?, self.buf(out)?);
        let needs = checks::attention_weighted_sum(&dims)?;
        needs.check(&[p, v, out])?;
        if needs.elems(2) == 0 {
            return Ok(());
        }
        self.weighted_sum_impl(pb.ptr, vb.ptr, ob.ptr, &dims)
    }

    fn attention(
        &self,
        q: &dyn DeviceBuffer,
        k: &dyn DeviceBuffer,
        v: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()> {
        let (qb, kb, vb, ob) = (self.buf(q)?, self.buf(k)?, self.buf(v)?, self.buf(out)?);
        let needs = checks::attention(&dims)?;
        needs.check(&[q, k, v, out])?;
        let sizes = checks::attention_sizes(&dims)?;
        if sizes.q == 0 {
            return Ok(());
        }
        if dims.head_dim <= FUSED_MAX_HEAD_DIM && dims.q_len <= i32::MAX as usize {
            let mut b0 = 0usize;
            while b0 < dims.batch_heads {
                let nb = (dims.batch_heads - b0).min(MAX_GRID_YZ);
                let (mut pq, mut pk, mut pv, mut po) = (
                    qb.ptr + (b0 * dims.q_len * dims.head_dim * 4) as u64,
                    kb.ptr + (b0 * dims.kv_stride * dims.head_dim * 4) as u64,
                    vb.ptr + (b0 * dims.kv_stride * dims.head_dim * 4) as u64,
                    ob.ptr + (b0 * dims.q_len * dims.head_dim * 4) as u64,
                );
                let (mut ql, mut kl, mut ks, mut hd) = (
                    dims.q_len as u64,
                    dims.kv_len as u64,
                    dims.kv_stride as u64,
                    dims.head_dim as u64,
                );
                let (mut sc, mut ca, mut qo) =
                    (dims.scale, dims.causal as i32, dims.q_offset as u64);
                self.launch(
                    "rk_attention",
                    (dims.q_len as u32, nb as u32, 1),
                    (128, 1, 1),
                    0,
                    &mut [
                        arg(&mut pq),
                        arg(&mut pk),
                        arg(&mut pv),
                        arg(&mut po),
                        arg(&mut ql),
                        arg(&mut kl),
                        arg(&mut ks),
                        arg(&mut hd),
                        arg(&mut sc),
                        arg(&mut ca),
                        arg(&mut qo),
                    ],
                )?;
                b0 += nb;
            }
            return Ok(());
        }
        // Unfused: scores, softmax, weighted sum through a temporary.
        let scores = self.raw_alloc(sizes.scores)?;
        let probs = self.raw_alloc(sizes.scores)?;
        self.scores_impl(qb.ptr, kb.ptr, scores.ptr, &dims)?;
        self.softmax_impl(
            scores.ptr,
            probs.ptr,
            dims.batch_heads * dims.q_len,
            dims.kv_len,
        )?;
        self.weighted_sum_impl(probs.ptr, vb.ptr, ob.ptr, &dims)
    }

    fn swiglu(
        &self,
        gate: &dyn DeviceBuffer,
        up: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (gb, ub, ob) = (self.buf(gate)?, self.buf(up)?, self.buf(out)?);
        checks::swiglu(len).check(&[gate, up, out])?;
        if len == 0 {
            return Ok(());
        }
        let (mut pg, mut pu, mut po, mut n) = (gb.ptr, ub.ptr, ob.ptr, len as u64);
        self.launch(
            "rk_swiglu",
            (self.elementwise_grid(len), 1, 1),
            (256, 1, 1),
            0,
            &mut [arg(&mut pg), arg(&mut pu), arg(&mut po), arg(&mut n)],
        )
    }

    model::model_ops!();
}

/// A kernel compiled at run time from CUDA C (a generated kernel), for
/// [`CudaCompute::launch_function`]. Holds its module loaded; cheap to clone.
#[derive(Clone)]
pub struct CudaFunction {
    func: Arc<Func>,
    name: String,
    // Keeps the module loaded (after `func` in drop order) and the device alive.
    _module: Arc<Module>,
    owner: Arc<ComputeInner>,
}

impl std::fmt::Debug for CudaFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaFunction")
            .field("name", &self.name)
            .finish()
    }
}

/// One argument of [`CudaCompute::launch_function`], in the kernel's parameter order.
#[derive(Debug, Clone, Copy)]
pub enum CudaArg<'a> {
    /// A buffer of this backend, passed as its device address (any `T*` parameter).
    Buffer(&'a dyn DeviceBuffer),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `bool`.
    Bool(bool),
}

impl CudaCompute {
    /// Compiles CUDA C `source` with NVRTC for this device (through the on-disk cubin
    /// cache of [`crate::nvrtc`]), loads it and looks up the `extern "C"` kernel `entry`.
    /// A compile failure is [`Error::Compile`] with the NVRTC log.
    pub fn compile_function(&self, label: &str, source: &str, entry: &str) -> Result<CudaFunction> {
        let info = &self.inner.dev.info;
        let cubin = crate::nvrtc::compile_cubin(source, label, info.cc, info.driver_version)?;
        let module = Arc::new(self.inner.dev.load_module(&cubin)?);
        let func = Arc::new(Func(module.function(entry)?));
        Ok(CudaFunction {
            func,
            name: entry.to_string(),
            _module: module,
            owner: self.inner.clone(),
        })
    }

    /// Queues one launch of `f` on this backend's stream (in order with its other ops).
    /// The arguments must match the kernel's parameters in order and type, and every
    /// buffer must be as long as the kernel reads and writes: the generated-kernel
    /// launcher of the `ringkernel` facade checks both before it calls this.
    pub fn launch_function(
        &self,
        f: &CudaFunction,
        grid: [u32; 3],
        block: [u32; 3],
        args: &[CudaArg<'_>],
    ) -> Result<()> {
        if !Arc::ptr_eq(&f.owner, &self.inner) {
            return Err(Error::Device(
                "kernel belongs to another CUDA device or context".into(),
            ));
        }
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        if threads > 1024 || block[2] > 64 {
            return Err(Error::invalid(format!(
                "block of {} threads: CUDA allows at most 1024 per block (z at most 64)",
                block.map(|b| b.to_string()).join(" x ")
            )));
        }
        if grid[1] as usize > MAX_GRID_YZ
            || grid[2] as usize > MAX_GRID_YZ
            || grid[0] > i32::MAX as u32
        {
            return Err(Error::invalid(format!(
                "grid of {} blocks exceeds CUDA's limits (x < 2^31, y and z at most {MAX_GRID_YZ})",
                grid.map(|g| g.to_string()).join(" x ")
            )));
        }
        if grid.contains(&0) || block.contains(&0) {
            return Ok(());
        }
        self.refuse_in_program(&f.name)?;
        // Owned storage of every argument value, then pointers to them.
        enum Slot {
            Ptr(u64),
            F32(f32),
            F64(f64),
            I32(i32),
            U32(u32),
            Bool(bool),
        }
        let mut slots = args
            .iter()
            .map(|a| {
                Ok(match a {
                    CudaArg::Buffer(b) => Slot::Ptr(self.buf(*b)?.ptr),
                    CudaArg::F32(x) => Slot::F32(*x),
                    CudaArg::F64(x) => Slot::F64(*x),
                    CudaArg::I32(x) => Slot::I32(*x),
                    CudaArg::U32(x) => Slot::U32(*x),
                    CudaArg::Bool(x) => Slot::Bool(*x),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut ptrs: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| match s {
                Slot::Ptr(p) => arg(p),
                Slot::F32(x) => arg(x),
                Slot::F64(x) => arg(x),
                Slot::I32(x) => arg(x),
                Slot::U32(x) => arg(x),
                Slot::Bool(x) => arg(x),
            })
            .collect();
        self.inner.dev.bind()?;
        let name = &f.name;
        // SAFETY: `f` is a kernel of a module loaded on this device (checked above) and
        // kept loaded by `f`; `ptrs` points at values of the C types of its parameters,
        // in order (the caller's contract, checked by the facade against the kernel's
        // parameter list), alive until the call returns (the driver copies them); the
        // buffers were checked to belong to this backend; the stream is valid.
        unsafe {
            cu::launch_kernel(
                f.func.0,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                0,
                self.inner.stream_op(),
                &mut ptrs,
            )
        }
        .map_err(|e| Error::Device(format!("CUDA launch of {name}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::may_load_early;

    #[test]
    fn early_loads_only_after_declared_writes_that_miss_every_read() {
        let reads = [(1000, 64), (4096, 16)];
        // declared writes elsewhere: early
        assert!(may_load_early(
            true,
            Some(&[(0, 1000), (1064, 100)]),
            &reads
        ));
        assert!(may_load_early(true, Some(&[]), &reads));
        // a write that touches a read range, at either end: not early
        assert!(!may_load_early(true, Some(&[(1063, 1)]), &reads));
        assert!(!may_load_early(true, Some(&[(990, 11)]), &reads));
        assert!(!may_load_early(true, Some(&[(0, 8192)]), &reads));
        assert!(!may_load_early(true, Some(&[(0, 10), (4100, 1)]), &reads));
        // unknown writes (anything else on the stream), or no programmatic launch
        assert!(!may_load_early(true, None, &reads));
        assert!(!may_load_early(false, Some(&[]), &reads));
    }
}
