//! Rings of fixed-size message slots (64-byte header + payload), written in place.
//!
//! [`SlotProducer`]/[`SlotConsumer`] are an SPSC ring in the shared layout
//! ([`QueueHeader`](super::QueueHeader) followed by `capacity * slot_size` bytes), which
//! GPU backends also place in mapped or device memory. [`SlotSender`]/[`SlotReceiver`]
//! are the multi-producer variant used for kernel input queues on the host, where the
//! host, other kernels (K2K) and the pub/sub broker all write.

use super::QueueStats;
use crate::error::Result;
use crate::message::{Envelope, MessageHeader};

/// Creates an SPSC slot ring: `capacity` slots (power of two) of `slot_size` bytes
/// (power of two, at least 128).
pub fn slot_channel(capacity: usize, slot_size: usize) -> Result<(SlotProducer, SlotConsumer)> {
    todo!("queue helper: implement")
}

/// Creates an MPSC slot ring.
pub fn mpsc_slot_channel(capacity: usize, slot_size: usize) -> Result<(SlotSender, SlotReceiver)> {
    todo!("queue helper: implement")
}

/// Producing half of an SPSC slot ring.
pub struct SlotProducer {}
/// Consuming half of an SPSC slot ring.
pub struct SlotConsumer {}
/// A producing handle of an MPSC slot ring (`Clone`).
#[derive(Clone)]
pub struct SlotSender {}
/// The consuming handle of an MPSC slot ring.
pub struct SlotReceiver {}

impl SlotProducer {
    /// Writes `header` and `payload` into the next slot. `MessageTooLarge` if the payload
    /// does not fit a slot, `QueueFull` if no slot is free; in both cases nothing changes.
    pub fn try_push(&mut self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        todo!()
    }
    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        todo!()
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        todo!()
    }
}

impl SlotConsumer {
    /// Takes the oldest message out, if any. A slot whose header is corrupt is consumed
    /// and reported as an error (so one bad slot cannot wedge the queue).
    pub fn try_pop(&mut self) -> Result<Option<Envelope>> {
        todo!()
    }
    /// Calls `f` on the oldest slot's header and payload in place (no copy), then frees
    /// the slot. Returns `None` when empty.
    pub fn pop_with<R>(&mut self, f: impl FnOnce(&MessageHeader, &[u8]) -> R) -> Option<R> {
        todo!()
    }
    /// Messages waiting.
    pub fn len(&self) -> usize {
        todo!()
    }
    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        todo!()
    }
}

impl SlotSender {
    /// As [`SlotProducer::try_push`], callable from any number of threads.
    pub fn try_push(&self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        todo!()
    }
    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        todo!()
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        todo!()
    }
}

impl SlotReceiver {
    /// As [`SlotConsumer::try_pop`].
    pub fn try_pop(&mut self) -> Result<Option<Envelope>> {
        todo!()
    }
    /// Messages waiting.
    pub fn len(&self) -> usize {
        todo!()
    }
    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        todo!()
    }
}
