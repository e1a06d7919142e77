//! CPU compute ops: [`CpuCompute`] implements
//! [`ComputeBackend`] with rayon for parallelism, vectorised inner loops
//! (see `kernels.rs`) and the `gemm` crate for matrix products.
//!
//! Ops run synchronously on the calling thread (fanning out to rayon for large inputs),
//! so `synchronize` has nothing to wait for.
//!
//! ```
//! use ringkernel_core::compute::{ComputeBackend, MatmulDims};
//! use ringkernel_cpu::CpuCompute;
//!
//! let cpu = CpuCompute::new();
//! let a = cpu.upload(&[1.0, 2.0, 3.0, 4.0])?;
//! let b = cpu.upload(&[5.0, 6.0, 7.0, 8.0])?;
//! let c = cpu.alloc(4)?;
//! cpu.matmul(&*a, &*b, &*c, MatmulDims { batch: 1, m: 2, k: 2, n: 2, b_batched: false })?;
//! let mut out = [0.0; 4];
//! cpu.read(&*c, 0, &mut out)?;
//! assert_eq!(out, [19.0, 22.0, 43.0, 50.0]);
//! # Ok::<(), ringkernel_core::Error>(())
//! ```

mod buffer;
mod kernels;
mod model;
mod qdot;

pub use buffer::CpuBuffer;

use buffer::{cpu, lock_buffers};
use rayon::prelude::*;
use ringkernel_core::compute::{
    checks, AttentionDims, BinaryOp, BroadcastDims, BufferRef, ComputeBackend, DType, DeviceBuffer,
    EmbeddingDims, KvDims, MatmulDims, QMatmulDims, ReduceDims, ReduceOp, RopeDims, UnaryOp,
    WeightFormat,
};
use ringkernel_core::{BackendKind, Error, Result};
use std::sync::Arc;

/// Elementwise work is split into tasks of this many elements.
const CHUNK: usize = 1 << 15;
/// Below this many elements (or multiply-adds) an op runs on the calling thread only.
const PAR_MIN: usize = 1 << 16;

/// The CPU compute backend.
///
/// [`CpuCompute::new`] uses rayon's global thread pool (all cores, or
/// `RAYON_NUM_THREADS`); [`CpuCompute::with_threads`] gets a dedicated pool of its own,
/// e.g. one thread for single-thread figures.
///
/// ```
/// use ringkernel_core::compute::{ComputeBackend, UnaryOp};
/// use ringkernel_cpu::CpuCompute;
///
/// let cpu = CpuCompute::with_threads(1)?;
/// assert_eq!(cpu.threads(), 1);
/// let x = cpu.upload(&[0.0, 1.0])?;
/// let y = cpu.alloc(2)?;
/// cpu.unary(UnaryOp::Exp, &*x, &*y, 2)?;
/// let mut out = [0.0; 2];
/// cpu.read(&*y, 0, &mut out)?;
/// assert!((out[1] - std::f32::consts::E).abs() < 1e-6);
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct CpuCompute {
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl CpuCompute {
    /// A backend on rayon's global pool.
    pub fn new() -> Self {
        CpuCompute { pool: None }
    }

    /// A backend with a dedicated pool of `threads` threads (at least 1).
    pub fn with_threads(threads: usize) -> Result<Self> {
        if threads == 0 {
            return Err(Error::invalid(
                "CpuCompute::with_threads: need at least one thread",
            ));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("ringkernel-compute-{i}"))
            .build()
            .map_err(|e| {
                Error::Device(format!(
                    "cannot start a rayon pool of {threads} threads: {e}"
                ))
            })?;
        Ok(CpuCompute {
            pool: Some(Arc::new(pool)),
        })
    }

    /// Number of threads ops may use.
    pub fn threads(&self) -> usize {
        match &self.pool {
            Some(p) => p.current_num_threads(),
            None => rayon::current_num_threads(),
        }
    }

    /// Runs `f` inside this backend's pool.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}

/// Applies `f` to matching chunks of `x` and `out`, in parallel when large. (The
/// output is not streamed as the row ops' is: measured, the extra pass through a block
/// cost the elementwise ops more than the saved read-for-ownership.)
fn par_map1(x: &[f32], out: &mut [f32], f: impl Fn(&[f32], &mut [f32]) + Sync + Send) {
    if out.len() < PAR_MIN {
        f(x, out)
    } else {
        out.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(o, x)| f(x, o));
    }
}

/// [`par_map1`] with two inputs.
fn par_map2(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    f: impl Fn(&[f32], &[f32], &mut [f32]) + Sync + Send,
) {
    if out.len() < PAR_MIN {
        f(a, b, out)
    } else {
        out.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK))
            .zip(b.par_chunks(CHUNK))
            .for_each(|((o, a), b)| f(a, b, o));
    }
}

