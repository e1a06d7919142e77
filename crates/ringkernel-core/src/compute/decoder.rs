//! One pre-norm decoder layer of a llama-style language model as a single backend op
//! ([`ComputeBackend::decoder_layer`]).
//!
//! The layer is five ops that every backend has ([`run_ops`], the trait's default):
//!
//! ```text
//! qkv = rms_norm(x, attn_norm) · W_qkvᵀ
//! att = attention over the KV cache of rope(qkv)          (writes the new key and value)
//! x  += att · W_oᵀ
//! h   = silu(rms_norm(x, ffn_norm) · W_gateᵀ) · (rms_norm(x, ffn_norm) · W_upᵀ)
//! x  += h · W_downᵀ
//! ```
//!
//! A backend may run them with fewer kernels (CUDA, for a decode step: the attention with
//! the output projection, and the feed-forward block with its down projection, each one
//! kernel); the result is the same up to the order of float additions.

use super::{
    check_len, checks, BufferRef, ComputeBackend, DeviceBuffer, EmbeddingDims, KvDims, QMatmulDims,
    WeightFormat,
};
use crate::Result;

/// A weight matrix stored in blocks of a [`WeightFormat`].
#[derive(Clone, Copy)]
pub struct BlockWeights<'a> {
    /// The stored blocks.
    pub buffer: &'a dyn DeviceBuffer,
    /// How they are stored.
    pub format: WeightFormat,
}

/// The tensors of one decoder layer (shapes by [`DecoderDims`]: `dim`, `hidden`, and the
/// heads of `kv`).
#[derive(Clone, Copy)]
pub struct DecoderLayer<'a> {
    /// RMSNorm weights before the attention, `[dim]`.
    pub attn_norm: &'a dyn DeviceBuffer,
    /// The query, key and value projections as one matrix,
    /// `[(heads + 2·kv_heads)·head_dim, dim]`.
    pub qkv: BlockWeights<'a>,
    /// The attention's output projection, `[dim, heads·head_dim]`.
    pub wo: BlockWeights<'a>,
    /// RMSNorm weights before the feed-forward block, `[dim]`.
    pub ffn_norm: &'a dyn DeviceBuffer,
    /// The feed-forward gate, `[hidden, dim]`.
    pub gate: BlockWeights<'a>,
    /// The feed-forward up projection, `[hidden, dim]`, stored like `gate`.
    pub up: &'a dyn DeviceBuffer,
    /// The feed-forward down projection, `[dim, hidden]`.
    pub down: BlockWeights<'a>,
    /// This layer's key cache, `[kv_heads, capacity, head_dim]`.
    pub k_cache: &'a dyn DeviceBuffer,
    /// This layer's value cache, `[kv_heads, capacity, head_dim]`.
    pub v_cache: &'a dyn DeviceBuffer,
}

/// Scratch buffers of [`ComputeBackend::decoder_layer`], each at least as long as given
/// (for `t = kv.tokens`). What they hold afterwards is unspecified: a backend that fuses
/// steps may leave some unwritten.
#[derive(Clone, Copy)]
pub struct DecoderScratch<'a> {
    /// Normalised input, `t · dim`.
    pub normed: &'a dyn DeviceBuffer,
    /// The QKV projection, `t · (heads + 2·kv_heads)·head_dim`.
    pub qkv: &'a dyn DeviceBuffer,
    /// Rotated queries, `t · heads·head_dim`.
    pub q: &'a dyn DeviceBuffer,
    /// The attention's output, `t · heads·head_dim`.
    pub att: &'a dyn DeviceBuffer,
    /// The feed-forward block's hidden activations, `t · hidden`.
    pub hidden: &'a dyn DeviceBuffer,
    /// A second copy of the residual stream, `t · dim` (CUDA reads the feed-forward
    /// block's input from it while the block adds its output to `x`).
    pub residual: &'a dyn DeviceBuffer,
}

/// The six buffers of a [`DecoderScratch`], owned: allocate them once for the most
/// tokens a call will run and lend them to every call with [`Self::view`].
pub struct DecoderScratchBuffers([BufferRef; 6]);

impl DecoderScratchBuffers {
    /// Allocates the scratch for up to `tokens` tokens of layers shaped like `d` (its
    /// `kv.tokens` is not used), filled with NaN: a fused op that reads what it did not
    /// write shows in its output.
    pub fn new(b: &dyn ComputeBackend, tokens: usize, d: &DecoderDims) -> Result<Self> {
        let kv = &d.kv;
        let att = checks::product(&[kv.heads, kv.head_dim], "decoder scratch")?;
        let qkv = checks::product(
            &[kv.heads + 2 * kv.kv_heads, kv.head_dim],
            "decoder scratch",
        )?;
        let nan = |n: usize| -> Result<BufferRef> {
            b.upload(&vec![
                f32::NAN;
                checks::product(&[tokens, n], "decoder scratch")?
            ])
        };
        Ok(Self([
            nan(d.dim)?,
            nan(qkv)?,
            nan(att)?,
            nan(att)?,
            nan(d.hidden)?,
            nan(d.dim)?,
        ]))
    }

    /// The buffers as the ops take them.
    pub fn view(&self) -> DecoderScratch<'_> {
        let [normed, qkv, q, att, hidden, residual] = &self.0;
        DecoderScratch {
            normed: &**normed,
            qkv: &**qkv,
            q: &**q,
            att: &**att,
            hidden: &**hidden,
            residual: &**residual,
        }
    }
}

