//! The CPU ops above the size where they fan out over rayon, against the f64
//! reference, on fresh random inputs of awkward sizes.

use ringkernel_core::compute::{
    reference, AttentionDims, BinaryOp, BufferRef, ComputeBackend, DeviceBuffer, MatmulDims,
    ReduceDims, ReduceOp, RopeDims, UnaryOp,
};
use ringkernel_core::util::{rel_error, SplitMix64};
use ringkernel_cpu::CpuCompute;

fn backends() -> Vec<CpuCompute> {
    vec![CpuCompute::new(), CpuCompute::with_threads(3).unwrap()]
}

/// Runs `op` into a NaN-poisoned output of `len` and returns the output.
fn run(
    cpu: &CpuCompute,
    inputs: &[&[f32]],
    len: usize,
    op: impl FnOnce(&[BufferRef], &dyn DeviceBuffer),
) -> Vec<f32> {
    let bufs: Vec<BufferRef> = inputs.iter().map(|d| cpu.upload(d).unwrap()).collect();
    let out = cpu.upload(&vec![f32::NAN; len]).unwrap();
    op(&bufs, &*out);
    let mut v = vec![0.0; len];
    cpu.read(&*out, 0, &mut v).unwrap();
    assert!(v.iter().all(|x| !x.is_nan()), "unwritten or NaN output");
    v
}

fn assert_close(what: &str, out: &[f32], want: &[f64], tol: f64) {
    let e = rel_error(out, want);
    assert!(e <= tol, "{what}: rel error {e:.3e} > {tol:.0e}");
}

#[test]
fn elementwise_large() {
    let mut rng = SplitMix64::from_entropy();
    let n = 131_075;
    let a = rng.vec(n, -5.0, 5.0);
    let b = rng.vec(n, 0.5, 5.0);
    for cpu in backends() {
        for op in [UnaryOp::Exp, UnaryOp::Gelu, UnaryOp::Neg, UnaryOp::Tanh] {
            let out = run(&cpu, &[&a], n, |i, o| cpu.unary(op, &*i[0], o, n).unwrap());
            assert_close(op.name(), &out, &reference::unary(op, &a), 1e-6);
        }
        for op in BinaryOp::ALL {
            let out = run(&cpu, &[&a, &b], n, |i, o| {
                cpu.binary(op, &*i[0], &*i[1], o, n).unwrap()
            });
            assert_close(op.name(), &out, &reference::binary(op, &a, &b), 1e-6);
            let out = run(&cpu, &[&a], n, |i, o| {
                cpu.binary_scalar(op, &*i[0], 1.5, o, n).unwrap()
            });
            assert_close(
                op.name(),
                &out,
                &reference::binary_scalar(op, &a, 1.5),
                1e-6,
            );
        }
        let out = run(&cpu, &[&a, &b], n, |i, o| {
            cpu.swiglu(&*i[0], &*i[1], o, n).unwrap()
        });
        assert_close("swiglu", &out, &reference::swiglu(&a, &b), 1e-6);
        // only the first `len` elements are touched
        let out = run(&cpu, &[&a], n, |i, o| {
            cpu.write(o, 0, &vec![7.0; n]).unwrap();
            cpu.unary(UnaryOp::Neg, &*i[0], o, n - 5).unwrap()
        });
        assert_eq!(&out[n - 5..], &[7.0; 5]);
    }
}

#[test]
fn reductions_large() {
    let mut rng = SplitMix64::from_entropy();
    let x = rng.vec(300_007, -0.5, 1.5);
    let shapes = [
        (1, 300_007, 1),
        (7, 42_858, 1),
        (3, 7, 14_286),
        (1, 5, 60_001),
        (70_001, 4, 1),
        (2, 3, 50_001),
    ];
    for cpu in backends() {
        for op in ReduceOp::ALL {
            for (outer, axis, inner) in shapes {
                let dims = ReduceDims { outer, axis, inner };
                let xs = &x[..outer * axis * inner];
                let out = run(&cpu, &[xs], outer * inner, |i, o| {
                    cpu.reduce(op, &*i[0], o, dims).unwrap()
                });
                assert_close(
                    &format!("{} {dims:?}", op.name()),
                    &out,
                    &reference::reduce(op, xs, dims),
                    1e-5,
                );
            }
        }
        let b = rng.vec(x.len(), 0.0, 1.0);
        let out = run(&cpu, &[&x, &b], 1, |i, o| {
            cpu.dot(&*i[0], &*i[1], o, x.len()).unwrap()
        });
        assert_close("dot", &out, &reference::dot(&x, &b), 1e-5);
    }
}

