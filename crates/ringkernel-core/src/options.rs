//! [`LaunchOptions`]: how a kernel is launched.

use crate::error::{Error, Result};
use crate::message::DEFAULT_SLOT_SIZE;

/// Options for [`RingKernelRuntime::launch`](crate::runtime::RingKernelRuntime::launch).
///
/// ```
/// use ringkernel_core::options::LaunchOptions;
/// let o = LaunchOptions::default().with_queue_capacity(4096).with_slot_size(512);
/// assert!(o.validate().is_ok());
/// assert!(LaunchOptions::default().with_queue_capacity(1000).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Input queue capacity in slots (power of two), *per priority lane*: a kernel's
    /// input has one lane per level ([`crate::priority`]), each holding this many
    /// messages, so a full LOW lane does not refuse a HIGH send. Memory: on the CPU a
    /// lane's ring (`queue_capacity × slot_size` bytes) is allocated when its first
    /// message arrives (the NORMAL lane at launch); on WebGPU and Metal the device ring
    /// has `queue_capacity` slots and waiting messages are held on the host heap
    /// (payload bytes only). CUDA documents its lanes in `ringkernel-cuda`.
    pub queue_capacity: usize,
    /// Output queue capacity in slots (power of two).
    pub output_capacity: usize,
    /// Slot size in bytes: 64-byte header plus payload, a multiple of 16 in
    /// 128..=65536 ([`check_slot_size`]). Every message of the kernel takes a whole slot
    /// on every crossing, so a slot fitted to the largest message moves the fewest bytes
    /// (a [`Token`](crate::builtin::Token), 72 bytes: 144).
    pub slot_size: usize,
    /// Threads of each block of the kernel on CUDA: a whole number of warps (a multiple
    /// of 32 there, at most 512); a quarter of them (at least one warp, when there are
    /// two or more; [`inbox_threads`](Self::inbox_threads) sets it) serve the K2K inbox,
    /// the rest the host's input, one message per thread. Must be in 1..=1024 on every
    /// backend ([`validate`](Self::validate)), but only CUDA uses it: the CPU handles one
    /// message at a time per kernel, and the WebGPU and Metal drain passes use the
    /// workgroup size fixed in their WGSL, whatever this says.
    pub block_size: u32,
    /// Threads of each block that serve the K2K inbox on CUDA, the rest serving the
    /// host's input (`None`: a quarter of `block_size`, at least one warp). A kernel that
    /// mostly receives K2K messages (a sink or aggregator behind other kernels) takes
    /// more of them per round with more: each group's window of slots grows with its
    /// threads, in a shared-memory budget the two groups split. On CUDA it must be a
    /// whole number of warps and leave at least one warp for the host's input; every
    /// backend checks that it is below `block_size` ([`validate`](Self::validate)), and
    /// only CUDA uses it.
    pub inbox_threads: Option<u32>,
    /// Blocks in the grid. Must be at least 1 everywhere. On CUDA every block of the
    /// persistent kernel takes messages of the same queues (replies still leave in
    /// input order); at most one block per multiprocessor, all resident at once
    /// ([`Error::InvalidArgument`] or a launch error otherwise). Ignored by the CPU,
    /// WebGPU and Metal backends.
    pub grid_size: u32,
    /// Activate right after launch (default true). When false the kernel stays
    /// `Launched` until [`KernelHandle::activate`](crate::runtime::KernelHandle::activate).
    pub auto_activate: bool,
    /// When the input queue is full, `send` waits for space (true, default) or returns
    /// [`Error::QueueFull`] at once (false).
    pub wait_when_full: bool,
    /// Bytes of per-kernel state handed to GPU handlers (0: none). Ignored on the CPU,
    /// where the handler owns its state.
    pub state_bytes: usize,
    /// Instance name (default: the handler name). Several kernels may run the same
    /// handler under different instance names; two live kernels never share one.
    pub name: Option<String>,
    /// The kernel's priority ([`crate::priority`], default
    /// [`NORMAL`](crate::priority::NORMAL)): the priority of every message it emits
    /// (replies, K2K sends, publishes), so its output overtakes lower-priority traffic in
    /// the kernels that receive it; and where a backend serves several kernels in turn
    /// (the WebGPU poller finishing drain passes), higher-priority kernels go first.
    pub priority: u8,
    /// Run the kernel on a thread of its own instead of as a task on the backend's
    /// shared worker pool (default false). Only the CPU backend schedules kernels on a
    /// pool (`ringkernel-cpu`: M:N, one worker per core); there a dedicated thread suits
    /// a latency-critical kernel (its thread spins before it parks, and no other
    /// kernel's turn runs ahead of it) or a handler that blocks for long (sleeps, waits
    /// on I/O or a lock). The GPU backends ignore it.
    pub dedicated_thread: bool,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            queue_capacity: 1024,
            output_capacity: 1024,
            slot_size: DEFAULT_SLOT_SIZE,
            block_size: 128,
            inbox_threads: None,
            grid_size: 1,
            auto_activate: true,
            wait_when_full: true,
            state_bytes: 0,
            name: None,
            priority: crate::priority::NORMAL,
            dedicated_thread: false,
        }
    }
}

