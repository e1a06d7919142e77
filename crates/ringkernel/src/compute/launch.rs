//! Launching kernels written once in Rust (`#[gpu_kernel]`) on any [`Device`].
//!
//! ```
//! use ringkernel::codegen::dsl::*;
//! use ringkernel::compute::Device;
//! use ringkernel::{args, gpu_kernel};
//!
//! #[gpu_kernel]
//! fn scale(data: &mut [f32], factor: f32, n: i32) {
//!     let i = block_idx_x() * block_dim_x() + thread_idx_x();
//!     if i < n {
//!         data[i as usize] *= factor;
//!     }
//! }
//!
//! let dev = Device::cpu(); // or Device::wgpu()?, Device::cuda(0)?, Device::metal()?
//! let mut data = vec![1.5f32; 100];
//! dev.launch(&SCALE, [2, 1, 1], [64, 1, 1], &mut args![&mut data, 2.0f32, 100])?;
//! assert!(data.iter().all(|&v| v == 3.0));
//! # Ok::<(), ringkernel::Error>(())
//! ```
//!
//! On the CPU the Rust function runs for every thread of the grid (`dsl::launch`); on
//! wgpu the kernel's WGSL, translated for the launch's block size, on CUDA its CUDA C
//! through NVRTC, on Metal naga's MSL of the WGSL. Each device translates and compiles a
//! kernel once (per block size for WGSL) and keeps the result ([`LaunchInfo`] says which
//! launch paid for it). Host slices are copied to the device, and the mutable ones
//! back, at every launch; [`Tensor`]s (`&t` read-only, `&mut t` writable, for `f32`
//! slice parameters) stay on the device and are bound in place, so a chain of launches
//! on tensors copies nothing.

use super::{Device, Tensor};
use crate::backends::Native;
use crate::core::compute::BufferRef;
use crate::{BackendKind, Error, Result};
use ringkernel_codegen::launch::{ArgError, DeviceRef, GpuKernel, KernelArg};
use ringkernel_codegen::ParamValue;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a [`Device::launch`] did besides running the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchInfo {
    /// This launch translated and compiled the kernel for the device (its first use
    /// there, or the first with this block size on wgpu/Metal); `false` when the
    /// compiled kernel came from the device's cache, and on the CPU.
    pub compiled: bool,
    /// Time spent translating and compiling (zero when `compiled` is false).
    pub compile_time: Duration,
    /// Time of the whole launch: compiling, copying the slices in and out, running.
    pub total_time: Duration,
}

/// A kernel compiled for one device.
#[derive(Clone)]
enum Compiled {
    #[cfg(feature = "wgpu")]
    Wgpu {
        pipeline: ringkernel_wgpu::WgslPipeline,
        layout: ringkernel_codegen::WgslKernel,
    },
    #[cfg(feature = "cuda")]
    Cuda(ringkernel_cuda::CudaFunction),
    #[cfg(feature = "metal")]
    Metal {
        pipeline: ringkernel_metal::MslPipeline,
        layout: ringkernel_codegen::WgslKernel,
    },
}

/// Which compiled form: the kernel (by name and a hash of its Rust source) and, for
/// WGSL, the workgroup size and whether the grid is folded.
type Key = (&'static str, u64, [u32; 3], bool);

/// Per-device cache of compiled generated kernels.
#[derive(Default)]
pub(crate) struct KernelCache {
    map: Mutex<HashMap<Key, Compiled>>,
}

impl KernelCache {
    /// Kernels compiled so far.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn arg_err(e: ArgError) -> Error {
    Error::invalid(e.to_string())
}

/// `log` of a compile error with the generated source appended, numbered.
#[cfg_attr(
    not(any(feature = "wgpu", feature = "cuda", feature = "metal")),
    allow(dead_code)
)]
fn with_source(e: Error, kernel: &str, lang: &str, source: &str) -> Error {
    match e {
        Error::Compile { backend, log } => {
            let numbered: String = source
                .lines()
                .enumerate()
                .map(|(i, l)| format!("{:4} | {l}\n", i + 1))
                .collect();
            Error::Compile {
                backend,
                log: format!("{log}\n\ngenerated {lang} of kernel `{kernel}`:\n{numbered}"),
            }
        }
        other => other,
    }
}

