// Row-wise kernels over [rows, cols]: one 256-thread workgroup per row (row index linear
// over a 2-D grid), tree reductions in workgroup memory.
//
// softmax:    out = exp(x - max) / Σ exp(x - max)
// rms_norm:   out = x / sqrt(mean(x²) + eps) · w
// layer_norm: out = (x - mean) / sqrt(var + eps) · w + bias   (biased variance, two-pass)

struct NormParams {
    rows: u32,
    cols: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: NormParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, 256>;

fn sum_all(lid: u32, v: f32) -> f32 {
    red[lid] = v;
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

fn max_all(lid: u32, v: f32) -> f32 {
    red[lid] = v;
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

@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var m = bitcast<f32>(0xff800000u);
    for (var c = lid; c < p.cols; c += 256u) {
        m = max(m, x[base + c]);
    }
    m = max_all(lid, m);
    var s = 0.0;
    for (var c = lid; c < p.cols; c += 256u) {
        s += exp(x[base + c] - m);
    }
    s = sum_all(lid, s);
    let inv = 1.0 / s;
    for (var c = lid; c < p.cols; c += 256u) {
        out[base + c] = exp(x[base + c] - m) * inv;
    }
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var s = 0.0;
    for (var c = lid; c < p.cols; c += 256u) {
        let v = x[base + c];
        s = fma(v, v, s);
    }
    s = sum_all(lid, s);
    let inv = inverseSqrt(s / f32(p.cols) + p.eps);
    for (var c = lid; c < p.cols; c += 256u) {
        out[base + c] = x[base + c] * inv * w[c];
    }
}

@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var s = 0.0;
    for (var c = lid; c < p.cols; c += 256u) {
        s += x[base + c];
    }
    let mean = sum_all(lid, s) / f32(p.cols);
    var q = 0.0;
    for (var c = lid; c < p.cols; c += 256u) {
        let d = x[base + c] - mean;
        q = fma(d, d, q);
    }
    let inv = inverseSqrt(sum_all(lid, q) / f32(p.cols) + p.eps);
    for (var c = lid; c < p.cols; c += 256u) {
        out[base + c] = (x[base + c] - mean) * inv * w[c] + bias[c];
    }
}

// ---- vec4 variants for rows whose length is a multiple of 4 (p.cols still counts
// floats): 16-byte loads and stores, a quarter of the memory instructions.

@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out4: array<vec4<f32>>;

@compute @workgroup_size(256)
fn softmax4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let n4 = p.cols / 4u;
    let base = row * n4;
    var m4 = vec4<f32>(bitcast<f32>(0xff800000u));
    for (var c = lid; c < n4; c += 256u) {
        m4 = max(m4, x4[base + c]);
    }
    let m = max_all(lid, max(max(m4.x, m4.y), max(m4.z, m4.w)));
    var s4 = vec4<f32>(0.0);
    for (var c = lid; c < n4; c += 256u) {
        s4 += exp(x4[base + c] - vec4<f32>(m));
    }
    let s = sum_all(lid, s4.x + s4.y + s4.z + s4.w);
    let inv = 1.0 / s;
    for (var c = lid; c < n4; c += 256u) {
        out4[base + c] = exp(x4[base + c] - vec4<f32>(m)) * inv;
    }
}

@compute @workgroup_size(256)
fn rms_norm4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let n4 = p.cols / 4u;
    let base = row * n4;
    var s4 = vec4<f32>(0.0);
    for (var c = lid; c < n4; c += 256u) {
        let v = x4[base + c];
        s4 = fma(v, v, s4);
    }
    let s = sum_all(lid, s4.x + s4.y + s4.z + s4.w);
    let inv = inverseSqrt(s / f32(p.cols) + p.eps);
    for (var c = lid; c < n4; c += 256u) {
        out4[base + c] = x4[base + c] * inv * w4[c];
    }
}
