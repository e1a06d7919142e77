//! The model ops of the CPU backend: dtype conversion, broadcasting, the block-format
//! weight ops (on the stored blocks, see `qdot.rs`) and attention over a KV cache.

use super::buffer::{cpu, lock_buffers, lock_many};
use super::{kernels, par_rows, qdot, CpuCompute, CHUNK, PAR_MIN};
use rayon::prelude::*;
use ringkernel_core::compute::dtype::{self, f32_as_words, DType};
use ringkernel_core::compute::quant::{self, BLOCK};
use ringkernel_core::compute::{
    checks, BinaryOp, BroadcastDims, DeviceBuffer, EmbeddingDims, KvDims, QMatmulDims, WeightFormat,
};
use ringkernel_core::Result;

/// Weight rows a batched `qmatmul` decodes and multiplies together.
const GROUP: usize = 4;

thread_local! {
    /// Per-thread decoded weight rows of a batched `qmatmul`.
    static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn binary_op(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
    }
}

/// Element `i` of `from`-typed words written as `to`'s bits (for the float types).
fn encode(to: DType, v: f32) -> u32 {
    match to {
        DType::F16 => u32::from(dtype::f32_to_f16_bits(v)),
        DType::Bf16 => u32::from(dtype::f32_to_bf16_bits(v)),
        _ => v.to_bits(),
    }
}

/// The rotation table of one position: `(cos, sin)` of `pos · base^(−2i/head_dim)`,
/// computed in f64.
fn rope_table(pos: u32, half: usize, head_dim: usize, base: f32) -> Vec<(f32, f32)> {
    (0..half)
        .map(|i| {
            let a = f64::from(pos) * f64::from(base).powf(-2.0 * i as f64 / head_dim as f64);
            let (s, c) = a.sin_cos();
            (c as f32, s as f32)
        })
        .collect()
}

/// Half-split RoPE of every head of `x` into `out` with `table`.
fn rotate(x: &[f32], table: &[(f32, f32)], head_dim: usize, out: &mut [f32]) {
    let h = head_dim / 2;
    for (xh, oh) in x.chunks_exact(head_dim).zip(out.chunks_exact_mut(head_dim)) {
        let (x0, x1) = xh.split_at(h);
        let (o0, o1) = oh.split_at_mut(h);
        for (i, &(c, s)) in table.iter().enumerate() {
            o0[i] = x0[i] * c - x1[i] * s;
            o1[i] = x0[i] * s + x1[i] * c;
        }
    }
}

impl CpuCompute {
    pub(super) fn convert_impl(
        &self,
        x: &dyn DeviceBuffer,
        from: DType,
        out: &dyn DeviceBuffer,
        to: DType,
        len: usize,
    ) -> Result<()> {
        let (xb, ob) = (cpu(x)?, cpu(out)?);
        let needs = checks::convert(from, to, len)?;
        needs.check(&[x, out])?;
        let mut l = lock_buffers(&[xb], ob)?;
        let (ins, o) = l.parts();
        let xw = f32_as_words(&ins[0][..needs.elems(0)]);
        let ow: &mut [u32] = bytemuck::cast_slice_mut(&mut o[..needs.elems(1)]);
        if from == to {
            ow.copy_from_slice(xw);
            if to.words(len) != len && len % 2 == 1 {
                ow[len / 2] &= 0xFFFF;
            }
            return Ok(());
        }
        let per = if matches!(to, DType::F16 | DType::Bf16) {
            2
        } else {
            1
        };
        let fill = |w0: usize, chunk: &mut [u32]| {
            for (k, w) in chunk.iter_mut().enumerate() {
                let e0 = (w0 + k) * per;
                let mut v = 0u32;
                for j in 0..per {
                    if e0 + j < len {
                        v |= encode(to, dtype::element(from, xw, e0 + j)) << (16 * j);
                    }
                }
                *w = v;
            }
        };
        self.run(|| {
            if len < PAR_MIN {
                fill(0, ow);
            } else {
                ow.par_chunks_mut(CHUNK)
                    .enumerate()
                    .for_each(|(c, chunk)| fill(c * CHUNK, chunk));
            }
        });
        Ok(())
    }

