// Elementwise kernels. One thread per element (per VEC4_PER_THREAD vec4s in the *4
// kernels) from p.first on; the linear index spans a 2-D grid of workgroups (wg.x +
// wg.y * num_workgroups.x) so ranges beyond 65535 workgroups work. The operation is the override constant OP
// (UnaryOp / BinaryOp codes of ringkernel-core). A length that is not a multiple of 4
// runs a *4 kernel over the whole vec4s and a scalar one over the last len % 4 elements.

struct ElementwiseParams {
    len: u32,
    scalar: f32,
    first: u32,
    _pad1: u32,
}

override OP: u32 = 0u;

@group(0) @binding(0) var<uniform> p: ElementwiseParams;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn linear_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return p.first + gid.x + gid.y * nwg.x * 256u;
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// tanh that stays finite for large |x| (exp overflow gives inf/inf in a naive form).
fn safe_tanh(x: f32) -> f32 {
    let ax = min(abs(x), 20.0);
    let e = exp(-2.0 * ax);
    return sign(x) * (1.0 - e) / (1.0 + e);
}

fn unary_op(x: f32) -> f32 {
    switch OP {
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 2u: { return sqrt(x); }
        case 3u: { return exp(x); }
        case 4u: { return log(x); }
        case 5u: { return sin(x); }
        case 6u: { return cos(x); }
        case 7u: { return safe_tanh(x); }
        case 8u: { return max(x, 0.0); }
        case 9u: { return sigmoid(x); }
        case 10u: { return x * sigmoid(x); }
        case 11u: {
            // 0.5·(1 + tanh(z)) = sigmoid(2z): no cancellation for large negative x.
            let c = 0.7978845608028654; // sqrt(2 / pi)
            return x * sigmoid(2.0 * c * (x + 0.044715 * x * x * x));
        }
        default: { return x; }
    }
}

fn binary_op(x: f32, y: f32) -> f32 {
    switch OP {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return max(x, y); }
        case 5u: { return min(x, y); }
        default: { return x; }
    }
}

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    if (i < p.len) {
        out[i] = unary_op(a[i]);
    }
}

@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    if (i < p.len) {
        out[i] = binary_op(a[i], b[i]);
    }
}

@compute @workgroup_size(256)
fn binary_scalar(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    if (i < p.len) {
        out[i] = binary_op(a[i], p.scalar);
    }
}

@compute @workgroup_size(256)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    if (i < p.len) {
        let g = a[i];
        out[i] = g * sigmoid(g) * b[i];
    }
}

// ---- vec4 variants: 16-byte loads and stores, for lengths that are a multiple of 4
// (p.len counts vec4s here). Same bindings, viewed as arrays of vec4<f32>.
//
// Each invocation handles VEC4_PER_THREAD vec4s, one grid apart (i, i + s, i + 2s, ...
// with s the invocations of the dispatch, so a warp's accesses stay contiguous), and
// loads all of them before it stores any: several 16-byte loads per thread in flight.
// With one per thread, a GPU whose memory is as fast as HBM3e spends much of the time
// waiting on memory latency rather than moving bytes. Load indices are clamped to the
// last vec4 (always in bounds); an invocation stores only the vec4s that exist.

const VEC4_PER_THREAD: u32 = 4u;

@group(0) @binding(1) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out4: array<vec4<f32>>;

// Invocations of the dispatch: the distance between an invocation's vec4s.
fn grid_stride(nwg: vec3<u32>) -> u32 {
    return nwg.x * nwg.y * 256u;
}

fn unary_op4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(unary_op(v.x), unary_op(v.y), unary_op(v.z), unary_op(v.w));
}

fn binary_op4(x: vec4<f32>, y: vec4<f32>) -> vec4<f32> {
    switch OP {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return max(x, y); }
        case 5u: { return min(x, y); }
        default: { return x; }
    }
}

fn swiglu_op4(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    return g / (vec4<f32>(1.0) + exp(-g)) * u;
}

// Stores the results of one invocation: v[k] at i + k * s where that is below p.len.
fn store4(i: u32, s: u32, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>) {
    if (i < p.len) { out4[i] = v0; }
    if (i + s < p.len) { out4[i + s] = v1; }
    if (i + 2u * s < p.len) { out4[i + 2u * s] = v2; }
    if (i + 3u * s < p.len) { out4[i + 3u * s] = v3; }
}

@compute @workgroup_size(256)
fn unary4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    let s = grid_stride(nwg);
    let last = p.len - 1u;
    let x0 = a4[min(i, last)];
    let x1 = a4[min(i + s, last)];
    let x2 = a4[min(i + 2u * s, last)];
    let x3 = a4[min(i + 3u * s, last)];
    store4(i, s, unary_op4(x0), unary_op4(x1), unary_op4(x2), unary_op4(x3));
}

@compute @workgroup_size(256)
fn binary4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    let s = grid_stride(nwg);
    let last = p.len - 1u;
    let j0 = min(i, last);
    let j1 = min(i + s, last);
    let j2 = min(i + 2u * s, last);
    let j3 = min(i + 3u * s, last);
    let x0 = a4[j0];
    let x1 = a4[j1];
    let x2 = a4[j2];
    let x3 = a4[j3];
    let y0 = b4[j0];
    let y1 = b4[j1];
    let y2 = b4[j2];
    let y3 = b4[j3];
    store4(i, s, binary_op4(x0, y0), binary_op4(x1, y1), binary_op4(x2, y2), binary_op4(x3, y3));
}

@compute @workgroup_size(256)
fn binary_scalar4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    let s = grid_stride(nwg);
    let last = p.len - 1u;
    let c = vec4<f32>(p.scalar);
    let x0 = a4[min(i, last)];
    let x1 = a4[min(i + s, last)];
    let x2 = a4[min(i + 2u * s, last)];
    let x3 = a4[min(i + 3u * s, last)];
    store4(i, s, binary_op4(x0, c), binary_op4(x1, c), binary_op4(x2, c), binary_op4(x3, c));
}

@compute @workgroup_size(256)
fn swiglu4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    let s = grid_stride(nwg);
    let last = p.len - 1u;
    let j0 = min(i, last);
    let j1 = min(i + s, last);
    let j2 = min(i + 2u * s, last);
    let j3 = min(i + 3u * s, last);
    let g0 = a4[j0];
    let g1 = a4[j1];
    let g2 = a4[j2];
    let g3 = a4[j3];
    let u0 = b4[j0];
    let u1 = b4[j1];
    let u2 = b4[j2];
    let u3 = b4[j3];
    store4(i, s, swiglu_op4(g0, u0), swiglu_op4(g1, u1), swiglu_op4(g2, u2), swiglu_op4(g3, u3));
}
