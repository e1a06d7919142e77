use ringkernel_derive::gpu_fn;

// A helper takes scalars: the error names the slice parameter.
#[gpu_fn]
fn first(v: &[f32]) -> f32 {
    v[0]
}

// A helper cannot read thread indices.
#[gpu_fn]
fn lane() -> i32 {
    ringkernel_codegen::dsl::thread_idx_x()
}

fn main() {}
