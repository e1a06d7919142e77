//! # ringkernel-wgpu
//!
//! The WebGPU backend of RingKernel, on [wgpu](https://wgpu.rs): Vulkan, Metal and DX12
//! adapters, and Mesa's software Vulkan (lavapipe) on a machine without a GPU.
//!
//! * [`WgpuCompute`]: every [`ComputeBackend`](ringkernel_core::compute::ComputeBackend)
//!   op, with the WGSL kernels of `ringkernel-shaders`; matmul runs the register-tiled
//!   kernel with a tile shape chosen per adapter ([`matmul_tune`]: timed once, cached
//!   on disk; `RINGKERNEL_WGPU_AUTOTUNE=0` turns that off,
//!   `RINGKERNEL_WGPU_MATMUL_TILE=128x128x8/8x8` forces a shape).
//! * [`WgpuRuntime`]: event-driven actors (a drain pass per batch of waiting messages,
//!   see [`runtime`]), with [`register_wgsl_builtins`] for `rk.echo`, `rk.stage` and
//!   `rk.counter`.
//! * [`probe`]: the adapters wgpu sees, for `ringkernel info`.
//!
//! ## Adapter selection
//!
//! [`AdapterSelection::from_env`] reads `RINGKERNEL_WGPU_ADAPTER`:
//! `software` (a CPU adapter such as lavapipe), `hardware` (a real GPU), or any other
//! text, matched case-insensitively against adapter names. Unset: the best hardware
//! adapter (discrete > integrated > virtual), else a software one. When nothing fits,
//! the error is [`Error::BackendUnavailable`] listing the adapters that were seen.
//!
//! ```no_run
//! use ringkernel_wgpu::{probe, AdapterSelection, WgpuCompute};
//! for a in probe().unwrap() {
//!     println!("{a}");
//! }
//! let gpu = WgpuCompute::with_selection(AdapterSelection::Software);
//! ```

#![warn(missing_docs)]

pub mod compute;
pub mod halo;
pub mod matmul_tune;
pub mod runtime;
pub mod upload;

pub use compute::{WgpuBuffer, WgpuCompute, WgslPipeline, WgslResource};
pub use halo::{HaloExchangeConfig, WgpuHaloExchange};
pub use ringkernel_shaders::MatmulTile;
pub use runtime::{register_wgsl_builtins, WgpuRuntime};

/// The device the crate's unit tests run on (`RINGKERNEL_WGPU_TEST_ADAPTER`, any adapter
/// when unset), or `None`, with SKIPPED printed, where there is none.
#[cfg(test)]
pub(crate) fn test_context() -> Option<Arc<GpuContext>> {
    let sel = std::env::var("RINGKERNEL_WGPU_TEST_ADAPTER")
        .map(|s| AdapterSelection::parse(&s))
        .unwrap_or(AdapterSelection::Any);
    match GpuContext::shared(&sel) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("SKIPPED: no WebGPU adapter: {e}");
            None
        }
    }
}

use ringkernel_core::{BackendKind, Error, Result};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Name of the environment variable that picks the adapter.
pub const ADAPTER_ENV: &str = "RINGKERNEL_WGPU_ADAPTER";

/// Which adapter to use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AdapterSelection {
    /// The best hardware adapter, else a software one.
    #[default]
    Any,
    /// A software (CPU) adapter, e.g. lavapipe. Deterministic choice for tests.
    Software,
    /// A hardware adapter; none is [`Error::BackendUnavailable`].
    Hardware,
    /// The first adapter whose name contains this text (case-insensitive).
    Name(String),
}

impl AdapterSelection {
    /// From `RINGKERNEL_WGPU_ADAPTER` (`software`, `hardware`, a name substring; unset or
    /// empty: [`AdapterSelection::Any`]).
    pub fn from_env() -> Self {
        match std::env::var(ADAPTER_ENV) {
            Ok(v) => Self::parse(&v),
            Err(_) => AdapterSelection::Any,
        }
    }

    /// Parses the same forms as [`from_env`](Self::from_env).
    pub fn parse(s: &str) -> Self {
        let t = s.trim();
        match t.to_ascii_lowercase().as_str() {
            "" | "any" | "auto" => AdapterSelection::Any,
            "software" | "cpu" => AdapterSelection::Software,
            "hardware" | "gpu" => AdapterSelection::Hardware,
            _ => AdapterSelection::Name(t.to_string()),
        }
    }
}

/// What [`probe`] reports about one adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// Adapter name (e.g. "NVIDIA H100 80GB HBM3", "llvmpipe (LLVM 15.0.6, 256 bits)").
    pub name: String,
    /// Graphics API (Vulkan, Metal, Dx12).
    pub backend: String,
    /// Device type (DiscreteGpu, IntegratedGpu, VirtualGpu, Cpu, Other).
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// Whether it is a software (CPU) adapter.
    pub software: bool,
    /// Whether it is a discrete GPU (its own memory, across a bus from the host).
    pub discrete: bool,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, {}", self.name, self.backend, self.device_type)?;
        if !self.driver.is_empty() {
            write!(f, ", {}", self.driver)?;
        }
        f.write_str(")")
    }
}

