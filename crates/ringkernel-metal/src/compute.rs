//! [`MetalCompute`]: the compute ops on Metal.
//!
//! Each op becomes a [`Plan`](ringkernel_drain::plan::Plan) of the shared planner (the
//! plans the WebGPU backend runs in CI), executed through [`PlanDevice`]: dispatches
//! are recorded into the current command buffer; consecutive
//! ops share one compute encoder, and the command buffer is committed when the host
//! needs results (`read`, `synchronize`, a host `write`) or after
//! [`MAX_DISPATCHES_PER_BATCH`] dispatches. Buffers are `StorageModeShared`: on unified
//! memory `read`/`write` copy straight from/to the buffer's memory, with no staging
//! buffer and no blit. Buffers come from a bounded [`BufferPool`].
//!
//! Pipelines are compiled from the MSL that naga generates for the shared WGSL kernels
//! (`ringkernel-shaders`) and cached by `(kernel, specialisation)`. Large matmuls
//! ([`plan::prefer_mps`]) go to Metal Performance Shaders' `MPSMatrixMultiplication`
//! when the device supports it and the `mps` feature is on (the default); the others
//! run the shared tiled WGSL kernel.
//!
//! Compiled for Apple targets in CI; not executed by CI (no Apple GPU there).

use crate::sys::{CommandBatch, MetalAllocator, MetalBuffer, MetalDevice, Pipeline};
use ringkernel_core::compute::{
    checks, downcast, BufferRef, ComputeBackend, DeviceBuffer, MatmulDims,
};
use ringkernel_core::util::lock;
use ringkernel_core::{BackendKind, Error, Result};
use ringkernel_drain::exec::{self, At, PlanDevice, Step};
use ringkernel_drain::plan::{self, PARAMS_BINDING};
use ringkernel_drain::pool::{BufferPool, PoolConfig, PoolStats, Pooled};
use ringkernel_drain::sizing::check_fixed_threadgroup;
use ringkernel_shaders::{Kernel, Specialization};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Dispatches recorded into one command buffer before it is committed without waiting.
pub const MAX_DISPATCHES_PER_BATCH: usize = 64;

/// An f32 buffer of the Metal backend: a pooled `StorageModeShared` buffer.
#[derive(Debug)]
pub struct MetalTensor {
    buf: Pooled<MetalAllocator>,
    len: usize,
}

impl MetalTensor {
    /// The underlying Metal buffer (its size class may exceed `len * 4` bytes).
    pub fn buffer(&self) -> &MetalBuffer {
        &self.buf
    }
}

ringkernel_core::impl_device_buffer!(MetalTensor, BackendKind::Metal);

#[derive(Default)]
struct Pending {
    batch: Option<CommandBatch>,
    dispatches: usize,
    /// Command buffers committed without waiting since the last wait.
    in_flight: bool,
    /// Scratch buffers used by recorded work, released after the next wait.
    keep_alive: Vec<Pooled<MetalAllocator>>,
}

type PipelineKey = (Kernel, Specialization);

/// A compiled kernel and what naga's buffer-sizes argument must hold for it.
#[derive(Debug)]
struct Compiled {
    pipeline: Pipeline,
    /// `(index, order)` of the `_buffer_sizes` argument, if the MSL has one.
    sizes: Option<ringkernel_drain::plan::SizesArg>,
}

/// The compute ops on the system default Metal device. See the [module docs](self).
pub struct MetalCompute {
    device: Arc<MetalDevice>,
    pool: Arc<BufferPool<MetalAllocator>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Compiled>>>,
    pending: Mutex<Pending>,
    /// Whether large matmuls go to Metal Performance Shaders.
    mps: bool,
}

impl std::fmt::Debug for MetalCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalCompute")
            .field("device", &self.device.name())
            .field("pool", &self.pool.stats())
            .finish()
    }
}

impl MetalCompute {
    /// Opens the system default Metal device. `BackendUnavailable` on non-Apple targets
    /// and when the system has no Metal device.
    pub fn new() -> Result<Self> {
        let device = crate::open_device()?;
        let config = PoolConfig::for_working_set(device.recommended_working_set_size());
        Ok(Self::with_device(device, config))
    }