#[allow(dead_code)] // unused without a WGSL backend
fn wgsl_layout(
    kernel: &GpuKernel,
    backend: BackendKind,
    block: [u32; 3],
    fold: bool,
) -> Result<ringkernel_codegen::WgslKernel> {
    if let Err(why) = kernel.wgsl_source {
        return Err(Error::Compile {
            backend,
            log: format!("kernel `{}` has no WGSL form: {why}", kernel.name),
        });
    }
    let layout = if fold {
        kernel.wgsl_folded(block)
    } else {
        kernel.wgsl(block)
    };
    layout.map_err(|e| {
        Error::invalid(format!(
            "kernel `{}` with block {block:?}: {e}",
            kernel.name
        ))
    })
}

/// A tensor as a read-only `&[f32]` argument: bound in place on a GPU.
impl<'a> From<&'a Tensor> for KernelArg<'a> {
    fn from(t: &'a Tensor) -> Self {
        KernelArg::Device {
            buffer: DeviceRef(t),
            len: t.len(),
            mutable: false,
        }
    }
}

/// A tensor as a `&mut [f32]` argument: the kernel writes it in place on a GPU.
impl<'a> From<&'a mut Tensor> for KernelArg<'a> {
    fn from(t: &'a mut Tensor) -> Self {
        KernelArg::Device {
            buffer: DeviceRef(&*t),
            len: t.len(),
            mutable: true,
        }
    }
}

/// The tensor of a [`KernelArg::Device`] (and whether it is writable), checked to be
/// on `dev`.
fn tensor_arg<'a>(dev: &Device, a: &KernelArg<'a>) -> Result<Option<(&'a Tensor, bool)>> {
    let KernelArg::Device {
        buffer, mutable, ..
    } = a
    else {
        return Ok(None);
    };
    let b: DeviceRef<'a> = *buffer;
    let t =
        b.0.downcast_ref::<Tensor>()
            .ok_or_else(|| Error::invalid("a device argument that is not a ringkernel Tensor"))?;
    if t.device() != dev {
        return Err(Error::Device(format!(
            "a tensor on {} passed to a launch on {dev}: copy it with Tensor::to_device",
            t.device()
        )));
    }
    Ok(Some((t, *mutable)))
}

