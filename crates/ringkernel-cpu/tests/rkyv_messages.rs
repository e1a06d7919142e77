//! Variable-size messages: `#[derive(RingMessage)]` on structs without `#[repr(C)]`
//! (rkyv archives), `#[message(id)]`, bad payloads, and a round trip through the CPU
//! runtime with typed and archived handlers.

use ringkernel_core::context::KernelContext;
use ringkernel_core::k2k::K2kReceipt;
use ringkernel_core::message::{
    flags, read_slot, write_slot, Encoding, Envelope, MessageHeader, MessageId, RingMessage,
    DEFAULT_SLOT_SIZE, HEADER_SIZE,
};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::{archived_fn, KernelRegistry};
use ringkernel_core::rkyv::{self, Archived};
use ringkernel_core::runtime::{RingKernelRuntime, RuntimeExt};
use ringkernel_core::Error;
use ringkernel_cpu::CpuRuntime;
use ringkernel_derive::{ring_kernel, RingMessage};
use std::time::Duration;

/// A nested struct: derives rkyv itself through the re-export.
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(crate = ringkernel_core::rkyv)]
struct Meta {
    source: String,
    scale: Option<f32>,
}

#[derive(Debug, Clone, PartialEq, RingMessage)]
#[message(type_id = 0x0E00_0001)]
struct Samples {
    #[message(id)]
    id: MessageId,
    label: String,
    data: Vec<f32>,
    meta: Meta,
}

#[derive(Debug, Clone, PartialEq, RingMessage)]
#[message(type_id = 0x0E00_0002, name = "summary")]
struct Summary {
    #[message(id)]
    id: MessageId,
    label: String,
    sum: f32,
    count: u32,
    tags: Vec<String>,
}

/// A tuple struct, nesting another rkyv message.
#[derive(Debug, Clone, PartialEq, RingMessage)]
#[message(type_id = 0x0E00_0003)]
struct Wrapped(Summary, Option<Box<Meta>>);

/// A plain-data message with an id field.
#[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
#[message(type_id = 0x0E00_0004)]
#[repr(C)]
struct Plain {
    #[message(id)]
    id: MessageId,
    value: f64,
}

fn samples(n: usize) -> Samples {
    Samples {
        id: MessageId::default(),
        label: "probe".into(),
        data: (0..n).map(|i| i as f32 * 0.5).collect(),
        meta: Meta {
            source: "sensor-7".into(),
            scale: Some(2.0),
        },
    }
}

#[test]
fn encodings_and_flags() {
    assert_eq!(Samples::encoding(), Encoding::Rkyv);
    assert_eq!(Plain::encoding(), Encoding::Plain);
    assert_eq!(Summary::NAME, "summary");
    let env = Envelope::new(&samples(4));
    assert_eq!(env.header.flags & flags::RKYV, flags::RKYV);
    assert_eq!(env.encoding(), Encoding::Rkyv);
    assert_eq!(env.header.type_id, Samples::TYPE_ID);
    assert_eq!(env.header.payload_len as usize, env.payload.len());
    let env = Envelope::new(&Plain {
        id: MessageId(3),
        value: 1.0,
    });
    assert_eq!(env.header.flags & flags::RKYV, 0);
    assert_eq!(env.payload.len(), 16);
}

#[test]
fn rkyv_message_round_trips_through_a_slot() {
    let m = samples(10);
    let mut env = Envelope::new(&m);
    env.header.message_id = 77;
    env.header.flags |= flags::CHECKSUM;
    let mut slot = vec![0u8; DEFAULT_SLOT_SIZE];
    write_slot(&mut slot, &env.header, &env.payload).unwrap();
    let back = read_slot(&slot).unwrap();
    let decoded: Samples = back.decode().unwrap();
    assert_eq!(
        decoded.id,
        MessageId(77),
        "the id field comes from the header"
    );
    assert_eq!(decoded.label, m.label);
    assert_eq!(decoded.data, m.data);
    assert_eq!(decoded.meta, m.meta);

    // Zero-copy view of the same bytes.
    let a = back.archived::<Samples>().unwrap();
    assert_eq!(a.label, "probe");
    assert_eq!(a.data.len(), 10);
    assert_eq!(a.data[3].to_native(), 1.5);
    assert_eq!(a.meta.source, "sensor-7");
    assert_eq!(a.meta.scale.as_ref().map(|s| s.to_native()), Some(2.0));
}

