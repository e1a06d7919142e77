//! Host copies of a kernel's rings and control block, for a [`DrainTarget`] whose device
//! memory the host cannot address (wgpu; the CPU stand-in of the tests).
//!
//! The target hands these addresses to the engine as its `input`/`output`/`control`
//! and copies bytes between them and the device: in `launch`, the pass's input slots and
//! the host-written part of the control block go up; before `done`, the pass's output
//! slots and the fields of the control block that the drain template writes
//! ([`DEVICE_WRITTEN`]) come down.
//!
//! [`DrainTarget`]: crate::engine::DrainTarget

use crate::engine::ring_bytes;
use ringkernel_core::control::ControlBlock;
use std::ops::Range;

/// Bytes of the control block that the drain template writes (`input_head` to the end
/// of the device line). `state` and `command_ack` at the start of the device line are
/// written by the host only, so a copy back from the device must leave them alone.
pub const DEVICE_WRITTEN: Range<usize> =
    std::mem::offset_of!(ControlBlock, input_head)..std::mem::size_of::<ControlBlock>();

/// One zeroed, 8-byte aligned allocation owned through a raw pointer (so that the
/// engine and the target may address it concurrently without a Rust reference).
struct Words {
    ptr: *mut u64,
    len: usize,
}

impl Words {
    fn new(bytes: usize) -> Self {
        let len = bytes.div_ceil(8);
        let ptr = Box::into_raw(vec![0u64; len].into_boxed_slice()).cast::<u64>();
        Words { ptr, len }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` come from `Box::into_raw` of a boxed slice of `len` words
        // in `new`, and are released only here, once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// Host copies of an input ring, an output ring (each [`ring_bytes`] long) and a
/// 128-byte control block, zero-initialised.
pub struct HostRings {
    input: Words,
    output: Words,
    control: Words,
    ring_len: usize,
}

// SAFETY: `HostRings` owns its allocations (no thread affinity); the bytes are only
// accessed through the raw pointers it hands out, under the `DrainTarget` contract that
// keeps host and device accesses of a slot apart.
unsafe impl Send for HostRings {}
// SAFETY: as above; `&HostRings` gives out pointers only, never references.
unsafe impl Sync for HostRings {}

impl HostRings {
    /// Rings of `capacity` slots of `slot_size` bytes.
    pub fn new(capacity: usize, slot_size: usize) -> Self {
        let ring_len = ring_bytes(capacity, slot_size);
        HostRings {
            input: Words::new(ring_len),
            output: Words::new(ring_len),
            control: Words::new(std::mem::size_of::<ControlBlock>()),
            ring_len,
        }
    }
    /// Bytes of each ring.
    pub fn ring_len(&self) -> usize {
        self.ring_len
    }
    /// Address of the input ring.
    pub fn input(&self) -> *mut u8 {
        self.input.ptr.cast()
    }
    /// Address of the output ring.
    pub fn output(&self) -> *mut u8 {
        self.output.ptr.cast()
    }
    /// Address of the control block.
    pub fn control(&self) -> *mut u8 {
        self.control.ptr.cast()
    }
}

/// The memory methods of a [`DrainTarget`](crate::engine::DrainTarget) whose rings are
/// the [`HostRings`] in field `$field`: `ring_len`, `input`, `output` and `control`.
/// Used inside the target's `unsafe impl DrainTarget`.
#[macro_export]
macro_rules! host_rings_memory {
    ($field:ident) => {
        fn ring_len(&self) -> usize {
            self.$field.ring_len()
        }
        fn input(&self) -> *mut u8 {
            self.$field.input()
        }
        fn output(&self) -> *mut u8 {
            self.$field.output()
        }
        fn control(&self) -> *mut u8 {
            self.$field.control()
        }
    };
}

/// The byte ranges of a ring (from its start, header included) that hold the slots of
/// queue indices `[first, first + count)`: one range, or two where the batch wraps.
pub fn slot_runs(first: u64, count: u64, capacity: usize, slot_size: usize) -> Vec<Range<usize>> {
    let header = std::mem::size_of::<ringkernel_core::queue::QueueHeader>();
    let cap = capacity as u64;
    let mut runs = Vec::with_capacity(2);
    let mut i = 0;
    while i < count.min(cap) {
        let slot = (first + i) & (cap - 1);
        let run = (count.min(cap) - i).min(cap - slot);
        let start = header + slot as usize * slot_size;
        runs.push(start..start + run as usize * slot_size);
        i += run;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_where_the_ring_wraps() {
        assert_eq!(slot_runs(0, 4, 8, 256), vec![128..128 + 4 * 256]);
        assert_eq!(
            slot_runs(6, 4, 8, 256),
            vec![128 + 6 * 256..128 + 8 * 256, 128..128 + 2 * 256]
        );
        assert_eq!(
            slot_runs(13, 8, 8, 128)
                .iter()
                .map(|r| r.len())
                .sum::<usize>(),
            8 * 128
        );
        assert!(slot_runs(3, 0, 8, 128).is_empty());
    }

    #[test]
    fn device_written_fields_skip_the_host_mirrored_state() {
        assert_eq!(DEVICE_WRITTEN.start, 72);
        assert_eq!(DEVICE_WRITTEN.end, 128);
        assert!(std::mem::offset_of!(ControlBlock, state) < DEVICE_WRITTEN.start);
        let r = HostRings::new(4, 256);
        assert_eq!(r.ring_len(), 128 + 4 * 256);
        assert_eq!(r.input() as usize % 8, 0);
    }
}
