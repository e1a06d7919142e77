//! The model ops of [`CudaCompute`] (kernels in `kernels/model.cu`): dtype conversion,
//! broadcasting, the block-format weight ops and attention over a KV cache. None of them
//! allocates or synchronises, so a decode step made of them can be captured in a CUDA
//! graph ([`ComputeBackend::record`](ringkernel_core::compute::ComputeBackend::record)).

use super::program::{field, Instr, OP_EMBED, OP_QM, OP_ROPE_ATT};
use super::{arg, grid_1d, CudaCompute, CudaGraph, MAX_GRID_YZ};
use ringkernel_core::compute::{
    checks, decoder, BinaryOp, BroadcastDims, ComputeBackend, DType, DecoderDims, DecoderLayer,
    DecoderScratch, DeviceBuffer, EmbeddingDims, GreedyFeed, KvDims, QMatmulDims, Replay,
    WeightFormat, MAX_BROADCAST_RANK,
};
use ringkernel_core::{Error, Result};

/// Warps (rows of W) per `rk_qmatmul_*` block and tokens per block (grid y); as
/// `QM_WARPS` and `QM_TOKENS` in `model.cu`.
const QM_WARPS: usize = 4;
const QM_TOKENS: usize = 4;
/// Rows a warp of `rk_qmatvec_rows_*` takes (`QM_ROWS`), and from how many rows one token's
/// matvec uses those kernels (an output head: 49,152 rows for SmolLM2).
const QM_ROWS: usize = 4;
const QM_ROWS_FROM: usize = 16384;
/// Threads per `rk_attention_kv` block (`KV_THREADS`), and the largest head it takes
/// (`KV_MAXD`).
const KV_THREADS: u32 = 512;
const KV_MAX_HEAD_DIM: usize = 256;

/// The split decode attention (`rk_rope_attention_kv_split`): threads a block
/// (`AS_THREADS`), the largest head (`AS_MAXD`), and what its scratch holds: parts for
/// up to `ATTN_SPLIT_HEADS` query heads of `ATTN_SPLIT_MAX` blocks each, then a counter
/// per head, then a 64-bit ticket count per head and one for `rk_ffn_qkv_*`.
const AS_THREADS: u32 = 128;
const AS_MAX_HEAD_DIM: usize = 128;
const ATTN_SPLIT_HEADS: usize = 64;
const ATTN_SPLIT_MAX: usize = 16;
const ATTN_PARTS_BYTES: usize = ATTN_SPLIT_HEADS * ATTN_SPLIT_MAX * (AS_MAX_HEAD_DIM + 2) * 4;
/// Where the 64-bit tickets a head of `rk_rope_attention_wo_split_*` start, after the
/// parts and the counters.
const ATTN_TICKETS_AT: usize = ATTN_PARTS_BYTES + ATTN_SPLIT_HEADS * 4;
/// Where the 64-bit ticket count of `rk_ffn_qkv_*`'s meeting is, after those.
const GRID_TICKET_AT: usize = ATTN_TICKETS_AT + ATTN_SPLIT_HEADS * 8;
/// Bytes of the split attention's scratch (allocated with the backend, zeroed).
pub(super) const ATTN_SCRATCH_BYTES: usize = GRID_TICKET_AT + 8;
/// Blocks a query head in the split decode attention when `RINGKERNEL_CUDA_ATTN_SPLIT`
/// does not say (`0` there: the one-block-a-head kernel, `rk_rope_attention_kv`).
const ATTN_SPLIT_DEFAULT: usize = 8;

/// The split decode attention's blocks a head, from `RINGKERNEL_CUDA_ATTN_SPLIT` (read
/// once; capped at `ATTN_SPLIT_MAX`; a value that is not a number is reported and the
/// default kept); 0 for the one-block-a-head kernel.
fn attn_split() -> usize {
    static SPLIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SPLIT.get_or_init(|| {
        parse_attn_split(std::env::var("RINGKERNEL_CUDA_ATTN_SPLIT").ok().as_deref())
    })
}

/// [`attn_split`] from the variable's value (`None`: unset).
fn parse_attn_split(value: Option<&str>) -> usize {
    let Some(v) = value else {
        return ATTN_SPLIT_DEFAULT;
    };
    match v.trim().parse::<usize>() {
        Ok(n) => n.min(ATTN_SPLIT_MAX),
        Err(_) => {
            tracing::warn!(value = %v, default = ATTN_SPLIT_DEFAULT,
                "RINGKERNEL_CUDA_ATTN_SPLIT is not a number of blocks; keeping the default");
            ATTN_SPLIT_DEFAULT
        }
    }
}

/// The leading parameters every decode attention kernel takes, in order: the pointers of
/// qkv, positions, q, the key and value caches and the output, then heads, key/value
/// heads, head width, capacity (u64 each), the RoPE base and the score scale (f32).
struct AttnArgs {
    ptrs: [u64; 6],
    sizes: [u64; 4],
    rope_base: f32,
    scale: f32,
}

impl AttnArgs {
    fn new(ptrs: [u64; 6], d: &KvDims) -> Self {
        AttnArgs {
            ptrs,
            sizes: [
                d.heads as u64,
                d.kv_heads as u64,
                d.head_dim as u64,
                d.capacity as u64,
            ],
            rope_base: d.rope_base,
            scale: d.scale,
        }
    }

    /// The kernel argument pointers (into `self`, which must outlive the launch).
    fn args(&mut self) -> Vec<*mut std::ffi::c_void> {
        let mut v: Vec<_> = self.ptrs.iter_mut().map(arg).collect();
        v.extend(self.sizes.iter_mut().map(arg));
        v.extend([arg(&mut self.rope_base), arg(&mut self.scale)]);
        v
    }
}

