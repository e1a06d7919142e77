//! The functions and types a kernel uses, with their CPU meaning.
//!
//! A kernel written in the subset is ordinary Rust: it compiles and runs on the CPU with
//! these definitions, and the translator maps the same calls to CUDA C and WGSL. That is
//! how tests compare a GPU result with "the Rust itself".
//!
//! ## Thread and block indices
//!
//! [`thread_idx_x`], [`block_idx_x`], [`block_dim_x`], [`grid_dim_x`] (and their `y`/`z`
//! forms) return `i32`, like CUDA's built-ins converted to `int`. On the CPU they read a
//! thread-local launch state that [`launch`] sets before each call of the kernel body:
//! [`launch`] runs every (block, thread) pair of the grid one after another, on the
//! calling thread, in x-fastest order. Outside [`launch`] the state is a single thread:
//! indices 0, dimensions 1.
//!
//! Because the CPU runs the threads one at a time, the atomics ([`atomic_add`], ...) are
//! plain read-modify-writes there.
//!
//! ## Shared arrays and barriers
//!
//! `let mut s = shared_array::<f32, 256>();` ([`shared_array`]) declares an array that
//! all threads of a block share (CUDA `__shared__`, WGSL `var<workgroup>`), and
//! [`sync_threads`] is the block's barrier. On the CPU, [`launch_with_barriers`] runs such
//! a kernel: blocks one after another; within a block every thread has its own OS thread,
//! but only one runs at a time: thread 0 runs until its first barrier (or its end), then
//! thread 1, and so on; when all have arrived, the next stretch runs in the same order.
//! So the CPU result is deterministic and equals the GPU's whenever the kernel is free of
//! races between barriers. [`launch`] also provides shared arrays (fresh for every block)
//! but panics at a barrier when a block has more than one thread.
//!
//! ```
//! use ringkernel_codegen::dsl::*;
//!
//! // Sum of each block of 64 values: a tree reduction in shared memory.
//! fn block_sum(x: &[f32], out: &mut [f32], n: i32) {
//!     let mut part = shared_array::<f32, 64>();
//!     let t = thread_idx_x();
//!     let i = block_idx_x() * block_dim_x() + t;
//!     part[t as usize] = if i < n { x[i as usize] } else { 0.0 };
//!     sync_threads();
//!     let mut s = block_dim_x() / 2;
//!     while s > 0 {
//!         if t < s {
//!             part[t as usize] += part[(t + s) as usize];
//!         }
//!         sync_threads();
//!         s /= 2;
//!     }
//!     if t == 0 {
//!         out[block_idx_x() as usize] = part[0];
//!     }
//! }
//!
//! let x: Vec<f32> = (0..100).map(|v| v as f32).collect();
//! let mut out = vec![0.0f32; 2];
//! launch_with_barriers([2, 1, 1], [64, 1, 1], || block_sum(&x, &mut out, 100));
//! assert_eq!(out, [(0..64).sum::<i32>() as f32, (64..100).sum::<i32>() as f32]);
//! ```
//!
//! ```
//! use ringkernel_codegen::dsl::*;
//!
//! fn scale(data: &mut [f32], n: i32) {
//!     let idx = block_idx_x() * block_dim_x() + thread_idx_x();
//!     if idx >= n {
//!         return;
//!     }
//!     data[idx as usize] *= 2.0;
//! }
//!
//! let mut data = vec![1.0f32; 100];
//! launch([4, 1, 1], [32, 1, 1], || scale(&mut data, 100));
//! assert!(data.iter().all(|&v| v == 2.0));
//! ```
//!
//! ## Stencils
//!
//! A stencil kernel takes a [`GridPos`] (2-D) or [`GridPos3`] (3-D): the cell it
//! computes, on a row-major grid of `nx × ny (× nz)` interior cells surrounded by a halo
//! of `halo` cells on every side (the buffers hold `(nx + 2·halo)·(ny + 2·halo)(·…)`
//! values; [`GridPos::buffer_len`]). `pos.idx()` is the cell's index in such a buffer,
//! `pos.north(&buf)` / `south` / `west` / `east` (and `down` / `up` in 3-D) read the
//! neighbour at y−1 / y+1 / x−1 / x+1 (z−1 / z+1), `pos.at(&buf, dx, dy)` any cell within
//! the halo. [`stencil_2d`] and [`stencil_3d`] run a kernel over every interior cell on
//! the CPU.

