//! Kernel-to-kernel (K2K) messaging: targets, receipts, and routing tables for 2-D
//! (4-neighbour) and 3-D (6-neighbour) tile grids.
//!
//! A handler sends with [`KernelContext::send_to`](crate::context::KernelContext::send_to);
//! the runtime routes by id or name and answers with a [`K2kReceipt`]. GPU backends
//! keep K2K inboxes in device memory with the [`K2kInboxHeader`] and [`RouteEntry`]
//! layouts defined here.

use crate::error::{Error, Result};
use crate::runtime::KernelId;
use bytemuck::{Pod, Zeroable};
use std::collections::HashMap;

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
/// by `capacity` slots of `slot_size` bytes; `head`/`tail` follow the queue rules
/// (64-bit, monotonically increasing, slot = index & mask).
///
/// Unlike [`QueueHeader`](crate::queue::QueueHeader), `tail` is claimed by several
/// writers (neighbouring kernels) with an atomic add, and all fields share one cache
/// line: inboxes are small and touched by device atomics, where line sharing between
/// the host and device is not the issue it is for the host queues. 64-bit fields are
/// `vec2<u32>` (low word first) in WGSL.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct K2kInboxHeader {
    /// Messages consumed. Written by the owner kernel only.
    pub head: u64,
    /// Slots claimed by senders (atomic add).
    pub tail: u64,
    /// Number of slots (power of two).
    pub capacity: u32,
    /// Slot size in bytes (power of two, >= 128).
    pub slot_size: u32,
    /// `capacity - 1`.
    pub mask: u32,
    /// Kernel id of the inbox's owner (the receiver).
    pub owner_kernel: u32,
    /// Messages delivered into this inbox (senders add 1 after writing a slot).
    pub delivered: u64,
    /// Sends refused because the inbox was full (senders add 1).
    pub rejected: u64,
    /// [`inbox_flags`] bits.
    pub flags: u32,
    /// Explicit padding to 64 bytes, always zero.
    pub reserved: [u32; 3],
}

/// Bits of [`K2kInboxHeader::flags`].
pub mod inbox_flags {
    /// The inbox is initialised and accepts messages.
    pub const ACTIVE: u32 = 1 << 0;
    /// The owner has terminated: senders must report `NotFound`.
    pub const CLOSED: u32 = 1 << 1;
}

impl K2kInboxHeader {
    /// A fresh, active header for an inbox of `capacity` slots of `slot_size` bytes
    /// owned by `owner` (`InvalidArgument` for a bad capacity or slot size).
    pub fn new(owner: KernelId, capacity: usize, slot_size: usize) -> Result<Self> {
        crate::queue::slot::slot_region_bytes(capacity, slot_size)?;
        Ok(K2kInboxHeader {
            capacity: capacity as u32,
            slot_size: slot_size as u32,
            mask: capacity as u32 - 1,
            owner_kernel: owner.0,
            flags: inbox_flags::ACTIVE,
            ..Default::default()
        })
    }
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<K2kInboxHeader>() == 64);
    assert!(align_of::<K2kInboxHeader>() == 64);
    assert!(offset_of!(K2kInboxHeader, head) == 0);
    assert!(offset_of!(K2kInboxHeader, tail) == 8);
    assert!(offset_of!(K2kInboxHeader, capacity) == 16);
    assert!(offset_of!(K2kInboxHeader, slot_size) == 20);
    assert!(offset_of!(K2kInboxHeader, mask) == 24);
    assert!(offset_of!(K2kInboxHeader, owner_kernel) == 28);
    assert!(offset_of!(K2kInboxHeader, delivered) == 32);
    assert!(offset_of!(K2kInboxHeader, rejected) == 40);
    assert!(offset_of!(K2kInboxHeader, flags) == 48);
    assert!(offset_of!(K2kInboxHeader, reserved) == 52);
};

/// Field names with their offsets for [`K2kInboxHeader`] (for the WGSL/CUDA/Metal
/// layout tests).
pub const K2K_INBOX_HEADER_FIELDS: &[(&str, usize)] = &[
    ("head", 0),
    ("tail", 8),
    ("capacity", 16),
    ("slot_size", 20),
    ("mask", 24),
    ("owner_kernel", 28),
    ("delivered", 32),
    ("rejected", 40),
    ("flags", 48),
    ("reserved", 52),
];

