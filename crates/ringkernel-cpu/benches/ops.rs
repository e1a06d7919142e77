//! Criterion benches of the CPU compute ops, on one thread and on all threads.
//!
//! The sizes match `numpy_peer.py` (16M elements; rows of 4096; 1024² and 2048²
//! matmul) so the figures compare directly; bytes are counted as the fewest each op
//! must move (12 B/element for add, 8 for the others), FLOPs as 2·n³ for matmul.
//!
//! `cargo bench -p ringkernel-cpu --bench ops` (add a filter such as `matmul` or
//! `t1/` to run part of it).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ringkernel_core::compute::{BinaryOp, ComputeBackend, MatmulDims, UnaryOp};
use ringkernel_core::util::SplitMix64;
use ringkernel_cpu::CpuCompute;
use std::time::Duration;

const ELEMS: usize = 16 * 1024 * 1024;
const COLS: usize = 4096;

fn backends() -> Vec<(String, CpuCompute)> {
    let all = CpuCompute::new();
    let mut v = vec![(
        "t1".to_string(),
        CpuCompute::with_threads(1).expect("one-thread pool"),
    )];
    if all.threads() > 1 {
        v.push((format!("t{}", all.threads()), all));
    }
    v
}

fn ops(c: &mut Criterion) {
    let mut rng = SplitMix64::new(1);
    let a = rng.vec(ELEMS, -3.0, 3.0);
    let b = rng.vec(ELEMS, -3.0, 3.0);
    let w = rng.vec(COLS, 0.5, 1.5);
    for (tag, cpu) in backends() {
        let (ab, bb, ob) = (
            cpu.upload(&a).unwrap(),
            cpu.upload(&b).unwrap(),
            cpu.alloc(ELEMS).unwrap(),
        );
        let wb = cpu.upload(&w).unwrap();
        let mut g = c.benchmark_group(format!("{tag}/elementwise-16M"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        g.throughput(Throughput::BytesDecimal(12 * ELEMS as u64));
        g.bench_function("add", |bn| {
            bn.iter(|| cpu.binary(BinaryOp::Add, &*ab, &*bb, &*ob, ELEMS).unwrap())
        });
        g.throughput(Throughput::BytesDecimal(8 * ELEMS as u64));
        g.bench_function("exp", |bn| {
            bn.iter(|| cpu.unary(UnaryOp::Exp, &*ab, &*ob, ELEMS).unwrap())
        });
        let rows = ELEMS / COLS;
        g.bench_function("softmax-4096", |bn| {
            bn.iter(|| cpu.softmax(&*ab, &*ob, rows, COLS).unwrap())
        });
        g.bench_function("rms_norm-4096", |bn| {
            bn.iter(|| cpu.rms_norm(&*ab, &*wb, &*ob, rows, COLS, 1e-6).unwrap())
        });
        g.finish();

        let mut g = c.benchmark_group(format!("{tag}/matmul"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        for n in [256usize, 1024, 2048] {
            let x = cpu.upload(&rng.vec(n * n, -1.0, 1.0)).unwrap();
            let y = cpu.upload(&rng.vec(n * n, -1.0, 1.0)).unwrap();
            let z = cpu.alloc(n * n).unwrap();
            let dims = MatmulDims {
                batch: 1,
                m: n,
                k: n,
                n,
                b_batched: false,
            };
            g.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
            g.bench_with_input(BenchmarkId::from_parameter(n), &dims, |bn, &dims| {
                bn.iter(|| cpu.matmul(&*x, &*y, &*z, dims).unwrap())
            });
        }
        g.finish();
    }
}

criterion_group!(benches, ops);
criterion_main!(benches);
