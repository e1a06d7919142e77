//! WgpuCompute on the software adapter (lavapipe in CI): the shared compute testkit plus
//! tests of what is specific to this backend (large dispatches, batching, the cache,
//! errors). Set RINGKERNEL_WGPU_TEST_ADAPTER=hardware to run them on a GPU instead.

use ringkernel_core::compute::{
    reference, testkit, AttentionDims, BinaryOp, ComputeBackend, MatmulDims, ReduceDims, ReduceOp,
    UnaryOp,
};
use ringkernel_core::util::{rel_error, SplitMix64};
use ringkernel_core::Error;
use ringkernel_wgpu::{AdapterSelection, GpuContext, MatmulTile, WgpuCompute};
use std::sync::OnceLock;

fn gpu() -> &'static WgpuCompute {
    static GPU: OnceLock<WgpuCompute> = OnceLock::new();
    GPU.get_or_init(fresh)
}

/// A backend of its own (its caches, its buffers) on the process's one device. The
/// tests share that device: with a device each, opened and used from parallel test
/// threads, NVIDIA's driver (580, H200) deadlocked inside itself in 1 of 5 to 2 of 3
/// runs at 16 test threads (BENCHMARKS.md, 2026-11-28, calls 15–17).
fn fresh() -> WgpuCompute {
    let sel = std::env::var("RINGKERNEL_WGPU_TEST_ADAPTER")
        .map(|s| AdapterSelection::parse(&s))
        .unwrap_or(default_adapter());
    WgpuCompute::with_context(
        GpuContext::shared(&sel)
            .expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)"),
    )
}

fn poisoned(g: &WgpuCompute, len: usize) -> ringkernel_core::compute::BufferRef {
    g.upload(&vec![f32::NAN; len]).unwrap()
}

fn read(g: &WgpuCompute, b: &dyn ringkernel_core::compute::DeviceBuffer) -> Vec<f32> {
    let mut v = vec![0.0; b.len()];
    g.read(b, 0, &mut v).unwrap();
    v
}

#[test]
fn shared_testkit_passes() {
    let report = testkit::check_all(gpu()).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.passed());
    println!("{report}");
}

/// 2^24 + 5 elements: 65541 workgroups, more than one grid dimension holds.
#[test]
fn large_elementwise_dispatch_covers_every_element() {
    let g = gpu();
    let n = (1usize << 24) + 5;
    let mut rng = SplitMix64::from_entropy();
    let a = rng.vec(n, -1.0, 1.0);
    let b = rng.vec(n, -1.0, 1.0);
    let (da, db, out) = (g.upload(&a).unwrap(), g.upload(&b).unwrap(), poisoned(g, n));
    g.binary(BinaryOp::Add, &*da, &*db, &*out, n).unwrap();
    let got = read(g, &*out);
    let want: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| *x as f64 + *y as f64)
        .collect();
    assert!(rel_error(&got, &want) < 1e-7, "{}", rel_error(&got, &want));
    // The tail (in the second grid row) was written.
    assert_eq!(got[n - 1], a[n - 1] + b[n - 1]);
}

#[test]
fn long_reduction_takes_passes_and_is_accurate() {
    let g = gpu();
    let n = 1_000_003;
    let mut rng = SplitMix64::from_entropy();
    let x = rng.vec(n, -1.0, 1.0);
    let dx = g.upload(&x).unwrap();
    for op in ReduceOp::ALL {
        let out = poisoned(g, 1);
        g.reduce(
            op,
            &*dx,
            &*out,
            ReduceDims {
                outer: 1,
                axis: n,
                inner: 1,
            },
        )
        .unwrap();
        let got = read(g, &*out)[0] as f64;
        let want = match op {
            ReduceOp::Sum => x.iter().map(|v| *v as f64).sum::<f64>(),
            ReduceOp::Mean => x.iter().map(|v| *v as f64).sum::<f64>() / n as f64,
            ReduceOp::Max => x.iter().cloned().fold(f32::MIN, f32::max) as f64,
            ReduceOp::Min => x.iter().cloned().fold(f32::MAX, f32::min) as f64,
        };
        let scale = x.iter().map(|v| v.abs() as f64).sum::<f64>() / n as f64;
        let tol = match op {
            ReduceOp::Max | ReduceOp::Min => 0.0,
            ReduceOp::Sum => 1e-5 * scale * n as f64,
            ReduceOp::Mean => 1e-5 * scale,
        };
        assert!((got - want).abs() <= tol, "{op:?}: {got} vs {want}");
    }
    let y = rng.vec(n, -1.0, 1.0);
    let dy = g.upload(&y).unwrap();
    let out = poisoned(g, 1);
    g.dot(&*dx, &*dy, &*out, n).unwrap();
    let want: f64 = x.iter().zip(&y).map(|(a, b)| *a as f64 * *b as f64).sum();
    let got = read(g, &*out)[0] as f64;
    assert!((got - want).abs() < 1e-3, "dot {got} vs {want}");
}