/// Threads of an `rk_ffn_*` block (`FF_THREADS`: a warp for each of an octet's 8 hidden
/// values).
const FF_THREADS: u32 = 256;

/// A switch read from the environment once: on unless the variable is `0`.
struct Switch(&'static str, std::sync::OnceLock<bool>);

/// Whether a decode step's feed-forward block runs as one kernel (`rk_ffn_*`).
static FUSED_FFN: Switch = Switch("RINGKERNEL_CUDA_FUSED_FFN", std::sync::OnceLock::new());
/// Whether a decode step's attention applies the output projection itself
/// (`rk_rope_attention_wo_split_*`).
static FUSED_WO: Switch = Switch("RINGKERNEL_CUDA_FUSED_WO", std::sync::OnceLock::new());

/// Whether `greedy_feed` runs as one kernel (`rk_greedy_feed_*`) rather than the trait's
/// three ops.
static FUSED_FEED: Switch = Switch("RINGKERNEL_CUDA_FUSED_FEED", std::sync::OnceLock::new());
/// [`super::program::switch`], read once.
fn switch_on(s: &Switch) -> bool {
    *s.1.get_or_init(|| super::program::switch(s.0))
}

/// Whether a decode step's feed-forward kernel goes on with the next layer's norm + QKV
/// (`rk_ffn_qkv_*`).
static FUSED_CHAIN: Switch = Switch("RINGKERNEL_CUDA_FUSED_CHAIN", std::sync::OnceLock::new());

/// Whether a chained feed-forward kernel of `blocks` blocks may run on a backend whose
/// chain grid is `slot` (0: none yet, then claimed). Its blocks meet on one 64-bit count
/// that each launch raises by its block count, and a block waits for the next multiple
/// of that count: a second grid size would meet on a count that is not a multiple of it
/// and let blocks pass early. A backend therefore chains one size only (the first); the
/// layers of another size run one at a time.
pub(super) fn claim_chain_grid(slot: &std::sync::atomic::AtomicU32, blocks: u32) -> bool {
    use std::sync::atomic::Ordering;
    blocks > 0
        && match slot.compare_exchange(0, blocks, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(current) => current == blocks,
        }
}

/// The name of `rk_ffn_qkv_*` for a feed-forward block in `ffn` and a QKV matrix in `qkv`.
fn ffn_qkv_name(ffn: WeightFormat, qkv: WeightFormat) -> String {
    format!("rk_ffn_qkv_{}_{}", ffn.name(), qkv.name())
}

/// The split decode attention's blocks a head for these heads (caches at addresses whose
/// OR is `cache_bits`), or `None` where it does not take them (or the split is off).
fn split_fits(d: &KvDims, cache_bits: u64) -> Option<usize> {
    let split = attn_split();
    (split > 0
        && d.head_dim.is_multiple_of(4)
        && d.head_dim <= AS_MAX_HEAD_DIM
        && d.heads <= ATTN_SPLIT_HEADS
        && cache_bits.is_multiple_of(16))
    .then_some(split)
}

/// The attention kernels take heads of up to `KV_MAX_HEAD_DIM` values.
fn kv_head_fits(op: &str, d: &KvDims) -> Result<()> {
    if d.head_dim > KV_MAX_HEAD_DIM {
        return Err(Error::invalid(format!(
            "{op}: head_dim {} over the kernel's {KV_MAX_HEAD_DIM}",
            d.head_dim
        )));
    }
    Ok(())
}

/// `BroadcastDims` of `model.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct DeviceBroadcast {
    rank: u64,
    len: u64,
    shape: [u64; MAX_BROADCAST_RANK],
    a_strides: [u64; MAX_BROADCAST_RANK],
    b_strides: [u64; MAX_BROADCAST_RANK],
}

impl Replay for CudaGraph {
    fn replay(&self) -> Result<()> {
        self.launch()
    }
    fn describe(&self) -> String {
        "CUDA graph".into()
    }
}

impl CudaCompute {
    pub(super) fn convert_impl(
        &self,
        x: &dyn DeviceBuffer,
        from: DType,
        out: &dyn DeviceBuffer,
        to: DType,
        len: usize,
    ) -> Result<()> {
        let (xb, ob) = (self.buf(x)?, self.buf(out)?);
        let needs = checks::convert(from, to, len)?;
        needs.check(&[x, out])?;
        checks::distinct("convert", out, &[x])?;
        let words = needs.elems(1);
        if words == 0 {
            return Ok(());
        }
        let (mut px, mut po) = (xb.ptr, ob.ptr);
        let (mut n, mut w, mut f, mut t) = (
            len as u64,
            words as u64,
            from.code() as i32,
            to.code() as i32,
        );
        self.launch(
            "rk_convert",
            (grid_1d(words, 256, self.sms()), 1, 1),
            (256, 1, 1),
            0,
            &mut [
                arg(&mut px),
                arg(&mut po),
                arg(&mut n),
                arg(&mut w),
                arg(&mut f),
                arg(&mut t),
            ],
        )
    }

    pub(super) fn broadcast_impl(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: &BroadcastDims,
    ) -> Result<()> {
        let (ab, bb, ob) = (self.buf(a)?, self.buf(b)?, self.buf(out)?);
        let needs = checks::broadcast_binary(d)?;
        needs.check(&[a, b, out])?;
        checks::distinct("broadcast_binary", out, &[a, b])?;
        let len = needs.elems(2);
        if len == 0 {
            return Ok(());
        }
        let mut dims = DeviceBroadcast {
            rank: d.rank as u64,
            len: len as u64,
            shape: d.shape.map(|v| v as u64),
            a_strides: d.a_strides.map(|v| v as u64),
            b_strides: d.b_strides.map(|v| v as u64),
        };
        let (mut pa, mut pb, mut po) = (ab.ptr, bb.ptr, ob.ptr);
        self.launch(
            &format!("rk_broadcast_{}", op.name()),
            (grid_1d(len, 256, self.sms()), 1, 1),
            (256, 1, 1),
            0,
            &mut [arg(&mut pa), arg(&mut pb), arg(&mut po), arg(&mut dims)],
        )
    }

