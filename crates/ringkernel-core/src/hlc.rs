//! Hybrid Logical Clock (Kulkarni, Demirbas et al., 2014), with node ids.
//!
//! A timestamp is `(time, node)`: `time` packs the logical physical time `l`
//! (milliseconds since the UNIX epoch, upper 44 bits) and the counter `c` (lower 20
//! bits) into one `u64`, and `node` is the id of the clock that issued it. Timestamps
//! order by `(l, c, node)`, so two clocks with different node ids never produce equal
//! timestamps, and every clock is strictly monotonic. The clock state is one
//! `AtomicU64` advanced by CAS (or, when only the counter moves, by `fetch_add`, which
//! cannot fail): strictly monotonic under any number of threads. When `c` would overflow
//! within one millisecond, `l` advances by one (the clock runs ahead of physical time by
//! at most that much while the burst lasts).
//!
//! ```
//! use ringkernel_core::hlc::HlcClock;
//!
//! let a = HlcClock::new(1);
//! let b = HlcClock::new(2);
//! let sent = a.tick();                      // send event on node 1
//! let received = b.update(&sent).unwrap(); // receive event on node 2
//! assert!(received > sent);
//! assert_eq!((sent.node(), received.node()), (1, 2));
//! assert!(b.tick() > received);
//! ```
//!
//! # The rules
//!
//! With `pt` the physical time, `(l, c)` the clock and `(l_m, c_m)` a remote timestamp:
//!
//! * send/local event: `l' = max(l, pt)`; `c' = c + 1` if `l' == l`, else `0`;
//! * receive event: `l' = max(l, l_m, pt)`; `c' = max(c, c_m) + 1` if `l' == l == l_m`,
//!   `c + 1` if only `l' == l`, `c_m + 1` if only `l' == l_m`, else `0`.
//!
//! In the packed form both reduce to one comparison: the new value is `pack(pt, 0)` when
//! `pt` is ahead of every `l` involved, and otherwise the largest packed value involved
//! plus one, which also carries a counter overflow into `l`. The node id takes no part
//! in the rules; it only breaks ties between clocks.
//!
//! # Layout (host and device)
//!
//! [`HlcTimestamp`] is 16 bytes, `#[repr(C)]`: `time: u64` at offset 0, `node: u64` at
//! offset 8. In a [`MessageHeader`](crate::message::MessageHeader) the two halves are
//! `timestamp` (offset 40) and `node_id` (offset 56). CUDA kernels see the same fields
//! (`RkMessageHeader::timestamp` / `node_id`, `unsigned long long`); WGSL, which has no
//! 64-bit integers, sees each as a `vec2<u32>`, low word first. A runtime gives every
//! clock it owns its own node id: the runtime's node number in the upper 32 bits and the
//! clock's index in the lower 32 (0 for the host, the kernel id for a kernel's clock), so
//! clocks of one runtime never collide, and neither do runtimes with distinct node
//! numbers.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of the logical counter.
pub const LOGICAL_BITS: u32 = 20;
/// Default maximum drift accepted from a remote timestamp, in milliseconds.
pub const DEFAULT_MAX_DRIFT_MS: u64 = 1_000;
/// Largest logical counter value (`2^20 - 1`).
pub const MAX_LOGICAL: u32 = (1 << LOGICAL_BITS) - 1;
/// Largest physical part in milliseconds (`2^44 - 1`, about the year 2527).
pub const MAX_PHYSICAL_MS: u64 = (1 << (64 - LOGICAL_BITS)) - 1;

/// An HLC timestamp: packed time (physical ms and logical counter) and the node id of
/// the clock that issued it. Ordering is the HLC order, ties broken by node id.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    bytemuck::Pod,
    bytemuck::Zeroable,
)]
pub struct HlcTimestamp {
    time: u64,
    node: u64,
}

const _: () = {
    assert!(std::mem::size_of::<HlcTimestamp>() == 16);
    assert!(std::mem::offset_of!(HlcTimestamp, time) == 0);
    assert!(std::mem::offset_of!(HlcTimestamp, node) == 8);
};