impl Device {
    /// Runs `kernel` (a `#[gpu_kernel]` function) over `grid` blocks of `block` threads
    /// with `args` bound by position (build them with [`args!`](crate::args)), and
    /// copies mutable host slices back: the results are in them when it returns.
    /// Tensors of this device are bound in place (see the [module docs](self)).
    ///
    /// Errors: wrong argument count or types, a block the backend cannot run, a grid
    /// beyond its limits: [`Error::InvalidArgument`]; generated source the device's
    /// compiler refuses: [`Error::Compile`] with the log and the source; a kernel that
    /// panics on the CPU (an index out of bounds, say): [`Error::Device`]; a device
    /// given to [`Device::from_backend`] that is not one of the built-in backends:
    /// [`Error::BackendUnavailable`]; a stencil kernel: [`Error::InvalidArgument`] (use
    /// [`Device::launch_stencil`]).
    ///
    /// The kernel's own indices are checked only on the CPU (where Rust panics, reported
    /// as above): on a GPU an index past the end of a slice is undefined on CUDA and
    /// clamped or zero on WGSL, so test a kernel on the CPU first.
    pub fn launch(
        &self,
        kernel: &GpuKernel,
        grid: [u32; 3],
        block: [u32; 3],
        args: &mut [KernelArg<'_>],
    ) -> Result<LaunchInfo> {
        if kernel.stencil.is_some() {
            return Err(Error::invalid(format!(
                "kernel `{}` is a stencil kernel: launch it with Device::launch_stencil",
                kernel.name
            )));
        }
        self.launch_any(kernel, grid, block, None, args)
    }

    /// Runs the stencil kernel `kernel` (a `#[gpu_kernel(halo = N)]` function with a
    /// `GridPos` or `GridPos3` parameter) once for every interior cell of a grid of
    /// `size` cells (`[nx, ny, 1]` in 2-D), with `args` for the other parameters by
    /// position. Grid buffers hold the interior and the halo
    /// ([`StencilInfo::buffer_len`](ringkernel_codegen::launch::StencilInfo::buffer_len)).
    /// Blocks are the translator's defaults: 16×16 (2-D), 8×8×4 (3-D).
    ///
    /// ```
    /// use ringkernel::codegen::dsl::*;
    /// use ringkernel::compute::Device;
    /// use ringkernel::{args, gpu_kernel};
    ///
    /// #[gpu_kernel(halo = 1)]
    /// fn average4(pos: GridPos, p: &[f32], out: &mut [f32]) {
    ///     out[pos.idx()] = 0.25 * (pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p));
    /// }
    ///
    /// let (nx, ny) = (5, 3);
    /// let len = GridPos::buffer_len(nx, ny, 1); // 7 x 5
    /// let p = vec![1.0f32; len];
    /// let mut out = vec![0.0f32; len];
    /// Device::cpu().launch_stencil(&AVERAGE4, [nx, ny, 1], &mut args![&p, &mut out])?;
    /// assert_eq!(out[7 + 1], 1.0); // the first interior cell
    /// assert_eq!(out[0], 0.0); // the halo is not written
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn launch_stencil(
        &self,
        kernel: &GpuKernel,
        size: [u32; 3],
        args: &mut [KernelArg<'_>],
    ) -> Result<LaunchInfo> {
        let Some(st) = kernel.stencil else {
            return Err(Error::invalid(format!(
                "kernel `{}` is not a stencil kernel: launch it with Device::launch",
                kernel.name
            )));
        };
        if st.dims == 2 && size[2] != 1 {
            return Err(Error::invalid(format!(
                "kernel `{}` is a 2-D stencil: its size is [nx, ny, 1], not {size:?}",
                kernel.name
            )));
        }
        if size.iter().any(|&d| d > i32::MAX as u32) {
            return Err(Error::invalid(format!(
                "stencil size {size:?}: each dimension at most {}",
                i32::MAX
            )));
        }
        let block = st.config().workgroup_size;
        self.launch_any(kernel, size, block, Some(size), args)
    }

    /// A launch of either kind: `stencil` is the interior size of a stencil kernel
    /// (then `grid` is that size too, what the CPU entry point takes).
    fn launch_any(
        &self,
        kernel: &GpuKernel,
        grid: [u32; 3],
        block: [u32; 3],
        stencil: Option<[u32; 3]>,
        args: &mut [KernelArg<'_>],
    ) -> Result<LaunchInfo> {
        let start = Instant::now();
        kernel.check_args(args).map_err(arg_err)?;
        let native = self.native();
        match native {
            Native::Cpu => {
                // Tensors go through host copies (mutable ones are written back).
                let tensors = args
                    .iter()
                    .map(|a| tensor_arg(self, a))
                    .collect::<Result<Vec<_>>>()?;
                let mut host = tensors
                    .iter()
                    .map(|t| t.map(|(t, _)| t.to_vec()).transpose())
                    .collect::<Result<Vec<Option<Vec<f32>>>>>()?;
                let mut staged: Vec<KernelArg<'_>> = args
                    .iter_mut()
                    .zip(host.iter_mut())
                    .zip(&tensors)
                    .map(|((a, h), t)| match (h, t) {
                        (Some(v), Some((_, true))) => KernelArg::F32sMut(v),
                        (Some(v), _) => KernelArg::F32s(v),
                        (None, _) => a.reborrow(),
                    })
                    .collect();
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    (kernel.cpu)(grid, block, &mut staged)
                }));
                drop(staged);
                match run {
                    Ok(r) => r.map_err(arg_err)?,
                    Err(p) => {
                        let msg = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "(no message)".into());
                        return Err(Error::Device(format!(
                            "kernel `{}` panicked on the CPU: {msg}",
                            kernel.name
                        )));
                    }
                }
                for (t, h) in tensors.iter().zip(&host) {
                    if let (Some((t, true)), Some(v)) = (t, h) {
                        self.backend().write(&**t.buffer(), 0, v)?;
                    }
                }
                Ok(LaunchInfo {
                    compiled: false,
                    compile_time: Duration::ZERO,
                    total_time: start.elapsed(),
                })
            }
            Native::Opaque => Err(Error::unavailable(
                self.kind(),
                format!(
                    "kernel `{}`: generated kernels run on the built-in backends only, not on \
                     one handed to Device::from_backend",
                    kernel.name
                ),
            )),
            #[allow(unreachable_patterns)]
            _ => {
                // A stencil covers its interior with blocks of the default size.
                let grid = match stencil {
                    Some(size) => [0, 1, 2].map(|i| size[i].div_ceil(block[i].max(1))),
                    None => grid,
                };
                self.launch_gpu(&native, kernel, grid, block, stencil, args)
                    .map(|info| LaunchInfo {
                        total_time: start.elapsed(),
                        ..info
                    })
            }
        }
    }

    /// Compiled generated kernels in this device's cache.
    pub fn cached_kernels(&self) -> usize {
        self.kernel_cache().len()
    }

    #[allow(unused_variables, unreachable_code)]
    fn launch_gpu(
        &self,
        native: &Native,
        kernel: &GpuKernel,
        grid: [u32; 3],
        block: [u32; 3],
        stencil: Option<[u32; 3]>,
        args: &mut [KernelArg<'_>],
    ) -> Result<LaunchInfo> {
        let backend = self.backend().clone();
        // A 1-D grid over the device's per-dimension limit runs folded into two
        // dimensions (WGSL translated for it).
        let dispatch = folded_grid(native, grid);
        let fold = dispatch.is_some();
        // Compiled form, from the cache or now.
        let wgsl_like = matches!(self.kind(), BackendKind::Wgpu | BackendKind::Metal);
        let key: Key = (
            kernel.name,
            // A hand-written kernel (no Rust source) is known by its sources.
            fnv1a(kernel.rust_source)
                ^ fnv1a(kernel.cuda_source).rotate_left(21)
                ^ fnv1a(kernel.wgsl_source.unwrap_or("")).rotate_left(42),
            if wgsl_like { block } else { [0; 3] },
            fold,
        );
        let cache = self.kernel_cache();
        let hit = cache
            .map
            .lock()
            .map_err(|_| Error::Device("kernel cache poisoned".into()))?
            .get(&key)
            .cloned();
        let (compiled, info) = match hit {
            Some(c) => (
                c,
                LaunchInfo {
                    compiled: false,
                    compile_time: Duration::ZERO,
                    total_time: Duration::ZERO,
                },
            ),
            None => {
                let t = Instant::now();
                let c = compile(native, kernel, block, fold)?;
                let info = LaunchInfo {
                    compiled: true,
                    compile_time: t.elapsed(),
                    total_time: Duration::ZERO,
                };
                cache
                    .map
                    .lock()
                    .map_err(|_| Error::Device("kernel cache poisoned".into()))?
                    .insert(key, c.clone());
                (c, info)
            }
        };
        // Slices to the device (as 32-bit words), run, mutable ones back.
        // Tensors are bound in place; host slices are uploaded.
        let bufs = args
            .iter()
            .map(|a| match tensor_arg(self, a)? {
                Some((t, _)) => Ok(Some(t.buffer().clone())),
                None => a.words().map(|w| backend.upload(&w)).transpose(),
            })
            .collect::<Result<Vec<Option<BufferRef>>>>()?;
        // The interior size of a stencil: trailing `int`s (CUDA) / params fields (WGSL);
        // a folded grid's size: the last params field.
        let sizes: Vec<ParamValue> = match (stencil, kernel.stencil, dispatch) {
            (Some(size), Some(st), _) => size[..st.dims as usize]
                .iter()
                .map(|&d| ParamValue::I32(d as i32))
                .collect(),
            (_, _, Some(_)) => vec![ParamValue::U32(grid[0])],
            _ => Vec::new(),
        };
        let grid = dispatch.unwrap_or(grid);
        run(&compiled, native, kernel, grid, block, args, &bufs, &sizes)?;
        for (a, b) in args.iter_mut().zip(&bufs) {
            if let (true, Some(b)) = (a.is_mut_slice(), b) {
                let mut words = vec![0.0f32; a.word_len()];
                backend.read(&**b, 0, &mut words)?;
                if !a.store_words(&words) {
                    return Err(Error::Device(format!(
                        "kernel `{}`: read back {} words for a {}",
                        kernel.name,
                        words.len(),
                        a.type_name()
                    )));
                }
            }
        }
        Ok(info)
    }
}

