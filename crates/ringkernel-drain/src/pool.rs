//! A bounded buffer pool, generic over the allocator.
//!
//! Allocating a Metal buffer is a kernel call that also zero-fills pages, so freshly
//! freed buffers are kept for reuse. Pools that only ever grow are the best-known
//! problem of Metal backends elsewhere, so this one is bounded:
//!
//! * requests are rounded up to a *size class* ([`size_class`]: four classes per
//!   power of two, at most 25 % slack), and a free buffer is reused only for its class;
//! * free buffers are kept up to [`PoolConfig::max_pooled_bytes`] in total; past that the
//!   least recently released buffers are dropped (counted as evictions);
//! * a buffer larger than [`PoolConfig::max_buffer_bytes`] is never kept;
//! * when an allocation fails, the pool is emptied and the allocation tried once more.
//!
//! The logic knows nothing about Metal: [`PoolAllocator`] is implemented by the Metal
//! device on Apple targets and by a fake allocator in the Linux tests.
//!
//! ```
//! use ringkernel_drain::pool::{BufferPool, PoolAllocator, PoolConfig};
//! use ringkernel_core::Result;
//!
//! struct Heap;
//! impl PoolAllocator for Heap {
//!     type Buffer = Vec<u8>;
//!     fn allocate(&self, bytes: usize) -> Result<Vec<u8>> { Ok(vec![0; bytes]) }
//!     fn size_of(buf: &Vec<u8>) -> usize { buf.len() }
//! }
//!
//! let pool = BufferPool::new(Heap, PoolConfig { max_pooled_bytes: 1 << 20, ..PoolConfig::default() });
//! let a = pool.acquire(1000).unwrap();
//! assert!(a.len() >= 1000);
//! drop(a); // back into the pool
//! let _b = pool.acquire(900).unwrap(); // same size class: reused
//! assert_eq!(pool.stats().hits, 1);
//! ```

use ringkernel_core::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};

/// Makes the buffers a [`BufferPool`] hands out.
pub trait PoolAllocator: Send + Sync + 'static {
    /// The buffer type.
    type Buffer: Send + Sync + 'static;
    /// Allocates a buffer of exactly `bytes` bytes (`bytes` is a size class, > 0).
    fn allocate(&self, bytes: usize) -> Result<Self::Buffer>;
    /// Size of a buffer in bytes (what [`allocate`](Self::allocate) was asked for).
    fn size_of(buf: &Self::Buffer) -> usize;
}

/// Limits of a [`BufferPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Bytes of free buffers kept at most (0 disables pooling).
    pub max_pooled_bytes: usize,
    /// Buffers larger than this are freed on release, never kept.
    pub max_buffer_bytes: usize,
}

impl Default for PoolConfig {
    /// 256 MiB pooled at most, buffers up to 64 MiB kept.
    fn default() -> Self {
        PoolConfig {
            max_pooled_bytes: 256 << 20,
            max_buffer_bytes: 64 << 20,
        }
    }
}

impl PoolConfig {
    /// A config sized for a device with `working_set` bytes of recommended working
    /// set: an eighth of it pooled (at most 1 GiB), buffers up to a quarter of that.
    pub fn for_working_set(working_set: u64) -> Self {
        let pooled = (working_set / 8).min(1 << 30) as usize;
        PoolConfig {
            max_pooled_bytes: pooled,
            max_buffer_bytes: (pooled / 4).max(1 << 20),
        }
    }
}

/// Counters of a [`BufferPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served from a pooled buffer.
    pub hits: u64,
    /// Requests that allocated a new buffer.
    pub misses: u64,
    /// Pooled buffers freed to respect [`PoolConfig::max_pooled_bytes`] (or by
    /// [`BufferPool::trim`] and allocation-failure recovery).
    pub evictions: u64,
    /// Released buffers freed at once because they exceed
    /// [`PoolConfig::max_buffer_bytes`] or the whole cap.
    pub rejected: u64,
    /// Bytes of free buffers held now.
    pub bytes_pooled: usize,
    /// Free buffers held now.
    pub buffers_pooled: usize,
    /// Bytes of buffers handed out and not yet returned.
    pub bytes_in_use: usize,
    /// Largest `bytes_pooled` ever reached (never above the cap).
    pub peak_bytes_pooled: usize,
}

