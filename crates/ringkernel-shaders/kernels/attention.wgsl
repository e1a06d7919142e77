// RoPE and attention. See ringkernel_core::compute::{RopeDims, AttentionDims}.
// q: [bh, q_len, d]; k, v: [bh, kv_stride, d] (first kv_len rows used);
// scores / probabilities: [bh, q_len, kv_len]; out: [bh, q_len, d].

struct RopeParams {
    seq: u32,
    heads: u32,
    head_dim: u32,
    base: f32,
}

struct AttentionParams {
    batch_heads: u32,
    q_len: u32,
    kv_len: u32,
    kv_stride: u32,
    head_dim: u32,
    scale: f32,
    causal: u32,
    q_offset: u32,
}

@group(0) @binding(0) var<uniform> rp: RopeParams;
@group(0) @binding(0) var<uniform> ap: AttentionParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const MAX_D: u32 = 512u;
const NEG_BIG: f32 = -3.0e38;

var<workgroup> q_row: array<f32, 512>;
var<workgroup> acc: array<f32, 512>;
var<workgroup> probs: array<f32, 256>;
var<workgroup> red: array<f32, 256>;

fn linear(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

// RoPE: x is `q` (binding 1), positions are `k` (binding 2). A thread per rotated pair.
@compute @workgroup_size(256)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = rp.head_dim / 2u;
    let idx = linear(gid, nwg);
    if (idx >= rp.seq * rp.heads * half) {
        return;
    }
    let i = idx % half;
    let row = idx / half; // s * heads + h
    let s = row / rp.heads;
    let base = row * rp.head_dim;
    let inv_freq = exp2(-2.0 * f32(i) / f32(rp.head_dim) * log2(rp.base));
    let theta = k[s] * inv_freq;
    let c = cos(theta);
    let sn = sin(theta);
    let x0 = q[base + i];
    let x1 = q[base + i + half];
    out[base + i] = x0 * c - x1 * sn;
    out[base + i + half] = x0 * sn + x1 * c;
}

// scores[h, i, j] = scale · q[h, i] · k[h, j]; causal: -inf where j > q_offset + i.
@compute @workgroup_size(256)
fn attention_scores(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = linear(gid, nwg);
    if (idx >= ap.batch_heads * ap.q_len * ap.kv_len) {
        return;
    }
    let j = idx % ap.kv_len;
    let hi = idx / ap.kv_len; // h * q_len + i
    let i = hi % ap.q_len;
    let h = hi / ap.q_len;
    if (ap.causal != 0u && j > ap.q_offset + i) {
        out[idx] = bitcast<f32>(0xff800000u);
        return;
    }
    let qb = hi * ap.head_dim;
    let kb = (h * ap.kv_stride + j) * ap.head_dim;
    var s = 0.0;
    for (var d = 0u; d < ap.head_dim; d++) {
        s = fma(q[qb + d], k[kb + d], s);
    }
    out[idx] = s * ap.scale;
}

// out[h, i, d] = Σ_j p[h, i, j] · v[h, j, d]; p is `q` (binding 1).
@compute @workgroup_size(256)
fn attention_weighted_sum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = linear(gid, nwg);
    if (idx >= ap.batch_heads * ap.q_len * ap.head_dim) {
        return;
    }
    let d = idx % ap.head_dim;
    let hi = idx / ap.head_dim;
    let h = hi / ap.q_len;
    let pb = hi * ap.kv_len;
    let vb = h * ap.kv_stride * ap.head_dim + d;
    var s = 0.0;
    for (var j = 0u; j < ap.kv_len; j++) {
        s = fma(q[pb + j], v[vb + j * ap.head_dim], s);
    }
    out[idx] = s;
}

fn wg_max(lid: u32, x: f32) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn wg_sum(lid: u32, x: f32) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Fused softmax(scale·Q·Kᵀ [+ causal mask])·V, one workgroup per (head, query row),
// keys in tiles of 256 with an online (running max) softmax. head_dim <= 512.
@compute @workgroup_size(256)
fn attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let hi = wg.x + wg.y * nwg.x; // h * q_len + i
    if (hi >= ap.batch_heads * ap.q_len) {
        return;
    }
    let i = hi % ap.q_len;
    let h = hi / ap.q_len;
    let dim = ap.head_dim;
    for (var d = lid; d < dim; d += 256u) {
        q_row[d] = q[hi * dim + d];
        acc[d] = 0.0;
    }
    workgroupBarrier();
    var kv_end = ap.kv_len;
    if (ap.causal != 0u) {
        kv_end = min(kv_end, ap.q_offset + i + 1u);
    }
    let kv_base = h * ap.kv_stride * dim;
    var m = NEG_BIG;
    var l = 0.0;
    for (var t0 = 0u; t0 < kv_end; t0 += 256u) {
        let j = t0 + lid;
        var s = NEG_BIG;
        if (j < kv_end) {
            var dot = 0.0;
            let kb = kv_base + j * dim;
            for (var d = 0u; d < dim; d++) {
                dot = fma(q_row[d], k[kb + d], dot);
            }
            s = dot * ap.scale;
        }
        let m_new = max(m, wg_max(lid, s));
        var pj = 0.0;
        if (j < kv_end) {
            pj = exp(s - m_new);
        }
        probs[lid] = pj;
        let corr = exp(m - m_new);
        l = l * corr + wg_sum(lid, pj);
        let n = min(256u, kv_end - t0);
        for (var d = lid; d < dim; d += 256u) {
            var a = acc[d] * corr;
            for (var jj = 0u; jj < n; jj++) {
                a = fma(probs[jj], v[kv_base + (t0 + jj) * dim + d], a);
            }
            acc[d] = a;
        }
        workgroupBarrier();
        m = m_new;
    }
    let inv = 1.0 / l;
    for (var d = lid; d < dim; d += 256u) {
        out[hi * dim + d] = acc[d] * inv;
    }
}
