//! The CPU meaning of shared arrays and barriers.
//!
//! Every block has a [`BlockCtx`]: the storage of its shared arrays (one slot per
//! `shared_array` call, in call order) and, under [`launch_with_barriers`], a scheduler
//! that runs the block's threads one at a time, each on its own OS thread, passing the
//! turn on at every `sync_threads()` and when a thread returns.

use super::{state, LaunchState, STATE};
use std::any::Any;
use std::cell::{Cell, RefCell, UnsafeCell};
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// The storage of one shared array: cells written through raw pointers by the threads of
/// one block, which never run at the same time (see [`BlockCtx`]).
struct Store<T>(Box<[UnsafeCell<T>]>);

// SAFETY: the cells are accessed only by the threads of one block, which the scheduler
// runs strictly one after another (a mutex hand-over orders their accesses); `T: Send`.
unsafe impl<T: Send> Send for Store<T> {}
// SAFETY: as above: no two threads access the cells at the same time.
unsafe impl<T: Send> Sync for Store<T> {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ready,
    AtBarrier,
    Done,
}

/// Marks the unwinding of threads stopped because another thread of the block panicked.
struct Aborted;

struct SchedState {
    /// Number of the block that runs (blocks in x-fastest order).
    block: usize,
    blocks: usize,
    /// The shared arrays of the running block.
    ctx: Arc<BlockCtx>,
    turn: usize,
    status: Vec<Status>,
    aborted: bool,
    panic: Option<Box<dyn Any + Send>>,
}

impl SchedState {
    /// Gives the turn to the lowest ready thread; when none is ready, releases the barrier
    /// (every thread that has not returned is waiting at it); when all have returned,
    /// starts the next block.
    fn advance(&mut self) {
        if let Some(i) = self.status.iter().position(|s| *s == Status::Ready) {
            self.turn = i;
            return;
        }
        let waiting = self.status.contains(&Status::AtBarrier);
        if !waiting {
            if self.block + 1 == self.blocks {
                self.turn = usize::MAX;
                return;
            }
            self.block += 1;
            self.ctx = BlockCtx::new();
        }
        self.status.iter_mut().for_each(|s| *s = Status::Ready);
        self.turn = 0;
    }
}

/// Runs the threads of a block one at a time (see [`launch_with_barriers`]).
struct Sched {
    state: Mutex<SchedState>,
    /// One per thread: only the thread whose turn it is gets woken.
    cvs: Vec<Condvar>,
}

impl Sched {
    fn lock(&self) -> MutexGuard<'_, SchedState> {
        // The state stays consistent: no code panics while holding the lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until thread `me` may run in block `block`; `None` when the launch was
    /// aborted, else the block's shared arrays.
    fn wait_turn(&self, me: usize, block: usize) -> Option<Arc<BlockCtx>> {
        let mut g = self.lock();
        while !(g.aborted || (g.block == block && g.turn == me)) {
            g = self.cvs[me].wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        (!g.aborted).then(|| g.ctx.clone())
    }

    fn barrier(&self, me: usize) {
        let block = {
            let mut g = self.lock();
            g.status[me] = Status::AtBarrier;
            g.advance();
            self.wake(&g);
            g.block
        };
        if self.wait_turn(me, block).is_none() {
            resume_unwind(Box::new(Aborted));
        }
    }

    fn finish(&self, me: usize, panic: Option<Box<dyn Any + Send>>) {
        let mut g = self.lock();
        g.status[me] = Status::Done;
        if let Some(p) = panic {
            g.aborted = true;
            if !p.is::<Aborted>() && g.panic.is_none() {
                g.panic = Some(p);
            }
        }
        g.advance();
        self.wake(&g);
    }

    fn wake(&self, g: &SchedState) {
        if g.aborted {
            self.cvs.iter().for_each(Condvar::notify_one);
        } else if let Some(cv) = self.cvs.get(g.turn) {
            cv.notify_one();
        }
    }
}

/// The shared arrays of one block.
pub(super) struct BlockCtx {
    slots: Mutex<Vec<Box<dyn Any + Send + Sync>>>,
}

impl BlockCtx {
    fn new() -> Arc<Self> {
        Arc::new(BlockCtx {
            slots: Mutex::new(Vec::new()),
        })
    }
}

thread_local! {
    static BLOCK: RefCell<Option<Arc<BlockCtx>>> = const { RefCell::new(None) };
    static SCHED: RefCell<Option<Arc<Sched>>> = const { RefCell::new(None) };
    static SLOT: Cell<usize> = const { Cell::new(0) };
}

/// Makes `ctx` the block of this OS thread (`None`: a fresh one on first use) and starts
/// a thread's shared-array numbering; returns the previous block.
pub(super) fn enter(ctx: Option<Arc<BlockCtx>>) -> Option<Arc<BlockCtx>> {
    SLOT.with(|s| s.set(0));
    BLOCK.with(|b| std::mem::replace(&mut *b.borrow_mut(), ctx))
}

/// A fresh block.
pub(super) fn fresh_block() -> Arc<BlockCtx> {
    BlockCtx::new()
}

/// Starts the next thread of the current block: its shared arrays are numbered from 0.
pub(super) fn next_thread() {
    SLOT.with(|s| s.set(0));
}

fn current() -> Arc<BlockCtx> {
    BLOCK.with(|b| b.borrow_mut().get_or_insert_with(BlockCtx::new).clone())
}

/// An array in the block's shared (CUDA `__shared__`, WGSL `var<workgroup>`) memory,
/// from [`shared_array`]: every thread of a block sees the same elements.
///
/// Index it with `usize` like an array (out of bounds panics on the CPU). On the CPU its
/// elements start as `T::default()`; on the GPU they start undefined: write before
/// reading.
pub struct SharedArray<T, const N: usize> {
    base: *mut T,
    /// Keeps the storage alive.
    _ctx: Arc<BlockCtx>,
    /// Not `Send`: it belongs to one thread of one block.
    _marker: PhantomData<*mut T>,
}

impl<T, const N: usize> SharedArray<T, N> {
    /// The number of elements, `N`.
    pub const fn len(&self) -> usize {
        N
    }