/// Rounds a request up to its size class: at least 256 bytes, then four classes per
/// power of two (`2^k`, `1.25·2^k`, `1.5·2^k`, `1.75·2^k`), so a buffer is at most 25 %
/// larger than asked. `None` on overflow.
pub fn size_class(bytes: usize) -> Option<usize> {
    const MIN: usize = 256;
    if bytes <= MIN {
        return Some(MIN);
    }
    let top = usize::BITS - 1 - bytes.leading_zeros(); // floor(log2(bytes)) >= 8
    let step = 1usize << (top - 2);
    bytes.checked_add(step - 1).map(|b| b / step * step)
}

struct Inner<B> {
    /// Free buffers by size class, oldest release first.
    free: HashMap<usize, Vec<(u64, B)>>,
    /// Release stamp → size class, for least-recently-released eviction.
    lru: BTreeMap<u64, usize>,
    next_stamp: u64,
    stats: PoolStats,
}

/// A thread-safe pool of buffers with a size cap. See the [module docs](self).
pub struct BufferPool<A: PoolAllocator> {
    alloc: A,
    config: PoolConfig,
    inner: Mutex<Inner<A::Buffer>>,
}

impl<A: PoolAllocator> std::fmt::Debug for BufferPool<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<A: PoolAllocator> BufferPool<A> {
    /// An empty pool over `alloc`.
    pub fn new(alloc: A, config: PoolConfig) -> Arc<Self> {
        Arc::new(BufferPool {
            alloc,
            config,
            inner: Mutex::new(Inner {
                free: HashMap::new(),
                lru: BTreeMap::new(),
                next_stamp: 0,
                stats: PoolStats::default(),
            }),
        })
    }

    /// The allocator.
    pub fn allocator(&self) -> &A {
        &self.alloc
    }

    /// The limits.
    pub fn config(&self) -> PoolConfig {
        self.config
    }

    fn lock(&self) -> MutexGuard<'_, Inner<A::Buffer>> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way
        // that matters (worst case a stale stat), so a poisoned lock is recovered.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `bytes` bytes (its size class), reused when one is free.
    /// [`Error::InvalidArgument`] for 0 bytes or an impossible size; the allocator's
    /// error when memory runs out even after emptying the pool.
    pub fn acquire(self: &Arc<Self>, bytes: usize) -> Result<Pooled<A>> {
        if bytes == 0 {
            return Err(Error::invalid("cannot allocate a buffer of 0 bytes"));
        }
        let class = size_class(bytes)
            .ok_or_else(|| Error::invalid(format!("buffer of {bytes} bytes is too large")))?;
        {
            let mut g = self.lock();
            let inner = &mut *g;
            if let Some((stamp, buf)) = inner.free.get_mut(&class).and_then(|v| v.pop()) {
                inner.lru.remove(&stamp);
                inner.stats.hits += 1;
                inner.stats.bytes_pooled -= class;
                inner.stats.buffers_pooled -= 1;
                inner.stats.bytes_in_use += class;
                return Ok(Pooled {
                    buf: Some(buf),
                    pool: self.clone(),
                });
            }
            inner.stats.misses += 1;
        }
        let buf = match self.alloc.allocate(class) {
            Ok(b) => b,
            Err(first) => {
                // Memory pressure: give everything pooled back and try once more.
                if self.trim() == 0 {
                    return Err(first);
                }
                self.alloc.allocate(class)?
            }
        };
        self.lock().stats.bytes_in_use += A::size_of(&buf);
        Ok(Pooled {
            buf: Some(buf),
            pool: self.clone(),
        })
    }

    fn release(&self, buf: A::Buffer) {
        let size = A::size_of(&buf);
        let mut evicted = Vec::new();
        {
            let mut g = self.lock();
            let inner = &mut *g;
            inner.stats.bytes_in_use = inner.stats.bytes_in_use.saturating_sub(size);
            if size > self.config.max_buffer_bytes || size > self.config.max_pooled_bytes {
                inner.stats.rejected += 1;
                evicted.push(buf);
            } else {
                let stamp = inner.next_stamp;
                inner.next_stamp += 1;
                inner.free.entry(size).or_default().push((stamp, buf));
                inner.lru.insert(stamp, size);
                inner.stats.bytes_pooled += size;
                inner.stats.buffers_pooled += 1;
                while inner.stats.bytes_pooled > self.config.max_pooled_bytes {
                    let Some((_, class)) = inner.lru.pop_first() else {
                        break;
                    };
                    if let Some(b) = Self::take_oldest(inner, class) {
                        evicted.push(b);
                    }
                }
                inner.stats.peak_bytes_pooled =
                    inner.stats.peak_bytes_pooled.max(inner.stats.bytes_pooled);
            }
        }
        // Freed outside the lock: releasing a GPU buffer may take a while.
        drop(evicted);
    }

