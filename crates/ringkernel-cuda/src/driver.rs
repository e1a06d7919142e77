//! The thin layer over the CUDA driver API (through `cudarc`'s `result`/`sys` modules):
//! availability checks that never panic, the device context, streams, modules, device
//! and mapped host memory.
//!
//! `cudarc` with `dynamic-loading` panics when a library it needs cannot be loaded, so
//! nothing here calls into it before [`ensure_driver`] (libcuda), [`ensure_nvrtc`] or
//! [`ensure_cublas`] has checked that the library loads.

use cudarc::driver::{result as cu, sys};
use ringkernel_core::{BackendKind, Error, Result};
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Persistent kernels running in this process (all runtimes).
///
/// Loading a CUDA module while a kernel runs in the context waits for that kernel
/// (seen on driver 580 / CUDA 13, H200): with a persistent kernel, forever. So module
/// loads are refused while this is non-zero; [`CudaRuntime::preload`](crate::CudaRuntime::preload)
/// loads handlers' modules before their kernels start.
pub(crate) static RUNNING_PERSISTENT_KERNELS: AtomicUsize = AtomicUsize::new(0);

/// Environment variable naming the driver library to load instead of the platform's
/// default (`libcuda.so.1` on Linux, `nvcuda.dll` on Windows). Used by the tests to
/// simulate a machine without a driver.
pub const DRIVER_LIBRARY_ENV: &str = "RINGKERNEL_CUDA_DRIVER";

fn unavailable(reason: impl Into<String>) -> Error {
    Error::unavailable(BackendKind::Cuda, reason)
}

/// Maps a driver error to [`Error::Device`], naming what was being done.
pub(crate) fn dev_err(what: &str) -> impl FnOnce(cu::DriverError) -> Error + '_ {
    move |e| Error::Device(format!("CUDA {what}: {e}"))
}

/// The names tried for the driver library on this platform.
pub fn driver_library_candidates() -> Vec<String> {
    if let Ok(name) = std::env::var(DRIVER_LIBRARY_ENV) {
        return vec![name];
    }
    if cfg!(target_os = "windows") {
        vec!["nvcuda.dll".into()]
    } else if cfg!(target_os = "macos") {
        vec![]
    } else {
        vec!["libcuda.so.1".into(), "libcuda.so".into()]
    }
}

/// Whether the CUDA driver library can be loaded on this machine (no CUDA call is made).
pub fn driver_library_present() -> bool {
    load_driver_library().is_ok()
}

fn load_driver_library() -> std::result::Result<(), String> {
    let candidates = driver_library_candidates();
    if candidates.is_empty() {
        return Err("CUDA is not supported on this operating system".into());
    }
    let mut errors = Vec::new();
    for name in &candidates {
        // SAFETY: loading the NVIDIA driver library runs its initialisers, which have no
        // preconditions; the handle is dropped at once (cudarc loads it again itself).
        match unsafe { libloading::Library::new(name) } {
            Ok(_lib) => return Ok(()),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "the NVIDIA driver library could not be loaded ({})",
        errors.join("; ")
    ))
}

/// Checks once per process that the driver loads, initialises and sees a GPU.
/// [`Error::BackendUnavailable`] with the reason otherwise.
pub fn ensure_driver() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // With DRIVER_LIBRARY_ENV set, only that library is checked here; cudarc
            // then loads the driver by its own list of names.
            load_driver_library()?;
            if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
                // Persistent kernels never finish: work queued behind one in the same
                // hardware queue would wait forever. More hardware queues (the maximum,
                // 32) make that far less likely. Must be set before the context exists.
                std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
            }
            if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
                // With lazy loading (the CUDA 12.2+ default) a kernel's code is loaded
                // at its first launch, and that load waits for running kernels: with a
                // persistent kernel running, forever. Load modules eagerly instead.
                std::env::set_var("CUDA_MODULE_LOADING", "EAGER");
            }
            cu::init().map_err(|e| format!("cuInit failed: {e}"))?;
            let n = cu::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
            if n < 1 {
                return Err("the NVIDIA driver is installed but reports no CUDA device".into());
            }
            Ok(())
        })
        .clone()
        .map_err(unavailable)
}

