use ringkernel_codegen::dsl::*;
use ringkernel_derive::gpu_kernel;

#[gpu_kernel]
fn gather(src: &[f32], dst: &mut [f32], n: i32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        let v = vec![src[i as usize]];
        dst[i as usize] = v[0];
    }
}

fn main() {}
