// Tree reductions. OP is the ReduceOp code (0 sum, 1 max, 2 min, 3 mean; mean reduces
// as a sum and the host passes scale = 1/axis on the last pass).
//
// reduce_rows: x viewed as [outer, axis] (contiguous axis). Workgroup g (linear over a
//   2-D grid) reduces chunk (g % chunks) of row (g / chunks) into out[g], scaled.
//   A long row is reduced in two passes: chunks partials, then one pass over them.
// reduce_strided: x as [outer, axis, inner] with inner > 1: one thread per output,
//   looping over the axis (neighbouring threads read neighbouring addresses).
// dot_partial: out[g] = Σ x[i]·y[i] over chunk g.

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
    var acc = identity();
    for (var i = start + lid; i < end; i += 256u) {
        acc = combine(acc, x[base + i]);
    }
    let r = tree(lid, acc);
    if (lid == 0u) {
        out[g] = r * p.scale;
    }
}

@compute @workgroup_size(256)
fn reduce_strided(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    if (idx >= p.outer * p.inner) {
        return;
    }
    let o = idx / p.inner;
    let i = idx % p.inner;
    var acc = identity();
    for (var a = 0u; a < p.axis; a++) {
        acc = combine(acc, x[(o * p.axis + a) * p.inner + i]);
    }
    out[idx] = acc * p.scale;
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
    var acc = 0.0;
    for (var i = start + lid; i < end; i += 256u) {
        acc = fma(x[i], y[i], acc);
    }
    // OP is 0 (sum) for this entry point.
    let r = tree(lid, acc);
    if (lid == 0u) {
        out[g] = r * p.scale;
    }
}