use std::cell::Cell;

mod block;
pub use block::{launch_with_barriers, shared_array, sync_threads, SharedArray};

#[derive(Clone, Copy)]
struct LaunchState {
    thread: [u32; 3],
    block: [u32; 3],
    block_dim: [u32; 3],
    grid_dim: [u32; 3],
}

const SINGLE: LaunchState = LaunchState {
    thread: [0; 3],
    block: [0; 3],
    block_dim: [1; 3],
    grid_dim: [1; 3],
};

thread_local! {
    static STATE: Cell<LaunchState> = const { Cell::new(SINGLE) };
}

fn state() -> LaunchState {
    STATE.with(Cell::get)
}

/// Runs `body` once for every thread of a `grid` of blocks of `block` threads, setting
/// the index functions of this module for each call (x fastest, then y, then z; threads
/// within a block before the next block). Sequential, on the calling thread. A zero
/// dimension runs nothing. The previous state is restored afterwards, also on panic.
pub fn launch(grid: [u32; 3], block: [u32; 3], mut body: impl FnMut()) {
    struct Restore(LaunchState, Option<std::sync::Arc<block::BlockCtx>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            STATE.with(|s| s.set(self.0));
            block::enter(self.1.take());
        }
    }
    let _restore = Restore(state(), block::enter(None));
    for bz in 0..grid[2] {
        for by in 0..grid[1] {
            for bx in 0..grid[0] {
                block::enter(Some(block::fresh_block()));
                for tz in 0..block[2] {
                    for ty in 0..block[1] {
                        for tx in 0..block[0] {
                            STATE.with(|s| {
                                s.set(LaunchState {
                                    thread: [tx, ty, tz],
                                    block: [bx, by, bz],
                                    block_dim: block,
                                    grid_dim: grid,
                                })
                            });
                            block::next_thread();
                            body();
                        }
                    }
                }
            }
        }
    }
}

macro_rules! index_fns {
    ($($name:ident, $field:ident, $k:expr, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            #[inline]
            pub fn $name() -> i32 {
                state().$field[$k] as i32
            }
        )*
    };
}

index_fns! {
    thread_idx_x, thread, 0, "Thread index in the block, x (CUDA `threadIdx.x`, WGSL `local_invocation_id.x`).";
    thread_idx_y, thread, 1, "Thread index in the block, y.";
    thread_idx_z, thread, 2, "Thread index in the block, z.";
    block_idx_x, block, 0, "Block index in the grid, x (CUDA `blockIdx.x`, WGSL `workgroup_id.x`).";
    block_idx_y, block, 1, "Block index in the grid, y.";
    block_idx_z, block, 2, "Block index in the grid, z.";
    block_dim_x, block_dim, 0, "Threads per block, x (CUDA `blockDim.x`; in WGSL the workgroup size the kernel was translated with).";
    block_dim_y, block_dim, 1, "Threads per block, y.";
    block_dim_z, block_dim, 2, "Threads per block, z.";
    grid_dim_x, grid_dim, 0, "Blocks in the grid, x (CUDA `gridDim.x`, WGSL `num_workgroups.x`).";
    grid_dim_y, grid_dim, 1, "Blocks in the grid, y.";
    grid_dim_z, grid_dim, 2, "Blocks in the grid, z.";
}

/// Integer types the atomics work on (`i32`, `u32`).
pub trait AtomicInt: Copy + Ord + private::Sealed {
    #[doc(hidden)]
    fn wrapping_add_(self, other: Self) -> Self;
    #[doc(hidden)]
    fn wrapping_sub_(self, other: Self) -> Self;
    #[doc(hidden)]
    fn and_(self, other: Self) -> Self;
    #[doc(hidden)]
    fn or_(self, other: Self) -> Self;
    #[doc(hidden)]
    fn xor_(self, other: Self) -> Self;
}

