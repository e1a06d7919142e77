//! [`WgpuCompute`]: the tensor ops on a wgpu device.
//!
//! * Buffers are `STORAGE | COPY_SRC | COPY_DST` buffers resident on the device
//!   ([`WgpuBuffer`]); host writes go through `queue.write_buffer`, reads through a
//!   staging buffer and `map_async`.
//! * Ops are recorded into one command encoder (one compute pass each) and submitted
//!   together: on a read, a write, `synchronize`, or every [`MAX_BATCH`] ops.
//! * Pipelines are cached per `(Kernel, Specialization)`; shader modules per family.
//! * Large ranges are spread over a 2-D workgroup grid (65535 per dimension).

use crate::{AdapterSelection, GpuContext};
use ringkernel_core::compute::{
    check_len, downcast, AttentionDims, BinaryOp, BufferRef, ComputeBackend, DeviceBuffer,
    MatmulDims, ReduceDims, ReduceOp, RopeDims, UnaryOp,
};
use ringkernel_core::{BackendKind, Error, Result};
use ringkernel_shaders::{
    grid_for, params, Family, Kernel, Specialization, ATTENTION_MAX_HEAD_DIM, MATMUL_TILE,
    WORKGROUP_SIZE,
};
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Ops recorded before the batch is submitted without being asked to.
pub const MAX_BATCH: usize = 256;

/// Elements per chunk in the first pass of a long reduction.
const REDUCE_CHUNK: usize = 16384;

/// A device-resident f32 buffer of [`WgpuCompute`].
#[derive(Debug)]
pub struct WgpuBuffer {
    buf: wgpu::Buffer,
    len: usize,
    owner: u64,
    id: u64,
}

impl WgpuBuffer {
    /// The wgpu buffer (usages `STORAGE | COPY_SRC | COPY_DST`).
    pub fn raw(&self) -> &wgpu::Buffer {
        &self.buf
    }
}

impl DeviceBuffer for WgpuBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn backend(&self) -> BackendKind {
        BackendKind::Wgpu
    }
}

struct Batch {
    encoder: Option<wgpu::CommandEncoder>,
    ops: usize,
}

/// The wgpu implementation of [`ComputeBackend`].
pub struct WgpuCompute {
    ctx: Arc<GpuContext>,
    id: u64,
    next_buffer: AtomicU64,
    modules: Mutex<HashMap<Family, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<(Kernel, Specialization), wgpu::ComputePipeline>>,
    batch: Mutex<Batch>,
}

impl std::fmt::Debug for WgpuCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuCompute")
            .field("adapter", &self.ctx.info)
            .finish()
    }
}

static NEXT_BACKEND: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::Device("wgpu backend lock poisoned".into()))
}

impl WgpuCompute {
    /// On the adapter chosen by `RINGKERNEL_WGPU_ADAPTER` (any adapter when unset).
    pub fn new() -> Result<Self> {
        Self::with_selection(AdapterSelection::from_env())
    }

    /// On a hardware adapter only ([`Error::BackendUnavailable`] on a machine with only
    /// a software adapter). What `Device::auto` uses.
    pub fn new_hardware() -> Result<Self> {
        Self::with_selection(AdapterSelection::Hardware)
    }

    /// On the adapter chosen by `sel`.
    pub fn with_selection(sel: AdapterSelection) -> Result<Self> {
        Ok(Self::with_context(GpuContext::new(&sel)?))
    }

    /// On an existing device (shared with a [`WgpuRuntime`](crate::WgpuRuntime)).
    pub fn with_context(ctx: Arc<GpuContext>) -> Self {
        WgpuCompute {
            ctx,
            id: NEXT_BACKEND.fetch_add(1, Ordering::Relaxed),
            next_buffer: AtomicU64::new(1),
            modules: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            batch: Mutex::new(Batch {
                encoder: None,
                ops: 0,
            }),
        }
    }

    /// The device this backend runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Pipelines compiled so far (for tests of the cache).
    pub fn cached_pipelines(&self) -> usize {
        self.pipelines.lock().map(|p| p.len()).unwrap_or(0)
    }