    /// Removes the oldest free buffer of `class` (its LRU entry is already gone).
    fn take_oldest(inner: &mut Inner<A::Buffer>, class: usize) -> Option<A::Buffer> {
        let list = inner.free.get_mut(&class)?;
        if list.is_empty() {
            return None;
        }
        let (_, b) = list.remove(0);
        if list.is_empty() {
            inner.free.remove(&class);
        }
        inner.stats.bytes_pooled -= class;
        inner.stats.buffers_pooled -= 1;
        inner.stats.evictions += 1;
        Some(b)
    }

    /// Frees every pooled buffer; returns how many bytes were freed.
    pub fn trim(&self) -> usize {
        let freed: Vec<(u64, A::Buffer)>;
        let bytes;
        {
            let mut g = self.lock();
            let inner = &mut *g;
            bytes = inner.stats.bytes_pooled;
            inner.stats.evictions += inner.stats.buffers_pooled as u64;
            inner.stats.bytes_pooled = 0;
            inner.stats.buffers_pooled = 0;
            inner.lru.clear();
            freed = inner.free.drain().flat_map(|(_, v)| v).collect();
        }
        drop(freed);
        bytes
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }
}

/// A buffer on loan from a [`BufferPool`]; goes back to the pool when dropped.
pub struct Pooled<A: PoolAllocator> {
    buf: Option<A::Buffer>,
    pool: Arc<BufferPool<A>>,
}

impl<A: PoolAllocator> Pooled<A> {
    /// Size of the buffer in bytes (its size class).
    pub fn size(&self) -> usize {
        A::size_of(self)
    }
}

impl<A: PoolAllocator> std::fmt::Debug for Pooled<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("bytes", &self.size())
            .finish()
    }
}

impl<A: PoolAllocator> Deref for Pooled<A> {
    type Target = A::Buffer;
    fn deref(&self) -> &A::Buffer {
        // `buf` is only taken in `drop`.
        self.buf.as_ref().expect("pooled buffer present until drop")
    }
}