fn summary(info: &wgpu::AdapterInfo) -> AdapterSummary {
    let driver = [info.driver.as_str(), info.driver_info.as_str()]
        .iter()
        .filter(|s| !s.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    AdapterSummary {
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver,
        software: info.device_type == wgpu::DeviceType::Cpu,
        discrete: info.device_type == wgpu::DeviceType::DiscreteGpu,
    }
}

/// Held while this process creates (and drops) Vulkan instances, enumerates adapters
/// or opens a device ([`probe`], [`GpuContext::new`]): NVIDIA's driver crashed once
/// when test threads opened and dropped instances at once (see this crate's lib
/// tests), and one device at a time costs only the opening. It is not what ended the
/// wgpu compute suite's deadlock at 16 threads (several devices in use from parallel
/// threads, inside the driver): with it the suite still hung in 1 of 5 runs; sharing
/// one device did (BENCHMARKS.md, 2026-11-28, calls 15–18).
static OPENING: Mutex<()> = Mutex::new(());

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::PRIMARY;
    desc.flags = wgpu::InstanceFlags::empty().with_env();
    wgpu::Instance::new(desc)
}

fn adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY))
}

/// Lists the adapters wgpu can see (possibly none).
pub fn probe() -> Result<Vec<AdapterSummary>> {
    let _one_at_a_time = ringkernel_core::util::lock(&OPENING);
    Ok(adapters(&instance())
        .iter()
        .map(|a| summary(&a.get_info()))
        .collect())
}

fn rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

fn seen(list: &[wgpu::Adapter]) -> String {
    if list.is_empty() {
        "no adapters were found (is a Vulkan driver installed? on Linux without a GPU: \
         apt-get install mesa-vulkan-drivers libvulkan1)"
            .to_string()
    } else {
        let names: Vec<String> = list
            .iter()
            .map(|a| summary(&a.get_info()).to_string())
            .collect();
        format!("adapters seen: {}", names.join("; "))
    }
}

/// Picks an adapter according to `sel` (pure function of the list, for testing).
fn pick(list: &[wgpu::Adapter], sel: &AdapterSelection) -> Result<usize> {
    let infos: Vec<wgpu::AdapterInfo> = list.iter().map(|a| a.get_info()).collect();
    let mut order: Vec<usize> = (0..infos.len()).collect();
    order.sort_by_key(|&i| rank(infos[i].device_type));
    let found = match sel {
        AdapterSelection::Any => order.first().copied(),
        AdapterSelection::Software => order
            .iter()
            .copied()
            .find(|&i| infos[i].device_type == wgpu::DeviceType::Cpu),
        AdapterSelection::Hardware => order
            .iter()
            .copied()
            .find(|&i| infos[i].device_type != wgpu::DeviceType::Cpu),
        AdapterSelection::Name(n) => {
            let n = n.to_ascii_lowercase();
            order
                .iter()
                .copied()
                .find(|&i| infos[i].name.to_ascii_lowercase().contains(&n))
        }
    };
    found.ok_or_else(|| {
        let what = match sel {
            AdapterSelection::Any => "no adapter".to_string(),
            AdapterSelection::Software => "no software adapter".to_string(),
            AdapterSelection::Hardware => "no hardware adapter (only software or none)".to_string(),
            AdapterSelection::Name(n) => format!("no adapter named like {n:?}"),
        };
        Error::unavailable(BackendKind::Wgpu, format!("{what}: {}", seen(list)))
    })
}

/// A wgpu device and queue on a chosen adapter, shared by the compute backend and the
/// runtime.
pub struct GpuContext {
    /// The adapter.
    pub adapter: wgpu::Adapter,
    /// The logical device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// What the adapter reported.
    pub info: AdapterSummary,
    errors: Arc<Mutex<Vec<String>>>,
}

impl fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.info)
            .finish()
    }
}