/// One routing-table entry (32 bytes): where a neighbour's inbox is.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RouteEntry {
    /// Kernel id of the neighbour (0 when there is none).
    pub dest_kernel: u32,
    /// Direction code: [`Dir2::code`] or [`Dir3::code`].
    pub direction: u32,
    /// Device address (or offset into the backend's inbox buffer) of the neighbour's
    /// [`K2kInboxHeader`]; 0 until the backend fills it in.
    pub inbox_addr: u64,
    /// [`route_flags`] bits.
    pub flags: u32,
    /// Explicit padding to 32 bytes, always zero.
    pub reserved: [u32; 3],
}

/// Bits of [`RouteEntry::flags`].
pub mod route_flags {
    /// A neighbour exists in this direction.
    pub const VALID: u32 = 1 << 0;
    /// The neighbour was reached by wrapping around a periodic edge.
    pub const WRAPPED: u32 = 1 << 1;
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<RouteEntry>() == 32);
    assert!(align_of::<RouteEntry>() == 8);
    assert!(offset_of!(RouteEntry, dest_kernel) == 0);
    assert!(offset_of!(RouteEntry, direction) == 4);
    assert!(offset_of!(RouteEntry, inbox_addr) == 8);
    assert!(offset_of!(RouteEntry, flags) == 16);
    assert!(offset_of!(RouteEntry, reserved) == 20);
};

/// Field names with their offsets for [`RouteEntry`].
pub const ROUTE_ENTRY_FIELDS: &[(&str, usize)] = &[
    ("dest_kernel", 0),
    ("direction", 4),
    ("inbox_addr", 8),
    ("flags", 16),
    ("reserved", 20),
];

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

impl Dir2 {
    /// All directions in table order.
    pub const ALL: [Dir2; 4] = [Dir2::North, Dir2::South, Dir2::East, Dir2::West];

    /// Device code (position in [`Dir2::ALL`]).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The opposite direction.
    pub fn opposite(self) -> Dir2 {
        match self {
            Dir2::North => Dir2::South,
            Dir2::South => Dir2::North,
            Dir2::East => Dir2::West,
            Dir2::West => Dir2::East,
        }
    }

    fn delta(self) -> (i64, i64) {
        match self {
            Dir2::North => (0, -1),
            Dir2::South => (0, 1),
            Dir2::East => (1, 0),
            Dir2::West => (-1, 0),
        }
    }
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

impl Dir3 {
    /// All directions in table order.
    pub const ALL: [Dir3; 6] = [
        Dir3::PosX,
        Dir3::NegX,
        Dir3::PosY,
        Dir3::NegY,
        Dir3::PosZ,
        Dir3::NegZ,
    ];

    /// Device code (position in [`Dir3::ALL`]).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The opposite direction.
    pub fn opposite(self) -> Dir3 {
        match self {
            Dir3::PosX => Dir3::NegX,
            Dir3::NegX => Dir3::PosX,
            Dir3::PosY => Dir3::NegY,
            Dir3::NegY => Dir3::PosY,
            Dir3::PosZ => Dir3::NegZ,
            Dir3::NegZ => Dir3::PosZ,
        }
    }

