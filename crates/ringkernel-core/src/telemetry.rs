//! Telemetry: per-kernel counters, handler-latency histograms and runtime snapshots.

use crate::backend::BackendKind;
use crate::ids::KernelId;
use crate::lifecycle::LifecycleState;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Bits of linear resolution inside each power-of-two range (32 sub-buckets).
const SUB_BITS: u32 = 5;
/// Sub-buckets per power-of-two range.
const SUB: usize = 1 << SUB_BITS;
/// Number of buckets: values below `SUB` exactly, then `SUB` per power of two up to 2^64.
const BUCKETS: usize = (65 - SUB_BITS as usize) * SUB;

/// Largest relative error of [`LatencyHistogram::percentile`] against the exact
/// nearest-rank percentile of the recorded samples: half a sub-bucket, `1 / 64`.
pub const HISTOGRAM_MAX_RELATIVE_ERROR: f64 = 1.0 / (2 * SUB) as f64;

/// Lock-free latency histogram (log-linear buckets, nanoseconds), safe to record into
/// from one thread while others read percentiles.
///
/// Values below 32 are counted exactly; above, each power-of-two range `[2^e, 2^(e+1))`
/// is split into 32 equal sub-buckets, so a bucket is at most 1/32 of its lower bound
/// wide and a percentile (reported as the bucket's midpoint) is within
/// [`HISTOGRAM_MAX_RELATIVE_ERROR`] of the exact one. Recording is three relaxed atomic
/// adds and an atomic max; any number of threads may record at once.
///
/// ```
/// use ringkernel_core::telemetry::LatencyHistogram;
/// let h = LatencyHistogram::new();
/// for ns in 1..=1000 { h.record(ns); }
/// let p50 = h.percentile(0.5);
/// assert!((p50 as f64 - 500.0).abs() <= 500.0 / 64.0 + 1.0);
/// assert_eq!(h.percentile(1.0), 1000);
/// ```
pub struct LatencyHistogram {
    /// The buckets, `SUB` per power-of-two range; a range's are allocated on its first
    /// sample (a histogram costs about 1 KB until used, and a kernel's handler times
    /// usually fall into a few ranges).
    groups: Box<[OnceLock<Box<[AtomicU64; SUB]>>]>,
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
    min: AtomicU64,
}

/// Samples counted locally for a [`LatencyHistogram`] ([`LatencyHistogram::batch`]).
#[derive(Debug)]
pub struct HistogramBatch<'a> {
    hist: &'a LatencyHistogram,
    /// Bucket of the current run of samples (`usize::MAX`: none yet).
    bucket: usize,
    in_bucket: u64,
    count: u64,
    sum: u64,
    min: u64,
    max: u64,
}

impl HistogramBatch<'_> {
    /// Counts one sample.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        let b = bucket_of(ns);
        if b != self.bucket {
            self.end_run();
            self.bucket = b;
        }
        self.in_bucket += 1;
        self.count += 1;
        self.sum = self.sum.wrapping_add(ns);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Adds the current run of samples to its bucket.
    fn end_run(&mut self) {
        if self.in_bucket > 0 {
            self.hist
                .bucket(self.bucket)
                .fetch_add(self.in_bucket, Ordering::Relaxed);
            self.in_bucket = 0;
        }
    }

    /// Adds the samples counted so far to the histogram (the batch can go on).
    pub fn flush(&mut self) {
        self.end_run();
        if self.count == 0 {
            return;
        }
        let h = self.hist;
        h.sum.fetch_add(self.sum, Ordering::Relaxed);
        h.max.fetch_max(self.max, Ordering::Relaxed);
        h.min.fetch_min(self.min, Ordering::Relaxed);
        h.count.fetch_add(self.count, Ordering::Relaxed);
        (self.count, self.sum, self.min, self.max) = (0, 0, u64::MAX, 0);
    }
}

impl Drop for HistogramBatch<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("summary", &self.summary())
            .finish()
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

