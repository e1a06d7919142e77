//! What a bridge is told: its node name, where it listens, whom it connects to.

use crate::keyexpr::check_chunk;
use ringkernel_core::{Error, Result};
use std::str::FromStr;
use std::time::Duration;
use zenoh::config::EndPoint;

/// The settings of a [`ZenohBridge`](crate::ZenohBridge).
///
/// Endpoints are explicit Zenoh TCP locators (`tcp/127.0.0.1:7447`,
/// `tcp/[::1]:7447`, `tcp/host.example:7447`). The bridge never scouts by multicast:
/// it talks to the peers it connects to, the peers that connect to it, and the peers
/// those tell it about over the same TCP links (Zenoh's gossip).
///
/// ```
/// use ringkernel_zenoh::BridgeConfig;
/// use std::time::Duration;
/// let config = BridgeConfig::new("gpu-box-1")
///     .listen("tcp/127.0.0.1:7447")
///     .connect("tcp/127.0.0.1:7448")
///     .connect_timeout(Duration::from_secs(2));
/// assert_eq!(config.node(), "gpu-box-1");
/// assert!(BridgeConfig::new("a").listen("tcp/127.0.0.1").validate().is_err()); // no port
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BridgeConfig {
    pub(crate) node: String,
    pub(crate) prefix: String,
    pub(crate) listen: Vec<String>,
    pub(crate) connect: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) ack_timeout: Duration,
    pub(crate) max_payload: usize,
    pub(crate) lease: Option<Duration>,
    pub(crate) imports: Vec<String>,
    pub(crate) close_timeout: Duration,
}

impl BridgeConfig {
    /// A bridge named `node`: the name other runtimes use to address this one
    /// (`kernel@node`). 1 to 64 characters of `A-Z a-z 0-9 _ - .`, unique among the
    /// bridges that talk to each other.
    pub fn new(node: impl Into<String>) -> Self {
        BridgeConfig {
            node: node.into(),
            prefix: "ringkernel".into(),
            listen: Vec::new(),
            connect: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            max_in_flight: 4096,
            ack_timeout: Duration::from_secs(30),
            max_payload: 64 * 1024,
            lease: None,
            imports: Vec::new(),
            close_timeout: Duration::from_secs(2),
        }
    }

    /// This bridge's node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Listens on a TCP endpoint (repeatable). A port another program holds is an
    /// error when the bridge starts.
    pub fn listen(mut self, endpoint: impl Into<String>) -> Self {
        self.listen.push(endpoint.into());
        self
    }

    /// Connects to a peer's TCP endpoint (repeatable). Every one must answer within
    /// [`connect_timeout`](Self::connect_timeout) or the bridge does not start.
    pub fn connect(mut self, endpoint: impl Into<String>) -> Self {
        self.connect.push(endpoint.into());
        self
    }

    /// How long starting waits for each `connect` endpoint (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The first chunk of every Zenoh key the bridge uses (default `ringkernel`):
    /// bridges with different prefixes on one Zenoh network do not see each other.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Most K2K messages to one peer sent and not yet acknowledged (default 4096).
    /// Past it, sends are refused with a full queue ([`K2kReceipt::QueueFull`](ringkernel_core::k2k::K2kReceipt)
    /// for a handler, a wait or [`Error::QueueFull`] for a host send) until receipts
    /// come back.
    pub fn max_in_flight(mut self, messages: usize) -> Self {
        self.max_in_flight = messages;
        self
    }

    /// How long a K2K message may wait for its receipt while its peer stays connected
    /// before it is counted lost (default 30 s).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// Largest K2K payload accepted for a remote kernel (default 64 KiB); the
    /// destination runtime still refuses what does not fit its kernel's slots.
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// How long [`ZenohBridge::close`](crate::ZenohBridge::close) waits for the
    /// receipts of K2K messages in flight before counting them lost (default 2 s).
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// Zenoh's link lease: how long a silent peer (a hung process, a cut cable) is
    /// kept before it is declared gone (Zenoh's default is 10 s). A peer process that
    /// exits or is killed closes its TCP connections and is reported at once.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Imports publications on topics matching the MQTT filter `filter` from the
    /// start (repeatable): as [`ZenohBridge::import_topics`](crate::ZenohBridge::import_topics),
    /// but declared before this node announces itself, so a peer that sees the node
    /// appear already reaches these subscriptions.
    pub fn import_topics(mut self, filter: impl Into<String>) -> Self {
        self.imports.push(filter.into());
        self
    }

