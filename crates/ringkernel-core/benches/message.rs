//! The cost of an rkyv message beside a plain-data one of the same payload size.
//!
//! * `slot_round_trip`: encode + write into a slot + read the slot + decode, for a
//!   `#[repr(C)]` message (64 payload bytes: the value's own bytes) and an rkyv message
//!   whose archive is the same size (a `Vec<f32>` and a `String`).
//! * `read`: given a received envelope, the archived (zero-copy, validated) view
//!   against the full deserialisation, and the plain-data decode.
//!
//! ```text
//! cargo bench -p ringkernel-core --bench message -- --warm-up-time 1 --measurement-time 3
//! ```

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringkernel_core::message::{
    read_slot, write_slot, Envelope, MessageHeader, MessageId, RingMessage, DEFAULT_SLOT_SIZE,
};
use ringkernel_derive::RingMessage;
use std::hint::black_box;

/// 64 bytes of plain data.
#[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
#[message(type_id = 0xBE00_0001)]
#[repr(C)]
struct PlainMsg {
    #[message(id)]
    id: MessageId,
    values: [f32; 14],
}

/// The same information, variable size.
#[derive(Clone, Debug, PartialEq, RingMessage)]
#[message(type_id = 0xBE00_0002)]
struct RkyvMsg {
    #[message(id)]
    id: MessageId,
    label: String,
    values: Vec<f32>,
}

fn plain() -> PlainMsg {
    PlainMsg {
        id: MessageId(0),
        values: std::array::from_fn(|i| i as f32),
    }
}

/// An rkyv message whose archive is exactly as large as `PlainMsg` (checked).
fn rkyv_same_size() -> RkyvMsg {
    let target = std::mem::size_of::<PlainMsg>();
    for n in 0..16 {
        for label in 0..16 {
            let m = RkyvMsg {
                id: MessageId(0),
                label: "x".repeat(label),
                values: (0..n).map(|i| i as f32).collect(),
            };
            if Envelope::new(&m).payload.len() == target {
                return m;
            }
        }
    }
    panic!("no rkyv message of {target} bytes found");
}

/// encode + write_slot + read_slot + decode, as a send and a receive do.
fn round_trip<M: RingMessage>(msg: &M, slot: &mut [u8]) -> M {
    let payload = msg.encode_payload().expect("encode");
    let mut h = MessageHeader::new(M::TYPE_ID, payload.len());
    h.flags |= M::header_flags();
    h.message_id = 7;
    write_slot(slot, &h, &payload).expect("write");
    let env = read_slot(slot).expect("read");
    env.decode::<M>().expect("decode")
}

fn bench_round_trip(c: &mut Criterion) {
    let p = plain();
    let r = rkyv_same_size();
    let mut slot = vec![0u8; DEFAULT_SLOT_SIZE];
    // Both carry the same number of payload bytes.
    assert_eq!(
        Envelope::new(&p).payload.len(),
        Envelope::new(&r).payload.len()
    );
    assert_eq!(round_trip(&r, &mut slot).values, r.values);
    let mut g = c.benchmark_group("message_slot_round_trip");
    g.throughput(Throughput::Elements(1));
    g.bench_function("plain_64B", |b| {
        b.iter(|| black_box(round_trip(black_box(&p), &mut slot)))
    });
    g.bench_function("rkyv_64B", |b| {
        b.iter(|| black_box(round_trip(black_box(&r), &mut slot)))
    });
    g.finish();
}

fn bench_read(c: &mut Criterion) {
    let env = Envelope::new(&rkyv_same_size());
    let plain_env = Envelope::new(&plain());
    let mut g = c.benchmark_group("message_read");
    g.throughput(Throughput::Elements(1));
    g.bench_function("rkyv_archived_view", |b| {
        b.iter(|| {
            let a = black_box(&env).archived::<RkyvMsg>().expect("archived");
            black_box(a.values.len())
        })
    });
    g.bench_function("rkyv_deserialise", |b| {
        b.iter(|| black_box(black_box(&env).decode::<RkyvMsg>().expect("decode")))
    });
    g.bench_function("plain_decode", |b| {
        b.iter(|| black_box(black_box(&plain_env).decode::<PlainMsg>().expect("decode")))
    });
    g.finish();
}

criterion_group!(benches, bench_round_trip, bench_read);
criterion_main!(benches);
