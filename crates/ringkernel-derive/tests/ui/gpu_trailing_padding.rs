use ringkernel_derive::GpuType;

// WGSL rounds the size up to 8 (the u64's alignment): 12 bytes of fields need 4 more.
#[derive(GpuType)]
struct Tail {
    a: u64,
    b: f32,
}

fn main() {}
