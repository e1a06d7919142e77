//! K2K inboxes and routing tables in one shared buffer, with the layouts of
//! `ringkernel-core` ([`K2kInboxHeader`], 64 bytes; [`RouteEntry`], 32 bytes).
//!
//! An [`InboxArena`] lays out one inbox per kernel (a 64-byte header followed by its
//! slots) and, after the inboxes, each kernel's route entries (4 for a 2-D grid, 6 for
//! a 3-D grid, from core's [`RoutingTable2D`]/[`RoutingTable3D`]), whose `inbox_addr`
//! is the byte offset of the neighbour's inbox in the same buffer. On Metal the arena is
//! one `StorageModeShared` buffer, so the host and every drain pass see it in place;
//! [`push`]/[`pop`] are the host-side operations on it, following the header's rules
//! (`tail` claimed by senders, `head` advanced by the owner, `rejected` counted when
//! full, `CLOSED` answered as not found).
//!
//! Status: the layout, the route tables and the host operations are tested on Linux.
//! The drain template in `ringkernel-shaders` does not read inboxes yet — its `rk_send`
//! goes through the host, which routes between passes with
//! [`RuntimeCore::deliver`](ringkernel_core::runtime::RuntimeCore::deliver) — so on Metal
//! K2K currently travels host-routed; the arena is the device-side layout for when the
//! template gains direct inbox writes.

use ringkernel_core::error::{Error, Result};
use ringkernel_core::k2k::{
    inbox_flags, K2kInboxHeader, K2kReceipt, RouteEntry, RoutingTable2D, RoutingTable3D,
};
use ringkernel_core::message::{
    check_payload_fits, read_slot, Envelope, MessageHeader, HEADER_SIZE,
};
use ringkernel_core::runtime::KernelId;
use std::collections::BTreeMap;

const HDR: usize = std::mem::size_of::<K2kInboxHeader>();
const ROUTE: usize = std::mem::size_of::<RouteEntry>();

/// Where each inbox and each kernel's routes live in an arena buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxArena {
    inboxes: BTreeMap<KernelId, (usize, K2kInboxHeader)>,
    routes: BTreeMap<KernelId, (usize, Vec<RouteEntry>)>,
    bytes: usize,
}

fn align64(v: usize) -> usize {
    v.next_multiple_of(64)
}

impl InboxArena {
    fn build(
        kernels: &[KernelId],
        capacity: usize,
        slot_size: usize,
        routes_of: impl Fn(KernelId, &dyn Fn(KernelId) -> u64) -> Vec<RouteEntry>,
    ) -> Result<Self> {
        let mut inboxes = BTreeMap::new();
        let mut off = 0usize;
        for &k in kernels {
            let h = K2kInboxHeader::new(k, capacity, slot_size)?;
            if inboxes.insert(k, (off, h)).is_some() {
                return Err(Error::invalid(format!(
                    "kernel {k} appears twice in the grid"
                )));
            }
            off = align64(off + HDR + capacity * slot_size);
        }
        let addr = |k: KernelId| inboxes.get(&k).map(|(o, _)| *o as u64).unwrap_or(0);
        let mut routes = BTreeMap::new();
        for &k in kernels {
            let r = routes_of(k, &addr);
            let len = r.len() * ROUTE;
            routes.insert(k, (off, r));
            off = align64(off + len);
        }
        Ok(InboxArena {
            inboxes,
            routes,
            bytes: off,
        })
    }

    /// An arena for every kernel of a 2-D grid (inboxes of `capacity` slots of
    /// `slot_size` bytes), with 4 route entries per kernel (N, S, E, W).
    pub fn for_grid_2d(table: &RoutingTable2D, capacity: usize, slot_size: usize) -> Result<Self> {
        let (w, h) = table.dims();
        let ids: Vec<KernelId> = (0..h)
            .flat_map(|y| (0..w).map(move |x| (x, y)))
            .filter_map(|(x, y)| table.id_at(x, y))
            .collect();
        Self::build(&ids, capacity, slot_size, |k, addr| {
            match table.position_of(k) {
                Some((x, y)) => table.route_entries_with(x, y, addr).to_vec(),
                None => Vec::new(),
            }
        })
    }

