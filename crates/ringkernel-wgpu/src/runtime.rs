//! [`WgpuRuntime`]: event-driven actors on wgpu.
//!
//! WebGPU has no persistent kernels, so a kernel here is a WGSL handler run by **drain
//! passes** (see [`ringkernel_shaders::drain`] for the template and the handler ABI):
//!
//! * Each kernel owns device buffers in the shared binary layout: its
//!   [`ControlBlock`](ringkernel_core::control::ControlBlock), an input and an output ring
//!   ([`QueueHeader`](ringkernel_core::queue::QueueHeader) + slots) and its handler state.
//! * `send` writes the message straight into the slot of a host-side image of the input
//!   ring and wakes the runtime's **worker thread**.
//! * The worker, in rounds: for every active kernel with messages waiting it uploads
//!   *all* waiting slots (up to the room left in the output queue) and records one
//!   dispatch for them (one invocation per message, or one in-order invocation for
//!   `RK_SERIAL` handlers); all kernels' passes go into one submission. It then reads the
//!   output slots and control block back, stamps message ids and HLC timestamps, puts
//!   replies into the kernel's output queue and routes K2K messages to their destination
//!   kernels with [`RuntimeCore::deliver`] (a full destination is retried next round,
//!   never dropped).
//! * Lifecycle: activate/deactivate take effect at the next round; terminate is carried
//!   out by the worker between rounds (an active kernel drains first, an inactive one
//!   hands its queued messages back).

use crate::{AdapterSelection, GpuContext};
use event_listener::{Event, Listener};
use ringkernel_core::control::ControlBlock;
use ringkernel_core::hlc::{HlcClock, HlcTimestamp};
use ringkernel_core::k2k::{K2kReceipt, KernelTarget};
use ringkernel_core::lifecycle::{AtomicLifecycle, LifecycleState};
use ringkernel_core::message::{
    check_payload_fits, flags, read_slot, write_slot, Envelope, MessageHeader, HEADER_SIZE,
};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::queue::QueueHeader;
use ringkernel_core::registry::{GpuHandler, KernelRegistry};
use ringkernel_core::runtime::{
    KernelEngine, KernelEvents, KernelHandle, KernelId, RingKernelRuntime, RuntimeCore,
    TerminateReport,
};
use ringkernel_core::telemetry::{KernelCounters, KernelMetrics};
use ringkernel_core::util::BoxFuture;
use ringkernel_core::{BackendKind, Error, Result};
use ringkernel_shaders::{drain, params, Kernel};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

const QH: usize = std::mem::size_of::<QueueHeader>();
const CB: u64 = std::mem::size_of::<ControlBlock>() as u64;

/// Registers the WGSL versions of the built-in kernels (`rk.echo`, `rk.stage`,
/// `rk.counter`) on `reg`, with the same semantics as the CPU ones in
/// [`ringkernel_core::builtin`]. Their `Token.value` arithmetic is exact f64 (done on the
/// IEEE-754 bits, see [`ringkernel_shaders::drain`]).
pub fn register_wgsl_builtins(reg: &KernelRegistry) {
    for (name, src, state) in drain::builtin_handlers() {
        reg.register_gpu(GpuHandler::new(name).with_wgsl(src).with_state_bytes(state));
    }
}