    fn buf<'a>(&self, b: &'a dyn DeviceBuffer) -> Result<&'a WgpuBuffer> {
        let w = downcast::<WgpuBuffer>(b, BackendKind::Wgpu)?;
        if w.owner != self.id {
            return Err(Error::Device(
                "buffer belongs to another wgpu device: copy it through the host".into(),
            ));
        }
        Ok(w)
    }

    fn max_elems(&self) -> usize {
        let l = self.ctx.device.limits();
        (l.max_buffer_size.min(l.max_storage_buffer_binding_size) / 4) as usize
    }

    fn new_buffer(&self, len: usize) -> Result<WgpuBuffer> {
        if len > self.max_elems() {
            return Err(Error::invalid(format!(
                "buffer of {len} f32 exceeds the device's storage-buffer limit of {} elements",
                self.max_elems()
            )));
        }
        let buf = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ringkernel tensor"),
            size: (len.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(WgpuBuffer {
            buf,
            len,
            owner: self.id,
            id: self.next_buffer.fetch_add(1, Ordering::Relaxed),
        })
    }

    fn pipeline(&self, kernel: Kernel, spec: &Specialization) -> Result<wgpu::ComputePipeline> {
        let key = (kernel, spec.clone());
        if let Some(p) = lock(&self.pipelines)?.get(&key) {
            return Ok(p.clone());
        }
        let family = kernel.family();
        let module = {
            let mut mods = lock(&self.modules)?;
            match mods.get(&family) {
                Some(m) => m.clone(),
                None => {
                    // naga validation first: a clear Compile error instead of a wgpu one.
                    ringkernel_shaders::validate(family)?;
                    let m = self
                        .ctx
                        .device
                        .create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some(family.name()),
                            source: wgpu::ShaderSource::Wgsl(
                                ringkernel_shaders::wgsl(family).into(),
                            ),
                        });
                    mods.insert(family, m.clone());
                    m
                }
            }
        };
        let constants = spec.constants();
        let scope = self
            .ctx
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let p = self
            .ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.entry_point()),
                layout: None,
                module: &module,
                entry_point: Some(kernel.entry_point()),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Compile {
                backend: BackendKind::Wgpu,
                log: format!("{}: {e}", kernel.entry_point()),
            });
        }
        lock(&self.pipelines)?.insert(key, p.clone());
        Ok(p)
    }

    /// Records one dispatch into the current batch.
    fn dispatch(
        &self,
        kernel: Kernel,
        spec: &Specialization,
        params: &[u8],
        bufs: &[(u32, &WgpuBuffer)],
        grid: [u32; 3],
    ) -> Result<()> {
        if grid
            .iter()
            .any(|&g| g > ringkernel_shaders::MAX_WORKGROUPS_PER_DIM)
        {
            return Err(Error::invalid(format!(
                "{}: dispatch of {grid:?} workgroups is too large",
                kernel.entry_point()
            )));
        }
        let pipeline = self.pipeline(kernel, spec)?;
        let uniform = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ringkernel params"),
            size: params.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        uniform
            .get_mapped_range_mut(..)
            .map_err(|e| Error::Device(format!("params buffer: {e}")))?
            .copy_from_slice(params);
        uniform.unmap();
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        for (binding, b) in bufs {
            entries.push(wgpu::BindGroupEntry {
                binding: *binding,
                resource: b.buf.as_entire_binding(),
            });
        }
        let bind = self
            .ctx
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
        let mut batch = lock(&self.batch)?;
        let enc = batch.encoder.get_or_insert_with(|| {
            self.ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("ringkernel ops"),
                })
        });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(kernel.entry_point()),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        }
        batch.ops += 1;
        if batch.ops >= MAX_BATCH {
            self.submit(&mut batch);
        }
        Ok(())
    }

    fn submit(&self, batch: &mut Batch) {
        if let Some(enc) = batch.encoder.take() {
            self.ctx.queue.submit([enc.finish()]);
        }
        batch.ops = 0;
    }

    /// Submits everything recorded so far (without waiting).
    pub fn flush(&self) -> Result<()> {
        let mut batch = lock(&self.batch)?;
        self.submit(&mut batch);
        drop(batch);
        self.ctx.take_error()
    }

    fn distinct(&self, out: &WgpuBuffer, inputs: &[&WgpuBuffer], op: &str) -> Result<()> {
        if inputs.iter().any(|i| i.id == out.id) {
            return Err(Error::invalid(format!(
                "{op}: the output buffer must not alias an input"
            )));
        }
        Ok(())
    }

    fn scratch(&self, len: usize) -> Result<WgpuBuffer> {
        self.new_buffer(len)
    }

    #[allow(clippy::too_many_arguments)]
    fn elementwise(
        &self,
        kernel: Kernel,
        op: u32,
        a: &WgpuBuffer,
        b: Option<&WgpuBuffer>,
        out: &WgpuBuffer,
        len: usize,
        scalar: f32,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        // Whole vec4s when the length allows (16-byte accesses: closer to the memory
        // bandwidth); the scalar kernels otherwise.
        let (kernel, len) = match (len & 3 == 0, kernel) {
            (true, Kernel::Unary) => (Kernel::Unary4, len / 4),
            (true, Kernel::Binary) => (Kernel::Binary4, len / 4),
            (true, Kernel::BinaryScalar) => (Kernel::BinaryScalar4, len / 4),
            (true, Kernel::Swiglu) => (Kernel::Swiglu4, len / 4),
            (_, k) => (k, len),
        };
        let p = params::Elementwise {
            len: len as u32,
            scalar,
            _pad: [0; 2],
        };
        let mut bufs = vec![(1, a), (3, out)];
        if let Some(b) = b {
            bufs.push((2, b));
        }
        let spec = if kernel.overrides().is_empty() {
            Specialization::none()
        } else {
            Specialization::op(op)
        };
        self.dispatch(
            kernel,
            &spec,
            bytemuck::bytes_of(&p),
            &bufs,
            grid_for(len.div_ceil(WORKGROUP_SIZE as usize) as u64),
        )
    }

    fn check_u32(&self, what: &str, v: usize) -> Result<()> {
        if v > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "{what} = {v} exceeds the 32-bit index range of the WGSL kernels"
            )));
        }
        Ok(())
    }

    /// Reduction of `[outer, axis]` rows (contiguous) into `out[outer]`.
    fn reduce_rows(
        &self,
        op: ReduceOp,
        x: &WgpuBuffer,
        out: &WgpuBuffer,
        outer: usize,
        axis: usize,
    ) -> Result<()> {
        let final_scale = if op == ReduceOp::Mean {
            1.0 / axis as f32
        } else {
            1.0
        };
        let code = op.code();
        if axis <= REDUCE_CHUNK || outer >= 4096 {
            let p = params::Reduce {
                outer: outer as u32,
                axis: axis as u32,
                inner: 1,
                chunks: 1,
                chunk_len: axis as u32,
                scale: final_scale,
                _pad: [0; 2],
            };
            return self.dispatch(
                Kernel::ReduceRows,
                &Specialization::op(code),
                bytemuck::bytes_of(&p),
                &[(1, x), (3, out)],
                grid_for(outer as u64),
            );
        }
        let chunks = axis.div_ceil(REDUCE_CHUNK);
        let tmp = self.scratch(outer * chunks)?;
        let p1 = params::Reduce {
            outer: outer as u32,
            axis: axis as u32,
            inner: 1,
            chunks: chunks as u32,
            chunk_len: REDUCE_CHUNK as u32,
            scale: 1.0,
            _pad: [0; 2],
        };
        self.dispatch(
            Kernel::ReduceRows,
            &Specialization::op(code),
            bytemuck::bytes_of(&p1),
            &[(1, x), (3, &tmp)],
            grid_for((outer * chunks) as u64),
        )?;
        self.reduce_rows_final(code, &tmp, out, outer, chunks, final_scale)
    }

    fn reduce_rows_final(
        &self,
        code: u32,
        tmp: &WgpuBuffer,
        out: &WgpuBuffer,
        outer: usize,
        chunks: usize,
        scale: f32,
    ) -> Result<()> {
        let p2 = params::Reduce {
            outer: outer as u32,
            axis: chunks as u32,
            inner: 1,
            chunks: 1,
            chunk_len: chunks as u32,
            scale,
            _pad: [0; 2],
        };
        self.dispatch(
            Kernel::ReduceRows,
            &Specialization::op(code),
            bytemuck::bytes_of(&p2),
            &[(1, tmp), (3, out)],
            grid_for(outer as u64),
        )
    }

    fn check_attention(&self, d: &AttentionDims) -> Result<()> {
        if d.kv_len > d.kv_stride {
            return Err(Error::shape(format!(
                "attention: kv_len {} exceeds kv_stride {}",
                d.kv_len, d.kv_stride
            )));
        }
        for (w, v) in [
            (
                "batch_heads·kv_stride·head_dim",
                d.batch_heads * d.kv_stride * d.head_dim,
            ),
            (
                "batch_heads·q_len·kv_len",
                d.batch_heads * d.q_len * d.kv_len,
            ),
        ] {
            self.check_u32(w, v)?;
        }
        Ok(())
    }

    fn attn_params(d: &AttentionDims) -> params::Attention {
        params::Attention {
            batch_heads: d.batch_heads as u32,
            q_len: d.q_len as u32,
            kv_len: d.kv_len as u32,
            kv_stride: d.kv_stride as u32,
            head_dim: d.head_dim as u32,
            scale: d.scale,
            causal: d.causal as u32,
            q_offset: d.q_offset as u32,
        }
    }
}

