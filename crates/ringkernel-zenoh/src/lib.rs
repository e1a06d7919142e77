//! RingKernel across processes and hosts, through [Zenoh](https://zenoh.io).
//!
//! A [`ZenohBridge`] joins one runtime to a Zenoh network of other runtimes' bridges
//! over explicit TCP endpoints ([`BridgeConfig`]: listen, connect; no multicast
//! scouting). Through it:
//!
//! * **K2K across runtimes.** A kernel of another runtime is addressed `kernel@node`
//!   (its instance name there, its runtime's bridge node name).
//!   [`ZenohBridge::remote_kernel`] puts a stand-in of it into the local runtime under
//!   that name, so a handler sends with `ctx.send_to("worker@b", &msg)` and the host
//!   with the stand-in's [`KernelHandle`](ringkernel_core::runtime::KernelHandle)
//!   (`send`, and `call` when runtime `b` [serves](ZenohBridge::serve) `worker`).
//!   [`ZenohBridge::send`] sends and waits for the remote receipt. On arrival the
//!   sender appears as a stand-in too (`source@a`), so the receiving handler can answer
//!   with `ctx.send_to(ctx.request().source_kernel, ..)`.
//! * **Topics across runtimes.** [`ZenohBridge::publish`] publishes to the local
//!   subscribers and to every runtime that [imports](ZenohBridge::import_topics) a
//!   matching MQTT filter; there the publication goes to the kernels subscribed with
//!   the runtime's own broker, MQTT rules applied. Filters become Zenoh key
//!   expressions as the [`keyexpr`] module documents (`+` → `*`, `#` → `**`, reserved
//!   characters and empty levels escaped, the `$` rule applied by the receiving broker).
//! * **Clocks.** Every message carries its sender's HLC timestamp (with the node id of
//!   the clock that issued it); the receiving runtime's clock merges it before
//!   delivery, so anything that runtime does afterwards (a reply, a publication) is
//!   ordered after it. A timestamp too far ahead of the receiver's clock is refused
//!   (receipt `Rejected`, [`BridgeStats::clock_rejected`]).
//! * **Order.** Messages from one bridge to another arrive in the order they were
//!   sent (one reliable Zenoh publisher per destination, sequence numbers checked on
//!   arrival: [`BridgeStats::sequence_gaps`]), so per-sender order holds.
//! * **Peers.** Each bridge holds a Zenoh liveliness token; [`ZenohBridge::events`]
//!   reports peers that appear and disappear ([`PeerEvent`]), with counters in
//!   [`BridgeStats`].
//!
//! # Delivery guarantee
//!
//! **At most once, acknowledged, nothing unaccounted for.** A K2K message is sent once
//! (never retried, so never duplicated) over a reliable, ordered Zenoh link. The
//! destination bridge answers every message with a receipt: `Delivered` (it is in the
//! destination kernel's input queue), or `QueueFull`, `NotFound`, `Rejected` (it was
//! not delivered, and why). Until its receipt arrives a message is *in flight*; if its
//! peer disappears first, or no receipt comes within the ack timeout, it is counted
//! **lost**: it may or may not have reached the destination queue, and the sender
//! cannot know which. At every moment
//!
//! ```text
//! k2k_sent == k2k_delivered + k2k_refused + k2k_lost + k2k_in_flight
//! ```
//!
//! Sends to a peer that is not connected are refused before sending
//! ([`BridgeStats::k2k_unreachable`]), and at most
//! [`max_in_flight`](BridgeConfig::max_in_flight) messages per peer wait for receipts
//! (further sends see a full queue), which bounds what a peer's disappearance can
//! leave unresolved. A `Delivered` receipt means queued, not processed: what a kernel
//! does with its queue is its runtime's business (and its metrics').
//!
//! The bridge's Zenoh publishers block rather than drop when Zenoh's transmit queue is
//! full (`CongestionControl::Block`): a send can wait briefly under a burst, and never
//! vanishes at the sender.
//!
//! Publications are at most once without receipts, as MQTT QoS 0: they reach the
//! runtimes connected and subscribed when they are sent; receivers count
//! [`topic_received`](BridgeStats::topic_received), deliveries, publications that
//! matched no kernel, and [`sequence_gaps`](BridgeStats::sequence_gaps).
//!
//! # Limits
//!
//! * Publications leave a runtime through [`ZenohBridge::publish`] (host side). A
//!   handler's `ctx.publish` reaches its own runtime's subscribers only; a handler that
//!   must reach another runtime sends K2K to a kernel there (`ctx.send_to("k@node", ..)`).
//! * A runtime's stand-ins for remote kernels are kernels of its table: they show up in
//!   its metrics and kernel lists, named `kernel@node` (`@node` for that node's host).
//!   They are made on first contact (a `remote` call, or a first message from that
//!   kernel) and kept until the bridge closes.
//! * Only TCP endpoints are compiled in (the crate builds Zenoh with `transport_tcp`
//!   alone, to keep build times down).
//!
//! # Example
//!
//! `cargo run -p ringkernel-zenoh --example two_processes` starts a second process and
//! makes the two talk (K2K with a reply, a publication each way).

pub mod bridge;
pub mod config;
pub mod keyexpr;
mod proxy;
pub mod wire;

pub use bridge::{parse_address, BridgeStats, PeerEvent, ZenohBridge};
pub use config::BridgeConfig;
pub use wire::RemoteReceipt;
/// The Zenoh crate this bridge is built on (for [`ZenohBridge::session`]).
pub use zenoh;
