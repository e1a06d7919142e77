//! Topic filters and the broker, checked against the examples of the MQTT 3.1.1 and 5.0
//! specifications (section 4.7, "Topic Names and Topic Filters").
//!
//! Run: `cargo test -p ringkernel-core --test pubsub`.

use ringkernel_core::pubsub::{validate_topic, Broker, TopicFilter};
use ringkernel_core::runtime::KernelId;
use ringkernel_core::Error;

fn m(filter: &str, topic: &str) -> bool {
    TopicFilter::new(filter).unwrap().matches(topic)
}

#[test]
fn multi_level_wildcard() {
    for t in [
        "sport/tennis/player1",
        "sport/tennis/player1/ranking",
        "sport/tennis/player1/score/wimbledon",
    ] {
        assert!(m("sport/tennis/player1/#", t), "{t}");
    }
    assert!(!m("sport/tennis/player1/#", "sport/tennis/player2"));
    assert!(m("sport/#", "sport"), "# includes the parent level");
    for t in ["sport", "a/b/c", "/finance", "/", "x"] {
        assert!(m("#", t), "{t}");
    }
}

#[test]
fn single_level_wildcard() {
    assert!(m("sport/tennis/+", "sport/tennis/player1"));
    assert!(m("sport/tennis/+", "sport/tennis/player2"));
    assert!(!m("sport/tennis/+", "sport/tennis/player1/ranking"));
    assert!(!m("sport/+", "sport"));
    assert!(m("sport/+", "sport/"));
    assert!(m("+/+", "/finance"));
    assert!(m("/+", "/finance"));
    assert!(!m("+", "/finance"));
    assert!(m("+/tennis/#", "sport/tennis/player1"));
    assert!(m("sport/+/player1", "sport/tennis/player1"));
}

#[test]
fn invalid_filters() {
    for f in [
        "sport/tennis#",
        "sport/tennis/#/ranking",
        "sport+",
        "",
        "#/a",
        "a/b+/c",
        "a/##",
    ] {
        assert!(
            matches!(TopicFilter::new(f), Err(Error::InvalidArgument(_))),
            "{f:?}"
        );
    }
    for f in [
        "+",
        "#",
        "+/tennis/#",
        "sport/+/player1",
        "/",
        "a//b",
        "sport/",
    ] {
        assert!(TopicFilter::new(f).is_ok(), "{f:?}");
    }
}

#[test]
fn dollar_topics() {
    assert!(!m("#", "$SYS/broker/clients"));
    assert!(!m("+/monitor/Clients", "$SYS/monitor/Clients"));
    assert!(m("$SYS/#", "$SYS/monitor/Clients"));
    assert!(m("$SYS/monitor/+", "$SYS/monitor/Clients"));
    assert!(!m("+", "$SYS"));
}

#[test]
fn topic_names() {
    for t in ["sport/tennis/+", "sport/#", "+", "#", ""] {
        assert!(
            matches!(validate_topic(t), Err(Error::InvalidArgument(_))),
            "{t:?}"
        );
    }
    // Empty levels are valid, and so are a leading or trailing separator.
    for t in ["a//b", "/", "/finance", "sport/", "$SYS/x"] {
        assert!(validate_topic(t).is_ok(), "{t:?}");
    }
    assert!(validate_topic("a\0b").is_err());
    assert!(m("a//b", "a//b"));
    assert!(m("a/+/b", "a//b"));
    assert!(!m("a/b", "a//b"));
    // A topic with a wildcard matches nothing, not even `#`.
    assert!(!m("#", "sport/+"));
    // Matching is case-sensitive and exact per level.
    assert!(!m("Sport", "sport"));
    assert!(!m("sport", "sport "));
}

#[test]
fn broker_subscribe_unsubscribe() {
    let b = Broker::new();
    let k1 = KernelId(1);
    let k2 = KernelId(2);
    let k3 = KernelId(3);
    let s3 = b.subscribe("sport/tennis/+", k3).unwrap();
    let s1 = b.subscribe("sport/#", k1).unwrap();
    let s2 = b.subscribe("sport/tennis/player1", k2).unwrap();
    // k1 twice through different filters: listed once.
    b.subscribe("+/tennis/player1", k1).unwrap();
    assert_eq!(
        b.subscribers("sport/tennis/player1").unwrap(),
        vec![k1, k2, k3]
    );
    assert_eq!(b.subscribers("sport").unwrap(), vec![k1]);
    assert!(b.subscribers("music").unwrap().is_empty());
    assert!(matches!(
        b.subscribers("sport/#"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.subscribe("bad#", k1),
        Err(Error::InvalidArgument(_))
    ));

    // The same kernel and filter again: the existing subscription.
    assert_eq!(b.subscribe("sport/tennis/+", k3).unwrap(), s3);
    assert_eq!(b.subscriptions().len(), 4);

    b.unsubscribe(s2).unwrap();
    assert_eq!(
        b.unsubscribe(s2).unwrap_err(),
        Error::InvalidArgument(format!("no subscription with id {}", s2.0))
    );
    assert_eq!(b.subscribers("sport/tennis/player1").unwrap(), vec![k1, k3]);

    b.remove_kernel(k1);
    assert_eq!(b.subscribers("sport/tennis/player1").unwrap(), vec![k3]);
    assert!(b.subscriptions().iter().all(|(_, _, k)| *k != k1));
    assert!(matches!(b.unsubscribe(s1), Err(Error::InvalidArgument(_))));
    let subs = b.subscriptions();
    assert_eq!(subs, vec![(s3, "sport/tennis/+".to_string(), k3)]);
}

#[test]
fn broker_is_usable_from_threads() {
    let b = std::sync::Arc::new(Broker::new());
    let hs: Vec<_> = (0..4u32)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    b.subscribe(&format!("t{t}/{i}"), KernelId(t + 1)).unwrap();
                    assert!(b
                        .subscribers(&format!("t{t}/{i}"))
                        .unwrap()
                        .contains(&KernelId(t + 1)));
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(b.subscriptions().len(), 800);
    let ids: std::collections::HashSet<_> =
        b.subscriptions().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(ids.len(), 800, "subscription ids are unique");
}
