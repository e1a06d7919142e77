//! Host side of the persistent kernels' metrics: handler-latency samples the device
//! measures on its own clock (`%globaltimer`), and the reasons behind dropped messages.
//!
//! ## Latency ring
//!
//! Each kernel has a ring of [`LATENCY_RING_CAPACITY`] 64-bit entries in mapped host
//! memory. For the `i`-th message it takes (counting every message, from 0), the
//! device writes entry `i & (capacity - 1)` with one 64-bit store:
//! `((i + 1) mod 2^32) << 32 | ns`, where `ns` is the handler's run time in
//! nanoseconds (saturated below [`NO_SAMPLE`]) or [`NO_SAMPLE`] when no handler ran
//! (a corrupt slot). The device never waits for the host: the sequence number in the
//! upper half tells the host whether an entry is the one it expects, not yet written,
//! or already overwritten by a later lap (then the samples in between are lost and
//! counted). So the device needs no extra index, fence or PCIe read per message.

use ringkernel_core::telemetry::LatencyHistogram;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries in each kernel's latency ring (128 KiB of mapped memory).
pub const LATENCY_RING_CAPACITY: usize = 16 * 1024;

/// Latency value of an entry for a message no handler ran on.
pub const NO_SAMPLE: u32 = u32::MAX;

/// The entry the device writes for message `index` (mirrors `persistent.cu`).
pub fn encode_sample(index: u64, ns: u64) -> u64 {
    let ns = ns.min(NO_SAMPLE as u64 - 1);
    (index.wrapping_add(1) << 32) | ns
}

/// What one [`LatencyReader::fold`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Folded {
    /// Samples added to the histogram.
    pub recorded: u64,
    /// Entries consumed that carried no sample (no handler ran).
    pub skipped: u64,
    /// Samples the device overwrote before the host read them.
    pub lost: u64,
}

/// Reads a latency ring in order, folding its samples into a histogram.
#[derive(Debug, Default)]
pub struct LatencyReader {
    /// Index of the next entry to read.
    next: u64,
}

impl LatencyReader {
    /// A reader at entry 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Index of the next entry this reader expects.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Records every entry written since the last call into `hist` (the device may be
    /// writing concurrently). `ring.len()` must be a power of two.
    pub fn fold(&mut self, ring: &[AtomicU64], hist: &LatencyHistogram) -> Folded {
        debug_assert!(ring.len().is_power_of_two());
        let cap = ring.len() as u64;
        let mask = cap - 1;
        let mut out = Folded::default();
        // Counted locally and added once (a stream folds millions of samples a second).
        let mut batch = hist.batch();
        loop {
            let entry = ring[(self.next & mask) as usize].load(Ordering::Acquire);
            let expected = self.next.wrapping_add(1) as u32;
            let seq = (entry >> 32) as u32;
            let ahead = seq.wrapping_sub(expected) as i32;
            if ahead < 0 {
                // Not written yet (an entry of an earlier lap, or still zero).
                return out;
            }
            if ahead > 0 {
                // A later lap overwrote it: the entry holds message `written`, and the
                // device writes in order, so every message from `written - cap + 1` on
                // may still be in the ring.
                let written = self.next + ahead as u64;
                let resume = (written + 1).saturating_sub(cap).max(self.next + 1);
                out.lost += resume - self.next;
                self.next = resume;
                continue;
            }
            let ns = entry as u32;
            if ns == NO_SAMPLE {
                out.skipped += 1;
            } else {
                batch.record(ns as u64);
                out.recorded += 1;
            }
            self.next += 1;
        }
    }
}

/// Codes a persistent kernel writes into the control block's `last_error`
/// (`RK_ERR_*` in `kernels/ringkernel.cuh`).
pub mod device_error {
    /// A slot's magic, version or payload length is wrong.
    pub const BAD_HEADER: u32 = 1;
    /// A message's HLC timestamp was too far ahead of the device clock.
    pub const CLOCK_DRIFT: u32 = 2;
    /// The handler failed (returned a negative code, or wrote an oversized reply).
    pub const HANDLER: u32 = 3;
    /// A flagged checksum did not match the payload.
    pub const CHECKSUM: u32 = 4;
}