fn threads_grid(n: usize) -> [u32; 3] {
    grid_for(n.div_ceil(WORKGROUP_SIZE as usize) as u64)
}

impl ComputeBackend for WgpuCompute {
    fn kind(&self) -> BackendKind {
        BackendKind::Wgpu
    }

    fn device_name(&self) -> String {
        format!(
            "{} ({}, {})",
            self.ctx.info.name, self.ctx.info.backend, self.ctx.info.device_type
        )
    }

    fn alloc(&self, len: usize) -> Result<BufferRef> {
        Ok(Arc::new(self.new_buffer(len)?))
    }

    fn upload(&self, data: &[f32]) -> Result<BufferRef> {
        let b = self.new_buffer(data.len())?;
        if !data.is_empty() {
            self.flush()?;
            self.ctx
                .queue
                .write_buffer(&b.buf, 0, bytemuck::cast_slice(data));
        }
        Ok(Arc::new(b))
    }

    fn write(&self, buf: &dyn DeviceBuffer, offset: usize, data: &[f32]) -> Result<()> {
        let b = self.buf(buf)?;
        check_len(buf, offset.saturating_add(data.len()), "write")?;
        if data.is_empty() {
            return Ok(());
        }
        // Queue writes run before the next submission: submit what is recorded first so
        // the write lands after the ops that were issued before it.
        self.flush()?;
        self.ctx
            .queue
            .write_buffer(&b.buf, (offset * 4) as u64, bytemuck::cast_slice(data));
        Ok(())
    }

