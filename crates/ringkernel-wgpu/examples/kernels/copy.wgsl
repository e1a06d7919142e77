// wgpu_bench's in-run references for the memory-bound ops: `o = a` over whole vec4s
// with 1, 2, 4 or 8 vec4s per invocation (one grid apart, all loads before any store),
// 256-thread workgroups on a 2-D grid (as `grid_for`). The library's elementwise
// kernels use VEC4_PER_THREAD = 4 (elementwise.wgsl); the others show what the choice
// is worth on the device at hand.

@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> o: array<vec4<f32>>;

fn first(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

fn stride(nwg: vec3<u32>) -> u32 {
    return nwg.x * nwg.y * 256u;
}

fn store4(i: u32, v: vec4<f32>) {
    if (i < arrayLength(&o)) {
        o[i] = v;
    }
}

fn load4(i: u32) -> vec4<f32> {
    return a[min(i, arrayLength(&o) - 1u)];
}

@compute @workgroup_size(256)
fn copy_x1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = first(gid, nwg);
    store4(i, load4(i));
}

@compute @workgroup_size(256)
fn copy_x2(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = first(gid, nwg);
    let s = stride(nwg);
    let v0 = load4(i);
    let v1 = load4(i + s);
    store4(i, v0);
    store4(i + s, v1);
}

@compute @workgroup_size(256)
fn copy_x4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = first(gid, nwg);
    let s = stride(nwg);
    let v0 = load4(i);
    let v1 = load4(i + s);
    let v2 = load4(i + 2u * s);
    let v3 = load4(i + 3u * s);
    store4(i, v0);
    store4(i + s, v1);
    store4(i + 2u * s, v2);
    store4(i + 3u * s, v3);
}

@compute @workgroup_size(256)
fn copy_x8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = first(gid, nwg);
    let s = stride(nwg);
    let v0 = load4(i);
    let v1 = load4(i + s);
    let v2 = load4(i + 2u * s);
    let v3 = load4(i + 3u * s);
    let v4 = load4(i + 4u * s);
    let v5 = load4(i + 5u * s);
    let v6 = load4(i + 6u * s);
    let v7 = load4(i + 7u * s);
    store4(i, v0);
    store4(i + s, v1);
    store4(i + 2u * s, v2);
    store4(i + 3u * s, v3);
    store4(i + 4u * s, v4);
    store4(i + 5u * s, v5);
    store4(i + 6u * s, v6);
    store4(i + 7u * s, v7);
}
