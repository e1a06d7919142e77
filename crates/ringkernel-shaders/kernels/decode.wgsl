// A decoder's attention over a KV cache on the device (KvDims of ringkernel-core):
//
// rope_kv: qkv [tokens, (heads + 2·kv_heads)·head_dim] → rotated queries [tokens, heads,
//   head_dim], rotated keys and the values into row positions[t] of each head of the
//   caches [kv_heads, capacity, head_dim] (nothing for a position past the cache).
//   Half-split RoPE; a thread per rotated pair or copied value.
// attention_kv: a workgroup per (token, query head): causal grouped-query attention over
//   the cache rows 0..=positions[t], 256 keys at a time with an online softmax; a thread
//   per output dimension (head_dim ≤ 256).

struct KvParams {
    tokens: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    rope_base: f32,
    scale: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: KvParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> kc: array<f32>;
@group(0) @binding(5) var<storage, read_write> vc: array<f32>;
@group(0) @binding(6) var<storage, read> kr: array<f32>;
@group(0) @binding(7) var<storage, read> vr: array<f32>;

// cos and sin of θ ≥ 0, reduced to [-π, π] first (2π split in two parts so that k·C1 is
// exact): GPU sin/cos are only accurate near zero.
fn cos_sin(theta: f32) -> vec2<f32> {
    let k = floor(theta * 0.15915494309189535 + 0.5);
    let r = (theta - k * 6.28125) - k * 0.0019353071795864769;
    return vec2<f32>(cos(r), sin(r));
}

@compute @workgroup_size(256)
fn rope_kv(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    let hd = p.head_dim;
    let half = hd / 2u;
    let rot = (p.heads + p.kv_heads) * half;
    let per_token = rot + p.kv_heads * hd;
    if (idx >= p.tokens * per_token) {
        return;
    }
    let t = idx / per_token;
    let r = idx % per_token;
    let at = pos[t];
    let row = t * (p.heads + 2u * p.kv_heads) * hd;
    if (r < rot) {
        let h = r / half;
        let i = r % half;
        let inv_freq = exp2(-2.0 * f32(i) / f32(hd) * log2(p.rope_base));
        let cs = cos_sin(f32(at) * inv_freq);
        let src = row + h * hd;
        let x0 = x[src + i];
        let x1 = x[src + i + half];
        let y0 = x0 * cs.x - x1 * cs.y;
        let y1 = x0 * cs.y + x1 * cs.x;
        if (h < p.heads) {
            let o = (t * p.heads + h) * hd;
            out[o + i] = y0;
            out[o + i + half] = y1;
        } else if (at < p.capacity) {
            let o = ((h - p.heads) * p.capacity + at) * hd;
            kc[o + i] = y0;
            kc[o + i + half] = y1;
        }
    } else if (at < p.capacity) {
        let r2 = r - rot;
        let kh = r2 / hd;
        let i = r2 % hd;
        vc[(kh * p.capacity + at) * hd + i] = x[row + (p.heads + p.kv_heads + kh) * hd + i];
    }
}

var<workgroup> red: array<f32, 256>;
var<workgroup> probs: array<f32, 256>;
var<workgroup> qs: array<f32, 256>;
var<workgroup> last_row: u32;

const NEG_BIG: f32 = -3.0e38;

@compute @workgroup_size(256)
fn attention_kv(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let rowi = wg.x + wg.y * nwg.x;
    if (rowi >= p.tokens * p.heads) {
        return;
    }
    let tid = lid.x;
    let t = rowi / p.heads;
    let h = rowi % p.heads;
    let hd = p.head_dim;
    let kvh = h / (p.heads / p.kv_heads);
    let qbase = rowi * hd;
    let kbase = kvh * p.capacity * hd;
    if (tid == 0u) {
        last_row = min(pos[t], p.capacity - 1u);
    }
    if (tid < hd) {
        qs[tid] = x[qbase + tid];
    }
    let last = workgroupUniformLoad(&last_row);
    var m = NEG_BIG;
    var l = 0.0;
    var acc = 0.0;
    let chunks = last / 256u + 1u;
    for (var c = 0u; c < chunks; c = c + 1u) {
        let j = c * 256u + tid;
        let valid = j <= last;
        var s = NEG_BIG;
        if (valid) {
            var d = 0.0;
            let kb = kbase + j * hd;
            for (var e = 0u; e < hd; e = e + 1u) {
                d = d + qs[e] * kr[kb + e];
            }
            s = d * p.scale;
        }
        red[tid] = s;
        workgroupBarrier();
        for (var st = 128u; st > 0u; st = st >> 1u) {
            if (tid < st) {
                red[tid] = max(red[tid], red[tid + st]);
            }
            workgroupBarrier();
        }
        let mn = max(m, red[0]);
        workgroupBarrier();
        let pj = select(0.0, exp(s - mn), valid);
        probs[tid] = pj;
        red[tid] = pj;
        workgroupBarrier();
        for (var st = 128u; st > 0u; st = st >> 1u) {
            if (tid < st) {
                red[tid] = red[tid] + red[tid + st];
            }
            workgroupBarrier();
        }
        let corr = exp(m - mn);
        l = l * corr + red[0];
        if (tid < hd) {
            var a = acc * corr;
            let n = min(256u, last + 1u - c * 256u);
            for (var jj = 0u; jj < n; jj = jj + 1u) {
                a = a + probs[jj] * vr[kbase + (c * 256u + jj) * hd + tid];
            }
            acc = a;
        }
        m = mn;
        workgroupBarrier();
    }
    if (tid < hd) {
        out[qbase + tid] = acc / l;
    }
}
