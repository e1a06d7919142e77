//! Small shared utilities: boxed futures, a runtime-agnostic sleep, a seeded RNG for
//! tests and examples, cache-line padding and prefetch.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed, `Send` future (what object-safe async trait methods return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Sleeps without blocking the executor thread. Works under any executor (tokio,
/// smol, `pollster`): it is driven by a timer thread ([`crate::timer`]), not by a
/// runtime's reactor.
pub fn sleep(d: Duration) -> crate::timer::Deadline {
    crate::timer::Deadline::after(d)
}

/// Pads and aligns a value to 128 bytes so that two of them never share a cache line
/// (x86 prefetches lines in adjacent pairs, hence 128 rather than 64): for values
/// that different threads write, such as a queue's head and tail.
///
/// ```
/// use ringkernel_core::util::CachePadded;
/// let head = CachePadded(std::sync::atomic::AtomicU64::new(0));
/// assert_eq!(std::mem::align_of_val(&head), 128);
/// assert_eq!(head.load(std::sync::atomic::Ordering::Relaxed), 0);
/// ```
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct CachePadded<T>(pub T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// SplitMix64: a tiny, fast, seedable generator for test inputs and examples.
/// Not cryptographic.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// A generator seeded from the clock and a counter (fresh inputs every run).
    pub fn from_entropy() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        SplitMix64(t ^ N.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)` as f32.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next_f64() as f32
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Uniform integer in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Relative error `‖out − ref‖₂ / ‖ref‖₂` (absolute error when the reference is zero).
/// Any NaN in `out` gives `f64::INFINITY`.
pub fn rel_error(out: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "rel_error: length mismatch");
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if !o.is_finite() && o.to_bits() != (r as f32).to_bits() {
            return f64::INFINITY;
        }
        let d = o as f64 - r;
        num += d * d;
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Locks `m`, recovering the guard if a panicking thread poisoned it.
///
/// Every mutex in RingKernel guards state that stays consistent across a panic in a
/// user handler (handlers never run while one of these locks is held), so poisoning
/// carries no information here; this is the one place that says so.
///
/// ```
/// use std::sync::Mutex;
/// let m = Mutex::new(1);
/// *ringkernel_core::util::lock(&m) += 1;
/// assert_eq!(*m.lock().unwrap(), 2);
/// ```
pub fn lock<T: ?Sized>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Asks the CPU to bring the cache lines of `bytes` bytes from `p` on into its caches
/// (at most the first 256 bytes), for a loop that will read or write them soon: slot
/// loops over memory another agent wrote (a device's readback) or that no core holds (a
/// mapped upload buffer) otherwise wait for each slot's lines in turn. A hint only: it
/// never faults, whatever the address, and does nothing on targets without one.
///
/// ```
/// let v = vec![0u8; 512];
/// ringkernel_core::util::prefetch(v.as_ptr(), v.len());
/// ringkernel_core::util::prefetch(std::ptr::null(), 64); // any address is fine
/// ```
#[inline(always)]
pub fn prefetch(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes.min(256) {
        let at = p.wrapping_add(off);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHT0 (SSE, part of the x86_64 baseline) only hints the cache; it
        // raises no fault and has no architectural effect for any address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at as *const i8)
        };
        #[cfg(target_arch = "aarch64")]
        // SAFETY: PRFM is a hint: it raises no fault and has no architectural effect for
        // any address; it reads no register but the address and writes none.
        unsafe {
            std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) at, options(nostack, readonly, preserves_flags))
        };
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let _ = at;
        off += 64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_spread() {
        let a: Vec<u64> = {
            let mut r = SplitMix64::new(1);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = SplitMix64::new(1);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        let mut r = SplitMix64::new(2);
        let v = r.vec(10_000, -1.0, 1.0);
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean: f32 = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.05, "mean {mean}");
    }

    #[test]
    fn rel_error_catches_nan_and_differences() {
        assert_eq!(rel_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(rel_error(&[f32::NAN, 2.0], &[1.0, 2.0]).is_infinite());
        assert!((rel_error(&[1.1], &[1.0]) - 0.1).abs() < 1e-6);
    }
}
