//! Every compute op on the GPU against the f64 reference: ringkernel-core's testkit
//! (awkward sizes, poisoned outputs, error contract) plus CUDA-specific paths the
//! testkit's small sizes do not reach (multi-block reductions, rows too long for shared
//! memory, unfused attention, cuBLAS batched/broadcast matmul, TF32, graph capture).

use ringkernel_core::compute::{
    reference, AttentionDims, BinaryOp, ComputeBackend, MatmulDims, ReduceDims, ReduceOp, UnaryOp,
};
use ringkernel_core::util::{rel_error, SplitMix64};
use ringkernel_cuda::CudaCompute;

fn gpu() -> CudaCompute {
    CudaCompute::new(0).expect("CUDA device 0")
}

fn poisoned(g: &CudaCompute, n: usize) -> ringkernel_core::compute::BufferRef {
    g.upload(&vec![f32::NAN; n]).unwrap()
}

fn read(g: &CudaCompute, b: &ringkernel_core::compute::BufferRef, n: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    g.read(&**b, 0, &mut v).unwrap();
    v
}

#[test]
#[ignore = "needs CUDA GPU"]
fn testkit_check_all() {
    let g = gpu();
    let report =
        ringkernel_core::compute::testkit::check_all(&g).expect("every op within tolerance");
    println!("{report}");
    assert!(report.passed());
}

#[test]
#[ignore = "needs CUDA GPU"]
fn matmul_batched_and_broadcast_vs_f64() {
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    for (batch, m, k, n, b_batched) in [
        (1, 1, 1, 1, false),
        (3, 65, 129, 33, true),
        (4, 127, 257, 63, false),
        (1, 512, 1024, 256, false),
    ] {
        let dims = MatmulDims {
            batch,
            m,
            k,
            n,
            b_batched,
        };
        let a = rng.vec(batch * m * k, -1.0, 1.0);
        let b = rng.vec(if b_batched { batch * k * n } else { k * n }, -1.0, 1.0);
        let out = poisoned(&g, batch * m * n);
        g.matmul(
            &*g.upload(&a).unwrap(),
            &*g.upload(&b).unwrap(),
            &*out,
            dims,
        )
        .unwrap();
        let got = read(&g, &out, batch * m * n);
        let err = rel_error(&got, &reference::matmul(&a, &b, dims));
        println!("matmul {dims:?}: rel err {err:.2e}");
        assert!(err < 1e-5, "fp32 matmul {dims:?}: {err}");
        g.set_tf32(true);
        g.matmul(
            &*g.upload(&a).unwrap(),
            &*g.upload(&b).unwrap(),
            &*out,
            dims,
        )
        .unwrap();
        let got = read(&g, &out, batch * m * n);
        let err32 = rel_error(&got, &reference::matmul(&a, &b, dims));
        g.set_tf32(false);
        println!("matmul {dims:?} tf32: rel err {err32:.2e}");
        assert!(err32 < 3e-3, "tf32 matmul {dims:?}: {err32}");
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn long_reductions_use_several_blocks() {
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    for dims in [
        ReduceDims {
            outer: 1,
            axis: (1 << 22) + 3,
            inner: 1,
        },
        ReduceDims {
            outer: 3,
            axis: 1 << 20,
            inner: 1,
        },
        ReduceDims {
            outer: 5,
            axis: 1000,
            inner: 37,
        },
    ] {
        let n = dims.outer * dims.axis * dims.inner;
        let x = rng.vec(n, -1.0, 1.0);
        let dx = g.upload(&x).unwrap();
        let abs: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        for op in ReduceOp::ALL {
            let out = poisoned(&g, dims.outer * dims.inner);
            g.reduce(op, &*dx, &*out, dims).unwrap();
            let got = read(&g, &out, dims.outer * dims.inner);
            let want = reference::reduce(op, &x, dims);
            match op {
                // A sum of terms of both signs cancels: its f32 error is bounded by the
                // sum of the terms' magnitudes, not by the (much smaller) result.
                ReduceOp::Sum | ReduceOp::Mean => {
                    let err = cancelling_error(&got, &want, &reference::reduce(op, &abs, dims));
                    assert!(err < 1e-5, "{op:?} {dims:?}: {err} of the magnitudes");
                }
                ReduceOp::Max | ReduceOp::Min => {
                    let err = rel_error(&got, &want);
                    assert!(err < 1e-6, "{op:?} {dims:?}: {err}");
                }
            }
        }
    }
    let n = (1 << 22) + 5;
    let (a, b) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0));
    let out = poisoned(&g, 1);
    g.dot(&*g.upload(&a).unwrap(), &*g.upload(&b).unwrap(), &*out, n)
        .unwrap();
    let (abs_a, abs_b): (Vec<f32>, Vec<f32>) =
        a.iter().zip(&b).map(|(x, y)| (x.abs(), y.abs())).unzip();
    let err = cancelling_error(
        &read(&g, &out, 1),
        &reference::dot(&a, &b),
        &reference::dot(&abs_a, &abs_b),
    );
    assert!(err < 1e-5, "dot: {err} of the magnitudes");
}

