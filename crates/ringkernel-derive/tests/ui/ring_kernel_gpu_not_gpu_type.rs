use ringkernel_core::context::KernelContext;
use ringkernel_derive::{ring_kernel, RingMessage};

// A message without `GpuType`: its fields cannot reach the translator.
#[derive(Clone, Copy, Default, RingMessage)]
#[message(type_id = 1)]
#[repr(C)]
struct Job {
    id: u64,
    value: f32,
    pad: u32,
}

#[ring_kernel(name = "double", gpu)]
fn double(_ctx: &mut KernelContext<'_>, m: Job) -> Option<Job> {
    Some(Job { value: m.value * 2.0, ..m })
}

fn main() {}
