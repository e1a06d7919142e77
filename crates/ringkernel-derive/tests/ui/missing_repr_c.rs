use ringkernel_derive::RingMessage;

#[derive(Clone, Copy, RingMessage)]
#[message(type_id = 1)]
struct NoRepr {
    a: u32,
    b: f32,
}

fn main() {}