    fn axis_delta(self) -> (usize, i64) {
        match self {
            Dir3::PosX => (0, 1),
            Dir3::NegX => (0, -1),
            Dir3::PosY => (1, 1),
            Dir3::NegY => (1, -1),
            Dir3::PosZ => (2, 1),
            Dir3::NegZ => (2, -1),
        }
    }
}

/// Moves coordinate `c` by `d` on an axis of length `n`: `(new, wrapped)`, or `None`
/// off a non-periodic edge.
fn step(c: u32, d: i64, n: u32, periodic: bool) -> Option<(u32, bool)> {
    let v = c as i64 + d;
    if (0..n as i64).contains(&v) {
        Some((v as u32, false))
    } else if periodic {
        Some((v.rem_euclid(n as i64) as u32, true))
    } else {
        None
    }
}

/// Validates the id list of a grid of `count` tiles and indexes it.
fn index_ids(
    ids: &[KernelId],
    count: Option<usize>,
    shape: &str,
) -> Result<HashMap<KernelId, usize>> {
    let count = count.filter(|&c| c > 0).ok_or_else(|| {
        Error::invalid(format!(
            "grid {shape} must have at least one tile and fit in memory"
        ))
    })?;
    if ids.len() != count {
        return Err(Error::invalid(format!(
            "grid {shape} has {count} tiles but {} kernel ids were given",
            ids.len()
        )));
    }
    let mut pos = HashMap::with_capacity(count);
    for (i, id) in ids.iter().enumerate() {
        if pos.insert(*id, i).is_some() {
            return Err(Error::invalid(format!(
                "kernel id {id} appears twice in grid {shape}"
            )));
        }
    }
    Ok(pos)
}

fn entry(dest: Option<(KernelId, bool)>, code: u32) -> RouteEntry {
    match dest {
        Some((id, wrapped)) => RouteEntry {
            dest_kernel: id.0,
            direction: code,
            flags: route_flags::VALID | if wrapped { route_flags::WRAPPED } else { 0 },
            ..Default::default()
        },
        None => RouteEntry {
            direction: code,
            ..Default::default()
        },
    }
}

/// Routing table for a `width × height` grid of kernels (row-major ids), optionally
/// periodic (wrap-around edges).
///
/// ```
/// use ringkernel_core::k2k::{Dir2, RoutingTable2D};
/// use ringkernel_core::runtime::KernelId;
/// let ids = (1..=6).map(KernelId).collect();          // 3 wide, 2 high
/// let t = RoutingTable2D::new(3, 2, ids, false).unwrap();
/// assert_eq!(t.neighbour(1, 0, Dir2::East), Some(KernelId(3)));
/// assert_eq!(t.neighbour(1, 0, Dir2::South), Some(KernelId(5)));
/// assert_eq!(t.neighbour(1, 0, Dir2::North), None);
/// assert_eq!(t.position_of(KernelId(6)), Some((2, 1)));
/// ```
#[derive(Debug, Clone)]
pub struct RoutingTable2D {
    width: u32,
    height: u32,
    ids: Vec<KernelId>,
    pos: HashMap<KernelId, usize>,
    periodic: bool,
}

impl RoutingTable2D {
    /// `ids.len()` must be `width * height` (`InvalidArgument` otherwise, and for an
    /// empty grid or an id listed twice).
    pub fn new(width: u32, height: u32, ids: Vec<KernelId>, periodic: bool) -> Result<Self> {
        let count = (width as usize).checked_mul(height as usize);
        let pos = index_ids(&ids, count, &format!("{width}x{height}"))?;
        Ok(RoutingTable2D {
            width,
            height,
            ids,
            pos,
            periodic,
        })
    }

    /// `(width, height)`.
    pub fn dims(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// Whether edges wrap around.
    pub fn is_periodic(&self) -> bool {
        self.periodic
    }

    /// The kernel at tile `(x, y)`.
    pub fn id_at(&self, x: u32, y: u32) -> Option<KernelId> {
        if x < self.width && y < self.height {
            Some(self.ids[y as usize * self.width as usize + x as usize])
        } else {
            None
        }
    }

    fn resolve(&self, x: u32, y: u32, dir: Dir2) -> Option<(KernelId, bool)> {
        self.id_at(x, y)?;
        let (dx, dy) = dir.delta();
        let (nx, wx) = step(x, dx, self.width, self.periodic)?;
        let (ny, wy) = step(y, dy, self.height, self.periodic)?;
        Some((self.id_at(nx, ny)?, wx || wy))
    }

    /// The neighbour of tile `(x, y)` in `dir`, `None` at a non-periodic edge or outside.
    pub fn neighbour(&self, x: u32, y: u32, dir: Dir2) -> Option<KernelId> {
        self.resolve(x, y, dir).map(|(id, _)| id)
    }

    /// All four neighbours in the order North, South, East, West.
    pub fn neighbours(&self, x: u32, y: u32) -> [Option<KernelId>; 4] {
        Dir2::ALL.map(|d| self.neighbour(x, y, d))
    }

    /// Tile position of a kernel id.
    pub fn position_of(&self, id: KernelId) -> Option<(u32, u32)> {
        let i = *self.pos.get(&id)?;
        Some((
            (i % self.width as usize) as u32,
            (i / self.width as usize) as u32,
        ))
    }

    /// The device-side route entries of tile `(x, y)`, in the order of `neighbours`
    /// (`inbox_addr` 0: see [`route_entries_with`](Self::route_entries_with)).
    pub fn route_entries(&self, x: u32, y: u32) -> [RouteEntry; 4] {
        self.route_entries_with(x, y, |_| 0)
    }

    /// As [`route_entries`](Self::route_entries), with `inbox_addr` filled in by
    /// `inbox_of` for each existing neighbour.
    pub fn route_entries_with(
        &self,
        x: u32,
        y: u32,
        inbox_of: impl Fn(KernelId) -> u64,
    ) -> [RouteEntry; 4] {
        Dir2::ALL.map(|d| {
            let dest = self.resolve(x, y, d);
            let mut e = entry(dest, d.code());
            if let Some((id, _)) = dest {
                e.inbox_addr = inbox_of(id);
            }
            e
        })
    }
}

/// Routing table for a `w × h × d` grid of kernels (x fastest), optionally periodic.
///
/// ```
/// use ringkernel_core::k2k::{Dir3, RoutingTable3D};
/// use ringkernel_core::runtime::KernelId;
/// let ids = (10..18).map(KernelId).collect();         // 2 × 2 × 2
/// let t = RoutingTable3D::new([2, 2, 2], ids, true).unwrap();
/// assert_eq!(t.neighbour([0, 0, 0], Dir3::PosZ), Some(KernelId(14)));
/// assert_eq!(t.neighbour([0, 0, 0], Dir3::NegX), Some(KernelId(11))); // wrapped
/// ```
#[derive(Debug, Clone)]
pub struct RoutingTable3D {
    dims: [u32; 3],
    ids: Vec<KernelId>,
    pos: HashMap<KernelId, usize>,
    periodic: bool,
}

impl RoutingTable3D {
    /// `ids.len()` must be `w * h * d` (`InvalidArgument` otherwise, and for an empty
    /// grid or an id listed twice).
    pub fn new(dims: [u32; 3], ids: Vec<KernelId>, periodic: bool) -> Result<Self> {
        let count = (dims[0] as usize)
            .checked_mul(dims[1] as usize)
            .and_then(|n| n.checked_mul(dims[2] as usize));
        let pos = index_ids(&ids, count, &format!("{}x{}x{}", dims[0], dims[1], dims[2]))?;
        Ok(RoutingTable3D {
            dims,
            ids,
            pos,
            periodic,
        })
    }