    /// Whether `N` is 0 (never, for an array the translator accepts).
    pub const fn is_empty(&self) -> bool {
        N == 0
    }
}

impl<T, const N: usize> Index<usize> for SharedArray<T, N> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        assert!(i < N, "shared array index {i} out of bounds (length {N})");
        // SAFETY: `i < N` and the storage of N cells lives as long as `_ctx`; the threads
        // of the block run one at a time, so no other thread writes while this one runs.
        unsafe { &*self.base.add(i) }
    }
}

impl<T, const N: usize> IndexMut<usize> for SharedArray<T, N> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        assert!(i < N, "shared array index {i} out of bounds (length {N})");
        // SAFETY: as in `index`: in bounds, alive, and no other thread runs meanwhile.
        unsafe { &mut *self.base.add(i) }
    }
}

/// Declares an array of `N` elements in the block's shared memory:
/// `let mut partial = shared_array::<f32, 256>();` at the top level of a kernel. Every
/// thread of a block gets the same array (the k-th `shared_array` call of each thread
/// names the k-th array of the block). Threads exchange values through it with
/// [`sync_threads`] between the writes and the reads.
///
/// # Panics
///
/// When threads of one block declare different arrays at the same position (a type or
/// length mismatch), which the translator's top-level rule prevents.
pub fn shared_array<T: Copy + Default + Send + 'static, const N: usize>() -> SharedArray<T, N> {
    let ctx = current();
    let k = SLOT.with(|s| {
        let k = s.get();
        s.set(k + 1);
        k
    });
    let base = {
        let mut slots = ctx.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if k == slots.len() {
            let cells: Box<[UnsafeCell<T>]> =
                (0..N).map(|_| UnsafeCell::new(T::default())).collect();
            slots.push(Box::new(Store(cells)));
        }
        let Some(store) = slots[k]
            .downcast_ref::<Store<T>>()
            .filter(|s| s.0.len() == N)
        else {
            drop(slots);
            panic!(
                "shared array {k} of this block was declared with another type or length by \
                 another thread; declare shared arrays at the top level of the kernel"
            );
        };
        UnsafeCell::raw_get(store.0.as_ptr())
    };
    SharedArray {
        base,
        _ctx: ctx,
        _marker: PhantomData,
    }
}

/// A barrier of the block: every thread of the block reaches it before any goes on, and
/// the shared-array (and buffer) writes before it are visible after it. CUDA
/// `__syncthreads()`, WGSL `storageBarrier(); workgroupBarrier();`.
///
/// As on the GPU, every thread of the block must reach the same barriers (not inside an
/// `if` that only some threads take; a thread that has returned counts as arrived on the
/// CPU). On the CPU it needs [`launch_with_barriers`] (which `Device::launch` uses for
/// kernels that call it): under [`launch`](super::launch), which runs the threads one
/// after another, it panics when a block has more than one thread.
pub fn sync_threads() {
    let sched = SCHED.with(|s| s.borrow().clone());
    match sched {
        Some(sched) => sched.barrier(linear_thread(&state())),
        None => {
            let st = state();
            if st.block_dim.iter().product::<u32>() > 1 {
                panic!(
                    "sync_threads() under dsl::launch, which runs a block's threads one after \
                     another: launch kernels with barriers through dsl::launch_with_barriers"
                );
            }
        }
    }
}

