use ringkernel_derive::RingMessage;

#[derive(RingMessage)]
#[message(type_id = 1)]
struct Generic<T> {
    data: Vec<T>,
}

fn main() {}
