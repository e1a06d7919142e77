// Elementwise kernels. One thread per element (per vec4 in the *4 kernels) from p.first
// on; the linear index spans a 2-D grid of workgroups (wg.x + wg.y * num_workgroups.x) so
// ranges beyond 65535 workgroups work. The operation is the override constant OP
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

@group(0) @binding(1) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out4: array<vec4<f32>>;

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

@compute @workgroup_size(256)
fn unary4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    if (i < p.len) {
        out4[i] = unary_op4(a4[i]);
    }
}

@compute @workgroup_size(256)
fn binary4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    if (i < p.len) {
        out4[i] = binary_op4(a4[i], b4[i]);
    }
}

@compute @workgroup_size(256)
fn binary_scalar4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    if (i < p.len) {
        out4[i] = binary_op4(a4[i], vec4<f32>(p.scalar));
    }
}

@compute @workgroup_size(256)
fn swiglu4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_index(gid, nwg);
    if (i < p.len) {
        let g = a4[i];
        out4[i] = g / (vec4<f32>(1.0) + exp(-g)) * b4[i];
    }
}