fn register_missing_builtins(reg: &KernelRegistry) {
    for (name, src, state) in drain::builtin_handlers() {
        if !matches!(reg.gpu(name), Ok(h) if h.wgsl.is_some()) {
            reg.register_gpu(GpuHandler::new(name).with_wgsl(src).with_state_bytes(state));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind: keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Host image of an input ring: slots in the shared layout, written in place by `send`.
struct HostRing {
    bytes: Vec<u8>,
    head: u64,
    tail: u64,
}

struct Gpu {
    params: wgpu::Buffer,
    control: wgpu::Buffer,
    input: wgpu::Buffer,
    output: wgpu::Buffer,
    staging: wgpu::Buffer,
    bind: wgpu::BindGroup,
    pipeline: wgpu::ComputePipeline,
    serial: bool,
}

struct Engine {
    id: KernelId,
    name: String,
    slot_size: usize,
    capacity: usize,
    out_capacity: usize,
    state_words: u32,
    life: AtomicLifecycle,
    was_active: AtomicBool,
    input: Mutex<HostRing>,
    output: Mutex<VecDeque<Envelope>>,
    k2k_pending: Mutex<VecDeque<(KernelId, MessageHeader, Vec<u8>)>>,
    counters: KernelCounters,
    events: KernelEvents,
    hlc: HlcClock,
    drained: AtomicU64,
    report: Mutex<Option<TerminateReport>>,
    gpu: Gpu,
    wake: Arc<Event>,
}

impl Engine {
    fn pending(&self) -> u64 {
        let r = lock(&self.input);
        r.tail - r.head
    }
}

impl KernelEngine for Engine {
    fn id(&self) -> KernelId {
        self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn state(&self) -> LifecycleState {
        self.life.get()
    }
    fn slot_size(&self) -> usize {
        self.slot_size
    }
    fn input_capacity(&self) -> usize {
        self.capacity
    }

    fn try_enqueue(&self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        check_payload_fits(payload.len(), self.slot_size)?;
        if !self.life.get().accepts_messages() {
            return Err(Error::KernelTerminated(self.name.clone()));
        }
        {
            let mut r = lock(&self.input);
            if (r.tail - r.head) as usize >= self.capacity {
                return Err(Error::QueueFull {
                    capacity: self.capacity,
                });
            }
            let slot = (r.tail as usize) & (self.capacity - 1);
            let off = slot * self.slot_size;
            write_slot(&mut r.bytes[off..off + self.slot_size], header, payload)?;
            r.tail += 1;
        }
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        self.wake.notify(usize::MAX);
        Ok(())
    }

    fn try_dequeue(&self) -> Result<Option<Envelope>> {
        let (e, was_full) = {
            let mut out = lock(&self.output);
            let was_full = out.len() >= self.out_capacity;
            (out.pop_front(), was_full)
        };
        if e.is_some() && was_full {
            // The worker skips a kernel whose output queue is full: tell it there is room.
            self.wake.notify(usize::MAX);
        }
        Ok(e)
    }

    fn output_depth(&self) -> usize {
        lock(&self.output).len()
    }

    fn activate(&self) -> Result<()> {
        self.life.transition(LifecycleState::Active)?;
        self.events.state.notify(usize::MAX);
        self.wake.notify(usize::MAX);
        Ok(())
    }

    fn deactivate(&self) -> Result<()> {
        self.life.transition(LifecycleState::Deactivated)?;
        self.events.state.notify(usize::MAX);
        Ok(())
    }

    fn terminate(&self) -> BoxFuture<'_, Result<TerminateReport>> {
        Box::pin(async move {
            let from = self.life.transition(LifecycleState::Terminating)?;
            self.was_active
                .store(from == LifecycleState::Active, Ordering::SeqCst);
            self.events.state.notify(usize::MAX);
            self.wake.notify(usize::MAX);
            loop {
                let l = self.events.state.listen();
                if self.life.get() == LifecycleState::Terminated {
                    break;
                }
                l.await;
            }
            let mut r = lock(&self.report).take().unwrap_or_default();
            r.replies_waiting = self.output_depth();
            Ok(r)
        })
    }

    fn events(&self) -> &KernelEvents {
        &self.events
    }

    fn metrics(&self) -> KernelMetrics {
        self.counters.snapshot(
            self.id,
            &self.name,
            self.life.get(),
            self.pending() as usize,
            self.output_depth(),
        )
    }
}

struct Shared {
    ctx: Arc<GpuContext>,
    core: Arc<RuntimeCore>,
    engines: Mutex<Vec<Arc<Engine>>>,
    wake: Arc<Event>,
    stop: AtomicBool,
    pipelines: Mutex<HashMap<String, (wgpu::ComputePipeline, bool)>>,
}

/// The wgpu implementation of [`RingKernelRuntime`].
pub struct WgpuRuntime {
    shared: Arc<Shared>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for WgpuRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuRuntime")
            .field("adapter", &self.shared.ctx.info)
            .finish()
    }
}

impl WgpuRuntime {
    /// A runtime on the adapter chosen by `RINGKERNEL_WGPU_ADAPTER`, resolving kernel
    /// names through `registry` (the WGSL built-ins are added where missing).
    pub async fn new(registry: KernelRegistry) -> Result<Self> {
        Self::with_selection(registry, AdapterSelection::from_env())
    }

    /// A runtime on the adapter chosen by `sel`.
    pub fn with_selection(registry: KernelRegistry, sel: AdapterSelection) -> Result<Self> {
        Ok(Self::with_context(registry, GpuContext::new(&sel)?))
    }

    /// A runtime on an existing device (e.g. shared with a [`WgpuCompute`](crate::WgpuCompute)).
    pub fn with_context(registry: KernelRegistry, ctx: Arc<GpuContext>) -> Self {
        register_missing_builtins(&registry);
        let shared = Arc::new(Shared {
            ctx,
            core: RuntimeCore::new(BackendKind::Wgpu, registry),
            engines: Mutex::new(Vec::new()),
            wake: Arc::new(Event::new()),
            stop: AtomicBool::new(false),
            pipelines: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&shared);
        let worker = std::thread::Builder::new()
            .name("ringkernel-wgpu".into())
            .spawn(move || worker(weak))
            .ok();
        WgpuRuntime {
            shared,
            worker: Mutex::new(worker),
        }
    }

    /// The device the runtime runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.shared.ctx
    }

    fn pipeline(&self, handler: &str, wgsl: &str) -> Result<(wgpu::ComputePipeline, bool)> {
        if let Some(p) = lock(&self.shared.pipelines).get(handler) {
            return Ok(p.clone());
        }
        let src = drain::compose(wgsl);
        let v = ringkernel_shaders::validate_source(handler, &src)?;
        let serial = drain::is_serial(&v.module);
        let k = if serial {
            Kernel::DrainSerial
        } else {
            Kernel::Drain
        };
        let dev = &self.shared.ctx.device;
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(handler),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let p = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(handler),
            layout: None,
            module: &module,
            entry_point: Some(k.entry_point()),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Compile {
                backend: BackendKind::Wgpu,
                log: format!("{handler}: {e}"),
            });
        }
        lock(&self.shared.pipelines).insert(handler.to_string(), (p.clone(), serial));
        Ok((p, serial))
    }

    fn launch_now(&self, handler: &str, opts: &LaunchOptions) -> Result<KernelHandle> {
        opts.validate()?;
        let h = self.shared.core.registry().gpu(handler)?;
        let wgsl = h.wgsl.clone().ok_or_else(|| {
            Error::KernelNotFound(format!("GPU handler {handler:?} has no WGSL source"))
        })?;
        let name = opts.name.clone().unwrap_or_else(|| handler.to_string());
        let id = self.shared.core.reserve(&name)?;
        match self.build(id, &name, handler, &wgsl, h.state_bytes, opts) {
            Ok(engine) => {
                lock(&self.shared.engines).push(engine.clone());
                let dynamic: Arc<dyn KernelEngine> = engine;
                self.shared.core.insert(dynamic.clone());
                Ok(self.shared.core.handle(dynamic, opts))
            }
            Err(e) => {
                self.shared.core.release(&name);
                Err(e)
            }
        }
    }

    fn build(
        &self,
        id: KernelId,
        name: &str,
        handler: &str,
        wgsl: &str,
        handler_state: usize,
        opts: &LaunchOptions,
    ) -> Result<Arc<Engine>> {
        let (pipeline, serial) = self.pipeline(handler, wgsl)?;
        let dev = &self.shared.ctx.device;
        let cap = opts.queue_capacity;
        let ring_bytes = (QH + cap * opts.slot_size) as u64;
        let limits = dev.limits();
        if ring_bytes
            > limits
                .max_buffer_size
                .min(limits.max_storage_buffer_binding_size)
        {
            return Err(Error::invalid(format!(
                "a queue of {cap} slots of {} bytes does not fit the device's storage-buffer limit",
                opts.slot_size
            )));
        }
        let state_bytes = opts
            .state_bytes
            .max(handler_state)
            .max(drain::MIN_STATE_BYTES)
            .next_multiple_of(4);
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let mk = |label: &str, size: u64, usage: wgpu::BufferUsages| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let gparams = mk(
            "rk params",
            std::mem::size_of::<params::Drain>() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        );
        let control = mk("rk control", CB, storage);
        let input = mk("rk input", ring_bytes, storage);
        let output = mk("rk output", ring_bytes, storage);
        let state = mk("rk state", state_bytes as u64, storage);
        let staging = mk(
            "rk readback",
            ring_bytes + CB,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        // Initial contents: control block and queue headers in the shared layout, zero state.
        let cb = ControlBlock {
            kernel_id: id.0,
            slot_size: opts.slot_size as u32,
            input_capacity: cap as u32,
            output_capacity: cap as u32,
            max_drift_ms: ringkernel_core::hlc::DEFAULT_MAX_DRIFT_MS,
            state: LifecycleState::Launched as u32,
            ..Default::default()
        };
        let q = &self.shared.ctx.queue;
        q.write_buffer(&control, 0, bytemuck::bytes_of(&cb));
        let qh = QueueHeader {
            capacity: cap as u32,
            slot_size: opts.slot_size as u32,
            mask: (cap - 1) as u32,
            ..Default::default()
        };
        q.write_buffer(&input, 0, bytemuck::bytes_of(&qh));
        q.write_buffer(&output, 0, bytemuck::bytes_of(&qh));
        q.write_buffer(&state, 0, &vec![0u8; state_bytes]);
        let layout = pipeline.get_bind_group_layout(0);
        let used = |b: u32| b != 4 || wgsl.contains("rk_state");
        let entries: Vec<wgpu::BindGroupEntry> = [
            (0, &gparams),
            (1, &control),
            (2, &input),
            (3, &output),
            (4, &state),
        ]
        .into_iter()
        .filter(|(b, _)| used(*b))
        .map(|(binding, buf)| wgpu::BindGroupEntry {
            binding,
            resource: buf.as_entire_binding(),
        })
        .collect();
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &layout,
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Device(format!("bind group of {name}: {e}")));
        }
        let engine = Arc::new(Engine {
            id,
            name: name.to_string(),
            slot_size: opts.slot_size,
            capacity: cap,
            out_capacity: opts.output_capacity,
            state_words: (state_bytes / 4) as u32,
            life: AtomicLifecycle::new(LifecycleState::Created),
            was_active: AtomicBool::new(false),
            input: Mutex::new(HostRing {
                bytes: vec![0; cap * opts.slot_size],
                head: 0,
                tail: 0,
            }),
            output: Mutex::new(VecDeque::new()),
            k2k_pending: Mutex::new(VecDeque::new()),
            counters: KernelCounters::default(),
            events: KernelEvents::default(),
            hlc: HlcClock::new(),
            drained: AtomicU64::new(0),
            report: Mutex::new(None),
            gpu: Gpu {
                params: gparams,
                control,
                input,
                output,
                staging,
                bind,
                pipeline,
                serial,
            },
            wake: self.shared.wake.clone(),
        });
        engine.life.transition(LifecycleState::Launched)?;
        if opts.auto_activate {
            engine.life.transition(LifecycleState::Active)?;
        }
        Ok(engine)
    }
}