impl<A: PoolAllocator> Drop for Pooled<A> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.release(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts live bytes; fails allocations past `limit`.
    #[derive(Default)]
    struct Fake {
        live: Arc<AtomicUsize>,
        limit: usize,
    }
    struct FakeBuf {
        bytes: usize,
        live: Arc<AtomicUsize>,
    }
    impl Drop for FakeBuf {
        fn drop(&mut self) {
            self.live.fetch_sub(self.bytes, Ordering::SeqCst);
        }
    }
    impl PoolAllocator for Fake {
        type Buffer = FakeBuf;
        fn allocate(&self, bytes: usize) -> Result<FakeBuf> {
            if self.live.load(Ordering::SeqCst) + bytes > self.limit {
                return Err(Error::Device("out of memory".into()));
            }
            self.live.fetch_add(bytes, Ordering::SeqCst);
            Ok(FakeBuf {
                bytes,
                live: self.live.clone(),
            })
        }
        fn size_of(b: &FakeBuf) -> usize {
            b.bytes
        }
    }

    fn pool(cap: usize, max_buf: usize, limit: usize) -> (Arc<BufferPool<Fake>>, Arc<AtomicUsize>) {
        let live = Arc::new(AtomicUsize::new(0));
        let p = BufferPool::new(
            Fake {
                live: live.clone(),
                limit,
            },
            PoolConfig {
                max_pooled_bytes: cap,
                max_buffer_bytes: max_buf,
            },
        );
        (p, live)
    }

    #[test]
    fn size_classes_bound_the_slack() {
        assert_eq!(size_class(1), Some(256));
        assert_eq!(size_class(256), Some(256));
        assert_eq!(size_class(257), Some(320));
        assert_eq!(size_class(1000), Some(1024));
        assert_eq!(size_class(1025), Some(1280));
        assert_eq!(size_class(usize::MAX), None);
        for b in [300usize, 4097, 1 << 20, (1 << 20) + 1, 123_456_789] {
            let c = size_class(b).unwrap();
            assert!(c >= b && (c - b) * 4 <= b, "{b} -> {c}");
            assert_eq!(size_class(c), Some(c), "classes are fixed points");
        }
    }

    #[test]
    fn reuse_counts_hits_and_misses() {
        let (p, live) = pool(1 << 20, 1 << 20, usize::MAX);
        let a = p.acquire(1000).unwrap();
        assert_eq!(a.size(), 1024);
        assert_eq!(p.stats().bytes_in_use, 1024);
        drop(a);
        let s = p.stats();
        assert_eq!(
            (
                s.misses,
                s.hits,
                s.bytes_pooled,
                s.buffers_pooled,
                s.bytes_in_use
            ),
            (1, 0, 1024, 1, 0)
        );
        let _b = p.acquire(900).unwrap();
        let _c = p.acquire(900).unwrap(); // pool empty again: a miss
        let s = p.stats();
        assert_eq!((s.hits, s.misses, s.bytes_pooled), (1, 2, 0));
        assert_eq!(live.load(Ordering::SeqCst), 2048);
    }

    #[test]
    fn the_cap_is_never_exceeded_and_oldest_go_first() {
        let (p, live) = pool(4096, 4096, usize::MAX);
        let bufs: Vec<_> = (0..10).map(|_| p.acquire(1024).unwrap()).collect();
        assert_eq!(live.load(Ordering::SeqCst), 10 * 1024);
        drop(bufs);
        let s = p.stats();
        assert_eq!(s.bytes_pooled, 4096);
        assert_eq!(s.buffers_pooled, 4);
        assert_eq!(s.evictions, 6);
        assert!(s.peak_bytes_pooled <= 4096);
        assert_eq!(
            live.load(Ordering::SeqCst),
            4096,
            "evicted buffers are really freed"
        );
        // A different class pushes out the least recently released ones.
        let big = p.acquire(2048).unwrap();
        drop(big);
        let s = p.stats();
        assert_eq!(s.bytes_pooled, 4096);
        assert_eq!(s.buffers_pooled, 3);
        assert_eq!(s.evictions, 8);
        assert_eq!(p.acquire(2048).unwrap().size(), 2048);
        assert_eq!(p.stats().hits, 1);
    }

    #[test]
    fn oversized_buffers_are_not_kept() {
        let (p, live) = pool(1 << 20, 8192, usize::MAX);
        drop(p.acquire(10_000).unwrap());
        let s = p.stats();
        assert_eq!((s.rejected, s.bytes_pooled), (1, 0));
        assert_eq!(live.load(Ordering::SeqCst), 0);
        // A zero cap disables pooling entirely.
        let (p, live) = pool(0, 8192, usize::MAX);
        drop(p.acquire(10).unwrap());
        assert_eq!(p.stats().bytes_pooled, 0);
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn allocation_failure_trims_and_retries() {
        let (p, live) = pool(1 << 20, 1 << 20, 4096);
        drop(p.acquire(3000).unwrap()); // 3072 pooled
        let b = p.acquire(2048).unwrap(); // needs the pooled memory back
        assert_eq!(b.size(), 2048);
        assert_eq!(p.stats().evictions, 1);
        assert_eq!(live.load(Ordering::SeqCst), 2048);
        // With nothing left to trim the allocator's error comes through.
        let e = p.acquire(4096).unwrap_err();
        assert!(matches!(e, Error::Device(_)), "{e}");
        assert!(matches!(p.acquire(0), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            p.acquire(usize::MAX),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn concurrent_use_keeps_the_books_balanced() {
        let (p, live) = pool(64 * 1024, 1 << 20, usize::MAX);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..500usize {
                        let a = p.acquire(256 + (i * 37 + t * 101) % 5000).unwrap();
                        let _b = p.acquire(512).unwrap();
                        drop(a);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = p.stats();
        assert_eq!(s.bytes_in_use, 0);
        assert_eq!(s.hits + s.misses, 4000);
        assert!(s.bytes_pooled <= 64 * 1024);
        assert_eq!(
            live.load(Ordering::SeqCst),
            s.bytes_pooled,
            "only pooled buffers stay alive"
        );
        p.trim();
        assert_eq!(live.load(Ordering::SeqCst), 0);
        assert_eq!(p.stats().buffers_pooled, 0);
    }
}
