//! [`WgpuCompute`]: the tensor ops on a wgpu device.
//!
//! * Buffers are `STORAGE | COPY_SRC | COPY_DST` buffers resident on the device
//!   ([`WgpuBuffer`]); host writes go through `queue.write_buffer`, reads through a
//!   staging buffer and `map_async`.
//! * Every op is a [`Plan`](ringkernel_drain::plan::Plan) of the shared planner
//!   (`ringkernel-drain`, the same plans the Metal backend runs), executed through
//!   [`PlanDevice`]: each dispatch's parameter block becomes a uniform buffer at
//!   binding 0, its operands storage buffers at their WGSL `@binding`.
//! * Dispatches are recorded into one command encoder (one compute pass each) and
//!   submitted together: on a read, a write, `synchronize`, every [`MAX_BATCH`]
//!   dispatches, or once they add up to [`SUBMIT_THREADS`] threads (so a large op
//!   runs on the device while the host records the next; for [`WgpuCompute::dispatch_wgsl`]
//!   a workgroup counts as 256 threads).
//! * Pipelines are cached per `(Kernel, Specialization)`; shader modules per family.

use crate::{AdapterSelection, GpuContext};
use ringkernel_core::compute::{
    checks, downcast, BufferRef, ComputeBackend, DeviceBuffer, MatmulDims,
};
use ringkernel_core::util::lock;
use ringkernel_core::{BackendKind, Error, Result};
use ringkernel_drain::exec::{PlanDevice, Step};
use ringkernel_shaders::{Family, Kernel, MatmulTile, Specialization};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Dispatches recorded before the batch is submitted without being asked to.
pub const MAX_BATCH: usize = 256;
/// Threads (workgroups × workgroup size) recorded before the batch is submitted without
/// being asked to: a large dispatch starts on the device while the host records the
/// next one, instead of waiting for the next read, write or `synchronize`; small ones
/// still share a submission.
pub const SUBMIT_THREADS: u64 = 1 << 20;

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

ringkernel_core::impl_device_buffer!(WgpuBuffer, BackendKind::Wgpu);

struct Batch {
    encoder: Option<wgpu::CommandEncoder>,
    ops: usize,
    threads: u64,
}

/// The wgpu implementation of [`ComputeBackend`].
pub struct WgpuCompute {
    ctx: Arc<GpuContext>,
    id: u64,
    next_buffer: AtomicU64,
    modules: Mutex<HashMap<(Family, Specialization), wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<(Kernel, Specialization), wgpu::ComputePipeline>>,
    batch: Mutex<Batch>,
    pub(crate) tiles: Mutex<crate::matmul_tune::TileState>,
}

impl std::fmt::Debug for WgpuCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuCompute")
            .field("adapter", &self.ctx.info)
            .finish()
    }
}

