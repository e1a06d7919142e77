//! [`Device`]: one compute backend, chosen explicitly or by [`Device::auto`], and
//! validated against the CPU before it is trusted.

use super::launch::KernelCache;
use crate::backends;
use crate::backends::Native;
use crate::core::compute::{
    reference, BinaryOp, BufferRef, ComputeBackend, DeviceBuffer, MatmulDims, ReduceDims, ReduceOp,
    UnaryOp,
};
use crate::core::util::{rel_error, SplitMix64};
use crate::{BackendKind, Error, Result, Skipped, BACKEND_ENV};
use std::fmt;
use std::sync::Arc;

/// A compute device: a backend behind `Arc<dyn ComputeBackend>`, its kind, whether it
/// passed the self-test, and (for [`Device::auto`]) why other backends were skipped.
///
/// Cloning is cheap and clones share the device. Tensors on one device can only be
/// combined with tensors on the same device (see [`Tensor::to_device`](super::Tensor::to_device)).
///
/// ```
/// use ringkernel::compute::Device;
/// let dev = Device::cpu();
/// assert_eq!(dev.kind(), ringkernel::BackendKind::Cpu);
/// assert!(dev.is_validated());
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn ComputeBackend>,
    native: Native,
    kernels: KernelCache,
    kind: BackendKind,
    validated: bool,
    skipped: Vec<Skipped>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("kind", &self.inner.kind)
            .field("name", &self.inner.backend.device_name())
            .field("validated", &self.inner.validated)
            .field("skipped", &self.inner.skipped)
            .finish()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            self.inner.kind,
            self.inner.backend.device_name()
        )
    }
}

impl PartialEq for Device {
    /// Two handles are equal when they share one device.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Device {
    /// The CPU (rayon's global pool; always available).
    pub fn cpu() -> Device {
        Self::wrap(backends::cpu_compute(), Native::Cpu, Vec::new())
    }

    /// The CPU with a dedicated pool of `threads` threads (1 for single-thread figures).
    ///
    /// ```
    /// let dev = ringkernel::compute::Device::cpu_with_threads(1)?;
    /// assert!(dev.name().contains("1 thread"));
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn cpu_with_threads(threads: usize) -> Result<Device> {
        Ok(Self::wrap(
            backends::cpu_compute_with_threads(threads)?,
            Native::Cpu,
            Vec::new(),
        ))
    }

    /// WebGPU through wgpu, on any adapter (a software one included), validated.
    /// Needs the `wgpu` feature: without it, [`Error::BackendUnavailable`] saying
    /// "not compiled in: enable feature `wgpu`".
    pub fn wgpu() -> Result<Device> {
        Self::from_native(backends::wgpu_compute(false)?)
    }