thread_local! {
    /// Per-thread row scratch for the streamed row ops.
    static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f(out_row)` directly, or for outputs of at least `STREAM_MIN` elements into a
/// per-thread scratch row that is then streamed into `out_row`.
fn row_out(stream: bool, out_row: &mut [f32], f: impl FnOnce(&mut [f32])) {
    if !stream {
        return f(out_row);
    }
    ROW.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => {
            s.resize(out_row.len(), 0.0);
            f(&mut s[..]);
            kernels::stream_copy(&s[..], out_row);
        }
        // not reachable (rows do not nest), but never worth a panic
        Err(_) => f(out_row),
    })
}

/// Calls `f(row_index, out_row)` for each `width`-wide row of `out`, in parallel with
/// at least ~`CHUNK` elements per task when `work` (elements touched) is large.
fn par_rows(
    out: &mut [f32],
    width: usize,
    work: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if width == 0 {
        return;
    }
    if work < PAR_MIN {
        out.chunks_mut(width).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        let rows = out.len() / width;
        let per_row = (work / rows.max(1)).max(1);
        let min_len = (CHUNK / per_row).max(1);
        out.par_chunks_mut(width)
            .enumerate()
            .with_min_len(min_len)
            .for_each(|(i, o)| f(i, o));
    }
}

impl ComputeBackend for CpuCompute {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn device_name(&self) -> String {
        format!("CPU ({} threads)", self.threads())
    }

    fn alloc(&self, len: usize) -> Result<BufferRef> {
        Ok(Arc::new(CpuBuffer::zeros(len)?))
    }

    fn upload(&self, data: &[f32]) -> Result<BufferRef> {
        Ok(Arc::new(CpuBuffer::from_slice(data)?))
    }

    fn write(&self, buf: &dyn DeviceBuffer, offset: usize, data: &[f32]) -> Result<()> {
        let b = cpu(buf)?;
        checks::range(buf, offset, data.len(), "write")?;
        b.write()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read(&self, buf: &dyn DeviceBuffer, offset: usize, out: &mut [f32]) -> Result<()> {
        let b = cpu(buf)?;
        checks::range(buf, offset, out.len(), "read")?;
        out.copy_from_slice(&b.read()[offset..offset + out.len()]);
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
        let (s, d) = (cpu(src)?, cpu(dst)?);
        checks::copy((src, src_offset), (dst, dst_offset), len)?;
        let (s_end, d_end) = (src_offset + len, dst_offset + len);
        if std::ptr::eq(s, d) {
            d.write().copy_within(src_offset..s_end, dst_offset);
        } else {
            let mut l = lock_buffers(&[s], d)?;
            let (ins, out) = l.parts();
            out[dst_offset..d_end].copy_from_slice(&ins[0][src_offset..s_end]);
        }
        Ok(())
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
        let (xb, ob) = (cpu(x)?, cpu(out)?);
        checks::unary(len).check(&[x, out])?;
        let mut l = lock_buffers(&[xb], ob)?;
        let (ins, o) = l.parts();
        let (x, o) = (&ins[0][..len], &mut o[..len]);
        self.run(|| par_map1(x, o, |x, o| kernels::unary(op, x, o)));
        Ok(())
    }

    fn binary(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (ab, bb, ob) = (cpu(a)?, cpu(b)?, cpu(out)?);
        checks::binary(len).check(&[a, b, out])?;
        let mut l = lock_buffers(&[ab, bb], ob)?;
        let (ins, o) = l.parts();
        let (a, b, o) = (&ins[0][..len], &ins[1][..len], &mut o[..len]);
        self.run(|| par_map2(a, b, o, |a, b, o| kernels::binary(op, a, b, o)));
        Ok(())
    }

    fn binary_scalar(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        s: f32,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (ab, ob) = (cpu(a)?, cpu(out)?);
        checks::binary_scalar(len).check(&[a, out])?;
        let mut l = lock_buffers(&[ab], ob)?;
        let (ins, o) = l.parts();
        let (a, o) = (&ins[0][..len], &mut o[..len]);
        self.run(|| par_map1(a, o, |a, o| kernels::binary_scalar(op, a, s, o)));
        Ok(())
    }

    fn matmul(
        &self,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: MatmulDims,
    ) -> Result<()> {
        let MatmulDims {
            batch,
            m,
            k,
            n,
            b_batched,
        } = dims;
        let (ab, bb, ob) = (cpu(a)?, cpu(b)?, cpu(out)?);
        let needs = checks::matmul(dims)?;
        needs.check(&[a, b, out])?;
        let (a_len, b_len, o_len) = (needs.elems(0), needs.elems(1), needs.elems(2));
        let flops = checks::product(&[batch, m, n, k], "matmul")?;
        let mut l = lock_buffers(&[ab, bb], ob)?;
        let (ins, o) = l.parts();
        let (a, b, o) = (&ins[0][..a_len], &ins[1][..b_len], &mut o[..o_len]);
        if o_len == 0 {
            return Ok(());
        }
        if k == 0 {
            o.fill(0.0);
            return Ok(());
        }
        let threads = self.threads();
        let one = |a: &[f32], b: &[f32], o: &mut [f32], par: gemm::Parallelism| {
            // SAFETY: `a` holds m·k, `b` k·n and `o` m·n elements (sliced above to exactly
            // the batch's extent), all row-major: column stride 1, row strides k, n, n.
            // `o` is a unique borrow, so it overlaps neither input. With
            // `read_dst = false` the destination is only written.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    o.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    par,
                )
            }
        };
        let b_of = |i: usize| {
            if b_batched {
                &b[i * k * n..(i + 1) * k * n]
            } else {
                b
            }
        };
        self.run(|| {
            let small = m * n * k < 96 * 96 * 96;
            if threads > 1 && batch > 1 && small {
                o.par_chunks_mut(m * n)
                    .zip(a.par_chunks(m * k))
                    .enumerate()
                    .for_each(|(i, (o, a))| one(a, b_of(i), o, gemm::Parallelism::None));
            } else {
                let par = if threads > 1 && flops >= PAR_MIN * 4 {
                    gemm::Parallelism::Rayon(threads)
                } else {
                    gemm::Parallelism::None
                };
                for (i, (o, a)) in o.chunks_mut(m * n).zip(a.chunks(m * k)).enumerate() {
                    one(a, b_of(i), o, par);
                }
            }
        });
        Ok(())
    }

    fn matvec(
        &self,
        a: &dyn DeviceBuffer,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        m: usize,
        k: usize,
    ) -> Result<()> {
        let (ab, xb, ob) = (cpu(a)?, cpu(x)?, cpu(out)?);
        let needs = checks::matvec(m, k)?;
        needs.check(&[a, x, out])?;
        let a_len = needs.elems(0);
        let mut l = lock_buffers(&[ab, xb], ob)?;
        let (ins, o) = l.parts();
        let (a, x, o) = (&ins[0][..a_len], &ins[1][..k], &mut o[..m]);
        if k == 0 {
            o.fill(0.0);
            return Ok(());
        }
        self.run(|| {
            par_rows(o, 1, a_len, |i, o| {
                o[0] = kernels::dot(&a[i * k..(i + 1) * k], x)
            })
        });
        Ok(())
    }

    fn argmax(&self, x: &dyn DeviceBuffer, len: usize, out: &dyn DeviceBuffer) -> Result<()> {
        let (xb, ob) = (cpu(x)?, cpu(out)?);
        checks::argmax(len)?.check(&[x, out])?;
        checks::distinct("argmax", out, &[x])?;
        let mut l = lock_buffers(&[xb], ob)?;
        let (ins, o) = l.parts();
        // The index fits 32 bits (checked).
        o[0] = f32::from_bits(ringkernel_core::compute::reference::argmax(&ins[0][..len]) as u32);
        Ok(())
    }

    fn dot(
        &self,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (ab, bb, ob) = (cpu(a)?, cpu(b)?, cpu(out)?);
        checks::dot(len).check(&[a, b, out])?;
        let mut l = lock_buffers(&[ab, bb], ob)?;
        let (ins, o) = l.parts();
        let (a, b) = (&ins[0][..len], &ins[1][..len]);
        o[0] = self.run(|| {
            if len < PAR_MIN {
                kernels::dot(a, b)
            } else {
                a.par_chunks(CHUNK)
                    .zip(b.par_chunks(CHUNK))
                    .map(|(a, b)| kernels::dot(a, b) as f64)
                    .sum::<f64>() as f32
            }
        });
        Ok(())
    }

    fn reduce(
        &self,
        op: ReduceOp,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: ReduceDims,
    ) -> Result<()> {
        let ReduceDims { outer, axis, inner } = dims;
        let (xb, ob) = (cpu(x)?, cpu(out)?);
        let needs = checks::reduce(dims)?;
        needs.check(&[x, out])?;
        let (x_len, o_len) = (needs.elems(0), needs.elems(1));
        let mut l = lock_buffers(&[xb], ob)?;
        let (ins, o) = l.parts();
        let (x, o) = (&ins[0][..x_len], &mut o[..o_len]);
        let finish = |v: f32| {
            if op == ReduceOp::Mean {
                v / axis as f32
            } else {
                v
            }
        };
        self.run(|| {
            if inner == 1 {
                if outer == 1 && x_len >= PAR_MIN {
                    // one long row: partial results per chunk, combined in f64
                    let v = match op {
                        ReduceOp::Sum | ReduceOp::Mean => {
                            x.par_chunks(CHUNK).map(kernels::sum).sum::<f64>() as f32
                        }
                        _ => {
                            let parts: Vec<f32> = x
                                .par_chunks(CHUNK)
                                .map(|c| kernels::reduce_slice(op, c))
                                .collect();
                            kernels::reduce_slice(op, &parts)
                        }
                    };
                    o[0] = finish(v);
                } else {
                    par_rows(o, 1, x_len, |i, o| {
                        o[0] = finish(kernels::reduce_slice(op, &x[i * axis..(i + 1) * axis]))
                    });
                }
            } else {
                // reduce rows of `inner` elements into one accumulator row, in column blocks
                let block = inner.min(1024);
                let blocks_per_row = inner.div_ceil(block);
                let work = x_len;
                let f = |idx: usize, ob: &mut [f32]| {
                    let (oi, bi) = (idx / blocks_per_row, idx % blocks_per_row);
                    let c0 = bi * block;
                    let w = ob.len();
                    let base = oi * axis * inner;
                    if matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
                        // f64 accumulators: a long axis keeps f32 precision
                        let mut acc = vec![0.0f64; w];
                        for a in 0..axis {
                            let r = base + a * inner + c0;
                            kernels::add_into(&mut acc, &x[r..r + w]);
                        }
                        let div = if op == ReduceOp::Mean {
                            axis as f64
                        } else {
                            1.0
                        };
                        for (o, a) in ob.iter_mut().zip(acc) {
                            *o = (a / div) as f32;
                        }
                        return;
                    }
                    ob.copy_from_slice(&x[base + c0..base + c0 + w]);
                    for a in 1..axis {
                        let r = base + a * inner + c0;
                        kernels::reduce_into(op, ob, &x[r..r + w]);
                    }
                };
                // one task per (outer row, column block); the last block of a row may be short
                let mut tasks: Vec<&mut [f32]> = o
                    .chunks_mut(inner)
                    .flat_map(|row| row.chunks_mut(block))
                    .collect();
                if work < PAR_MIN {
                    tasks.iter_mut().enumerate().for_each(|(i, t)| f(i, t));
                } else {
                    tasks.par_iter_mut().enumerate().for_each(|(i, t)| f(i, t));
                }
            }
        });
        Ok(())
    }

    fn softmax(
        &self,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let (xb, ob) = (cpu(x)?, cpu(out)?);
        let needs = checks::softmax(rows, cols)?;
        needs.check(&[x, out])?;
        let n = needs.elems(0);
        let mut l = lock_buffers(&[xb], ob)?;
        let (ins, o) = l.parts();
        let (x, o) = (&ins[0][..n], &mut o[..n]);
        let stream = n >= kernels::STREAM_MIN;
        self.run(|| {
            par_rows(o, cols, n, |r, o| {
                row_out(stream, o, |o| {
                    kernels::softmax_row(&x[r * cols..(r + 1) * cols], o)
                })
            })
        });
        Ok(())
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
        let (xb, wb, ob) = (cpu(x)?, cpu(weight)?, cpu(out)?);
        let needs = checks::rms_norm(rows, cols)?;
        needs.check(&[x, weight, out])?;
        let n = needs.elems(0);
        let mut l = lock_buffers(&[xb, wb], ob)?;
        let (ins, o) = l.parts();
        let (x, w, o) = (&ins[0][..n], &ins[1][..cols], &mut o[..n]);
        let stream = n >= kernels::STREAM_MIN;
        self.run(|| {
            par_rows(o, cols, n, |r, o| {
                row_out(stream, o, |o| {
                    kernels::rms_norm_row(&x[r * cols..(r + 1) * cols], w, eps, o)
                })
            })
        });
        Ok(())
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
        let (xb, wb, bb, ob) = (cpu(x)?, cpu(weight)?, cpu(bias)?, cpu(out)?);
        let needs = checks::layer_norm(rows, cols)?;
        needs.check(&[x, weight, bias, out])?;
        let n = needs.elems(0);
        let mut l = lock_buffers(&[xb, wb, bb], ob)?;
        let (ins, o) = l.parts();
        let (x, w, b, o) = (&ins[0][..n], &ins[1][..cols], &ins[2][..cols], &mut o[..n]);
        let stream = n >= kernels::STREAM_MIN;
        self.run(|| {
            par_rows(o, cols, n, |r, o| {
                row_out(stream, o, |o| {
                    kernels::layer_norm_row(&x[r * cols..(r + 1) * cols], w, b, eps, o)
                })
            })
        });
        Ok(())
    }

    fn rope(
        &self,
        x: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: RopeDims,
    ) -> Result<()> {
        let RopeDims {
            seq,
            heads,
            head_dim,
            base,
        } = dims;
        let (xb, pb, ob) = (cpu(x)?, cpu(positions)?, cpu(out)?);
        let needs = checks::rope(dims)?;
        needs.check(&[x, positions, out])?;
        let n = needs.elems(0);
        let mut l = lock_buffers(&[xb, pb], ob)?;
        let (ins, o) = l.parts();
        let (x, pos, o) = (&ins[0][..n], &ins[1][..seq], &mut o[..n]);
        let h = head_dim / 2;
        let inv_freq: Vec<f64> = (0..h)
            .map(|i| (base as f64).powf(-2.0 * i as f64 / head_dim as f64))
            .collect();
        let row = heads * head_dim;
        self.run(|| {
            par_rows(o, row, n, |s, o| {
                let p = pos[s] as f64;
                let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq
                    .iter()
                    .map(|f| {
                        let (s, c) = (p * f).sin_cos();
                        (c as f32, s as f32)
                    })
                    .unzip();
                for (xo, oo) in x[s * row..(s + 1) * row]
                    .chunks_exact(head_dim)
                    .zip(o.chunks_exact_mut(head_dim))
                {
                    let (x0, x1) = xo.split_at(h);
                    let (o0, o1) = oo.split_at_mut(h);
                    for i in 0..h {
                        o0[i] = x0[i] * cos[i] - x1[i] * sin[i];
                        o1[i] = x0[i] * sin[i] + x1[i] * cos[i];
                    }
                }
            })
        });
        Ok(())
    }

    fn attention_scores(
        &self,
        q: &dyn DeviceBuffer,
        k: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()> {
        let (qb, kb, ob) = (cpu(q)?, cpu(k)?, cpu(out)?);
        checks::attention_scores(&dims)?.check(&[q, k, out])?;
        let s = checks::attention_sizes(&dims)?;
        let mut l = lock_buffers(&[qb, kb], ob)?;
        let (ins, o) = l.parts();
        let (q, k, o) = (&ins[0][..s.q], &ins[1][..s.kv], &mut o[..s.scores]);
        let AttentionDims {
            q_len,
            kv_len,
            kv_stride,
            head_dim: d,
            scale,
            ..
        } = dims;
        self.run(|| {
            par_rows(o, kv_len, s.scores.saturating_mul(d), |r, o| {
                let (b, i) = (r / q_len, r % q_len);
                let vis = visible(&dims, i);
                let qr = &q[r * d..(r + 1) * d];
                let kr = &k[b * kv_stride * d..(b * kv_stride + vis) * d];
                kernels::dot_rows(qr, kr, scale, &mut o[..vis]);
                o[vis..].fill(f32::NEG_INFINITY);
            })
        });
        Ok(())
    }

    fn attention_weighted_sum(
        &self,
        p: &dyn DeviceBuffer,
        v: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()> {
        let (pb, vb, ob) = (cpu(p)?, cpu(v)?, cpu(out)?);
        checks::attention_weighted_sum(&dims)?.check(&[p, v, out])?;
        let s = checks::attention_sizes(&dims)?;
        let mut l = lock_buffers(&[pb, vb], ob)?;
        let (ins, o) = l.parts();
        let (p, v, o) = (&ins[0][..s.scores], &ins[1][..s.kv], &mut o[..s.q]);
        let AttentionDims {
            q_len,
            kv_len,
            kv_stride,
            head_dim: d,
            ..
        } = dims;
        self.run(|| {
            par_rows(o, d, s.scores.saturating_mul(d), |r, o| {
                let b = r / q_len;
                let pr = &p[r * kv_len..(r + 1) * kv_len];
                kernels::weighted_rows(pr, &v[b * kv_stride * d..(b * kv_stride + kv_len) * d], o);
            })
        });
        Ok(())
    }

    fn attention(
        &self,
        q: &dyn DeviceBuffer,
        k: &dyn DeviceBuffer,
        v: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()> {
        let (qb, kb, vb, ob) = (cpu(q)?, cpu(k)?, cpu(v)?, cpu(out)?);
        checks::attention(&dims)?.check(&[q, k, v, out])?;
        let s = checks::attention_sizes(&dims)?;
        let mut l = lock_buffers(&[qb, kb, vb], ob)?;
        let (ins, o) = l.parts();
        let (q, k, v, o) = (
            &ins[0][..s.q],
            &ins[1][..s.kv],
            &ins[2][..s.kv],
            &mut o[..s.q],
        );
        let AttentionDims {
            q_len,
            kv_len,
            kv_stride,
            head_dim: d,
            scale,
            ..
        } = dims;
        self.run(|| {
            let row = |scratch: &mut Vec<f32>, r: usize, o: &mut [f32]| {
                let (b, i) = (r / q_len, r % q_len);
                let vis = visible(&dims, i);
                if vis == 0 {
                    o.fill(0.0);
                    return;
                }
                scratch.resize(2 * vis, 0.0);
                let (sc, p) = scratch.split_at_mut(vis);
                let kv0 = b * kv_stride * d;
                kernels::dot_rows(&q[r * d..(r + 1) * d], &k[kv0..kv0 + vis * d], scale, sc);
                kernels::softmax_row(sc, p);
                kernels::weighted_rows(p, &v[kv0..kv0 + vis * d], o);
            };
            let work = s.scores.saturating_mul(d).saturating_mul(2);
            if work < PAR_MIN {
                let mut scratch = Vec::new();
                o.chunks_mut(d)
                    .enumerate()
                    .for_each(|(r, o)| row(&mut scratch, r, o));
            } else {
                let min_len = (CHUNK / (kv_len * d * 2).max(1)).max(1);
                o.par_chunks_mut(d)
                    .enumerate()
                    .with_min_len(min_len)
                    .for_each_init(Vec::new, |scratch, (r, o)| row(scratch, r, o));
            }
        });
        Ok(())
    }

    fn swiglu(
        &self,
        gate: &dyn DeviceBuffer,
        up: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        let (gb, ub, ob) = (cpu(gate)?, cpu(up)?, cpu(out)?);
        checks::swiglu(len).check(&[gate, up, out])?;
        let mut l = lock_buffers(&[gb, ub], ob)?;
        let (ins, o) = l.parts();
        let (g, u, o) = (&ins[0][..len], &ins[1][..len], &mut o[..len]);
        self.run(|| par_map2(g, u, o, kernels::swiglu));
        Ok(())
    }

    fn convert(
        &self,
        x: &dyn DeviceBuffer,
        from: DType,
        out: &dyn DeviceBuffer,
        to: DType,
        len: usize,
    ) -> Result<()> {
        self.convert_impl(x, from, out, to, len)
    }

    fn broadcast_binary(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: &BroadcastDims,
    ) -> Result<()> {
        self.broadcast_impl(op, a, b, out, dims)
    }

    fn embedding(
        &self,
        table: &dyn DeviceBuffer,
        format: WeightFormat,
        ids: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: EmbeddingDims,
    ) -> Result<()> {
        self.embedding_impl(table, format, ids, out, dims)
    }

    fn qmatmul(
        &self,
        w: &dyn DeviceBuffer,
        format: WeightFormat,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: QMatmulDims,
    ) -> Result<()> {
        self.qmatmul_impl(&[w], format, x, out, dims)
    }

    fn qmatmul_swiglu(
        &self,
        w_gate: &dyn DeviceBuffer,
        w_up: &dyn DeviceBuffer,
        format: WeightFormat,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: QMatmulDims,
    ) -> Result<()> {
        self.qmatmul_impl(&[w_gate, w_up], format, x, out, dims)
    }

    fn rope_kv(
        &self,
        qkv: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        q: &dyn DeviceBuffer,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        dims: KvDims,
    ) -> Result<()> {
        self.rope_kv_impl(qkv, positions, q, k_cache, v_cache, dims)
    }

    fn attention_kv(
        &self,
        q: &dyn DeviceBuffer,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: KvDims,
    ) -> Result<()> {
        self.attention_kv_impl(q, k_cache, v_cache, positions, out, dims)
    }

    fn batch(&self, ops: &mut (dyn FnMut() -> Result<()> + Send)) -> Result<()> {
        // Inside the pool, every op's `run` executes in place instead of queueing a job
        // for the pool and sleeping until it is done (measured: most of a decode step's
        // overhead over its arithmetic, ~250 ops a token).
        self.run(ops)
    }

    fn memory_available(&self) -> Option<u64> {
        let s = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
}

/// How many keys query row `i` sees.
fn visible(d: &AttentionDims, i: usize) -> usize {
    if d.causal {
        d.kv_len.min(d.q_offset.saturating_add(i).saturating_add(1))
    } else {
        d.kv_len
    }
}
