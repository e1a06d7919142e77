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
//! ([`MessageHeader::priority`](crate::message::MessageHeader::priority), bits 8..15 of
//! `flags`). Messages from the host default to [`NORMAL`]
//! ([`KernelHandle::send`](crate::runtime::KernelHandle::send), `call`, `publish`);
//! [`KernelHandle::send_with_priority`](crate::runtime::KernelHandle::send_with_priority)
//! and [`Envelope::with_priority`](crate::message::Envelope::with_priority) (honoured by
//! `send_envelope` and `publish_envelope`) choose another. A kernel's replies, K2K
//! sends and publishes carry the kernel's own priority
//! ([`LaunchOptions::priority`](crate::options::LaunchOptions::priority)), whatever the
//! priority of the request was.
//!
//! ```
//! use ringkernel_core::builtin::Token;
//! use ringkernel_core::prelude::*;
//! use ringkernel_core::priority;
//! # async fn demo(rt: &dyn RingKernelRuntime) -> ringkernel_core::Result<()> {
//! let k = rt
//!     .launch("rk.echo", LaunchOptions::default().with_priority(priority::HIGH))
//!     .await?;
//! k.send_with_priority(Token::new(1, 1.0), priority::CRITICAL).await?;
//! # Ok(()) }
//! ```
//!
//! # Design
//!
//! **What is guaranteed.** Among the messages *waiting* in a kernel's input, the next
//! one handled is the oldest of the highest non-empty lane. Priorities in one lane
//! (say 128 and 130) are equal for ordering: FIFO. Nothing is pre-empted: a message
//! already being handled, or a GPU drain pass already running, finishes first. There
//! is no ageing: LOW messages wait as long as higher traffic keeps arriving.
//!
//! **Capacity and backpressure.** Each lane holds
//! [`LaunchOptions::queue_capacity`](crate::options::LaunchOptions::queue_capacity)
//! messages; a send into a full lane is
//! [`Error::QueueFull`](crate::Error::QueueFull) (or waits, with `wait_when_full`),
//! while the other lanes still accept messages. `KernelEngine::input_capacity` is the
//! capacity of one lane; a kernel's metrics `queue_depth` counts every lane.
//! Terminating a kernel that is not active hands back the messages of every lane in
//! `TerminateReport::undelivered`, highest lane first (the order they would have been
//! handled in).
//!
//! **Where the ordering happens, per backend.**
//!
//! * CPU (`ringkernel-cpu`): one MPSC slot ring per lane; before each message the
//!   kernel's thread looks at the lanes from CRITICAL down. The NORMAL ring is
//!   allocated at launch, the others on their first message, so NORMAL-only kernels
//!   pay neither memory nor time for the lanes they do not use (at most 4 × the
//!   `queue_capacity × slot_size` bytes of one ring).
//! * WebGPU and Metal (`ringkernel-drain`): the lanes live on the host (a waiting
//!   message costs its header and payload on the heap); when a drain pass starts, the
//!   host copies waiting messages into the device input ring highest lane first, so
//!   the pass's slots, a serial handler's order and the replies' order all follow
//!   priority. A pass takes at most `queue_capacity` messages; the rest wait for the
//!   next pass, still in lanes. The WebGPU poller also finishes the passes of
//!   higher-priority kernels first. Metal has no such shared step: each kernel's
//!   command buffer completes on its own.
//! * CUDA (`ringkernel-cuda`): the persistent kernel drains the lanes; that crate
//!   documents its layout.

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