#[test]
fn tuple_struct_with_nested_message_round_trips() {
    let w = Wrapped(
        Summary {
            id: MessageId(1),
            label: "x".into(),
            sum: 4.5,
            count: 2,
            tags: vec!["a".into(), "bc".into()],
        },
        Some(Box::new(Meta {
            source: "s".into(),
            scale: None,
        })),
    );
    let back: Wrapped = Envelope::new(&w).decode().unwrap();
    assert_eq!(back, w);
    let none = Wrapped(w.0.clone(), None);
    assert_eq!(Envelope::new(&none).decode::<Wrapped>().unwrap(), none);
}

#[test]
fn plain_message_id_field_is_set_on_decode() {
    let mut env = Envelope::new(&Plain {
        id: MessageId(0),
        value: 2.5,
    });
    env.header.message_id = 1234;
    let p: Plain = env.decode().unwrap();
    assert_eq!(
        p,
        Plain {
            id: MessageId(1234),
            value: 2.5
        }
    );
}

#[test]
fn truncated_archive_is_a_decode_error() {
    let env = Envelope::new(&samples(8));
    for cut in [0, 1, env.payload.len() / 2, env.payload.len() - 1] {
        let mut bad = env.clone();
        bad.payload.truncate(cut);
        bad.header.payload_len = cut as u32;
        assert!(
            matches!(
                bad.decode::<Samples>(),
                Err(Error::Decode {
                    type_name: "Samples",
                    ..
                })
            ),
            "cut at {cut}: {:?}",
            bad.decode::<Samples>()
        );
        assert!(matches!(
            bad.archived::<Samples>(),
            Err(Error::Decode { .. })
        ));
    }
}

#[test]
fn corrupted_archive_is_an_error_never_ub() {
    let env = Envelope::new(&samples(8));
    // The root object sits at the end of the archive: overwrite it (relative pointers
    // and lengths of the String and Vec fields) with garbage.
    let root = std::mem::size_of::<Archived<Samples>>();
    let n = env.payload.len();
    let mut bad = env.clone();
    for b in &mut bad.payload[n - root..] {
        *b = 0xFF;
    }
    assert!(matches!(bad.decode::<Samples>(), Err(Error::Decode { .. })));
    // Flip every byte in turn: validation either accepts the bytes (a changed float,
    // say) or refuses them with a typed error; nothing panics, and flips inside the
    // root's pointers are caught.
    let mut refused = 0;
    for i in 0..n {
        let mut bad = env.clone();
        bad.payload[i] ^= 0xA5;
        match bad.decode::<Samples>() {
            Ok(_) => {}
            Err(Error::Decode { .. }) => refused += 1,
            Err(e) => panic!("unexpected error kind at byte {i}: {e}"),
        }
    }
    assert!(refused > 0, "no flipped byte was refused");
}

#[test]
fn wrong_encoding_flag_is_a_typed_error() {
    // An rkyv payload without the RKYV flag.
    let mut env = Envelope::new(&samples(2));
    env.header.flags &= !flags::RKYV;
    assert!(matches!(
        env.decode::<Samples>(),
        Err(Error::EncodingMismatch {
            type_id: 0x0E00_0001,
            ..
        })
    ));
    assert!(matches!(
        env.archived::<Samples>(),
        Err(Error::EncodingMismatch { .. })
    ));
    // A plain-data payload flagged RKYV.
    let mut env = Envelope::new(&Plain {
        id: MessageId(0),
        value: 1.0,
    });
    env.header.flags |= flags::RKYV;
    assert!(matches!(
        env.decode::<Plain>(),
        Err(Error::EncodingMismatch { .. })
    ));
    // Another type id stays a type mismatch.
    let env = Envelope::new(&samples(2));
    assert_eq!(
        env.decode::<Summary>(),
        Err(Error::TypeMismatch {
            expected: Summary::TYPE_ID,
            found: Samples::TYPE_ID
        })
    );
}

#[test]
fn too_large_for_the_slot() {
    let env = Envelope::new(&samples(100));
    assert!(env.payload.len() > DEFAULT_SLOT_SIZE - HEADER_SIZE);
    let mut slot = vec![0u8; DEFAULT_SLOT_SIZE];
    assert!(matches!(
        write_slot(&mut slot, &env.header, &env.payload),
        Err(Error::MessageTooLarge { .. })
    ));
    assert!(matches!(
        env.check_fits(DEFAULT_SLOT_SIZE),
        Err(Error::MessageTooLarge { .. })
    ));
    // A bigger slot takes it.
    let mut slot = vec![0u8; 1024];
    write_slot(&mut slot, &env.header, &env.payload).unwrap();
    assert_eq!(
        read_slot(&slot)
            .unwrap()
            .decode::<Samples>()
            .unwrap()
            .data
            .len(),
        100
    );
}