/// The `(x, y, 1)` workgroups a 1-D `grid` runs as when it has more than the device's
/// per-dimension limit (wgpu); `None`: as it is.
#[allow(unused_variables)]
fn folded_grid(native: &Native, grid: [u32; 3]) -> Option<[u32; 3]> {
    match native {
        #[cfg(feature = "wgpu")]
        Native::Wgpu(w) => {
            let max = w.max_workgroups_per_dimension().max(1);
            (grid[0] > max && grid[1] == 1 && grid[2] == 1).then(|| [max, grid[0].div_ceil(max), 1])
        }
        _ => None,
    }
}

#[allow(unused_variables)]
fn compile(native: &Native, kernel: &GpuKernel, block: [u32; 3], fold: bool) -> Result<Compiled> {
    match native {
        #[cfg(feature = "wgpu")]
        Native::Wgpu(w) => {
            let layout = wgsl_layout(kernel, BackendKind::Wgpu, block, fold)?;
            let label = format!("{}.wgsl", kernel.name);
            use ringkernel_codegen::BindingKind;
            use ringkernel_wgpu::WgslResource;
            let resources: Vec<(u32, WgslResource)> = layout
                .bindings
                .iter()
                .map(|b| {
                    let r = match b.kind {
                        BindingKind::Params => WgslResource::Uniform,
                        BindingKind::Storage { read_only, .. }
                        | BindingKind::Structs { read_only, .. } => {
                            WgslResource::Storage { read_only }
                        }
                    };
                    (b.binding, r)
                })
                .collect();
            let pipeline = w
                .compile_wgsl(&label, &layout.source, &layout.entry_point, &resources)
                .map_err(|e| with_source(e, kernel.name, "WGSL", &layout.source))?;
            Ok(Compiled::Wgpu { pipeline, layout })
        }
        #[cfg(feature = "cuda")]
        Native::Cuda(c) => {
            let f = c
                .compile_function(kernel.name, kernel.cuda_source, kernel.name)
                .map_err(|e| with_source(e, kernel.name, "CUDA C", kernel.cuda_source))?;
            Ok(Compiled::Cuda(f))
        }
        #[cfg(feature = "metal")]
        Native::Metal(m) => {
            let layout = wgsl_layout(kernel, BackendKind::Metal, block, fold)?;
            let label = format!("{}.wgsl", kernel.name);
            let pipeline = m
                .compile_wgsl(
                    &label,
                    &layout.source,
                    &layout.entry_point,
                    !layout.params.is_empty(),
                    &storage_read_write(&layout),
                )
                .map_err(|e| with_source(e, kernel.name, "WGSL", &layout.source))?;
            Ok(Compiled::Metal { pipeline, layout })
        }
        _ => Err(Error::Device(format!(
            "kernel `{}`: no compiler for this backend",
            kernel.name
        ))),
    }
}