    pub(super) fn broadcast_impl(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: &BroadcastDims,
    ) -> Result<()> {
        let (ab, bb, ob) = (cpu(a)?, cpu(b)?, cpu(out)?);
        let needs = checks::broadcast_binary(d)?;
        needs.check(&[a, b, out])?;
        let mut l = lock_buffers(&[ab, bb], ob)?;
        let (ins, o) = l.parts();
        let (a, b, o) = (ins[0], ins[1], &mut o[..needs.elems(2)]);
        let (rank, shape) = (d.rank, &d.shape[..d.rank]);
        // Rows of the innermost dimension: the strides along a row are constant.
        let inner = shape[rank - 1];
        let (sa, sb) = (d.a_strides[rank - 1], d.b_strides[rank - 1]);
        self.run(|| {
            par_rows(o, inner, o.len(), |r, row| {
                let (mut rest, mut ia, mut ib) = (r, 0, 0);
                for k in (0..rank - 1).rev() {
                    let c = rest % shape[k];
                    rest /= shape[k];
                    ia += c * d.a_strides[k];
                    ib += c * d.b_strides[k];
                }
                for (j, v) in row.iter_mut().enumerate() {
                    *v = binary_op(op, a[ia + j * sa], b[ib + j * sb]);
                }
            })
        });
        Ok(())
    }

    pub(super) fn embedding_impl(
        &self,
        table: &dyn DeviceBuffer,
        format: WeightFormat,
        ids: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: EmbeddingDims,
    ) -> Result<()> {
        let (tb, ib, ob) = (cpu(table)?, cpu(ids)?, cpu(out)?);
        let needs = checks::embedding(format, d)?;
        needs.check(&[table, ids, out])?;
        let mut l = lock_buffers(&[tb, ib], ob)?;
        let (ins, o) = l.parts();
        let words = f32_as_words(&ins[0][..needs.elems(0)]);
        let ids = f32_as_words(&ins[1][..d.count]);
        let row_words = format.words(1, d.cols)?;
        for (&id, row) in ids
            .iter()
            .zip(o[..needs.elems(2)].chunks_exact_mut(d.cols.max(1)))
        {
            let id = id as usize;
            if id < d.rows {
                let w = &words[id * row_words..(id + 1) * row_words];
                row.copy_from_slice(&quant::dequantize(format, w, d.cols)?);
            } else {
                row.fill(0.0);
            }
        }
        Ok(())
    }