/// Checks that NVRTC (the runtime compiler) loads.
pub fn ensure_nvrtc() -> Result<()> {
    static STATE: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen the candidate names.
    if *STATE.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(unavailable(
            "NVRTC (libnvrtc) could not be loaded: install the CUDA toolkit's runtime compiler or add its lib directory to LD_LIBRARY_PATH",
        ))
    }
}

/// Checks that cuBLAS loads.
pub fn ensure_cublas() -> Result<()> {
    static STATE: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen the candidate names.
    if *STATE.get_or_init(|| unsafe { cudarc::cublas::sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(unavailable(
            "cuBLAS (libcublas) could not be loaded: install the CUDA toolkit's cuBLAS or add its lib directory to LD_LIBRARY_PATH",
        ))
    }
}

/// Facts about one device, read once.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Ordinal.
    pub ordinal: usize,
    /// Marketing name.
    pub name: String,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    /// Total memory in bytes.
    pub total_mem: usize,
    /// Multiprocessors.
    pub sm_count: u32,
    /// Driver version as reported by cuDriverGetVersion (e.g. 13000).
    pub driver_version: i32,
    /// Largest dynamic shared memory a block may opt into.
    pub max_smem_optin: u32,
}

/// A device's primary context, retained for as long as this lives.
pub(crate) struct Device {
    ctx: sys::CUcontext,
    cu_device: sys::CUdevice,
    pub(crate) info: DeviceInfo,
}

// SAFETY: a CUcontext handle may be used from any thread once made current there
// (every entry point calls `bind` first); the primary context is reference-counted by
// the driver and released exactly once in Drop.
unsafe impl Send for Device {}
// SAFETY: as above; the handle itself is never mutated after construction.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish()
    }
}