impl HlcTimestamp {
    /// Packs `physical_ms` (< 2^44) and `logical` (< 2^20), node id 0; larger values are
    /// truncated to those widths.
    ///
    /// ```
    /// use ringkernel_core::hlc::HlcTimestamp;
    /// let t = HlcTimestamp::new(1_700_000_000_000, 5).with_node(3);
    /// assert_eq!((t.physical_ms(), t.logical(), t.node()), (1_700_000_000_000, 5, 3));
    /// ```
    #[inline(always)]
    pub const fn new(physical_ms: u64, logical: u32) -> Self {
        HlcTimestamp {
            time: ((physical_ms & MAX_PHYSICAL_MS) << LOGICAL_BITS)
                | (logical & MAX_LOGICAL) as u64,
            node: 0,
        }
    }
    /// A timestamp from its packed time and node id (as stored in a message header).
    #[inline(always)]
    pub const fn from_parts(packed: u64, node: u64) -> Self {
        HlcTimestamp { time: packed, node }
    }
    /// The same time, issued by `node`.
    #[inline(always)]
    pub const fn with_node(self, node: u64) -> Self {
        HlcTimestamp {
            time: self.time,
            node,
        }
    }
    /// The `l` part, in milliseconds since the UNIX epoch.
    #[inline(always)]
    pub const fn physical_ms(self) -> u64 {
        self.time >> LOGICAL_BITS
    }
    /// The `c` part.
    #[inline(always)]
    pub const fn logical(self) -> u32 {
        (self.time & MAX_LOGICAL as u64) as u32
    }
    /// The packed time (`l << 20 | c`), without the node id.
    #[inline(always)]
    pub const fn packed(self) -> u64 {
        self.time
    }
    /// The packed time (same as [`packed`](Self::packed)).
    #[inline(always)]
    pub const fn as_u64(self) -> u64 {
        self.time
    }
    /// The node id of the clock that issued this timestamp.
    #[inline(always)]
    pub const fn node(self) -> u64 {
        self.node
    }
}

impl std::fmt::Display for HlcTimestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}@{}", self.physical_ms(), self.logical(), self.node)
    }
}

/// A source of physical time in milliseconds since the UNIX epoch.
pub type PhysicalClock = fn() -> u64;

/// The system wall clock in milliseconds since the UNIX epoch (fast path).
///
/// On Linux this reads `CLOCK_REALTIME_COARSE`, which the vDSO answers from the value
/// the kernel updates on every timer tick, in a few nanoseconds and without a syscall,
/// where `SystemTime::now` (`CLOCK_REALTIME`) costs 20 ns or more. Its resolution is one
/// timer tick (1 to 10 ms, typically 4 ms): coarser than a millisecond, but the HLC
/// only needs a physical clock that is close to real time and never jumps far ahead.
/// Within one tick the logical counter orders events, so `l` lags the true wall time by
/// at most one tick, a small fraction of any sensible maximum drift. Other platforms use
/// `SystemTime::now`.
#[inline]
pub fn system_clock_ms() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_REALTIME_COARSE exists on
        // every Linux since 2.6.32 and the call only writes `ts`.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
        if rc == 0 {
            return (ts.tv_sec as u64)
                .wrapping_mul(1_000)
                .wrapping_add(ts.tv_nsec as u64 / 1_000_000);
        }
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The packed timestamp after `top` (the latest issued or seen) at physical time `pt`:
/// `(pt, 0)` once `pt` passed `top`'s physical part, else `top` with its counter
/// bumped.
#[inline(always)]
fn next_after(top: u64, pt: u64) -> u64 {
    if pt > top >> LOGICAL_BITS {
        HlcTimestamp::new(pt, 0).time
    } else {
        top.wrapping_add(1)
    }
}

/// A hybrid logical clock with a node id.
pub struct HlcClock {
    state: AtomicU64,
    node: u64,
    /// `None`: the system clock ([`system_clock_ms`], called directly so it inlines
    /// into `tick`); `Some`: a custom clock.
    clock: Option<PhysicalClock>,
    max_drift_ms: u64,
}

impl std::fmt::Debug for HlcClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HlcClock")
            .field("last", &self.peek())
            .field("node", &self.node)
            .field("max_drift_ms", &self.max_drift_ms)
            .finish()
    }
}