    pub(super) fn embedding_impl(
        &self,
        table: &dyn DeviceBuffer,
        format: WeightFormat,
        ids: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: EmbeddingDims,
    ) -> Result<()> {
        let (tb, ib, ob) = (self.buf(table)?, self.buf(ids)?, self.buf(out)?);
        let needs = checks::embedding(format, d)?;
        needs.check(&[table, ids, out])?;
        checks::distinct("embedding", out, &[table, ids])?;
        let n = needs.elems(2);
        if n == 0 {
            return Ok(());
        }
        if let Some(r) = self.program_op(|| {
            Some(Instr {
                op: OP_EMBED + format.code(),
                a: field(d.rows)?,
                b: field(d.cols)?,
                c: field(d.count)?,
                p: [tb.ptr, ib.ptr, ob.ptr, 0, 0, 0, 0, 0],
                ..Instr::default()
            })
        }) {
            return r;
        }
        let (mut pt, mut pi, mut po) = (tb.ptr, ib.ptr, ob.ptr);
        let (mut r, mut c, mut k) = (d.rows as u64, d.cols as u64, d.count as u64);
        self.launch_writing(
            &format!("rk_embedding_{}", format.name()),
            (grid_1d(n, 256, self.sms()), 1, 1),
            (256, 1, 1),
            &mut [
                arg(&mut pt),
                arg(&mut pi),
                arg(&mut po),
                arg(&mut r),
                arg(&mut c),
                arg(&mut k),
            ],
            &[self.span(out)?],
        )
    }

    /// `ComputeBackend::greedy_feed`: one `rk_greedy_feed_*` kernel (one block: the
    /// argmax, then the picked row of the table).
    pub(super) fn greedy_feed_impl(&self, f: &GreedyFeed) -> Result<()> {
        if !switch_on(&FUSED_FEED) {
            return f.run_ops(self);
        }
        let p = self.device_ptrs(&f.buffers())?;
        f.check()?;
        let (mut pl, mut pw, mut pt, mut px, mut pp) = (p[0], p[1], p[2], p[3], p[4]);
        let (mut rows, mut cols) = (f.rows as u64, f.cols as u64);
        self.launch_writing(
            &format!("rk_greedy_feed_{}", f.table.format.name()),
            (1, 1, 1),
            (super::ARGMAX_THREADS, 1, 1),
            &mut [
                arg(&mut pl),
                arg(&mut rows),
                arg(&mut pw),
                arg(&mut cols),
                arg(&mut pt),
                arg(&mut px),
                arg(&mut pp),
            ],
            &[self.span(f.token)?, self.span(f.x)?, self.span(f.position)?],
        )
    }