    /// `qmatmul` (one weight matrix) or `qmatmul_swiglu` (`gate` and `up`).
    pub(super) fn qmatmul_impl(
        &self,
        w: &[&dyn DeviceBuffer],
        format: WeightFormat,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: QMatmulDims,
    ) -> Result<()> {
        let needs = if w.len() == 1 {
            checks::qmatmul(format, d)?
        } else {
            checks::qmatmul_swiglu(format, d)?
        };
        let mut args: Vec<&dyn DeviceBuffer> = w.to_vec();
        args.extend([x, out]);
        needs.check(&args)?;
        let ins = args[..args.len() - 1]
            .iter()
            .map(|b| cpu(*b))
            .collect::<Result<Vec<_>>>()?;
        let mut l = lock_buffers(&ins, cpu(out)?)?;
        let (ins, o) = l.parts();
        let nw = w.len();
        let wlen = needs.elems(0);
        let mats: Vec<&[u8]> = ins[..nw]
            .iter()
            .map(|m| bytemuck::cast_slice::<f32, u8>(&m[..wlen]))
            .collect();
        let (batch, rows, cols) = (d.batch, d.rows, d.cols);
        let x = &ins[nw][..batch * cols];
        let o = &mut o[..batch * rows];
        if batch == 0 || rows == 0 {
            return Ok(());
        }
        let rb = cols / BLOCK * qdot::block_bytes(format);
        let sums: Vec<Vec<f32>> = x
            .chunks_exact(cols.max(1))
            .map(|xt| qdot::block_sums(format, xt))
            .collect();
        // One row of W against one token: the fused dot on the blocks.
        let row_value = |r: usize| {
            let rows_of = |k: usize| &mats[k][r * rb..(r + 1) * rb];
            let g = qdot::dot(format, rows_of(0), x, &sums[0]);
            if nw == 1 {
                g
            } else {
                let u = qdot::dot(format, rows_of(1), x, &sums[0]);
                g / (1.0 + (-g).exp()) * u
            }
        };
        // Up to `GROUP` rows of W (from `r0`) against every token: the rows are decoded
        // once (into a per-thread f32 buffer), and each token's slice of `x` is read once
        // for all of them. `vals` is `[rows, batch]`.
        let group_values = |r0: usize, vals: &mut [f32]| {
            let g = vals.len() / batch;
            DECODED.with(|cell| {
                let mut buf = cell.borrow_mut();
                buf.resize(2 * GROUP * cols, 0.0);
                let (wg, wu) = buf.split_at_mut(GROUP * cols);
                for j in 0..g {
                    let (r, at) = (r0 + j, j * cols..(j + 1) * cols);
                    qdot::decode_row(format, &mats[0][r * rb..(r + 1) * rb], &mut wg[at.clone()]);
                    if nw == 2 {
                        qdot::decode_row(format, &mats[1][r * rb..(r + 1) * rb], &mut wu[at]);
                    }
                }
                let dots = |w: &[f32], xt: &[f32]| -> [f32; GROUP] {
                    if g == GROUP {
                        kernels::dot4(w, xt)
                    } else {
                        let mut d = [0f32; GROUP];
                        for (j, d) in d.iter_mut().enumerate().take(g) {
                            *d = kernels::dot(&w[j * cols..(j + 1) * cols], xt);
                        }
                        d
                    }
                };
                for t in 0..batch {
                    let xt = &x[t * cols..(t + 1) * cols];
                    let gv = dots(wg, xt);
                    let uv = if nw == 2 { dots(wu, xt) } else { [0f32; GROUP] };
                    for j in 0..g {
                        let a = gv[j];
                        vals[j * batch + t] = if nw == 1 {
                            a
                        } else {
                            a / (1.0 + (-a).exp()) * uv[j]
                        };
                    }
                }
            })
        };
        let work = batch * rows * cols * nw;
        let rows_per_task = (CHUNK * 8 / (batch * cols * nw).max(1)).clamp(1, 64);
        self.run(|| {
            if batch == 1 {
                let each = |(i, chunk): (usize, &mut [f32])| {
                    for (k, v) in chunk.iter_mut().enumerate() {
                        let val = row_value(i * rows_per_task + k);
                        *v = if d.accumulate { *v + val } else { val };
                    }
                };
                if work < PAR_MIN {
                    o.chunks_mut(rows_per_task).enumerate().for_each(each);
                } else {
                    o.par_chunks_mut(rows_per_task).enumerate().for_each(each);
                }
            } else {
                // [rows, batch] first, then into [batch, rows].
                let mut tmp = vec![0f32; rows * batch];
                let rows_per_task = rows_per_task.next_multiple_of(GROUP);
                let each = |(i, chunk): (usize, &mut [f32])| {
                    for (k, vals) in chunk.chunks_mut(GROUP * batch).enumerate() {
                        group_values(i * rows_per_task + k * GROUP, vals);
                    }
                };
                if work < PAR_MIN {
                    tmp.chunks_mut(rows_per_task * batch)
                        .enumerate()
                        .for_each(each);
                } else {
                    tmp.par_chunks_mut(rows_per_task * batch)
                        .enumerate()
                        .for_each(each);
                }
                for (t, orow) in o.chunks_exact_mut(rows).enumerate() {
                    for (r, v) in orow.iter_mut().enumerate() {
                        let val = tmp[r * batch + t];
                        *v = if d.accumulate { *v + val } else { val };
                    }
                }
            }
        });
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_kv_impl(
        &self,
        qkv: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        q: &dyn DeviceBuffer,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        d: KvDims,
    ) -> Result<()> {
        checks::rope_kv(&d)?.check(&[qkv, positions, q, k_cache, v_cache])?;
        let s = checks::kv_sizes(&d)?;
        let mut l = lock_many(
            &[cpu(qkv)?, cpu(positions)?],
            &[cpu(q)?, cpu(k_cache)?, cpu(v_cache)?],
        )?;
        let (ins, mut outs) = l.parts();
        let (x, pos) = (&ins[0][..s.qkv], f32_as_words(&ins[1][..d.tokens]));
        let hd = d.head_dim;
        let (qw, kw) = (d.heads * hd, d.kv_heads * hd);
        let width = qw + 2 * kw;
        for (t, &p) in pos.iter().enumerate() {
            let table = rope_table(p, hd / 2, hd, d.rope_base);
            let row = &x[t * width..(t + 1) * width];
            rotate(&row[..qw], &table, hd, &mut outs[0][t * qw..(t + 1) * qw]);
            let p = p as usize;
            if p >= d.capacity {
                continue;
            }
            for h in 0..d.kv_heads {
                let at = (h * d.capacity + p) * hd;
                let src = qw + h * hd;
                rotate(&row[src..src + hd], &table, hd, &mut outs[1][at..at + hd]);
                outs[2][at..at + hd].copy_from_slice(&row[src + kw..src + kw + hd]);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_kv_impl(
        &self,
        q: &dyn DeviceBuffer,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: KvDims,
    ) -> Result<()> {
        checks::attention_kv(&d)?.check(&[q, k_cache, v_cache, positions, out])?;
        let s = checks::kv_sizes(&d)?;
        let ins = [cpu(q)?, cpu(k_cache)?, cpu(v_cache)?, cpu(positions)?];
        let mut l = lock_buffers(&ins, cpu(out)?)?;
        let (ins, o) = l.parts();
        let (qs, kc, vc) = (&ins[0][..s.q], &ins[1][..s.cache], &ins[2][..s.cache]);
        let pos = f32_as_words(&ins[3][..d.tokens]);
        let o = &mut o[..s.q];
        let (hd, group) = (d.head_dim, d.heads / d.kv_heads);
        let row = |scratch: &mut Vec<f32>, r: usize, o: &mut [f32]| {
            let (t, h) = (r / d.heads, r % d.heads);
            let n = (pos[t] as usize).min(d.capacity - 1) + 1;
            scratch.resize(2 * n, 0.0);
            let (sc, p) = scratch.split_at_mut(n);
            let kv0 = (h / group) * d.capacity * hd;
            kernels::dot_rows(
                &qs[r * hd..(r + 1) * hd],
                &kc[kv0..kv0 + n * hd],
                d.scale,
                sc,
            );
            kernels::softmax_row(sc, p);
            kernels::weighted_rows(p, &vc[kv0..kv0 + n * hd], o);
        };
        let work: usize = pos
            .iter()
            .map(|&p| (p as usize).min(d.capacity) + 1)
            .sum::<usize>()
            * d.heads
            * hd
            * 2;
        self.run(|| {
            if work < PAR_MIN {
                let mut scratch = Vec::new();
                o.chunks_mut(hd.max(1))
                    .enumerate()
                    .for_each(|(r, o)| row(&mut scratch, r, o));
            } else {
                o.par_chunks_mut(hd.max(1))
                    .enumerate()
                    .for_each_init(Vec::new, |scratch, (r, o)| row(scratch, r, o));
            }
        });
        Ok(())
    }
}
