//! The local stand-in of a kernel of another runtime.
//!
//! A [`RemoteKernel`] is a [`KernelEngine`] in the local runtime's kernel table, named
//! `kernel@node`. Whatever the runtime puts into its input queue (a handler's
//! `send_to("worker@b", ..)`, a host `send`/`call` through its [`KernelHandle`], a
//! publication it is subscribed to) goes to the bridge, which carries it to `node`;
//! messages that kernel sends back to this runtime's host (replies to a `call`) come
//! out of its output queue.
//!
//! [`KernelHandle`]: ringkernel_core::runtime::KernelHandle

use ringkernel_core::lifecycle::LifecycleState;
use ringkernel_core::message::{check_payload_fits, Envelope, MessageHeader};
use ringkernel_core::runtime::{KernelEngine, KernelEvents, KernelId, TerminateReport};
use ringkernel_core::telemetry::{KernelCounters, KernelMetrics};
use ringkernel_core::util::BoxFuture;
use ringkernel_core::{Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Weak};

/// What carries a stand-in's messages to its kernel (the bridge).
pub(crate) trait Carrier: Send + Sync {
    /// Sends one message (header stamped locally) to `to`'s kernel.
    fn carry(&self, to: &RemoteKernel, header: &MessageHeader, payload: &[u8]) -> Result<()>;
}

/// Where a remote kernel is: its runtime's node name and its name or id there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum RemoteTarget {
    /// The host of the remote runtime (replies to its calls).
    Host,
    /// A kernel by instance name.
    Name(String),
    /// A kernel by id.
    Id(u32),
}

/// A remote kernel's stand-in (see the module docs).
pub(crate) struct RemoteKernel {
    pub(crate) id: KernelId,
    pub(crate) name: String,
    pub(crate) node: String,
    pub(crate) target: RemoteTarget,
    pub(crate) bridge: Weak<dyn Carrier>,
    pub(crate) max_payload: usize,
    pub(crate) window: usize,
    pub(crate) output: Mutex<VecDeque<Envelope>>,
    pub(crate) events: KernelEvents,
    pub(crate) counters: KernelCounters,
    pub(crate) terminated: AtomicBool,
}

impl RemoteKernel {
    /// Puts a message the remote kernel sent to this runtime's host into the output
    /// queue.
    pub(crate) fn push_output(&self, env: Envelope) {
        ringkernel_core::util::lock(&self.output).push_back(env);
        self.counters.emitted.fetch_add(1, Ordering::Relaxed);
        self.events.output.notify(usize::MAX);
    }

    fn gone(&self, why: &str) -> Error {
        Error::KernelTerminated(format!("{} ({why})", self.name))
    }
}

impl KernelEngine for RemoteKernel {
    fn id(&self) -> KernelId {
        self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn state(&self) -> LifecycleState {
        if self.terminated.load(Ordering::Acquire) {
            LifecycleState::Terminated
        } else {
            LifecycleState::Active
        }
    }
    fn slot_size(&self) -> usize {
        self.max_payload + ringkernel_core::message::HEADER_SIZE
    }
    fn input_capacity(&self) -> usize {
        self.window
    }
    fn try_enqueue(&self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        if self.terminated.load(Ordering::Acquire) {
            return Err(self.gone("its bridge has closed"));
        }
        check_payload_fits(payload.len(), self.slot_size())?;
        let bridge = self
            .bridge
            .upgrade()
            .ok_or_else(|| self.gone("its bridge has closed"))?;
        bridge.carry(self, header, payload)?;
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        self.counters.processed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn try_dequeue(&self) -> Result<Option<Envelope>> {
        let env = ringkernel_core::util::lock(&self.output).pop_front();
        if env.is_none() && self.terminated.load(Ordering::Acquire) {
            return Err(self.gone("its bridge has closed"));
        }
        Ok(env)
    }
    fn output_depth(&self) -> usize {
        ringkernel_core::util::lock(&self.output).len()
    }
    fn activate(&self) -> Result<()> {
        Err(Error::InvalidState {
            from: self.state(),
            to: LifecycleState::Active,
        })
    }
    fn deactivate(&self) -> Result<()> {
        Err(Error::invalid(format!(
            "{} stands in for a kernel of node {}: its lifecycle belongs to that runtime",
            self.name, self.node
        )))
    }
    fn terminate(&self) -> BoxFuture<'_, Result<TerminateReport>> {
        Box::pin(async move {
            self.terminated.store(true, Ordering::Release);
            self.events.notify_all();
            Ok(TerminateReport {
                replies_waiting: self.output_depth(),
                ..TerminateReport::default()
            })
        })
    }
    fn events(&self) -> &KernelEvents {
        &self.events
    }
    fn metrics(&self) -> KernelMetrics {
        self.counters
            .snapshot(self.id, &self.name, self.state(), 0, self.output_depth())
    }
}
