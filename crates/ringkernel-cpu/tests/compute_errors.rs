//! Error paths of the CPU backend beyond the shared kit: aliasing, overlapping copies,
//! overflowing dimensions, bad pools, and crossed concurrent ops (no deadlock).

use ringkernel_core::compute::{
    testkit, AttentionDims, BinaryOp, ComputeBackend, MatmulDims, ReduceDims, ReduceOp, RopeDims,
    UnaryOp,
};
use ringkernel_core::Error;
use ringkernel_cpu::CpuCompute;
use std::sync::Arc;

#[test]
fn shared_error_checks() {
    let cpu = CpuCompute::new();
    let r = testkit::check_errors(&cpu, &testkit::Tolerances::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.checks.len() > 40);
}

#[test]
fn output_aliasing_an_input_is_refused() {
    let cpu = CpuCompute::new();
    let x = cpu.upload(&[1.0; 8]).unwrap();
    let y = cpu.upload(&[2.0; 8]).unwrap();
    assert!(matches!(
        cpu.unary(UnaryOp::Exp, &*x, &*x, 8),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        cpu.binary(BinaryOp::Add, &*x, &*y, &*y, 8),
        Err(Error::InvalidArgument(_))
    ));
    // the same buffer twice as an input is fine
    let z = cpu.alloc(8).unwrap();
    cpu.binary(BinaryOp::Mul, &*y, &*y, &*z, 8).unwrap();
    let mut out = [0.0; 8];
    cpu.read(&*z, 0, &mut out).unwrap();
    assert_eq!(out, [4.0; 8]);
    // and nothing was corrupted by the refused calls
    cpu.read(&*x, 0, &mut out).unwrap();
    assert_eq!(out, [1.0; 8]);
}