static NEXT_BACKEND: AtomicU64 = AtomicU64::new(1);

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

    /// On the adapter chosen by `sel`, on a device of its own. Several devices used from
    /// parallel threads deadlocked inside NVIDIA's driver (580, H200; BENCHMARKS.md,
    /// 2026-11-28): where a process runs several backends at once, give them one device
    /// with [`with_context`](Self::with_context) and [`GpuContext::shared`].
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
                threads: 0,
            }),
            tiles: Mutex::new(Default::default()),
        }
    }

    /// The device this backend runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Dispatches recorded and not submitted yet (for tests of the batching).
    pub fn pending_ops(&self) -> usize {
        lock(&self.batch).ops
    }

    /// Pipelines compiled so far (for tests of the cache).
    pub fn cached_pipelines(&self) -> usize {
        lock(&self.pipelines).len()
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
        if let Some(p) = lock(&self.pipelines).get(&key) {
            return Ok(p.clone());
        }
        let family = kernel.family();
        let module_key = (family, ringkernel_shaders::source_key(kernel, spec));
        let module = {
            let mut mods = lock(&self.modules);
            match mods.get(&module_key) {
                Some(m) => m.clone(),
                None => {
                    // naga validation first: a clear Compile error instead of a wgpu one.
                    ringkernel_shaders::validate_kernel(kernel, spec)?;
                    let source = ringkernel_shaders::kernel_wgsl(kernel, spec)?;
                    let desc = wgpu::ShaderModuleDescriptor {
                        label: Some(family.name()),
                        source: wgpu::ShaderSource::Wgsl(source),
                    };
                    let m = if kernel == Kernel::MatmulTiled {
                        // The generated matmul's inner loop reads workgroup memory at
                        // indices in range by construction (the tests of
                        // `matmul_tiled.rs` and of this backend's numerics cover every
                        // tile shape), but wgpu clamps each such index (and bounds each
                        // loop) unless told not to: on a GPU those are integer
                        // instructions among the multiply-adds of every step.
                        // SAFETY: every workgroup index of the generated kernel is below
                        // its array's length: `a_s[cur * bk·bm/4 + ty + kk·bm/4 + g·bm/tm]`
                        // with `ty < bm/tm`, `kk < bk`, `g < tm/4` is at most
                        // `2·bk·bm/4 - 1`, likewise for `b_s` and for the stores (which
                        // skip `e >= count`); every storage access is guarded by explicit
                        // `m`/`n`/`k` checks against operand lengths `prepare` verified;
                        // its only loop runs `tiles = ⌈k/bk⌉` times, and it divides by
                        // non-zero constants only.
                        unsafe {
                            self.ctx.device.create_shader_module_trusted(
                                desc,
                                wgpu::ShaderRuntimeChecks::unchecked(),
                            )
                        }
                    } else {
                        self.ctx.device.create_shader_module(desc)
                    };
                    mods.insert(module_key, m.clone());
                    m
                }
            }
        };
        let constants = ringkernel_shaders::pipeline_constants(kernel, spec);
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
        lock(&self.pipelines).insert(key, p.clone());
        Ok(p)
    }

    fn submit(&self, batch: &mut Batch) {
        if let Some(enc) = batch.encoder.take() {
            self.ctx.queue.submit([enc.finish()]);
        }
        batch.ops = 0;
        batch.threads = 0;
    }

    /// Submits everything recorded so far (without waiting).
    pub fn flush(&self) -> Result<()> {
        let mut batch = lock(&self.batch);
        self.submit(&mut batch);
        drop(batch);
        self.ctx.take_error()
    }

    fn uniform(&self, params: &[u8]) -> Result<wgpu::Buffer> {
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
        Ok(uniform)
    }

    fn encoder<'a>(&self, batch: &'a mut Batch) -> &'a mut wgpu::CommandEncoder {
        batch.encoder.get_or_insert_with(|| {
            self.ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("ringkernel ops"),
                })
        })
    }
}

impl PlanDevice for WgpuCompute {
    type Buffer = WgpuBuffer;

