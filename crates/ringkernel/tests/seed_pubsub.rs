//! The seed README's "Pub/Sub Messaging" example, compiled as written after
//! `use ringkernel::prelude::*;` and run.
//!
//! The fragment presumes `kernel_id`, `sender`, `envelope` and `timestamp`. Its broker
//! is standalone (attached to no runtime): publications wait in a bounded mailbox per
//! subscriber until the program takes them. The other tests cover the wildcards, bad
//! topics and filters, full mailboxes, and a runtime's own broker, which delivers into
//! kernel input queues.

use ringkernel::core::message::flags;
use ringkernel::prelude::*;
use std::time::Duration;

/// The fragment, unchanged. Its two `subscribe` calls ignore the `Result` they return
/// (a filter can be invalid, so ours returns one): hence the `allow`.
#[allow(unused_must_use)]
fn pubsub_example(
    kernel_id: KernelId,
    sender: KernelId,
    envelope: Envelope,
    timestamp: HlcTimestamp,
) -> Result<PubSubBroker, Box<dyn std::error::Error>> {
    let broker = PubSubBroker::new(PubSubConfig::default());

    broker.subscribe(kernel_id, Topic::new("sensors/+/temperature"));
    broker.subscribe(kernel_id, Topic::new("events/#"));

    broker.publish(
        Topic::new("sensors/room1/temperature"),
        sender,
        envelope,
        timestamp,
    )?;
    Ok(broker)
}

#[test]
fn pubsub_example_runs_as_written() {
    let kernel_id = KernelId(4);
    let sender = KernelId(9);
    let clock = HlcClock::new(11);
    let timestamp = clock.tick();
    let envelope = Envelope::new(&Token::new(1, 21.5));
    let broker = pubsub_example(kernel_id, sender, envelope, timestamp).expect("the example");

    // Both subscriptions exist.
    let filters: Vec<String> = broker.subscriptions().into_iter().map(|s| s.1).collect();
    assert_eq!(filters, ["sensors/+/temperature", "events/#"]);
    // One publication matched (the `+` filter), once.
    assert_eq!(broker.pending(kernel_id), 1);
    let got = broker.take(kernel_id).unwrap();
    assert_eq!(got.len(), 1);
    let p = &got[0];
    assert_eq!(p.topic, Topic::new("sensors/room1/temperature"));
    assert_eq!(p.envelope.decode::<Token>().unwrap().value, 21.5);
    assert_eq!(p.envelope.header.source_kernel, sender.0);
    assert_eq!(p.envelope.header.hlc(), timestamp);
    assert_ne!(p.envelope.header.flags & flags::PUBSUB, 0);
    assert_eq!(broker.overflowed(kernel_id), 0);
    assert!(broker.take(kernel_id).unwrap().is_empty(), "taken once");
    assert!(!broker.is_attached());
}

fn token(v: f64) -> Envelope {
    Envelope::new(&Token::new(0, v))
}

#[test]
fn wildcards_match_as_in_mqtt() {
    let clock = HlcClock::new(1);
    let broker = PubSubBroker::new(PubSubConfig::default());
    let (plus, hash, exact) = (KernelId(1), KernelId(2), KernelId(3));
    broker
        .subscribe(plus, Topic::new("sensors/+/temperature"))
        .unwrap();
    broker.subscribe(hash, Topic::new("events/#")).unwrap();
    broker.subscribe(exact, Topic::new("events/door")).unwrap();
    // Subscribing again to the same filter is the same subscription.
    let a = broker.subscribe(hash, Topic::new("events/#")).unwrap();
    let b = broker.subscribe(hash, Topic::new("events/#")).unwrap();
    assert_eq!(a, b);

    let publish = |t: &str| {
        broker
            .publish(Topic::new(t), KernelId::HOST, token(1.0), clock.tick())
            .unwrap()
            .delivered
    };
    assert_eq!(publish("sensors/room1/temperature"), 1);
    assert_eq!(publish("sensors/room1/humidity"), 0);
    assert_eq!(publish("sensors/a/b/temperature"), 0, "+ is one level");
    assert_eq!(publish("events"), 1, "# also matches the parent level");
    assert_eq!(publish("events/door"), 2);
    assert_eq!(publish("events/door/left"), 1);
    assert_eq!(broker.pending(plus), 1);
    assert_eq!(broker.pending(hash), 3);
    assert_eq!(broker.pending(exact), 1);
}