impl LaunchOptions {
    /// Sets the input and output queue capacity.
    pub fn with_queue_capacity(mut self, slots: usize) -> Self {
        self.queue_capacity = slots;
        self.output_capacity = slots;
        self
    }
    /// Sets only the output queue capacity.
    pub fn with_output_capacity(mut self, slots: usize) -> Self {
        self.output_capacity = slots;
        self
    }
    /// Sets the slot size in bytes.
    pub fn with_slot_size(mut self, bytes: usize) -> Self {
        self.slot_size = bytes;
        self
    }
    /// Sets the CUDA block size ([`block_size`](Self::block_size): ignored by the CPU,
    /// WebGPU and Metal backends).
    pub fn with_block_size(mut self, threads: u32) -> Self {
        self.block_size = threads;
        self
    }
    /// Sets the threads of each block that serve the K2K inbox
    /// ([`inbox_threads`](Self::inbox_threads): CUDA only).
    ///
    /// ```
    /// use ringkernel_core::options::LaunchOptions;
    /// // A K2K sink: 15 of its 16 warps take inbox messages, one the host's input.
    /// let o = LaunchOptions::default().with_block_size(512).with_inbox_threads(480);
    /// assert!(o.validate().is_ok());
    /// assert!(LaunchOptions::default().with_inbox_threads(128).validate().is_err());
    /// ```
    pub fn with_inbox_threads(mut self, threads: u32) -> Self {
        self.inbox_threads = Some(threads);
        self
    }
    /// Sets the grid size ([`grid_size`](Self::grid_size): blocks of a CUDA kernel,
    /// ignored elsewhere).
    pub fn with_grid_size(mut self, blocks: u32) -> Self {
        self.grid_size = blocks;
        self
    }
    /// Sets whether the kernel starts active.
    pub fn with_auto_activate(mut self, yes: bool) -> Self {
        self.auto_activate = yes;
        self
    }
    /// The kernel stays `Launched` until
    /// [`KernelHandle::activate`](crate::runtime::KernelHandle::activate); messages sent
    /// meanwhile wait in its input.
    pub fn without_auto_activate(self) -> Self {
        self.with_auto_activate(false)
    }
    /// Sets the kernel's priority ([`priority`](Self::priority)), e.g.
    /// `with_priority(priority::HIGH)`.
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }
    /// Runs the kernel on a dedicated thread ([`dedicated_thread`](Self::dedicated_thread)).
    ///
    /// ```
    /// use ringkernel_core::options::LaunchOptions;
    /// assert!(LaunchOptions::default().with_dedicated_thread().dedicated_thread);
    /// ```
    pub fn with_dedicated_thread(mut self) -> Self {
        self.dedicated_thread = true;
        self
    }
    /// Sets the backpressure behaviour of `send`.
    pub fn with_wait_when_full(mut self, yes: bool) -> Self {
        self.wait_when_full = yes;
        self
    }
    /// Sets the GPU handler state size in bytes.
    pub fn with_state_bytes(mut self, bytes: usize) -> Self {
        self.state_bytes = bytes;
        self
    }

    /// Sets the instance name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Checks every field; [`Error::InvalidArgument`] names the first bad one.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [
            ("queue_capacity", self.queue_capacity),
            ("output_capacity", self.output_capacity),
        ] {
            if v < 2 || !v.is_power_of_two() || v > (1 << 24) {
                return Err(Error::invalid(format!(
                    "{what} must be a power of two in 2..=16777216, got {v}"
                )));
            }
        }
        check_slot_size(self.slot_size)?;
        if self.block_size == 0 || self.block_size > 1024 {
            return Err(Error::invalid(format!(
                "block_size must be in 1..=1024, got {}",
                self.block_size
            )));
        }
        if let Some(n) = self.inbox_threads {
            if n == 0 || n >= self.block_size {
                return Err(Error::invalid(format!(
                    "inbox_threads must be in 1..block_size ({}), got {n}: some of the block must serve the host's input",
                    self.block_size
                )));
            }
        }
        if matches!(&self.name, Some(n) if n.is_empty()) {
            return Err(Error::invalid("instance name must not be empty"));
        }
        if self.grid_size == 0 {
            return Err(Error::invalid("grid_size must be at least 1"));
        }
        Ok(())
    }
}

/// Largest [`LaunchOptions::slot_size`].
pub const MAX_LAUNCH_SLOT_SIZE: usize = 65536;

/// The rule for [`LaunchOptions::slot_size`], shared by every backend that checks a
/// kernel's slot size: a multiple of [`SLOT_ALIGN`](crate::queue::slot::SLOT_ALIGN) in
/// 128..=65536 (room for the 64-byte header and at least 64 payload bytes).
///
/// ```
/// use ringkernel_core::options::check_slot_size;
/// assert!(check_slot_size(144).is_ok());
/// assert!(check_slot_size(100).is_err() && check_slot_size(112).is_err());
/// ```
pub fn check_slot_size(slot_size: usize) -> Result<()> {
    crate::queue::slot::check_slot_size_up_to(slot_size, MAX_LAUNCH_SLOT_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_named() {
        let d = LaunchOptions::default;
        let refused = |o: LaunchOptions, field: &str| {
            let e = o.validate().unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        };
        refused(d().with_queue_capacity(1000), "queue_capacity");
        refused(d().with_queue_capacity(1), "queue_capacity");
        refused(d().with_slot_size(100), "slot_size");
        refused(d().with_slot_size(64), "slot_size");
        refused(d().with_slot_size(136), "slot_size");
        refused(d().with_slot_size(65536 + 16), "slot_size");
        refused(d().with_block_size(0), "block_size");
        refused(d().with_grid_size(0), "grid_size");
        for bad in [0, 128, 200] {
            refused(d().with_inbox_threads(bad), "inbox_threads");
        }
        assert!(d().validate().is_ok());
        for fitted in [128, 144, 208, 65536] {
            assert!(d().with_slot_size(fitted).validate().is_ok(), "{fitted}");
        }
        assert!(d().with_inbox_threads(96).validate().is_ok());
    }
}
