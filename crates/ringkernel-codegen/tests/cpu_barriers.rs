//! The CPU meaning of shared arrays and barriers (`dsl::launch_with_barriers`).

use ringkernel_codegen::dsl::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Every thread writes its slot, waits, then reads its neighbour's: the value written by
/// another thread before the barrier.
fn rotate(out: &mut [i32]) {
    let mut s = shared_array::<i32, 48>();
    let t = thread_idx_x() + block_dim_x() * (thread_idx_y() + block_dim_y() * thread_idx_z());
    let n = block_dim_x() * block_dim_y() * block_dim_z();
    s[t as usize] = t * 10 + block_idx_x();
    sync_threads();
    let got = s[((t + 1) % n) as usize];
    sync_threads();
    s[t as usize] = got + 1;
    sync_threads();
    out[(block_idx_x() * n + t) as usize] = s[((t + n - 1) % n) as usize];
}

#[test]
fn threads_see_each_others_writes_across_barriers() {
    for block in [[48u32, 1, 1], [6, 8, 1], [4, 3, 4]] {
        let n = (block[0] * block[1] * block[2]) as i32;
        let mut out = vec![0i32; 3 * n as usize];
        launch_with_barriers([3, 1, 1], block, || rotate(&mut out));
        for b in 0..3 {
            for t in 0..n {
                // Slot t-1 held got(t-1) + 1 = value of slot t, plus one.
                let want = t * 10 + b + 1;
                assert_eq!(
                    out[(b * n + t) as usize],
                    want,
                    "block {b} thread {t} {block:?}"
                );
            }
        }
    }
}

#[test]
fn shared_arrays_are_fresh_per_block() {
    fn count(out: &mut [i32]) {
        let mut c = shared_array::<i32, 1>();
        if thread_idx_x() == 0 {
            c[0] = 0;
        }
        sync_threads();
        c[0] += 1;
        sync_threads();
        if thread_idx_x() == 0 {
            out[block_idx_x() as usize] = c[0];
        }
    }
    let mut out = vec![0i32; 5];
    launch_with_barriers([5, 1, 1], [7, 1, 1], || count(&mut out));
    assert_eq!(out, vec![7; 5]);
    // Sequential launch: shared arrays work, each block starts from T::default().
    fn accumulate(out: &mut [i32]) {
        let mut c = shared_array::<i32, 1>();
        c[0] += 1;
        out[block_idx_x() as usize] = c[0];
    }
    let mut out = vec![0i32; 4];
    launch([4, 1, 1], [9, 1, 1], || accumulate(&mut out));
    assert_eq!(out, vec![9; 4]);
}

#[test]
fn threads_that_return_early_count_as_arrived() {
    fn early(out: &mut [i32]) {
        let mut s = shared_array::<i32, 16>();
        let t = thread_idx_x();
        s[t as usize] = t;
        if t >= 10 {
            return;
        }
        sync_threads();
        out[t as usize] = s[(15 - t) as usize];
    }
    let mut out = vec![-1i32; 16];
    launch_with_barriers([1, 1, 1], [16, 1, 1], || early(&mut out));
    let want: Vec<i32> = (0..16).map(|t| if t < 10 { 15 - t } else { -1 }).collect();
    assert_eq!(out, want);
}

#[test]
fn a_panicking_thread_stops_the_launch_without_hanging() {
    fn bad(out: &mut [i32]) {
        let t = thread_idx_x();
        sync_threads();
        out[(t * 100) as usize] = 1; // out of bounds for t > 0
        sync_threads();
    }
    let mut out = vec![0i32; 8];
    let r = catch_unwind(AssertUnwindSafe(|| {
        launch_with_barriers([2, 1, 1], [8, 1, 1], || bad(&mut out))
    }));
    let msg = r.expect_err("the launch panics");
    let text = msg
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(text.contains("index out of bounds"), "{text}");
    assert_eq!(out[0], 1);
}

#[test]
fn a_barrier_under_the_sequential_launch_is_refused() {
    let r = catch_unwind(|| launch([1, 1, 1], [4, 1, 1], sync_threads));
    let msg = r.expect_err("launch refuses barriers");
    let text = msg
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .unwrap_or_else(|| msg.downcast_ref::<String>().cloned().unwrap_or_default());
    assert!(text.contains("launch_with_barriers"), "{text}");
    // One thread per block: the barrier is trivially met.
    launch([3, 1, 1], [1, 1, 1], sync_threads);
    launch_with_barriers([3, 1, 1], [1, 1, 1], sync_threads);
    sync_threads();
}