fn linear_thread(st: &LaunchState) -> usize {
    let [x, y, z] = st.thread;
    let [bx, by, _] = st.block_dim;
    (z as usize * by as usize + y as usize) * bx as usize + x as usize
}

/// The closure of a launch, shared by the OS threads of a block.
struct BodyPtr<F>(*mut F);
impl<F> Clone for BodyPtr<F> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<F> Copy for BodyPtr<F> {}
// SAFETY: the closure is `Send`, and the scheduler lets one thread call it at a time.
unsafe impl<F: Send> Send for BodyPtr<F> {}

/// Runs `body` for every thread of `grid` × `block` like [`launch`](super::launch), for
/// kernels that call [`sync_threads`]: the blocks run one after another; the threads of
/// a block each get an OS thread but run one at a time, in thread order, each until it
/// reaches a barrier or returns; when every thread of the block is at the barrier (or has
/// returned) they all go on, again in thread order. The result is deterministic.
///
/// A panic of one thread stops its block and is raised again here (also when an OS thread
/// cannot be started). A block of one thread runs on the calling thread.
///
/// Limit of the CPU model: the closure's `&mut` buffers are borrowed by every thread of
/// the block at once (only one of them running), which Rust's exclusive borrows do not
/// describe: threads of a block exchange values through [`shared_array`]s, not by writing
/// and then reading one `&mut [T]` element across a barrier (the compiler may keep such a
/// value in a register across the barrier).
pub fn launch_with_barriers<F: FnMut() + Send>(grid: [u32; 3], block: [u32; 3], mut body: F) {
    let n = block.iter().map(|&d| d as usize).product::<usize>();
    let blocks = grid.iter().map(|&d| d as usize).product::<usize>();
    if n <= 1 || blocks == 0 {
        return super::launch(grid, block, body);
    }
    let sched = Arc::new(Sched {
        state: Mutex::new(SchedState {
            block: 0,
            blocks,
            ctx: BlockCtx::new(),
            turn: 0,
            status: vec![Status::Ready; n],
            aborted: false,
            panic: None,
        }),
        cvs: (0..n).map(|_| Condvar::new()).collect(),
    });
    let ptr = BodyPtr(&mut body as *mut F);
    let [gx, gy, _] = grid.map(|d| d as usize);
    std::thread::scope(|s| {
        for t in 0..n {
            let thread = [
                (t % block[0] as usize) as u32,
                ((t / block[0] as usize) % block[1] as usize) as u32,
                (t / (block[0] as usize * block[1] as usize)) as u32,
            ];
            let sched2 = sched.clone();
            let started = std::thread::Builder::new()
                .name(format!("rk-cpu-thread-{t}"))
                .spawn_scoped(s, move || {
                    let sched = sched2;
                    SCHED.with(|s| *s.borrow_mut() = Some(sched.clone()));
                    // The same OS thread runs thread `t` of every block, in order.
                    for b in 0..blocks {
                        let Some(ctx) = sched.wait_turn(t, b) else {
                            break;
                        };
                        let bidx = [
                            (b % gx) as u32,
                            ((b / gx) % gy) as u32,
                            (b / (gx * gy)) as u32,
                        ];
                        STATE.with(|st| {
                            st.set(LaunchState {
                                thread,
                                block: bidx,
                                block_dim: block,
                                grid_dim: grid,
                            })
                        });
                        enter(Some(ctx));
                        let p = ptr;
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            // SAFETY: `body` outlives the scope; the scheduler lets one
                            // thread run at a time (the others wait inside `sync_threads`
                            // or for their turn), so its calls never run concurrently.
                            unsafe { (*p.0)() }
                        }));
                        enter(None);
                        let failed = r.is_err();
                        sched.finish(t, r.err());
                        if failed {
                            break;
                        }
                    }
                    SCHED.with(|s| *s.borrow_mut() = None);
                });
            if let Err(e) = started {
                // The started threads are told to stop; this one never runs.
                sched.finish(
                    t,
                    Some(Box::new(format!(
                        "could not start a CPU thread for thread {t} of the blocks: {e}"
                    ))),
                );
                break;
            }
        }
    });
    let panic = sched.lock().panic.take();
    if let Some(p) = panic {
        resume_unwind(p);
    }
}
