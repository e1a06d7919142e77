//! Telemetry: per-kernel counters, handler-latency histograms and runtime snapshots.

use crate::backend::BackendKind;
use crate::lifecycle::LifecycleState;
use crate::runtime::KernelId;
use std::time::Duration;

/// Lock-free latency histogram (log-linear buckets, nanoseconds), safe to record into
/// from one thread while others read percentiles.
#[derive(Debug)]
pub struct LatencyHistogram {
    _todo: (),
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        todo!("telemetry helper")
    }
    /// Records one sample.
    pub fn record(&self, ns: u64) {
        todo!()
    }
    /// The value below which fraction `q` (0..=1) of the samples lie (bucket resolution,
    /// relative error at most a few percent). 0 when empty.
    pub fn percentile(&self, q: f64) -> u64 {
        todo!()
    }
    /// count, p50, p90, p99, max, mean.
    pub fn summary(&self) -> LatencySummary {
        todo!()
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
    pub received: std::sync::atomic::AtomicU64,
    /// Messages the handler processed.
    pub processed: std::sync::atomic::AtomicU64,
    /// Messages dropped (handler error, decode error, clock drift); each is logged.
    pub dropped: std::sync::atomic::AtomicU64,
    /// Messages the kernel emitted (replies, K2K, publishes).
    pub emitted: std::sync::atomic::AtomicU64,
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
        todo!()
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
    pub fn from_kernels(backend: BackendKind, uptime: Duration, kernels: Vec<KernelMetrics>) -> Self {
        todo!()
    }
}
