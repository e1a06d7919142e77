//! The kernel lifecycle states (public as
//! [`lifecycle::LifecycleState`](crate::lifecycle::LifecycleState)). A leaf module: the
//! error type names these states, and the lifecycle module returns that error.

/// The state of a kernel. The numeric values are part of the shared binary layout
/// (they are written into [`ControlBlock`](crate::control::ControlBlock)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum LifecycleState {
    /// Registered, no resources yet.
    Created = 0,
    /// Resources allocated and the worker (thread, persistent kernel, drain task) exists,
    /// but messages are not processed yet.
    Launched = 1,
    /// Processing messages.
    Active = 2,
    /// Paused: messages queue up and are kept, none are processed.
    Deactivated = 3,
    /// Draining what is in flight; no new messages accepted.
    Terminating = 4,
    /// Gone. Nothing is accepted.
    Terminated = 5,
}

impl LifecycleState {
    /// Every state, in declaration order.
    pub const ALL: [LifecycleState; 6] = [
        LifecycleState::Created,
        LifecycleState::Launched,
        LifecycleState::Active,
        LifecycleState::Deactivated,
        LifecycleState::Terminating,
        LifecycleState::Terminated,
    ];

    /// Whether `self → to` is an allowed transition.
    pub fn can_transition_to(self, to: LifecycleState) -> bool {
        use LifecycleState::*;
        matches!(
            (self, to),
            (Created, Launched)
                | (Launched, Active)
                | (Active, Deactivated)
                | (Deactivated, Active)
                | (Launched, Terminating)
                | (Active, Terminating)
                | (Deactivated, Terminating)
                | (Terminating, Terminated)
        )
    }

    /// Decodes the numeric form; `None` for values that name no state.
    #[inline]
    pub fn from_u32(v: u32) -> Option<LifecycleState> {
        LifecycleState::ALL.get(v as usize).copied()
    }

    /// Whether the kernel still accepts messages (Launched, Active or Deactivated).
    #[inline]
    pub fn accepts_messages(self) -> bool {
        matches!(
            self,
            LifecycleState::Launched | LifecycleState::Active | LifecycleState::Deactivated
        )
    }
}
