//! A backend-agnostic conformance kit for [`ComputeBackend`] implementations.
//!
//! [`check_all`] runs every op of the trait on fresh random inputs of awkward sizes
//! (1, 7, 33, 1023, 4097 elements; matrices up to 65×129×33; small attention heads),
//! with output buffers poisoned with NaN first and a NaN guard region after the output
//! (so unwritten elements and writes past the end both show), and compares the results
//! with the f64 [`reference`](super::reference) by relative error
//! `‖out − ref‖ / ‖ref‖`. It also checks the error contract: buffers that are too short
//! give [`Error::ShapeMismatch`], and buffers of another backend give [`Error::Device`].
//!
//! Every check is recorded in a [`TestReport`]. When any check fails, the functions
//! return `Err(Error::Device(..))` whose message lists each failing check by op, size and
//! error, so a backend's test is just:
//!
//! ```
//! # use ringkernel_core::compute::ComputeBackend;
//! # fn backend_test(backend: &dyn ComputeBackend) -> ringkernel_core::Result<()> {
//! let report = ringkernel_core::compute::testkit::check_all(backend)?;
//! println!("{report}");
//! # Ok(())
//! # }
//! ```
//!
//! The family functions ([`check_memory`], [`check_elementwise`], [`check_linear`],
//! [`check_reductions`], [`check_normalization`], [`check_rope`], [`check_attention`],
//! [`check_errors`], and for the model ops [`check_convert`], [`check_broadcast`],
//! [`check_quantized`], [`check_kv_attention`], [`check_model_op_errors`]) run one part
//! each, with explicit [`Tolerances`].

use super::reference;
use super::{
    AttentionDims, BinaryOp, BufferRef, ComputeBackend, DeviceBuffer, MatmulDims, ReduceDims,
    ReduceOp, RopeDims, UnaryOp,
};
use crate::backend::BackendKind;
use crate::error::{Error, Result};
use crate::util::{rel_error, SplitMix64};
use std::any::Any;
use std::fmt;

mod model_ops;
mod recorded;

/// Relative-error thresholds per op family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    /// Ops that are one correctly rounded f32 operation (neg, abs, relu, add, sub, mul,
    /// max, min) and sqrt/div (GPUs may be a few ULP off).
    pub exact: f64,
    /// exp, log, sin, cos, tanh, sigmoid, silu, gelu, swiglu.
    pub transcendental: f64,
    /// matmul and matvec (inner dimension up to 4097).
    pub linear: f64,
    /// Whole-tensor and axis reductions and dot (up to 4097 terms).
    pub reduction: f64,
    /// softmax, RMSNorm, LayerNorm.
    pub normalization: f64,
    /// RoPE (positions up to 255, so the angle itself carries f32 rounding).
    pub rope: f64,
    /// Attention scores, weighted sum and fused attention.
    pub attention: f64,
}

impl Default for Tolerances {
    fn default() -> Self {
        Tolerances {
            exact: 1e-6,
            transcendental: 1e-5,
            linear: 1e-5,
            reduction: 1e-4,
            normalization: 1e-5,
            rope: 5e-4,
            attention: 2e-5,
        }
    }
}

/// What one check found.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A numeric result within tolerance.
    Passed {
        /// Measured relative error.
        rel_error: f64,
        /// Allowed relative error.
        tolerance: f64,
    },
    /// A bad call that returned the expected error (its message).
    ExpectedError(String),
    /// Anything else: the reason.
    Failed(String),
}

/// One check: an op on one size.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Op name, e.g. `unary exp` or `matmul`.
    pub op: String,
    /// The size or case, e.g. `len=4097` or `b=2 m=33 k=8 n=65`.
    pub size: String,
    /// Result.
    pub outcome: Outcome,
}

impl Check {
    /// Whether the check passed.
    pub fn passed(&self) -> bool {
        !matches!(self.outcome, Outcome::Failed(_))
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Outcome::Passed {
                rel_error,
                tolerance,
            } => {
                write!(
                    f,
                    "ok    {:<28} {:<34} rel error {rel_error:.2e} (≤ {tolerance:.0e})",
                    self.op, self.size
                )
            }
            Outcome::ExpectedError(e) => write!(
                f,
                "ok    {:<28} {:<34} error as expected: {e}",
                self.op, self.size
            ),
            Outcome::Failed(e) => write!(f, "FAIL  {:<28} {:<34} {e}", self.op, self.size),
        }
    }
}

/// Everything one run of the kit checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TestReport {
    /// Backend under test.
    pub backend: BackendKind,
    /// Its device name.
    pub device: String,
    /// Every check, in the order run.
    pub checks: Vec<Check>,
}

impl TestReport {
    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.passed()).collect()
    }

    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(Check::passed)
    }

    /// Largest relative error among the numeric checks of `op` (prefix match), if any.
    pub fn worst(&self, op: &str) -> Option<f64> {
        self.checks
            .iter()
            .filter(|c| c.op.starts_with(op))
            .filter_map(|c| match c.outcome {
                Outcome::Passed { rel_error, .. } => Some(rel_error),
                _ => None,
            })
            .reduce(f64::max)
    }

    /// Appends another report's checks.
    pub fn merge(&mut self, other: TestReport) {
        self.checks.extend(other.checks);
    }

    /// `Ok(self)` when every check passed, else [`Error::Device`] listing the failures.
    pub fn into_result(self) -> Result<TestReport> {
        let failures = self.failures();
        if failures.is_empty() {
            return Ok(self);
        }
        let mut msg = format!(
            "compute testkit on {} ({}): {} of {} checks failed:",
            self.backend,
            self.device,
            failures.len(),
            self.checks.len()
        );
        for c in failures {
            msg.push_str(&format!("\n  {c}"));
        }
        Err(Error::Device(msg))
    }
}

