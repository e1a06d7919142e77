//! Kernel lifecycle: `Created → Launched → Active ⇄ Deactivated → Terminating → Terminated`.
//!
//! A kernel may also be terminated straight from `Launched` (launched but never
//! activated). Every other transition is [`Error::InvalidState`].
//!
//! ```
//! use ringkernel_core::lifecycle::{AtomicLifecycle, LifecycleState::*};
//! let s = AtomicLifecycle::new(Created);
//! s.transition(Launched).unwrap();
//! s.transition(Active).unwrap();
//! assert!(s.transition(Launched).is_err()); // no way back
//! ```

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU32, Ordering};

// The enum is defined in a leaf module (it is part of `Error::InvalidState`, and the
// error module must not depend on this one); its public path is this module.
pub use crate::state::LifecycleState;

impl LifecycleState {
    /// Checks `self → to`, returning [`Error::InvalidState`] when it is not allowed.
    pub fn check_transition(self, to: LifecycleState) -> Result<()> {
        if self.can_transition_to(to) {
            Ok(())
        } else {
            Err(Error::InvalidState { from: self, to })
        }
    }
}

/// A lifecycle state shared between threads, changed only through checked transitions.
#[derive(Debug)]
pub struct AtomicLifecycle(AtomicU32);

impl AtomicLifecycle {
    /// Starts in `state`.
    pub fn new(state: LifecycleState) -> Self {
        AtomicLifecycle(AtomicU32::new(state as u32))
    }

    /// Current state.
    #[inline]
    pub fn get(&self) -> LifecycleState {
        LifecycleState::from_u32(self.0.load(Ordering::Acquire))
            .expect("only valid states are stored")
    }

    /// Moves to `to` if the current state allows it (atomically: of two racing callers
    /// at most one succeeds for a given source state). Returns the previous state.
    pub fn transition(&self, to: LifecycleState) -> Result<LifecycleState> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let from = LifecycleState::from_u32(cur).expect("only valid states are stored");
            from.check_transition(to)?;
            match self
                .0
                .compare_exchange_weak(cur, to as u32, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(from),
                Err(actual) => cur = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LifecycleState::*;
    use super::*;

    #[test]
    fn exhaustive_transition_table() {
        let allowed = [
            (Created, Launched),
            (Launched, Active),
            (Active, Deactivated),
            (Deactivated, Active),
            (Launched, Terminating),
            (Active, Terminating),
            (Deactivated, Terminating),
            (Terminating, Terminated),
        ];
        for from in LifecycleState::ALL {
            for to in LifecycleState::ALL {
                let s = AtomicLifecycle::new(from);
                let r = s.transition(to);
                if allowed.contains(&(from, to)) {
                    assert_eq!(r, Ok(from), "{from:?} -> {to:?} should be allowed");
                    assert_eq!(s.get(), to);
                } else {
                    assert_eq!(
                        r,
                        Err(Error::InvalidState { from, to }),
                        "{from:?} -> {to:?}"
                    );
                    assert_eq!(s.get(), from, "a refused transition must not change state");
                }
            }
        }
    }

    #[test]
    fn numeric_round_trip() {
        for s in LifecycleState::ALL {
            assert_eq!(LifecycleState::from_u32(s as u32), Some(s));
        }
        assert_eq!(LifecycleState::from_u32(6), None);
    }

    #[test]
    fn racing_transitions_only_one_wins() {
        use std::sync::Arc;
        for _ in 0..200 {
            let s = Arc::new(AtomicLifecycle::new(Active));
            let wins: usize = (0..4)
                .map(|_| {
                    let s = s.clone();
                    std::thread::spawn(move || s.transition(Deactivated).is_ok() as usize)
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .sum();
            assert_eq!(wins, 1);
        }
    }
}
