//! [`MetalRuntime`]: event-driven actors on Metal.
//!
//! A kernel is a WGSL handler (registered with
//! [`KernelRegistry::register_gpu`](ringkernel_core::registry::KernelRegistry::register_gpu))
//! composed with the shared drain template, translated to MSL by naga and compiled
//! once per handler. Its queues, control block and state live in `StorageModeShared`
//! buffers; [`DrainEngine`](ringkernel_drain::engine::DrainEngine) does the host
//! side: requests wait in one host lane per priority level, a drain pass is dispatched
//! whenever messages wait (its input slots, in the shared buffer, filled highest
//! priority first), and the command buffer's completion handler (`addCompletedHandler`,
//! on a Metal thread) collects the outputs, routes K2K sends and wakes waiters. No
//! executor thread ever blocks.
//!
//! Priority: message priority is the drain engine's (see
//! [`ringkernel_drain::engine`]); replies and K2K sends carry the kernel's
//! [`LaunchOptions::priority`]. Kernels are not served in turn here (each kernel's
//! command buffer is committed and completes on its own), so kernel priority does not
//! order passes of different kernels on Metal.
//!
//! The built-in kernels (`rk.echo`, `rk.stage`, `rk.counter`) are registered with
//! their WGSL versions from `ringkernel-shaders`.
//!
//! Compiled for Apple targets in CI; not executed by CI (no Apple GPU there). The
//! host side is `ringkernel-drain`'s engine, which CI runs through the WebGPU backend
//! on lavapipe and against a CPU stand-in (`ringkernel-drain/tests/engine.rs`); this
//! file is only the Metal glue (buffers, pipeline, command buffer).

use crate::sys::{MetalBuffer, MetalDevice, Pipeline};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelHandle, RingKernelRuntime, RuntimeCore, ShutdownReport};
use ringkernel_core::{BackendKind, Result};
use ringkernel_drain::engine::{
    ring_bytes, CompileCache, DrainModule, DrainTarget, PassDone, PassOutputs, DRAIN_SLOTS,
};
use ringkernel_drain::sizing::check_fixed_threadgroup;
use ringkernel_shaders::params;
use std::sync::Arc;

/// Registers the WGSL versions of the built-in kernels on `registry` (the shared
/// [`ringkernel_drain::engine::register_builtins`]).
pub use ringkernel_drain::engine::register_builtins;

struct Compiled {
    pipeline: Arc<Pipeline>,
    module: DrainModule,
    /// `(index, order)` of naga's buffer-sizes argument, if the MSL has one.
    sizes: Option<ringkernel_drain::plan::SizesArg>,
}

/// Actors on the system default Metal device. See the [module docs](self).
pub struct MetalRuntime {
    core: Arc<RuntimeCore>,
    device: Arc<MetalDevice>,
    compiled: CompileCache<Compiled>,
}

impl std::fmt::Debug for MetalRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalRuntime")
            .field("device", &self.device.name())
            .finish()
    }
}

impl MetalRuntime {
    /// A runtime on the system default device, resolving handler names through the
    /// process-wide [`KernelRegistry::global`] (the built-in kernels are added to it
    /// where missing): register a program's GPU handlers there, then
    /// `runtime.launch("name", ..)` finds them. `BackendUnavailable` on non-Apple
    /// targets and when the system has no Metal device.
    pub async fn new() -> Result<Self> {
        Self::with_registry(KernelRegistry::global().clone()).await
    }

    /// Like [`MetalRuntime::new`], resolving handler names through `registry`.
    pub async fn with_registry(registry: KernelRegistry) -> Result<Self> {
        let device = crate::open_device()?;
        register_builtins(&registry);
        Ok(MetalRuntime {
            core: RuntimeCore::new(BackendKind::Metal, registry),
            device,
            compiled: CompileCache::default(),
        })
    }

    /// Launches a kernel running the handler registered as `handler`: the
    /// [`RingKernelRuntime::launch`] of this runtime, callable without importing the
    /// trait (as the Metal seed README does).
    pub async fn launch(&self, handler: &str, opts: LaunchOptions) -> Result<KernelHandle> {
        RingKernelRuntime::launch(self, handler, opts).await
    }

    /// Terminates every kernel (draining active ones): [`RingKernelRuntime::shutdown`],
    /// callable without importing the trait.
    pub async fn shutdown(&self) -> Result<ShutdownReport> {
        RingKernelRuntime::shutdown(self).await
    }

    /// The device.
    pub fn device(&self) -> &Arc<MetalDevice> {
        &self.device
    }