impl fmt::Display for TestReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "compute testkit on {} ({}): {} checks, {} failed",
            self.backend,
            self.device,
            self.checks.len(),
            self.failures().len()
        )?;
        for c in &self.checks {
            writeln!(f, "  {c}")?;
        }
        Ok(())
    }
}

/// A buffer that claims to belong to another backend; every backend must refuse it
/// with [`Error::Device`].
#[derive(Debug)]
pub struct ForeignBuffer {
    len: usize,
    kind: BackendKind,
}

impl ForeignBuffer {
    /// A foreign buffer of `len` elements claiming a backend other than `not`.
    pub fn new(len: usize, not: BackendKind) -> Self {
        let kind = if not == BackendKind::Cpu {
            BackendKind::Metal
        } else {
            BackendKind::Cpu
        };
        ForeignBuffer { len, kind }
    }
}

impl DeviceBuffer for ForeignBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn backend(&self) -> BackendKind {
        self.kind
    }
}

/// Runs every family below with default [`Tolerances`].
pub fn check_all(backend: &dyn ComputeBackend) -> Result<TestReport> {
    check_all_with(backend, &Tolerances::default())
}

/// Runs every family below with the given tolerances; `Err` lists every failure.
pub fn check_all_with(backend: &dyn ComputeBackend, tol: &Tolerances) -> Result<TestReport> {
    let mut k = Kit::new(backend, tol);
    k.memory();
    k.elementwise();
    k.linear();
    k.reductions();
    k.argmax();
    k.counters();
    k.greedy_feed();
    k.normalization();
    k.rope();
    k.attention();
    k.errors();
    k.convert();
    k.broadcast();
    k.quantized();
    k.kv_attention();
    k.model_op_errors();
    k.finish()
}

