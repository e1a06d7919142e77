//! Typed lock-free multi-producer/single-consumer ring (bounded).
//!
//! ```
//! let (tx, mut rx) = ringkernel_core::queue::mpsc::channel::<u32>(4).unwrap();
//! let tx2 = tx.clone();
//! tx.push(1).unwrap();
//! tx2.push(2).unwrap();
//! assert_eq!(rx.pop(), Some(1));
//! assert_eq!(rx.pop(), Some(2));
//! ```

use super::QueueStats;
use crate::error::Result;

/// Creates a ring of `capacity` items (a power of two).
pub fn channel<T: Send>(capacity: usize) -> Result<(Sender<T>, Receiver<T>)> {
    todo!("queue helper: implement")
}

/// A producing handle; clone it for more producers.
pub struct Sender<T> {
    _p: std::marker::PhantomData<T>,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        todo!()
    }
}

/// The single consuming handle.
pub struct Receiver<T> {
    _p: std::marker::PhantomData<T>,
}

impl<T: Send> Sender<T> {
    /// Pushes `value`; when the ring is full it is handed back in `Err`.
    pub fn push(&self, value: T) -> std::result::Result<(), T> {
        todo!()
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        todo!()
    }
}

impl<T: Send> Receiver<T> {
    /// Pops the oldest item, if any.
    pub fn pop(&mut self) -> Option<T> {
        todo!()
    }
    /// Items waiting now.
    pub fn len(&self) -> usize {
        todo!()
    }
    /// Whether no item is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        todo!()
    }
}