/// Why the device dropped a message, from the code it left in `last_error`.
pub fn drop_reason(code: u32) -> String {
    match code {
        device_error::BAD_HEADER => {
            "corrupt message header (magic, version or payload length)".into()
        }
        device_error::CLOCK_DRIFT => "timestamp too far ahead of the device clock".into(),
        device_error::HANDLER => "the handler failed or wrote an oversized reply".into(),
        device_error::CHECKSUM => "payload checksum mismatch".into(),
        0 => "unknown (no error code recorded)".into(),
        other => format!("the handler returned error code -{other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(cap: usize) -> Vec<AtomicU64> {
        (0..cap).map(|_| AtomicU64::new(0)).collect()
    }

    fn write(ring: &[AtomicU64], index: u64, ns: u64) {
        let e = encode_sample(index, ns);
        ring[(index as usize) & (ring.len() - 1)].store(e, Ordering::Release);
    }

    #[test]
    fn reads_in_order_and_stops_at_unwritten_entries() {
        let r = ring(8);
        let h = LatencyHistogram::new();
        let mut rd = LatencyReader::new();
        assert_eq!(
            rd.fold(&r, &h),
            Folded::default(),
            "zeroed ring: nothing yet"
        );
        for i in 0..3 {
            write(&r, i, 100 * (i + 1));
        }
        // Entry 4 written before entry 3: the reader waits for 3.
        write(&r, 4, 999);
        assert_eq!(rd.fold(&r, &h).recorded, 3);
        assert_eq!((h.count(), h.max(), rd.position()), (3, 300, 3));
        write(&r, 3, 5);
        assert_eq!(rd.fold(&r, &h).recorded, 2);
        assert_eq!((h.count(), h.max()), (5, 999));
    }

    #[test]
    fn wraps_around_the_ring_many_times() {
        let r = ring(4);
        let h = LatencyHistogram::new();
        let mut rd = LatencyReader::new();
        for i in 0..1000u64 {
            write(&r, i, i % 7 + 1);
            if i % 3 == 2 {
                assert_eq!(rd.fold(&r, &h).lost, 0);
            }
        }
        rd.fold(&r, &h);
        assert_eq!((h.count(), rd.position()), (1000, 1000));
    }

    #[test]
    fn overwritten_samples_are_counted_as_lost() {
        let r = ring(4);
        let h = LatencyHistogram::new();
        let mut rd = LatencyReader::new();
        for i in 0..10u64 {
            write(&r, i, 10 + i);
        }
        // Entries 6..10 are still there; 0..6 were overwritten.
        let f = rd.fold(&r, &h);
        assert_eq!((f.lost, f.recorded), (6, 4));
        assert_eq!((h.percentile(0.0), h.max()), (16, 19));
    }

    #[test]
    fn entries_without_a_sample_are_skipped_and_values_saturate() {
        let r = ring(4);
        let h = LatencyHistogram::new();
        let mut rd = LatencyReader::new();
        r[0].store((1u64 << 32) | NO_SAMPLE as u64, Ordering::Release);
        write(&r, 1, u64::MAX);
        let f = rd.fold(&r, &h);
        assert_eq!((f.skipped, f.recorded), (1, 1));
        assert_eq!(h.max(), NO_SAMPLE as u64 - 1);
    }

    #[test]
    fn the_sequence_number_wraps_at_2_pow_32() {
        let r = ring(4);
        let h = LatencyHistogram::new();
        let start = (1u64 << 32) - 2;
        let mut rd = LatencyReader { next: start };
        for i in start..start + 4 {
            write(&r, i, 7);
        }
        assert_eq!(rd.fold(&r, &h).recorded, 4);
        assert_eq!(rd.position(), start + 4);
    }

    #[test]
    fn reasons_name_each_code() {
        assert!(drop_reason(device_error::CHECKSUM).contains("checksum"));
        assert!(drop_reason(device_error::BAD_HEADER).contains("header"));
        assert!(drop_reason(device_error::CLOCK_DRIFT).contains("clock"));
        assert!(drop_reason(17).contains("-17"));
    }
}