/// For each storage binding (1, 2, ... in order): whether the kernel writes it.
#[cfg(feature = "metal")]
fn storage_read_write(layout: &ringkernel_codegen::WgslKernel) -> Vec<bool> {
    layout
        .bindings
        .iter()
        .filter_map(|b| match b.kind {
            ringkernel_codegen::BindingKind::Storage { read_only, .. }
            | ringkernel_codegen::BindingKind::Structs { read_only, .. } => Some(!read_only),
            ringkernel_codegen::BindingKind::Params => None,
        })
        .collect()
}

/// The WGSL parameter block of the scalar arguments.
#[allow(dead_code)] // unused without a WGSL backend
fn wgsl_params(
    kernel: &GpuKernel,
    layout: &ringkernel_codegen::WgslKernel,
    args: &[KernelArg<'_>],
    sizes: &[ParamValue],
) -> Result<Option<Vec<u8>>> {
    use ringkernel_codegen::ParamValue as V;
    if layout.params.is_empty() {
        return Ok(None);
    }
    let values = args
        .iter()
        .filter_map(|a| match a {
            KernelArg::F32(x) => Some(Ok(V::F32(*x))),
            KernelArg::I32(x) => Some(Ok(V::I32(*x))),
            KernelArg::U32(x) => Some(Ok(V::U32(*x))),
            KernelArg::Bool(x) => Some(Ok(V::Bool(*x))),
            KernelArg::F64(_) | KernelArg::I64(_) | KernelArg::U64(_) => Some(Err(Error::invalid(
                format!("kernel `{}`: WGSL has no {}", kernel.name, a.type_name()),
            ))),
            _ => None,
        })
        .chain(sizes.iter().map(|&d| Ok(d)))
        .collect::<Result<Vec<_>>>()?;
    layout
        .pack_params(&values)
        .map(Some)
        .map_err(|e| Error::invalid(format!("kernel `{}`: {e}", kernel.name)))
}

/// The storage bindings of the slice arguments, in parameter order.
#[allow(dead_code)] // unused without a WGSL backend
fn wgsl_buffers<'a>(
    kernel: &GpuKernel,
    layout: &ringkernel_codegen::WgslKernel,
    bufs: &'a [Option<BufferRef>],
) -> Result<Vec<(u32, &'a dyn crate::core::compute::DeviceBuffer)>> {
    use ringkernel_codegen::BindingKind;
    let slots: Vec<u32> = layout
        .bindings
        .iter()
        .filter(|b| {
            matches!(
                b.kind,
                BindingKind::Storage { .. } | BindingKind::Structs { .. }
            )
        })
        .map(|b| b.binding)
        .collect();
    let given: Vec<&dyn crate::core::compute::DeviceBuffer> =
        bufs.iter().flatten().map(|b| &**b).collect();
    if slots.len() != given.len() {
        return Err(Error::Device(format!(
            "kernel `{}`: the WGSL binds {} buffers, {} slices were given",
            kernel.name,
            slots.len(),
            given.len()
        )));
    }
    Ok(slots.into_iter().zip(given).collect())
}

