// Tree reductions. OP is the ReduceOp code (0 sum, 1 max, 2 min, 3 mean; mean reduces
// as a sum and the host passes scale = 1/axis on the last pass).
//
// reduce_rows: x viewed as [outer, axis] (contiguous axis). Workgroup g (linear over a
//   2-D grid) reduces chunk (g % chunks) of row (g / chunks) into out[g], scaled.
//   A long row is reduced in passes: chunks partials, then passes over them (the
//   host's plan keeps chunks at 16384 elements, 64 per thread).
// reduce_strided: x as [outer, axis, inner] with inner > 1: one thread per element of
//   out [outer, chunks, inner], looping over its chunk of the axis (neighbouring
//   threads read neighbouring addresses). A long axis takes further passes over the
//   [outer, chunks, inner] partials (the plan keeps chunks at 1024 elements: a thread
//   looping over hundreds of thousands of elements may never finish on some drivers).
// dot_partial: out[g] = Σ x[i]·y[i] over chunk g.
// argmax: out_u[0] = the index of the first largest of x[0..axis] (NaNs passed over, 0
//   when x[0] is NaN), one workgroup: each invocation its strided values, then a tree of
//   (value, index) pairs; NaNs are found by their bits (WGSL lets a compiler assume
//   there are none, so `v != v` is no test).
// No f32 sum runs long: threads of reduce_rows/dot_partial add at most 4 terms in a row
// (rows_leaf; the plan's chunks are 16384 elements, 64 per thread), reduce_strided
// threads accumulate pairwise (Pairwise), and threads combine in a tree, so a sum of n
// terms carries O(log n) rounding error, not O(n).

struct ReduceParams {
    outer: u32,
    axis: u32,
    inner: u32,
    chunks: u32,
    chunk_len: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
}

override OP: u32 = 0u;

@group(0) @binding(0) var<uniform> p: ReduceParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, 256>;

fn identity() -> f32 {
    switch OP {
        case 1u: { return bitcast<f32>(0xff800000u); } // -inf
        case 2u: { return bitcast<f32>(0x7f800000u); } // +inf
        default: { return 0.0; }
    }
}

fn combine(u: f32, v: f32) -> f32 {
    switch OP {
        case 1u: { return max(u, v); }
        case 2u: { return min(u, v); }
        default: { return u + v; }
    }
}

// Pairwise accumulation by a binary counter (for reduce_strided, whose threads loop
// over up to 1024 elements): part[k] holds the combination of a block of
// 2^k values, and a new value merges with the full blocks below it, as a carry
// propagates. A sum of n values has O(log n) rounding error (a running f32 sum of ten
// million values drifts by parts per million), and there is no compensation term a
// compiler could simplify away. Zero-initialised (n = 0) by `var acc: Pairwise;`.
struct Pairwise {
    part: array<f32, 32>,
    n: u32,
}

fn pw_add(acc: ptr<function, Pairwise>, value: f32) {
    var v = value;
    var c = (*acc).n;
    var k = 0u;
    while ((c & 1u) == 1u) {
        v = combine((*acc).part[k], v);
        c = c >> 1u;
        k = k + 1u;
    }
    (*acc).part[k] = v;
    (*acc).n = (*acc).n + 1u;
}

fn pw_total(acc: ptr<function, Pairwise>) -> f32 {
    var t = identity();
    var c = (*acc).n;
    var k = 0u;
    while (c != 0u) {
        if ((c & 1u) == 1u) {
            t = combine((*acc).part[k], t);
        }
        c = c >> 1u;
        k = k + 1u;
    }
    return t;
}

// A thread's share of a row chunk: its elements first, first + 256, ... below end (64
// when the plan's chunk of 16384 is full). Each run of four is combined pairwise (a
// "quad"), and four accumulators in registers each add one quad in four, so no f32 sum
// adds more than 4 terms in a row (a running sum of millions drifts by parts per
// million). Indices stay far below u32::MAX (buffers are at most a few GiB).
fn ld(i: u32, end: u32, base: u32) -> f32 {
    if (i < end) {
        return x[base + i];
    }
    return identity();
}

fn quad(i: u32, end: u32, base: u32) -> f32 {
    return combine(combine(ld(i, end, base), ld(i + 256u, end, base)),
                   combine(ld(i + 512u, end, base), ld(i + 768u, end, base)));
}

