//! Plans of the model ops: dtype conversion, broadcasting, the block-format weight ops
//! and attention over a KV cache (kernels `dtype.wgsl`, `broadcast.wgsl`, `quant.wgsl`,
//! `decode.wgsl`).

use super::{bytes, read, thread_grid, u32_of, write, Dispatch, Plan};
use crate::sizing::groups_for;
use ringkernel_core::compute::checks;
use ringkernel_core::compute::{
    BinaryOp, BroadcastDims, DType, EmbeddingDims, KvDims, QMatmulDims, WeightFormat,
};
use ringkernel_core::error::{Error, Result};
use ringkernel_shaders::{grid_for, params, Kernel, Specialization};
use ringkernel_shaders::{MAX_WORKGROUPS_PER_DIM, WORKGROUP_SIZE};

/// `convert(x, from, out, to, len)`: a thread per output word.
pub fn convert(from: DType, to: DType, len: usize) -> Result<Plan> {
    let needs = checks::convert(from, to, len)?;
    u32_of(needs.elems(0).max(needs.elems(1)).max(len), "convert size")?;
    let words = needs.elems(1);
    if words == 0 {
        return Ok(Plan::empty(needs));
    }
    let p = params::Convert {
        len: len as u32,
        words: words as u32,
        src_type: from.code(),
        dst_type: to.code(),
    };
    let dsp = Dispatch {
        kernel: Kernel::Convert,
        spec: Specialization::none(),
        params: bytes(&p),
        binds: vec![read(1, "a", 0), write(3, "out", 1)],
        groups: thread_grid(words),
    };
    Ok(Plan::one(needs, dsp))
}

/// `broadcast_binary(op, a, b, out, dims)`: a thread per output element.
pub fn broadcast_binary(op: BinaryOp, d: &BroadcastDims) -> Result<Plan> {
    let needs = checks::broadcast_binary(d)?;
    let len = needs.elems(2);
    u32_of(
        len.max(needs.elems(0)).max(needs.elems(1)),
        "broadcast size",
    )?;
    if len == 0 {
        return Ok(Plan::empty(needs));
    }
    // Every stride and extent is at most one of the lengths checked above.
    let arr = |v: &[usize; ringkernel_core::compute::MAX_BROADCAST_RANK]| v.map(|x| x as u32);
    let p = params::Broadcast {
        rank: d.rank as u32,
        len: len as u32,
        _pad: [0; 2],
        shape: arr(&d.shape),
        a_strides: arr(&d.a_strides),
        b_strides: arr(&d.b_strides),
    };
    let dsp = Dispatch {
        kernel: Kernel::BroadcastBinary,
        spec: Specialization::op(op.code()),
        params: bytes(&p),
        binds: vec![read(1, "a", 0), read(2, "b", 1), write(3, "out", 2)],
        groups: thread_grid(len),
    };
    Ok(Plan::one(needs, dsp))
}

/// The specialisation of [`Kernel::Qmatmul`] / [`Kernel::Embedding`].
fn quant_spec(format: WeightFormat, gated: Option<bool>) -> Specialization {
    let mut s = Specialization::none();
    s.0.insert("FORMAT", format.code());
    if let Some(g) = gated {
        s.0.insert("GATED", g as u32);
    }
    s
}

/// Rows of `W` per [`Kernel::Qmatmul`] workgroup, and tokens per workgroup.
pub const QMATMUL_ROWS: usize = 8;
/// Tokens per [`Kernel::Qmatmul`] workgroup (grid z).
pub const QMATMUL_TOKENS: usize = 4;

/// `qmatmul(w, format, x, out, dims)` (`gated = false`) or
/// `qmatmul_swiglu(w_gate, w_up, format, x, out, dims)` (`gated = true`): 8 rows of W per
/// workgroup (spread over x and y), 4 tokens per workgroup in z.
pub fn qmatmul(format: WeightFormat, d: QMatmulDims, gated: bool) -> Result<Plan> {
    let needs = if gated {
        checks::qmatmul_swiglu(format, d)?
    } else {
        checks::qmatmul(format, d)?
    };
    let big = needs.args.iter().map(|n| n.elems).max().unwrap_or(0);
    u32_of(big, "qmatmul size")?;
    if d.batch == 0 || d.rows == 0 {
        return Ok(Plan::empty(needs));
    }
    let tiles = d.batch.div_ceil(QMATMUL_TOKENS);
    if tiles > MAX_WORKGROUPS_PER_DIM as usize {
        return Err(Error::invalid(format!(
            "qmatmul: {} input rows need {tiles} token tiles, over 65535",
            d.batch
        )));
    }
    let p = params::Quant {
        batch: d.batch as u32,
        rows: d.rows as u32,
        cols: d.cols as u32,
        accumulate: d.accumulate as u32,
    };
    let (x, out) = if gated { (2, 3) } else { (1, 2) };
    let mut groups = grid_for(groups_for(d.rows, QMATMUL_ROWS) as u64);
    groups[2] = tiles as u32;
    let dsp = Dispatch {
        kernel: Kernel::Qmatmul,
        spec: quant_spec(format, Some(gated)),
        params: bytes(&p),
        binds: vec![
            read(1, "w", 0),
            read(2, "w2", if gated { 1 } else { 0 }),
            read(3, "x", x),
            write(4, "out", out),
        ],
        groups,
    };
    Ok(Plan::one(needs, dsp))
}

