use ringkernel_derive::RingMessage;

#[derive(RingMessage)]
#[message(type_id = 1)]
struct WrongId {
    #[message(id)]
    id: u64,
    data: Vec<f32>,
}

fn main() {}