mod private {
    pub trait Sealed {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
}

macro_rules! atomic_int {
    ($($t:ty),*) => {$(
        impl AtomicInt for $t {
            fn wrapping_add_(self, o: Self) -> Self { self.wrapping_add(o) }
            fn wrapping_sub_(self, o: Self) -> Self { self.wrapping_sub(o) }
            fn and_(self, o: Self) -> Self { self & o }
            fn or_(self, o: Self) -> Self { self | o }
            fn xor_(self, o: Self) -> Self { self ^ o }
        }
    )*};
}
atomic_int!(i32, u32);

fn rmw<T: AtomicInt>(place: &mut T, f: impl FnOnce(T) -> T) -> T {
    let old = *place;
    *place = f(old);
    old
}

// Atomics: on the GPU one indivisible step on an element of a `&mut [i32]`/`&mut [u32]`
// parameter (CUDA `atomicAdd`..., WGSL `atomicAdd`...); each returns the old value. On the
// CPU, [`launch`] runs one thread at a time, so a plain read-modify-write is the same.
// The order in which threads reach an element is not defined on the GPU: results that
// depend on it (the returned old values, say) differ between runs.

/// Adds `value` (wrapping) and returns the old value: `atomic_add(&mut hist[b], 1)`.
pub fn atomic_add<T: AtomicInt>(place: &mut T, value: T) -> T {
    rmw(place, |o| o.wrapping_add_(value))
}
/// Subtracts `value` (wrapping) and returns the old value.
pub fn atomic_sub<T: AtomicInt>(place: &mut T, value: T) -> T {
    rmw(place, |o| o.wrapping_sub_(value))
}
/// Stores the minimum of the element and `value`; returns the old value.
pub fn atomic_min<T: AtomicInt>(place: &mut T, value: T) -> T {
    rmw(place, |o| o.min(value))
}
/// Stores the maximum of the element and `value`; returns the old value.
pub fn atomic_max<T: AtomicInt>(place: &mut T, value: T) -> T {
    rmw(place, |o| o.max(value))
}
/// Bitwise and; returns the old value.
pub fn atomic_and<T: AtomicInt>(place: &mut T, value: T) -> T {
    rmw(place, |o| o.and_(value))
}
/// Bitwise or; returns the old value.
pub fn atomic_or<T: AtomicInt>(place: &mut T, value: T) -> T {
    rmw(place, |o| o.or_(value))
}
/// Bitwise exclusive or; returns the old value.
pub fn atomic_xor<T: AtomicInt>(place: &mut T, value: T) -> T {
    rmw(place, |o| o.xor_(value))
}
/// Stores `value`; returns the old value.
pub fn atomic_exchange<T: AtomicInt>(place: &mut T, value: T) -> T {
    rmw(place, |_| value)
}

/// The cell of a 2-D stencil kernel (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridPos {
    x: i32,
    y: i32,
    nx: i32,
    ny: i32,
    halo: i32,
}

impl GridPos {
    /// Length of a buffer for an `nx × ny` grid with a halo of `halo` cells.
    pub fn buffer_len(nx: u32, ny: u32, halo: u32) -> usize {
        let h = 2 * halo as usize;
        (nx as usize + h) * (ny as usize + h)
    }