#[test]
fn header_without_rkyv_flag_from_bytes_is_plain() {
    let env = Envelope::from_bytes(5, &[1, 2, 3]);
    assert_eq!(env.encoding(), Encoding::Plain);
    let mut h = MessageHeader::new(5, 3);
    h.flags |= flags::RKYV;
    assert_eq!(Encoding::of(&h), Encoding::Rkyv);
}

/// Reads the samples (deserialised), replies with an rkyv summary.
#[ring_kernel(name = "rkyv.summarise")]
fn summarise(_ctx: &mut KernelContext<'_>, s: Samples) -> Option<Summary> {
    Some(Summary {
        id: s.id,
        label: format!("{}@{}", s.label, s.meta.source),
        sum: s.data.iter().sum::<f32>() * s.meta.scale.unwrap_or(1.0),
        count: s.data.len() as u32,
        tags: vec![s.id.to_string()],
    })
}

/// Reads the archived form in place (no deserialisation), replies with plain data.
#[ring_kernel(name = "rkyv.archived_sum")]
fn archived_sum(_ctx: &mut KernelContext<'_>, s: &Archived<Samples>) -> Option<Plain> {
    let sum: f32 = s.data.iter().map(|x| x.to_native()).sum();
    Some(Plain {
        id: MessageId(0),
        value: f64::from(sum) + s.label.len() as f64,
    })
}

/// Stateful, archived: counts the elements seen so far.
#[ring_kernel(name = "rkyv.running_count")]
fn running_count(
    _ctx: &mut KernelContext<'_>,
    seen: &mut u64,
    s: &Archived<Samples>,
) -> Option<Plain> {
    *seen += s.data.len() as u64;
    Some(Plain {
        id: MessageId(0),
        value: *seen as f64,
    })
}