/// Runs `dims` on random inputs and checks each output against the f64 reference,
/// within the forward error bound of its dot product.
fn check_matmul(g: &WgpuCompute, rng: &mut SplitMix64, dims: MatmulDims, what: &str) {
    let MatmulDims {
        batch,
        m,
        k,
        n,
        b_batched: bb,
    } = dims;
    let a = rng.vec(batch * m * k, -1.0, 1.0);
    let b = rng.vec(if bb { batch } else { 1 } * k * n, -1.0, 1.0);
    let (da, db, out) = (
        g.upload(&a).unwrap(),
        g.upload(&b).unwrap(),
        poisoned(g, batch * m * n),
    );
    g.matmul(&*da, &*db, &*out, dims).unwrap();
    let want = reference::matmul(&a, &b, dims);
    let got = read(g, &*out);
    // Forward error of each dot product against its condition Σ|a||b| (a single short
    // dot can cancel to near zero, where a plain relative error means nothing).
    let abs_a: Vec<f32> = a.iter().map(|v| v.abs()).collect();
    let abs_b: Vec<f32> = b.iter().map(|v| v.abs()).collect();
    let scale = reference::matmul(&abs_a, &abs_b, dims);
    for (i, ((g, w), s)) in got.iter().zip(&want).zip(&scale).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= 1e-6 * s + 1e-30,
            "{what} {dims:?}: element {i}: {g} vs {w} (scale {s})"
        );
    }
}

fn mm(batch: usize, m: usize, k: usize, n: usize, b_batched: bool) -> MatmulDims {
    MatmulDims {
        batch,
        m,
        k,
        n,
        b_batched,
    }
}

#[test]
fn matmul_with_awkward_sizes_matches_reference() {
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    for dims in [
        mm(1, 130, 67, 129, false),
        mm(2, 64, 128, 64, true),
        mm(1, 1, 300, 1, false),
    ] {
        check_matmul(g, &mut rng, dims, "default shape");
    }
}

/// Every tile shape the tuner may pick, with and without 16-byte accesses, on sizes that
/// are not multiples of any tile: 1×N, N×1, k = 1, k = 0, a ragged depth, batches.
#[test]
fn every_matmul_tile_shape_matches_reference_on_awkward_sizes() {
    let g = fresh();
    let mut rng = SplitMix64::from_entropy();
    let cases = [
        mm(1, 131, 37, 133, false), // scalar accesses, ragged everywhere
        mm(1, 130, 68, 132, false), // 16-byte accesses, tiles cut at the edges
        mm(2, 67, 20, 9, true),     // vec A, scalar B, batched B
        mm(3, 9, 13, 20, false),    // scalar A, vec B, B shared by the batch
        mm(1, 1, 257, 300, false),  // one row
        mm(1, 300, 257, 1, false),  // one column
        mm(1, 129, 1, 131, false),  // k = 1
        mm(1, 1, 1, 1, false),
    ];
    let shapes = g.matmul_tile_candidates();
    assert!(shapes.contains(&MatmulTile::LARGE));
    for t in shapes {
        g.set_matmul_tile(Some(t)).unwrap();
        for dims in cases {
            check_matmul(&g, &mut rng, dims, &t.to_string());
        }
        // k = 0: zeros.
        let (a, b, out) = (g.alloc(0).unwrap(), g.alloc(0).unwrap(), poisoned(&g, 35));
        g.matmul(&*a, &*b, &*out, mm(1, 5, 0, 7, false)).unwrap();
        assert!(read(&g, &*out).iter().all(|v| *v == 0.0), "{t}: k = 0");
    }
    g.set_matmul_tile(None).unwrap();
    // Without a forced shape: small products by the workgroup count, large ones tuned
    // (or the large shape on a software adapter, where nothing is timed).
    use ringkernel_wgpu::matmul_tune::{untuned_tile, TILE_ENV};
    if std::env::var_os(TILE_ENV).is_none() {
        for d in [mm(1, 64, 64, 64, false), mm(1, 2048, 16, 1024, false)] {
            assert_eq!(g.matmul_tile_for(d).unwrap(), untuned_tile(d));
        }
        assert_eq!(untuned_tile(mm(1, 64, 64, 64, false)), MatmulTile::SMALL);
        assert_eq!(
            untuned_tile(mm(1, 2048, 16, 1024, false)),
            MatmulTile::LARGE
        );
        if g.context().info.software {
            let big = mm(1, 1024, 1024, 1024, false);
            assert_eq!(g.matmul_tile_for(big).unwrap(), MatmulTile::LARGE);
        }
    }
    // A shape the generator does not support, or one too big for the device, is refused.
    let odd = MatmulTile {
        bm: 96,
        bn: 128,
        bk: 8,
        tm: 8,
        tn: 8,
    };
    assert!(matches!(
        g.set_matmul_tile(Some(odd)),
        Err(Error::InvalidArgument(_))
    ));
    let huge = MatmulTile {
        bk: 64,
        ..MatmulTile::LARGE
    };
    let limit = g
        .context()
        .device
        .limits()
        .max_compute_workgroup_storage_size;
    assert_eq!(
        g.set_matmul_tile(Some(huge)).is_ok(),
        huge.workgroup_bytes() <= limit
    );
}

