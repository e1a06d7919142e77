use ringkernel_derive::GpuType;

#[derive(Clone, Copy, GpuType)]
#[repr(C)]
struct Precise {
    x: f64,
    y: f64,
}

fn main() {}
