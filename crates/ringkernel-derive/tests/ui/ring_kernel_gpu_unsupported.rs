use ringkernel_core::context::KernelContext;
use ringkernel_derive::{ring_kernel, GpuType, RingMessage};

#[derive(Clone, Copy, Default, RingMessage, GpuType)]
#[message(type_id = 1)]
#[repr(C)]
struct Job {
    id: u64,
    value: f32,
    pad: u32,
}

#[ring_kernel(name = "uses_a_vec", gpu)]
fn uses_a_vec(_ctx: &mut KernelContext<'_>, m: Job) -> Option<Job> {
    let v = vec![m.value];
    Some(Job { value: v[0], ..m })
}

#[ring_kernel(name = "publishes", gpu)]
fn publishes(ctx: &mut KernelContext<'_>, m: Job) {
    let _ = ctx.publish("jobs", &m);
}

fn main() {}
