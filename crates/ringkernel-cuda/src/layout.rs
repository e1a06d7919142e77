//! The CUDA-only shared structs (input lane tails, device inbox, route entry, launch
//! parameters) and the
//! layout check: a device kernel (`kernels/layout.cu`) writes `sizeof` and `offsetof()`
//! of every struct mirrored in `kernels/ringkernel.cuh` and `kernels/token.cuh`, and
//! [`check_device_layout`] compares them with the Rust definitions (ringkernel-core's
//! field tables for the core structs).

use crate::driver::{dev_err, Device, DeviceMemory};
use bytemuck::{Pod, Zeroable};
use cudarc::driver::result as cu;
use ringkernel_core::builtin::Token;
use ringkernel_core::control::{ControlBlock, CONTROL_BLOCK_FIELDS, MESSAGE_HEADER_FIELDS};
use ringkernel_core::message::MessageHeader;
use ringkernel_core::queue::{QueueHeader, QUEUE_HEADER_FIELDS};
use ringkernel_core::{Error, Result};
use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use std::sync::Arc;

/// The tails of a persistent kernel's host input lanes (`RkLaneTails`, 128 bytes, mapped
/// host memory, written by the host only): one input ring per priority lane
/// ([`ringkernel_core::priority::LANES`]), and after publishing messages in lane `l`'s
/// ring the host stores the low 32 bits of its new tail in `tail[l]` (release). The
/// kernel polls all four with one 16-byte acquire load: one PCIe read per poll
/// whichever lanes are in use, so four lanes poll as fast as one queue did. A lane
/// holds at most its capacity (< 2^32) messages, so 32 bits give its exact depth.
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct LaneTails {
    /// Low 32 bits of each lane's tail index.
    pub tail: [u32; 4],
    /// The control block's `command`, mirrored where the kernel polls.
    pub command: u32,
    /// The control block's `command_seq`, mirrored (stored after `command`).
    pub command_seq: u32,
    /// Padding to the end of the two host-written cache lines.
    pub reserved: [u32; 26],
}

impl Default for LaneTails {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// Header of a K2K inbox in device memory (`RkInbox`, 128 bytes): followed by
/// `capacity` stamped slots (core's [`queue::stamped`](ringkernel_core::queue::stamped)
/// layout). Producers (other kernels' warps) reserve indices with a CAS on `reserve`
/// (one per group of lanes sending together) and write their slots' units; the owning
/// kernel takes slots in index order once their stamps are in and advances `head`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct DeviceInbox {
    /// Next index to claim (producers, atomically).
    pub reserve: u64,
    /// Capacity in slots (power of two).
    pub capacity: u32,
    /// Slot size in bytes.
    pub slot_size: u32,
    /// `capacity - 1`.
    pub mask: u32,
    /// Padding to the end of the producer line.
    pub producer_reserved: [u32; 11],
    /// Slots consumed so far (the owning kernel).
    pub head: u64,
    /// Padding to the end of the consumer line.
    pub consumer_reserved: [u32; 14],
}

/// One entry of the device routing table (`RkRoute`, 32 bytes), indexed by kernel id.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct DeviceRoute {
    /// Device address of the kernel's [`DeviceInbox`].
    pub inbox: u64,
    /// Device address of its first stamped slot.
    pub slots: u64,
    /// The kernel id (equal to the index; checked by senders).
    pub kernel_id: u32,
    /// 1 while the kernel accepts K2K messages.
    pub valid: u32,
    /// Slots of the inbox (as its [`DeviceInbox::capacity`]).
    pub capacity: u32,
    /// Bytes of a message in them, header included (as [`DeviceInbox::slot_size`]).
    pub slot_size: u32,
}

