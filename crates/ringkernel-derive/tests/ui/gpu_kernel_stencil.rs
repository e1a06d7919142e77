use ringkernel_codegen::dsl::*;
use ringkernel_derive::gpu_kernel;

#[gpu_kernel]
fn blur(pos: GridPos, p: &[f32], out: &mut [f32]) {
    out[pos.idx()] = 0.5 * (pos.west(p) + pos.east(p));
}

fn main() {}