    /// The CUDA GPU `ordinal` (any GPU of the machine), validated. A GPU that does not
    /// exist is [`Error::InvalidArgument`] naming how many there are. Needs the `cuda`
    /// feature: without it, [`Error::BackendUnavailable`] saying "not compiled in:
    /// enable feature `cuda`".
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Self::from_native(backends::cuda_compute(ordinal)?)
    }

    /// The default Metal GPU, validated. Needs the `metal` feature: without it,
    /// [`Error::BackendUnavailable`] saying "not compiled in: enable feature `metal`".
    pub fn metal() -> Result<Device> {
        Self::from_native(backends::metal_compute()?)
    }

    /// The device of `kind` (CUDA device 0; wgpu on any adapter).
    pub fn of_kind(kind: BackendKind) -> Result<Device> {
        match kind {
            BackendKind::Cpu => Ok(Self::cpu()),
            BackendKind::Cuda => Self::cuda(0),
            BackendKind::Wgpu => Self::wgpu(),
            BackendKind::Metal => Self::metal(),
        }
    }

    /// Parses `auto`, `cpu`, `cuda`, `cuda:N` (CUDA GPU `N`), `wgpu` or `metal` (as a
    /// `--device` flag takes) and opens that device.
    ///
    /// ```
    /// let dev = ringkernel::compute::Device::from_name("cpu")?;
    /// assert_eq!(dev.kind(), ringkernel::BackendKind::Cpu);
    /// assert!(ringkernel::compute::Device::from_name("tpu").is_err());
    /// assert!(ringkernel::compute::Device::from_name("cuda:x").is_err());
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn from_name(name: &str) -> Result<Device> {
        if name.trim().eq_ignore_ascii_case("auto") {
            return Self::auto();
        }
        let lower = name.trim().to_ascii_lowercase();
        if let Some(n) = lower.strip_prefix("cuda:") {
            let ordinal = n.parse::<usize>().map_err(|_| {
                Error::invalid(format!(
                    "device {name:?}: expected cuda:N with N a GPU ordinal"
                ))
            })?;
            return Self::cuda(ordinal);
        }
        let kind = BackendKind::parse(name).ok_or_else(|| {
            Error::invalid(format!(
                "unknown device {name:?}: expected auto, cpu, cuda, wgpu or metal"
            ))
        })?;
        Self::of_kind(kind)
    }

    /// Wraps a backend; a non-CPU backend runs the self-test first and is refused
    /// (with [`Error::Device`]) when it fails. Generated kernels
    /// ([`Device::launch`]) run on such a device only when it is the CPU.
    pub fn from_backend(backend: Arc<dyn ComputeBackend>) -> Result<Device> {
        let kind = backend.kind();
        if kind != BackendKind::Cpu {
            self_test(&*backend)?;
        }
        let native = if kind == BackendKind::Cpu {
            Native::Cpu
        } else {
            Native::Opaque
        };
        Ok(Self::wrap(backend, native, Vec::new()))
    }

    /// A built-in GPU backend, self-tested.
    fn from_native(native: Native) -> Result<Device> {
        let backend = native
            .dyn_backend()
            .ok_or_else(|| Error::Device("not a GPU backend".into()))?;
        self_test(&*backend)?;
        Ok(Self::wrap(backend, native, Vec::new()))
    }

    /// Picks the best validated device: Metal > CUDA > wgpu on a hardware adapter > CPU.
    /// `RINGKERNEL_BACKEND=cpu|cuda|wgpu|metal` overrides the choice; an unavailable
    /// explicit choice is [`Error::BackendUnavailable`] with the reason. Each skipped
    /// backend is logged with `tracing` and listed by [`Device::skipped`].
    ///
    /// ```
    /// let dev = ringkernel::compute::Device::auto()?;
    /// for s in dev.skipped() {
    ///     println!("skipped {}: {}", s.backend, s.reason);
    /// }
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn auto() -> Result<Device> {
        if let Ok(v) = std::env::var(BACKEND_ENV) {
            let v = v.trim();
            if !v.is_empty() && !v.eq_ignore_ascii_case("auto") {
                let kind = BackendKind::parse(v).ok_or_else(|| {
                    Error::invalid(format!(
                        "{BACKEND_ENV}={v:?}: expected auto, cpu, cuda, wgpu or metal"
                    ))
                })?;
                tracing::info!("compute device: {kind} chosen by {BACKEND_ENV}");
                return Self::of_kind(kind);
            }
        }
        let mut skipped = Vec::new();
        for kind in BackendKind::ALL {
            let backend = match kind {
                BackendKind::Cpu => {
                    tracing::info!("compute device: cpu");
                    return Ok(Self::wrap(backends::cpu_compute(), Native::Cpu, skipped));
                }
                BackendKind::Metal => backends::metal_compute(),
                BackendKind::Cuda => backends::cuda_compute(0),
                BackendKind::Wgpu => backends::wgpu_compute(true),
            };
            let outcome = backend.and_then(|n| {
                let b = n
                    .dyn_backend()
                    .ok_or_else(|| Error::Device("not a GPU backend".into()))?;
                self_test(&*b).map(|()| (b, n))
            });
            match outcome {
                Ok((b, n)) => {
                    tracing::info!(
                        "compute device: {kind} ({}), self-test passed",
                        b.device_name()
                    );
                    return Ok(Self::wrap(b, n, skipped));
                }
                Err(e) => {
                    let reason = backends::reason(e);
                    tracing::info!("compute device: skipping {kind}: {reason}");
                    skipped.push(Skipped {
                        backend: kind,
                        reason,
                    });
                }
            }
        }
        // BackendKind::ALL ends with the CPU, which always returns above.
        Ok(Self::wrap(backends::cpu_compute(), Native::Cpu, skipped))
    }

    /// Every device is validated when it is wrapped (the CPU is the reference; GPUs
    /// passed [`self_test`]).
    fn wrap(backend: Arc<dyn ComputeBackend>, native: Native, skipped: Vec<Skipped>) -> Device {
        let kind = backend.kind();
        Device {
            inner: Arc::new(Inner {
                backend,
                native,
                kernels: KernelCache::default(),
                kind,
                validated: true,
                skipped,
            }),
        }
    }

    /// The backend as its concrete type (for generated kernels).
    pub(crate) fn native(&self) -> Native {
        self.inner.native.clone()
    }

    /// The device's cache of compiled generated kernels.
    pub(crate) fn kernel_cache(&self) -> &KernelCache {
        &self.inner.kernels
    }

    /// Which backend.
    pub fn kind(&self) -> BackendKind {
        self.inner.kind
    }

    /// The backend's device name (adapter, GPU model, CPU threads).
    pub fn name(&self) -> String {
        self.inner.backend.device_name()
    }

    /// Whether the device passed its self-test against the CPU (the CPU always has).
    pub fn is_validated(&self) -> bool {
        self.inner.validated
    }

    /// Backends that [`Device::auto`] tried and passed over, with the reasons.
    pub fn skipped(&self) -> &[Skipped] {
        &self.inner.skipped
    }

    /// The backend, for calling ops on raw buffers.
    pub fn backend(&self) -> &Arc<dyn ComputeBackend> {
        &self.inner.backend
    }

    /// Waits for all queued work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.backend.synchronize()
    }
}

