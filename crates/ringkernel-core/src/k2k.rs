//! Kernel-to-kernel (K2K) messaging: targets, receipts, and routing tables for 2-D
//! (4-neighbour) and 3-D (6-neighbour) tile grids.
//!
//! A handler sends with [`KernelContext::send_to`](crate::context::KernelContext::send_to);
//! the runtime routes by id or name and answers with a [`K2kReceipt`]. GPU backends
//! keep K2K inboxes in device memory with the [`K2kInboxHeader`] and [`RouteEntry`]
//! layouts defined here.

use crate::error::Result;
use crate::runtime::KernelId;
use bytemuck::{Pod, Zeroable};

/// Where a K2K message goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KernelTarget {
    /// A kernel by id.
    Id(KernelId),
    /// A kernel by instance name.
    Name(String),
}

impl From<KernelId> for KernelTarget {
    fn from(id: KernelId) -> Self {
        KernelTarget::Id(id)
    }
}
impl From<&str> for KernelTarget {
    fn from(s: &str) -> Self {
        KernelTarget::Name(s.to_string())
    }
}
impl From<String> for KernelTarget {
    fn from(s: String) -> Self {
        KernelTarget::Name(s)
    }
}
impl From<&String> for KernelTarget {
    fn from(s: &String) -> Self {
        KernelTarget::Name(s.clone())
    }
}

/// What happened to a K2K message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum K2kReceipt {
    /// In the destination's input queue.
    Delivered,
    /// The destination's input queue was full; the message was not delivered.
    QueueFull,
    /// No such kernel (or it has terminated); the message was not delivered.
    NotFound,
}

/// Header of a K2K inbox in device memory (64 bytes). An inbox is this header followed
/// by `capacity` slots of `slot_size` bytes; `head`/`tail` follow the queue rules.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct K2kInboxHeader {
    /// Reserved by the K2K helper: define the fields and assert the layout.
    pub _todo: [u64; 8],
}

/// One routing-table entry (32 bytes): where a neighbour's inbox is.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RouteEntry {
    /// Reserved by the K2K helper: define the fields and assert the layout.
    pub _todo: [u64; 4],
}

/// The four directions of a 2-D tile grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir2 {
    /// y - 1
    North,
    /// y + 1
    South,
    /// x + 1
    East,
    /// x - 1
    West,
}

/// The six directions of a 3-D tile grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir3 {
    /// x + 1
    PosX,
    /// x - 1
    NegX,
    /// y + 1
    PosY,
    /// y - 1
    NegY,
    /// z + 1
    PosZ,
    /// z - 1
    NegZ,
}

/// Routing table for a `width × height` grid of kernels (row-major ids), optionally
/// periodic (wrap-around edges).
#[derive(Debug, Clone)]
pub struct RoutingTable2D {
    _todo: (),
}

impl RoutingTable2D {
    /// `ids.len()` must be `width * height` (`InvalidArgument` otherwise).
    pub fn new(width: u32, height: u32, ids: Vec<KernelId>, periodic: bool) -> Result<Self> {
        todo!("k2k helper")
    }
    /// The neighbour of tile `(x, y)` in `dir`, `None` at a non-periodic edge or outside.
    pub fn neighbour(&self, x: u32, y: u32, dir: Dir2) -> Option<KernelId> {
        todo!()
    }
    /// All four neighbours in the order North, South, East, West.
    pub fn neighbours(&self, x: u32, y: u32) -> [Option<KernelId>; 4] {
        todo!()
    }
    /// Tile position of a kernel id.
    pub fn position_of(&self, id: KernelId) -> Option<(u32, u32)> {
        todo!()
    }
    /// The device-side route entries of tile `(x, y)`, in the order of `neighbours`.
    pub fn route_entries(&self, x: u32, y: u32) -> [RouteEntry; 4] {
        todo!()
    }
}

/// Routing table for a `w × h × d` grid of kernels (x fastest), optionally periodic.
#[derive(Debug, Clone)]
pub struct RoutingTable3D {
    _todo: (),
}

impl RoutingTable3D {
    /// `ids.len()` must be `w * h * d` (`InvalidArgument` otherwise).
    pub fn new(dims: [u32; 3], ids: Vec<KernelId>, periodic: bool) -> Result<Self> {
        todo!("k2k helper")
    }
    /// The neighbour of tile `p` in `dir`.
    pub fn neighbour(&self, p: [u32; 3], dir: Dir3) -> Option<KernelId> {
        todo!()
    }
    /// All six neighbours in the order +X, -X, +Y, -Y, +Z, -Z.
    pub fn neighbours(&self, p: [u32; 3]) -> [Option<KernelId>; 6] {
        todo!()
    }
    /// Tile position of a kernel id.
    pub fn position_of(&self, id: KernelId) -> Option<[u32; 3]> {
        todo!()
    }
    /// The device-side route entries of tile `p`, in the order of `neighbours`.
    pub fn route_entries(&self, p: [u32; 3]) -> [RouteEntry; 6] {
        todo!()
    }
}