    fn read(&self, buf: &dyn DeviceBuffer, offset: usize, out: &mut [f32]) -> Result<()> {
        let b = self.buf(buf)?;
        check_len(buf, offset.saturating_add(out.len()), "read")?;
        if out.is_empty() {
            return Ok(());
        }
        self.flush()?;
        let bytes = self
            .ctx
            .read_bytes(&b.buf, (offset * 4) as u64, (out.len() * 4) as u64)?;
        bytemuck::cast_slice_mut(out).copy_from_slice(&bytes);
        Ok(())
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
        check_len(src, src_offset.saturating_add(len), "copy source")?;
        check_len(dst, dst_offset.saturating_add(len), "copy destination")?;
        if len == 0 {
            return Ok(());
        }
        let same = s.id == d.id;
        if same && src_offset < dst_offset + len && dst_offset < src_offset + len {
            return Err(Error::invalid(
                "copy: source and destination ranges overlap",
            ));
        }
        let mut batch = lock(&self.batch)?;
        let enc = batch.encoder.get_or_insert_with(|| {
            self.ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("ringkernel ops"),
                })
        });
        let bytes = (len * 4) as u64;
        if same {
            // wgpu does not copy within one buffer: go through a scratch buffer.
            let tmp = self.scratch(len)?;
            enc.copy_buffer_to_buffer(&s.buf, (src_offset * 4) as u64, &tmp.buf, 0, bytes);
            enc.copy_buffer_to_buffer(&tmp.buf, 0, &d.buf, (dst_offset * 4) as u64, bytes);
        } else {
            enc.copy_buffer_to_buffer(
                &s.buf,
                (src_offset * 4) as u64,
                &d.buf,
                (dst_offset * 4) as u64,
                bytes,
            );
        }
        batch.ops += 1;
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.flush()?;
        self.ctx.wait()
    }

    fn unary(
        &self,
        op: UnaryOp,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (xb, ob) = (self.buf(x)?, self.buf(out)?);
        check_len(x, len, "unary input")?;
        check_len(out, len, "unary output")?;
        self.distinct(ob, &[xb], "unary")?;
        self.elementwise(Kernel::Unary, op.code(), xb, None, ob, len, 0.0)
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
        check_len(a, len, "binary a")?;
        check_len(b, len, "binary b")?;
        check_len(out, len, "binary output")?;
        self.distinct(ob, &[ab, bb], "binary")?;
        self.elementwise(Kernel::Binary, op.code(), ab, Some(bb), ob, len, 0.0)
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
        check_len(a, len, "binary_scalar input")?;
        check_len(out, len, "binary_scalar output")?;
        self.distinct(ob, &[ab], "binary_scalar")?;
        self.elementwise(Kernel::BinaryScalar, op.code(), ab, None, ob, len, s)
    }

    fn matmul(
        &self,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: MatmulDims,
    ) -> Result<()> {
        let (ab, bb, ob) = (self.buf(a)?, self.buf(b)?, self.buf(out)?);
        let b_batches = if d.b_batched { d.batch } else { 1 };
        check_len(a, d.batch * d.m * d.k, "matmul A")?;
        check_len(b, b_batches * d.k * d.n, "matmul B")?;
        check_len(out, d.batch * d.m * d.n, "matmul out")?;
        self.distinct(ob, &[ab, bb], "matmul")?;
        if d.batch == 0 || d.m == 0 || d.n == 0 {
            return Ok(());
        }
        for (w, v) in [
            ("batch·m·k", d.batch * d.m * d.k),
            ("batch·k·n", b_batches * d.k * d.n),
            ("batch·m·n", d.batch * d.m * d.n),
        ] {
            self.check_u32(w, v)?;
        }
        if d.k == 0 {
            // An empty sum: zeros.
            let zeros = vec![0.0f32; d.batch * d.m * d.n];
            return self.write(out, 0, &zeros);
        }
        let p = params::Matmul {
            m: d.m as u32,
            k: d.k as u32,
            n: d.n as u32,
            batch: d.batch as u32,
            a_stride: (d.m * d.k) as u32,
            b_stride: if d.b_batched { (d.k * d.n) as u32 } else { 0 },
            c_stride: (d.m * d.n) as u32,
            _pad: 0,
        };
        let t = MATMUL_TILE as usize;
        let grid = [
            d.n.div_ceil(t) as u32,
            d.m.div_ceil(t) as u32,
            d.batch as u32,
        ];
        self.dispatch(
            Kernel::Matmul,
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, ab), (2, bb), (3, ob)],
            grid,
        )
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
        check_len(a, m * k, "matvec A")?;
        check_len(x, k, "matvec x")?;
        check_len(out, m, "matvec out")?;
        self.distinct(ob, &[ab, xb], "matvec")?;
        self.check_u32("m·k", m * k)?;
        if m == 0 {
            return Ok(());
        }
        let p = params::Matmul {
            m: m as u32,
            k: k as u32,
            n: 1,
            batch: 1,
            a_stride: 0,
            b_stride: 0,
            c_stride: 0,
            _pad: 0,
        };
        self.dispatch(
            Kernel::Matvec,
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, ab), (2, xb), (3, ob)],
            grid_for(m as u64),
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
        check_len(a, len, "dot a")?;
        check_len(b, len, "dot b")?;
        check_len(out, 1, "dot out")?;
        self.distinct(ob, &[ab, bb], "dot")?;
        self.check_u32("len", len)?;
        let chunks = len.div_ceil(REDUCE_CHUNK).max(1);
        let p = params::Reduce {
            outer: 1,
            axis: len as u32,
            inner: 1,
            chunks: chunks as u32,
            chunk_len: REDUCE_CHUNK as u32,
            scale: 1.0,
            _pad: [0; 2],
        };
        if chunks == 1 {
            return self.dispatch(
                Kernel::DotPartial,
                &Specialization::none(),
                bytemuck::bytes_of(&p),
                &[(1, ab), (2, bb), (3, ob)],
                [1, 1, 1],
            );
        }
        let tmp = self.scratch(chunks)?;
        self.dispatch(
            Kernel::DotPartial,
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, ab), (2, bb), (3, &tmp)],
            grid_for(chunks as u64),
        )?;
        self.reduce_rows_final(ReduceOp::Sum.code(), &tmp, ob, 1, chunks, 1.0)
    }

    fn reduce(
        &self,
        op: ReduceOp,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: ReduceDims,
    ) -> Result<()> {
        let (xb, ob) = (self.buf(x)?, self.buf(out)?);
        if d.axis == 0 {
            return Err(Error::invalid(
                "reduce: the reduced axis must have at least one element",
            ));
        }
        check_len(x, d.outer * d.axis * d.inner, "reduce input")?;
        check_len(out, d.outer * d.inner, "reduce output")?;
        self.distinct(ob, &[xb], "reduce")?;
        self.check_u32("outer·axis·inner", d.outer * d.axis * d.inner)?;
        if d.outer == 0 || d.inner == 0 {
            return Ok(());
        }
        if d.inner == 1 {
            return self.reduce_rows(op, xb, ob, d.outer, d.axis);
        }
        let scale = if op == ReduceOp::Mean {
            1.0 / d.axis as f32
        } else {
            1.0
        };
        let p = params::Reduce {
            outer: d.outer as u32,
            axis: d.axis as u32,
            inner: d.inner as u32,
            chunks: 1,
            chunk_len: 0,
            scale,
            _pad: [0; 2],
        };
        self.dispatch(
            Kernel::ReduceStrided,
            &Specialization::op(op.code()),
            bytemuck::bytes_of(&p),
            &[(1, xb), (3, ob)],
            threads_grid(d.outer * d.inner),
        )
    }

    fn softmax(
        &self,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let (xb, ob) = (self.buf(x)?, self.buf(out)?);
        check_len(x, rows * cols, "softmax input")?;
        check_len(out, rows * cols, "softmax output")?;
        self.distinct(ob, &[xb], "softmax")?;
        self.check_u32("rows·cols", rows * cols)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let p = params::Norm {
            rows: rows as u32,
            cols: cols as u32,
            eps: 0.0,
            _pad: 0,
        };
        self.dispatch(
            if cols & 3 == 0 {
                Kernel::Softmax4
            } else {
                Kernel::Softmax
            },
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, xb), (4, ob)],
            grid_for(rows as u64),
        )
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
        check_len(x, rows * cols, "rms_norm input")?;
        check_len(weight, cols, "rms_norm weight")?;
        check_len(out, rows * cols, "rms_norm output")?;
        self.distinct(ob, &[xb, wb], "rms_norm")?;
        self.check_u32("rows·cols", rows * cols)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let p = params::Norm {
            rows: rows as u32,
            cols: cols as u32,
            eps,
            _pad: 0,
        };
        self.dispatch(
            if cols & 3 == 0 {
                Kernel::RmsNorm4
            } else {
                Kernel::RmsNorm
            },
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, xb), (2, wb), (4, ob)],
            grid_for(rows as u64),
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
        check_len(x, rows * cols, "layer_norm input")?;
        check_len(weight, cols, "layer_norm weight")?;
        check_len(bias, cols, "layer_norm bias")?;
        check_len(out, rows * cols, "layer_norm output")?;
        self.distinct(ob, &[xb, wb, bb], "layer_norm")?;
        self.check_u32("rows·cols", rows * cols)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let p = params::Norm {
            rows: rows as u32,
            cols: cols as u32,
            eps,
            _pad: 0,
        };
        self.dispatch(
            Kernel::LayerNorm,
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, xb), (2, wb), (3, bb), (4, ob)],
            grid_for(rows as u64),
        )
    }

    fn rope(
        &self,
        x: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: RopeDims,
    ) -> Result<()> {
        let (xb, pb, ob) = (self.buf(x)?, self.buf(positions)?, self.buf(out)?);
        if d.head_dim & 1 != 0 {
            return Err(Error::invalid(format!(
                "rope: head_dim must be even, got {}",
                d.head_dim
            )));
        }
        let n = d.seq * d.heads * d.head_dim;
        check_len(x, n, "rope input")?;
        check_len(positions, d.seq, "rope positions")?;
        check_len(out, n, "rope output")?;
        self.distinct(ob, &[xb, pb], "rope")?;
        self.check_u32("seq·heads·head_dim", n)?;
        if n == 0 {
            return Ok(());
        }
        let p = params::Rope {
            seq: d.seq as u32,
            heads: d.heads as u32,
            head_dim: d.head_dim as u32,
            base: d.base,
        };
        self.dispatch(
            Kernel::Rope,
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, xb), (2, pb), (4, ob)],
            threads_grid(n / 2),
        )
    }

    fn attention_scores(
        &self,
        q: &dyn DeviceBuffer,
        k: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: AttentionDims,
    ) -> Result<()> {
        let (qb, kb, ob) = (self.buf(q)?, self.buf(k)?, self.buf(out)?);
        self.check_attention(&d)?;
        check_len(q, d.batch_heads * d.q_len * d.head_dim, "attention Q")?;
        check_len(k, d.batch_heads * d.kv_stride * d.head_dim, "attention K")?;
        check_len(out, d.batch_heads * d.q_len * d.kv_len, "attention scores")?;
        self.distinct(ob, &[qb, kb], "attention_scores")?;
        let n = d.batch_heads * d.q_len * d.kv_len;
        if n == 0 {
            return Ok(());
        }
        let p = Self::attn_params(&d);
        self.dispatch(
            Kernel::AttentionScores,
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, qb), (2, kb), (4, ob)],
            threads_grid(n),
        )
    }

    fn attention_weighted_sum(
        &self,
        pr: &dyn DeviceBuffer,
        v: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: AttentionDims,
    ) -> Result<()> {
        let (pb, vb, ob) = (self.buf(pr)?, self.buf(v)?, self.buf(out)?);
        self.check_attention(&d)?;
        check_len(pr, d.batch_heads * d.q_len * d.kv_len, "attention P")?;
        check_len(v, d.batch_heads * d.kv_stride * d.head_dim, "attention V")?;
        check_len(
            out,
            d.batch_heads * d.q_len * d.head_dim,
            "attention output",
        )?;
        self.distinct(ob, &[pb, vb], "attention_weighted_sum")?;
        let n = d.batch_heads * d.q_len * d.head_dim;
        if n == 0 {
            return Ok(());
        }
        let p = Self::attn_params(&d);
        self.dispatch(
            Kernel::AttentionWeightedSum,
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, pb), (3, vb), (4, ob)],
            threads_grid(n),
        )
    }

    fn attention(
        &self,
        q: &dyn DeviceBuffer,
        k: &dyn DeviceBuffer,
        v: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: AttentionDims,
    ) -> Result<()> {
        let (qb, kb, vb, ob) = (self.buf(q)?, self.buf(k)?, self.buf(v)?, self.buf(out)?);
        self.check_attention(&d)?;
        if d.head_dim > ATTENTION_MAX_HEAD_DIM {
            return Err(Error::invalid(format!(
                "attention: head_dim {} exceeds the fused kernel's maximum of {ATTENTION_MAX_HEAD_DIM}; use attention_scores + softmax + attention_weighted_sum",
                d.head_dim
            )));
        }
        check_len(q, d.batch_heads * d.q_len * d.head_dim, "attention Q")?;
        check_len(k, d.batch_heads * d.kv_stride * d.head_dim, "attention K")?;
        check_len(v, d.batch_heads * d.kv_stride * d.head_dim, "attention V")?;
        check_len(
            out,
            d.batch_heads * d.q_len * d.head_dim,
            "attention output",
        )?;
        self.distinct(ob, &[qb, kb, vb], "attention")?;
        let rows = d.batch_heads * d.q_len;
        if rows == 0 || d.head_dim == 0 {
            return Ok(());
        }
        if d.kv_len == 0 {
            return Err(Error::invalid(
                "attention: kv_len must be at least 1 (softmax over no keys)",
            ));
        }
        let p = Self::attn_params(&d);
        self.dispatch(
            Kernel::Attention,
            &Specialization::none(),
            bytemuck::bytes_of(&p),
            &[(1, qb), (2, kb), (3, vb), (4, ob)],
            grid_for(rows as u64),
        )
    }

    fn swiglu(
        &self,
        gate: &dyn DeviceBuffer,
        up: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (gb, ub, ob) = (self.buf(gate)?, self.buf(up)?, self.buf(out)?);
        check_len(gate, len, "swiglu gate")?;
        check_len(up, len, "swiglu up")?;
        check_len(out, len, "swiglu output")?;
        self.distinct(ob, &[gb, ub], "swiglu")?;
        self.elementwise(Kernel::Swiglu, 0, gb, Some(ub), ob, len, 0.0)
    }
}