impl Drop for WgpuRuntime {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify(usize::MAX);
        if let Some(h) = lock(&self.worker).take() {
            let _ = h.join();
        }
    }
}

impl RingKernelRuntime for WgpuRuntime {
    fn core(&self) -> &Arc<RuntimeCore> {
        &self.shared.core
    }

    fn launch<'a>(
        &'a self,
        handler: &'a str,
        opts: LaunchOptions,
    ) -> BoxFuture<'a, Result<KernelHandle>> {
        Box::pin(async move { self.launch_now(handler, &opts) })
    }

    fn device_info(&self) -> String {
        format!("wgpu: {}", self.shared.ctx.info)
    }
}

/// One kernel's pass within a round.
struct Pass {
    engine: Arc<Engine>,
    first: u64,
    count: u64,
    terminating: bool,
}

fn worker(weak: Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let listener = shared.wake.listen();
        let busy = match round(&shared) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "wgpu drain round failed");
                false
            }
        };
        drop(shared);
        if !busy {
            listener.wait_timeout(Duration::from_millis(50));
        }
    }
}

/// Retries K2K messages that met a full queue. Returns whether any are still waiting.
fn flush_k2k(shared: &Shared, e: &Engine) -> bool {
    let mut pending = lock(&e.k2k_pending);
    while let Some((dest, h, payload)) = pending.pop_front() {
        match shared.core.deliver(&KernelTarget::Id(dest), h, &payload) {
            Ok(K2kReceipt::Delivered) => {
                e.counters.emitted.fetch_add(1, Ordering::Relaxed);
            }
            Ok(K2kReceipt::QueueFull) => {
                pending.push_front((dest, h, payload));
                return true;
            }
            Ok(K2kReceipt::NotFound) | Err(_) => {
                tracing::warn!(kernel = %e.name, %dest, "K2K destination not found; message dropped");
                e.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    false
}

fn finish_terminate(e: &Engine) {
    let mut undelivered = Vec::new();
    {
        let mut r = lock(&e.input);
        while r.head < r.tail {
            let slot = (r.head as usize) & (e.capacity - 1);
            let off = slot * e.slot_size;
            if let Ok(env) = read_slot(&r.bytes[off..off + e.slot_size]) {
                undelivered.push(env);
            }
            r.head += 1;
        }
    }
    *lock(&e.report) = Some(TerminateReport {
        drained: e.drained.load(Ordering::Relaxed),
        undelivered,
        replies_waiting: 0,
    });
    let _ = e.life.transition(LifecycleState::Terminated);
    e.events.notify_all();
}

/// One round: a drain pass for every kernel with work, one submission. Returns whether
/// anything happened (so the worker polls again at once).
fn round(shared: &Shared) -> Result<bool> {
    let engines: Vec<Arc<Engine>> = lock(&shared.engines).clone();
    let mut passes = Vec::new();
    let mut k2k_waiting = false;
    for e in &engines {
        let state = e.life.get();
        k2k_waiting |= flush_k2k(shared, e);
        let terminating = state == LifecycleState::Terminating;
        let draining =
            state == LifecycleState::Active || (terminating && e.was_active.load(Ordering::SeqCst));
        if terminating && !draining {
            finish_terminate(e);
            continue;
        }
        if !draining {
            continue;
        }
        let (first, waiting) = {
            let r = lock(&e.input);
            (r.head, r.tail - r.head)
        };
        if waiting == 0 {
            if terminating && lock(&e.k2k_pending).is_empty() {
                finish_terminate(e);
            }
            continue;
        }
        let room = if terminating {
            usize::MAX
        } else {
            e.out_capacity.saturating_sub(e.output_depth())
        };
        let count = waiting.min(room as u64);
        if count == 0 || !lock(&e.k2k_pending).is_empty() {
            continue;
        }
        passes.push(Pass {
            engine: e.clone(),
            first,
            count,
            terminating,
        });
    }
    lock(&shared.engines).retain(|e| e.life.get() != LifecycleState::Terminated);
    if passes.is_empty() {
        return Ok(k2k_waiting);
    }
    let started = Instant::now();
    let q = &shared.ctx.queue;
    let mut enc = shared
        .ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("rk drain"),
        });
    for p in &passes {
        let e = &p.engine;
        let g = &e.gpu;
        let mask = e.capacity as u64 - 1;
        let ss = e.slot_size as u64;
        // Upload the waiting slots (one or two ranges when the ring wraps) and merge
        // their timestamps into the kernel's clock.
        {
            let r = lock(&e.input);
            let mut i = 0;
            while i < p.count {
                let slot = (p.first + i) & mask;
                let run = (p.count - i).min(e.capacity as u64 - slot);
                let off = (slot * ss) as usize;
                let bytes = &r.bytes[off..off + (run * ss) as usize];
                q.write_buffer(&g.input, QH as u64 + slot * ss, bytes);
                for j in 0..run as usize {
                    let h: MessageHeader = bytemuck::pod_read_unaligned(
                        &bytes[j * e.slot_size..j * e.slot_size + HEADER_SIZE],
                    );
                    if let Err(err) = e.hlc.update(HlcTimestamp(h.timestamp)) {
                        tracing::warn!(kernel = %e.name, error = %err, "message timestamp not merged");
                    }
                }
                i += run;
            }
        }
        // One receive timestamp per message of the batch (the drain template adds j).
        let hlc = e.hlc.reserve(p.count as u32).0;
        let dp = params::Drain {
            kernel_id: e.id.0,
            count: p.count as u32,
            first_lo: p.first as u32,
            first_hi: (p.first >> 32) as u32,
            hlc_lo: hlc as u32,
            hlc_hi: (hlc >> 32) as u32,
            slot_words: (ss / 4) as u32,
            mask: mask as u32,
            state_words: e.state_words,
            _pad: [0; 3],
        };
        q.write_buffer(&g.params, 0, bytemuck::bytes_of(&dp));
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("rk drain"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&g.pipeline);
            pass.set_bind_group(0, &g.bind, &[]);
            if g.serial {
                pass.dispatch_workgroups(1, 1, 1);
            } else {
                let grid = ringkernel_shaders::grid_for(
                    p.count.div_ceil(drain::DRAIN_WORKGROUP_SIZE as u64),
                );
                pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            }
        }
        // Read back the output slots of the batch and the control block.
        let mut i = 0;
        while i < p.count {
            let slot = (p.first + i) & mask;
            let run = (p.count - i).min(e.capacity as u64 - slot);
            enc.copy_buffer_to_buffer(
                &g.output,
                QH as u64 + slot * ss,
                &g.staging,
                QH as u64 + slot * ss,
                run * ss,
            );
            i += run;
        }
        let ring_bytes = (QH + e.capacity * e.slot_size) as u64;
        enc.copy_buffer_to_buffer(&g.control, 0, &g.staging, ring_bytes, CB);
    }
    q.submit([enc.finish()]);
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, p) in passes.iter().enumerate() {
        let tx = tx.clone();
        p.engine
            .gpu
            .staging
            .map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send((i, r));
            });
    }
    drop(tx);
    shared.ctx.wait()?;
    let mut mapped = vec![false; passes.len()];
    for (i, r) in rx.try_iter() {
        match r {
            Ok(()) => mapped[i] = true,
            Err(err) => tracing::error!(error = %err, "readback map failed"),
        }
    }
    let elapsed = started.elapsed().as_nanos() as u64;
    for (p, ok) in passes.iter().zip(mapped) {
        if !ok {
            continue;
        }
        collect(shared, p, elapsed)?;
    }
    Ok(true)
}

