//! Lock-free bounded queues.
//!
//! * [`spsc`]: typed single-producer/single-consumer ring with split
//!   [`Producer`](spsc::Producer)/[`Consumer`](spsc::Consumer) types.
//! * [`mpsc`]: typed multi-producer/single-consumer ring.
//! * [`stamped`]: a slot ring whose slots validate themselves (a stamp in every 16 bytes),
//!   so a consumer across PCIe reads a message with one read and no index.
//! * [`slot`]: rings of fixed-size message slots (header + payload) in the binary layout
//!   shared with the GPU backends ([`QueueHeader`]), SPSC and MPSC.
//!
//! Every capacity must be a power of two (anything else is
//! [`Error::InvalidArgument`]). Indices are 64-bit and
//! only ever increase; the slot is `index & (capacity - 1)`.

pub mod mpsc;
pub mod slot;
pub mod spsc;
pub mod stamped;

use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// Counters of a queue, readable from either side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Items ever enqueued.
    pub enqueued: u64,
    /// Items ever dequeued.
    pub dequeued: u64,
    /// Pushes refused because the queue was full.
    pub full_rejections: u64,
    /// Items in the queue now (`enqueued - dequeued` at the time of reading).
    pub depth: usize,
    /// Capacity in items.
    pub capacity: usize,
}

/// Checks that `capacity` is a power of two of at least 1 and at most 2^31.
pub fn check_capacity(capacity: usize) -> Result<()> {
    if capacity == 0 || !capacity.is_power_of_two() || capacity > (1 << 31) {
        Err(Error::invalid(format!(
            "queue capacity must be a power of two between 1 and 2^31, got {capacity}"
        )))
    } else {
        Ok(())
    }
}

/// Header of a message-slot queue in the shared binary layout (128 bytes): the
/// producer's cache line (tail and the constants), then the consumer's (head).
///
/// 64-bit indices are `vec2<u32>` in WGSL (low word first).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct QueueHeader {
    /// Producer index: slots written so far. Written by the producer only.
    pub tail: u64,
    /// Capacity in slots (power of two).
    pub capacity: u32,
    /// Slot size in bytes (a multiple of 16, >= 128).
    pub slot_size: u32,
    /// `capacity - 1`.
    pub mask: u32,
    /// Explicit padding to the end of the producer line.
    pub producer_reserved: [u32; 11],
    /// Consumer index: slots read so far. Written by the consumer only.
    pub head: u64,
    /// Explicit padding to the end of the consumer line.
    pub consumer_reserved: [u32; 14],
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<QueueHeader>() == 128);
    assert!(align_of::<QueueHeader>() == 64);
    assert!(offset_of!(QueueHeader, tail) == 0);
    assert!(offset_of!(QueueHeader, capacity) == 8);
    assert!(offset_of!(QueueHeader, slot_size) == 12);
    assert!(offset_of!(QueueHeader, mask) == 16);
    assert!(offset_of!(QueueHeader, head) == 64);
};

/// Field names with their offsets for [`QueueHeader`] (for the WGSL/CUDA layout tests).
pub const QUEUE_HEADER_FIELDS: &[(&str, usize)] = &[
    ("tail", 0),
    ("capacity", 8),
    ("slot_size", 12),
    ("mask", 16),
    ("producer_reserved", 20),
    ("head", 64),
    ("consumer_reserved", 72),
];
