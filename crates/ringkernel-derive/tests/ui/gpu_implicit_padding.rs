use ringkernel_derive::GpuType;

// Without #[repr(C)] the derive lays the struct out for WGSL itself; a gap before `b`
// (WGSL aligns vec2<u32> to 8) must be an explicit field.
#[derive(GpuType)]
struct Gap {
    a: u32,
    b: u64,
}

fn main() {}