/// The one parameter of the persistent kernel (`RkLaunchParams`), passed by value.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct LaunchParams {
    /// Device address of the control block (mapped host memory).
    pub control: u64,
    /// Device address of input lane 0's queue header (mapped host memory); lane `l`'s
    /// header is at `in_queue + l * lane_stride`.
    pub in_queue: u64,
    /// Device address of the output queue header (mapped host memory).
    pub out_queue: u64,
    /// Device address of the K2K inbox header.
    pub inbox: u64,
    /// Device address of the inbox's stamped slots.
    pub inbox_slots: u64,
    /// Device address of the routing table.
    pub routes: u64,
    /// Entries in the routing table.
    pub route_count: u64,
    /// Device address of the groups' staging slots when they do not fit in shared
    /// memory; 0: staged in dynamic shared memory.
    pub stage: u64,
    /// Device address of the kernel-wide state of a kernel of several blocks; 0: in
    /// shared memory (one block).
    pub shared: u64,
    /// Device address of the handler state.
    pub state: u64,
    /// The host's UNIX time in ns at launch; the kernel maps `%globaltimer` onto it.
    pub clock_offset_ns: u64,
    /// This kernel's id.
    pub kernel_id: u64,
    /// Slot size in bytes.
    pub slot_size: u64,
    /// Input queue capacity.
    pub in_capacity: u64,
    /// Output queue capacity.
    pub out_capacity: u64,
    /// Inbox capacity.
    pub inbox_capacity: u64,
    /// Maximum HLC drift accepted, ms.
    pub max_drift_ms: u64,
    /// Device address of the latency ring (mapped host memory; see
    /// [`metrics`](crate::metrics)), or 0 for none.
    pub latency: u64,
    /// Entries in the latency ring (a power of two).
    pub latency_capacity: u64,
    /// Device address of the [`LaneTails`] (mapped host memory).
    pub lane_tails: u64,
    /// Bytes from one input lane's queue header to the next one's.
    pub lane_stride: u64,
    /// Node id of the kernel's clock (`RuntimeCore::kernel_node_id`), stamped on its
    /// replies and K2K sends next to the timestamp.
    pub node_id: u64,
    /// The kernel's priority (`LaunchOptions::priority`), carried in the priority byte
    /// of its replies and K2K sends.
    pub priority: u64,
    /// Threads of each block that serve the host lanes (the rest serve the K2K inbox).
    pub host_threads: u64,
    /// Most host messages one group takes per round.
    pub host_window: u64,
    /// Most inbox messages one group takes per round.
    pub inbox_window: u64,
    /// Bytes between staged slots (the slot's units × 12, rounded up to 16).
    pub stage_stride: u64,
    /// Device address of the round profile (mapped host memory, see
    /// [`CudaRuntime::round_profile`](crate::CudaRuntime::round_profile)), or 0 for none.
    pub profile: u64,
    /// Entries of the round profile (a power of two).
    pub profile_capacity: u64,
    /// Device address of an array of `peer_route_count` device addresses: the routing
    /// tables of the other GPUs of a multi-GPU group
    /// ([`CudaRuntimeGroup`](crate::CudaRuntimeGroup)), where the kernel publishes its
    /// route entry too (through peer access); 0 for a runtime on one GPU.
    pub peer_routes: u64,
    /// Entries of `peer_routes`.
    pub peer_route_count: u64,
}

const _: () = {
    assert!(size_of::<DeviceInbox>() == 128);
    assert!(offset_of!(DeviceInbox, head) == 64);
    assert!(size_of::<DeviceRoute>() == 32);
    assert!(size_of::<LaunchParams>() == 31 * 8);
    assert!(size_of::<LaneTails>() == 128);
    assert!(ringkernel_core::priority::LANES == 4);
};

/// Field tables of the CUDA-only structs, as the Rust compiler lays them out.
pub const DEVICE_INBOX_FIELDS: &[(&str, usize)] = &[
    ("reserve", offset_of!(DeviceInbox, reserve)),
    ("capacity", offset_of!(DeviceInbox, capacity)),
    ("slot_size", offset_of!(DeviceInbox, slot_size)),
    ("mask", offset_of!(DeviceInbox, mask)),
    (
        "producer_reserved",
        offset_of!(DeviceInbox, producer_reserved),
    ),
    ("head", offset_of!(DeviceInbox, head)),
    (
        "consumer_reserved",
        offset_of!(DeviceInbox, consumer_reserved),
    ),
];

