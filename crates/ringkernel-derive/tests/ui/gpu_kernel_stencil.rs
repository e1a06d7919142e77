use ringkernel_codegen::dsl::*;
use ringkernel_derive::gpu_kernel;

// A stencil kernel needs its halo width.
#[gpu_kernel]
fn blur(pos: GridPos, p: &[f32], out: &mut [f32]) {
    out[pos.idx()] = 0.5 * (pos.west(p) + pos.east(p));
}

// A halo without a GridPos.
#[gpu_kernel(halo = 1)]
fn plain(out: &mut [f32]) {
    out[thread_idx_x() as usize] = 1.0;
}

// A halo the translator does not take.
#[gpu_kernel(halo = 40)]
fn wide(pos: GridPos, p: &[f32], out: &mut [f32]) {
    out[pos.idx()] = p[pos.idx()];
}

fn main() {}