    /// On an already opened device, with explicit pool limits.
    pub fn with_device(device: Arc<MetalDevice>, pool: PoolConfig) -> Self {
        MetalCompute {
            pool: BufferPool::new(MetalAllocator::new(device.clone()), pool),
            mps: device.supports_mps(),
            device,
            pipelines: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending::default()),
        }
    }

    /// Turns the Metal Performance Shaders matmul off (or back on where the device
    /// supports it); off, every matmul runs the shared tiled WGSL kernel.
    pub fn set_use_mps(&mut self, on: bool) {
        self.mps = on && self.device.supports_mps();
    }

    /// Whether large matmuls go to Metal Performance Shaders ([`plan::prefer_mps`]).
    pub fn uses_mps(&self) -> bool {
        self.mps
    }

    /// The device.
    pub fn device(&self) -> &Arc<MetalDevice> {
        &self.device
    }

    /// Buffer pool counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Frees every pooled (unused) buffer; returns the bytes freed.
    pub fn trim_pool(&self) -> usize {
        self.pool.trim()
    }

    /// Number of compiled pipelines in the cache.
    pub fn cached_pipelines(&self) -> usize {
        lock(&self.pipelines).len()
    }

    fn pipeline(&self, kernel: Kernel, spec: &Specialization) -> Result<Arc<Compiled>> {
        let key = (kernel, spec.clone());
        if let Some(p) = lock(&self.pipelines).get(&key) {
            return Ok(p.clone());
        }
        // Compiled outside the lock; a racing thread may compile the same pipeline
        // once more, and the first one inserted wins.
        let msl = ringkernel_shaders::to_msl(kernel, spec)?;
        let label = format!("{}{:?}", kernel.entry_point(), spec.0);
        let p = self.device.compile(&label, &msl.source, &msl.entry_point)?;
        check_fixed_threadgroup(kernel.entry_point(), p.limits(), msl.workgroup_size)?;
        let sizes = msl
            .sizes_buffer
            .map(|i| (i as u32, msl.sizes_order.clone()));
        let p = Arc::new(Compiled { pipeline: p, sizes });
        Ok(lock(&self.pipelines).entry(key).or_insert(p).clone())
    }

    /// The limits of the compiled pipeline of `kernel` specialised with `spec`
    /// (`threadExecutionWidth`, `maxTotalThreadsPerThreadgroup`), compiling it if needed.
    pub fn pipeline_limits(
        &self,
        kernel: Kernel,
        spec: &Specialization,
    ) -> Result<ringkernel_drain::sizing::PipelineLimits> {
        Ok(self.pipeline(kernel, spec)?.pipeline.limits())
    }

    fn new_tensor(&self, len: usize) -> Result<MetalTensor> {
        let bytes = len
            .checked_mul(4)
            .ok_or_else(|| Error::invalid(format!("{len} f32 elements overflow")))?;
        Ok(MetalTensor {
            buf: self.pool.acquire(bytes.max(4))?,
            len,
        })
    }

    /// The open command buffer of `pending`, begun if there is none.
    fn open<'a>(&self, pending: &'a mut Pending) -> Result<&'a mut CommandBatch> {
        if pending.batch.is_none() {
            pending.batch = Some(self.device.batch()?);
        }
        pending
            .batch
            .as_mut()
            .ok_or_else(|| crate::device_err("no command buffer"))
    }

    /// Commits the open command buffer without waiting once it holds enough work.
    fn maybe_commit(pending: &mut Pending) {
        if pending.dispatches >= MAX_DISPATCHES_PER_BATCH {
            if let Some(b) = pending.batch.take() {
                b.commit(None);
                pending.in_flight = true;
                pending.dispatches = 0;
            }
        }
    }

    /// Commits recorded work and waits for everything committed so far.
    fn wait_all(&self) -> Result<()> {
        let mut pending = lock(&self.pending);
        let batch = match pending.batch.take() {
            Some(b) => Some(b),
            // An empty command buffer completes after every earlier one on the queue.
            None if pending.in_flight => Some(self.device.batch()?),
            None => None,
        };
        pending.dispatches = 0;
        let result = match batch {
            Some(b) => b.commit_and_wait(),
            None => Ok(()),
        };
        pending.in_flight = false;
        pending.keep_alive.clear();
        result
    }
}

impl PlanDevice for MetalCompute {
    type Buffer = MetalTensor;