#[allow(unused_variables, clippy::too_many_arguments)]
fn run(
    compiled: &Compiled,
    native: &Native,
    kernel: &GpuKernel,
    grid: [u32; 3],
    block: [u32; 3],
    args: &[KernelArg<'_>],
    bufs: &[Option<BufferRef>],
    sizes: &[ParamValue],
) -> Result<()> {
    match (compiled, native) {
        #[cfg(feature = "wgpu")]
        (Compiled::Wgpu { pipeline, layout }, Native::Wgpu(w)) => {
            let params = wgsl_params(kernel, layout, args, sizes)?;
            let buffers = wgsl_buffers(kernel, layout, bufs)?;
            w.dispatch_wgsl(pipeline, params.as_deref(), &buffers, grid)
        }
        #[cfg(feature = "metal")]
        (Compiled::Metal { pipeline, layout }, Native::Metal(m)) => {
            let params = wgsl_params(kernel, layout, args, sizes)?;
            let buffers = wgsl_buffers(kernel, layout, bufs)?;
            m.dispatch_wgsl(pipeline, params.as_deref(), &buffers, grid)
        }
        #[cfg(feature = "cuda")]
        (Compiled::Cuda(f), Native::Cuda(c)) => {
            use ringkernel_codegen::ParamKind;
            use ringkernel_cuda::CudaArg;
            let cargs = args
                .iter()
                .zip(bufs)
                .zip(kernel.launch_params())
                .map(|((a, b), p)| match (a, b, p.kind) {
                    (
                        _,
                        Some(b),
                        ParamKind::Slice { .. }
                        | ParamKind::Struct { .. }
                        | ParamKind::StructSlice { .. },
                    ) => Ok(CudaArg::Buffer(&**b)),
                    (KernelArg::F32(x), None, _) => Ok(CudaArg::F32(*x)),
                    (KernelArg::F64(x), None, _) => Ok(CudaArg::F64(*x)),
                    (KernelArg::I32(x), None, _) => Ok(CudaArg::I32(*x)),
                    (KernelArg::U32(x), None, _) => Ok(CudaArg::U32(*x)),
                    (KernelArg::Bool(x), None, _) => Ok(CudaArg::Bool(*x)),
                    // 64-bit integers travel as the 8 bytes of a `double` (same size and
                    // alignment in the kernel's parameter buffer; the bits are kept).
                    (KernelArg::I64(x), None, _) => Ok(CudaArg::F64(f64::from_bits(*x as u64))),
                    (KernelArg::U64(x), None, _) => Ok(CudaArg::F64(f64::from_bits(*x))),
                    _ => Err(Error::invalid(format!(
                        "kernel `{}`: argument for `{}` does not fit",
                        kernel.name, p.name
                    ))),
                })
                .chain(sizes.iter().map(|d| match d {
                    ParamValue::I32(d) => Ok(CudaArg::I32(*d)),
                    other => Err(Error::invalid(format!(
                        "kernel `{}`: no CUDA argument for {other:?}",
                        kernel.name
                    ))),
                }))
                .collect::<Result<Vec<_>>>()?;
            c.launch_function(f, grid, block, &cargs)
        }
        #[allow(unreachable_patterns)]
        _ => Err(Error::Device(format!(
            "kernel `{}`: compiled for another backend",
            kernel.name
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MSL that Metal compiles for generated kernels, checked off Apple: naga
    /// translates it, and its buffer indices are the ones the launcher binds.
    #[cfg(feature = "metal")]
    #[test]
    fn generated_kernels_have_msl_with_the_bindings_metal_binds() {
        use ringkernel_codegen::dsl::*;
        use ringkernel_metal::msl::{parse_entry_points, AddressSpace};

        #[ringkernel_derive::gpu_kernel]
        fn hist(data: &[u32], h: &mut [u32], bins: u32, n: i32) {
            let i = block_idx_x() * block_dim_x() + thread_idx_x();
            if i < n {
                atomic_add(&mut h[(data[i as usize] % bins) as usize], 1u32);
            }
        }
        #[ringkernel_derive::gpu_kernel]
        fn fill(out: &mut [f32]) {
            let i = block_idx_x() * block_dim_x() + thread_idx_x();
            out[i as usize] = (i as f32).sqrt();
        }
        #[ringkernel_derive::gpu_kernel(halo = 1)]
        fn lap(pos: GridPos, p: &[f32], o: &mut [f32], k: f32) {
            o[pos.idx()] = k * (pos.north(p) + pos.south(p) - 2.0 * p[pos.idx()]);
        }
        #[derive(Clone, Copy, ringkernel_derive::GpuType)]
        #[repr(C)]
        struct Pt {
            id: u64,
            v: [f32; 2],
        }
        #[ringkernel_derive::gpu_kernel]
        fn nudge(ps: &mut [Pt], by: Pt, seen: &[Pt], n: i32) {
            let i = block_idx_x() * block_dim_x() + thread_idx_x();
            if i < n {
                ps[i as usize].v[0] += by.v[0] + seen[i as usize].v[1];
            }
        }
        for (k, block) in [
            (&HIST, [128, 1, 1]),
            (&FILL, [8, 8, 1]),
            (&LAP, LAP.stencil.unwrap().config().workgroup_size),
            (&NUDGE, [64, 1, 1]),
        ] {
            let layout = wgsl_layout(k, BackendKind::Metal, block, false).unwrap();
            let rw = storage_read_write(&layout);
            let msl = ringkernel_metal::MetalCompute::generated_msl(
                k.name,
                &layout.source,
                &layout.entry_point,
                !layout.params.is_empty(),
                &rw,
            )
            .unwrap();
            assert_eq!(msl.workgroup_size, block);
            let eps = parse_entry_points(&msl.source).unwrap();
            let ep = eps.iter().find(|e| e.name == msl.entry_point).unwrap();
            let bufs = ep.buffers();
            if !layout.params.is_empty() {
                let (_, p) = bufs.iter().find(|(i, _)| *i == 0).expect("params at 0");
                assert_eq!(p.space, AddressSpace::Constant, "{}", msl.source);
            }
            for (i, w) in rw.iter().enumerate() {
                let (_, b) = bufs
                    .iter()
                    .find(|(n, _)| *n == i as u32 + 1)
                    .unwrap_or_else(|| panic!("buffer {} in {}", i + 1, msl.source));
                assert_eq!(b.space, AddressSpace::Device);
                assert_eq!(b.read_only, !w, "{}", msl.source);
            }
        }
    }

    #[test]
    fn compile_errors_get_the_numbered_source() {
        let e = Error::Compile {
            backend: BackendKind::Wgpu,
            log: "error: unknown identifier `q`".into(),
        };
        let src = "fn a() {\n    q;\n}";
        match with_source(e, "k", "WGSL", src) {
            Error::Compile { backend, log } => {
                assert_eq!(backend, BackendKind::Wgpu);
                assert!(log.starts_with("error: unknown identifier `q`"), "{log}");
                assert!(log.contains("generated WGSL of kernel `k`:"), "{log}");
                assert!(log.contains("   2 |     q;\n"), "{log}");
            }
            other => panic!("{other}"),
        }
        // other errors pass through
        let e = with_source(Error::invalid("x"), "k", "WGSL", src);
        assert!(matches!(e, Error::InvalidArgument(_)));
    }
}
