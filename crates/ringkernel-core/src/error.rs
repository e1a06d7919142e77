//! The one error type of RingKernel.

use crate::backend::BackendKind;
use crate::state::LifecycleState;
use std::time::Duration;

/// Result alias used throughout RingKernel.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure a caller can act on. Bad input never panics: it comes back as one of
/// these.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend cannot be used on this machine (no driver, no adapter, wrong OS).
    #[error("backend {backend} unavailable: {reason}")]
    BackendUnavailable {
        /// Which backend.
        backend: BackendKind,
        /// Why, in words a user can act on.
        reason: String,
    },
    /// A lifecycle transition that the state machine does not allow.
    #[error("invalid kernel state transition {from:?} -> {to:?}")]
    InvalidState {
        /// State the kernel was in.
        from: LifecycleState,
        /// State that was asked for.
        to: LifecycleState,
    },
    /// The destination queue has no free slot (and the caller asked not to wait).
    #[error("queue full (capacity {capacity})")]
    QueueFull {
        /// Capacity of the full queue, in slots.
        capacity: usize,
    },
    /// Nothing arrived (or nothing completed) within the given time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// A payload larger than the slot it must fit into.
    #[error("message of {size} bytes exceeds the maximum payload of {max} bytes")]
    MessageTooLarge {
        /// Payload size in bytes.
        size: usize,
        /// Largest payload the slot can carry.
        max: usize,
    },
    /// Tensor shapes that do not fit the operation.
    #[error("shape mismatch: {0}")]
    ShapeMismatch(String),
    /// A kernel source failed to compile.
    #[error("{backend} kernel compilation failed:\n{log}")]
    Compile {
        /// Backend whose compiler rejected the source.
        backend: BackendKind,
        /// The compiler's log.
        log: String,
    },
    /// A device or driver call failed.
    #[error("device error: {0}")]
    Device(String),
    /// No kernel (or no handler) of that name or id.
    #[error("kernel not found: {0}")]
    KernelNotFound(String),
    /// The kernel has terminated: it accepts no more messages.
    #[error("kernel {0} has terminated")]
    KernelTerminated(String),
    /// An argument that can never be valid (a non-power-of-two capacity, a zero size).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A remote HLC timestamp further ahead of the local physical clock than allowed.
    #[error("clock drift: remote timestamp is {drift_ms} ms ahead, maximum {max_drift_ms} ms")]
    ClockDrift {
        /// How far ahead the remote clock is, in milliseconds.
        drift_ms: u64,
        /// The configured maximum.
        max_drift_ms: u64,
    },
    /// A message of another type than the one asked for.
    #[error("message type mismatch: expected type_id {expected}, found {found}")]
    TypeMismatch {
        /// The `type_id` the caller asked for.
        expected: u32,
        /// The `type_id` of the message received.
        found: u32,
    },
    /// A payload that cannot be read as the message type asked for: a truncated or
    /// corrupted rkyv archive (rkyv's validation refused it), or a serialisation failure.
    #[error("cannot decode a {type_name}: {reason}")]
    Decode {
        /// [`RingMessage::NAME`](crate::message::RingMessage::NAME) of the type.
        type_name: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A message whose encoding (plain data or rkyv, [`flags::RKYV`](crate::message::flags::RKYV))
    /// is not the one its reader or destination uses.
    #[error("message encoding mismatch for type_id {type_id}: {reason}")]
    EncodingMismatch {
        /// `type_id` of the message.
        type_id: u32,
        /// What was expected and what was found.
        reason: String,
    },
}

impl Error {
    /// Shorthand for [`Error::BackendUnavailable`].
    pub fn unavailable(backend: BackendKind, reason: impl Into<String>) -> Self {
        Error::BackendUnavailable {
            backend,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::ShapeMismatch`].
    pub fn shape(msg: impl Into<String>) -> Self {
        Error::ShapeMismatch(msg.into())
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}
