use ringkernel_derive::RingMessage;

#[derive(Clone, Copy, RingMessage)]
#[message(type_id = 2)]
#[repr(C)]
struct Padded {
    small: u8,
    big: u64,
}

fn main() {}
