//! Running [`Plan`]s: the host loop the WebGPU and Metal backends share.
//!
//! A backend implements [`PlanDevice`] (its buffer type, scratch allocation, and how to
//! record a sequence of resolved dispatches) and gets every compute op from
//! [`planned_ops!`](crate::planned_ops): each op is planned by [`plan`]
//! and run by [`run`], which downcasts the arguments, checks their lengths against the
//! plan ([`Needs`](ringkernel_core::compute::checks::Needs)), refuses an output that
//! aliases an input, allocates the scratch buffers and resolves every binding.

use crate::plan::{self, Bind, Dispatch, Operand, Plan};
use ringkernel_core::compute::{checks, DeviceBuffer, MatmulDims};
use ringkernel_core::error::{Error, Result};

/// One dispatch with its bindings resolved to buffers.
#[derive(Debug)]
pub struct Step<'a, B> {
    /// The dispatch (kernel, specialisation, parameter bytes, grid).
    pub dispatch: &'a Dispatch,
    /// Every storage binding with the buffer bound there.
    pub buffers: Vec<(&'a Bind, &'a B)>,
}

impl<B: DeviceBuffer> Step<'_, B> {
    /// The bytes of naga's buffer-sizes argument for this step (Metal): for each
    /// `(group, binding)` of the MSL's `sizes_order`, the byte length of the buffer
    /// bound there ([`plan::buffer_sizes`]).
    pub fn buffer_sizes(&self, order: &[Option<(u32, u32)>]) -> Result<Vec<u8>> {
        plan::buffer_sizes(order, |binding| {
            self.buffers
                .iter()
                .find(|(b, _)| b.binding == binding)
                .and_then(|(_, buf)| buf.len().checked_mul(4))
        })
    }
}

/// A buffer and an element offset into it.
pub type At<'a, B> = (&'a B, usize);

/// What a backend provides to run plans.
pub trait PlanDevice: Send + Sync {
    /// The backend's buffer type.
    type Buffer: DeviceBuffer;

    /// Downcasts an op argument to this backend's buffer ([`Error::Device`] for a
    /// buffer of another backend or device).
    fn buffer<'a>(&self, b: &'a dyn DeviceBuffer) -> Result<&'a Self::Buffer>;

    /// A scratch buffer of `len` elements (contents unspecified).
    fn scratch(&self, len: usize) -> Result<Self::Buffer>;

    /// Records `steps` in order, each seeing the writes of the ones before.
    fn record(&self, steps: &[Step<'_, Self::Buffer>]) -> Result<()>;

    /// Called with a plan's scratch buffers once its steps are recorded; a backend
    /// whose API does not keep buffers alive for the GPU holds them until the work is
    /// done. Dropping them (the default) suits one that does.
    fn retire(&self, scratch: Vec<Self::Buffer>) {
        drop(scratch);
    }

    /// Copies `len > 0` elements from `src[src_offset..]` to `dst[dst_offset..]` after
    /// queued work (ranges checked, not overlapping: see [`copy`]).
    fn copy_elems(
        &self,
        src: At<'_, Self::Buffer>,
        dst: At<'_, Self::Buffer>,
        len: usize,
    ) -> Result<()>;

    /// `matmul`; a backend with a faster library path overrides this and falls back to
    /// running the plan (see [`run`]).
    fn run_matmul(&self, dims: MatmulDims, args: [&dyn DeviceBuffer; 3]) -> Result<()> {
        run(self, &plan::matmul(dims)?, &args)
    }
}

/// Downcasts `args` and checks them against `plan`: lengths ([`Error::ShapeMismatch`])
/// and no argument the plan writes also passed as another argument
/// ([`Error::InvalidArgument`]).
pub fn prepare<'a, D: PlanDevice + ?Sized>(
    dev: &D,
    plan: &Plan,
    args: &[&'a dyn DeviceBuffer],
) -> Result<Vec<&'a D::Buffer>> {
    let bufs = args
        .iter()
        .map(|a| dev.buffer(*a))
        .collect::<Result<Vec<_>>>()?;
    plan.needs.check(args)?;
    for i in 0..args.len() {
        if plan.writes_arg(i) {
            checks::distinct_from_others(plan.needs.op, args, i)?;
        }
    }
    Ok(bufs)
}

