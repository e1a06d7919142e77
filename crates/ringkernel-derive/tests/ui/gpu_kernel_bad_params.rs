use ringkernel_derive::gpu_kernel;

#[gpu_kernel]
fn flags(f: &mut [bool]) {
    f[0] = true;
}

#[gpu_kernel]
fn sized(n: usize) {
    let _ = n;
}

#[gpu_kernel(workgroup_size = 64)]
fn with_args(x: &mut [f32]) {
    x[0] = 1.0;
}

#[gpu_kernel]
fn returns(x: &[f32]) -> f32 {
    x[0]
}

fn main() {}