#[test]
fn rows_large() {
    let mut rng = SplitMix64::from_entropy();
    let (rows, cols) = (65, 1031);
    let x = rng.vec(rows * cols, -8.0, 8.0);
    let w = rng.vec(cols, 0.5, 1.5);
    let bias = rng.vec(cols, -1.0, 1.0);
    let n = rows * cols;
    for cpu in backends() {
        let out = run(&cpu, &[&x], n, |i, o| {
            cpu.softmax(&*i[0], o, rows, cols).unwrap()
        });
        assert_close("softmax", &out, &reference::softmax(&x, rows, cols), 1e-6);
        let out = run(&cpu, &[&x, &w], n, |i, o| {
            cpu.rms_norm(&*i[0], &*i[1], o, rows, cols, 1e-6).unwrap()
        });
        assert_close(
            "rms_norm",
            &out,
            &reference::rms_norm(&x, &w, rows, cols, 1e-6),
            1e-6,
        );
        let out = run(&cpu, &[&x, &w, &bias], n, |i, o| {
            cpu.layer_norm(&*i[0], &*i[1], &*i[2], o, rows, cols, 1e-6)
                .unwrap()
        });
        assert_close(
            "layer_norm",
            &out,
            &reference::layer_norm(&x, &w, &bias, rows, cols, 1e-6),
            1e-6,
        );
        let (m, k) = (65, 1031);
        let out = run(&cpu, &[&x[..m * k], &w[..k]], m, |i, o| {
            cpu.matvec(&*i[0], &*i[1], o, m, k).unwrap()
        });
        assert_close(
            "matvec",
            &out,
            &reference::matvec(&x[..m * k], &w[..k], m, k),
            1e-5,
        );
    }
}

#[test]
fn matmul_large_and_batched() {
    let mut rng = SplitMix64::from_entropy();
    for cpu in backends() {
        for (batch, m, k, n, b_batched) in [
            (1, 131, 97, 65, false),
            (5, 33, 47, 29, true),
            (3, 70, 64, 90, false),
            (2, 100, 101, 102, true),
        ] {
            let dims = MatmulDims {
                batch,
                m,
                k,
                n,
                b_batched,
            };
            let a = rng.vec(batch * m * k, -1.0, 1.0);
            let b = rng.vec(if b_batched { batch } else { 1 } * k * n, -1.0, 1.0);
            let out = run(&cpu, &[&a, &b], batch * m * n, |i, o| {
                cpu.matmul(&*i[0], &*i[1], o, dims).unwrap()
            });
            assert_close(
                &format!("{dims:?}"),
                &out,
                &reference::matmul(&a, &b, dims),
                1e-5,
            );
        }
        // k = 0: all zeros
        let out = run(&cpu, &[&[1.0], &[1.0]], 6, |i, o| {
            cpu.matmul(
                &*i[0],
                &*i[1],
                o,
                MatmulDims {
                    batch: 1,
                    m: 2,
                    k: 0,
                    n: 3,
                    b_batched: false,
                },
            )
            .unwrap()
        });
        assert_eq!(out, vec![0.0; 6]);
    }
}

