use ringkernel_core::message::MessageId;
use ringkernel_derive::RingMessage;

#[derive(RingMessage)]
#[message(type_id = 1)]
struct TwoIds {
    #[message(id)]
    first: MessageId,
    #[message(id)]
    second: MessageId,
    data: Vec<f32>,
}

fn main() {}