/// See [`DEVICE_INBOX_FIELDS`].
pub const DEVICE_ROUTE_FIELDS: &[(&str, usize)] = &[
    ("inbox", offset_of!(DeviceRoute, inbox)),
    ("slots", offset_of!(DeviceRoute, slots)),
    ("kernel_id", offset_of!(DeviceRoute, kernel_id)),
    ("valid", offset_of!(DeviceRoute, valid)),
    ("capacity", offset_of!(DeviceRoute, capacity)),
    ("slot_size", offset_of!(DeviceRoute, slot_size)),
];

/// See [`DEVICE_INBOX_FIELDS`].
pub const LAUNCH_PARAMS_FIELDS: &[(&str, usize)] = &[
    ("control", offset_of!(LaunchParams, control)),
    ("in_queue", offset_of!(LaunchParams, in_queue)),
    ("out_queue", offset_of!(LaunchParams, out_queue)),
    ("inbox", offset_of!(LaunchParams, inbox)),
    ("inbox_slots", offset_of!(LaunchParams, inbox_slots)),
    ("routes", offset_of!(LaunchParams, routes)),
    ("route_count", offset_of!(LaunchParams, route_count)),
    ("stage", offset_of!(LaunchParams, stage)),
    ("shared", offset_of!(LaunchParams, shared)),
    ("state", offset_of!(LaunchParams, state)),
    ("clock_offset_ns", offset_of!(LaunchParams, clock_offset_ns)),
    ("kernel_id", offset_of!(LaunchParams, kernel_id)),
    ("slot_size", offset_of!(LaunchParams, slot_size)),
    ("in_capacity", offset_of!(LaunchParams, in_capacity)),
    ("out_capacity", offset_of!(LaunchParams, out_capacity)),
    ("inbox_capacity", offset_of!(LaunchParams, inbox_capacity)),
    ("max_drift_ms", offset_of!(LaunchParams, max_drift_ms)),
    ("latency", offset_of!(LaunchParams, latency)),
    (
        "latency_capacity",
        offset_of!(LaunchParams, latency_capacity),
    ),
    ("lane_tails", offset_of!(LaunchParams, lane_tails)),
    ("lane_stride", offset_of!(LaunchParams, lane_stride)),
    ("node_id", offset_of!(LaunchParams, node_id)),
    ("priority", offset_of!(LaunchParams, priority)),
    ("host_threads", offset_of!(LaunchParams, host_threads)),
    ("host_window", offset_of!(LaunchParams, host_window)),
    ("inbox_window", offset_of!(LaunchParams, inbox_window)),
    ("stage_stride", offset_of!(LaunchParams, stage_stride)),
    ("profile", offset_of!(LaunchParams, profile)),
    (
        "profile_capacity",
        offset_of!(LaunchParams, profile_capacity),
    ),
    ("peer_routes", offset_of!(LaunchParams, peer_routes)),
    (
        "peer_route_count",
        offset_of!(LaunchParams, peer_route_count),
    ),
];

/// See [`DEVICE_INBOX_FIELDS`].
pub const LANE_TAILS_FIELDS: &[(&str, usize)] = &[
    ("tail", offset_of!(LaneTails, tail)),
    ("command", offset_of!(LaneTails, command)),
    ("command_seq", offset_of!(LaneTails, command_seq)),
    ("reserved", offset_of!(LaneTails, reserved)),
];

/// Field table of the built-in [`Token`].
pub const TOKEN_FIELDS: &[(&str, usize)] = &[
    ("id", offset_of!(Token, id)),
    ("value", offset_of!(Token, value)),
    ("stamps", offset_of!(Token, stamps)),
    ("route", offset_of!(Token, route)),
    ("route_len", offset_of!(Token, route_len)),
    ("hops", offset_of!(Token, hops)),
];

/// A field table: (field name, offset) in declaration order.
pub type FieldTable = &'static [(&'static str, usize)];