    /// An arena for every kernel of a 3-D grid, with 6 route entries per kernel
    /// (+X, -X, +Y, -Y, +Z, -Z).
    pub fn for_grid_3d(table: &RoutingTable3D, capacity: usize, slot_size: usize) -> Result<Self> {
        let [w, h, d] = table.dims();
        let ids: Vec<KernelId> = (0..d)
            .flat_map(|z| (0..h).flat_map(move |y| (0..w).map(move |x| [x, y, z])))
            .filter_map(|p| table.id_at(p))
            .collect();
        Self::build(&ids, capacity, slot_size, |k, addr| {
            match table.position_of(k) {
                Some(p) => table.route_entries_with(p, addr).to_vec(),
                None => Vec::new(),
            }
        })
    }

    /// Total bytes of the arena buffer.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Byte offset of `kernel`'s inbox header.
    pub fn inbox_offset(&self, kernel: KernelId) -> Option<usize> {
        self.inboxes.get(&kernel).map(|(o, _)| *o)
    }

    /// Byte offset and entries of `kernel`'s routes.
    pub fn routes(&self, kernel: KernelId) -> Option<(usize, &[RouteEntry])> {
        self.routes.get(&kernel).map(|(o, r)| (*o, r.as_slice()))
    }

    /// Writes every inbox header and route table into `buf` (at least
    /// [`bytes`](Self::bytes) long; slots are left as they are).
    pub fn init(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < self.bytes {
            return Err(Error::invalid(format!(
                "arena needs {} bytes, buffer has {}",
                self.bytes,
                buf.len()
            )));
        }
        for (off, h) in self.inboxes.values() {
            buf[*off..*off + HDR].copy_from_slice(bytemuck::bytes_of(h));
        }
        for (off, r) in self.routes.values() {
            buf[*off..*off + r.len() * ROUTE].copy_from_slice(bytemuck::cast_slice(r));
        }
        Ok(())
    }
}

fn header_at(buf: &[u8], off: usize) -> Result<K2kInboxHeader> {
    buf.get(off..off + HDR)
        .map(bytemuck::pod_read_unaligned)
        .ok_or_else(|| Error::invalid(format!("no inbox header at byte {off}")))
}

fn put_header(buf: &mut [u8], off: usize, h: &K2kInboxHeader) {
    buf[off..off + HDR].copy_from_slice(bytemuck::bytes_of(h));
}

/// Sends into the inbox at byte `off` of an arena: `QueueFull` (and `rejected` + 1)
/// when full, `NotFound` when the owner closed it, `MessageTooLarge` when the payload
/// does not fit a slot.
pub fn push(
    buf: &mut [u8],
    off: usize,
    header: &MessageHeader,
    payload: &[u8],
) -> Result<K2kReceipt> {
    let mut h = header_at(buf, off)?;
    if h.flags & inbox_flags::CLOSED != 0 || h.flags & inbox_flags::ACTIVE == 0 {
        return Ok(K2kReceipt::NotFound);
    }
    let slot_size = h.slot_size as usize;
    check_payload_fits(payload.len(), slot_size)?;
    if h.tail - h.head >= h.capacity as u64 {
        h.rejected += 1;
        put_header(buf, off, &h);
        return Ok(K2kReceipt::QueueFull);
    }
    let at = off + HDR + (h.tail & h.mask as u64) as usize * slot_size;
    let slot = buf
        .get_mut(at..at + slot_size)
        .ok_or_else(|| Error::invalid("inbox slot outside the arena"))?;
    ringkernel_core::message::write_slot(slot, header, payload)?;
    h.tail += 1;
    h.delivered += 1;
    put_header(buf, off, &h);
    Ok(K2kReceipt::Delivered)
}

/// Takes the oldest message out of the inbox at byte `off`, if any.
pub fn pop(buf: &mut [u8], off: usize) -> Result<Option<Envelope>> {
    let mut h = header_at(buf, off)?;
    if h.head == h.tail {
        return Ok(None);
    }
    let slot_size = h.slot_size as usize;
    let at = off + HDR + (h.head & h.mask as u64) as usize * slot_size;
    let slot = buf
        .get(at..at + slot_size)
        .ok_or_else(|| Error::invalid("inbox slot outside the arena"))?;
    let env = read_slot(slot);
    h.head += 1;
    put_header(buf, off, &h);
    env.map(Some)
}

/// Marks the inbox at `off` closed (its owner terminated): later sends are `NotFound`.
pub fn close(buf: &mut [u8], off: usize) -> Result<()> {
    let mut h = header_at(buf, off)?;
    h.flags |= inbox_flags::CLOSED;
    put_header(buf, off, &h);
    Ok(())
}

const _: () = assert!(HEADER_SIZE == 64 && HDR == 64 && ROUTE == 32);