    /// Interior x coordinate (0-based, halo excluded).
    pub fn x(&self) -> i32 {
        self.x
    }
    /// Interior y coordinate.
    pub fn y(&self) -> i32 {
        self.y
    }
    /// Interior width.
    pub fn nx(&self) -> i32 {
        self.nx
    }
    /// Interior height.
    pub fn ny(&self) -> i32 {
        self.ny
    }
    fn sy(&self) -> usize {
        (self.nx + 2 * self.halo) as usize
    }
    /// Index of this cell in a buffer with halo.
    pub fn idx(&self) -> usize {
        (self.y + self.halo) as usize * self.sy() + (self.x + self.halo) as usize
    }
    /// The cell at y − 1.
    pub fn north<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() - self.sy()]
    }
    /// The cell at y + 1.
    pub fn south<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() + self.sy()]
    }
    /// The cell at x − 1.
    pub fn west<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() - 1]
    }
    /// The cell at x + 1.
    pub fn east<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() + 1]
    }
    /// The cell at (x + dx, y + dy); the offsets must stay within the halo (on the GPU a
    /// larger offset reads a wrong cell; here it reads a wrong cell or panics at the
    /// buffer's end).
    pub fn at<T: Copy>(&self, buf: &[T], dx: i32, dy: i32) -> T {
        let i = self.idx() as i64 + dy as i64 * self.sy() as i64 + dx as i64;
        buf[i as usize]
    }
}

/// The cell of a 3-D stencil kernel (see the [module docs](self)); `z` is the slowest
/// axis of the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridPos3 {
    x: i32,
    y: i32,
    z: i32,
    nx: i32,
    ny: i32,
    nz: i32,
    halo: i32,
}

impl GridPos3 {
    /// Length of a buffer for an `nx × ny × nz` grid with a halo of `halo` cells.
    pub fn buffer_len(nx: u32, ny: u32, nz: u32, halo: u32) -> usize {
        let h = 2 * halo as usize;
        (nx as usize + h) * (ny as usize + h) * (nz as usize + h)
    }
    /// Interior x coordinate.
    pub fn x(&self) -> i32 {
        self.x
    }
    /// Interior y coordinate.
    pub fn y(&self) -> i32 {
        self.y
    }
    /// Interior z coordinate.
    pub fn z(&self) -> i32 {
        self.z
    }
    /// Interior width.
    pub fn nx(&self) -> i32 {
        self.nx
    }
    /// Interior height.
    pub fn ny(&self) -> i32 {
        self.ny
    }
    /// Interior depth.
    pub fn nz(&self) -> i32 {
        self.nz
    }
    fn sy(&self) -> usize {
        (self.nx + 2 * self.halo) as usize
    }
    fn sz(&self) -> usize {
        self.sy() * (self.ny + 2 * self.halo) as usize
    }
    /// Index of this cell in a buffer with halo.
    pub fn idx(&self) -> usize {
        (self.z + self.halo) as usize * self.sz()
            + (self.y + self.halo) as usize * self.sy()
            + (self.x + self.halo) as usize
    }
    /// The cell at y − 1.
    pub fn north<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() - self.sy()]
    }
    /// The cell at y + 1.
    pub fn south<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() + self.sy()]
    }
    /// The cell at x − 1.
    pub fn west<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() - 1]
    }
    /// The cell at x + 1.
    pub fn east<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() + 1]
    }
    /// The cell at z − 1.
    pub fn down<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() - self.sz()]
    }
    /// The cell at z + 1.
    pub fn up<T: Copy>(&self, buf: &[T]) -> T {
        buf[self.idx() + self.sz()]
    }
    /// The cell at (x + dx, y + dy, z + dz); offsets within the halo.
    pub fn at<T: Copy>(&self, buf: &[T], dx: i32, dy: i32, dz: i32) -> T {
        let i = self.idx() as i64
            + dz as i64 * self.sz() as i64
            + dy as i64 * self.sy() as i64
            + dx as i64;
        buf[i as usize]
    }
}

/// Runs `body` for every interior cell of an `nx × ny` grid with a halo of `halo` cells
/// (row by row), as the translated stencil kernel does on the GPU.
pub fn stencil_2d(nx: u32, ny: u32, halo: u32, mut body: impl FnMut(GridPos)) {
    for y in 0..ny as i32 {
        for x in 0..nx as i32 {
            body(GridPos {
                x,
                y,
                nx: nx as i32,
                ny: ny as i32,
                halo: halo as i32,
            });
        }
    }
}