fn rows_leaf(first: u32, end: u32, base: u32) -> f32 {
    var a = vec4<f32>(identity());
    for (var i = first; i < end; i += 4096u) {
        a.x = combine(a.x, quad(i, end, base));
        a.y = combine(a.y, quad(i + 1024u, end, base));
        a.z = combine(a.z, quad(i + 2048u, end, base));
        a.w = combine(a.w, quad(i + 3072u, end, base));
    }
    return combine(combine(a.x, a.y), combine(a.z, a.w));
}

// The same for dot_partial's x[i]·y[i].
fn ld_dot(i: u32, end: u32) -> f32 {
    if (i < end) {
        return x[i] * y[i];
    }
    return 0.0;
}

fn quad_dot(i: u32, end: u32) -> f32 {
    return (ld_dot(i, end) + ld_dot(i + 256u, end)) + (ld_dot(i + 512u, end) + ld_dot(i + 768u, end));
}

fn dot_leaf(first: u32, end: u32) -> f32 {
    var a = vec4<f32>(0.0);
    for (var i = first; i < end; i += 4096u) {
        a += vec4<f32>(quad_dot(i, end), quad_dot(i + 1024u, end), quad_dot(i + 2048u, end),
                       quad_dot(i + 3072u, end));
    }
    return (a.x + a.y) + (a.z + a.w);
}

fn tree(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w / 2u) {
        if (lid < w) {
            red[lid] = combine(red[lid], red[lid + w]);
        }
        workgroupBarrier();
    }
    return red[0];
}

@compute @workgroup_size(256)
fn reduce_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = wg.x + wg.y * nwg.x;
    if (g >= p.outer * p.chunks) {
        return;
    }
    let row = g / p.chunks;
    let chunk = g % p.chunks;
    let start = chunk * p.chunk_len;
    let end = min(start + p.chunk_len, p.axis);
    let base = row * p.axis;
    let r = tree(lid, rows_leaf(start + lid, end, base));
    if (lid == 0u) {
        out[g] = r * p.scale;
    }
}

@compute @workgroup_size(256)
fn reduce_strided(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    let per_outer = p.chunks * p.inner;
    if (idx >= p.outer * per_outer) {
        return;
    }
    let o = idx / per_outer;
    let c = (idx % per_outer) / p.inner;
    let i = idx % p.inner;
    let start = c * p.chunk_len;
    let end = min(start + p.chunk_len, p.axis);
    var acc: Pairwise;
    for (var a = start; a < end; a++) {
        pw_add(&acc, x[(o * p.axis + a) * p.inner + i]);
    }
    out[idx] = pw_total(&acc) * p.scale;
}

@compute @workgroup_size(256)
fn dot_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = wg.x + wg.y * nwg.x;
    if (g >= p.chunks) {
        return;
    }
    let start = g * p.chunk_len;
    let end = min(start + p.chunk_len, p.axis);
    // OP is 0 (sum) for this entry point.
    let r = tree(lid, dot_leaf(start + lid, end));
    if (lid == 0u) {
        out[g] = r * p.scale;
    }
}

@group(0) @binding(5) var<storage, read_write> out_u: array<u32>;
var<workgroup> red_at: array<u32, 256>;

fn is_nan_bits(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// Whether (v, i) beats (best, at): a larger value, or the same value at a smaller index.
fn argmax_beats(v: f32, i: u32, best: f32, at: u32) -> bool {
    return v > best || (v == best && i < at);
}

@compute @workgroup_size(256)
fn argmax(@builtin(local_invocation_id) lid: vec3<u32>) {
    let t = lid.x;
    var best = bitcast<f32>(0xff800000u); // -inf
    var at = 0xffffffffu;
    for (var i = t; i < p.axis; i = i + 256u) {
        let v = x[i];
        if (!is_nan_bits(v) && argmax_beats(v, i, best, at)) {
            best = v;
            at = i;
        }
    }
    red[t] = best;
    red_at[t] = at;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (t < s && argmax_beats(red[t + s], red_at[t + s], red[t], red_at[t])) {
            red[t] = red[t + s];
            red_at[t] = red_at[t + s];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        var r = red_at[0];
        if (is_nan_bits(x[0]) || r == 0xffffffffu) {
            r = 0u;
        }
        out_u[0] = r;
    }
}