    fn buffer<'a>(&self, b: &'a dyn DeviceBuffer) -> Result<&'a WgpuBuffer> {
        self.buf(b)
    }

    fn scratch(&self, len: usize) -> Result<WgpuBuffer> {
        self.new_buffer(len)
    }

    fn record(&self, steps: &[Step<'_, WgpuBuffer>]) -> Result<()> {
        // Pipelines and bind groups first (pipeline creation may compile), then one
        // compute pass per dispatch under the batch lock.
        let mut prepared = Vec::with_capacity(steps.len());
        for s in steps {
            let d = s.dispatch;
            let pipeline = self.pipeline(d.kernel, &d.spec)?;
            let uniform = self.uniform(&d.params)?;
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: ringkernel_drain::plan::PARAMS_BINDING,
                resource: uniform.as_entire_binding(),
            }];
            entries.extend(s.buffers.iter().map(|(b, buf)| wgpu::BindGroupEntry {
                binding: b.binding,
                resource: buf.buf.as_entire_binding(),
            }));
            let group = self
                .ctx
                .device
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                });
            prepared.push((pipeline, group, d));
        }
        let mut batch = lock(&self.batch);
        for (pipeline, group, d) in &prepared {
            let mut pass =
                self.encoder(&mut batch)
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(d.kernel.entry_point()),
                        timestamp_writes: None,
                    });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
        }
        batch.ops += prepared.len();
        batch.threads += prepared
            .iter()
            .map(|(_, _, d)| {
                let per_group: u64 = d.threads().iter().map(|&t| u64::from(t)).product();
                d.groups.iter().map(|&g| u64::from(g)).product::<u64>() * per_group
            })
            .sum::<u64>();
        if batch.ops >= MAX_BATCH || batch.threads >= SUBMIT_THREADS {
            self.submit(&mut batch);
        }
        Ok(())
    }

    fn copy_elems(
        &self,
        (s, so): (&WgpuBuffer, usize),
        (d, dof): (&WgpuBuffer, usize),
        len: usize,
    ) -> Result<()> {
        let tmp = if s.id == d.id {
            // wgpu does not copy within one buffer: go through a scratch buffer.
            Some(self.new_buffer(len)?)
        } else {
            None
        };
        let mut batch = lock(&self.batch);
        let enc = self.encoder(&mut batch);
        let (so, dof, bytes) = ((so * 4) as u64, (dof * 4) as u64, (len * 4) as u64);
        match tmp {
            Some(tmp) => {
                enc.copy_buffer_to_buffer(&s.buf, so, &tmp.buf, 0, bytes);
                enc.copy_buffer_to_buffer(&tmp.buf, 0, &d.buf, dof, bytes);
            }
            None => enc.copy_buffer_to_buffer(&s.buf, so, &d.buf, dof, bytes),
        }
        batch.ops += 1;
        Ok(())
    }

    /// The register-tiled kernel with this device's tile shape
    /// ([`matmul_tile_for`](WgpuCompute::matmul_tile_for)), with 16-byte accesses where
    /// the shapes and buffer lengths allow them.
    fn run_matmul(&self, dims: MatmulDims, args: [&dyn DeviceBuffer; 3]) -> Result<()> {
        // The arguments are checked before a first large product times the shapes.
        let check = ringkernel_drain::plan::matmul_tiled(dims, MatmulTile::LARGE, false, false)?;
        ringkernel_drain::exec::prepare(self, &check, &args)?;
        let tile = self.matmul_tile_for(dims)?;
        // An `array<vec4<f32>>` binding needs at least 16 bytes.
        let whole_vec4s = |b: &dyn DeviceBuffer| b.len().is_multiple_of(4) && !b.is_empty();
        let vec_a = whole_vec4s(args[0]);
        let vec_b = whole_vec4s(args[1]) && whole_vec4s(args[2]);
        let plan = ringkernel_drain::plan::matmul_tiled(dims, tile, vec_a, vec_b)?;
        ringkernel_drain::exec::run(self, &plan, &args)
    }
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
        checks::range(buf, offset, data.len(), "write")?;
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
        checks::range(buf, offset, out.len(), "read")?;
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

    fn synchronize(&self) -> Result<()> {
        self.flush()?;
        self.ctx.wait()
    }

    ringkernel_drain::planned_ops!();
}

/// One resource of group 0 of a pipeline built by [`WgpuCompute::compile_wgsl`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WgslResource {
    /// `var<uniform>` (the parameter block).
    Uniform,
    /// `var<storage, read>` (`read_only`) or `var<storage, read_write>`.
    Storage {
        /// Whether the shader only reads it.
        read_only: bool,
    },
}

/// A compute pipeline built at run time from WGSL source (a generated kernel), for
/// [`WgpuCompute::dispatch_wgsl`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WgslPipeline {
    pipeline: wgpu::ComputePipeline,
    group_layout: wgpu::BindGroupLayout,
    entry_point: String,
    owner: u64,
}