impl GpuContext {
    /// Opens a device on the adapter chosen by `sel`. Several devices used from parallel
    /// threads deadlocked inside NVIDIA's driver (580, H200; BENCHMARKS.md, 2026-11-28):
    /// prefer [`GpuContext::shared`] where one device will do.
    pub fn new(sel: &AdapterSelection) -> Result<Arc<Self>> {
        // Declared first, so released last: after the instance and the adapters not
        // picked are dropped.
        let _one_at_a_time = ringkernel_core::util::lock(&OPENING);
        let inst = instance();
        let list = adapters(&inst);
        let i = pick(&list, sel)?;
        let adapter = list.into_iter().nth(i).expect("index from pick");
        let info = summary(&adapter.get_info());
        let limits = adapter.limits();
        // Timestamp queries where the adapter has them: benchmarks read the device's own
        // clock around their dispatches (nothing else depends on them).
        let timing =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        let desc = wgpu::DeviceDescriptor {
            label: Some("ringkernel"),
            required_features: adapter.features() & timing,
            required_limits: limits,
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(|e| {
            Error::unavailable(
                BackendKind::Wgpu,
                format!("could not open a device on {info}: {e}"),
            )
        })?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        // Validation errors outside an error scope land here instead of panicking; the
        // next operation that checks reports them as Error::Device.
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            tracing::error!(error = %e, "wgpu error");
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        Ok(Arc::new(GpuContext {
            adapter,
            device,
            queue,
            info,
            errors,
        }))
    }

    /// The process-wide device on the adapter chosen by `sel`: opened by the first call
    /// for this selection, then handed out to every caller (it stays open until the
    /// process ends). [`WgpuRuntime::with_selection`] uses it, so that several runtimes
    /// in one process share one device instead of each creating and destroying its own
    /// Vulkan instance and device while the others run (which some drivers do not
    /// survive). A failure is not cached: the next call tries again.
    pub fn shared(sel: &AdapterSelection) -> Result<Arc<Self>> {
        static SHARED: Mutex<Vec<(AdapterSelection, Arc<GpuContext>)>> = Mutex::new(Vec::new());
        // Held while a device opens, so that two first callers do not open two.
        let mut all = ringkernel_core::util::lock(&SHARED);
        if let Some((_, ctx)) = all.iter().find(|(s, _)| s == sel) {
            return Ok(ctx.clone());
        }
        let ctx = GpuContext::new(sel)?;
        all.push((sel.clone(), ctx.clone()));
        Ok(ctx)
    }

    /// Takes the errors wgpu reported since the last call, as one [`Error::Device`].
    pub fn take_error(&self) -> Result<()> {
        let mut v = self
            .errors
            .lock()
            .map_err(|_| Error::Device("wgpu error list poisoned".into()))?;
        if v.is_empty() {
            Ok(())
        } else {
            let msg = v.join("; ");
            v.clear();
            Err(Error::Device(format!("wgpu on {}: {msg}", self.info.name)))
        }
    }

    /// Waits for all submitted work.
    pub fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("wgpu poll on {}: {e}", self.info.name)))?;
        self.take_error()
    }

    /// Reads `size` bytes at `offset` of `buf` (which needs `COPY_SRC`) after all
    /// submitted work, through a staging buffer.
    pub fn read_bytes(&self, buf: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        if size == 0 {
            return Ok(Vec::new());
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ringkernel staging"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, size);
        self.queue.submit([enc.finish()]);
        self.map_and_copy(&staging, size)
    }

    /// Maps a `MAP_READ` buffer after all submitted work and copies `size` bytes out.
    pub fn map_and_copy(&self, staging: &wgpu::Buffer, size: u64) -> Result<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, 0..size, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| Error::Device("map callback dropped".into()))?
            .map_err(|e| Error::Device(format!("buffer map failed: {e}")))?;
        let out = {
            let view = staging
                .get_mapped_range(0..size)
                .map_err(|e| Error::Device(format!("mapped range: {e}")))?;
            view.to_vec()
        };
        staging.unmap();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opening and dropping instances from parallel test threads crashed NVIDIA's Vulkan
    /// driver once (a segfault on the device machine); these tests take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn selection_parses() {
        assert_eq!(
            AdapterSelection::parse("software"),
            AdapterSelection::Software
        );
        assert_eq!(
            AdapterSelection::parse(" Hardware "),
            AdapterSelection::Hardware
        );
        assert_eq!(AdapterSelection::parse(""), AdapterSelection::Any);
        assert_eq!(
            AdapterSelection::parse("H100"),
            AdapterSelection::Name("H100".into())
        );
    }

    #[test]
    fn unknown_name_lists_what_was_seen() {
        let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let e = GpuContext::new(&AdapterSelection::Name("no-such-adapter-xyz".into())).unwrap_err();
        match e {
            Error::BackendUnavailable { backend, reason } => {
                assert_eq!(backend, BackendKind::Wgpu);
                assert!(reason.contains("no-such-adapter-xyz"), "{reason}");
                assert!(
                    reason.contains("adapters seen") || reason.contains("no adapters"),
                    "{reason}"
                );
            }
            e => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn hardware_required_on_a_software_only_machine_is_unavailable() {
        let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let list = probe().unwrap();
        if list.iter().any(|a| !a.software) {
            // A real GPU is here: hardware selection must work instead.
            assert!(GpuContext::new(&AdapterSelection::Hardware).is_ok());
            return;
        }
        let e = GpuContext::new(&AdapterSelection::Hardware).unwrap_err();
        let s = e.to_string();
        assert!(matches!(e, Error::BackendUnavailable { .. }), "{s}");
        assert!(s.contains("no hardware adapter"), "{s}");
        for a in &list {
            assert!(s.contains(&a.name), "{s} should list {}", a.name);
        }
    }
}