#[test]
fn matmul_tuning_times_every_fitting_shape_and_caches_the_winner() {
    use ringkernel_wgpu::matmul_tune::{cached_tile, store_tile};
    let g = fresh();
    let times = g.time_matmul_tiles(mm(1, 256, 64, 256, false)).unwrap();
    assert_eq!(times.len(), g.matmul_tile_candidates().len());
    assert!(times.windows(2).all(|w| w[0].1 <= w[1].1), "{times:?}");
    // The cache file: one line per key, a newer entry replaces an older one.
    let dir = std::env::temp_dir().join(format!("rk-tune-{}", std::process::id()));
    let path = dir.join("tiles.txt");
    let key = g.tuning_key();
    assert_eq!(cached_tile(&path, &key), None);
    store_tile(&path, &key, times[0].0).unwrap();
    store_tile(&path, "other|adapter", MatmulTile::SMALL).unwrap();
    assert_eq!(cached_tile(&path, &key), Some(times[0].0));
    store_tile(&path, &key, MatmulTile::SMALL).unwrap();
    assert_eq!(cached_tile(&path, &key), Some(MatmulTile::SMALL));
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn many_ops_in_one_batch_keep_their_order() {
    let g = gpu();
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let a = g.upload(&x).unwrap();
    let b = g.alloc(n).unwrap();
    // 600 dependent ops (more than MAX_BATCH, so the batch is submitted midway).
    for _ in 0..300 {
        g.binary_scalar(BinaryOp::Add, &*a, 1.0, &*b, n).unwrap();
        g.binary_scalar(BinaryOp::Add, &*b, 1.0, &*a, n).unwrap();
    }
    // A host write between ops lands after the ops issued before it.
    g.write(&*a, 0, &[-5.0]).unwrap();
    g.unary(UnaryOp::Neg, &*a, &*b, n).unwrap();
    let got = read(g, &*b);
    assert_eq!(got[0], 5.0);
    for (i, v) in got.iter().enumerate().skip(1) {
        assert_eq!(*v, -(i as f32 + 600.0), "element {i}");
    }
}

#[test]
fn large_dispatches_are_submitted_at_once_small_ones_batched() {
    let g = fresh();
    // Elements for SUBMIT_THREADS threads: VEC4_PER_THREAD vec4s per thread.
    let n = 4
        * ringkernel_drain::plan::VEC4_PER_THREAD
        * ringkernel_wgpu::compute::SUBMIT_THREADS as usize;
    let (a, out) = (g.upload(&vec![1.5; n]).unwrap(), g.alloc(n).unwrap());
    g.binary_scalar(BinaryOp::Add, &*a, 1.0, &*out, 8).unwrap();
    g.binary_scalar(BinaryOp::Add, &*a, 1.0, &*out, 8).unwrap();
    assert_eq!(g.pending_ops(), 2, "small ops share a submission");
    g.binary_scalar(BinaryOp::Mul, &*a, 2.0, &*out, n).unwrap();
    assert_eq!(
        g.pending_ops(),
        0,
        "a large op is submitted as soon as it is recorded"
    );
    let got = read(&g, &*out);
    assert!(got.iter().all(|v| *v == 3.0));
}

#[test]
fn pipelines_are_cached_per_specialisation() {
    let g = fresh();
    let x = g.upload(&[1.0, 4.0]).unwrap();
    let o = g.alloc(2).unwrap();
    g.unary(UnaryOp::Sqrt, &*x, &*o, 2).unwrap();
    g.unary(UnaryOp::Sqrt, &*x, &*o, 2).unwrap();
    assert_eq!(g.cached_pipelines(), 1);
    g.unary(UnaryOp::Neg, &*x, &*o, 2).unwrap();
    assert_eq!(g.cached_pipelines(), 2);
    let mut v = [0.0; 2];
    g.read(&*o, 0, &mut v).unwrap();
    assert_eq!(v, [-1.0, -4.0]);
}

#[test]
fn bad_calls_are_typed_errors() {
    let g = gpu();
    let a = g.upload(&[1.0; 8]).unwrap();
    let small = g.alloc(4).unwrap();
    assert!(matches!(
        g.unary(UnaryOp::Neg, &*a, &*small, 8),
        Err(Error::ShapeMismatch(_))
    ));
    assert!(matches!(
        g.unary(UnaryOp::Neg, &*a, &*a, 8),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        g.reduce(
            ReduceOp::Sum,
            &*a,
            &*small,
            ReduceDims {
                outer: 1,
                axis: 0,
                inner: 1
            }
        ),
        Err(Error::ShapeMismatch(_))
    ));
    let mut out = [0.0; 9];
    assert!(matches!(
        g.read(&*a, 0, &mut out),
        Err(Error::ShapeMismatch(_))
    ));
    assert!(matches!(
        g.copy(&*a, 0, &*a, 2, 4),
        Err(Error::InvalidArgument(_))
    ));
    // Copy within one buffer, non-overlapping.
    g.write(&*a, 0, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    g.copy(&*a, 0, &*a, 4, 4).unwrap();
    let mut v = [0.0; 8];
    g.read(&*a, 0, &mut v).unwrap();
    assert_eq!(v, [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
    // A buffer of another backend (on the same device) is refused.
    let other = fresh();
    let ob = other.alloc(8).unwrap();
    assert!(matches!(
        g.unary(UnaryOp::Neg, &*ob, &*a, 8),
        Err(Error::Device(_))
    ));
}

/// lavapipe in CI; the GPU on the device machine (whose bundle sets RINGKERNEL_REQUIRE_GPU).
fn default_adapter() -> AdapterSelection {
    if std::env::var("RINGKERNEL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        AdapterSelection::Hardware
    } else {
        AdapterSelection::Software
    }
}

/// Lengths divisible by 4 run the vec4 kernels, others the scalar ones: both must give
/// the same results to 2 ulp (and the vec4 run must write every element, including the last).
#[test]
fn vec4_kernels_agree_with_scalar_kernels() {
    let g = gpu();
    let n = 1028;
    let mut rng = SplitMix64::from_entropy();
    let a = rng.vec(n, 0.1, 2.0);
    let b = rng.vec(n, 0.1, 2.0);
    let (da, db) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
    let run = |f: &dyn Fn(&dyn ringkernel_core::compute::DeviceBuffer, usize)| {
        let (o4, o1) = (poisoned(g, n), poisoned(g, n));
        f(&*o4, n);
        f(&*o1, n - 1);
        let (v4, v1) = (read(g, &*o4), read(g, &*o1));
        assert!(
            v4[n - 1].is_finite(),
            "vec4 kernel left the last element unwritten"
        );
        // Same formulas; the shader compiler may contract differently in vector code,
        // so allow 2 ulp.
        for i in 0..n - 1 {
            let ulps = (v4[i].to_bits() as i64 - v1[i].to_bits() as i64).abs();
            assert!(ulps <= 2, "element {i}: {} vs {}", v4[i], v1[i]);
        }
    };
    for op in UnaryOp::ALL {
        run(&|o, len| g.unary(op, &*da, o, len).unwrap());
    }
    for op in BinaryOp::ALL {
        run(&|o, len| g.binary(op, &*da, &*db, o, len).unwrap());
        run(&|o, len| g.binary_scalar(op, &*da, 1.5, o, len).unwrap());
    }
    run(&|o, len| g.swiglu(&*da, &*db, o, len).unwrap());
}

/// A length that is not a multiple of 4 runs the vec4 kernel over the whole vec4s and
/// the scalar one over the rest: every element up to `len` matches the f64 reference,
/// and nothing beyond `len` is written.
#[test]
fn awkward_lengths_take_vec4_and_a_scalar_tail() {
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    for len in [1usize, 2, 3, 5, 6, 7, 9, 1023, 1025, 4099] {
        let cap = len + 5;
        let a = rng.vec(cap, 0.1, 2.0);
        let b = rng.vec(cap, 0.1, 2.0);
        let (da, db) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
        let out = poisoned(g, cap);
        g.binary(BinaryOp::Mul, &*da, &*db, &*out, len).unwrap();
        let got = read(g, &*out);
        let want: Vec<f64> = (0..len).map(|i| a[i] as f64 * b[i] as f64).collect();
        assert!(rel_error(&got[..len], &want) < 1e-7, "len {len}");
        assert!(
            got[len..].iter().all(|x| x.is_nan()),
            "len {len}: wrote past the end"
        );
        let out = poisoned(g, cap);
        g.unary(UnaryOp::Exp, &*da, &*out, len).unwrap();
        let got = read(g, &*out);
        let want: Vec<f64> = (0..len).map(|i| (a[i] as f64).exp()).collect();
        assert!(rel_error(&got[..len], &want) < 1e-6, "exp, len {len}");
        assert!(got[len..].iter().all(|x| x.is_nan()), "exp, len {len}");
    }
}

/// Rows whose length is a multiple of 4 take the vec4 softmax / RMSNorm kernels.
#[test]
fn vec4_row_kernels_match_reference() {
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    for &(rows, cols) in &[(3, 4096), (5, 1028), (2, 4)] {
        let x = rng.vec(rows * cols, -4.0, 4.0);
        let w = rng.vec(cols, 0.5, 1.5);
        let (dx, dw) = (g.upload(&x).unwrap(), g.upload(&w).unwrap());
        let out = poisoned(g, rows * cols);
        g.softmax(&*dx, &*out, rows, cols).unwrap();
        let e = rel_error(&read(g, &*out), &reference::softmax(&x, rows, cols));
        assert!(e < 1e-5, "softmax {rows}x{cols}: {e}");
        let out = poisoned(g, rows * cols);
        g.rms_norm(&*dx, &*dw, &*out, rows, cols, 1e-6).unwrap();
        let e = rel_error(
            &read(g, &*out),
            &reference::rms_norm(&x, &w, rows, cols, 1e-6),
        );
        assert!(e < 1e-5, "rms_norm {rows}x{cols}: {e}");
    }
}

/// Sizes whose products overflow `usize` are `ShapeMismatch` (checked once in core,
/// never wrapped into a small dispatch); sizes that fit `usize` but not the kernels'
/// 32-bit indices are `InvalidArgument`.
#[test]
fn overflowing_sizes_are_errors_not_wraps() {
    let g = gpu();
    let b = g.upload(&[1.0; 16]).unwrap();
    let o = g.alloc(16).unwrap();
    let h = usize::MAX / 2 + 1;
    let shape = |r: ringkernel_core::Result<()>| matches!(r, Err(Error::ShapeMismatch(_)));
    let mm = MatmulDims {
        batch: 1 << 16,
        m: 1 << 16,
        k: 1 << 16,
        n: 1 << 16,
        b_batched: true,
    };
    assert!(shape(g.matmul(&*b, &*b, &*o, mm)));
    assert!(shape(g.matvec(&*b, &*b, &*o, h, 2)));
    let rd = ReduceDims {
        outer: 2,
        axis: h,
        inner: 1,
    };
    assert!(shape(g.reduce(ReduceOp::Sum, &*b, &*o, rd)));
    assert!(shape(g.softmax(&*b, &*o, h, 4)));
    let ad = AttentionDims {
        batch_heads: 3,
        q_len: h,
        kv_len: 4,
        kv_stride: 4,
        head_dim: 8,
        scale: 0.5,
        causal: true,
        q_offset: 1,
    };
    assert!(shape(g.attention(&*b, &*b, &*b, &*o, ad)));
    // 2^40 elements fit usize but not the kernels' u32 indices: the planner refuses it.
    let r = g.reduce(
        ReduceOp::Sum,
        &*b,
        &*o,
        ReduceDims {
            outer: 1 << 20,
            axis: 1 << 20,
            inner: 1,
        },
    );
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}