/// Forwards the samples, K2K, to the kernel named `rkyv.last` (an rkyv message through
/// `send_to`).
#[ring_kernel(name = "rkyv.forward")]
fn forward(ctx: &mut KernelContext<'_>, s: Samples) -> ringkernel_core::Result<()> {
    match ctx.send_to("rkyv.last", &s)? {
        K2kReceipt::Delivered => Ok(()),
        other => Err(Error::invalid(format!("forward: {other:?}"))),
    }
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rkyv_messages_through_the_cpu_runtime() {
    let rt = CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap();
    let k = rt
        .launch("rkyv.summarise", LaunchOptions::default())
        .await
        .unwrap();
    let m = samples(12);
    let expected_sum: f32 = m.data.iter().sum::<f32>() * 2.0;
    let reply: Summary = k.call(m.clone(), WAIT).await.unwrap();
    assert_eq!(reply.label, "probe@sensor-7");
    assert_eq!(reply.sum, expected_sum);
    assert_eq!(reply.count, 12);
    // The handler saw the id the request travelled with, and the reply's id field is
    // the reply's own id (set from its header on receive).
    assert_ne!(reply.id, MessageId(0));
    assert_ne!(reply.tags[0], MessageId(0).to_string());

    // send + receive (typed and as an envelope, then zero-copy).
    let sent = k.send(m.clone()).await.unwrap();
    let env = k.receive_timeout(WAIT).await.unwrap();
    assert_eq!(env.header.correlation_id, sent);
    assert_eq!(env.encoding(), Encoding::Rkyv);
    let archived = env.archived::<Summary>().unwrap();
    assert_eq!(archived.count.to_native(), 12);
    assert_eq!(archived.tags[0], MessageId(sent).to_string().as_str());
    k.try_send(&m).unwrap();
    let s: Summary = k.receive_timeout_as(WAIT).await.unwrap();
    assert_eq!(s.count, 12);
    // send_envelope keeps the RKYV flag, by value or by reference.
    let env = Envelope::new(&m);
    k.send_envelope(&env).await.unwrap();
    k.send_envelope(env).await.unwrap();
    for _ in 0..2 {
        let s: Summary = k.receive_timeout_as(WAIT).await.unwrap();
        assert_eq!(s.sum, expected_sum);
    }

    // Too large for the kernel's slots: refused before it enters the queue.
    let err = k.send(samples(500)).await.unwrap_err();
    assert!(matches!(err, Error::MessageTooLarge { .. }), "{err}");
    // A corrupted archive sent raw is dropped by the handler (typed error), counted.
    let mut bad = Envelope::new(&m);
    let n = bad.payload.len();
    let root = std::mem::size_of::<Archived<Samples>>();
    bad.payload[n - root..].fill(0xFF);
    let before = k.metrics().dropped;
    k.send_envelope(&bad).await.unwrap();
    let reply: Summary = k.call(m.clone(), WAIT).await.unwrap();
    assert_eq!(reply.count, 12, "the kernel goes on after a bad archive");
    assert_eq!(k.metrics().dropped, before + 1);

    // The archived handler.
    let a = rt
        .launch("rkyv.archived_sum", LaunchOptions::default())
        .await
        .unwrap();
    let p: Plain = a.call(m.clone(), WAIT).await.unwrap();
    assert_eq!(p.value, f64::from(m.data.iter().sum::<f32>()) + 5.0);
    assert_ne!(p.id, MessageId(0), "set from the reply's header");
    // A plain message to the archived handler is dropped, not misread.
    let before = a.metrics().dropped;
    assert!(a
        .call::<Plain, Plain>(
            Plain {
                id: MessageId(0),
                value: 1.0
            },
            Duration::from_millis(200)
        )
        .await
        .is_err());
    assert_eq!(a.metrics().dropped, before + 1);

    // The stateful archived handler keeps its state across messages.
    let c = rt
        .launch("rkyv.running_count", LaunchOptions::default())
        .await
        .unwrap();
    for expected in [3.0, 10.0] {
        let n = if expected == 3.0 { 3 } else { 7 };
        let p: Plain = c.call(samples(n), WAIT).await.unwrap();
        assert_eq!(p.value, expected);
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_fn_on_a_registry() {
    let reg = KernelRegistry::new();
    reg.register_cpu("count", || {
        Box::new(archived_fn::<Samples, _, _>(
            |_ctx: &mut KernelContext<'_>, s: &Archived<Samples>| {
                Some(Plain {
                    id: MessageId(0),
                    value: s.data.len() as f64,
                })
            },
        ))
    });
    let rt = CpuRuntime::with_registry(reg).await.unwrap();
    let k = rt.launch("count", LaunchOptions::default()).await.unwrap();
    let p: Plain = k.call(samples(7), WAIT).await.unwrap();
    assert_eq!(p.value, 7.0);
    rt.shutdown().await.unwrap();
}

/// The send futures of rkyv messages can be spawned on a multi-threaded executor
/// (checked at compile time).
#[allow(dead_code)]
fn send_futures_are_send(k: &ringkernel_core::runtime::KernelHandle, m: Samples) {
    fn is_send<T: Send>(_: T) {}
    is_send(k.send(m.clone()));
    is_send(k.call::<Samples, Summary>(m, WAIT));
    is_send(k.send_envelope(Envelope::new(&samples(1))));
    is_send(k.receive_timeout(WAIT));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rkyv_messages_over_k2k_and_pubsub() {
    let rt = CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap();
    let last = rt
        .launch(
            "rkyv.summarise",
            LaunchOptions::default().with_name("rkyv.last"),
        )
        .await
        .unwrap();
    let fwd = rt
        .launch("rkyv.forward", LaunchOptions::default())
        .await
        .unwrap();
    let m = samples(6);
    // K2K: host → forward → (send_to) → last → reply in last's output queue.
    let sent = fwd.send(m.clone()).await.unwrap();
    let env = last.receive_timeout(WAIT).await.unwrap();
    assert_eq!(
        env.header.flags & (flags::REPLY | flags::RKYV),
        flags::REPLY | flags::RKYV
    );
    assert_eq!(env.header.source_kernel, last.id().0);
    assert_eq!(
        env.header.correlation_id, sent,
        "the request's id travels along"
    );
    let s: Summary = env.decode().unwrap();
    assert_eq!(s.count, 6);
    assert_eq!(s.label, "probe@sensor-7");

    // Pub/sub from the host (RuntimeExt::publish) to a subscribed kernel.
    rt.subscribe(last.id(), "samples/#").unwrap();
    let report = rt.publish("samples/a", &samples(4)).unwrap();
    assert_eq!(report.delivered, 1);
    let s: Summary = last.receive_timeout_as(WAIT).await.unwrap();
    assert_eq!(s.count, 4);
    rt.shutdown().await.unwrap();
}
