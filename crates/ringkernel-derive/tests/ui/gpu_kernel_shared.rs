use ringkernel_codegen::dsl::*;
use ringkernel_derive::gpu_kernel;

// Shared arrays exist once per block: declared at the top level only.
#[gpu_kernel]
fn nested(out: &mut [f32], n: i32) {
    let t = thread_idx_x();
    if t < n {
        let mut s = shared_array::<f32, 64>();
        s[t as usize] = 1.0;
        out[t as usize] = s[t as usize];
    }
}

// A barrier is a statement.
#[gpu_kernel]
fn valued(out: &mut [f32]) {
    let b = sync_threads();
    out[0] = 1.0;
}

fn main() {}
