//! Deadlines for futures, driven by one process-wide thread, under any executor.
//!
//! A receive with a timeout arms a deadline every time it goes to sleep, and most of
//! them are dropped long before they expire (the message came). The timer thread
//! therefore only hears of a deadline when it is earlier than the one the thread sleeps
//! until; arming a later one, or dropping one, is a map insert or remove under a lock
//! and no system call. (`futures-timer`, used before, woke its thread on every arm and
//! every drop: two OS wake-ups per sleeping receive; BENCHMARKS.md has what removing
//! them saved on the host side of the CPU pipeline.) After its earliest deadline is
//! dropped the thread still sleeps until that time, so a receiver that arms a
//! 30-second deadline over and over wakes it about once in 30 seconds.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! let t0 = Instant::now();
//! rt.block_on(ringkernel_core::timer::Deadline::after(Duration::from_millis(5)));
//! assert!(t0.elapsed() >= Duration::from_millis(5));
//! ```

use std::collections::btree_map::{BTreeMap, Entry};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The armed deadlines and when the thread wakes next.
struct Timers {
    /// Keyed by deadline, then by a unique number (equal deadlines stay apart).
    armed: BTreeMap<(Instant, u64), Waker>,
    /// When the thread wakes next, whatever is armed (`None`: only when unparked).
    wakes_at: Option<Instant>,
}

struct Shared {
    timers: Mutex<Timers>,
    thread: OnceLock<Thread>,
    next_key: AtomicU64,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        timers: Mutex::new(Timers {
            armed: BTreeMap::new(),
            wakes_at: None,
        }),
        thread: OnceLock::new(),
        next_key: AtomicU64::new(0),
    })
}

fn lock(s: &Shared) -> MutexGuard<'_, Timers> {
    // Wakers are called outside the lock; nothing panics while holding it.
    s.timers.lock().unwrap_or_else(|e| e.into_inner())
}

/// The timer thread, started on first use. `None` if the OS refused a thread: the
/// deadline then completes at once (a timeout that comes early, never a hang).
fn thread(s: &'static Shared) -> Option<&'static Thread> {
    if let Some(t) = s.thread.get() {
        return Some(t);
    }
    static STARTING: Mutex<()> = Mutex::new(());
    let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = s.thread.get() {
        return Some(t);
    }
    let t = std::thread::Builder::new()
        .name("rk-timer".into())
        .spawn(move || run(s))
        .ok()?;
    let _ = s.thread.set(t.thread().clone());
    s.thread.get()
}

fn run(s: &'static Shared) {
    let mut due = Vec::new();
    loop {
        let sleep_until = {
            let mut t = lock(s);
            let now = Instant::now();
            while let Some(entry) = t.armed.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove());
            }
            let next = t.armed.keys().next().map(|k| k.0);
            // Past deadlines that were dropped are forgotten; a later one is kept even
            // when dropped (see the module doc).
            t.wakes_at = match (next, t.wakes_at) {
                (Some(n), Some(w)) if w > now => Some(n.min(w)),
                (Some(n), _) => Some(n),
                (None, Some(w)) if w > now => Some(w),
                (None, _) => None,
            };
            t.wakes_at
        };
        for w in due.drain(..) {
            w.wake();
        }
        match sleep_until {
            Some(at) => std::thread::park_timeout(at.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
    }
}

/// A future that completes at a point in time (see the module doc).
#[derive(Debug)]
pub struct Deadline {
    at: Instant,
    /// Set while armed in the timer map.
    key: Option<(Instant, u64)>,
}

impl Deadline {
    /// Completes at `at` (at once if that has passed).
    pub fn at(at: Instant) -> Self {
        Deadline { at, key: None }
    }

    /// Completes after `d`.
    pub fn after(d: Duration) -> Self {
        let now = Instant::now();
        Self::at(
            now.checked_add(d)
                .unwrap_or(now + Duration::from_secs(86_400 * 365)),
        )
    }
}

impl Future for Deadline {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            self.disarm();
            return Poll::Ready(());
        }
        let s = shared();
        let Some(thread) = thread(s) else {
            return Poll::Ready(());
        };
        let at = self.at;
        let key = *self
            .key
            .get_or_insert_with(|| (at, s.next_key.fetch_add(1, Ordering::Relaxed)));
        let unpark = {
            let mut t = lock(s);
            match t.armed.entry(key) {
                Entry::Occupied(mut e) => {
                    if !e.get().will_wake(cx.waker()) {
                        e.get_mut().clone_from(cx.waker());
                    }
                    false
                }
                // First poll (or, defensively, one after the thread fired it).
                Entry::Vacant(e) => {
                    e.insert(cx.waker().clone());
                    let earlier = t.wakes_at.is_none_or(|w| at < w);
                    if earlier {
                        t.wakes_at = Some(at);
                    }
                    earlier
                }
            }
        };
        if unpark {
            thread.unpark();
        }
        Poll::Pending
    }
}

impl Deadline {
    fn disarm(&mut self) {
        if let Some(key) = self.key.take() {
            lock(shared()).armed.remove(&key);
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.disarm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    /// Runs `f` to completion on this thread (parks between polls).
    fn block_on<F: Future>(f: F) -> F::Output {
        struct Unpark(Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    fn armed() -> usize {
        lock(shared()).armed.len()
    }

    /// Deadlines complete at their time, not before; an earlier one
    /// armed while the thread sleeps until a later one still fires on time; dropped
    /// ones leave nothing behind.
    #[test]
    fn deadlines_fire_in_time_and_leave_nothing_behind() {
        let t0 = Instant::now();
        // A long one first, so the thread sleeps until far ahead...
        let long = std::thread::spawn(|| block_on(Deadline::after(Duration::from_secs(3))));
        std::thread::sleep(Duration::from_millis(20));
        // ...then shorter ones from several threads.
        let hs: Vec<_> = [40u64, 10, 25]
            .into_iter()
            .map(|ms| {
                std::thread::spawn(move || {
                    let d = Duration::from_millis(ms);
                    let start = Instant::now();
                    block_on(Deadline::after(d));
                    (d, start.elapsed())
                })
            })
            .collect();
        for h in hs {
            let (d, took) = h.join().unwrap();
            assert!(took >= d, "{d:?} completed after {took:?}");
            // Generous: a loaded CI machine delays threads.
            assert!(took < d + Duration::from_millis(900), "{d:?} took {took:?}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the short ones waited for the long one"
        );
        long.join().unwrap();
        assert!(t0.elapsed() >= Duration::from_secs(3));
        // Dropped before expiry: disarmed.
        let mut d = Box::pin(Deadline::after(Duration::from_secs(60)));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(d.as_mut().poll(&mut cx).is_pending());
        assert!(armed() >= 1);
        drop(d);
        // Other tests in this binary may arm their own meanwhile; ours is gone.
        assert!(!lock(shared())
            .armed
            .keys()
            .any(|k| k.0 > Instant::now() + Duration::from_secs(30)));
        // A past deadline is ready at once and arms nothing.
        let mut p = Box::pin(Deadline::at(Instant::now()));
        assert!(p.as_mut().poll(&mut cx).is_ready());
        assert!(p.key.is_none());
    }
}
