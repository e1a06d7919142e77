use ringkernel_derive::RingMessage;

#[derive(Clone, Copy, RingMessage)]
#[message(type_id = 3)]
#[repr(C)]
struct HasRef {
    id: u64,
    name: &'static str,
}

fn main() {}
