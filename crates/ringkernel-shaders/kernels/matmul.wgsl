// Matrix products.
//
// matmul: out[b] = A[b] (m×k) · B[b] (k×n), row-major. Each 256-thread workgroup computes
// a 64×64 output tile; A and B tiles of depth 16 are staged in workgroup memory and each
// thread accumulates a 4×4 block (rows ty + 16·i, columns tx + 16·j) in registers.
// Grid: (ceil(n/64), ceil(m/64), batch).
//
// matvec: out[r] = A[r, :] · x, one workgroup per row with a tree reduction.

struct MatmulParams {
    m: u32,
    k: u32,
    n: u32,
    batch: u32,
    a_stride: u32,
    b_stride: u32,
    c_stride: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: MatmulParams;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const TILE: u32 = 64u;
const DEPTH: u32 = 16u;

var<workgroup> a_tile: array<f32, 1024>; // [DEPTH][TILE], A transposed
var<workgroup> b_tile: array<f32, 1024>; // [DEPTH][TILE]
var<workgroup> partial: array<f32, 256>;

// The 4×4 register block is written out with constant indices on purpose: a version
// with a 128×128 tile and an 8×8 block in dynamically indexed private arrays ran 20×
// slower on NVIDIA's Vulkan driver (the arrays went to local memory).
@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row0 = wg.y * TILE;
    let col0 = wg.x * TILE;
    let batch = wg.z;
    let a_base = batch * p.a_stride;
    let b_base = batch * p.b_stride;
    let c_base = batch * p.c_stride;
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 += DEPTH) {
        for (var r = 0u; r < 4u; r++) {
            let e = lid + 256u * r;
            // A: 64 rows × 16 depth, read along k.
            let ar = e / DEPTH;
            let ak = e % DEPTH;
            var av = 0.0;
            if (row0 + ar < p.m && k0 + ak < p.k) {
                av = a[a_base + (row0 + ar) * p.k + k0 + ak];
            }
            a_tile[ak * TILE + ar] = av;
            // B: 16 depth × 64 columns, read along n.
            let bk = e / TILE;
            let bc = e % TILE;
            var bv = 0.0;
            if (k0 + bk < p.k && col0 + bc < p.n) {
                bv = b[b_base + (k0 + bk) * p.n + col0 + bc];
            }
            b_tile[bk * TILE + bc] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < DEPTH; kk++) {
            let a0 = a_tile[kk * TILE + ty];
            let a1 = a_tile[kk * TILE + ty + 16u];
            let a2 = a_tile[kk * TILE + ty + 32u];
            let a3 = a_tile[kk * TILE + ty + 48u];
            let b0 = b_tile[kk * TILE + tx];
            let b1 = b_tile[kk * TILE + tx + 16u];
            let b2 = b_tile[kk * TILE + tx + 32u];
            let b3 = b_tile[kk * TILE + tx + 48u];
            acc[0] = fma(a0, b0, acc[0]);
            acc[1] = fma(a0, b1, acc[1]);
            acc[2] = fma(a0, b2, acc[2]);
            acc[3] = fma(a0, b3, acc[3]);
            acc[4] = fma(a1, b0, acc[4]);
            acc[5] = fma(a1, b1, acc[5]);
            acc[6] = fma(a1, b2, acc[6]);
            acc[7] = fma(a1, b3, acc[7]);
            acc[8] = fma(a2, b0, acc[8]);
            acc[9] = fma(a2, b1, acc[9]);
            acc[10] = fma(a2, b2, acc[10]);
            acc[11] = fma(a2, b3, acc[11]);
            acc[12] = fma(a3, b0, acc[12]);
            acc[13] = fma(a3, b1, acc[13]);
            acc[14] = fma(a3, b2, acc[14]);
            acc[15] = fma(a3, b3, acc[15]);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + ty + 16u * i;
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + tx + 16u * j;
            if (row < p.m && col < p.n) {
                out[c_base + row * p.n + col] = acc[i * 4u + j];
            }
        }
    }
}

@compute @workgroup_size(256)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.m) {
        return;
    }
    var s = 0.0;
    for (var c = lid; c < p.k; c += 256u) {
        s = fma(a[row * p.k + c], b[c], s);
    }
    partial[lid] = s;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w / 2u) {
        if (lid < w) {
            partial[lid] = partial[lid] + partial[lid + w];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[row] = partial[0];
    }
}
