use ringkernel_derive::gpu_kernel;

fn helper(x: f32) -> f32 {
    x * 2.0
}

#[gpu_kernel]
fn twice(data: &mut [f32]) {
    data[0] = helper(data[0]);
}

fn main() {}
