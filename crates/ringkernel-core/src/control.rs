//! The 128-byte control block shared by the host and a kernel's worker.
//!
//! It is split into two 64-byte cache lines, one per writer: the host writes only the
//! first line, the kernel (a CPU thread, a persistent CUDA kernel, a drain pass) only the
//! second. Neither side ever read-modify-writes a field the other side writes, so no
//! atomic RMW across the PCIe bus is needed.

use bytemuck::{Pod, Zeroable};

/// Commands the host writes into [`ControlBlock::command`].
pub mod command {
    /// Keep running in the current state (initial value).
    pub const NONE: u32 = 0;
    /// Process messages.
    pub const ACTIVATE: u32 = 1;
    /// Pause: keep queued messages, process none.
    pub const DEACTIVATE: u32 = 2;
    /// Drain the input queue and exit.
    pub const TERMINATE: u32 = 3;
}

/// Shared control block (host line + device line). 128 bytes, aligned to 128.
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ControlBlock {
    // ---- line 0: written by the host only ----
    /// Last command ([`command`]) the host issued.
    pub command: u32,
    /// Incremented by the host with every new command, so the worker sees repeats.
    pub command_seq: u32,
    /// Id of the kernel this block belongs to.
    pub kernel_id: u32,
    /// Slot size of the kernel's queues, in bytes.
    pub slot_size: u32,
    /// Producer index of the input queue (messages the host has written).
    pub input_tail: u64,
    /// Consumer index of the output queue (replies the host has read).
    pub output_head: u64,
    /// Input queue capacity in slots.
    pub input_capacity: u32,
    /// Output queue capacity in slots.
    pub output_capacity: u32,
    /// Maximum HLC drift the worker accepts, in milliseconds.
    pub max_drift_ms: u64,
    /// Explicit padding to the end of the host line.
    pub host_reserved: [u32; 4],
    // ---- line 1: written by the worker only ----
    /// [`LifecycleState`](crate::lifecycle::LifecycleState) the worker reports.
    pub state: u32,
    /// Last `command_seq` the worker acted on.
    pub command_ack: u32,
    /// Consumer index of the input queue (messages the worker has taken).
    pub input_head: u64,
    /// Producer index of the output queue (replies the worker has written).
    pub output_tail: u64,
    /// Messages the handler processed.
    pub processed: u64,
    /// Messages the worker dropped (each one also counted in `last_error`).
    pub dropped: u64,
    /// The worker's packed HLC state.
    pub hlc: u64,
    /// Last error code the worker hit (0: none).
    pub last_error: u32,
    /// Incremented by the worker on every poll round (liveness).
    pub heartbeat: u32,
    /// Explicit padding to the end of the worker line.
    pub device_reserved: [u32; 2],
}

/// Offset of the worker-written line.
pub const DEVICE_LINE_OFFSET: usize = 64;

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<ControlBlock>() == 128);
    assert!(align_of::<ControlBlock>() == 128);
    assert!(offset_of!(ControlBlock, command) == 0);
    assert!(offset_of!(ControlBlock, command_seq) == 4);
    assert!(offset_of!(ControlBlock, kernel_id) == 8);
    assert!(offset_of!(ControlBlock, slot_size) == 12);
    assert!(offset_of!(ControlBlock, input_tail) == 16);
    assert!(offset_of!(ControlBlock, output_head) == 24);
    assert!(offset_of!(ControlBlock, input_capacity) == 32);
    assert!(offset_of!(ControlBlock, output_capacity) == 36);
    assert!(offset_of!(ControlBlock, max_drift_ms) == 40);
    assert!(offset_of!(ControlBlock, host_reserved) == 48);
    assert!(offset_of!(ControlBlock, state) == DEVICE_LINE_OFFSET);
    assert!(offset_of!(ControlBlock, command_ack) == 68);
    assert!(offset_of!(ControlBlock, input_head) == 72);
    assert!(offset_of!(ControlBlock, output_tail) == 80);
    assert!(offset_of!(ControlBlock, processed) == 88);
    assert!(offset_of!(ControlBlock, dropped) == 96);
    assert!(offset_of!(ControlBlock, hlc) == 104);
    assert!(offset_of!(ControlBlock, last_error) == 112);
    assert!(offset_of!(ControlBlock, heartbeat) == 116);
    assert!(offset_of!(ControlBlock, device_reserved) == 120);
};

/// Field names with their offsets, in declaration order: used by the layout tests that
/// compare the WGSL and CUDA mirrors against this struct.
pub const CONTROL_BLOCK_FIELDS: &[(&str, usize)] = &[
    ("command", 0),
    ("command_seq", 4),
    ("kernel_id", 8),
    ("slot_size", 12),
    ("input_tail", 16),
    ("output_head", 24),
    ("input_capacity", 32),
    ("output_capacity", 36),
    ("max_drift_ms", 40),
    ("host_reserved", 48),
    ("state", 64),
    ("command_ack", 68),
    ("input_head", 72),
    ("output_tail", 80),
    ("processed", 88),
    ("dropped", 96),
    ("hlc", 104),
    ("last_error", 112),
    ("heartbeat", 116),
    ("device_reserved", 120),
];

/// Field names with their offsets for [`MessageHeader`](crate::message::MessageHeader).
pub const MESSAGE_HEADER_FIELDS: &[(&str, usize)] = &[
    ("magic", 0),
    ("version", 4),
    ("type_id", 8),
    ("payload_len", 12),
    ("message_id", 16),
    ("correlation_id", 24),
    ("source_kernel", 32),
    ("dest_kernel", 36),
    ("timestamp", 40),
    ("checksum", 48),
    ("flags", 52),
    ("node_id", 56),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_tables_match_the_struct() {
        // The tables other backends compare against must agree with the compiler.
        let cb = ControlBlock::default();
        let base = &cb as *const _ as usize;
        let actual = [
            ("command", &cb.command as *const _ as usize),
            ("input_tail", &cb.input_tail as *const _ as usize),
            ("state", &cb.state as *const _ as usize),
            ("hlc", &cb.hlc as *const _ as usize),
            ("heartbeat", &cb.heartbeat as *const _ as usize),
        ];
        for (name, addr) in actual {
            let want = CONTROL_BLOCK_FIELDS
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap()
                .1;
            assert_eq!(addr - base, want, "{name}");
        }
        let h = crate::message::MessageHeader::default();
        let hb = &h as *const _ as usize;
        assert_eq!(&h.timestamp as *const _ as usize - hb, 40);
        assert_eq!(
            MESSAGE_HEADER_FIELDS
                .iter()
                .find(|(n, _)| *n == "timestamp")
                .unwrap()
                .1,
            40
        );
    }

    #[test]
    fn host_and_device_lines_are_disjoint() {
        // Every host field lies in [0, 64), every worker field in [64, 128).
        for (name, off) in CONTROL_BLOCK_FIELDS {
            let host = [
                "command",
                "command_seq",
                "kernel_id",
                "slot_size",
                "input_tail",
                "output_head",
                "input_capacity",
                "output_capacity",
                "max_drift_ms",
                "host_reserved",
            ]
            .contains(name);
            assert_eq!(host, *off < DEVICE_LINE_OFFSET, "{name} at {off}");
        }
    }
}
