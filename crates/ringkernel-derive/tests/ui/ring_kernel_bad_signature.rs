use ringkernel_derive::ring_kernel;

#[ring_kernel(name = "lonely")]
fn lonely(value: u32) -> Option<u32> {
    Some(value)
}

fn main() {}
