// Weight matrices in blocks of 32 values (WeightFormat of ringkernel-core, FORMAT:
// 0 f32 = 32 words, 1 q4_1 = 5 words (d, m halves; 16 bytes of nibbles), 2 q8_0 = 9 words
// (d; 32 signed bytes)), multiplied on the stored blocks. half.wgsl is put in front.
//
// qmatmul: out[t, r] (+)= Σ_c W[r, c] · x[t, c]; with GATED, out = silu(W·x) · (W2·x).
// A workgroup is 8 rows × 32 lanes and TILE tokens (workgroup z); the lanes of a row
// take the row's octets (8 consecutive values: a quarter block) in turn, then sum their
// partial dots in workgroup memory.
//
// embedding: out[t, c] = W[ids[t], c] (zeros for an id past the table), a thread per
// output element.

struct QuantParams {
    batch: u32,
    rows: u32,
    cols: u32,
    accumulate: u32,
}

override FORMAT: u32 = 1u;
override GATED: u32 = 0u;

const TILE: u32 = 4u;

@group(0) @binding(0) var<uniform> p: QuantParams;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> w2: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> ids: array<u32>;

var<workgroup> partial: array<f32, 2048>; // [gate | up][256 threads][TILE]

fn block_words() -> u32 {
    switch FORMAT {
        case 0u: { return 32u; }
        case 1u: { return 5u; }
        default: { return 9u; }
    }
}

fn word(second: bool, i: u32) -> u32 {
    if (second) {
        return w2[i];
    }
    return w[i];
}

// The 8 values of octet o (0..3) of the block at word `base`.
fn octet(second: bool, base: u32, o: u32) -> array<f32, 8> {
    var v: array<f32, 8>;
    switch FORMAT {
        case 0u: {
            for (var j = 0u; j < 8u; j = j + 1u) {
                v[j] = bitcast<f32>(word(second, base + o * 8u + j));
            }
        }
        case 1u: {
            let dm = word(second, base);
            let d = f16_value(dm);
            let m = f16_value(dm >> 16u);
            let wa = word(second, base + 1u + 2u * (o & 1u));
            let wb = word(second, base + 2u + 2u * (o & 1u));
            let sh = select(0u, 4u, o >= 2u);
            for (var k = 0u; k < 4u; k = k + 1u) {
                v[k] = f32((wa >> (8u * k + sh)) & 0xFu) * d + m;
                v[4u + k] = f32((wb >> (8u * k + sh)) & 0xFu) * d + m;
            }
        }
        default: {
            let d = f16_value(word(second, base));
            let wa = bitcast<i32>(word(second, base + 1u + 2u * o));
            let wb = bitcast<i32>(word(second, base + 2u + 2u * o));
            for (var k = 0u; k < 4u; k = k + 1u) {
                v[k] = f32(extractBits(wa, 8u * k, 8u)) * d;
                v[4u + k] = f32(extractBits(wb, 8u * k, 8u)) * d;
            }
        }
    }
    return v;
}

@compute @workgroup_size(256)
fn qmatmul(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let lane = lid.x % 32u;
    let row = (wg.x + wg.y * nwg.x) * 8u + lid.x / 32u;
    let t0 = wg.z * TILE;
    let nt = min(TILE, p.batch - t0);
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    var acc2 = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    if (row < p.rows) {
        let nb = p.cols / 32u;
        let bw = block_words();
        let base = row * nb * bw;
        for (var oc = lane; oc < nb * 4u; oc = oc + 32u) {
            let blk = oc / 4u;
            let o = oc % 4u;
            let wv = octet(false, base + blk * bw, o);
            var uv: array<f32, 8>;
            if (GATED != 0u) {
                uv = octet(true, base + blk * bw, o);
            }
            for (var t = 0u; t < nt; t = t + 1u) {
                let xi = (t0 + t) * p.cols + blk * 32u + o * 8u;
                var s = 0.0;
                var s2 = 0.0;
                for (var j = 0u; j < 8u; j = j + 1u) {
                    let xv = x[xi + j];
                    s = s + wv[j] * xv;
                    s2 = s2 + uv[j] * xv;
                }
                acc[t] = acc[t] + s;
                acc2[t] = acc2[t] + s2;
            }
        }
    }
    for (var t = 0u; t < TILE; t = t + 1u) {
        partial[lid.x * TILE + t] = acc[t];
        partial[1024u + lid.x * TILE + t] = acc2[t];
    }
    workgroupBarrier();
    for (var s = 16u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            for (var t = 0u; t < TILE; t = t + 1u) {
                let i = lid.x * TILE + t;
                let j = (lid.x + s) * TILE + t;
                partial[i] = partial[i] + partial[j];
                partial[1024u + i] = partial[1024u + i] + partial[1024u + j];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < p.rows) {
        for (var t = 0u; t < nt; t = t + 1u) {
            let g = partial[lid.x * TILE + t];
            var v = g;
            if (GATED != 0u) {
                v = g / (1.0 + exp(-g)) * partial[1024u + lid.x * TILE + t];
            }
            let oi = (t0 + t) * p.rows + row;
            if (p.accumulate != 0u) {
                v = v + out[oi];
            }
            out[oi] = v;
        }
    }
}

// Value j (0..31) of the block at word `base`.
fn element(base: u32, j: u32) -> f32 {
    switch FORMAT {
        case 0u: {
            return bitcast<f32>(w[base + j]);
        }
        case 1u: {
            let dm = w[base];
            let q = (w[base + 1u + (j % 16u) / 4u] >> (8u * (j % 4u))) & 0xFFu;
            let nib = select(q & 0xFu, q >> 4u, j >= 16u);
            return f32(nib) * f16_value(dm) + f16_value(dm >> 16u);
        }
        default: {
            let q = extractBits(bitcast<i32>(w[base + 1u + j / 4u]), 8u * (j % 4u), 8u);
            return f32(q) * f16_value(w[base]);
        }
    }
}

@compute @workgroup_size(256)
fn embedding(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.batch * p.cols) {
        return;
    }
    let t = i / p.cols;
    let c = i % p.cols;
    let id = ids[t];
    if (id >= p.rows) {
        out[i] = 0.0;
        return;
    }
    let bw = block_words();
    out[i] = element((id * (p.cols / 32u) + c / 32u) * bw, c % 32u);
}