    fn buffer<'a>(&self, b: &'a dyn DeviceBuffer) -> Result<&'a MetalTensor> {
        downcast::<MetalTensor>(b, BackendKind::Metal)
    }

    fn scratch(&self, len: usize) -> Result<MetalTensor> {
        self.new_tensor(len)
    }

    fn record(&self, steps: &[Step<'_, MetalTensor>]) -> Result<()> {
        // Compiled (or found) before the command buffer is locked.
        let pipelines = steps
            .iter()
            .map(|s| self.pipeline(s.dispatch.kernel, &s.dispatch.spec))
            .collect::<Result<Vec<_>>>()?;
        let mut pending = lock(&self.pending);
        for (s, pipe) in steps.iter().zip(&pipelines) {
            let d = s.dispatch;
            let binds: Vec<(u32, &MetalBuffer, usize)> = s
                .buffers
                .iter()
                .map(|(b, t)| (b.index(), t.buffer(), 0))
                .collect();
            let sizes = match &pipe.sizes {
                Some((index, order)) => Some((*index, s.buffer_sizes(order)?)),
                None => None,
            };
            let mut inline: Vec<(u32, &[u8])> = vec![(PARAMS_BINDING, &d.params)];
            if let Some((index, bytes)) = &sizes {
                inline.push((*index, bytes));
            }
            let batch = self.open(&mut pending)?;
            batch.dispatch(&pipe.pipeline, &binds, &inline, d.groups, d.threads())?;
            pending.dispatches += 1;
        }
        Self::maybe_commit(&mut pending);
        Ok(())
    }

    fn retire(&self, scratch: Vec<MetalTensor>) {
        // Metal does not retain buffers for the GPU: keep them until the next wait.
        lock(&self.pending)
            .keep_alive
            .extend(scratch.into_iter().map(|t| t.buf));
    }

    fn copy_elems(&self, s: At<MetalTensor>, d: At<MetalTensor>, n: usize) -> Result<()> {
        let mut pending = lock(&self.pending);
        let batch = self.open(&mut pending)?;
        batch.copy(s.0.buffer(), s.1 * 4, d.0.buffer(), d.1 * 4, n * 4)
    }

    fn run_matmul(&self, dims: MatmulDims, args: [&dyn DeviceBuffer; 3]) -> Result<()> {
        let plan = plan::matmul(dims)?;
        if !(self.mps && plan::prefer_mps(dims)) {
            return exec::run(self, &plan, &args);
        }
        let t = exec::prepare(self, &plan, &args)?;
        let mut pending = lock(&self.pending);
        let batch = self.open(&mut pending)?;
        batch.matmul_mps(
            &self.device,
            t[0].buffer(),
            t[1].buffer(),
            t[2].buffer(),
            dims,
        )?;
        pending.dispatches += 1;
        Self::maybe_commit(&mut pending);
        Ok(())
    }
}

impl ComputeBackend for MetalCompute {
    fn kind(&self) -> BackendKind {
        BackendKind::Metal
    }

    fn device_name(&self) -> String {
        self.device.name()
    }

    fn alloc(&self, len: usize) -> Result<BufferRef> {
        Ok(Arc::new(self.new_tensor(len)?))
    }

    fn upload(&self, data: &[f32]) -> Result<BufferRef> {
        let t = self.new_tensor(data.len())?;
        self.write(&t, 0, data)?;
        Ok(Arc::new(t))
    }

    fn write(&self, buf: &dyn DeviceBuffer, offset: usize, data: &[f32]) -> Result<()> {
        let t = self.buffer(buf)?;
        checks::range(buf, offset, data.len(), "write")?;
        // Queued GPU work may still read this buffer: let it finish first.
        self.wait_all()?;
        t.buffer()
            .write_bytes(offset * 4, bytemuck::cast_slice(data))
    }

    fn read(&self, buf: &dyn DeviceBuffer, offset: usize, out: &mut [f32]) -> Result<()> {
        let t = self.buffer(buf)?;
        checks::range(buf, offset, out.len(), "read")?;
        self.wait_all()?;
        t.buffer()
            .read_bytes(offset * 4, bytemuck::cast_slice_mut(out))
    }

    fn synchronize(&self) -> Result<()> {
        self.wait_all()
    }

    ringkernel_drain::planned_ops!();
}