#[test]
fn overlapping_copy_within_a_buffer_is_refused() {
    let cpu = CpuCompute::new();
    let x = cpu.upload(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    assert!(matches!(
        cpu.copy(&*x, 0, &*x, 2, 3),
        Err(Error::InvalidArgument(_))
    ));
    cpu.copy(&*x, 0, &*x, 3, 3).unwrap();
    let mut out = [0.0; 6];
    cpu.read(&*x, 0, &mut out).unwrap();
    assert_eq!(out, [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
}

#[test]
fn overflowing_and_invalid_dims_are_errors() {
    let cpu = CpuCompute::new();
    let x = cpu.upload(&[1.0; 16]).unwrap();
    let huge = MatmulDims {
        batch: usize::MAX / 2,
        m: 4,
        k: 4,
        n: 4,
        b_batched: true,
    };
    assert!(matches!(
        cpu.matmul(&*x, &*x, &*x.clone(), huge),
        Err(Error::ShapeMismatch(_)) | Err(Error::InvalidArgument(_))
    ));
    let y = cpu.alloc(16).unwrap();
    assert!(matches!(
        cpu.matmul(&*x, &*x, &*y, huge),
        Err(Error::ShapeMismatch(_))
    ));
    assert!(matches!(
        cpu.matvec(&*x, &*x, &*y, usize::MAX, 2),
        Err(Error::ShapeMismatch(_))
    ));
    let odd = RopeDims {
        seq: 1,
        heads: 1,
        head_dim: 3,
        base: 10000.0,
    };
    assert!(matches!(
        cpu.rope(&*x, &*x, &*y, odd),
        Err(Error::ShapeMismatch(_))
    ));
    let ad = AttentionDims {
        batch_heads: 1,
        q_len: 1,
        kv_len: 3,
        kv_stride: 2,
        head_dim: 2,
        scale: 1.0,
        causal: false,
        q_offset: 0,
    };
    assert!(matches!(
        cpu.attention(&*x, &*x, &*x, &*y, ad),
        Err(Error::ShapeMismatch(_))
    ));
    assert!(matches!(
        cpu.read(&*x, usize::MAX, &mut [0.0; 2]),
        Err(Error::ShapeMismatch(_))
    ));
    assert!(matches!(
        CpuCompute::with_threads(0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(cpu.alloc(usize::MAX / 2), Err(Error::Device(_))));
}

/// Dimensions whose products overflow `usize` are `ShapeMismatch` for every op that
/// multiplies dimensions (checked in `ringkernel_core::compute::checks`, never wrapped).
#[test]
fn every_overflowing_product_is_a_shape_error() {
    let cpu = CpuCompute::new();
    let b = cpu.upload(&[1.0; 16]).unwrap();
    let (x, o) = (&*b, &*cpu.alloc(16).unwrap());
    let h = usize::MAX / 2 + 1;
    let ad = AttentionDims {
        batch_heads: h,
        q_len: 2,
        kv_len: 2,
        kv_stride: 2,
        head_dim: 2,
        scale: 1.0,
        causal: false,
        q_offset: 0,
    };
    let rd = ReduceDims {
        outer: 2,
        axis: h,
        inner: 1,
    };
    let results = [
        cpu.reduce(ReduceOp::Sum, x, o, rd),
        cpu.reduce(ReduceOp::Max, x, o, ReduceDims { inner: 2, ..rd }),
        cpu.softmax(x, o, h, 2),
        cpu.rms_norm(x, x, o, 2, h, 1e-5),
        cpu.layer_norm(x, x, x, o, h, 4, 1e-5),
        cpu.attention_scores(x, x, o, ad),
        cpu.attention_weighted_sum(x, x, o, ad),
        cpu.attention(x, x, x, o, ad),
        cpu.rope(
            x,
            x,
            o,
            RopeDims {
                seq: 2,
                heads: h,
                head_dim: 2,
                base: 1e4,
            },
        ),
        cpu.matmul(
            x,
            x,
            o,
            MatmulDims {
                batch: 1 << 16,
                m: 1 << 16,
                k: 1 << 16,
                n: 1 << 16,
                b_batched: false,
            },
        ),
    ];
    for (i, r) in results.into_iter().enumerate() {
        assert!(matches!(r, Err(Error::ShapeMismatch(_))), "case {i}: {r:?}");
    }
}

/// The sum of 10,000,000 × 0.1f32 is 1,000,000.015; an f32 running sum gives 1,000,016.
#[test]
fn long_sums_keep_f32_precision() {
    let cpu = CpuCompute::new();
    let n = 10_000_000;
    let x = cpu.upload(&vec![0.1f32; n]).unwrap();
    let out = cpu.alloc(2).unwrap();
    let exact = n as f64 * 0.1f32 as f64;
    for (op, dims, want) in [
        (ReduceOp::Sum, (1, n, 1), exact),
        (ReduceOp::Sum, (1, n / 2, 2), exact / 2.0),
        (ReduceOp::Mean, (2, n / 2, 1), 0.1f32 as f64),
    ] {
        let (outer, axis, inner) = dims;
        cpu.reduce(op, &*x, &*out, ReduceDims { outer, axis, inner })
            .unwrap();
        let mut got = [0.0f32; 2];
        cpu.read(&*out, 0, &mut got[..outer * inner]).unwrap();
        for g in &got[..outer * inner] {
            let err = (*g as f64 - want).abs() / want;
            assert!(err < 1e-7, "{op:?} {dims:?}: {g} vs {want}");
        }
    }
    let one = CpuCompute::with_threads(1).unwrap();
    let x1 = one.upload(&vec![0.1f32; n]).unwrap();
    let o1 = one.alloc(1).unwrap();
    one.reduce(
        ReduceOp::Sum,
        &*x1,
        &*o1,
        ReduceDims {
            outer: 1,
            axis: n,
            inner: 1,
        },
    )
    .unwrap();
    let mut got = [0.0f32];
    one.read(&*o1, 0, &mut got).unwrap();
    assert!((got[0] as f64 - exact).abs() < 0.1, "{}", got[0]);
}

#[test]
fn crossed_concurrent_ops_do_not_deadlock() {
    let cpu = Arc::new(CpuCompute::with_threads(2).unwrap());
    let a = cpu.upload(&vec![1.0; 70_000]).unwrap();
    let b = cpu.upload(&vec![1.0; 70_000]).unwrap();
    let threads: Vec<_> = [(a.clone(), b.clone()), (b, a)]
        .into_iter()
        .map(|(src, dst)| {
            let cpu = cpu.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    cpu.binary_scalar(BinaryOp::Mul, &*src, 1.0, &*dst, 70_000)
                        .unwrap();
                    cpu.copy(&*src, 0, &*dst, 0, 100).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