impl Device {
    /// Retains the primary context of device `ordinal`.
    pub(crate) fn open(ordinal: usize) -> Result<Arc<Device>> {
        ensure_driver()?;
        let count = cu::device::get_count().map_err(dev_err("device count"))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::invalid(format!(
                "CUDA device {ordinal} does not exist ({count} device(s) present)"
            )));
        }
        let cu_device = cu::device::get(ordinal as i32).map_err(dev_err("cuDeviceGet"))?;
        // SAFETY: cu_device is a valid device handle from cuDeviceGet.
        let ctx = unsafe { cu::primary_ctx::retain(cu_device) }
            .map_err(dev_err("retain primary context"))?;
        // SAFETY: ctx was just retained and is valid.
        unsafe { cu::ctx::set_current(ctx) }.map_err(dev_err("set context"))?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            // SAFETY: valid device handle and attribute enum.
            unsafe { cu::device::get_attribute(cu_device, a) }.map_err(dev_err("device attribute"))
        };
        let name = cu::device::get_name(cu_device).map_err(dev_err("device name"))?;
        let cc = (
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let max_smem_optin =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as u32;
        // SAFETY: valid device handle.
        let total_mem =
            unsafe { cu::device::total_mem(cu_device) }.map_err(dev_err("total memory"))?;
        let mut driver_version = 0i32;
        // SAFETY: writes one int through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(dev_err("driver version"))?;
        let mapped = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)?;
        if mapped == 0 {
            tracing::warn!(
                ordinal,
                "device cannot map host memory: persistent kernels will not work"
            );
        }
        Ok(Arc::new(Device {
            ctx,
            cu_device,
            info: DeviceInfo {
                ordinal,
                name,
                cc,
                total_mem,
                sm_count,
                driver_version,
                max_smem_optin,
            },
        }))
    }

    /// Whether this device can read and write `peer`'s memory directly, whether its
    /// atomics on that memory are native (an NVLink-class link; PCIe peer links
    /// usually have none) and the link's relative performance rank:
    /// `(access, native_atomics, rank)`. `(false, false, 0)` for `peer` itself.
    pub(crate) fn peer_attributes(&self, peer: &Device) -> Result<(bool, bool, i32)> {
        if self.cu_device == peer.cu_device {
            return Ok((false, false, 0));
        }
        let mut can = 0i32;
        // SAFETY: writes one int; both handles come from cuDeviceGet.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.cu_device, peer.cu_device) }
            .result()
            .map_err(dev_err("cuDeviceCanAccessPeer"))?;
        let attr = |a: sys::CUdevice_P2PAttribute| -> Result<i32> {
            let mut v = 0i32;
            // SAFETY: writes one int; valid attribute and device handles.
            unsafe { sys::cuDeviceGetP2PAttribute(&mut v, a, self.cu_device, peer.cu_device) }
                .result()
                .map_err(dev_err("cuDeviceGetP2PAttribute"))?;
            Ok(v)
        };
        let atomics =
            attr(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)?;
        let rank = attr(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?;
        Ok((can != 0, atomics != 0, rank))
    }

    /// Lets kernels on this device read and write `peer`'s memory: peer access of this
    /// context to `peer`'s (plain allocations) and access to `peer`'s default memory
    /// pool (what stream-ordered allocations come from; pools ignore context peer
    /// access). One direction only; call it the other way round for the other.
    pub(crate) fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        self.bind()?;
        // SAFETY: both contexts are retained primary contexts; the flags must be 0.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            }
            e => {
                return Err(Error::Device(format!(
                    "CUDA cuCtxEnablePeerAccess (device {} -> {}): {e:?}",
                    self.info.ordinal, peer.info.ordinal
                )))
            }
        }
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: writes one handle; valid device handle.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, peer.cu_device) }
            .result()
            .map_err(dev_err("cuDeviceGetDefaultMemPool"))?;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.cu_device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid access descriptor for a pool of a peer-capable device.
        unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }
            .result()
            .map_err(dev_err("cuMemPoolSetAccess"))
    }

    /// Makes the context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: self.ctx is a retained primary context (valid until Drop).
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(dev_err("set context"))
    }

    /// A new non-blocking stream (does not synchronise with the legacy default stream).
    pub(crate) fn new_stream(self: &Arc<Self>) -> Result<Stream> {
        self.bind()?;
        let s = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(dev_err("create stream"))?;
        Ok(Stream {
            raw: s,
            dev: self.clone(),
        })
    }

    /// A new non-blocking stream with CUDA stream priority `priority` (lower numbers
    /// are higher priorities; see
    /// [`stream_priority`](crate::runtime::stream_priority)), clamped by the driver to the
    /// context's range.
    pub(crate) fn new_stream_with_priority(self: &Arc<Self>, priority: i32) -> Result<Stream> {
        self.bind()?;
        let s = cu::stream::create_with_priority(cu::stream::StreamKind::NonBlocking, priority)
            .map_err(dev_err("create stream"))?;
        Ok(Stream {
            raw: s,
            dev: self.clone(),
        })
    }

    /// The context's stream priority range, `(least, greatest)` (greatest <= least;
    /// both 0 where the device has no stream priorities).
    pub(crate) fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.bind()?;
        cu::stream::get_priority_range().map_err(dev_err("stream priority range"))
    }

    /// Loads a cubin image and returns the module.
    pub(crate) fn load_module(self: &Arc<Self>, image: &[u8]) -> Result<Module> {
        let running = RUNNING_PERSISTENT_KERNELS.load(Ordering::Acquire);
        if running > 0 {
            return Err(Error::invalid(format!(
                "cannot load a CUDA module while {running} persistent kernel(s) run: the driver would wait for them \
                 forever. Create CudaCompute and preload handlers (CudaRuntime::preload) before launching kernels"
            )));
        }
        self.bind()?;
        // cuModuleLoadData wants the image to stay readable for the call only; copy it
        // into an 8-byte-aligned buffer (ELF headers are read as 64-bit words).
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..image.len()].copy_from_slice(image);
        // SAFETY: the pointer refers to a complete cubin image that outlives the call.
        let m = unsafe { cu::module::load_data(aligned.as_ptr() as *const c_void) }
            .map_err(dev_err("load module"))?;
        Ok(Module {
            raw: m,
            dev: self.clone(),
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: releases the reference retained in `open`, exactly once.
        if let Err(e) = unsafe { cu::primary_ctx::release(self.cu_device) } {
            tracing::warn!(error = %e, "releasing the CUDA primary context failed");
        }
    }
}

