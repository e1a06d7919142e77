// Binary ops under numpy broadcasting, described by strides (BroadcastDims of
// ringkernel-core): output element i, as a multi-index over `shape` (last index fastest,
// up to 8 dimensions), reads a[Σ i_d · a_stride_d] and b[Σ i_d · b_stride_d]; a
// broadcast dimension has stride 0. One thread per output element; OP is the BinaryOp
// code as in elementwise.wgsl.

struct BroadcastParams {
    rank: u32,
    len: u32,
    _pad0: u32,
    _pad1: u32,
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

override OP: u32 = 0u;

@group(0) @binding(0) var<uniform> p: BroadcastParams;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

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
fn broadcast_binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.len) {
        return;
    }
    var rest = i;
    var ia = 0u;
    var ib = 0u;
    for (var d = i32(p.rank) - 1; d >= 0; d = d - 1) {
        let n = p.shape[d / 4][d % 4];
        let c = rest % n;
        rest = rest / n;
        ia = ia + c * p.a_strides[d / 4][d % 4];
        ib = ib + c * p.b_strides[d / 4][d % 4];
    }
    out[i] = binary_op(a[ia], b[ib]);
}