/// Runs `body` for every interior cell of an `nx × ny × nz` grid with a halo of `halo`
/// cells.
pub fn stencil_3d(nx: u32, ny: u32, nz: u32, halo: u32, mut body: impl FnMut(GridPos3)) {
    for z in 0..nz as i32 {
        for y in 0..ny as i32 {
            for x in 0..nx as i32 {
                body(GridPos3 {
                    x,
                    y,
                    z,
                    nx: nx as i32,
                    ny: ny as i32,
                    nz: nz as i32,
                    halo: halo as i32,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_visits_every_thread_once_and_restores_the_state() {
        let mut seen = Vec::new();
        launch([2, 3, 1], [4, 1, 2], || {
            assert_eq!((block_dim_x(), block_dim_y(), block_dim_z()), (4, 1, 2));
            assert_eq!((grid_dim_x(), grid_dim_y(), grid_dim_z()), (2, 3, 1));
            let b = block_idx_x() + 2 * block_idx_y() + 6 * block_idx_z();
            let t = thread_idx_x() + 4 * thread_idx_y() + 4 * thread_idx_z();
            seen.push(b * 8 + t);
        });
        assert_eq!(seen, (0..48).collect::<Vec<i32>>());
        assert_eq!(
            (thread_idx_x(), block_idx_y(), block_dim_z(), grid_dim_x()),
            (0, 0, 1, 1)
        );
        launch([0, 1, 1], [64, 1, 1], || panic!("a zero grid runs nothing"));
    }

    #[test]
    fn grid_pos_neighbours() {
        // 3 x 2 interior, halo 1: rows of 5, buffer 5 x 4.
        let buf: Vec<i32> = (0..GridPos::buffer_len(3, 2, 1) as i32).collect();
        assert_eq!(buf.len(), 20);
        let mut cells = Vec::new();
        stencil_2d(3, 2, 1, |p| {
            cells.push((p.x(), p.y(), p.idx()));
            assert_eq!(p.north(&buf), buf[p.idx() - 5]);
            assert_eq!(p.south(&buf), buf[p.idx() + 5]);
            assert_eq!(p.west(&buf), buf[p.idx() - 1]);
            assert_eq!(p.east(&buf), buf[p.idx() + 1]);
            assert_eq!(p.at(&buf, 1, -1), buf[p.idx() - 4]);
            assert_eq!((p.nx(), p.ny()), (3, 2));
        });
        let idx: Vec<usize> = cells.iter().map(|c| c.2).collect();
        assert_eq!(idx, [6, 7, 8, 11, 12, 13]);
        let buf3: Vec<i32> = (0..GridPos3::buffer_len(2, 2, 2, 1) as i32).collect();
        assert_eq!(buf3.len(), 64);
        let mut n = 0;
        stencil_3d(2, 2, 2, 1, |p| {
            n += 1;
            assert_eq!(p.up(&buf3), buf3[p.idx() + 16]);
            assert_eq!(p.down(&buf3), buf3[p.idx() - 16]);
            assert_eq!(p.at(&buf3, -1, 1, 1), buf3[p.idx() + 16 + 4 - 1]);
            assert_eq!((p.nz(), p.z() < 2), (2, true));
        });
        assert_eq!(n, 8);
    }

    #[test]
    fn atomics_return_the_old_value() {
        let mut x = 5u32;
        assert_eq!(atomic_add(&mut x, 3), 5);
        assert_eq!(atomic_sub(&mut x, 10), 8);
        assert_eq!(x, u32::MAX - 1);
        assert_eq!(atomic_min(&mut x, 7), u32::MAX - 1);
        assert_eq!(atomic_max(&mut x, 9), 7);
        assert_eq!(atomic_and(&mut x, 8), 9);
        assert_eq!(atomic_or(&mut x, 3), 8);
        assert_eq!(atomic_xor(&mut x, 1), 11);
        assert_eq!(atomic_exchange(&mut x, 42), 10);
        assert_eq!(x, 42);
        let mut y = -1i32;
        assert_eq!(atomic_min(&mut y, -5), -1);
        assert_eq!(y, -5);
    }
}