    /// `ComputeBackend::rms_norm_qmatmul`: one `rk_qmatmul_norm_*` kernel for up to
    /// `QM_TOKENS` tokens (a decode step), else `rms_norm` into `normed` and the matvec.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rms_norm_qmatmul_impl(
        &self,
        x: &dyn DeviceBuffer,
        norm: &dyn DeviceBuffer,
        eps: f32,
        normed: &dyn DeviceBuffer,
        w: &[&dyn DeviceBuffer],
        format: WeightFormat,
        out: &dyn DeviceBuffer,
        d: QMatmulDims,
    ) -> Result<()> {
        checks::projection_matrices("rms_norm_qmatmul", w.len())?;
        checks::rms_norm(d.batch, d.cols)?.check(&[x, norm, normed])?;
        if d.batch > QM_TOKENS {
            ComputeBackend::rms_norm(self, x, norm, normed, d.batch, d.cols, eps)?;
            return self.qmatmul_impl(w, format, normed, out, d, None);
        }
        self.qmatmul_impl(w, format, x, out, d, Some((norm, eps)))
    }

    /// `qmatmul` (one matrix) or `qmatmul_swiglu` (two); with `norm`, x is RMS-normalised
    /// inside the kernel (`rk_qmatmul_norm_*`, at most `QM_TOKENS` tokens).
    pub(super) fn qmatmul_impl(
        &self,
        w: &[&dyn DeviceBuffer],
        format: WeightFormat,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: QMatmulDims,
        norm: Option<(&dyn DeviceBuffer, f32)>,
    ) -> Result<()> {
        self.qmatmul_keeping(w, format, x, out, d, norm, None)
    }

    /// [`Self::qmatmul_impl`] that also writes a copy to `keep`, for the decoder layer:
    /// of its output (`rk_qmatmul_keep_*`), or with `norm` of its input x
    /// (`rk_qmatmul_norm_copy_*`). One matrix, up to `QM_TOKENS` tokens.
    #[allow(clippy::too_many_arguments)]
    fn qmatmul_keeping(
        &self,
        w: &[&dyn DeviceBuffer],
        format: WeightFormat,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: QMatmulDims,
        norm: Option<(&dyn DeviceBuffer, f32)>,
        keep: Option<&dyn DeviceBuffer>,
    ) -> Result<()> {
        let gated = w.len() == 2;
        let needs = if gated {
            checks::qmatmul_swiglu(format, d)?
        } else {
            checks::qmatmul(format, d)?
        };
        let mut args: Vec<&dyn DeviceBuffer> = w.to_vec();
        args.extend([x, out]);
        needs.check(&args)?;
        if let Some((g, _)) = norm {
            args.insert(args.len() - 1, g);
        }
        // Buffers of another device first: the aliasing check compares identities only.
        let mut ptrs = self.device_ptrs(&args)?;
        checks::distinct("qmatmul", out, &args[..args.len() - 1])?;
        if d.batch == 0 || d.rows == 0 {
            return Ok(());
        }
        if let Some(r) = self.program_op(|| {
            // Pointers as in rk_program: w, w2 (w again without a gate), x, g (0 without
            // a norm), out.
            let mut p = [0u64; 8];
            p[0] = ptrs[0];
            p[1] = ptrs[usize::from(gated)];
            p[2] = ptrs[w.len()];
            if norm.is_some() {
                p[3] = ptrs[w.len() + 1];
            }
            p[4] = ptrs[ptrs.len() - 1];
            Some(Instr {
                op: OP_QM + 4 * format.code() + 2 * u32::from(gated) + u32::from(norm.is_some()),
                a: field(d.batch)?,
                b: field(d.rows)?,
                c: field(d.cols)?,
                d: u32::from(d.accumulate),
                f0: norm.map_or(0.0, |(_, e)| e),
                p,
                ..Instr::default()
            })
        }) {
            return r;
        }
        // One token through a tall matrix (an output head): QM_ROWS rows a warp, in
        // rk_qmatvec_rows_* (no batch parameter).
        let tall = !gated && d.batch == 1 && d.rows >= QM_ROWS_FROM;
        let mut keep_ptr = match keep {
            None => 0,
            Some(k) if !gated && !tall && d.batch <= QM_TOKENS && !self.in_program() => {
                // with a norm, a copy of the input; without, of the output
                let len = if norm.is_some() {
                    needs.elems(1)
                } else {
                    needs.elems(2)
                };
                ringkernel_core::compute::check_len(k, len, "qmatmul copy")?;
                checks::distinct("qmatmul", k, &args)?;
                self.buf(k)?.ptr
            }
            Some(_) => {
                return Err(Error::invalid(
                    "qmatmul: a copy of the output needs the plain kernel",
                ))
            }
        };
        let block = ((QM_WARPS * 32) as u32, 1, 1);
        let norm_part = if norm.is_some() { "norm_" } else { "" };
        let name = if tall {
            format!("rk_qmatvec_rows_{norm_part}{}", format.name())
        } else {
            format!(
                "rk_qmatmul_{norm_part}{}{}{}",
                match (keep.is_some(), norm.is_some()) {
                    (false, _) => "",
                    (true, true) => "copy_",
                    (true, false) => "keep_",
                },
                format.name(),
                if gated { "_swiglu" } else { "" }
            )
        };
        let (gx, gy) = if tall {
            // One wave of resident blocks at most; the warps walk the rows (see
            // qmatvec_rows_body in model.cu).
            let wave = self.sms() as usize
                * self.blocks_per_sm(&name, (QM_WARPS * 32) as u32)?.max(1) as usize;
            (d.rows.div_ceil(QM_ROWS * QM_WARPS).min(wave), 1)
        } else {
            (d.rows.div_ceil(QM_WARPS), d.batch.div_ceil(QM_TOKENS))
        };
        if gx > i32::MAX as usize || gy > MAX_GRID_YZ {
            return Err(Error::invalid(format!(
                "qmatmul: {} rows x {} inputs exceed one launch's grid",
                d.rows, d.batch
            )));
        }
        let (mut b, mut r, mut c, mut acc) = (
            d.batch as u64,
            d.rows as u64,
            d.cols as u64,
            d.accumulate as i32,
        );
        let grid = (gx as u32, gy as u32, 1);
        // The pointers in the kernels' order: weights (one or two), x, then with a norm
        // its weights and epsilon, then out and the sizes.
        let mut eps = norm.map_or(0.0f32, |(_, e)| e);
        let mut params: Vec<*mut std::ffi::c_void> = Vec::with_capacity(10);
        let n_in = ptrs.len() - 1;
        let (inputs, output) = ptrs.split_at_mut(n_in);
        for p in inputs.iter_mut() {
            params.push(arg(p));
        }
        if norm.is_some() {
            params.push(arg(&mut eps));
        }
        params.push(arg(&mut output[0]));
        if !tall {
            params.push(arg(&mut b));
        }
        params.extend([arg(&mut r), arg(&mut c), arg(&mut acc)]);
        // rk_qmatmul_* load the weights, and the output they add to, before their wait
        // where the kernel ahead writes neither (see `early_loads`).
        let mut reads = w
            .iter()
            .map(|b| self.span(*b))
            .collect::<Result<Vec<_>>>()?;
        if d.accumulate {
            reads.push(self.span(out)?);
        }
        let mut early = self.early_loads(&reads);
        if !tall {
            params.push(arg(&mut early));
        }
        let mut writes = vec![self.span(out)?];
        if let Some(k) = keep {
            params.push(arg(&mut keep_ptr));
            writes.push(self.span(k)?);
        }
        self.launch_writing(&name, grid, block, &mut params, &writes)
    }

    /// `ComputeBackend::decoder_layer`. A decode step (one token, outside a program) runs
    /// in three kernels where it can:
    /// 1. the norm + QKV matvec, which also copies `x` into the scratch `residual`;
    /// 2. the attention with the output projection (`rk_rope_attention_wo_split_*`),
    ///    adding its products to `x` and `residual`;
    /// 3. `rk_ffn_*`: norm + gate/up + SwiGLU + down projection, reading `residual` and
    ///    adding its products to `x` (the three matrices in one format).
    ///
    /// Where 2 does not fit (see `wo_split`, or `RINGKERNEL_CUDA_FUSED_WO=0`) the
    /// attention and the output projection are two kernels, the projection writing its sum
    /// to `residual` as well; where 3 does not (or `RINGKERNEL_CUDA_FUSED_FFN=0`) the
    /// feed-forward block is its two ops. Other calls run `decoder::run_ops`.
    pub(super) fn decoder_layer_impl(
        &self,
        x: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        l: &DecoderLayer,
        s: &DecoderScratch,
        d: DecoderDims,
    ) -> Result<()> {
        decoder::check(x, s, &d)?;
        if d.kv.tokens != 1 || self.in_program() {
            return decoder::run_ops(self, x, positions, l, s, d);
        }
        let [qkv, wo, gate_up, down] = d.projections();
        let fuse_ffn = switch_on(&FUSED_FFN) && l.gate.format == l.down.format;
        // 1, copying x where 2 will add to both, then 2.
        let split = self.wo_split(l.k_cache, l.v_cache, &d.kv);
        self.qmatmul_keeping(
            &[l.qkv.buffer],
            l.qkv.format,
            x,
            s.qkv,
            qkv,
            Some((l.attn_norm, d.eps)),
            split.is_some().then_some(s.residual),
        )?;
        match split {
            Some(split) => self.rope_attention_wo(positions, l, s, x, d, split)?,
            None => {
                self.rope_attention_kv_impl(
                    s.qkv, positions, s.q, l.k_cache, l.v_cache, s.att, d.kv,
                )?;
                let keep = fuse_ffn.then_some(s.residual);
                self.qmatmul_keeping(&[l.wo.buffer], l.wo.format, s.att, x, wo, None, keep)?;
            }
        }
        if !fuse_ffn {
            let ffn = [l.gate.buffer, l.up];
            self.rms_norm_qmatmul_impl(
                x,
                l.ffn_norm,
                d.eps,
                s.normed,
                &ffn,
                l.gate.format,
                s.hidden,
                gate_up,
            )?;
            return self.qmatmul_impl(&[l.down.buffer], l.down.format, s.hidden, x, down, None);
        }
        self.ffn(l, s, x, d, gate_up, down, None)
    }

    /// `rk_ffn_*` (see `decoder_layer_impl`), with the checks of the ops it stands for;
    /// with `next` (the next layer and its QKV sizes), `rk_ffn_qkv_*`, which goes on with
    /// that layer's norm + QKV matvec (as `decoder_layers_impl` chains them).
    #[allow(clippy::too_many_arguments)]
    fn ffn(
        &self,
        l: &DecoderLayer,
        s: &DecoderScratch,
        x: &dyn DeviceBuffer,
        d: DecoderDims,
        gate_up: QMatmulDims,
        down: QMatmulDims,
        next: Option<(&DecoderLayer, QMatmulDims)>,
    ) -> Result<()> {
        let format = l.gate.format;
        checks::rms_norm(1, d.dim)?.check(&[s.residual, l.ffn_norm, s.normed])?;
        checks::qmatmul_swiglu(format, gate_up)?.check(&[
            l.gate.buffer,
            l.up,
            s.residual,
            s.hidden,
        ])?;
        checks::qmatmul(format, down)?.check(&[l.down.buffer, s.hidden, x])?;
        let inputs = [l.gate.buffer, l.up, l.down.buffer, s.residual, l.ffn_norm];
        let mut p = self.device_ptrs(&inputs)?;
        checks::distinct("decoder_layer", x, &inputs)?;
        let mut px = self.buf(x)?.ptr;
        let (mut eps, mut dim, mut hidden) = (d.eps, d.dim as u64, d.hidden as u64);
        let mut early = self.early_loads(&[
            self.span(l.gate.buffer)?,
            self.span(l.up)?,
            self.span(l.down.buffer)?,
        ]);
        let (wg, rest) = p.split_at_mut(1);
        let (wu, rest) = rest.split_at_mut(1);
        let (wd, rest) = rest.split_at_mut(1);
        let (xin, g) = rest.split_at_mut(1);
        let mut params = vec![
            arg(&mut wg[0]),
            arg(&mut wu[0]),
            arg(&mut wd[0]),
            arg(&mut xin[0]),
            arg(&mut g[0]),
            arg(&mut eps),
            arg(&mut px),
            arg(&mut dim),
            arg(&mut hidden),
            arg(&mut early),
        ];
        let mut writes = vec![self.span(x)?];
        let Some((n, qd)) = next else {
            return self.launch_writing(
                &format!("rk_ffn_{}", format.name()),
                ((d.hidden / 8) as u32, 1, 1),
                (FF_THREADS, 1, 1),
                &mut params,
                &writes,
            );
        };
        checks::rms_norm(1, d.dim)?.check(&[x, n.attn_norm, s.normed])?;
        checks::qmatmul(n.qkv.format, qd)?.check(&[n.qkv.buffer, x, s.qkv])?;
        let q_in = [n.qkv.buffer, n.attn_norm, x, s.residual];
        checks::distinct("decoder_layer", s.qkv, &q_in)?;
        let mut q = self.device_ptrs(&[n.qkv.buffer, n.attn_norm, s.qkv, s.residual])?;
        let (mut rows_q, mut ticket) = (
            qd.rows as u64,
            self.inner.attn_scratch.ptr() + GRID_TICKET_AT as u64,
        );
        let (wq, rest) = q.split_at_mut(1);
        let (gq, rest) = rest.split_at_mut(1);
        let (pq, copy) = rest.split_at_mut(1);
        params.extend([
            arg(&mut wq[0]),
            arg(&mut gq[0]),
            arg(&mut pq[0]),
            arg(&mut rows_q),
            arg(&mut copy[0]),
            arg(&mut ticket),
        ]);
        writes.extend([self.span(s.qkv)?, self.span(s.residual)?, (ticket, 8)]);
        self.launch_writing(
            &ffn_qkv_name(format, n.qkv.format),
            ((d.hidden / 8) as u32, 1, 1),
            (FF_THREADS, 1, 1),
            &mut params,
            &writes,
        )
    }

    /// `ComputeBackend::decoder_layers`. A decode step's stack of layers that each run in
    /// three kernels (see `decoder_layer_impl`) runs with the feed-forward kernel of each
    /// layer but the last also doing the next layer's norm + QKV matvec
    /// (`rk_ffn_qkv_*`): 2 kernels a layer and one more. That kernel's blocks meet in the
    /// middle, so it is used only where all of them fit on the device at once
    /// (`RINGKERNEL_CUDA_FUSED_CHAIN=0` turns it off); otherwise one layer at a time.
    pub(super) fn decoder_layers_impl(
        &self,
        x: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        layers: &[DecoderLayer],
        s: &DecoderScratch,
        d: DecoderDims,
    ) -> Result<()> {
        let Some(splits) = self.chain_fits(layers, &d)? else {
            return layers
                .iter()
                .try_for_each(|l| self.decoder_layer_impl(x, positions, l, s, d));
        };
        decoder::check(x, s, &d)?;
        let [qkv, _, gate_up, down] = d.projections();
        let first = &layers[0];
        self.qmatmul_keeping(
            &[first.qkv.buffer],
            first.qkv.format,
            x,
            s.qkv,
            qkv,
            Some((first.attn_norm, d.eps)),
            Some(s.residual),
        )?;
        for (i, (l, &split)) in layers.iter().zip(&splits).enumerate() {
            self.rope_attention_wo(positions, l, s, x, d, split)?;
            let next = layers.get(i + 1).map(|n| (n, qkv));
            self.ffn(l, s, x, d, gate_up, down, next)?;
        }
        Ok(())
    }

    /// Whether `decoder_layers_impl` chains these layers: more than one, one token,
    /// outside a program, every layer taking the fused attention and feed-forward kernels,
    /// no more QKV rows than `rk_ffn_qkv_*` has warps (one a row: `hidden`), every
    /// block of each `rk_ffn_qkv_*` it would launch resident at once, and its grid size
    /// the one this backend chains (`claim_chain_grid`). `Some`: each layer's attention
    /// split (`wo_split`).
    fn chain_fits(&self, layers: &[DecoderLayer], d: &DecoderDims) -> Result<Option<Vec<usize>>> {
        let [qkv, ..] = d.projections();
        if layers.len() < 2
            || qkv.rows > d.hidden
            || d.kv.tokens != 1
            || !switch_on(&FUSED_CHAIN)
            || !switch_on(&FUSED_FFN)
            || self.in_program()
            || layers.iter().any(|l| l.gate.format != l.down.format)
        {
            return Ok(None);
        }
        let Some(splits) = layers
            .iter()
            .map(|l| self.wo_split(l.k_cache, l.v_cache, &d.kv))
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(None);
        };
        for (l, n) in layers.iter().zip(&layers[1..]) {
            let per_sm =
                self.blocks_per_sm(&ffn_qkv_name(l.gate.format, n.qkv.format), FF_THREADS)?;
            if (d.hidden / 8) as u64 > u64::from(per_sm) * u64::from(self.sms()) {
                return Ok(None);
            }
        }
        let claimed =
            u32::try_from(d.hidden / 8).is_ok_and(|n| claim_chain_grid(&self.inner.chain_grid, n));
        Ok(claimed.then_some(splits))
    }

    /// `ComputeBackend::rope_attention_kv`: one kernel for a single token, else
    /// `rope_kv` and `attention_kv`. The one kernel is `rk_rope_attention_kv_split`
    /// (`RINGKERNEL_CUDA_ATTN_SPLIT` blocks of 128 threads a query head, 8 by default, each
    /// over a slice of the keys, the last to finish merging them) where the head fits it
    /// (`head_dim` a multiple of 4 up to 128, at most 64 heads, 16-byte aligned caches),
    /// else, or with
    /// `RINGKERNEL_CUDA_ATTN_SPLIT=0`, `rk_rope_attention_kv` (one block of 512 a head).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_attention_kv_impl(
        &self,
        qkv: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        q: &dyn DeviceBuffer,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        d: KvDims,
    ) -> Result<()> {
        if d.tokens != 1 {
            self.rope_kv_impl(qkv, positions, q, k_cache, v_cache, d)?;
            return self.attention_kv_impl(q, k_cache, v_cache, positions, out, d);
        }
        // The checks of the two ops, and out apart from everything else.
        checks::rope_kv(&d)?.check(&[qkv, positions, q, k_cache, v_cache])?;
        checks::attention_kv(&d)?.check(&[q, k_cache, v_cache, positions, out])?;
        let all = [qkv, positions, q, k_cache, v_cache, out];
        let p = self.device_ptrs(&all)?;
        for i in 2..all.len() {
            checks::distinct_from_others("rope_attention_kv", &all, i)?;
        }
        kv_head_fits("rope_attention_kv", &d)?;
        if let Some(r) = self.program_op(|| {
            Some(Instr {
                op: OP_ROPE_ATT,
                a: field(d.heads)?,
                b: field(d.kv_heads)?,
                c: field(d.head_dim)?,
                d: field(d.capacity)?,
                f0: d.rope_base,
                f1: d.scale,
                p: [p[0], p[1], p[2], p[3], p[4], p[5], 0, 0],
                ..Instr::default()
            })
        }) {
            return r;
        }
        let mut leading = AttnArgs::new([p[0], p[1], p[2], p[3], p[4], p[5]], &d);
        let mut args = leading.args();
        let writes = [q, k_cache, v_cache, out]
            .iter()
            .map(|b| self.span(*b))
            .collect::<Result<Vec<_>>>()?;
        if let Some(split) = split_fits(&d, p[3] | p[4]) {
            // The position and the cached keys and values are loaded before the wait
            // where the kernel ahead writes none of them (see `early_loads`).
            let early = self.early_loads(&[
                self.span(positions)?,
                self.span(k_cache)?,
                self.span(v_cache)?,
            ]);
            return self.launch_split_attention(
                "rk_rope_attention_kv_split",
                args,
                split,
                early,
                &mut [],
                writes,
                d.heads,
            );
        }
        self.launch_writing(
            "rk_rope_attention_kv",
            (d.heads as u32, 1, 1),
            (KV_THREADS, 1, 1),
            &mut args,
            &writes,
        )
    }

    /// Launches a split decode attention kernel (`heads · split` blocks): `args` are the
    /// leading parameters every such kernel takes (as `rope_attention_kv_impl` builds
    /// them), then the scratch parts and counters, the split, `early`, and `extra`.
    #[allow(clippy::too_many_arguments)]
    fn launch_split_attention(
        &self,
        name: &str,
        mut args: Vec<*mut std::ffi::c_void>,
        split: usize,
        mut early: i32,
        extra: &mut [*mut std::ffi::c_void],
        mut writes: Vec<(u64, u64)>,
        heads: usize,
    ) -> Result<()> {
        let scratch = self.inner.attn_scratch.ptr();
        let (mut part, mut done, mut ns) =
            (scratch, scratch + ATTN_PARTS_BYTES as u64, split as u64);
        args.extend([
            arg(&mut part),
            arg(&mut done),
            arg(&mut ns),
            arg(&mut early),
        ]);
        args.extend_from_slice(extra);
        writes.push((scratch, ATTN_SCRATCH_BYTES as u64));
        self.launch_writing(
            name,
            ((heads * split) as u32, 1, 1),
            (AS_THREADS, 1, 1),
            &mut args,
            &writes,
        )
    }

    /// The split of `rk_rope_attention_wo_split_*` for these heads and caches, or `None`
    /// where it does not fit: no split attention for these heads, a head width not a
    /// multiple of 8, or more blocks than SMs (its blocks wait for each other, so all must
    /// be resident at once).
    fn wo_split(
        &self,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        d: &KvDims,
    ) -> Option<usize> {
        if d.tokens != 1 || !d.head_dim.is_multiple_of(8) || !switch_on(&FUSED_WO) {
            return None;
        }
        let p = self.device_ptrs(&[k_cache, v_cache]).ok()?;
        let split = split_fits(d, p[0] | p[1])?;
        (d.heads * split <= self.sms() as usize).then_some(split)
    }

    /// `rope_attention_kv` and then `x += att · Woᵀ` for one token in one kernel
    /// (`rk_rope_attention_wo_split_*`) with `split` blocks a head (from `wo_split`), of
    /// layer `l`'s attention, adding the same products to the scratch residual; the
    /// scratch `att` is left unwritten.
    fn rope_attention_wo(
        &self,
        positions: &dyn DeviceBuffer,
        l: &DecoderLayer,
        s: &DecoderScratch,
        x: &dyn DeviceBuffer,
        dd: DecoderDims,
        split: usize,
    ) -> Result<()> {
        let (qkv, q, k_cache, v_cache, att, wo, x2) =
            (s.qkv, s.q, l.k_cache, l.v_cache, s.att, l.wo, s.residual);
        let (d, dim) = (dd.kv, dd.dim);
        let wo_d = QMatmulDims {
            batch: 1,
            rows: dim,
            cols: d.heads * d.head_dim,
            accumulate: true,
        };
        checks::rope_kv(&d)?.check(&[qkv, positions, q, k_cache, v_cache])?;
        checks::attention_kv(&d)?.check(&[q, k_cache, v_cache, positions, att])?;
        checks::qmatmul(wo.format, wo_d)?.check(&[wo.buffer, att, x])?;
        ringkernel_core::compute::check_len(x2, dim, "decoder_layer residual")?;
        let all = [qkv, positions, q, k_cache, v_cache, wo.buffer, x, x2];
        let p = self.device_ptrs(&all)?;
        for i in [2, 3, 4, 6, 7] {
            checks::distinct_from_others("decoder_layer", &all, i)?;
        }
        let mut leading = AttnArgs::new([p[0], p[1], p[2], p[3], p[4], self.buf(att)?.ptr], &d);
        let args = leading.args();
        let (mut pw, mut pxx, mut px2, mut dm) = (p[5], p[6], p[7], dim as u64);
        let mut ticket = self.inner.attn_scratch.ptr() + ATTN_TICKETS_AT as u64;
        // The Wo rows are loaded early too.
        let early = self.early_loads(&[
            self.span(positions)?,
            self.span(k_cache)?,
            self.span(v_cache)?,
            self.span(wo.buffer)?,
        ]);
        let writes = [q, k_cache, v_cache, x, x2]
            .iter()
            .map(|b| self.span(*b))
            .collect::<Result<Vec<_>>>()?;
        self.launch_split_attention(
            &format!("rk_rope_attention_wo_split_{}", wo.format.name()),
            args,
            split,
            early,
            &mut [
                arg(&mut pw),
                arg(&mut pxx),
                arg(&mut px2),
                arg(&mut dm),
                arg(&mut ticket),
            ],
            writes,
            d.heads,
        )
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
        let all = [qkv, positions, q, k_cache, v_cache];
        checks::rope_kv(&d)?.check(&all)?;
        let p = self.device_ptrs(&all)?;
        for i in 2..all.len() {
            checks::distinct_from_others("rope_kv", &all, i)?;
        }
        let threads =
            d.tokens * ((d.heads + d.kv_heads) * d.head_dim / 2 + d.kv_heads * d.head_dim);
        if threads == 0 {
            return Ok(());
        }
        let (mut px, mut pp, mut pq, mut pk, mut pv) = (p[0], p[1], p[2], p[3], p[4]);
        let (mut t, mut h, mut kh, mut hd, mut cap, mut base) = (
            d.tokens as u64,
            d.heads as u64,
            d.kv_heads as u64,
            d.head_dim as u64,
            d.capacity as u64,
            d.rope_base,
        );
        self.launch(
            "rk_rope_kv",
            (grid_1d(threads, 256, self.sms()), 1, 1),
            (256, 1, 1),
            0,
            &mut [
                arg(&mut px),
                arg(&mut pp),
                arg(&mut pq),
                arg(&mut pk),
                arg(&mut pv),
                arg(&mut t),
                arg(&mut h),
                arg(&mut kh),
                arg(&mut hd),
                arg(&mut cap),
                arg(&mut base),
            ],
        )
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
        let all = [q, k_cache, v_cache, positions, out];
        checks::attention_kv(&d)?.check(&all)?;
        let p = self.device_ptrs(&all)?;
        checks::distinct("attention_kv", out, &all[..4])?;
        kv_head_fits("attention_kv", &d)?;
        let rows = d.tokens * d.heads;
        if rows == 0 {
            return Ok(());
        }
        if rows > i32::MAX as usize {
            return Err(Error::invalid("attention_kv: too many (token, head) rows"));
        }
        let (mut pq, mut pk, mut pv, mut pp, mut po) = (p[0], p[1], p[2], p[3], p[4]);
        let (mut h, mut kh, mut hd, mut cap, mut sc) = (
            d.heads as u64,
            d.kv_heads as u64,
            d.head_dim as u64,
            d.capacity as u64,
            d.scale,
        );
        self.launch(
            "rk_attention_kv",
            (rows as u32, 1, 1),
            (KV_THREADS, 1, 1),
            0,
            &mut [
                arg(&mut pq),
                arg(&mut pk),
                arg(&mut pv),
                arg(&mut pp),
                arg(&mut po),
                arg(&mut h),
                arg(&mut kh),
                arg(&mut hd),
                arg(&mut cap),
                arg(&mut sc),
            ],
        )
    }

    /// Free device memory (`cuMemGetInfo`).
    pub(super) fn memory_available_impl(&self) -> Option<u64> {
        self.inner.dev.bind().ok()?;
        cudarc::driver::result::mem_get_info()
            .ok()
            .map(|(free, _)| free as u64)
    }
}