    /// `[w, h, d]`.
    pub fn dims(&self) -> [u32; 3] {
        self.dims
    }

    /// Whether edges wrap around.
    pub fn is_periodic(&self) -> bool {
        self.periodic
    }

    /// The kernel at tile `p`.
    pub fn id_at(&self, p: [u32; 3]) -> Option<KernelId> {
        let [w, h, d] = self.dims.map(|v| v as usize);
        let [x, y, z] = p.map(|v| v as usize);
        if x < w && y < h && z < d {
            Some(self.ids[(z * h + y) * w + x])
        } else {
            None
        }
    }

    fn resolve(&self, p: [u32; 3], dir: Dir3) -> Option<(KernelId, bool)> {
        self.id_at(p)?;
        let (axis, d) = dir.axis_delta();
        let (v, wrapped) = step(p[axis], d, self.dims[axis], self.periodic)?;
        let mut q = p;
        q[axis] = v;
        Some((self.id_at(q)?, wrapped))
    }

    /// The neighbour of tile `p` in `dir`.
    pub fn neighbour(&self, p: [u32; 3], dir: Dir3) -> Option<KernelId> {
        self.resolve(p, dir).map(|(id, _)| id)
    }

    /// All six neighbours in the order +X, -X, +Y, -Y, +Z, -Z.
    pub fn neighbours(&self, p: [u32; 3]) -> [Option<KernelId>; 6] {
        Dir3::ALL.map(|d| self.neighbour(p, d))
    }

    /// Tile position of a kernel id.
    pub fn position_of(&self, id: KernelId) -> Option<[u32; 3]> {
        let i = *self.pos.get(&id)?;
        let (w, h) = (self.dims[0] as usize, self.dims[1] as usize);
        Some([(i % w) as u32, ((i / w) % h) as u32, (i / (w * h)) as u32])
    }

    /// The device-side route entries of tile `p`, in the order of `neighbours`
    /// (`inbox_addr` 0: see [`route_entries_with`](Self::route_entries_with)).
    pub fn route_entries(&self, p: [u32; 3]) -> [RouteEntry; 6] {
        self.route_entries_with(p, |_| 0)
    }

    /// As [`route_entries`](Self::route_entries), with `inbox_addr` filled in by
    /// `inbox_of` for each existing neighbour.
    pub fn route_entries_with(
        &self,
        p: [u32; 3],
        inbox_of: impl Fn(KernelId) -> u64,
    ) -> [RouteEntry; 6] {
        Dir3::ALL.map(|d| {
            let dest = self.resolve(p, d);
            let mut e = entry(dest, d.code());
            if let Some((id, _)) = dest {
                e.inbox_addr = inbox_of(id);
            }
            e
        })
    }
}