    /// Checks everything that can be checked before starting: node name, prefix,
    /// endpoints (parsable, TCP, with a port), limits. [`Error::InvalidArgument`]
    /// naming the culprit.
    pub fn validate(&self) -> Result<()> {
        check_chunk("node name", &self.node)?;
        for chunk in self.prefix.split('/') {
            check_chunk("key prefix chunk", chunk)?;
        }
        for e in self.listen.iter().chain(&self.connect) {
            parse_endpoint(e)?;
        }
        for f in &self.imports {
            ringkernel_core::pubsub::TopicFilter::new(f)?;
        }
        if self.max_in_flight == 0 {
            return Err(Error::invalid("max_in_flight must be at least 1"));
        }
        if self.connect_timeout.is_zero() || self.ack_timeout.is_zero() {
            return Err(Error::invalid("timeouts must be longer than zero"));
        }
        if self.max_payload == 0 || self.max_payload > u32::MAX as usize {
            return Err(Error::invalid("max_payload must be 1 to 2^32-1 bytes"));
        }
        if matches!(self.lease, Some(l) if l < Duration::from_millis(100)) {
            return Err(Error::invalid("lease must be at least 100 ms"));
        }
        Ok(())
    }

    /// The Zenoh configuration: peer mode, no multicast scouting, the endpoints, and
    /// `exit_on_failure` for both listening and connecting so that a bad endpoint is an
    /// error of `open`, not a retry loop in the background.
    pub(crate) fn zenoh_config(&self) -> Result<zenoh::Config> {
        self.validate()?;
        let mut c = zenoh::Config::default();
        let list = |v: &[String]| {
            let quoted: Vec<String> = v.iter().map(|e| format!("{e:?}")).collect();
            format!("[{}]", quoted.join(","))
        };
        let timeout_ms = self.connect_timeout.as_millis().min(i64::MAX as u128);
        let mut set = |key: &str, value: String| {
            c.insert_json5(key, &value)
                .map_err(|e| Error::invalid(format!("zenoh configuration {key} = {value}: {e}")))
        };
        set("mode", "\"peer\"".into())?;
        set("scouting/multicast/enabled", "false".into())?;
        set("listen/endpoints", list(&self.listen))?;
        set("listen/exit_on_failure", "true".into())?;
        set("connect/endpoints", list(&self.connect))?;
        set("connect/exit_on_failure", "true".into())?;
        set("connect/timeout_ms", timeout_ms.to_string())?;
        if let Some(lease) = self.lease {
            set("transport/link/tx/lease", lease.as_millis().to_string())?;
        }
        Ok(c)
    }
}

/// Parses one endpoint: a Zenoh locator that this build can use (TCP, with a port).
pub(crate) fn parse_endpoint(e: &str) -> Result<EndPoint> {
    let ep = EndPoint::from_str(e)
        .map_err(|err| Error::invalid(format!("unparsable endpoint {e:?}: {err}")))?;
    let proto = ep.protocol();
    if proto.as_str() != "tcp" {
        return Err(Error::invalid(format!(
            "endpoint {e:?}: only tcp/ endpoints are compiled in (found {})",
            proto.as_str()
        )));
    }
    let addr = ep.address();
    let port_ok = addr
        .as_str()
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    if !port_ok {
        return Err(Error::invalid(format!(
            "endpoint {e:?}: expected tcp/HOST:PORT"
        )));
    }
    Ok(ep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_invalid_arguments() {
        let ok = BridgeConfig::new("a").listen("tcp/127.0.0.1:7000");
        assert!(ok.validate().is_ok());
        assert!(ok.zenoh_config().is_ok());
        let cases = [
            BridgeConfig::new(""),
            BridgeConfig::new("a/b"),
            BridgeConfig::new("a").prefix("x//y"),
            BridgeConfig::new("a").prefix("*"),
            BridgeConfig::new("a").listen("not a locator"),
            BridgeConfig::new("a").listen("tcp/127.0.0.1"),
            BridgeConfig::new("a").listen("tcp/127.0.0.1:99999"),
            BridgeConfig::new("a").connect("udp/127.0.0.1:7000"),
            BridgeConfig::new("a").connect("127.0.0.1:7000"),
            BridgeConfig::new("a").max_in_flight(0),
            BridgeConfig::new("a").ack_timeout(Duration::ZERO),
            BridgeConfig::new("a").max_payload(0),
            BridgeConfig::new("a").lease(Duration::from_millis(1)),
            BridgeConfig::new("a").import_topics("a/#/b"),
        ];
        for c in cases {
            assert!(
                matches!(c.validate(), Err(Error::InvalidArgument(_))),
                "{c:?}"
            );
            assert!(c.zenoh_config().is_err());
        }
    }

    #[test]
    fn the_zenoh_configuration_turns_multicast_scouting_off() {
        let c = BridgeConfig::new("n")
            .listen("tcp/127.0.0.1:7001")
            .connect("tcp/[::1]:7002")
            .lease(Duration::from_millis(500))
            .zenoh_config()
            .unwrap();
        assert_eq!(c.get_json("scouting/multicast/enabled").unwrap(), "false");
        assert_eq!(c.get_json("mode").unwrap(), "\"peer\"");
        assert!(c
            .get_json("listen/endpoints")
            .unwrap()
            .contains("127.0.0.1:7001"));
        assert!(c
            .get_json("connect/endpoints")
            .unwrap()
            .contains("[::1]:7002"));
        assert_eq!(c.get_json("transport/link/tx/lease").unwrap(), "500");
    }
}
