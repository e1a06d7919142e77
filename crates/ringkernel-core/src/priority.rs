//! Message and kernel priorities.
//!
//! A priority is a `u8`; the four named levels are the lower bounds of four *lanes*.
//! Every kernel's input has one lane per level, and a kernel takes its next message from
//! the highest non-empty lane, so a high-priority message overtakes any number of
//! lower-priority ones already waiting. Within one lane order is FIFO (and so, for
//! messages of one priority, per sender).
//!
//! ```
//! use ringkernel_core::priority::{self, lane};
//! assert_eq!(lane(priority::LOW), 0);
//! assert_eq!(lane(priority::NORMAL), 1);
//! assert_eq!(lane(priority::HIGH + 10), 2);
//! assert_eq!(lane(priority::CRITICAL), 3);
//! assert_eq!(priority::LANES, 4);
//! ```
//!
//! A message carries its priority in its header
//! ([`MessageHeader::priority`](crate::message::MessageHeader::priority)). Messages from
//! the host default to [`NORMAL`]; a kernel's replies, K2K sends and publishes carry the
//! kernel's own priority ([`LaunchOptions::priority`](crate::options::LaunchOptions)).

/// Background work: handled when nothing else waits.
pub const LOW: u8 = 0;
/// The default.
pub const NORMAL: u8 = 64;
/// Ahead of normal traffic.
pub const HIGH: u8 = 128;
/// Ahead of everything else.
pub const CRITICAL: u8 = 192;

/// Number of input lanes (one per named level).
pub const LANES: usize = 4;

/// The lane of priority `p` (0 = lowest): `p / 64`.
#[inline(always)]
pub const fn lane(p: u8) -> usize {
    (p >> 6) as usize
}

/// The name of the level `p` falls into.
pub const fn level_name(p: u8) -> &'static str {
    match lane(p) {
        0 => "low",
        1 => "normal",
        2 => "high",
        _ => "critical",
    }
}