/// A compute pipeline built at run time from WGSL (a generated kernel) through naga's
/// MSL, for [`MetalCompute::dispatch_wgsl`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MslPipeline {
    compiled: Arc<Compiled>,
    entry_point: String,
    workgroup_size: [u32; 3],
}

impl MetalCompute {
    /// Validates WGSL `source` with naga and translates `entry_point` to MSL: binding `n`
    /// of group 0 at `[[buffer(n)]]`, as for the built-in kernels; binding 0 is the
    /// uniform parameter block when `has_params`, and `read_write[i]` says whether
    /// storage binding `i + 1` is written. Needs no device (tests check it off Apple).
    /// Failures are [`Error::Compile`].
    pub fn generated_msl(
        label: &str,
        source: &str,
        entry_point: &str,
        has_params: bool,
        read_write: &[bool],
    ) -> Result<ringkernel_shaders::MslOutput> {
        use ringkernel_shaders::{Access, Binding};
        let v = ringkernel_shaders::validate_source(label, source)?;
        let mut bindings = Vec::with_capacity(read_write.len() + 1);
        if has_params {
            bindings.push(Binding {
                group: 0,
                binding: PARAMS_BINDING,
                name: "",
                access: Access::Uniform,
            });
        }
        for (i, &rw) in read_write.iter().enumerate() {
            bindings.push(Binding {
                group: 0,
                binding: i as u32 + 1,
                name: "",
                access: if rw { Access::ReadWrite } else { Access::Read },
            });
        }
        ringkernel_shaders::module_to_msl(&v, entry_point, &bindings, &Specialization::none())
    }

    /// Compiles the MSL of [`generated_msl`](Self::generated_msl) into a pipeline.
    pub fn compile_wgsl(
        &self,
        label: &str,
        source: &str,
        entry_point: &str,
        has_params: bool,
        read_write: &[bool],
    ) -> Result<MslPipeline> {
        let msl = Self::generated_msl(label, source, entry_point, has_params, read_write)?;
        let pipeline = self.device.compile(label, &msl.source, &msl.entry_point)?;
        check_fixed_threadgroup(entry_point, pipeline.limits(), msl.workgroup_size)?;
        let sizes = msl
            .sizes_buffer
            .map(|i| (i as u32, msl.sizes_order.clone()));
        Ok(MslPipeline {
            compiled: Arc::new(Compiled { pipeline, sizes }),
            entry_point: entry_point.to_string(),
            workgroup_size: msl.workgroup_size,
        })
    }

    /// Records one dispatch of `groups` threadgroups of a pipeline from
    /// [`compile_wgsl`](Self::compile_wgsl): `params` at binding 0 (when given), each
    /// `(binding, buffer)` at its binding. In order with the other ops of this backend.
    pub fn dispatch_wgsl(
        &self,
        pipeline: &MslPipeline,
        params: Option<&[u8]>,
        buffers: &[(u32, &dyn DeviceBuffer)],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let tensors = buffers
            .iter()
            .map(|(b, t)| Ok((*b, self.buffer(*t)?)))
            .collect::<Result<Vec<_>>>()?;
        let binds: Vec<(u32, &MetalBuffer, usize)> =
            tensors.iter().map(|(b, t)| (*b, t.buffer(), 0)).collect();
        let sizes = match &pipeline.compiled.sizes {
            Some((index, order)) => Some((
                *index,
                plan::buffer_sizes(order, |binding| {
                    tensors
                        .iter()
                        .find(|(b, _)| *b == binding)
                        .map(|(_, t)| t.len * 4)
                })?,
            )),
            None => None,
        };
        let mut inline: Vec<(u32, &[u8])> = Vec::new();
        if let Some(p) = params {
            inline.push((PARAMS_BINDING, p));
        }
        if let Some((index, bytes)) = &sizes {
            inline.push((*index, bytes));
        }
        let mut pending = lock(&self.pending);
        let batch = self.open(&mut pending)?;
        batch
            .dispatch(
                &pipeline.compiled.pipeline,
                &binds,
                &inline,
                groups,
                pipeline.workgroup_size,
            )
            .map_err(|e| match e {
                Error::InvalidArgument(m) => {
                    Error::invalid(format!("{}: {m}", pipeline.entry_point))
                }
                other => other,
            })?;
        pending.dispatches += 1;
        Self::maybe_commit(&mut pending);
        Ok(())
    }
}