/// `embedding(table, format, ids, out, dims)`: a thread per output element.
pub fn embedding(format: WeightFormat, d: EmbeddingDims) -> Result<Plan> {
    let needs = checks::embedding(format, d)?;
    let out = needs.elems(2);
    u32_of(needs.elems(0).max(out), "embedding size")?;
    if out == 0 {
        return Ok(Plan::empty(needs));
    }
    let p = params::Quant {
        batch: d.count as u32,
        rows: u32_of(d.rows, "embedding rows")?,
        cols: d.cols as u32,
        accumulate: 0,
    };
    let dsp = Dispatch {
        kernel: Kernel::Embedding,
        spec: quant_spec(format, None),
        params: bytes(&p),
        binds: vec![read(1, "w", 0), read(5, "ids", 1), write(4, "out", 2)],
        groups: thread_grid(out),
    };
    Ok(Plan::one(needs, dsp))
}

/// Largest `head_dim` of [`Kernel::AttentionKv`] (a thread per output dimension).
pub const KV_MAX_HEAD_DIM: usize = WORKGROUP_SIZE as usize;

fn kv_params(d: &KvDims) -> Result<Vec<u8>> {
    Ok(bytes(&params::Kv {
        tokens: d.tokens as u32,
        heads: d.heads as u32,
        kv_heads: d.kv_heads as u32,
        head_dim: d.head_dim as u32,
        capacity: u32_of(d.capacity, "kv cache capacity")?,
        rope_base: d.rope_base,
        scale: d.scale,
        _pad: 0,
    }))
}

/// `rope_kv(qkv, positions, q, k_cache, v_cache, dims)`: a thread per rotated pair or
/// copied value.
pub fn rope_kv(d: KvDims) -> Result<Plan> {
    let needs = checks::rope_kv(&d)?;
    let s = checks::kv_sizes(&d)?;
    u32_of(s.qkv.max(s.cache), "rope_kv size")?;
    let threads = d.tokens * ((d.heads + d.kv_heads) * d.head_dim / 2 + d.kv_heads * d.head_dim);
    if threads == 0 {
        return Ok(Plan::empty(needs));
    }
    let dsp = Dispatch {
        kernel: Kernel::RopeKv,
        spec: Specialization::none(),
        params: kv_params(&d)?,
        binds: vec![
            read(1, "x", 0),
            read(2, "pos", 1),
            write(3, "out", 2),
            write(4, "kc", 3),
            write(5, "vc", 4),
        ],
        groups: thread_grid(threads),
    };
    Ok(Plan::one(needs, dsp))
}

/// `attention_kv(q, k_cache, v_cache, positions, out, dims)`: a workgroup per (token,
/// query head); `head_dim` over [`KV_MAX_HEAD_DIM`] is [`Error::InvalidArgument`].
pub fn attention_kv(d: KvDims) -> Result<Plan> {
    let needs = checks::attention_kv(&d)?;
    let s = checks::kv_sizes(&d)?;
    u32_of(s.q.max(s.cache), "attention_kv size")?;
    if d.head_dim > KV_MAX_HEAD_DIM {
        return Err(Error::invalid(format!(
            "attention_kv: head_dim {} over the kernel's {KV_MAX_HEAD_DIM}",
            d.head_dim
        )));
    }
    if s.q == 0 {
        return Ok(Plan::empty(needs));
    }
    let dsp = Dispatch {
        kernel: Kernel::AttentionKv,
        spec: Specialization::none(),
        params: kv_params(&d)?,
        binds: vec![
            read(1, "x", 0),
            read(6, "kr", 1),
            read(7, "vr", 2),
            read(2, "pos", 3),
            write(3, "out", 4),
        ],
        groups: grid_for((d.tokens * d.heads) as u64),
    };
    Ok(Plan::one(needs, dsp))
}