impl HlcClock {
    /// A clock of node `node_id` on the system wall clock with [`DEFAULT_MAX_DRIFT_MS`].
    /// Give every clock that takes part in one system its own node id: that is what
    /// keeps timestamps of different clocks apart.
    pub fn new(node_id: u64) -> Self {
        Self::with_max_drift(node_id, DEFAULT_MAX_DRIFT_MS)
    }
    /// A clock with another maximum drift.
    pub fn with_max_drift(node_id: u64, max_drift_ms: u64) -> Self {
        HlcClock {
            state: AtomicU64::new(0),
            node: node_id,
            clock: None,
            max_drift_ms,
        }
    }
    /// A clock on a custom physical clock (tests use this to control time).
    ///
    /// ```
    /// use ringkernel_core::hlc::{HlcClock, HlcTimestamp};
    /// fn frozen() -> u64 { 1_000 }
    /// let c = HlcClock::with_physical_clock(9, frozen, 50);
    /// assert_eq!(c.tick(), HlcTimestamp::new(1_000, 0).with_node(9));
    /// assert_eq!(c.tick(), HlcTimestamp::new(1_000, 1).with_node(9));
    /// ```
    pub fn with_physical_clock(node_id: u64, clock: PhysicalClock, max_drift_ms: u64) -> Self {
        HlcClock {
            state: AtomicU64::new(0),
            node: node_id,
            clock: Some(clock),
            max_drift_ms,
        }
    }

    /// This clock's node id.
    #[inline(always)]
    pub fn node_id(&self) -> u64 {
        self.node
    }

    #[inline(always)]
    fn stamp(&self, packed: u64) -> HlcTimestamp {
        HlcTimestamp::from_parts(packed, self.node)
    }

    #[inline(always)]
    fn physical(&self) -> u64 {
        match self.clock {
            None => system_clock_ms() & MAX_PHYSICAL_MS,
            Some(clock) => clock() & MAX_PHYSICAL_MS,
        }
    }

    /// Local or send event: returns a timestamp greater than every one this clock has
    /// returned or seen before.
    #[inline]
    pub fn tick(&self) -> HlcTimestamp {
        self.tick_at(self.physical())
    }

    /// This clock's physical time now, in milliseconds (the system wall clock, or the
    /// custom clock it was made with). A caller that handles many events in a burst
    /// reads it once and passes it to [`tick_at`](Self::tick_at) /
    /// [`update_at`](Self::update_at).
    #[inline]
    pub fn physical_ms(&self) -> u64 {
        self.physical()
    }