impl WgpuCompute {
    /// Validates `source` with naga and builds the pipeline of its `entry_point` with
    /// an explicit layout: group 0 holds exactly `resources` (so a resource the shader
    /// does not use still takes its binding). Invalid WGSL or a pipeline wgpu refuses is
    /// [`Error::Compile`] with the diagnostic; `label` names the source in it.
    pub fn compile_wgsl(
        &self,
        label: &str,
        source: &str,
        entry_point: &str,
        resources: &[(u32, WgslResource)],
    ) -> Result<WgslPipeline> {
        ringkernel_shaders::validate_source(label, source)?;
        let scope = self
            .ctx
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let entries: Vec<wgpu::BindGroupLayoutEntry> = resources
            .iter()
            .map(|(binding, r)| wgpu::BindGroupLayoutEntry {
                binding: *binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match r {
                        WgslResource::Uniform => wgpu::BufferBindingType::Uniform,
                        WgslResource::Storage { read_only } => wgpu::BufferBindingType::Storage {
                            read_only: *read_only,
                        },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let group_layout =
            self.ctx
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(label),
                    entries: &entries,
                });
        let layout = self
            .ctx
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(label),
                bind_group_layouts: &[Some(&group_layout)],
                immediate_size: 0,
            });
        let module = self
            .ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = self
            .ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry_point),
                layout: Some(&layout),
                module: &module,
                entry_point: Some(entry_point),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Compile {
                backend: BackendKind::Wgpu,
                log: format!("{label}: {e}"),
            });
        }
        Ok(WgslPipeline {
            pipeline,
            group_layout,
            entry_point: entry_point.to_string(),
            owner: self.id,
        })
    }

    /// The most workgroups one dimension of a dispatch may have on this device
    /// (WebGPU guarantees 65,535).
    pub fn max_workgroups_per_dimension(&self) -> u32 {
        self.ctx
            .device
            .limits()
            .max_compute_workgroups_per_dimension
    }

    /// Records one dispatch of `groups` workgroups of a pipeline from
    /// [`compile_wgsl`](Self::compile_wgsl): `params` (when given) becomes a uniform
    /// buffer at binding 0, each `(binding, buffer)` a storage buffer of group 0. Runs in
    /// order with the other ops of this backend.
    pub fn dispatch_wgsl(
        &self,
        pipeline: &WgslPipeline,
        params: Option<&[u8]>,
        buffers: &[(u32, &dyn DeviceBuffer)],
        groups: [u32; 3],
    ) -> Result<()> {
        if pipeline.owner != self.id {
            return Err(Error::Device(
                "pipeline belongs to another wgpu device".into(),
            ));
        }
        let max = self
            .ctx
            .device
            .limits()
            .max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::invalid(format!(
                "{} workgroups: at most {max} per dimension on this device",
                groups.map(|g| g.to_string()).join(" x ")
            )));
        }
        if groups.contains(&0) {
            return Ok(());
        }
        let uniform = params.map(|p| self.uniform(p)).transpose()?;
        let mut entries = Vec::with_capacity(buffers.len() + 1);
        if let Some(u) = &uniform {
            entries.push(wgpu::BindGroupEntry {
                binding: 0,
                resource: u.as_entire_binding(),
            });
        }
        for (binding, b) in buffers {
            entries.push(wgpu::BindGroupEntry {
                binding: *binding,
                resource: self.buf(*b)?.buf.as_entire_binding(),
            });
        }
        let scope = self
            .ctx
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let group = self
            .ctx
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.group_layout,
                entries: &entries,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::invalid(format!(
                "bindings of {}: {e}",
                pipeline.entry_point
            )));
        }
        let mut batch = lock(&self.batch);
        {
            let mut pass =
                self.encoder(&mut batch)
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(&pipeline.entry_point),
                        timestamp_writes: None,
                    });
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        batch.ops += 1;
        batch.threads += groups.iter().map(|&g| u64::from(g)).product::<u64>()
            * u64::from(ringkernel_shaders::WORKGROUP_SIZE);
        if batch.ops >= MAX_BATCH || batch.threads >= SUBMIT_THREADS {
            self.submit(&mut batch);
        }
        Ok(())
    }
}

// Tile choice and tuning of the register-tiled matmul (the policy and the cache file
// live in `matmul_tune`).
mod tuning {
    use super::WgpuCompute;
    use crate::matmul_tune::*;
    use ringkernel_core::compute::{ComputeBackend, MatmulDims};
    use ringkernel_core::util::lock;
    use ringkernel_core::{Error, Result};
    use ringkernel_shaders::MatmulTile;
    use std::time::{Duration, Instant};

    impl WgpuCompute {
        /// The key of this device in the tuning cache: adapter name, backend and driver
        /// (tabs and line breaks replaced).
        pub fn tuning_key(&self) -> String {
            let i = &self.context().info;
            format!("matmul-large|{}|{}|{}", i.name, i.backend, i.driver)
                .replace(['\t', '\n', '\r'], " ")
        }

        /// Forces the tile shape of every later matmul (`None`: back to the automatic
        /// choice). An unsupported shape is [`Error::InvalidArgument`].
        pub fn set_matmul_tile(&self, tile: Option<MatmulTile>) -> Result<()> {
            if let Some(t) = tile {
                t.check()?;
                self.check_tile_fits(t)?;
            }
            lock(&self.tiles).forced = tile;
            Ok(())
        }