/// Every struct the layout kernel reports, in its order: (CUDA name, Rust size, fields).
pub fn expected_layout() -> Vec<(&'static str, usize, FieldTable)> {
    vec![
        (
            "RkControlBlock",
            size_of::<ControlBlock>(),
            CONTROL_BLOCK_FIELDS,
        ),
        (
            "RkMessageHeader",
            size_of::<MessageHeader>(),
            MESSAGE_HEADER_FIELDS,
        ),
        (
            "RkQueueHeader",
            size_of::<QueueHeader>(),
            QUEUE_HEADER_FIELDS,
        ),
        ("RkLaneTails", size_of::<LaneTails>(), LANE_TAILS_FIELDS),
        ("RkInbox", size_of::<DeviceInbox>(), DEVICE_INBOX_FIELDS),
        ("RkRoute", size_of::<DeviceRoute>(), DEVICE_ROUTE_FIELDS),
        (
            "RkLaunchParams",
            size_of::<LaunchParams>(),
            LAUNCH_PARAMS_FIELDS,
        ),
        ("RkToken", size_of::<Token>(), TOKEN_FIELDS),
    ]
}

/// Source of the layout kernel (headers included).
pub(crate) fn layout_source() -> String {
    format!(
        "{}\n{}\n{}",
        include_str!("../kernels/ringkernel.cuh"),
        include_str!("../kernels/token.cuh"),
        include_str!("../kernels/layout.cu")
    )
}

/// Runs the layout kernel on device `ordinal` and returns what it wrote: for each struct
/// of [`expected_layout`], its size then its field offsets, then the end marker
/// `0xC0FFEE`.
pub fn device_layout(ordinal: usize) -> Result<Vec<u64>> {
    let dev = Device::open(ordinal)?;
    let cubin = crate::nvrtc::compile_cubin(
        &layout_source(),
        "layout",
        dev.info.cc,
        dev.info.driver_version,
    )?;
    let module = dev.load_module(&cubin)?;
    let f = module.function("rk_layout")?;
    let count: usize = expected_layout()
        .iter()
        .map(|(_, _, f)| 1 + f.len())
        .sum::<usize>()
        + 1;
    let stream = Arc::new(dev.new_stream()?);
    let out = DeviceMemory::zeroed(&stream, count * 8)?;
    let mut p = out.ptr();
    let mut args = [&mut p as *mut u64 as *mut c_void];
    // SAFETY: rk_layout takes one `unsigned long long*` and writes `count` values into
    // it; `out` holds count * 8 bytes.
    unsafe { cu::launch_kernel(f, (1, 1, 1), (1, 1, 1), 0, stream.raw, &mut args) }
        .map_err(dev_err("launch layout"))?;
    stream.synchronize()?;
    let mut host = vec![0u64; count];
    // SAFETY: reads count u64 from a buffer of that size, after the kernel finished.
    unsafe { cu::memcpy_dtoh_async(&mut host, out.ptr(), stream.raw) }
        .map_err(dev_err("read layout"))?;
    stream.synchronize()?;
    Ok(host)
}