    /// The device buffers of one kernel: control block, rings and `state_bytes` of
    /// handler state.
    fn target(
        &self,
        compiled: Arc<Compiled>,
        opts: &LaunchOptions,
        state_bytes: usize,
    ) -> Result<MetalDrainTarget> {
        let ring = ring_bytes(opts.queue_capacity, opts.slot_size);
        let target = MetalDrainTarget {
            device: self.device.clone(),
            compiled,
            control: self
                .device
                .new_buffer(std::mem::size_of::<ringkernel_core::control::ControlBlock>())?,
            input: self.device.new_buffer(ring)?,
            output: self.device.new_buffer(ring)?,
            state: self.device.new_buffer(state_bytes)?,
        };
        // The handler's state starts at zero (written explicitly rather than
        // relying on how the allocator initialises memory).
        target.state.write_bytes(0, &vec![0u8; state_bytes])?;
        Ok(target)
    }

    fn info(&self) -> String {
        format!(
            "Metal: {} (unified memory: {}, working set {} MiB)",
            self.device.name(),
            self.device.has_unified_memory(),
            self.device.recommended_working_set_size() >> 20
        )
    }

    fn compile_module(&self, name: &str, module: DrainModule) -> Result<Compiled> {
        let kernel = module.kernel();
        let msl = ringkernel_shaders::module_to_msl(
            &module.validated,
            kernel.entry_point(),
            kernel.bindings(),
            &Default::default(),
        )?;
        let pipeline = self.device.compile(name, &msl.source, &msl.entry_point)?;
        check_fixed_threadgroup(kernel.entry_point(), pipeline.limits(), msl.workgroup_size)?;
        let sizes = msl
            .sizes_buffer
            .map(|i| (i as u32, msl.sizes_order.clone()));
        Ok(Compiled {
            pipeline: Arc::new(pipeline),
            module,
            sizes,
        })
    }
}

/// The shared buffers and pipeline of one kernel's drain passes.
struct MetalDrainTarget {
    device: Arc<MetalDevice>,
    compiled: Arc<Compiled>,
    control: MetalBuffer,
    input: MetalBuffer,
    output: MetalBuffer,
    state: MetalBuffer,
}

// SAFETY: the three pointers are `contents()` of StorageModeShared buffers owned by
// the target (live as long as it): the rings are `ring_len` bytes each (allocated with
// exactly that size in `launch`), the control buffer `size_of::<ControlBlock>()` = 128
// bytes. No Rust reference aliases them. The GPU writes them only while a pass runs,
// and only where the drain template writes (output slots of the pass, the worker
// line of the control block, the state buffer the host never touches afterwards).
unsafe impl DrainTarget for MetalDrainTarget {
    fn ring_len(&self) -> usize {
        self.input.len().min(self.output.len())
    }
    fn input(&self) -> *mut u8 {
        self.input.contents()
    }
    fn output(&self) -> *mut u8 {
        self.output.contents()
    }
    fn control(&self) -> *mut u8 {
        self.control.contents()
    }
    fn launch(&self, p: params::Drain, done: PassDone) -> Result<()> {
        let kernel = self.compiled.module.kernel();
        let groups = self.compiled.module.groups(p.count);
        let buffers = [&self.control, &self.input, &self.output, &self.state];
        let binds: Vec<(u32, &MetalBuffer, usize)> = DRAIN_SLOTS[1..]
            .iter()
            .zip(buffers)
            .map(|(s, b)| (s.index, b, 0))
            .collect();
        let sizes = match &self.compiled.sizes {
            Some((index, order)) => Some((
                *index,
                ringkernel_drain::plan::buffer_sizes(order, |b| {
                    binds
                        .iter()
                        .find(|(i, _, _)| *i == b)
                        .map(|(_, buf, _)| buf.len())
                })?,
            )),
            None => None,
        };
        let mut inline: Vec<(u32, &[u8])> = vec![(DRAIN_SLOTS[0].index, bytemuck::bytes_of(&p))];
        if let Some((index, bytes)) = &sizes {
            inline.push((*index, bytes));
        }
        let mut batch = self.device.batch()?;
        batch.dispatch(
            &self.compiled.pipeline,
            &binds,
            &inline,
            groups,
            kernel.workgroup_size(),
        )?;
        // The outputs are in the shared output ring itself.
        batch.commit(Some(Box::new(move |r: Result<()>| {
            done(r.map(|()| PassOutputs::InRing))
        })));
        Ok(())
    }
}

ringkernel_drain::drain_runtime!(MetalRuntime);