/// Sizes of [`ComputeBackend::decoder_layer`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderDims {
    /// Tokens, heads, cache and RoPE ([`KvDims`]).
    pub kv: KvDims,
    /// Width of the residual stream (a multiple of 32).
    pub dim: usize,
    /// Width of the feed-forward block (a multiple of 32).
    pub hidden: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
}

impl DecoderDims {
    /// The projections' sizes: QKV, output, gate/up, down.
    pub fn projections(&self) -> [QMatmulDims; 4] {
        let (t, kv) = (self.kv.tokens, &self.kv);
        let mm = |rows, cols, accumulate| QMatmulDims {
            batch: t,
            rows,
            cols,
            accumulate,
        };
        [
            mm((kv.heads + 2 * kv.kv_heads) * kv.head_dim, self.dim, false),
            mm(self.dim, kv.heads * kv.head_dim, true),
            mm(self.hidden, self.dim, false),
            mm(self.dim, self.hidden, true),
        ]
    }
}

/// [`ComputeBackend::decoder_layer`] as its five ops, one after another (the trait's
/// default, and what a backend that fuses falls back to where it cannot).
pub fn run_ops<B: ComputeBackend + ?Sized>(
    b: &B,
    x: &dyn DeviceBuffer,
    positions: &dyn DeviceBuffer,
    l: &DecoderLayer,
    s: &DecoderScratch,
    d: DecoderDims,
) -> Result<()> {
    let [qkv, wo, gate_up, down] = d.projections();
    b.rms_norm_qmatmul(
        x,
        l.attn_norm,
        d.eps,
        s.normed,
        &[l.qkv.buffer],
        l.qkv.format,
        s.qkv,
        qkv,
    )?;
    b.rope_attention_kv(s.qkv, positions, s.q, l.k_cache, l.v_cache, s.att, d.kv)?;
    b.qmatmul(l.wo.buffer, l.wo.format, s.att, x, wo)?;
    b.rms_norm_qmatmul(
        x,
        l.ffn_norm,
        d.eps,
        s.normed,
        &[l.gate.buffer, l.up],
        l.gate.format,
        s.hidden,
        gate_up,
    )?;
    b.qmatmul(l.down.buffer, l.down.format, s.hidden, x, down)
}

/// The checks of [`ComputeBackend::decoder_layer`] that its ops do not make themselves:
/// `dim` and `hidden` positive multiples of 32, and the residual copy long enough and
/// apart from `x` (the ops check every other buffer).
pub fn check(x: &dyn DeviceBuffer, s: &DecoderScratch, d: &DecoderDims) -> Result<()> {
    for (v, what) in [(d.dim, "dim"), (d.hidden, "hidden")] {
        if v == 0 || !v.is_multiple_of(32) {
            return Err(crate::Error::invalid(format!(
                "decoder_layer: {what} {v} is not a positive multiple of 32"
            )));
        }
    }
    let need = checks::product(&[d.kv.tokens, d.dim], "decoder_layer residual")?;
    check_len(s.residual, need, "decoder_layer residual")?;
    checks::distinct("decoder_layer", s.residual, &[x])
}

/// The end of a greedy decode step that feeds the next step
/// ([`ComputeBackend::greedy_feed`]): the token with the largest logit, its embedding as
/// the next step's input, and the position advanced. With it a recorded step (a CUDA
/// graph) can run again and again without the host, and several steps can be recorded
/// into one replay, each writing its token to its own word.
#[derive(Clone, Copy)]
pub struct GreedyFeed<'a> {
    /// The step's logits, `[rows]`.
    pub logits: &'a dyn DeviceBuffer,
    /// The embedding table, `rows × cols` in its format.
    pub table: BlockWeights<'a>,
    /// Rows of the table: the vocabulary, and the logits' length.
    pub rows: usize,
    /// Columns of the table: the model's width (a multiple of 32).
    pub cols: usize,
    /// Word 0 receives the token, as [`ComputeBackend::argmax`] writes it.
    pub token: &'a dyn DeviceBuffer,
    /// The next step's input, `[cols]`: the token's row of the table.
    pub x: &'a dyn DeviceBuffer,
    /// Word 0 (a `u32` bit pattern) is advanced by one.
    pub position: &'a dyn DeviceBuffer,
}

impl GreedyFeed<'_> {
    /// Every check of the op, made before anything runs: the sizes, each buffer long
    /// enough, and the three outputs apart from each other and from the inputs.
    pub fn check(&self) -> Result<()> {
        let needs = checks::greedy_feed(self.table.format, self.rows, self.cols)?;
        let bufs = self.buffers();
        needs.check(&bufs)?;
        for i in 2..bufs.len() {
            checks::distinct_from_others("greedy_feed", &bufs, i)?;
        }
        Ok(())
    }

    /// The buffers in [`checks::greedy_feed`]'s order: logits, table, token, x, position.
    pub fn buffers(&self) -> [&dyn DeviceBuffer; 5] {
        [
            self.logits,
            self.table.buffer,
            self.token,
            self.x,
            self.position,
        ]
    }

    /// [`ComputeBackend::greedy_feed`] as three ops: `argmax`, `embedding` and
    /// `increment` (the trait's default).
    pub fn run_ops<B: ComputeBackend + ?Sized>(&self, b: &B) -> Result<()> {
        self.check()?;
        b.argmax(self.logits, self.rows, self.token)?;
        b.embedding(
            self.table.buffer,
            self.table.format,
            self.token,
            self.x,
            EmbeddingDims {
                rows: self.rows,
                cols: self.cols,
                count: 1,
            },
        )?;
        b.increment(self.position, 0, 1, 1)
    }
}
