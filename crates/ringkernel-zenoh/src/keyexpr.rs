//! MQTT topics and filters as Zenoh key expressions.
//!
//! RingKernel topics are MQTT topics ([`ringkernel_core::pubsub`]): `/`-separated
//! levels, `+` matching one level, `#` (last) matching the rest including the parent.
//! Zenoh key expressions are `/`-separated chunks, `*` matching one chunk and `**`
//! matching any number of chunks, zero included. The bridge maps one onto the other
//! under a prefix (`<prefix>/topic/...`):
//!
//! | MQTT              | Zenoh                    |
//! |-------------------|--------------------------|
//! | level `+`         | chunk `*`                |
//! | last level `#`    | chunk `**` (`a/#` → `a/**`, which matches `a` as MQTT's does) |
//! | any other level   | the level, escaped (below) |
//!
//! Edge cases, and how they are handled:
//!
//! * **Characters Zenoh reserves.** A level may hold `*`, `$`, `?`, `#`-free text with
//!   `@` or `%` in MQTT, but Zenoh forbids `?` and `#`, gives `*` and `$` a meaning and
//!   treats a chunk starting with `@` as verbatim (never matched by a wildcard). Each of
//!   `* $ ? # @ %` in a level is written `%XX` (its byte in upper-case hex), so the
//!   chunk matches only itself and `%` stays unambiguous.
//! * **Empty levels.** MQTT allows them (`a//b`, `/a`, `a/`); Zenoh forbids empty
//!   chunks. An empty level becomes the chunk `%00` (MQTT forbids NUL in topics, so no
//!   real level escapes to it). `+` still matches it, as in MQTT (`*` matches `%00`).
//! * **`$` topics.** MQTT keeps a filter that starts with a wildcard from matching a
//!   topic that starts with `$` (`#` does not match `$SYS/x`). Zenoh has no such rule:
//!   `**` matches `%24SYS/x`. The mapping is therefore a superset on that one point, and
//!   the receiving bridge never relies on Zenoh's match: it hands every publication to
//!   its runtime's broker, which applies the MQTT rules exactly (the publication reaches
//!   no kernel there, and is counted in [`BridgeStats::topic_unmatched`](crate::BridgeStats)).
//! * Everything else matches exactly: a topic matches a filter in MQTT if and only if
//!   their key expressions intersect (tested over every pair of a set of awkward topics
//!   and filters in this module's tests).

use ringkernel_core::pubsub::{validate_topic, TopicFilter};
use ringkernel_core::{Error, Result};

/// Characters escaped in a level (see the module docs).
const ESCAPED: &[char] = &['*', '$', '?', '#', '@', '%'];