#[test]
fn rope_and_attention_large() {
    let mut rng = SplitMix64::from_entropy();
    for cpu in backends() {
        let dims = RopeDims {
            seq: 301,
            heads: 8,
            head_dim: 64,
            base: 10000.0,
        };
        let x = rng.vec(301 * 8 * 64, -1.0, 1.0);
        let pos: Vec<f32> = (0..301).map(|i| (i * 7) as f32).collect();
        let out = run(&cpu, &[&x, &pos], x.len(), |i, o| {
            cpu.rope(&*i[0], &*i[1], o, dims).unwrap()
        });
        assert_close("rope", &out, &reference::rope(&x, &pos, dims), 1e-6);

        let dims = AttentionDims {
            batch_heads: 6,
            q_len: 33,
            kv_len: 301,
            kv_stride: 320,
            head_dim: 32,
            scale: 0.17,
            causal: true,
            q_offset: 268,
        };
        let q = rng.vec(6 * 33 * 32, -1.0, 1.0);
        let k = rng.vec(6 * 320 * 32, -1.0, 1.0);
        let v = rng.vec(6 * 320 * 32, -1.0, 1.0);
        let out = run(&cpu, &[&q, &k, &v], q.len(), |i, o| {
            cpu.attention(&*i[0], &*i[1], &*i[2], o, dims).unwrap()
        });
        assert_close(
            "attention",
            &out,
            &reference::attention(&q, &k, &v, dims),
            1e-5,
        );
        let n_scores = 6 * 33 * 301;
        let scores = run(&cpu, &[&q, &k], n_scores, |i, o| {
            cpu.attention_scores(&*i[0], &*i[1], o, dims).unwrap()
        });
        let want = reference::attention_scores(&q, &k, dims);
        for (s, w) in scores.iter().zip(&want) {
            if *w == f64::NEG_INFINITY {
                assert_eq!(*s, f32::NEG_INFINITY);
            } else {
                assert!((*s as f64 - w).abs() < 1e-5, "{s} vs {w}");
            }
        }
        let p: Vec<f32> = rng.vec(n_scores, 0.0, 1.0);
        let out = run(&cpu, &[&p, &v], q.len(), |i, o| {
            cpu.attention_weighted_sum(&*i[0], &*i[1], o, dims).unwrap()
        });
        assert_close(
            "weighted sum",
            &out,
            &reference::attention_weighted_sum(&p, &v, dims),
            1e-5,
        );
    }
}

/// The benchmark sizes (16M elements, rows of 4096, a 512³ product), in release builds
/// only: `cargo test --release -p ringkernel-cpu --test compute_parallel`.
#[cfg(not(debug_assertions))]
#[test]
fn benchmark_sizes_match_the_reference() {
    let mut rng = SplitMix64::from_entropy();
    let n = 16 << 20;
    let (rows, cols) = (n / 4096, 4096);
    let x = rng.vec(n, -5.0, 5.0);
    let w = rng.vec(cols, 0.5, 1.5);
    for cpu in backends() {
        let out = run(&cpu, &[&x], n, |i, o| {
            cpu.unary(UnaryOp::Exp, &*i[0], o, n).unwrap()
        });
        assert_close("exp 16M", &out, &reference::unary(UnaryOp::Exp, &x), 1e-6);
        let out = run(&cpu, &[&x], n, |i, o| {
            cpu.softmax(&*i[0], o, rows, cols).unwrap()
        });
        assert_close(
            "softmax 4096x4096",
            &out,
            &reference::softmax(&x, rows, cols),
            1e-6,
        );
        let out = run(&cpu, &[&x, &w], n, |i, o| {
            cpu.rms_norm(&*i[0], &*i[1], o, rows, cols, 1e-6).unwrap()
        });
        assert_close(
            "rms_norm 4096x4096",
            &out,
            &reference::rms_norm(&x, &w, rows, cols, 1e-6),
            1e-6,
        );
        let out = run(&cpu, &[&x], 1, |i, o| {
            cpu.reduce(
                ReduceOp::Sum,
                &*i[0],
                o,
                ReduceDims {
                    outer: 1,
                    axis: n,
                    inner: 1,
                },
            )
            .unwrap()
        });
        assert_close(
            "sum 16M",
            &out,
            &reference::reduce(
                ReduceOp::Sum,
                &x,
                ReduceDims {
                    outer: 1,
                    axis: n,
                    inner: 1,
                },
            ),
            1e-4,
        );
        let m = 512;
        let dims = MatmulDims {
            batch: 1,
            m,
            k: m,
            n: m,
            b_batched: false,
        };
        let out = run(&cpu, &[&x[..m * m], &x[m * m..2 * m * m]], m * m, |i, o| {
            cpu.matmul(&*i[0], &*i[1], o, dims).unwrap()
        });
        assert_close(
            "matmul 512",
            &out,
            &reference::matmul(&x[..m * m], &x[m * m..2 * m * m], dims),
            1e-5,
        );
    }
}