/// `copy` of [`ComputeBackend`](ringkernel_core::compute::ComputeBackend): downcasts,
/// checks both ranges ([`checks::copy`]) and hands a non-empty copy to
/// [`PlanDevice::copy_elems`].
pub fn copy<D: PlanDevice + ?Sized>(
    dev: &D,
    src: (&dyn DeviceBuffer, usize),
    dst: (&dyn DeviceBuffer, usize),
    len: usize,
) -> Result<()> {
    let (s, d) = (dev.buffer(src.0)?, dev.buffer(dst.0)?);
    checks::copy(src, dst, len)?;
    if len == 0 {
        return Ok(());
    }
    dev.copy_elems((s, src.1), (d, dst.1), len)
}

/// Runs `plan` on `args` (the op's buffer arguments in order).
pub fn run<D: PlanDevice + ?Sized>(dev: &D, plan: &Plan, args: &[&dyn DeviceBuffer]) -> Result<()> {
    let bufs = prepare(dev, plan, args)?;
    if plan.dispatches.is_empty() {
        return Ok(());
    }
    let scratch = plan
        .scratch
        .iter()
        .map(|&n| dev.scratch(n))
        .collect::<Result<Vec<_>>>()?;
    let resolve = |o: Operand| -> Result<&D::Buffer> {
        match o {
            Operand::Arg(i) => bufs.get(i).copied(),
            Operand::Scratch(i) => scratch.get(i),
        }
        .ok_or_else(|| Error::invalid(format!("plan binds a missing operand {o:?}")))
    };
    let steps = plan
        .dispatches
        .iter()
        .map(|d| {
            Ok(Step {
                dispatch: d,
                buffers: d
                    .binds
                    .iter()
                    .map(|b| Ok((b, resolve(b.operand)?)))
                    .collect::<Result<Vec<_>>>()?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let recorded = dev.record(&steps);
    drop(steps);
    dev.retire(scratch);
    recorded
}

/// Expands, inside `impl ComputeBackend for T` where `T:`[`PlanDevice`], to every
/// compute op of the trait: each plans the op ([`plan`](crate::plan)) and runs it
/// ([`run`]); `matmul` goes through [`PlanDevice::run_matmul`], `copy` through
/// [`copy`]. `alloc`, `upload`, `read`, `write`, `synchronize`, `kind` and
/// `device_name` are the backend's own.
#[macro_export]
macro_rules! planned_ops {
    () => {
        fn copy(
            &self,
            src: &dyn ::ringkernel_core::compute::DeviceBuffer,
            src_offset: usize,
            dst: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dst_offset: usize,
            len: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::copy(self, (src, src_offset), (dst, dst_offset), len)
        }
        fn unary(
            &self,
            op: ::ringkernel_core::compute::UnaryOp,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            len: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::unary(op, len)?, &[x, out])
        }
        fn binary(
            &self,
            op: ::ringkernel_core::compute::BinaryOp,
            a: &dyn ::ringkernel_core::compute::DeviceBuffer,
            b: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            len: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::binary(op, len)?, &[a, b, out])
        }
        fn binary_scalar(
            &self,
            op: ::ringkernel_core::compute::BinaryOp,
            a: &dyn ::ringkernel_core::compute::DeviceBuffer,
            s: f32,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            len: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::binary_scalar(op, s, len)?, &[a, out])
        }
        fn matmul(
            &self,
            a: &dyn ::ringkernel_core::compute::DeviceBuffer,
            b: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::MatmulDims,
        ) -> ::ringkernel_core::Result<()> {
            <Self as $crate::exec::PlanDevice>::run_matmul(self, dims, [a, b, out])
        }
        fn matvec(
            &self,
            a: &dyn ::ringkernel_core::compute::DeviceBuffer,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            m: usize,
            k: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::matvec(m, k)?, &[a, x, out])
        }
        fn argmax(
            &self,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            len: usize,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
        ) -> ::ringkernel_core::Result<()> {
            ::ringkernel_core::compute::checks::distinct("argmax", out, &[x])?;
            $crate::exec::run(self, &$crate::plan::argmax(len)?, &[x, out])
        }
        fn dot(
            &self,
            a: &dyn ::ringkernel_core::compute::DeviceBuffer,
            b: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            len: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::dot(len)?, &[a, b, out])
        }
        fn reduce(
            &self,
            op: ::ringkernel_core::compute::ReduceOp,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::ReduceDims,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::reduce(op, dims)?, &[x, out])
        }
        fn softmax(
            &self,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            rows: usize,
            cols: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::softmax(rows, cols)?, &[x, out])
        }
        fn rms_norm(
            &self,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            weight: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            rows: usize,
            cols: usize,
            eps: f32,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::rms_norm(rows, cols, eps)?;
            $crate::exec::run(self, &plan, &[x, weight, out])
        }
        fn layer_norm(
            &self,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            weight: &dyn ::ringkernel_core::compute::DeviceBuffer,
            bias: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            rows: usize,
            cols: usize,
            eps: f32,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::layer_norm(rows, cols, eps)?;
            $crate::exec::run(self, &plan, &[x, weight, bias, out])
        }
        fn rope(
            &self,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            positions: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::RopeDims,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::rope(dims)?, &[x, positions, out])
        }
        fn attention_scores(
            &self,
            q: &dyn ::ringkernel_core::compute::DeviceBuffer,
            k: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::AttentionDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::attention_scores(dims)?;
            $crate::exec::run(self, &plan, &[q, k, out])
        }
        fn attention_weighted_sum(
            &self,
            p: &dyn ::ringkernel_core::compute::DeviceBuffer,
            v: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::AttentionDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::attention_weighted_sum(dims)?;
            $crate::exec::run(self, &plan, &[p, v, out])
        }
        fn attention(
            &self,
            q: &dyn ::ringkernel_core::compute::DeviceBuffer,
            k: &dyn ::ringkernel_core::compute::DeviceBuffer,
            v: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::AttentionDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::attention(dims)?;
            $crate::exec::run(self, &plan, &[q, k, v, out])
        }
        fn swiglu(
            &self,
            gate: &dyn ::ringkernel_core::compute::DeviceBuffer,
            up: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            len: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::swiglu(len)?, &[gate, up, out])
        }
        fn convert(
            &self,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            from: ::ringkernel_core::compute::DType,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            to: ::ringkernel_core::compute::DType,
            len: usize,
        ) -> ::ringkernel_core::Result<()> {
            $crate::exec::run(self, &$crate::plan::convert(from, to, len)?, &[x, out])
        }
        fn broadcast_binary(
            &self,
            op: ::ringkernel_core::compute::BinaryOp,
            a: &dyn ::ringkernel_core::compute::DeviceBuffer,
            b: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: &::ringkernel_core::compute::BroadcastDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::broadcast_binary(op, dims)?;
            $crate::exec::run(self, &plan, &[a, b, out])
        }
        fn embedding(
            &self,
            table: &dyn ::ringkernel_core::compute::DeviceBuffer,
            format: ::ringkernel_core::compute::WeightFormat,
            ids: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::EmbeddingDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::embedding(format, dims)?;
            $crate::exec::run(self, &plan, &[table, ids, out])
        }
        fn qmatmul(
            &self,
            w: &dyn ::ringkernel_core::compute::DeviceBuffer,
            format: ::ringkernel_core::compute::WeightFormat,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::QMatmulDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::qmatmul(format, dims, false)?;
            $crate::exec::run(self, &plan, &[w, x, out])
        }
        fn qmatmul_swiglu(
            &self,
            w_gate: &dyn ::ringkernel_core::compute::DeviceBuffer,
            w_up: &dyn ::ringkernel_core::compute::DeviceBuffer,
            format: ::ringkernel_core::compute::WeightFormat,
            x: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::QMatmulDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::qmatmul(format, dims, true)?;
            $crate::exec::run(self, &plan, &[w_gate, w_up, x, out])
        }
        fn rope_kv(
            &self,
            qkv: &dyn ::ringkernel_core::compute::DeviceBuffer,
            positions: &dyn ::ringkernel_core::compute::DeviceBuffer,
            q: &dyn ::ringkernel_core::compute::DeviceBuffer,
            k_cache: &dyn ::ringkernel_core::compute::DeviceBuffer,
            v_cache: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::KvDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::rope_kv(dims)?;
            $crate::exec::run(self, &plan, &[qkv, positions, q, k_cache, v_cache])
        }
        fn attention_kv(
            &self,
            q: &dyn ::ringkernel_core::compute::DeviceBuffer,
            k_cache: &dyn ::ringkernel_core::compute::DeviceBuffer,
            v_cache: &dyn ::ringkernel_core::compute::DeviceBuffer,
            positions: &dyn ::ringkernel_core::compute::DeviceBuffer,
            out: &dyn ::ringkernel_core::compute::DeviceBuffer,
            dims: ::ringkernel_core::compute::KvDims,
        ) -> ::ringkernel_core::Result<()> {
            let plan = $crate::plan::attention_kv(dims)?;
            $crate::exec::run(self, &plan, &[q, k_cache, v_cache, positions, out])
        }
    };
}