/// An owned CUDA stream.
pub(crate) struct Stream {
    pub(crate) raw: sys::CUstream,
    dev: Arc<Device>,
}

// SAFETY: CUstream handles may be used from any thread with the context current.
unsafe impl Send for Stream {}
// SAFETY: as above; the handle is immutable.
unsafe impl Sync for Stream {}

impl Stream {
    /// Blocks until everything queued on the stream has finished.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.dev.bind()?;
        // SAFETY: valid stream handle owned by self.
        unsafe { cu::stream::synchronize(self.raw) }.map_err(dev_err("stream synchronize"))
    }

    /// Whether all work on the stream has completed (`Ok(false)` while running).
    pub(crate) fn is_idle(&self) -> Result<bool> {
        self.dev.bind()?;
        // SAFETY: valid stream handle owned by self.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Error::Device(format!("CUDA stream query: {e:?}"))),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: destroys the stream created in new_stream, exactly once; the
            // driver lets queued work finish first.
            unsafe {
                let _ = cu::stream::destroy(self.raw);
            }
        }
    }
}

/// A loaded module.
pub(crate) struct Module {
    raw: sys::CUmodule,
    dev: Arc<Device>,
}

// SAFETY: module and function handles may be used from any thread with the context
// current; they are immutable.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// Looks a kernel up by its `extern "C"` name.
    pub(crate) fn function(&self, name: &str) -> Result<sys::CUfunction> {
        self.dev.bind()?;
        let c = CString::new(name).map_err(|_| Error::invalid("kernel name contains NUL"))?;
        // SAFETY: valid module; the name is a NUL-terminated string.
        unsafe { cu::module::get_function(self.raw, c) }
            .map_err(|e| Error::Device(format!("CUDA kernel {name}: {e}")))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: unloads the module loaded in load_module, exactly once, after
            // every user (kernels hold an Arc to it) is gone.
            unsafe {
                let _ = cu::module::unload(self.raw);
            }
        }
    }
}

/// Pinned host memory mapped into the device's address space (cuMemHostAlloc with
/// DEVICEMAP | PORTABLE), zero-initialised.
pub(crate) struct MappedMemory {
    host: *mut u8,
    device: sys::CUdeviceptr,
    len: usize,
    dev: Arc<Device>,
}

// SAFETY: the allocation is plain memory owned by this value; concurrent access goes
// through atomics in the users (runtime.rs).
unsafe impl Send for MappedMemory {}
// SAFETY: as above.
unsafe impl Sync for MappedMemory {}

