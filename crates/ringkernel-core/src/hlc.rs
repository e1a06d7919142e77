//! Hybrid Logical Clock (Kulkarni, Demirbas et al., 2014).
//!
//! A timestamp packs the logical physical time `l` (milliseconds since the UNIX epoch,
//! upper 44 bits) and the counter `c` (lower 20 bits) into one `u64`, so timestamps
//! compare as integers and the clock state is one `AtomicU64` advanced by CAS: strictly
//! monotonic under any number of threads. When `c` would overflow within one
//! millisecond, `l` advances by one (the clock runs ahead of physical time by at most
//! that much while the burst lasts).

use crate::error::Result;

/// Bits of the logical counter.
pub const LOGICAL_BITS: u32 = 20;
/// Default maximum drift accepted from a remote timestamp, in milliseconds.
pub const DEFAULT_MAX_DRIFT_MS: u64 = 1_000;

/// A packed HLC timestamp. Ordering is the HLC order.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HlcTimestamp(pub u64);

impl HlcTimestamp {
    /// Packs `physical_ms` (< 2^44) and `logical` (< 2^20).
    pub fn new(physical_ms: u64, logical: u32) -> Self {
        todo!("hlc helper")
    }
    /// The `l` part, in milliseconds since the UNIX epoch.
    pub fn physical_ms(self) -> u64 {
        todo!()
    }
    /// The `c` part.
    pub fn logical(self) -> u32 {
        todo!()
    }
    /// The packed value.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

/// A source of physical time in milliseconds since the UNIX epoch.
pub type PhysicalClock = fn() -> u64;

/// The system wall clock in milliseconds since the UNIX epoch (fast path).
pub fn system_clock_ms() -> u64 {
    todo!()
}

/// A hybrid logical clock.
#[derive(Debug)]
pub struct HlcClock {
    _todo: (),
}

impl Default for HlcClock {
    fn default() -> Self {
        Self::new()
    }
}

impl HlcClock {
    /// A clock on the system wall clock with [`DEFAULT_MAX_DRIFT_MS`].
    pub fn new() -> Self {
        todo!()
    }
    /// A clock with another maximum drift.
    pub fn with_max_drift(max_drift_ms: u64) -> Self {
        todo!()
    }
    /// A clock on a custom physical clock (tests use this to control time).
    pub fn with_physical_clock(clock: PhysicalClock, max_drift_ms: u64) -> Self {
        todo!()
    }
    /// Local or send event: returns a timestamp greater than every one this clock has
    /// returned or seen before.
    pub fn tick(&self) -> HlcTimestamp {
        todo!()
    }
    /// Receive event: merges `remote` per the paper's rules and returns the new
    /// timestamp (greater than `remote` and than every earlier local one).
    /// [`Error::ClockDrift`](crate::Error::ClockDrift) if `remote` is more than the
    /// maximum drift ahead of the physical clock; the clock is then unchanged.
    pub fn update(&self, remote: HlcTimestamp) -> Result<HlcTimestamp> {
        todo!()
    }
    /// The latest timestamp issued, without advancing.
    pub fn peek(&self) -> HlcTimestamp {
        todo!()
    }
    /// The configured maximum drift in milliseconds.
    pub fn max_drift_ms(&self) -> u64 {
        todo!()
    }
}