macro_rules! family {
    ($(#[$doc:meta])* $name:ident => $method:ident) => {
        $(#[$doc])*
        pub fn $name(backend: &dyn ComputeBackend, tol: &Tolerances) -> Result<TestReport> {
            let mut k = Kit::new(backend, tol);
            k.$method();
            k.finish()
        }
    };
}

family!(
    /// alloc, upload, write and read at offsets, copy between and within buffers.
    check_memory => memory
);
family!(
    /// Every unary op, every binary op (tensor and scalar), and SwiGLU.
    check_elementwise => elementwise
);
family!(
    /// matmul (2-D, batched, shared right-hand side), matvec.
    check_linear => linear
);
family!(
    /// dot, and every reduction over the whole tensor and along an axis, including
    /// sums of 10,000,000 elements.
    check_reductions => reductions
);
family!(
    /// argmax: ties, NaNs, every value -inf, the largest first or last; its errors.
    check_argmax => argmax
);
family!(
    /// increment (offsets, wrap-around, queued twice) and read_async (later work does
    /// not reach it); their errors.
    check_counters => counters
);
family!(
    /// greedy_feed (the argmax, the token's embedding row and the position advanced by
    /// one op) in every weight format; its errors.
    check_greedy_feed => greedy_feed
);
family!(
    /// softmax (including rows far from zero), RMSNorm, LayerNorm.
    check_normalization => normalization
);
family!(
    /// RoPE with random positions.
    check_rope => rope
);
family!(
    /// Attention scores, weighted sum and fused attention, causal and not, with a KV
    /// stride larger than the used length.
    check_attention => attention
);
family!(
    /// Short buffers give `ShapeMismatch`, foreign buffers give `Device`, an empty
    /// reduction axis is an error.
    check_errors => errors
);
family!(
    /// `convert` between f32, f16 and bf16 (exact, with infinities, NaN, subnormals and
    /// ties), and u32 to u32.
    check_convert => convert
);
family!(
    /// `broadcast_binary` on shapes that broadcast in front, behind and in the middle.
    check_broadcast => broadcast
);
family!(
    /// `qmatmul`, `qmatmul_swiglu` and `embedding` in every weight format, against the
    /// exactly decoded weights (batches 1 to 17, with and without accumulation).
    check_quantized => quantized
);
family!(
    /// `rope_kv` and `attention_kv`: grouped-query heads, several tokens at once,
    /// positions out of order, a position past the cache.
    check_kv_attention => kv_attention
);
family!(
    /// The error contract of the model ops (short buffers, foreign buffers, bad
    /// shapes).
    check_model_op_errors => model_op_errors
);

/// Relative error allowed for a sum of 10,000,000 × 0.1f32 (0.2 on 1,000,000: three f32
/// steps; an f32 running sum is off by 16).
const LONG_SUM_TOLERANCE: f64 = 2e-7;

/// Elements after every output that must stay NaN.
const GUARD: usize = 3;
const SIZES: [usize; 5] = [1, 7, 33, 1023, 4097];

struct Kit<'a> {
    b: &'a dyn ComputeBackend,
    tol: Tolerances,
    rng: SplitMix64,
    checks: Vec<Check>,
}

impl<'a> Kit<'a> {
    fn new(b: &'a dyn ComputeBackend, tol: &Tolerances) -> Self {
        Kit {
            b,
            tol: *tol,
            rng: SplitMix64::from_entropy(),
            checks: Vec::new(),
        }
    }

    fn finish(self) -> Result<TestReport> {
        TestReport {
            backend: self.b.kind(),
            device: self.b.device_name(),
            checks: self.checks,
        }
        .into_result()
    }

    fn record(&mut self, op: &str, size: &str, outcome: Outcome) {
        self.checks.push(Check {
            op: op.to_string(),
            size: size.to_string(),
            outcome,
        });
    }

    /// A NaN-poisoned output buffer of `len` elements plus the guard region.
    fn poisoned(&self, len: usize) -> Result<BufferRef> {
        self.b.upload(&vec![f32::NAN; len + GUARD])
    }

    /// Reads `len` elements of `out` and checks that the guard region is still NaN.
    fn fetch(&self, out: &BufferRef, len: usize) -> Result<Vec<f32>> {
        let mut v = vec![0.0f32; len + GUARD];
        self.b.read(&**out, 0, &mut v)?;
        if v[len..].iter().any(|x| !x.is_nan()) {
            return Err(Error::Device(format!(
                "wrote past the end of the output ({len} elements)"
            )));
        }
        v.truncate(len);
        Ok(v)
    }

    /// Runs `run`, which returns the op's output, and compares it with `reference`.
    fn numeric(
        &mut self,
        op: &str,
        size: &str,
        tol: f64,
        reference: &[f64],
        run: impl FnOnce(&Self) -> Result<Vec<f32>>,
    ) {
        let outcome = match run(self) {
            Err(e) => Outcome::Failed(format!("error: {e}")),
            Ok(out) => compare(&out, reference, tol),
        };
        self.record(op, size, outcome);
    }

    /// Uploads `x`, runs `op(x, out)` into a poisoned buffer of `out_len`, returns it.
    fn run_unary_shape(
        &self,
        inputs: &[&[f32]],
        out_len: usize,
        op: impl FnOnce(&[BufferRef], &dyn DeviceBuffer) -> Result<()>,
    ) -> Result<Vec<f32>> {
        let bufs = inputs
            .iter()
            .map(|x| self.b.upload(x))
            .collect::<Result<Vec<_>>>()?;
        let out = self.poisoned(out_len)?;
        op(&bufs, &*out)?;
        self.fetch(&out, out_len)
    }

    fn memory(&mut self) {
        for n in SIZES {
            let data = self.rng.vec(n, -1.0, 1.0);
            let expect: Vec<f64> = data.iter().map(|&x| x as f64).collect();
            self.numeric("upload/read", &format!("len={n}"), 0.0, &expect, |k| {
                let buf = k.b.upload(&data)?;
                let mut out = vec![f32::NAN; n];
                k.b.read(&*buf, 0, &mut out)?;
                Ok(out)
            });
            // alloc + write in two parts at offsets + partial reads
            let half = n / 2;
            self.numeric(
                "alloc/write/read offsets",
                &format!("len={n} split={half}"),
                0.0,
                &expect,
                |k| {
                    let buf = k.b.alloc(n)?;
                    k.b.write(&*buf, half, &data[half..])?;
                    k.b.write(&*buf, 0, &data[..half])?;
                    let mut out = vec![f32::NAN; n];
                    k.b.read(&*buf, half, &mut out[half..])?;
                    k.b.read(&*buf, 0, &mut out[..half])?;
                    Ok(out)
                },
            );
            // copy into the middle of another buffer
            let mut expect2 = vec![f64::NAN; n + 4];
            expect2[2..n + 2].copy_from_slice(&expect);
            let expect2: Vec<f64> = expect2[2..n + 2].to_vec();
            self.numeric(
                "copy",
                &format!("len={n} dst_offset=2"),
                0.0,
                &expect2,
                |k| {
                    let src = k.b.upload(&data)?;
                    let dst = k.b.upload(&vec![f32::NAN; n + 4])?;
                    k.b.copy(&*src, 0, &*dst, 2, n)?;
                    k.b.synchronize()?;
                    let mut out = vec![0.0; n + 4];
                    k.b.read(&*dst, 0, &mut out)?;
                    if !(out[0].is_nan()
                        && out[1].is_nan()
                        && out[n + 2].is_nan()
                        && out[n + 3].is_nan())
                    {
                        return Err(Error::Device(
                            "copy wrote outside the destination range".into(),
                        ));
                    }
                    Ok(out[2..n + 2].to_vec())
                },
            );
        }
        // copy within one buffer (non-overlapping halves), as a KV cache append does
        let n = 1023;
        let data = self.rng.vec(2 * n, -1.0, 1.0);
        let mut expect: Vec<f64> = data.iter().map(|&x| x as f64).collect();
        for i in 0..n {
            expect[n + i] = data[i] as f64;
        }
        self.numeric(
            "copy within a buffer",
            &format!("len={n}"),
            0.0,
            &expect,
            |k| {
                let buf = k.b.upload(&data)?;
                k.b.copy(&*buf, 0, &*buf, n, n)?;
                let mut out = vec![f32::NAN; 2 * n];
                k.b.read(&*buf, 0, &mut out)?;
                Ok(out)
            },
        );
    }

    fn unary_range(op: UnaryOp) -> (f32, f32) {
        match op {
            UnaryOp::Sqrt | UnaryOp::Log => (0.01, 10.0),
            UnaryOp::Exp => (-10.0, 10.0),
            UnaryOp::Sin | UnaryOp::Cos => (-4.0, 4.0),
            _ => (-6.0, 6.0),
        }
    }

    fn elementwise(&mut self) {
        for op in UnaryOp::ALL {
            let tol = match op {
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Sqrt => self.tol.exact,
                _ => self.tol.transcendental,
            };
            let (lo, hi) = Self::unary_range(op);
            for n in SIZES {
                let x = self.rng.vec(n, lo, hi);
                let r = reference::unary(op, &x);
                // log near 1 and sin, cos near their zeros are ill-conditioned: a GPU's
                // f32 result is good to an absolute error there, not a relative one
                // (cos(1.5641) = 0.0067 was 7.7e-8 off on NVIDIA's Vulkan, and sin of
                // one fresh input 2.3e-5 relative). Outputs smaller than 1 (the scale of
                // these functions' values) are held to the tolerance relative to 1.
                let tol = match op {
                    UnaryOp::Log | UnaryOp::Sin | UnaryOp::Cos => {
                        let big = r.iter().fold(0f64, |m, v| m.max(v.abs()));
                        tol * (1.0 / big).max(1.0)
                    }
                    _ => tol,
                };
                self.numeric(
                    &format!("unary {}", op.name()),
                    &format!("len={n}"),
                    tol,
                    &r,
                    |k| k.run_unary_shape(&[&x], n, |b, out| k.b.unary(op, &*b[0], out, n)),
                );
            }
        }
        for op in BinaryOp::ALL {
            let tol = self.tol.exact;
            for n in SIZES {
                let a = self.rng.vec(n, -4.0, 4.0);
                let mut b = self.rng.vec(n, 0.25, 4.0);
                if op != BinaryOp::Div {
                    // mixed signs except for the divisor
                    b.iter_mut().enumerate().for_each(|(i, v)| {
                        if i % 3 == 0 {
                            *v = -*v
                        }
                    });
                }
                let r = reference::binary(op, &a, &b);
                self.numeric(
                    &format!("binary {}", op.name()),
                    &format!("len={n}"),
                    tol,
                    &r,
                    |k| {
                        k.run_unary_shape(&[&a, &b], n, |bb, out| {
                            k.b.binary(op, &*bb[0], &*bb[1], out, n)
                        })
                    },
                );
                let s = self.rng.uniform(0.5, 3.0);
                let r = reference::binary_scalar(op, &a, s);
                self.numeric(
                    &format!("binary_scalar {}", op.name()),
                    &format!("len={n} s={s:.3}"),
                    tol,
                    &r,
                    |k| {
                        k.run_unary_shape(&[&a], n, |bb, out| {
                            k.b.binary_scalar(op, &*bb[0], s, out, n)
                        })
                    },
                );
            }
        }
        for n in SIZES {
            let g = self.rng.vec(n, -6.0, 6.0);
            let u = self.rng.vec(n, -2.0, 2.0);
            let r = reference::swiglu(&g, &u);
            self.numeric(
                "swiglu",
                &format!("len={n}"),
                self.tol.transcendental,
                &r,
                |k| k.run_unary_shape(&[&g, &u], n, |b, out| k.b.swiglu(&*b[0], &*b[1], out, n)),
            );
        }
    }

    fn linear(&mut self) {
        let cases = [
            (1, 1, 1, 1, false),
            (1, 7, 33, 5, false),
            (1, 65, 129, 33, false),
            (1, 33, 1, 7, false),
            (3, 7, 17, 9, true),
            (2, 33, 8, 65, false),
        ];
        for (batch, m, k, n, b_batched) in cases {
            let dims = MatmulDims {
                batch,
                m,
                k,
                n,
                b_batched,
            };
            let a = self.rng.vec(batch * m * k, -1.0, 1.0);
            let b = self
                .rng
                .vec(if b_batched { batch } else { 1 } * k * n, -1.0, 1.0);
            let r = reference::matmul(&a, &b, dims);
            let size = format!(
                "b={batch} m={m} k={k} n={n}{}",
                if b_batched {
                    ""
                } else if batch > 1 {
                    " shared B"
                } else {
                    ""
                }
            );
            self.numeric("matmul", &size, self.tol.linear, &r, |kit| {
                kit.run_unary_shape(&[&a, &b], batch * m * n, |bb, out| {
                    kit.b.matmul(&*bb[0], &*bb[1], out, dims)
                })
            });
        }
        for (m, k) in [(1, 1), (7, 33), (65, 129), (33, 4097), (1023, 7)] {
            let a = self.rng.vec(m * k, -1.0, 1.0);
            let x = self.rng.vec(k, -1.0, 1.0);
            let r = reference::matvec(&a, &x, m, k);
            self.numeric(
                "matvec",
                &format!("m={m} k={k}"),
                self.tol.linear.max(self.tol.reduction),
                &r,
                |kit| {
                    kit.run_unary_shape(&[&a, &x], m, |bb, out| {
                        kit.b.matvec(&*bb[0], &*bb[1], out, m, k)
                    })
                },
            );
        }
    }

    fn reductions(&mut self) {
        for n in SIZES {
            let a = self.rng.vec(n, -0.5, 1.5);
            let b = self.rng.vec(n, 0.0, 1.0);
            let r = reference::dot(&a, &b);
            self.numeric("dot", &format!("len={n}"), self.tol.reduction, &r, |k| {
                k.run_unary_shape(&[&a, &b], 1, |bb, out| k.b.dot(&*bb[0], &*bb[1], out, n))
            });
        }
        let mut shapes: Vec<(usize, usize, usize)> = SIZES.iter().map(|&n| (1, n, 1)).collect();
        shapes.extend([
            (3, 7, 5),
            (33, 1, 7),
            (2, 33, 65),
            (65, 33, 1),
            (1, 7, 1023),
            (4, 1023, 1),
        ]);
        for op in ReduceOp::ALL {
            for &(outer, axis, inner) in &shapes {
                let dims = ReduceDims { outer, axis, inner };
                let x = self.rng.vec(outer * axis * inner, -0.5, 1.5);
                let r = reference::reduce(op, &x, dims);
                let tol = match op {
                    ReduceOp::Max | ReduceOp::Min => 0.0,
                    _ => self.tol.reduction,
                };
                self.numeric(
                    &format!("reduce {}", op.name()),
                    &format!("outer={outer} axis={axis} inner={inner}"),
                    tol,
                    &r,
                    |k| {
                        k.run_unary_shape(&[&x], outer * inner, |bb, out| {
                            k.b.reduce(op, &*bb[0], out, dims)
                        })
                    },
                );
            }
        }
        self.long_sums();
    }

    /// 10,000,000 × 0.1f32: an f32 running sum drifts to about 1,000,016; the exact sum
    /// is 1,000,000.015. Whole tensor, long rows and a long strided axis, sum and mean.
    fn long_sums(&mut self) {
        const N: usize = 10_000_000;
        let x = vec![0.1f32; N];
        for (op, dims) in [
            (ReduceOp::Sum, (1, N, 1)),
            (ReduceOp::Mean, (2, N / 2, 1)),
            (ReduceOp::Sum, (1, N / 2, 2)),
        ] {
            let (outer, axis, inner) = dims;
            let dims = ReduceDims { outer, axis, inner };
            let r = reference::reduce(op, &x, dims);
            self.numeric(
                &format!("reduce {}", op.name()),
                &format!("long: 0.1 × outer={outer} axis={axis} inner={inner}"),
                LONG_SUM_TOLERANCE,
                &r,
                |k| {
                    k.run_unary_shape(&[&x], outer * inner, |bb, out| {
                        k.b.reduce(op, &*bb[0], out, dims)
                    })
                },
            );
        }
    }

    fn normalization(&mut self) {
        let shapes = [(1, 1), (7, 33), (3, 1023), (1, 4097), (33, 7)];
        for (rows, cols) in shapes {
            let x = self.rng.vec(rows * cols, -8.0, 8.0);
            let r = reference::softmax(&x, rows, cols);
            self.numeric(
                "softmax",
                &format!("rows={rows} cols={cols}"),
                self.tol.normalization,
                &r,
                |k| {
                    k.run_unary_shape(&[&x], rows * cols, |bb, out| {
                        k.b.softmax(&*bb[0], out, rows, cols)
                    })
                },
            );
            let w = self.rng.vec(cols, 0.5, 1.5);
            let bias = self.rng.vec(cols, -1.0, 1.0);
            let eps = 1e-5;
            let r = reference::rms_norm(&x, &w, rows, cols, eps);
            self.numeric(
                "rms_norm",
                &format!("rows={rows} cols={cols}"),
                self.tol.normalization,
                &r,
                |k| {
                    k.run_unary_shape(&[&x, &w], rows * cols, |bb, out| {
                        k.b.rms_norm(&*bb[0], &*bb[1], out, rows, cols, eps)
                    })
                },
            );
            let r = reference::layer_norm(&x, &w, &bias, rows, cols, eps);
            self.numeric(
                "layer_norm",
                &format!("rows={rows} cols={cols}"),
                self.tol.normalization,
                &r,
                |k| {
                    k.run_unary_shape(&[&x, &w, &bias], rows * cols, |bb, out| {
                        k.b.layer_norm(&*bb[0], &*bb[1], &*bb[2], out, rows, cols, eps)
                    })
                },
            );
        }
        // rows far from zero: a naive exp would overflow; one row per offset
        let (rows, cols) = (4, 33);
        let mut x = self.rng.vec(rows * cols, -5.0, 5.0);
        for (r, off) in [90.0f32, -90.0, 1000.0, 0.0].iter().enumerate() {
            x[r * cols..(r + 1) * cols]
                .iter_mut()
                .for_each(|v| *v += off);
        }
        let r = reference::softmax(&x, rows, cols);
        self.numeric(
            "softmax",
            "rows=4 cols=33 offsets ±90, 1000",
            self.tol.normalization,
            &r,
            |k| {
                k.run_unary_shape(&[&x], rows * cols, |bb, out| {
                    k.b.softmax(&*bb[0], out, rows, cols)
                })
            },
        );
    }

    fn rope(&mut self) {
        for (seq, heads, head_dim) in [(1, 1, 2), (7, 3, 8), (5, 2, 64), (33, 1, 16)] {
            let dims = RopeDims {
                seq,
                heads,
                head_dim,
                base: 10000.0,
            };
            let x = self.rng.vec(seq * heads * head_dim, -1.0, 1.0);
            let pos: Vec<f32> = (0..seq).map(|_| self.rng.below(256) as f32).collect();
            let r = reference::rope(&x, &pos, dims);
            self.numeric(
                "rope",
                &format!("seq={seq} heads={heads} head_dim={head_dim}"),
                self.tol.rope,
                &r,
                |k| {
                    k.run_unary_shape(&[&x, &pos], x.len(), |bb, out| {
                        k.b.rope(&*bb[0], &*bb[1], out, dims)
                    })
                },
            );
        }
    }

    fn attention(&mut self) {
        // (bh, q_len, kv_len, kv_stride, head_dim, causal, q_offset)
        let cases = [
            (1, 1, 1, 1, 1, false, 0),
            (3, 7, 7, 7, 16, true, 0),
            (2, 1, 33, 40, 32, true, 32),
            (2, 5, 9, 16, 8, false, 0),
            (4, 3, 20, 24, 64, true, 17),
            (1, 4, 4, 4, 7, true, 2),
        ];
        for (bh, q_len, kv_len, kv_stride, head_dim, causal, q_offset) in cases {
            let dims = AttentionDims {
                batch_heads: bh,
                q_len,
                kv_len,
                kv_stride,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                causal,
                q_offset,
            };
            let size = format!(
                "bh={bh} q={q_len} kv={kv_len}/{kv_stride} d={head_dim}{}",
                if causal {
                    format!(" causal@{q_offset}")
                } else {
                    String::new()
                }
            );
            let q = self.rng.vec(bh * q_len * head_dim, -1.0, 1.0);
            let kk = self.rng.vec(bh * kv_stride * head_dim, -1.0, 1.0);
            let v = self.rng.vec(bh * kv_stride * head_dim, -1.0, 1.0);
            let n_scores = bh * q_len * kv_len;
            let r = reference::attention_scores(&q, &kk, dims);
            let tol = self.tol.attention;
            let outcome = match self.run_unary_shape(&[&q, &kk], n_scores, |bb, out| {
                self.b.attention_scores(&*bb[0], &*bb[1], out, dims)
            }) {
                Err(e) => Outcome::Failed(format!("error: {e}")),
                Ok(out) => compare_masked(&out, &r, tol),
            };
            self.record("attention_scores", &size, outcome);

            let p = reference::softmax(
                &r.iter().map(|&s| s as f32).collect::<Vec<_>>(),
                bh * q_len,
                kv_len,
            );
            let p: Vec<f32> = p
                .iter()
                .map(|&x| if x.is_nan() { 0.0 } else { x as f32 })
                .collect();
            let r = reference::attention_weighted_sum(&p, &v, dims);
            self.numeric("attention_weighted_sum", &size, tol, &r, |k| {
                k.run_unary_shape(&[&p, &v], bh * q_len * head_dim, |bb, out| {
                    k.b.attention_weighted_sum(&*bb[0], &*bb[1], out, dims)
                })
            });

            let r = reference::attention(&q, &kk, &v, dims);
            self.numeric("attention", &size, tol, &r, |k| {
                k.run_unary_shape(&[&q, &kk, &v], bh * q_len * head_dim, |bb, out| {
                    k.b.attention(&*bb[0], &*bb[1], &*bb[2], out, dims)
                })
            });
        }
    }

    /// Expects `result` to be the error `want` names (`shape` or `device`).
    fn expect_err(&mut self, op: &str, case: &str, want: ErrKind, result: Result<()>) {
        let outcome = match (result, want) {
            (Ok(()), _) => Outcome::Failed(format!("expected a {want:?} error, got Ok")),
            (Err(e @ Error::ShapeMismatch(_)), ErrKind::Shape | ErrKind::Any) => {
                Outcome::ExpectedError(e.to_string())
            }
            (Err(e @ Error::Device(_)), ErrKind::Device | ErrKind::Any) => {
                Outcome::ExpectedError(e.to_string())
            }
            (Err(e), ErrKind::Any) => Outcome::ExpectedError(e.to_string()),
            (Err(e), _) => Outcome::Failed(format!("expected a {want:?} error, got: {e}")),
        };
        self.record(op, case, outcome);
    }

    fn errors(&mut self) {
        let b = self.b;
        let setup = (|| -> Result<(BufferRef, BufferRef)> {
            Ok((b.upload(&[1.0; 64])?, b.upload(&[1.0; 8])?))
        })();
        let (big, small) = match setup {
            Ok(x) => x,
            Err(e) => {
                self.record(
                    "errors setup",
                    "upload",
                    Outcome::Failed(format!("error: {e}")),
                );
                return;
            }
        };
        let (g, s) = (&*big, &*small);
        let foreign = ForeignBuffer::new(64, b.kind());
        let f: &dyn DeviceBuffer = &foreign;
        use ErrKind::{Any, Device, Shape};

        let mut host = [0.0f32; 8];
        self.expect_err(
            "read",
            "offset 4 + 8 > len 8",
            Shape,
            b.read(s, 4, &mut host),
        );
        self.expect_err("write", "offset 1 + 8 > len 8", Shape, b.write(s, 1, &host));
        self.expect_err(
            "copy",
            "src range past the end",
            Shape,
            b.copy(s, 4, g, 0, 8),
        );
        self.expect_err(
            "copy",
            "dst range past the end",
            Shape,
            b.copy(g, 0, s, 4, 8),
        );
        self.expect_err("read", "foreign buffer", Device, b.read(f, 0, &mut host));
        self.expect_err("write", "foreign buffer", Device, b.write(f, 0, &host));
        self.expect_err("copy", "foreign buffer", Device, b.copy(f, 0, g, 0, 8));

        self.expect_err(
            "unary",
            "out too short",
            Shape,
            b.unary(UnaryOp::Exp, g, s, 9),
        );
        self.expect_err(
            "unary",
            "x too short",
            Shape,
            b.unary(UnaryOp::Exp, s, g, 9),
        );
        self.expect_err("unary", "foreign x", Device, b.unary(UnaryOp::Exp, f, g, 8));
        self.expect_err(
            "binary",
            "b too short",
            Shape,
            b.binary(BinaryOp::Add, g, s, g, 9),
        );
        self.expect_err(
            "binary",
            "foreign out",
            Device,
            b.binary(BinaryOp::Add, g, g, f, 8),
        );
        self.expect_err(
            "binary_scalar",
            "out too short",
            Shape,
            b.binary_scalar(BinaryOp::Mul, g, 2.0, s, 9),
        );
        self.expect_err(
            "binary_scalar",
            "foreign a",
            Device,
            b.binary_scalar(BinaryOp::Mul, f, 2.0, g, 8),
        );
        let md = MatmulDims {
            batch: 1,
            m: 3,
            k: 3,
            n: 3,
            b_batched: false,
        };
        self.expect_err("matmul", "a too short", Shape, b.matmul(s, g, g, md));
        self.expect_err("matmul", "out too short", Shape, b.matmul(g, g, s, md));
        let mdb = MatmulDims {
            batch: 2,
            m: 2,
            k: 2,
            n: 3,
            b_batched: true,
        };
        self.expect_err(
            "matmul",
            "batched b too short",
            Shape,
            b.matmul(g, s, g, mdb),
        );
        self.expect_err("matmul", "foreign b", Device, b.matmul(g, f, g, md));
        self.expect_err("matvec", "x too short", Shape, b.matvec(g, s, g, 2, 9));
        self.expect_err("matvec", "a too short", Shape, b.matvec(s, g, g, 3, 3));
        self.expect_err("matvec", "foreign out", Device, b.matvec(g, g, f, 2, 2));
        self.expect_err("dot", "b too short", Shape, b.dot(g, s, g, 9));
        self.expect_err("dot", "foreign a", Device, b.dot(f, g, g, 8));
        let rd = ReduceDims {
            outer: 3,
            axis: 3,
            inner: 1,
        };
        self.expect_err(
            "reduce",
            "x too short",
            Shape,
            b.reduce(ReduceOp::Sum, s, g, rd),
        );
        self.expect_err(
            "reduce",
            "out too short",
            Shape,
            b.reduce(
                ReduceOp::Sum,
                g,
                s,
                ReduceDims {
                    outer: 3,
                    axis: 2,
                    inner: 3,
                },
            ),
        );
        self.expect_err(
            "reduce",
            "empty axis",
            Any,
            b.reduce(
                ReduceOp::Max,
                g,
                g,
                ReduceDims {
                    outer: 2,
                    axis: 0,
                    inner: 2,
                },
            ),
        );
        self.expect_err(
            "reduce",
            "foreign x",
            Device,
            b.reduce(ReduceOp::Sum, f, g, rd),
        );
        self.expect_err("softmax", "x too short", Shape, b.softmax(s, g, 3, 3));
        self.expect_err("softmax", "foreign out", Device, b.softmax(g, f, 2, 2));
        self.expect_err(
            "rms_norm",
            "weight too short",
            Shape,
            b.rms_norm(g, s, g, 2, 9, 1e-5),
        );
        self.expect_err(
            "rms_norm",
            "foreign weight",
            Device,
            b.rms_norm(g, f, g, 2, 2, 1e-5),
        );
        self.expect_err(
            "layer_norm",
            "bias too short",
            Shape,
            b.layer_norm(g, g, s, g, 2, 9, 1e-5),
        );
        self.expect_err(
            "layer_norm",
            "foreign bias",
            Device,
            b.layer_norm(g, g, f, g, 2, 2, 1e-5),
        );
        let rp = RopeDims {
            seq: 3,
            heads: 1,
            head_dim: 4,
            base: 10000.0,
        };
        self.expect_err("rope", "x too short", Shape, b.rope(s, g, g, rp));
        self.expect_err(
            "rope",
            "positions too short",
            Shape,
            b.rope(
                g,
                s,
                g,
                RopeDims {
                    seq: 9,
                    heads: 1,
                    head_dim: 2,
                    base: 10000.0,
                },
            ),
        );
        self.expect_err("rope", "foreign positions", Device, b.rope(g, f, g, rp));
        let ad = AttentionDims {
            batch_heads: 1,
            q_len: 2,
            kv_len: 3,
            kv_stride: 3,
            head_dim: 4,
            scale: 0.5,
            causal: true,
            q_offset: 1,
        };
        self.expect_err(
            "attention_scores",
            "q too short",
            Shape,
            b.attention_scores(s, g, g, AttentionDims { q_len: 3, ..ad }),
        );
        self.expect_err(
            "attention_scores",
            "foreign k",
            Device,
            b.attention_scores(g, f, g, ad),
        );
        self.expect_err(
            "attention_weighted_sum",
            "v too short",
            Shape,
            b.attention_weighted_sum(g, s, g, ad),
        );
        self.expect_err(
            "attention_weighted_sum",
            "foreign p",
            Device,
            b.attention_weighted_sum(f, g, g, ad),
        );
        self.expect_err(
            "attention",
            "k too short",
            Shape,
            b.attention(g, s, g, g, ad),
        );
        self.expect_err(
            "attention",
            "out too short",
            Shape,
            b.attention(g, g, g, s, AttentionDims { q_len: 3, ..ad }),
        );
        self.expect_err(
            "attention",
            "foreign v",
            Device,
            b.attention(g, g, f, g, ad),
        );
        self.expect_err("swiglu", "up too short", Shape, b.swiglu(g, s, g, 9));
        self.expect_err("swiglu", "foreign gate", Device, b.swiglu(f, g, g, 8));
    }
}

#[derive(Debug, Clone, Copy)]
enum ErrKind {
    Shape,
    Device,
    Any,
}

fn compare(out: &[f32], reference: &[f64], tol: f64) -> Outcome {
    if out.len() != reference.len() {
        return Outcome::Failed(format!(
            "output has {} elements, reference {}",
            out.len(),
            reference.len()
        ));
    }
    if let Some(i) = out.iter().position(|x| x.is_nan()) {
        return Outcome::Failed(format!(
            "NaN at element {i} of {} (unwritten or invalid), reference {}",
            out.len(),
            reference[i]
        ));
    }
    let e = rel_error(out, reference);
    if e <= tol {
        Outcome::Passed {
            rel_error: e,
            tolerance: tol,
        }
    } else {
        let (i, _) = out
            .iter()
            .zip(reference)
            .map(|(&o, &r)| (o as f64 - r).abs())
            .enumerate()
            .fold((0, 0.0), |acc, (i, d)| if d > acc.1 { (i, d) } else { acc });
        Outcome::Failed(format!(
            "rel error {e:.3e} > {tol:.0e} (worst element {i}: got {}, want {})",
            out[i], reference[i]
        ))
    }
}

/// Like [`compare`], but entries that are `−∞` in the reference (causally masked) must be
/// `−∞` in the output too and are left out of the error norm.
fn compare_masked(out: &[f32], reference: &[f64], tol: f64) -> Outcome {
    if out.len() != reference.len() {
        return Outcome::Failed(format!(
            "output has {} elements, reference {}",
            out.len(),
            reference.len()
        ));
    }
    let mut o2 = Vec::with_capacity(out.len());
    let mut r2 = Vec::with_capacity(out.len());
    for (i, (&o, &r)) in out.iter().zip(reference).enumerate() {
        if r == f64::NEG_INFINITY {
            if o != f32::NEG_INFINITY {
                return Outcome::Failed(format!("masked element {i} is {o}, want -inf"));
            }
        } else {
            o2.push(o);
            r2.push(r);
        }
    }
    compare(&o2, &r2, tol)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_flags_nan_and_error() {
        assert!(matches!(
            compare(&[1.0, 2.0], &[1.0, 2.0], 0.0),
            Outcome::Passed { .. }
        ));
        assert!(matches!(
            compare(&[f32::NAN, 2.0], &[1.0, 2.0], 1.0),
            Outcome::Failed(_)
        ));
        assert!(matches!(
            compare(&[1.5, 2.0], &[1.0, 2.0], 1e-3),
            Outcome::Failed(_)
        ));
        assert!(matches!(
            compare_masked(&[f32::NEG_INFINITY, 2.0], &[f64::NEG_INFINITY, 2.0], 0.0),
            Outcome::Passed { .. }
        ));
        assert!(matches!(
            compare_masked(&[0.0, 2.0], &[f64::NEG_INFINITY, 2.0], 0.0),
            Outcome::Failed(_)
        ));
    }

    #[test]
    fn report_lists_failures_by_op_and_size() {
        let r = TestReport {
            backend: BackendKind::Cpu,
            device: "test".into(),
            checks: vec![
                Check {
                    op: "unary exp".into(),
                    size: "len=7".into(),
                    outcome: Outcome::Failed("rel error 1".into()),
                },
                Check {
                    op: "dot".into(),
                    size: "len=1".into(),
                    outcome: Outcome::Passed {
                        rel_error: 0.0,
                        tolerance: 1e-4,
                    },
                },
            ],
        };
        assert!(!r.passed());
        let msg = r.into_result().unwrap_err().to_string();
        assert!(
            msg.contains("unary exp") && msg.contains("len=7") && msg.contains("1 of 2"),
            "{msg}"
        );
    }

    #[test]
    fn foreign_buffer_claims_another_backend() {
        for k in BackendKind::ALL {
            assert_ne!(ForeignBuffer::new(1, k).backend(), k);
        }
    }
}