impl MappedMemory {
    pub(crate) fn new(dev: &Arc<Device>, len: usize) -> Result<MappedMemory> {
        dev.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: requests `len` bytes of pinned memory; the pointer is checked.
        let host =
            unsafe { cu::malloc_host(len, flags) }.map_err(dev_err("cuMemHostAlloc"))? as *mut u8;
        // SAFETY: host points at `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host, 0, len) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: host is a DEVICEMAP allocation of the current context.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0) }
            .result();
        if let Err(e) = r {
            // SAFETY: frees the allocation made above, exactly once.
            unsafe {
                let _ = cu::free_host(host as *mut c_void);
            }
            return Err(Error::Device(format!(
                "CUDA cuMemHostGetDevicePointer: {e}"
            )));
        }
        Ok(MappedMemory {
            host,
            device,
            len,
            dev: dev.clone(),
        })
    }
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host
    }
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Pinned allocations dropped while persistent kernels ran, freed later: cuMemFreeHost
/// may synchronise the whole device, which would wait for those kernels for ever (seen on
/// an H200, 2026-11-27: a launch that failed after allocating its pinned memory hung while
/// another kernel ran). The next drop that finds no persistent kernel running frees them
/// all.
static RETIRED_HOST: std::sync::Mutex<Vec<(Arc<Device>, usize)>> =
    std::sync::Mutex::new(Vec::new());

impl Drop for MappedMemory {
    fn drop(&mut self) {
        let mut retired = RETIRED_HOST.lock().unwrap_or_else(|p| p.into_inner());
        retired.push((self.dev.clone(), self.host as usize));
        if RUNNING_PERSISTENT_KERNELS.load(Ordering::Acquire) > 0 {
            return;
        }
        for (dev, host) in retired.drain(..) {
            if dev.bind().is_ok() {
                // SAFETY: each entry is an allocation of MappedMemory::new whose owner
                // was dropped (it is pushed once, by that owner's drop, and drained
                // once here); the owners keep it alive until no kernel can touch it.
                unsafe {
                    let _ = cu::free_host(host as *mut c_void);
                }
            }
        }
    }
}

/// Device memory allocated and freed in stream order (cuMemAllocAsync /
/// cuMemFreeAsync) on a given stream, zeroed. Stream-ordered freeing never waits for
/// other streams, so it is safe while persistent kernels run elsewhere (cuMemFree may
/// synchronise the whole device, which would wait for them forever).
pub(crate) struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<Stream>,
}

// SAFETY: a device address is just a number; the memory is owned by this value.
unsafe impl Send for DeviceMemory {}
// SAFETY: as above.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// Allocates `len` bytes (at least 16) and zeroes them; returns once both are done.
    pub(crate) fn zeroed(stream: &Arc<Stream>, len: usize) -> Result<DeviceMemory> {
        stream.dev.bind()?;
        let len = len.max(16);
        // SAFETY: stream-ordered allocation of len bytes on a valid stream.
        let ptr =
            unsafe { cu::malloc_async(stream.raw, len) }.map_err(dev_err("cuMemAllocAsync"))?;
        let mem = DeviceMemory {
            ptr,
            len,
            stream: stream.clone(),
        };
        // SAFETY: ptr points at len bytes allocated above, in the same stream order.
        unsafe { cu::memset_d8_async(ptr, 0, len, stream.raw) }.map_err(dev_err("memset"))?;
        stream.synchronize()?;
        Ok(mem)
    }
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Copies host bytes to `offset`, synchronously.
    pub(crate) fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        if offset.checked_add(bytes.len()).is_none_or(|e| e > self.len) {
            return Err(Error::invalid("device memory write out of range"));
        }
        self.stream.dev.bind()?;
        // SAFETY: the range was checked above; the stream is synchronised before the
        // host buffer can go away.
        unsafe { cu::memcpy_htod_async(self.ptr + offset as u64, bytes, self.stream.raw) }
            .map_err(dev_err("copy to device"))?;
        self.stream.synchronize()
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.stream.dev.bind().is_ok() {
            // SAFETY: frees the allocation made in zeroed, exactly once, in the order of
            // its stream; owners keep it until no kernel uses it.
            unsafe {
                let _ = cu::free_async(self.ptr, self.stream.raw);
            }
        }
    }
}

/// Reads the device facts of `ordinal` without keeping a context.
pub(crate) fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    Ok(Device::open(ordinal)?.info.clone())
}
