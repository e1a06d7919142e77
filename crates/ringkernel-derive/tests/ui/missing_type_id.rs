use ringkernel_derive::RingMessage;

#[derive(Clone, Copy, RingMessage)]
#[repr(C)]
struct NoId {
    a: u32,
}

fn main() {}