/// Bucket of value `v`.
#[inline(always)]
fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        v as usize
    } else {
        let e = 63 - v.leading_zeros(); // >= SUB_BITS
        let sub = (v >> (e - SUB_BITS)) as usize - SUB;
        (e - SUB_BITS + 1) as usize * SUB + sub
    }
}

/// Smallest value and width of bucket `i`.
#[inline]
fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB {
        (i as u64, 1)
    } else {
        let e = (i / SUB) as u32 + SUB_BITS - 1;
        let sub = (i % SUB) as u64;
        let width = 1u64 << (e - SUB_BITS);
        ((SUB as u64 + sub) << (e - SUB_BITS), width)
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        LatencyHistogram {
            groups: (0..BUCKETS / SUB).map(|_| OnceLock::new()).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
            min: AtomicU64::new(u64::MAX),
        }
    }

    /// The counter of bucket `b` (its group is allocated on first use).
    #[inline]
    fn bucket(&self, b: usize) -> &AtomicU64 {
        &self.groups[b / SUB].get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU64::new(0))))
            [b % SUB]
    }

    /// Records one sample.
    #[inline]
    pub fn record(&self, ns: u64) {
        self.bucket(bucket_of(ns)).fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        if ns > self.max.load(Ordering::Relaxed) {
            self.max.fetch_max(ns, Ordering::Relaxed);
        }
        if ns < self.min.load(Ordering::Relaxed) {
            self.min.fetch_min(ns, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Records `n` samples of the same value `ns` (one update per counter, however
    /// large `n`).
    pub fn record_n(&self, ns: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.bucket(bucket_of(ns)).fetch_add(n, Ordering::Relaxed);
        self.sum.fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
        self.min.fetch_min(ns, Ordering::Relaxed);
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    /// A recorder for many samples from one thread: it counts them locally and adds
    /// them to this histogram when dropped (or [`HistogramBatch::flush`]ed), one atomic
    /// add per run of samples in the same bucket and one for each of the totals,
    /// instead of [`record`](Self::record)'s three adds and a max per sample. Readers
    /// see the batch's samples only after the flush.
    ///
    /// ```
    /// use ringkernel_core::telemetry::LatencyHistogram;
    /// let h = LatencyHistogram::new();
    /// {
    ///     let mut b = h.batch();
    ///     for ns in [500, 510, 505, 9_000] { b.record(ns); }
    /// }
    /// assert_eq!((h.count(), h.max()), (4, 9_000));
    /// ```
    pub fn batch(&self) -> HistogramBatch<'_> {
        HistogramBatch {
            hist: self,
            bucket: usize::MAX,
            in_bucket: 0,
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Records a duration (saturating at `u64::MAX` nanoseconds).
    pub fn record_duration(&self, d: Duration) {
        self.record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Largest sample (0 when empty).
    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// The value below which fraction `q` (0..=1) of the samples lie (bucket resolution,
    /// relative error at most a few percent). 0 when empty.
    ///
    /// This is the nearest-rank percentile (the `ceil(q * n)`-th smallest sample) up to
    /// [`HISTOGRAM_MAX_RELATIVE_ERROR`], clamped to the recorded minimum and maximum, so
    /// `percentile(0.0)` is the smallest and `percentile(1.0)` the largest sample.
    /// A `q` outside `0..=1` is clamped; NaN counts as 0.
    pub fn percentile(&self, q: f64) -> u64 {
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        // Count from the buckets themselves so a concurrent `record` cannot make the
        // rank point past the last bucket.
        let counts: Vec<u64> = self
            .groups
            .iter()
            .flat_map(|g| match g.get() {
                Some(g) => g.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
                None => vec![0; SUB],
            })
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let (lo, hi) = (
            self.min.load(Ordering::Relaxed),
            self.max.load(Ordering::Relaxed),
        );
        // The extremes are tracked exactly.
        if rank == total && hi != 0 {
            return hi;
        }
        if rank == 1 && lo != u64::MAX {
            return lo.min(hi);
        }
        let mut seen = 0u64;
        for (i, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (start, width) = bucket_range(i);
                let mid = start + (width - 1) / 2;
                return mid.clamp(lo.min(hi), hi);
            }
        }
        hi
    }

    /// count, p50, p90, p99, max, mean. (The mean assumes the samples sum to less than
    /// 2^64 ns, about 584 years.)
    pub fn summary(&self) -> LatencySummary {
        let count = self.count.load(Ordering::Relaxed);
        if count == 0 {
            return LatencySummary::default();
        }
        LatencySummary {
            count,
            p50_ns: self.percentile(0.50),
            p90_ns: self.percentile(0.90),
            p99_ns: self.percentile(0.99),
            max_ns: self.max.load(Ordering::Relaxed),
            mean_ns: self.sum.load(Ordering::Relaxed) as f64 / count as f64,
        }
    }
}

/// Latency percentiles in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    /// Samples recorded.
    pub count: u64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Largest sample.
    pub max_ns: u64,
    /// Mean.
    pub mean_ns: f64,
}

/// Counters one kernel's worker updates (relaxed atomics).
#[derive(Debug, Default)]
pub struct KernelCounters {
    /// Messages accepted into the input queue.
    pub received: AtomicU64,
    /// Messages the handler processed.
    pub processed: AtomicU64,
    /// Messages dropped (handler error, decode error, clock drift); each is logged.
    pub dropped: AtomicU64,
    /// Messages the kernel emitted (replies, K2K, publishes).
    pub emitted: AtomicU64,
    /// Handler latency.
    pub latency: LatencyHistogram,
}

/// A snapshot of one kernel's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelMetrics {
    /// Kernel id.
    pub id: KernelId,
    /// Instance name.
    pub name: String,
    /// Lifecycle state at snapshot time.
    pub state: LifecycleState,
    /// Messages accepted into the input queue.
    pub received: u64,
    /// Messages processed by the handler.
    pub processed: u64,
    /// Messages dropped.
    pub dropped: u64,
    /// Messages emitted.
    pub emitted: u64,
    /// Input queue depth.
    pub queue_depth: usize,
    /// Output queue depth.
    pub output_depth: usize,
    /// Handler latency.
    pub latency: LatencySummary,
}

impl KernelCounters {
    /// Snapshot with the given identity and depths.
    pub fn snapshot(
        &self,
        id: KernelId,
        name: &str,
        state: LifecycleState,
        queue_depth: usize,
        output_depth: usize,
    ) -> KernelMetrics {
        KernelMetrics {
            id,
            name: name.to_string(),
            state,
            received: self.received.load(Ordering::Relaxed),
            processed: self.processed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            emitted: self.emitted.load(Ordering::Relaxed),
            queue_depth,
            output_depth,
            latency: self.latency.summary(),
        }
    }
}

/// A runtime-wide snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeMetrics {
    /// Backend of the runtime.
    pub backend: BackendKind,
    /// Time since the runtime started.
    pub uptime: Duration,
    /// One entry per live kernel, by id.
    pub kernels: Vec<KernelMetrics>,
    /// Sum of `received` over kernels.
    pub total_received: u64,
    /// Sum of `processed`.
    pub total_processed: u64,
    /// Sum of `dropped`.
    pub total_dropped: u64,
}

impl RuntimeMetrics {
    /// Builds the totals from per-kernel snapshots.
    pub fn from_kernels(
        backend: BackendKind,
        uptime: Duration,
        mut kernels: Vec<KernelMetrics>,
    ) -> Self {
        kernels.sort_by_key(|k| k.id);
        let sum =
            |f: fn(&KernelMetrics) -> u64| kernels.iter().map(f).fold(0u64, u64::saturating_add);
        RuntimeMetrics {
            backend,
            uptime,
            total_received: sum(|k| k.received),
            total_processed: sum(|k| k.processed),
            total_dropped: sum(|k| k.dropped),
            kernels,
        }
    }
}