/// One op of the self-test: backend, uploaded inputs, output buffer.
type OpFn<'a> = dyn Fn(&dyn ComputeBackend, &[BufferRef], &dyn DeviceBuffer) -> Result<()> + 'a;

/// Runs a few small ops on `b` and compares them with the CPU's f64 reference;
/// [`Error::Device`] naming the op on a mismatch.
pub(crate) fn self_test(b: &dyn ComputeBackend) -> Result<()> {
    let kind = b.kind();
    let fail = |op: &str, e: String| Error::Device(format!("{kind} self-test failed on {op}: {e}"));
    let mut rng = SplitMix64::new(0x5EED);
    let x = rng.vec(67, -2.0, 2.0);
    let y = rng.vec(67, -2.0, 2.0);
    let run = |op: &str, len: usize, f: &OpFn<'_>, inputs: &[&[f32]]| -> Result<Vec<f32>> {
        let bufs = inputs
            .iter()
            .map(|d| b.upload(d))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| fail(op, e.to_string()))?;
        let out = b
            .upload(&vec![f32::NAN; len])
            .map_err(|e| fail(op, e.to_string()))?;
        f(b, &bufs, &*out).map_err(|e| fail(op, e.to_string()))?;
        let mut v = vec![0.0; len];
        b.read(&*out, 0, &mut v)
            .map_err(|e| fail(op, e.to_string()))?;
        Ok(v)
    };
    let check = |op: &str, got: Vec<f32>, want: Vec<f64>| -> Result<()> {
        let e = rel_error(&got, &want);
        if e <= 1e-4 {
            Ok(())
        } else {
            Err(fail(
                op,
                format!("relative error {e:.2e} against the CPU reference"),
            ))
        }
    };
    let got = run(
        "add",
        67,
        &|b, i, o| b.binary(BinaryOp::Add, &*i[0], &*i[1], o, 67),
        &[&x, &y],
    )?;
    check("add", got, reference::binary(BinaryOp::Add, &x, &y))?;
    let got = run(
        "exp",
        67,
        &|b, i, o| b.unary(UnaryOp::Exp, &*i[0], o, 67),
        &[&x],
    )?;
    check("exp", got, reference::unary(UnaryOp::Exp, &x))?;
    let dims = MatmulDims {
        batch: 1,
        m: 5,
        k: 7,
        n: 9,
        b_batched: false,
    };
    let got = run(
        "matmul",
        45,
        &|b, i, o| b.matmul(&*i[0], &*i[1], o, dims),
        &[&x[..35], &y[..63]],
    )?;
    check("matmul", got, reference::matmul(&x[..35], &y[..63], dims))?;
    let rd = ReduceDims {
        outer: 3,
        axis: 11,
        inner: 2,
    };
    let got = run(
        "reduce sum",
        6,
        &|b, i, o| b.reduce(ReduceOp::Sum, &*i[0], o, rd),
        &[&x[..66]],
    )?;
    check(
        "reduce sum",
        got,
        reference::reduce(ReduceOp::Sum, &x[..66], rd),
    )?;
    let got = run(
        "softmax",
        66,
        &|b, i, o| b.softmax(&*i[0], o, 6, 11),
        &[&x[..66]],
    )?;
    check("softmax", got, reference::softmax(&x[..66], 6, 11))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::compute::{
        AttentionDims, BroadcastDims, DType, EmbeddingDims, KvDims, QMatmulDims, RopeDims,
        WeightFormat,
    };
    use ringkernel_cpu::CpuCompute;

    #[test]
    fn cpu_passes_its_own_self_test() {
        self_test(&CpuCompute::new()).unwrap();
    }

    #[test]
    fn unknown_device_name_is_an_error() {
        assert!(matches!(
            Device::from_name("tpu"),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn auto_lists_why_gpus_were_skipped() {
        // without RINGKERNEL_BACKEND set, on a machine without GPUs, auto falls back to
        // the CPU and says why
        if std::env::var(BACKEND_ENV).is_ok() {
            return;
        }
        let dev = Device::auto().unwrap();
        if dev.kind() == BackendKind::Cpu {
            assert_eq!(dev.skipped().len(), 3, "{:?}", dev.skipped());
            assert!(dev.skipped().iter().all(|s| !s.reason.is_empty()));
        }
        assert!(dev.is_validated());
    }

    /// The CPU backend posing as a GPU, with a wrong `exp`.
    struct Broken(CpuCompute);

    impl ComputeBackend for Broken {
        fn kind(&self) -> BackendKind {
            BackendKind::Wgpu
        }
        fn device_name(&self) -> String {
            "broken".into()
        }
        fn alloc(&self, len: usize) -> Result<BufferRef> {
            self.0.alloc(len)
        }
        fn upload(&self, data: &[f32]) -> Result<BufferRef> {
            self.0.upload(data)
        }
        fn write(&self, buf: &dyn DeviceBuffer, offset: usize, data: &[f32]) -> Result<()> {
            self.0.write(buf, offset, data)
        }
        fn read(&self, buf: &dyn DeviceBuffer, offset: usize, out: &mut [f32]) -> Result<()> {
            self.0.read(buf, offset, out)
        }
        fn copy(
            &self,
            s: &dyn DeviceBuffer,
            so: usize,
            d: &dyn DeviceBuffer,
            dof: usize,
            len: usize,
        ) -> Result<()> {
            self.0.copy(s, so, d, dof, len)
        }
        fn synchronize(&self) -> Result<()> {
            Ok(())
        }
        fn unary(
            &self,
            op: UnaryOp,
            x: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            len: usize,
        ) -> Result<()> {
            let op = if op == UnaryOp::Exp {
                UnaryOp::Sigmoid
            } else {
                op
            };
            self.0.unary(op, x, out, len)
        }
        fn binary(
            &self,
            op: BinaryOp,
            a: &dyn DeviceBuffer,
            b: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            len: usize,
        ) -> Result<()> {
            self.0.binary(op, a, b, out, len)
        }
        fn binary_scalar(
            &self,
            op: BinaryOp,
            a: &dyn DeviceBuffer,
            s: f32,
            out: &dyn DeviceBuffer,
            len: usize,
        ) -> Result<()> {
            self.0.binary_scalar(op, a, s, out, len)
        }
        fn matmul(
            &self,
            a: &dyn DeviceBuffer,
            b: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: MatmulDims,
        ) -> Result<()> {
            self.0.matmul(a, b, out, dims)
        }
        fn matvec(
            &self,
            a: &dyn DeviceBuffer,
            x: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            m: usize,
            k: usize,
        ) -> Result<()> {
            self.0.matvec(a, x, out, m, k)
        }
        fn argmax(&self, x: &dyn DeviceBuffer, len: usize, out: &dyn DeviceBuffer) -> Result<()> {
            self.0.argmax(x, len, out)
        }
        fn dot(
            &self,
            a: &dyn DeviceBuffer,
            b: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            len: usize,
        ) -> Result<()> {
            self.0.dot(a, b, out, len)
        }
        fn reduce(
            &self,
            op: ReduceOp,
            x: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: ReduceDims,
        ) -> Result<()> {
            self.0.reduce(op, x, out, dims)
        }
        fn softmax(
            &self,
            x: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            rows: usize,
            cols: usize,
        ) -> Result<()> {
            self.0.softmax(x, out, rows, cols)
        }
        fn rms_norm(
            &self,
            x: &dyn DeviceBuffer,
            w: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            rows: usize,
            cols: usize,
            eps: f32,
        ) -> Result<()> {
            self.0.rms_norm(x, w, out, rows, cols, eps)
        }
        fn layer_norm(
            &self,
            x: &dyn DeviceBuffer,
            w: &dyn DeviceBuffer,
            b: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            rows: usize,
            cols: usize,
            eps: f32,
        ) -> Result<()> {
            self.0.layer_norm(x, w, b, out, rows, cols, eps)
        }
        fn rope(
            &self,
            x: &dyn DeviceBuffer,
            p: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: RopeDims,
        ) -> Result<()> {
            self.0.rope(x, p, out, dims)
        }
        fn attention_scores(
            &self,
            q: &dyn DeviceBuffer,
            k: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: AttentionDims,
        ) -> Result<()> {
            self.0.attention_scores(q, k, out, dims)
        }
        fn attention_weighted_sum(
            &self,
            p: &dyn DeviceBuffer,
            v: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: AttentionDims,
        ) -> Result<()> {
            self.0.attention_weighted_sum(p, v, out, dims)
        }
        fn attention(
            &self,
            q: &dyn DeviceBuffer,
            k: &dyn DeviceBuffer,
            v: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: AttentionDims,
        ) -> Result<()> {
            self.0.attention(q, k, v, out, dims)
        }
        fn swiglu(
            &self,
            g: &dyn DeviceBuffer,
            u: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            len: usize,
        ) -> Result<()> {
            self.0.swiglu(g, u, out, len)
        }
        fn convert(
            &self,
            x: &dyn DeviceBuffer,
            from: DType,
            out: &dyn DeviceBuffer,
            to: DType,
            len: usize,
        ) -> Result<()> {
            self.0.convert(x, from, out, to, len)
        }
        fn broadcast_binary(
            &self,
            op: BinaryOp,
            a: &dyn DeviceBuffer,
            b: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: &BroadcastDims,
        ) -> Result<()> {
            self.0.broadcast_binary(op, a, b, out, dims)
        }
        fn embedding(
            &self,
            t: &dyn DeviceBuffer,
            f: WeightFormat,
            ids: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            d: EmbeddingDims,
        ) -> Result<()> {
            self.0.embedding(t, f, ids, out, d)
        }
        fn qmatmul(
            &self,
            w: &dyn DeviceBuffer,
            f: WeightFormat,
            x: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            d: QMatmulDims,
        ) -> Result<()> {
            self.0.qmatmul(w, f, x, out, d)
        }
        fn qmatmul_swiglu(
            &self,
            g: &dyn DeviceBuffer,
            u: &dyn DeviceBuffer,
            f: WeightFormat,
            x: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            d: QMatmulDims,
        ) -> Result<()> {
            self.0.qmatmul_swiglu(g, u, f, x, out, d)
        }
        fn rope_kv(
            &self,
            qkv: &dyn DeviceBuffer,
            p: &dyn DeviceBuffer,
            q: &dyn DeviceBuffer,
            k: &dyn DeviceBuffer,
            v: &dyn DeviceBuffer,
            d: KvDims,
        ) -> Result<()> {
            self.0.rope_kv(qkv, p, q, k, v, d)
        }
        fn attention_kv(
            &self,
            q: &dyn DeviceBuffer,
            k: &dyn DeviceBuffer,
            v: &dyn DeviceBuffer,
            p: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            d: KvDims,
        ) -> Result<()> {
            self.0.attention_kv(q, k, v, p, out, d)
        }
    }

    #[test]
    fn a_backend_failing_the_self_test_is_refused() {
        let err = Device::from_backend(Arc::new(Broken(CpuCompute::new()))).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Device(_)) && msg.contains("exp") && msg.contains("wgpu"),
            "{msg}"
        );
    }
}