    /// [`tick`](Self::tick) with a physical time the caller read earlier from
    /// [`physical_ms`](Self::physical_ms) (one clock read for a burst of events). A
    /// `physical_ms` older than the clock's `l` only means the logical counter moves
    /// instead: the result is still greater than every timestamp issued or seen before.
    /// Pass a reading of this clock's own physical source, never a time ahead of it.
    ///
    /// ```
    /// use ringkernel_core::hlc::HlcClock;
    /// let c = HlcClock::new(1);
    /// let pt = c.physical_ms();
    /// let (a, b) = (c.tick_at(pt), c.tick_at(pt));
    /// assert!(b > a);
    /// ```
    #[inline]
    pub fn tick_at(&self, physical_ms: u64) -> HlcTimestamp {
        let pt = physical_ms & MAX_PHYSICAL_MS;
        let mut old = self.state.load(Ordering::Relaxed);
        loop {
            if pt <= old >> LOGICAL_BITS {
                // l stays (or moved on meanwhile, which is just as good): bump the
                // counter. fetch_add never fails and always hands out a unique value,
                // larger than anything stored before it.
                let prev = self.state.fetch_add(1, Ordering::AcqRel);
                return self.stamp(prev.wrapping_add(1));
            }
            let new = HlcTimestamp::new(pt, 0).time;
            match self
                .state
                .compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return self.stamp(new),
                Err(now) => old = now,
            }
        }
    }

    /// [`tick_at`](Self::tick_at) for a clock that one thread at a time advances (a
    /// kernel's clock, ticked and updated only by the worker running the kernel's
    /// turn): a load and a store instead of a read-modify-write, which on x86 is a
    /// locked instruction that also waits for the thread's earlier stores (a message
    /// just copied into a queue) to leave its store buffer. Same result as `tick_at`.
    /// Readers ([`peek`](Self::peek)) may run at any time. If another thread ticks or
    /// updates the clock at the same moment, two events may get the same timestamp:
    /// use [`tick_at`](Self::tick_at) wherever that can happen.
    ///
    /// ```
    /// use ringkernel_core::hlc::HlcClock;
    /// let c = HlcClock::new(1);
    /// let pt = c.physical_ms();
    /// let a = c.tick_at_exclusive(pt);
    /// let b = c.tick_at(pt);
    /// assert!(b > a && c.tick_at_exclusive(pt) > b);
    /// ```
    #[inline]
    pub fn tick_at_exclusive(&self, physical_ms: u64) -> HlcTimestamp {
        let new = next_after(
            self.state.load(Ordering::Acquire),
            physical_ms & MAX_PHYSICAL_MS,
        );
        self.state.store(new, Ordering::Release);
        self.stamp(new)
    }

    /// [`update_at`](Self::update_at) for a clock that one thread at a time advances;
    /// see [`tick_at_exclusive`](Self::tick_at_exclusive). Same result and the same
    /// drift check as `update_at`.
    ///
    /// ```
    /// use ringkernel_core::hlc::HlcClock;
    /// let (a, b) = (HlcClock::new(1), HlcClock::new(2));
    /// let sent = a.tick();
    /// let got = b.update_at_exclusive(&sent, b.physical_ms()).unwrap();
    /// assert!(got > sent && b.tick() > got);
    /// ```
    #[inline]
    pub fn update_at_exclusive(
        &self,
        remote: &HlcTimestamp,
        physical_ms: u64,
    ) -> Result<HlcTimestamp> {
        let pt = self.check_drift(remote, physical_ms)?;
        let new = next_after(self.state.load(Ordering::Acquire).max(remote.time), pt);
        self.state.store(new, Ordering::Release);
        Ok(self.stamp(new))
    }

    /// `physical_ms` masked to the clock's range, or [`Error::ClockDrift`] if `remote`
    /// is more than the maximum drift ahead of it.
    #[inline(always)]
    fn check_drift(&self, remote: &HlcTimestamp, physical_ms: u64) -> Result<u64> {
        let pt = physical_ms & MAX_PHYSICAL_MS;
        let lm = remote.physical_ms();
        if lm > pt.saturating_add(self.max_drift_ms) {
            return Err(Error::ClockDrift {
                drift_ms: lm - pt,
                max_drift_ms: self.max_drift_ms,
            });
        }
        Ok(pt)
    }

    /// Reserves `n` consecutive timestamps (`n ≥ 1`) and returns the first: the batch is
    /// `first, first + 1, …, first + n − 1` (as packed values, so a counter overflow
    /// carries into the physical part), all greater than every timestamp issued before,
    /// and the clock continues after the last. Drain passes on GPUs use this to give each
    /// message of a batch its own receive timestamp without a round trip per message.
    pub fn reserve(&self, n: u32) -> HlcTimestamp {
        let n = u64::from(n.max(1));
        let pt = self.physical();
        let mut old = self.state.load(Ordering::Relaxed);
        loop {
            let first = if pt > old >> LOGICAL_BITS {
                HlcTimestamp::new(pt, 0).time
            } else {
                old + 1
            };
            match self.state.compare_exchange_weak(
                old,
                first + (n - 1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return self.stamp(first),
                Err(now) => old = now,
            }
        }
    }

    /// Receive event: merges `remote` per the paper's rules and returns the new
    /// timestamp (greater than `remote` and than every earlier local one).
    /// [`Error::ClockDrift`] if `remote` is more than the
    /// maximum drift ahead of the physical clock; the clock is then unchanged.
    pub fn update(&self, remote: &HlcTimestamp) -> Result<HlcTimestamp> {
        self.update_at(remote, self.physical())
    }

    /// [`update`](Self::update) with a physical time the caller read earlier from
    /// [`physical_ms`](Self::physical_ms). An old reading makes the drift check
    /// stricter, never looser: on [`Error::ClockDrift`] a caller holding an old reading
    /// should read the clock again and retry before it refuses the message.
    ///
    /// ```
    /// use ringkernel_core::hlc::HlcClock;
    /// let (a, b) = (HlcClock::new(1), HlcClock::new(2));
    /// let sent = a.tick();
    /// let got = b.update_at(&sent, b.physical_ms()).unwrap();
    /// assert!(got > sent);
    /// ```
    #[inline]
    pub fn update_at(&self, remote: &HlcTimestamp, physical_ms: u64) -> Result<HlcTimestamp> {
        let pt = self.check_drift(remote, physical_ms)?;
        let mut old = self.state.load(Ordering::Relaxed);
        loop {
            let new = next_after(old.max(remote.time), pt);
            match self
                .state
                .compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(self.stamp(new)),
                Err(now) => old = now,
            }
        }
    }

    /// The latest timestamp issued, without advancing.
    pub fn peek(&self) -> HlcTimestamp {
        self.stamp(self.state.load(Ordering::Acquire))
    }

    /// The configured maximum drift in milliseconds.
    pub fn max_drift_ms(&self) -> u64 {
        self.max_drift_ms
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reserve_hands_out_a_fresh_consecutive_batch() {
        let c = HlcClock::new(1);
        let before = c.tick();
        let first = c.reserve(5);
        assert!(first > before);
        let after = c.tick();
        assert!(
            after.packed() >= first.packed() + 5,
            "the clock continues after the whole batch"
        );
        assert!(c.reserve(0) > after, "n = 0 counts as 1");
    }

    use super::*;

    #[test]
    fn pack_round_trip_and_order() {
        let t = HlcTimestamp::new(MAX_PHYSICAL_MS, MAX_LOGICAL);
        assert_eq!(t.physical_ms(), MAX_PHYSICAL_MS);
        assert_eq!(t.logical(), MAX_LOGICAL);
        assert!(HlcTimestamp::new(5, MAX_LOGICAL) < HlcTimestamp::new(6, 0));
        assert!(HlcTimestamp::new(5, 1) > HlcTimestamp::new(5, 0));
    }

    #[test]
    fn system_clock_is_near_system_time() {
        let ours = system_clock_ms();
        let std_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        // The coarse clock lags by at most one timer tick (<= 10 ms, allow slack).
        assert!(
            ours <= std_ms + 1 && std_ms - ours < 50,
            "{ours} vs {std_ms}"
        );
    }

    /// The single-writer versions give exactly what the read-modify-write ones give,
    /// for any mix of sends and receives, physical times that stall or jump, and
    /// remote stamps ahead of or behind the clock.
    #[test]
    fn exclusive_ticks_and_updates_match_the_atomic_ones() {
        let (a, b) = (HlcClock::new(5), HlcClock::new(5));
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut pt = 1_000u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            pt += x % 3; // stalls most of the time, sometimes moves on
            if x.is_multiple_of(5) {
                let remote = HlcTimestamp::new(pt + (x >> 8) % 4 - 1, (x >> 16) as u32 % 8); // pt - 1 ..= pt + 2
                let (ra, rb) = (a.update_at(&remote, pt), b.update_at_exclusive(&remote, pt));
                assert_eq!(ra.ok(), rb.ok());
            } else {
                assert_eq!(a.tick_at(pt), b.tick_at_exclusive(pt));
            }
        }
        // A remote stamp beyond the drift is refused the same way, the clock unchanged.
        let far = HlcTimestamp::new(pt + 10 * DEFAULT_MAX_DRIFT_MS, 0);
        assert!(b.update_at_exclusive(&far, pt).is_err());
        assert_eq!(a.peek(), b.peek());
    }

    #[test]
    fn tick_follows_system_time() {
        let c = HlcClock::new(4);
        let t = c.tick();
        assert_eq!(t.node(), 4);
        assert!(t.physical_ms() + 50 > system_clock_ms());
        assert_eq!(c.peek(), t);
    }
}
