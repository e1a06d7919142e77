//! Kernel-to-kernel (K2K) messaging: targets, receipts, the [`K2kBroker`], and routing
//! tables for 2-D (4-neighbour) and 3-D (6-neighbour) tile grids.
//!
//! A handler sends with [`KernelContext::send_to`](crate::context::KernelContext::send_to);
//! the runtime routes by id or name and answers with a [`K2kReceipt`]. From outside a
//! handler, [`RingKernelRuntime::k2k_broker`](crate::runtime::RingKernelRuntime::k2k_broker)
//! gives a [`K2kBroker`] that sends on a kernel's behalf. The routing tables name the
//! neighbours of each tile of a 2-D or 3-D grid of kernels.
//!
//! K2K is enabled by default; a runtime whose K2K is switched off
//! ([`RuntimeCore::set_k2k_enabled`](crate::runtime::RuntimeCore::set_k2k_enabled))
//! refuses every K2K send with [`Error::InvalidArgument`] and has no broker.

use crate::context::MessageRouter;
use crate::error::{Error, Result};
use crate::hlc::HlcTimestamp;
use crate::ids::KernelId;
use crate::message::{flags, Envelope};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::Arc;

pub use crate::ids::{K2kReceipt, KernelTarget};

/// What a [`K2kBroker`] needs from its runtime.
/// [`RuntimeCore`](crate::runtime::RuntimeCore) implements it (a trait, so that this
/// module does not depend on the runtime module that uses it).
pub trait K2kHost: MessageRouter {
    /// Whether K2K messaging is enabled.
    fn k2k_enabled(&self) -> bool;
    /// The id of the live kernel `target` names, if there is one.
    fn live_kernel(&self, target: &KernelTarget) -> Option<KernelId>;
    /// A timestamp of the runtime's clock.
    fn tick(&self) -> HlcTimestamp;
}

/// The error of a K2K send on a runtime whose K2K messaging is switched off.
pub(crate) fn k2k_disabled() -> Error {
    Error::invalid(
        "kernel-to-kernel messaging is disabled for this runtime \
         (enable it with set_k2k_enabled(true))",
    )
}

/// Sends envelopes from one kernel of a runtime straight into another's input queue.
/// Made by [`RingKernelRuntime::k2k_broker`](crate::runtime::RingKernelRuntime::k2k_broker);
/// cheap to clone.
///
/// This is the host-side counterpart of a handler's
/// [`KernelContext::send_to`](crate::context::KernelContext::send_to): the message is
/// stamped as if the source kernel had sent it (source id, the [`flags::K2K`] flag, a
/// fresh message id that is also its correlation id, and a timestamp of the runtime's
/// clock), then routed like every K2K message.
///
/// ```
/// use ringkernel_core::builtin::{self, Token};
/// use ringkernel_core::k2k::K2kReceipt;
/// use ringkernel_core::message::Envelope;
/// use ringkernel_core::options::LaunchOptions;
/// use ringkernel_core::runtime::RingKernelRuntime;
/// # async fn demo(rt: &dyn RingKernelRuntime) -> ringkernel_core::Result<()> {
/// let a = rt.launch(builtin::ECHO, LaunchOptions::default().with_name("a")).await?;
/// let b = rt.launch(builtin::ECHO, LaunchOptions::default().with_name("b")).await?;
/// let broker = rt.k2k_broker().expect("K2K is enabled by default");
/// let receipt = broker.send(a.id(), "b", Envelope::new(&Token::new(1, 2.0))).await?;
/// assert_eq!(receipt, K2kReceipt::Delivered);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct K2kBroker {
    host: Arc<dyn K2kHost>,
}

impl std::fmt::Debug for K2kBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("K2kBroker")
            .field("enabled", &self.host.k2k_enabled())
            .finish()
    }
}

impl K2kBroker {
    /// A broker routing through `host` (normally a runtime's
    /// [`RuntimeCore`](crate::runtime::RuntimeCore); use
    /// [`RingKernelRuntime::k2k_broker`](crate::runtime::RingKernelRuntime::k2k_broker)).
    pub fn new(host: Arc<dyn K2kHost>) -> Self {
        K2kBroker { host }
    }

    /// Sends `envelope` from kernel `source` to `dest` (a [`KernelId`] or an instance
    /// name). Never waits for queue space: a full destination is
    /// [`K2kReceipt::QueueFull`], a missing or terminated one [`K2kReceipt::NotFound`],
    /// and in both cases the message was not delivered.
    ///
    /// The envelope's type id, payload, flags and priority are kept; its ids, source,
    /// destination and timestamp are set here.
    ///
    /// Errors: [`Error::KernelNotFound`] when `source` is not a live kernel of this
    /// runtime, [`Error::InvalidArgument`] when K2K has been disabled since the broker
    /// was made, [`Error::MessageTooLarge`] when the payload does not fit the
    /// destination's slots.
    pub async fn send(
        &self,
        source: impl Into<KernelTarget>,
        dest: impl Into<KernelTarget>,
        envelope: impl Borrow<Envelope>,
    ) -> Result<K2kReceipt> {
        let source = source.into();
        let env = envelope.borrow();
        if !self.host.k2k_enabled() {
            return Err(k2k_disabled());
        }
        let src = self.host.live_kernel(&source).ok_or_else(|| {
            Error::KernelNotFound(format!(
                "K2K source {source} is not a live kernel of this runtime"
            ))
        })?;
        let mut h = env.header;
        h.message_id = self.host.next_message_id();
        h.correlation_id = h.message_id;
        h.source_kernel = src.0;
        h.flags |= flags::K2K;
        h.set_hlc(self.host.tick());
        self.host.deliver(&dest.into(), h, &env.payload)
    }
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
}