/// Compares the device layout with the Rust one; [`Error::Device`] lists every
/// difference.
pub fn check_device_layout(ordinal: usize) -> Result<()> {
    let got = device_layout(ordinal)?;
    let mut i = 0;
    let mut diffs = Vec::new();
    for (name, size, fields) in expected_layout() {
        if got[i] != size as u64 {
            diffs.push(format!("sizeof({name}): device {} host {size}", got[i]));
        }
        i += 1;
        for (field, off) in fields {
            if got[i] != *off as u64 {
                diffs.push(format!("{name}.{field}: device {} host {off}", got[i]));
            }
            i += 1;
        }
    }
    if got[i] != 0xC0FFEE {
        diffs.push("the layout kernel wrote a different number of values than expected".into());
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(Error::Device(format!(
            "CUDA/Rust layout mismatch: {}",
            diffs.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    //! Host-only checks of the CUDA sources against the Rust tables (the offsets
    //! themselves need a device: `layout_matches_rust` in tests/gpu_smoke.rs).
    use super::*;

    /// The field names of `struct ... {name} {` in `src`, in declaration order.
    fn cuda_fields(src: &str, name: &str) -> Vec<String> {
        let start = src
            .lines()
            .position(|l| l.starts_with("struct ") && l.contains(&format!(" {name} {{")))
            .unwrap_or_else(|| panic!("struct {name} not found"));
        src.lines()
            .skip(start + 1)
            .take_while(|l| !l.starts_with("};"))
            .map(|l| l.split("/*").next().unwrap().trim())
            .filter(|l| !l.is_empty())
            .map(|l| {
                let decl = l.trim_end_matches(';');
                let decl = decl.split('[').next().unwrap();
                decl.split_whitespace().last().unwrap().to_string()
            })
            .collect()
    }

    #[test]
    fn cuda_structs_declare_the_rust_fields_in_order() {
        let src = layout_source();
        for (name, _, fields) in expected_layout() {
            let want: Vec<&str> = fields.iter().map(|(f, _)| *f).collect();
            assert_eq!(cuda_fields(&src, name), want, "{name}");
        }
    }

    #[test]
    fn the_layout_kernel_reports_every_field_in_table_order() {
        let src = include_str!("../kernels/layout.cu");
        let mut reported = Vec::new();
        for l in src.lines().map(str::trim) {
            if let Some(rest) = l.strip_prefix("out[i++] = sizeof(") {
                reported.push((rest.trim_end_matches(");").to_string(), None));
            } else if let Some(rest) = l.strip_prefix("out[i++] = RK_OFF(") {
                let (s, f) = rest.trim_end_matches(");").split_once(',').unwrap();
                reported.push((s.trim().to_string(), Some(f.trim().to_string())));
            }
        }
        let mut want = Vec::new();
        for (name, _, fields) in expected_layout() {
            want.push((name.to_string(), None));
            for (f, _) in fields {
                want.push((name.to_string(), Some(f.to_string())));
            }
        }
        assert_eq!(reported, want);
    }

    #[test]
    fn device_constants_match_the_host() {
        use crate::metrics::{device_error, NO_SAMPLE};
        let cuh = include_str!("../kernels/ringkernel.cuh");
        let define = |name: &str| -> u32 {
            let l = cuh
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not defined"));
            let v = l[name.len() + 8..].split("/*").next().unwrap().trim();
            if let Some(bit) = v.strip_prefix("(1u << ") {
                return 1 << bit.trim_end_matches(')').parse::<u32>().unwrap();
            }
            let v = v.trim_end_matches('u');
            match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
                None => v.parse().unwrap(),
            }
        };
        assert_eq!(define("RK_NO_SAMPLE"), NO_SAMPLE);
        assert_eq!(define("RK_ERR_BAD_HEADER"), device_error::BAD_HEADER);
        assert_eq!(define("RK_ERR_CLOCK_DRIFT"), device_error::CLOCK_DRIFT);
        assert_eq!(define("RK_ERR_HANDLER"), device_error::HANDLER);
        assert_eq!(define("RK_ERR_CHECKSUM"), device_error::CHECKSUM);
        assert_eq!(
            define("RK_MESSAGE_MAGIC"),
            ringkernel_core::message::MESSAGE_MAGIC
        );
        assert_eq!(
            define("RK_FLAG_CHECKSUM"),
            ringkernel_core::message::flags::CHECKSUM
        );
        use ringkernel_core::message::flags;
        assert_eq!(define("RK_FLAG_REPLY"), flags::REPLY);
        assert_eq!(define("RK_FLAG_K2K"), flags::K2K);
        assert_eq!(define("RK_FLAG_PUBSUB"), flags::PUBSUB);
        assert_eq!(define("RK_FLAG_RKYV"), flags::RKYV);
        assert_eq!(define("RK_FLAG_PRIORITY_SHIFT"), flags::PRIORITY_SHIFT);
        assert_eq!(
            0xFFu32 << define("RK_FLAG_PRIORITY_SHIFT"),
            flags::PRIORITY_MASK
        );
        // The lanes: as many as core's, and the same priority -> lane mapping.
        use ringkernel_core::priority::{lane, LANES};
        assert_eq!(define("RK_LANES") as usize, LANES);
        let shift = define("RK_LANE_SHIFT");
        for p in 0..=u8::MAX {
            assert_eq!((u32::from(p) >> shift) as usize, lane(p), "priority {p}");
        }
    }
}