#[test]
fn invalid_topics_and_filters_are_typed_errors() {
    let clock = HlcClock::new(1);
    let broker = PubSubBroker::new(PubSubConfig::default());
    for bad in ["", "a/#/b", "a/b#", "sensors/+x", "a\0b"] {
        let err = broker.subscribe(KernelId(1), Topic::new(bad)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err}");
    }
    assert!(broker.subscriptions().is_empty());
    for bad in ["", "a/+", "a/#", "a\0"] {
        let err = broker
            .publish(Topic::new(bad), KernelId::HOST, token(1.0), clock.tick())
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err}");
    }
    let id = broker.subscribe(KernelId(1), Topic::new("a")).unwrap();
    broker.unsubscribe(id).unwrap();
    assert!(matches!(
        broker.unsubscribe(id),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn a_full_mailbox_counts_what_it_could_not_keep() {
    let clock = HlcClock::new(1);
    let broker = PubSubBroker::new(PubSubConfig::default().with_mailbox_capacity(2));
    let (k, other) = (KernelId(1), KernelId(2));
    broker.subscribe(k, Topic::new("t")).unwrap();
    broker.subscribe(other, Topic::new("t")).unwrap();
    for i in 0..5 {
        let report = broker
            .publish(
                Topic::new("t"),
                KernelId::HOST,
                token(i as f64),
                clock.tick(),
            )
            .unwrap();
        if i < 2 {
            assert_eq!((report.delivered, report.queue_full.len()), (2, 0));
        } else {
            assert_eq!(report.delivered, 0);
            assert_eq!(report.queue_full, [k, other]);
        }
    }
    assert_eq!(broker.overflowed(k), 3);
    // The oldest ones were kept, in order; taking them makes room again.
    let kept: Vec<f64> = broker
        .take(k)
        .unwrap()
        .iter()
        .map(|p| p.envelope.decode::<Token>().unwrap().value)
        .collect();
    assert_eq!(kept, [0.0, 1.0]);
    let report = broker
        .publish(Topic::new("t"), KernelId::HOST, token(9.0), clock.tick())
        .unwrap();
    assert_eq!(report.delivered, 1);
    assert_eq!(report.queue_full, [other]);
    assert_eq!(broker.overflowed(other), 4);

    // Capacity 0 keeps nothing and counts everything.
    let none = PubSubBroker::new(PubSubConfig::default().with_mailbox_capacity(0));
    none.subscribe(k, Topic::new("t")).unwrap();
    let r = none
        .publish(Topic::new("t"), KernelId::HOST, token(1.0), clock.tick())
        .unwrap();
    assert_eq!(
        (r.delivered, none.pending(k), none.overflowed(k)),
        (0, 0, 1)
    );
}

#[tokio::test]
async fn a_runtimes_broker_delivers_into_kernel_queues() {
    let runtime = CpuRuntime::new().await.unwrap();
    let broker = runtime.pubsub();
    assert!(broker.is_attached());
    let kernel = runtime
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_name("seed.pubsub.echo"),
        )
        .await
        .unwrap();
    broker
        .subscribe(kernel.id(), Topic::new("sensors/+/temperature"))
        .unwrap();
    let remote = HlcClock::new(77).tick();
    let report = broker
        .publish(
            Topic::new("sensors/room1/temperature"),
            KernelId::HOST,
            token(4.0),
            remote,
        )
        .unwrap();
    assert_eq!(report.delivered, 1);
    // The kernel handled it: echo doubles the value.
    let reply: Token = kernel
        .receive_envelope(Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!(reply.value, 8.0);
    // The runtime's clock merged the publication's timestamp.
    assert!(runtime.core().hlc().peek() > remote);
    // The same subscriptions as the runtime's own API.
    assert_eq!(runtime.core().broker().subscriptions().len(), 1);
    // Non-matching topics reach nobody.
    let r = broker
        .publish(
            Topic::new("sensors/room1/humidity"),
            KernelId::HOST,
            token(1.0),
            remote,
        )
        .unwrap();
    assert_eq!(r.delivered, 0);

    // Bad inputs on an attached broker.
    assert!(matches!(
        broker.subscribe(KernelId(9_999), Topic::new("a")),
        Err(Error::KernelNotFound(_))
    ));
    assert!(matches!(
        broker.publish(Topic::new("a"), KernelId(9_999), token(1.0), remote),
        Err(Error::KernelNotFound(_))
    ));
    assert!(matches!(
        broker.take(kernel.id()),
        Err(Error::InvalidArgument(_))
    ));
    let far = HlcTimestamp::new(u64::MAX >> 21, 0);
    assert!(matches!(
        broker.publish(
            Topic::new("sensors/x/temperature"),
            KernelId::HOST,
            token(1.0),
            far
        ),
        Err(Error::ClockDrift { .. })
    ));
    // A kernel's subscriptions end with it.
    kernel.terminate().await.unwrap();
    assert!(broker.subscriptions().is_empty());
    let r = broker
        .publish(
            Topic::new("sensors/room1/temperature"),
            KernelId::HOST,
            token(1.0),
            remote,
        )
        .unwrap();
    assert_eq!(r, PublishReport::default());
    runtime.shutdown().await.unwrap();
}