/// Takes one pass's outputs out of its mapped readback buffer.
fn collect(shared: &Shared, p: &Pass, elapsed_ns: u64) -> Result<()> {
    let e = &p.engine;
    let mask = e.capacity as u64 - 1;
    let ss = e.slot_size;
    let mut replies = Vec::new();
    let mut sends = Vec::new();
    let mut dropped = 0u64;
    {
        let view = e
            .gpu
            .staging
            .get_mapped_range(..)
            .map_err(|err| Error::Device(format!("readback: {err}")))?;
        let ring_bytes = QH + e.capacity * ss;
        let cb: ControlBlock =
            bytemuck::pod_read_unaligned(&view[ring_bytes..ring_bytes + CB as usize]);
        if cb.input_head != p.first + p.count {
            tracing::warn!(kernel = %e.name, head = cb.input_head, "drain pass did not advance the input head");
        }
        for j in 0..p.count {
            let slot = ((p.first + j) & mask) as usize;
            let off = QH + slot * ss;
            let bytes = &view[off..off + ss];
            let mut h: MessageHeader = bytemuck::pod_read_unaligned(&bytes[..HEADER_SIZE]);
            if h.magic == 0 {
                let status = h.reserved[0];
                if status != 0 {
                    dropped += 1;
                    tracing::warn!(kernel = %e.name, status, "handler refused a message; dropped");
                }
                continue;
            }
            match read_slot(bytes) {
                Ok(env) => {
                    h = env.header;
                    h.reserved = [0; 2];
                    h.message_id = shared.core.next_message_id();
                    h.timestamp = e.hlc.tick().0;
                    let env = Envelope {
                        header: h,
                        payload: env.payload,
                    };
                    if h.flags & flags::K2K != 0 {
                        sends.push(env);
                    } else {
                        replies.push(env);
                    }
                }
                Err(err) => {
                    dropped += 1;
                    tracing::warn!(kernel = %e.name, error = %err, "corrupt output slot; dropped");
                }
            }
        }
    }
    e.gpu.staging.unmap();
    let n = p.count;
    e.counters
        .processed
        .fetch_add(n - dropped, Ordering::Relaxed);
    e.counters.dropped.fetch_add(dropped, Ordering::Relaxed);
    let per = elapsed_ns / n.max(1);
    for _ in 0..n {
        e.counters.latency.record(per);
    }
    if p.terminating {
        e.drained.fetch_add(n, Ordering::Relaxed);
    }
    // Free the input slots.
    lock(&e.input).head = p.first + n;
    e.events.input_space.notify(usize::MAX);
    if !replies.is_empty() {
        e.counters
            .emitted
            .fetch_add(replies.len() as u64, Ordering::Relaxed);
        lock(&e.output).extend(replies);
        e.events.output.notify(usize::MAX);
    }
    if !sends.is_empty() {
        let mut pending = lock(&e.k2k_pending);
        pending.extend(
            sends
                .into_iter()
                .map(|env| (KernelId(env.header.dest_kernel), env.header, env.payload)),
        );
    }
    flush_k2k(shared, e);
    Ok(())
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn ok<T: Send + Sync>() {}
    ok::<WgpuRuntime>();
    ok::<Engine>();
}