/// Appends one MQTT level as a wildcard-free Zenoh chunk.
fn push_level(out: &mut String, level: &str) {
    if level.is_empty() {
        out.push_str("%00");
        return;
    }
    for c in level.chars() {
        if ESCAPED.contains(&c) {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
}

/// The key expression of a topic name (no wildcards), under `prefix`
/// ([`Error::InvalidArgument`] for an invalid topic, as [`validate_topic`] says).
///
/// ```
/// use ringkernel_zenoh::keyexpr::topic_key;
/// assert_eq!(topic_key("rk/topic", "sensors/room1/temp").unwrap(), "rk/topic/sensors/room1/temp");
/// assert_eq!(topic_key("rk/topic", "/a//b*").unwrap(), "rk/topic/%00/a/%00/b%2A");
/// assert!(topic_key("rk/topic", "a/+").is_err());
/// ```
pub fn topic_key(prefix: &str, topic: &str) -> Result<String> {
    validate_topic(topic)?;
    let mut out = String::with_capacity(prefix.len() + topic.len() + 8);
    out.push_str(prefix);
    for level in topic.split('/') {
        out.push('/');
        push_level(&mut out, level);
    }
    Ok(out)
}

/// The key expression of an MQTT filter, under `prefix` ([`Error::InvalidArgument`]
/// for an invalid filter, as [`TopicFilter::new`] says).
///
/// ```
/// use ringkernel_zenoh::keyexpr::filter_key;
/// assert_eq!(filter_key("rk/topic", "sensors/+/temp").unwrap(), "rk/topic/sensors/*/temp");
/// assert_eq!(filter_key("rk/topic", "sensors/#").unwrap(), "rk/topic/sensors/**");
/// assert_eq!(filter_key("rk/topic", "#").unwrap(), "rk/topic/**");
/// assert!(filter_key("rk/topic", "a/#/b").is_err());
/// ```
pub fn filter_key(prefix: &str, filter: &str) -> Result<String> {
    let filter = TopicFilter::new(filter)?;
    let mut out = String::with_capacity(prefix.len() + filter.as_str().len() + 8);
    out.push_str(prefix);
    for level in filter.as_str().split('/') {
        out.push('/');
        match level {
            "+" => out.push('*'),
            "#" => out.push_str("**"),
            l => push_level(&mut out, l),
        }
    }
    Ok(out)
}

/// Checks a name used as one chunk of the bridge's keys (node names, the prefix's
/// chunks): 1 to 64 characters of `A-Z a-z 0-9 _ - .`.
pub(crate) fn check_chunk(what: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} {s:?} must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '-', '.'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zenoh::key_expr::KeyExpr;

    const PREFIX: &str = "rk/topic";

    fn ke(s: &str) -> KeyExpr<'static> {
        KeyExpr::try_from(s.to_string()).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    const TOPICS: &[&str] = &[
        "a",
        "a/b",
        "a/b/c",
        "a//b",
        "/a",
        "a/",
        "/",
        "//",
        "$SYS/x",
        "$SYS",
        "a/$b",
        "a*b/c",
        "a/**",
        "@a/b",
        "a/@",
        "100%/x",
        "%00",
        "q?/r",
        "sensors/room1/temperature",
        "sensors/room 2/temperature",
        "température/ä",
        "a/b/c/d/e",
    ];

    const FILTERS: &[&str] = &[
        "#",
        "+",
        "a",
        "a/#",
        "a/+",
        "+/+",
        "+/b",
        "a/+/c",
        "a//b",
        "/+",
        "+/",
        "a/b/#",
        "$SYS/#",
        "$SYS",
        "+/$b",
        "a*b/#",
        "@a/+",
        "100%/+",
        "%00",
        "q?/r",
        "sensors/+/temperature",
        "température/+",
        "+/+/+/+/+",
        "/#",
    ];

    #[test]
    fn every_mapped_key_is_a_canonical_zenoh_key_expression() {
        for t in TOPICS {
            let k = topic_key(PREFIX, t).unwrap();
            let parsed = ke(&k);
            assert_eq!(parsed.as_str(), k, "topic {t:?} maps to a canonical key");
            assert!(!k.contains('*'), "topic {t:?} key {k:?} has no wildcard");
        }
        for f in FILTERS {
            let k = filter_key(PREFIX, f).unwrap();
            assert_eq!(ke(&k).as_str(), k, "filter {f:?} maps to a canonical key");
        }
    }

    #[test]
    fn zenoh_matching_equals_mqtt_matching_except_the_dollar_rule() {
        let mut checked = 0;
        for f in FILTERS {
            let filter = TopicFilter::new(f).unwrap();
            let fk = ke(&filter_key(PREFIX, f).unwrap());
            for t in TOPICS {
                let tk = ke(&topic_key(PREFIX, t).unwrap());
                let mqtt = filter.matches(t);
                let zenoh = fk.intersects(&tk);
                let dollar_rule = t.starts_with('$') && (f.starts_with('+') || f.starts_with('#'));
                if dollar_rule {
                    assert!(!mqtt, "MQTT keeps {f:?} out of {t:?}");
                    // Zenoh matches as MQTT would without the rule (documented).
                    let without_rule = filter.matches(&t.replacen('$', "X", 1));
                    assert_eq!(zenoh, without_rule, "filter {f:?} topic {t:?}");
                } else {
                    assert_eq!(mqtt, zenoh, "filter {f:?} topic {t:?}");
                }
                checked += 1;
            }
        }
        assert_eq!(checked, FILTERS.len() * TOPICS.len());
    }

    #[test]
    fn distinct_topics_get_distinct_keys() {
        let mut keys: Vec<String> = TOPICS
            .iter()
            .map(|t| topic_key(PREFIX, t).unwrap())
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), TOPICS.len());
    }

    #[test]
    fn invalid_topics_and_filters_are_errors() {
        for t in ["", "a/+", "#", "a\0b"] {
            assert!(
                matches!(topic_key(PREFIX, t), Err(Error::InvalidArgument(_))),
                "{t:?}"
            );
        }
        for f in ["", "a/#/b", "a+", "#a", "a/b#"] {
            assert!(
                matches!(filter_key(PREFIX, f), Err(Error::InvalidArgument(_))),
                "{f:?}"
            );
        }
    }

    #[test]
    fn chunk_names_are_checked() {
        for ok in ["a", "node-1", "N_2.x", &"z".repeat(64)] {
            assert!(check_chunk("node", ok).is_ok(), "{ok:?}");
        }
        for bad in ["", "a/b", "*", "a b", "$x", "é", &"z".repeat(65)] {
            assert!(check_chunk("node", bad).is_err(), "{bad:?}");
        }
    }
}
