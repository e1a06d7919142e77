//! WGSL barriers: `sync_threads()` is `workgroupBarrier()`, with `storageBarrier()` in front
//! only where a thread may read a storage element another thread wrote before the
//! barrier (see the crate docs). Both kinds execute on a wgpu adapter (lavapipe in CI)
//! with the results of the Rust on the CPU.

mod common;
mod kernels;

use common::{assert_close, check_wgsl, gpu, run, Data, Rng};
use kernels::*;
use ringkernel_codegen::dsl::launch_with_barriers;
use ringkernel_codegen::{transpile_global_kernel_wgsl, ParamValue as P};
use syn::parse_quote;

fn wgsl(f: &syn::ItemFn) -> String {
    let k = transpile_global_kernel_wgsl(f).unwrap_or_else(|e| panic!("{e}"));
    check_wgsl(&k);
    k.source
}

#[test]
fn storage_barriers_only_where_threads_share_storage() {
    // Talking through `out` across the barrier: storage barriers.
    let w = wgsl(&neighbour_sum::source());
    assert_eq!(w.matches("storageBarrier();").count(), 2, "{w}");
    assert_eq!(w.matches("workgroupBarrier();").count(), 2, "{w}");
    // Each thread keeps to its own columns of `y`: workgroup barriers only.
    let w = wgsl(&row_softmax::source());
    assert!(!w.contains("storageBarrier"), "{w}");
    assert_eq!(w.matches("workgroupBarrier();").count(), 5, "{w}");
    // Written only, or read only: nothing to order.
    let w = wgsl(&block_reduce::source());
    assert!(!w.contains("storageBarrier"), "{w}");

    // What makes the analysis keep the storage barrier.
    let keeps = |f: syn::ItemFn, why: &str| {
        let w = wgsl(&f);
        assert!(w.contains("storageBarrier();"), "{why}:\n{w}");
    };
    keeps(
        parse_quote! {
            fn k(y: &mut [f32]) {
                let t = thread_idx_x();
                y[(t * 2) as usize] = 1.0;
                sync_threads();
                y[t as usize] += 1.0;
            }
        },
        "an index that is not thread_idx_x() + a uniform value",
    );
    keeps(
        parse_quote! {
            fn k(y: &mut [f32], off: i32) {
                let t = thread_idx_x();
                y[t as usize] = 1.0;
                sync_threads();
                y[(t + off) as usize] += 1.0;
            }
        },
        "two different offsets",
    );
    keeps(
        parse_quote! {
            fn k(y: &mut [f32]) {
                let t = thread_idx_x();
                let mut c = t;
                y[c as usize] = 1.0;
                c += 3;
                sync_threads();
                y[c as usize] += 1.0;
            }
        },
        "a step that is not a multiple of the workgroup width",
    );
    keeps(
        parse_quote! {
            fn k(h: &mut [u32], y: &mut [f32]) {
                let t = thread_idx_x();
                atomic_add(&mut h[0], 1u32);
                sync_threads();
                y[t as usize] = h[0] as f32;
            }
        },
        "atomics",
    );
    keeps(
        parse_quote! {
            fn k(y: &mut [f32], flag: &[i32]) {
                let t = thread_idx_x();
                let mut c = t;
                if flag[0] > 0 {
                    c = 0;
                }
                y[c as usize] = 1.0;
                sync_threads();
                y[t as usize] += 1.0;
            }
        },
        "one assignment breaks the pattern",
    );
    // A 2-D workgroup: thread_idx_x() alone does not tell the threads apart.
    let f: syn::ItemFn = parse_quote! {
        fn k(y: &mut [f32]) {
            let t = thread_idx_x();
            y[t as usize] = 1.0;
            sync_threads();
            y[t as usize] += 1.0;
        }
    };
    let w2 = ringkernel_codegen::transpile_global_kernel_wgsl_with(&f, [8, 8, 1]).unwrap();
    check_wgsl(&w2);
    assert!(w2.source.contains("storageBarrier();"), "{}", w2.source);
    assert!(!wgsl(&f).contains("storageBarrier"));
}

#[test]
fn both_barrier_kinds_match_cpu() {
    let Some(ctx) = gpu("both_barrier_kinds_match_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("barriers");
    // Storage barriers: neighbours' values through `out`.
    let k = transpile_global_kernel_wgsl(&neighbour_sum::source()).unwrap();
    for n in [1usize, 64, 65, rng.usize(100, 3000)] {
        let x = rng.vec_f32(n, -4.0, 4.0);
        let g = [(n as u32).div_ceil(64), 1, 1];
        let mut cpu = vec![f32::NAN; n];
        launch_with_barriers(g, [64, 1, 1], || {
            neighbour_sum::neighbour_sum(&x, &mut cpu, n as i32)
        });
        let mut data = [Data::F32(x.clone()), Data::F32(vec![f32::NAN; n])];
        run(
            &ctx,
            &k,
            &k.pack_params(&[P::I32(n as i32)]).unwrap(),
            &mut data,
            g,
        );
        assert_close("neighbour_sum", data[1].f32(), &cpu, 1e-6);
    }
    // Workgroup barriers only: a row softmax.
    let k = transpile_global_kernel_wgsl(&row_softmax::source()).unwrap();
    for (rows, cols) in [(1usize, 1usize), (3, 63), (5, 1000)] {
        let x = rng.vec_f32(rows * cols, -6.0, 6.0);
        let g = [rows as u32, 1, 1];
        let mut cpu = vec![f32::NAN; rows * cols];
        launch_with_barriers(g, [64, 1, 1], || {
            row_softmax::row_softmax(&x, &mut cpu, cols as i32)
        });
        let mut data = [Data::F32(x.clone()), Data::F32(vec![f32::NAN; rows * cols])];
        run(
            &ctx,
            &k,
            &k.pack_params(&[P::I32(cols as i32)]).unwrap(),
            &mut data,
            g,
        );
        assert_close("row_softmax", data[1].f32(), &cpu, 1e-5);
    }
}