/// The largest `|got − want| / scale` (each output against its own scale, the sum of
/// its terms' magnitudes); infinite for a NaN.
fn cancelling_error(got: &[f32], want: &[f64], scale: &[f64]) -> f64 {
    assert!(got.len() == want.len() && want.len() == scale.len());
    got.iter()
        .zip(want)
        .zip(scale)
        .map(|((&g, &w), &s)| {
            let e = (f64::from(g) - w).abs() / s.max(f64::MIN_POSITIVE);
            if e.is_nan() {
                f64::INFINITY
            } else {
                e
            }
        })
        .fold(0.0, f64::max)
}

#[test]
#[ignore = "needs CUDA GPU"]
fn rows_longer_than_shared_memory() {
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    for (rows, cols) in [(3usize, 40_000usize), (2, 40_001), (64, 4096), (5, 4097)] {
        let x = rng.vec(rows * cols, -8.0, 8.0);
        let w = rng.vec(cols, 0.5, 1.5);
        let bias = rng.vec(cols, -1.0, 1.0);
        let (dx, dw, db) = (
            g.upload(&x).unwrap(),
            g.upload(&w).unwrap(),
            g.upload(&bias).unwrap(),
        );
        let out = poisoned(&g, rows * cols);
        g.softmax(&*dx, &*out, rows, cols).unwrap();
        let err = rel_error(
            &read(&g, &out, rows * cols),
            &reference::softmax(&x, rows, cols),
        );
        assert!(err < 1e-5, "softmax {rows}x{cols}: {err}");
        let out = poisoned(&g, rows * cols);
        g.rms_norm(&*dx, &*dw, &*out, rows, cols, 1e-6).unwrap();
        let err = rel_error(
            &read(&g, &out, rows * cols),
            &reference::rms_norm(&x, &w, rows, cols, 1e-6),
        );
        assert!(err < 1e-5, "rms_norm {rows}x{cols}: {err}");
        let out = poisoned(&g, rows * cols);
        g.layer_norm(&*dx, &*dw, &*db, &*out, rows, cols, 1e-5)
            .unwrap();
        let err = rel_error(
            &read(&g, &out, rows * cols),
            &reference::layer_norm(&x, &w, &bias, rows, cols, 1e-5),
        );
        assert!(err < 1e-5, "layer_norm {rows}x{cols}: {err}");
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn attention_fused_and_unfused_paths() {
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    for (bh, q_len, kv_len, kv_stride, head_dim, causal, q_offset) in [
        (3, 17, 40, 48, 64, true, 23),
        (2, 5, 300, 300, 128, false, 0),
        (2, 9, 33, 40, 300, true, 24),
        (1, 1, 1000, 1024, 256, true, 999),
    ] {
        let dims = AttentionDims {
            batch_heads: bh,
            q_len,
            kv_len,
            kv_stride,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            causal,
            q_offset,
        };
        let q = rng.vec(bh * q_len * head_dim, -1.0, 1.0);
        let k = rng.vec(bh * kv_stride * head_dim, -1.0, 1.0);
        let v = rng.vec(bh * kv_stride * head_dim, -1.0, 1.0);
        let out = poisoned(&g, bh * q_len * head_dim);
        g.attention(
            &*g.upload(&q).unwrap(),
            &*g.upload(&k).unwrap(),
            &*g.upload(&v).unwrap(),
            &*out,
            dims,
        )
        .unwrap();
        let err = rel_error(
            &read(&g, &out, bh * q_len * head_dim),
            &reference::attention(&q, &k, &v, dims),
        );
        println!("attention {dims:?}: {err:.2e}");
        assert!(err < 1e-5, "attention {dims:?}: {err}");
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn captured_graph_replays_with_fresh_inputs() {
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    let n = 10_007;
    let (da, db, tmp, out) = (
        g.alloc(n).unwrap(),
        g.alloc(n).unwrap(),
        g.alloc(n).unwrap(),
        g.alloc(n).unwrap(),
    );
    let graph = g
        .capture(|c| {
            c.binary(BinaryOp::Mul, &*da, &*db, &*tmp, n)?;
            c.unary(UnaryOp::Exp, &*tmp, &*out, n)
        })
        .expect("capture");
    for _ in 0..3 {
        let (a, b) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0));
        g.write(&*da, 0, &a).unwrap();
        g.write(&*db, 0, &b).unwrap();
        g.write(&*out, 0, &vec![f32::NAN; n]).unwrap();
        graph.launch().unwrap();
        let got = read(&g, &out, n);
        let want: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| ((*x * *y) as f64).exp())
            .collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-6, "graph replay: {err}");
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn bad_arguments_are_errors() {
    let g = gpu();
    let a = g.upload(&[1.0; 16]).unwrap();
    let out = g.alloc(16).unwrap();
    assert!(matches!(
        g.unary(UnaryOp::Exp, &*a, &*out, 17),
        Err(ringkernel_core::Error::ShapeMismatch(_))
    ));
    assert!(matches!(
        g.reduce(
            ReduceOp::Sum,
            &*a,
            &*out,
            ReduceDims {
                outer: 1,
                axis: 0,
                inner: 1
            }
        ),
        Err(ringkernel_core::Error::ShapeMismatch(_))
    ));
    let mut host = [0.0f32; 4];
    assert!(g.read(&*a, 14, &mut host).is_err());
    assert!(g.copy(&*a, 0, &*a, 4, 8).is_err(), "overlapping copy");
    let other = gpu();
    let foreign = other.upload(&[1.0; 16]).unwrap();
    assert!(matches!(
        g.unary(UnaryOp::Exp, &*foreign, &*out, 16),
        Err(ringkernel_core::Error::Device(_))
    ));
}

/// 10,000,000 × 0.1f32 sums to 1,000,000.015: every reduction path (multi-block
/// partials, one block per row, strided columns) and `dot` must stay within 2e-7 of
/// it, where a float running sum per thread drifts by parts per million.
#[test]
#[ignore = "needs CUDA GPU"]
fn long_sums_keep_f32_precision() {
    let g = gpu();
    let n = 10_000_000;
    let x = g.upload(&vec![0.1f32; n]).unwrap();
    let exact = n as f64 * 0.1f32 as f64;
    for (op, (outer, axis, inner), want) in [
        (ReduceOp::Sum, (1, n, 1), exact),
        (ReduceOp::Mean, (2, n / 2, 1), 0.1f32 as f64),
        (ReduceOp::Sum, (400, n / 400, 1), exact / 400.0),
        (ReduceOp::Sum, (1, n / 2, 2), exact / 2.0),
    ] {
        let out = poisoned(&g, outer * inner);
        g.reduce(op, &*x, &*out, ReduceDims { outer, axis, inner })
            .unwrap();
        for v in read(&g, &out, outer * inner) {
            let err = (v as f64 - want).abs() / want;
            assert!(err < 2e-7, "{op:?} {outer}x{axis}x{inner}: {v} vs {want}");
        }
    }
    let ones = g.upload(&vec![1.0f32; n]).unwrap();
    let out = poisoned(&g, 1);
    g.dot(&*x, &*ones, &*out, n).unwrap();
    let v = read(&g, &out, 1)[0] as f64;
    assert!((v - exact).abs() / exact < 2e-7, "dot: {v} vs {exact}");
}

/// A recorded program: the decode ops become one launch and replay with fresh inputs; an
/// op without an instruction makes `record_program` decline (and `record` a graph); a
/// failed check inside the recording is the op's error, not a fallback.
#[test]
#[ignore = "needs CUDA GPU"]
fn recorded_program_runs_the_decode_ops_in_one_launch() {
    use ringkernel_core::compute::{dtype, quant, QMatmulDims, WeightFormat};
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    let (rows, cols) = (1000, 96);
    let wv = rng.vec(rows * cols, -1.0, 1.0);
    let w = quant::quantize(WeightFormat::Q4_1, &wv).unwrap();
    let wb = g.upload(dtype::words_as_f32(&w)).unwrap();
    let norm = g.upload(&rng.vec(cols, 0.5, 1.5)).unwrap();
    let (x, xn, y, z) = (
        g.alloc(cols).unwrap(),
        g.alloc(cols).unwrap(),
        g.alloc(rows).unwrap(),
        g.alloc(rows).unwrap(),
    );
    let d = QMatmulDims {
        batch: 1,
        rows,
        cols,
        accumulate: false,
    };
    let mut ops = || -> ringkernel_core::Result<()> {
        g.rms_norm_qmatmul(&*x, &*norm, 1e-5, &*xn, &[&*wb], WeightFormat::Q4_1, &*y, d)?;
        // y's first `cols` values as the next input: a second instruction that reads
        // what the first wrote (across the grid barrier)
        g.qmatmul(
            &*wb,
            WeightFormat::Q4_1,
            &*y,
            &*z,
            QMatmulDims {
                accumulate: true,
                ..d
            },
        )
    };
    let program = g
        .record_program(&mut ops)
        .expect("records")
        .expect("every op has an instruction");
    assert_eq!(program.len(), 2);
    for _ in 0..3 {
        let xv = rng.vec(cols, -1.0, 1.0);
        let z0 = rng.vec(rows, -1.0, 1.0);
        g.write(&*x, 0, &xv).unwrap();
        g.write(&*y, 0, &vec![f32::NAN; rows]).unwrap();
        g.write(&*z, 0, &z0).unwrap();
        program.launch().unwrap();
        let (got_y, got_z) = (read(&g, &y, rows), read(&g, &z, rows));
        // the same two ops one by one
        g.write(&*z, 0, &z0).unwrap();
        ops().unwrap();
        let (want_y, want_z) = (read(&g, &y, rows), read(&g, &z, rows));
        let to64 = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
        assert!(
            rel_error(&got_y, &to64(&want_y)) < 1e-6,
            "first instruction"
        );
        assert!(
            rel_error(&got_z, &to64(&want_z)) < 1e-6,
            "second instruction"
        );
        // and against the f64 reference of the first
        let xn_ref = reference::rms_norm(&xv, &read(&g, &norm, cols), 1, cols, 1e-5);
        let r = reference::qmatmul(WeightFormat::Q4_1, &w, &xn_ref, &[], d);
        assert!(rel_error(&got_y, &r) < 1e-5, "vs f64");
    }
    // an op without an instruction: no program, and `record` gives a graph
    let mut mixed = || -> ringkernel_core::Result<()> {
        g.qmatmul(&*wb, WeightFormat::Q4_1, &*x, &*y, d)?;
        g.unary(UnaryOp::Exp, &*y, &*z, rows)
    };
    assert!(g.record_program(&mut mixed).expect("declines").is_none());
    let replay = g.record(&mut mixed).unwrap().expect("a graph");
    assert_eq!(replay.describe(), "CUDA graph");
    // a failed check is the op's error
    let mut bad = || -> ringkernel_core::Result<()> {
        g.qmatmul(
            &*wb,
            WeightFormat::Q4_1,
            &*x,
            &*y,
            QMatmulDims {
                rows: rows + 1,
                ..d
            },
        )
    };
    assert!(g.record_program(&mut bad).is_err());
    // after all that, plain ops run again (no recording left behind)
    g.unary(UnaryOp::Exp, &*x, &*xn, cols).unwrap();
    g.synchronize().unwrap();
}

/// Attention over a long cache inside a recorded program: the keys are split over several
/// blocks per head whose partial results are merged (rk_program's split attention), and
/// the output and both caches match the one-block-per-head kernel run directly.
#[test]
#[ignore = "needs CUDA GPU"]
fn recorded_attention_over_a_long_cache_matches_the_direct_kernel() {
    use ringkernel_core::compute::{checks, dtype, KvDims};
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    let d = KvDims {
        tokens: 1,
        heads: 3,
        kv_heads: 1,
        head_dim: 64,
        capacity: 3000,
        rope_base: 10000.0,
        scale: 0.125,
    };
    let s = checks::kv_sizes(&d).unwrap();
    let (kv0, vv0) = (rng.vec(s.cache, -1.0, 1.0), rng.vec(s.cache, -1.0, 1.0));
    let set = || {
        (
            g.alloc(s.qkv).unwrap(),
            g.alloc(1).unwrap(),
            g.alloc(s.q).unwrap(),
            g.upload(&kv0).unwrap(),
            g.upload(&vv0).unwrap(),
            g.alloc(s.q).unwrap(),
        )
    };
    let (a, b) = (set(), set());
    let program = g
        .record_program(&mut || g.rope_attention_kv(&*a.0, &*a.1, &*a.2, &*a.3, &*a.4, &*a.5, d))
        .unwrap()
        .expect("one instruction");
    for at in [2999u32, 2048, 1500, 700, 10] {
        let qkv = rng.vec(s.qkv, -1.0, 1.0);
        for x in [&a, &b] {
            g.write(&*x.0, 0, &qkv).unwrap();
            g.write(&*x.1, 0, dtype::words_as_f32(&[at])).unwrap();
            g.write(&*x.5, 0, &vec![f32::NAN; s.q]).unwrap();
        }
        program.launch().unwrap();
        g.rope_attention_kv(&*b.0, &*b.1, &*b.2, &*b.3, &*b.4, &*b.5, d)
            .unwrap();
        for (got, want, n, what) in [
            (&a.5, &b.5, s.q, "output"),
            (&a.3, &b.3, s.cache, "keys"),
            (&a.4, &b.4, s.cache, "values"),
        ] {
            let want: Vec<f64> = read(&g, want, n).iter().map(|&v| v as f64).collect();
            let e = rel_error(&read(&g, got, n), &want);
            assert!(e < 1e-5, "position {at}: {what} off by {e:.2e}");
        }
    }
}

/// Early loads (`rk_pdl_wait` in `kernels/ops.cu`): a matvec whose weights the kernel two
/// ahead of it wrote loads them before its wait and must see those writes; one whose
/// weights, or the output it adds to, the kernel just ahead wrote must wait first. Each
/// layout runs op by op and replayed from a graph, with fresh ids and residuals every
/// round, and a long kernel in between where the layout has one, so that the matvec is
/// scheduled while that kernel still runs.
#[test]
#[ignore = "needs CUDA GPU"]
fn early_loads_see_every_write_but_the_kernel_ahead() {
    use ringkernel_core::compute::{dtype, quant, EmbeddingDims, QMatmulDims, WeightFormat};
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    let (vocab, cols, count) = (64, 128, 40);
    let table_words =
        quant::quantize(WeightFormat::F32, &rng.vec(vocab * cols, -1.0, 1.0)).unwrap();
    let table = g.upload(dtype::words_as_f32(&table_words)).unwrap();
    let ids = g.alloc(count).unwrap();
    // The embedding's output is the matvec's weights (f32 blocks are plain floats).
    let w = poisoned(&g, count * cols);
    let xv = rng.vec(cols, -1.0, 1.0);
    let x = g.upload(&xv).unwrap();
    let y = g.alloc(count).unwrap();
    // The long kernel: a tall matvec (8,192 rows).
    let (big_rows, big_cols) = (8192, 1024);
    let big = g.upload(&rng.vec(big_rows * big_cols, -1.0, 1.0)).unwrap();
    let bx = g.upload(&rng.vec(big_cols, -1.0, 1.0)).unwrap();
    let bz = g.alloc(big_rows).unwrap();
    // A matvec that writes y itself (the residual the last one adds to).
    let m_words = quant::quantize(WeightFormat::F32, &rng.vec(count * cols, -1.0, 1.0)).unwrap();
    let m = g.upload(dtype::words_as_f32(&m_words)).unwrap();
    let x2v = rng.vec(cols, -1.0, 1.0);
    let x2 = g.upload(&x2v).unwrap();
    let emb = EmbeddingDims {
        rows: vocab,
        cols,
        count,
    };
    let mv = QMatmulDims {
        batch: 1,
        rows: count,
        cols,
        accumulate: true,
    };
    let f32w = WeightFormat::F32;
    for layout in 0..3 {
        let mut ops = || -> ringkernel_core::Result<()> {
            g.embedding(&*table, f32w, &*ids, &*w, emb)?;
            match layout {
                // weights written two kernels ahead: loaded early
                0 => g.qmatmul(
                    &*big,
                    f32w,
                    &*bx,
                    &*bz,
                    QMatmulDims {
                        batch: 1,
                        rows: big_rows,
                        cols: big_cols,
                        accumulate: false,
                    },
                )?,
                // weights written by the kernel ahead: not loaded early
                1 => {}
                // the residual written by the kernel ahead (the weights two ahead)
                _ => g.qmatmul(
                    &*m,
                    f32w,
                    &*x2,
                    &*y,
                    QMatmulDims {
                        accumulate: false,
                        ..mv
                    },
                )?,
            }
            g.qmatmul(&*w, f32w, &*x, &*y, mv)
        };
        let replay = g.record(&mut ops).unwrap().expect("a graph");
        for round in 0..40 {
            let idv: Vec<u32> = (0..count).map(|_| rng.below(vocab as u64) as u32).collect();
            let y0 = rng.vec(count, -1.0, 1.0);
            g.write(&*ids, 0, dtype::words_as_f32(&idv)).unwrap();
            g.write(&*y, 0, &y0).unwrap();
            if round % 2 == 0 {
                ops().unwrap();
            } else {
                replay.replay().unwrap();
            }
            let wr = reference::embedding(f32w, &table_words, &idv, emb);
            let w_words: Vec<u32> = wr.iter().map(|&v| (v as f32).to_bits()).collect();
            let init = if layout == 2 {
                let r = reference::qmatmul(
                    f32w,
                    &m_words,
                    &x2v,
                    &[],
                    QMatmulDims {
                        accumulate: false,
                        ..mv
                    },
                );
                r.iter().map(|&v| v as f32).collect()
            } else {
                y0
            };
            let want = reference::qmatmul(f32w, &w_words, &xv, &init, mv);
            let got = read(&g, &y, count);
            let e = rel_error(&got, &want);
            assert!(e < 1e-5, "layout {layout} round {round}: error {e}");
        }
    }
}

/// A stack of decoder layers for one token (`decoder_layers`: three kernels a layer, the
/// output and down projections added by reductions, the feed-forward kernel going on with
/// the next layer's norm and QKV projection) against the same layers as their five ops
/// one by one (`decoder::run_ops`), step after step at growing positions, run directly
/// and replayed from a CUDA graph: the residual stream and every cache agree. Awkward
/// sizes: a residual wider than the attention, a hidden width of 7 blocks, a residual
/// wider than a block's preloaded rows (800 > 3 · 256); 3, 1 and 2 layers (the last
/// with more QKV rows than hidden values: not chained).
#[test]
#[ignore = "needs CUDA GPU"]
fn decoder_layers_fused_match_their_ops_one_by_one() {
    use ringkernel_core::compute::{
        decoder, dtype, quant, BlockWeights, BufferRef, DecoderDims, DecoderLayer,
        DecoderScratchBuffers, KvDims, WeightFormat,
    };
    let g = gpu();
    let mut rng = SplitMix64::from_entropy();
    for (dim, hidden, heads, kv_heads, head_dim, format, n_layers) in [
        (160, 224, 4, 2, 16, WeightFormat::Q4_1, 3),
        (800, 96, 2, 1, 32, WeightFormat::Q8_0, 1),
        (96, 64, 3, 3, 32, WeightFormat::F32, 2),
    ] {
        let cap = 8;
        let kv = KvDims {
            tokens: 1,
            heads,
            kv_heads,
            head_dim,
            capacity: cap,
            rope_base: 10000.0,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let d = DecoderDims {
            kv,
            dim,
            hidden,
            eps: 1e-5,
        };
        let att = heads * head_dim;
        let n = kv_heads * cap * head_dim;
        let mut matrix = |rows: usize, cols: usize| -> BufferRef {
            let v = rng.vec(rows * cols, -0.5, 0.5);
            let words = quant::quantize(format, &v).unwrap();
            g.upload(dtype::words_as_f32(&words)).unwrap()
        };
        // Per layer: qkv, wo, gate, up, down; then the norms; then the caches of both
        // sides (zeros: the rows after the position are compared too, both unwritten).
        let weights: Vec<[BufferRef; 5]> = (0..n_layers)
            .map(|_| {
                [
                    matrix((heads + 2 * kv_heads) * head_dim, dim),
                    matrix(dim, att),
                    matrix(hidden, dim),
                    matrix(hidden, dim),
                    matrix(dim, hidden),
                ]
            })
            .collect();
        let norms: Vec<[BufferRef; 2]> = (0..n_layers)
            .map(|_| [0, 1].map(|_| g.upload(&rng.vec(dim, 0.5, 1.5)).unwrap()))
            .collect();
        let caches: Vec<[BufferRef; 4]> = (0..n_layers)
            .map(|_| [0, 1, 2, 3].map(|_| g.upload(&vec![0.0; n]).unwrap()))
            .collect();
        let x0 = rng.vec(dim, -1.0, 1.0);
        let (xa, xb) = (g.upload(&x0).unwrap(), g.upload(&x0).unwrap());
        let scratch = DecoderScratchBuffers::new(&g, 1, &d).unwrap();
        let s = scratch.view();
        let pos = g.alloc(1).unwrap();
        let layer = |l: usize, side: usize| {
            let w = &weights[l];
            let bw = |i: usize| BlockWeights {
                buffer: &*w[i],
                format,
            };
            DecoderLayer {
                attn_norm: &*norms[l][0],
                qkv: bw(0),
                wo: bw(1),
                ffn_norm: &*norms[l][1],
                gate: bw(2),
                up: &*w[3],
                down: bw(4),
                k_cache: &*caches[l][2 * side],
                v_cache: &*caches[l][2 * side + 1],
            }
        };
        let la: Vec<DecoderLayer> = (0..n_layers).map(|l| layer(l, 0)).collect();
        let lb: Vec<DecoderLayer> = (0..n_layers).map(|l| layer(l, 1)).collect();
        let graph = g
            .capture(|c| c.decoder_layers(&*xa, &*pos, &la, &s, d))
            .expect("the fused layers record");
        for p in 0..6u32 {
            g.write(&*pos, 0, dtype::words_as_f32(&[p])).unwrap();
            if p < 3 {
                g.decoder_layers(&*xa, &*pos, &la, &s, d).unwrap();
            } else {
                graph.launch().unwrap();
            }
            for l in &lb {
                decoder::run_ops(&g, &*xb, &*pos, l, &s, d).unwrap();
            }
            let mut pairs = vec![("x".to_string(), &xa, &xb, dim)];
            for (l, c) in caches.iter().enumerate() {
                pairs.push((format!("layer {l} k cache"), &c[0], &c[2], n));
                pairs.push((format!("layer {l} v cache"), &c[1], &c[3], n));
            }
            for (what, fa, fb, len) in pairs {
                let want: Vec<f64> = read(&g, fb, len).iter().map(|&v| v as f64).collect();
                let err = rel_error(&read(&g, fa, len), &want);
                assert!(
                    err < 1e-5,
                    "{format:?} dim {dim}, {n_layers} layers, step {p}: {what} differs by {err:.2e}"
                );
            }
        }
    }
}