/// The op methods for `impl ComputeBackend for CudaCompute`.
macro_rules! model_ops {
    () => {
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
        fn greedy_feed(&self, feed: &ringkernel_core::compute::GreedyFeed) -> Result<()> {
            self.greedy_feed_impl(feed)
        }
        fn qmatmul(
            &self,
            w: &dyn DeviceBuffer,
            format: WeightFormat,
            x: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: QMatmulDims,
        ) -> Result<()> {
            self.qmatmul_impl(&[w], format, x, out, dims, None)
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
            self.qmatmul_impl(&[w_gate, w_up], format, x, out, dims, None)
        }
        fn rms_norm_qmatmul(
            &self,
            x: &dyn DeviceBuffer,
            norm: &dyn DeviceBuffer,
            eps: f32,
            normed: &dyn DeviceBuffer,
            w: &[&dyn DeviceBuffer],
            format: WeightFormat,
            out: &dyn DeviceBuffer,
            dims: QMatmulDims,
        ) -> Result<()> {
            self.rms_norm_qmatmul_impl(x, norm, eps, normed, w, format, out, dims)
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
        fn rope_attention_kv(
            &self,
            qkv: &dyn DeviceBuffer,
            positions: &dyn DeviceBuffer,
            q: &dyn DeviceBuffer,
            k_cache: &dyn DeviceBuffer,
            v_cache: &dyn DeviceBuffer,
            out: &dyn DeviceBuffer,
            dims: KvDims,
        ) -> Result<()> {
            self.rope_attention_kv_impl(qkv, positions, q, k_cache, v_cache, out, dims)
        }
        fn decoder_layer(
            &self,
            x: &dyn DeviceBuffer,
            positions: &dyn DeviceBuffer,
            layer: &ringkernel_core::compute::DecoderLayer,
            scratch: &ringkernel_core::compute::DecoderScratch,
            dims: ringkernel_core::compute::DecoderDims,
        ) -> Result<()> {
            self.decoder_layer_impl(x, positions, layer, scratch, dims)
        }
        fn decoder_layers(
            &self,
            x: &dyn DeviceBuffer,
            positions: &dyn DeviceBuffer,
            layers: &[ringkernel_core::compute::DecoderLayer],
            scratch: &ringkernel_core::compute::DecoderScratch,
            dims: ringkernel_core::compute::DecoderDims,
        ) -> Result<()> {
            self.decoder_layers_impl(x, positions, layers, scratch, dims)
        }
        fn record(
            &self,
            ops: &mut dyn FnMut() -> Result<()>,
        ) -> Result<Option<Box<dyn ringkernel_core::compute::Replay>>> {
            self.record_impl(ops)
        }
        fn memory_available(&self) -> Option<u64> {
            self.memory_available_impl()
        }
    };
}
pub(super) use model_ops;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_chains_the_first_grid_size_only() {
        let slot = std::sync::atomic::AtomicU32::new(0);
        assert!(!claim_chain_grid(&slot, 0));
        assert!(claim_chain_grid(&slot, 192));
        assert!(claim_chain_grid(&slot, 192));
        assert!(!claim_chain_grid(&slot, 100));
        assert!(claim_chain_grid(&slot, 192));
    }

    #[test]
    fn the_attention_split_switch_reads_numbers_caps_them_and_keeps_the_default_otherwise() {
        assert_eq!(parse_attn_split(None), ATTN_SPLIT_DEFAULT);
        assert_eq!(parse_attn_split(Some("0")), 0);
        assert_eq!(parse_attn_split(Some(" 4 ")), 4);
        assert_eq!(parse_attn_split(Some("1000")), ATTN_SPLIT_MAX);
        assert_eq!(parse_attn_split(Some("eight")), ATTN_SPLIT_DEFAULT);
    }
}