        fn check_tile_fits(&self, t: MatmulTile) -> Result<()> {
            let limit = self
                .context()
                .device
                .limits()
                .max_compute_workgroup_storage_size;
            if t.workgroup_bytes() > limit {
                return Err(Error::invalid(format!(
                    "matmul tile {t} needs {} bytes of workgroup memory; the device has {limit}",
                    t.workgroup_bytes()
                )));
            }
            Ok(())
        }

        /// The candidate shapes that fit this device.
        pub fn matmul_tile_candidates(&self) -> Vec<MatmulTile> {
            MatmulTile::CANDIDATES
                .into_iter()
                .filter(|t| self.check_tile_fits(*t).is_ok())
                .collect()
        }

        /// Times every candidate shape ([`matmul_tile_candidates`](Self::matmul_tile_candidates))
        /// on a product of `dims` over buffers of its own (zeros), best of [`TUNE_RUNS`]
        /// after one untimed run, fastest first. A shape the device fails to build is left
        /// out; none succeeding is the first error.
        pub fn time_matmul_tiles(&self, dims: MatmulDims) -> Result<Vec<(MatmulTile, Duration)>> {
            let b_batch = if dims.b_batched { dims.batch } else { 1 };
            let a = self.alloc(dims.batch * dims.m * dims.k)?;
            let b = self.alloc(b_batch * dims.k * dims.n)?;
            let c = self.alloc(dims.batch * dims.m * dims.n)?;
            let mut times = Vec::new();
            let mut first_err = None;
            for t in self.matmul_tile_candidates() {
                let run = || -> Result<Duration> {
                    let (va, vb) = (!a.is_empty(), !b.is_empty() && !c.is_empty());
                    let plan = ringkernel_drain::plan::matmul_tiled(dims, t, va, vb)?;
                    let args: [&dyn ringkernel_core::compute::DeviceBuffer; 3] = [&*a, &*b, &*c];
                    ringkernel_drain::exec::run(self, &plan, &args)?;
                    self.synchronize()?;
                    let mut best = Duration::MAX;
                    for _ in 0..TUNE_RUNS {
                        let t0 = Instant::now();
                        ringkernel_drain::exec::run(self, &plan, &args)?;
                        self.synchronize()?;
                        best = best.min(t0.elapsed());
                    }
                    Ok(best)
                };
                match run() {
                    Ok(d) => times.push((t, d)),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if times.is_empty() {
                return Err(first_err.unwrap_or_else(|| {
                    Error::Device("no matmul tile shape fits this device".into())
                }));
            }
            times.sort_by_key(|(_, d)| *d);
            Ok(times)
        }

        /// The shape a matmul of `dims` runs with (see the [module docs](crate::matmul_tune)); may time
        /// the candidates on the first large product.
        pub fn matmul_tile_for(&self, dims: MatmulDims) -> Result<MatmulTile> {
            let (forced, tuned) = {
                let s = lock(&self.tiles);
                (s.forced, s.tuned)
            };
            if let Some(t) = forced {
                return Ok(t);
            }
            if let Some(t) = tile_from_env()? {
                self.check_tile_fits(t)?;
                return Ok(t);
            }
            if work(dims) < TUNE_MIN_WORK {
                return Ok(untuned_tile(dims));
            }
            if let Some(t) = tuned {
                return Ok(t);
            }
            // A software adapter runs on the host's cores: timing shapes there costs
            // seconds and says little, so it takes the large shape.
            if !autotune_enabled() || self.context().info.software {
                return Ok(MatmulTile::LARGE);
            }
            let key = self.tuning_key();
            let path = cache_dir().map(|d| d.join(CACHE_FILE));
            let stored = path
                .as_deref()
                .and_then(|p| cached_tile(p, &key))
                .filter(|t| self.check_tile_fits(*t).is_ok());
            let tile = match stored {
                Some(t) => t,
                None => {
                    let best = self.time_matmul_tiles(dims)?[0].0;
                    if let Some(p) = &path {
                        // A read-only or missing cache directory costs a re-tune next time,
                        // nothing else.
                        let _ = store_tile(p, &key, best);
                    }
                    best
                }
            };
            lock(&self.tiles).tuned = Some(tile);
            Ok(tile)
        }
    }
}
