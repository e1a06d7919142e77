// wgpu_bench's floor pass (as ../shared/tools/wgpu-floor): the second half of `buf`
// becomes a transform of the first, one invocation per word.

@group(0) @binding(0) var<storage, read_write> buf: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let n = arrayLength(&buf) / 2u;
    if (g.x < n) {
        buf[n + g.x] = buf[g.x] * 2u + 1u;
    }
}
