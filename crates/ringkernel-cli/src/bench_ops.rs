//! `ringkernel bench ops`: GFLOP/s or GB/s of the compute ops on one device.
//!
//! Each op runs on buffers allocated once up front (nothing is allocated or uploaded
//! inside the timed loop), once as a warm-up and then `--repeats` times; the table shows
//! the median. Bytes are counted as the fewest the op must move (12 B/element for a
//! binary op, 8 for a unary op or a row op, 4 for a reduction), FLOPs as `2·m·n·k` for
//! matrix products, so the figures compare with `numpy_peer.py`.

use ringkernel::compute::{
    AttentionDims, BinaryOp, BufferRef, Device, MatmulDims, ReduceDims, ReduceOp, RopeDims, UnaryOp,
};
use ringkernel::core::util::SplitMix64;
use ringkernel::{BackendKind, Error, Result};
use std::time::Instant;

/// Arguments of `ringkernel bench ops`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchOpsArgs {
    /// Device: auto, cpu, cuda, wgpu or metal.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Element counts for the elementwise, reduction and row ops.
    #[arg(long, num_args = 1.., default_values_t = [1usize << 20, 16 << 20])]
    pub sizes: Vec<usize>,
    /// Row length of softmax, RMSNorm and LayerNorm.
    #[arg(long, default_value_t = 4096)]
    pub cols: usize,
    /// Square matrix sizes for matmul.
    #[arg(long, num_args = 0.., default_values_t = [256usize, 1024, 2048])]
    pub matmul: Vec<usize>,
    /// CPU threads (default: all cores); ignored on GPUs.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Timed repeats per op and size (the median is shown).
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// Only ops whose name contains one of these (e.g. `--ops matmul exp`).
    #[arg(long, num_args = 1..)]
    pub ops: Vec<String>,
}

/// One measured row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Op name.
    pub op: String,
    /// Size, in words.
    pub size: String,
    /// Median seconds.
    pub secs: f64,
    /// Throughput in `unit`.
    pub value: f64,
    /// `GB/s` or `GFLOP/s`.
    pub unit: &'static str,
}

enum Work {
    Bytes(f64),
    Flops(f64),
}

/// Runs the benchmark and prints the table.
pub fn run(args: &BenchOpsArgs) -> Result<()> {
    let (device, rows) = measure(args)?;
    println!(
        "ringkernel bench ops on {device} (median of {} after a warm-up)",
        args.repeats
    );
    println!(
        "{:<16} {:<26} {:>11} {:>14}",
        "op", "size", "time", "throughput"
    );
    for r in rows {
        println!(
            "{:<16} {:<26} {:>8.3} ms {:>9.2} {}",
            r.op,
            r.size,
            r.secs * 1e3,
            r.value,
            r.unit
        );
    }
    Ok(())
}

fn open_device(args: &BenchOpsArgs) -> Result<Device> {
    match (args.threads, BackendKind::parse(&args.device)) {
        (Some(t), Some(BackendKind::Cpu)) => Device::cpu_with_threads(t),
        _ => Device::from_name(&args.device),
    }
}

/// Measures every selected op; returns the device and the rows (for tests and for
/// callers that format their own table).
pub fn measure(args: &BenchOpsArgs) -> Result<(Device, Vec<Row>)> {
    if args.repeats == 0 {
        return Err(Error::invalid("--repeats must be at least 1"));
    }
    if args.cols == 0 {
        return Err(Error::invalid("--cols must be at least 1"));
    }
    let dev = open_device(args)?;
    let b = dev.backend().clone();
    let mut rng = SplitMix64::new(7);
    let mut rows = Vec::new();
    let wanted = |op: &str| args.ops.is_empty() || args.ops.iter().any(|w| op.contains(w.as_str()));
    let upload = |rng: &mut SplitMix64, n: usize, lo: f32, hi: f32| -> Result<BufferRef> {
        b.upload(&rng.vec(n, lo, hi))
    };

    let mut time =
        |op: &str, size: String, work: Work, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            if !wanted(op) {
                return Ok(());
            }
            f()?;
            dev.synchronize()?;
            let mut ts = Vec::with_capacity(args.repeats);
            for _ in 0..args.repeats {
                let t0 = Instant::now();
                f()?;
                dev.synchronize()?;
                ts.push(t0.elapsed().as_secs_f64());
            }
            ts.sort_by(f64::total_cmp);
            let secs = ts[ts.len() / 2].max(1e-12);
            let (value, unit) = match work {
                Work::Bytes(x) => (x / secs / 1e9, "GB/s"),
                Work::Flops(x) => (x / secs / 1e9, "GFLOP/s"),
            };
            rows.push(Row {
                op: op.to_string(),
                size,
                secs,
                value,
                unit,
            });
            Ok(())
        };

    for &n in &args.sizes {
        if n == 0 {
            return Err(Error::invalid("--sizes must be positive"));
        }
        let x = upload(&mut rng, n, -3.0, 3.0)?;
        let y = upload(&mut rng, n, -3.0, 3.0)?;
        let out = b.alloc(n)?;
        let (x, y, out) = (&*x, &*y, &*out);
        let s = format!("{n}");
        let nf = n as f64;
        time("add", s.clone(), Work::Bytes(12.0 * nf), &mut || {
            b.binary(BinaryOp::Add, x, y, out, n)
        })?;
        time("mul_scalar", s.clone(), Work::Bytes(8.0 * nf), &mut || {
            b.binary_scalar(BinaryOp::Mul, x, 1.5, out, n)
        })?;
        time("exp", s.clone(), Work::Bytes(8.0 * nf), &mut || {
            b.unary(UnaryOp::Exp, x, out, n)
        })?;
        time("silu", s.clone(), Work::Bytes(8.0 * nf), &mut || {
            b.unary(UnaryOp::Silu, x, out, n)
        })?;
        time("swiglu", s.clone(), Work::Bytes(12.0 * nf), &mut || {
            b.swiglu(x, y, out, n)
        })?;
        time("sum", s.clone(), Work::Bytes(4.0 * nf), &mut || {
            b.reduce(
                ReduceOp::Sum,
                x,
                out,
                ReduceDims {
                    outer: 1,
                    axis: n,
                    inner: 1,
                },
            )
        })?;
        time("dot", s.clone(), Work::Bytes(8.0 * nf), &mut || {
            b.dot(x, y, out, n)
        })?;
        let cols = args.cols.min(n);
        let rows_n = n / cols;
        let rs = format!("{rows_n}x{cols}");
        let rf = (rows_n * cols) as f64;
        let w = upload(&mut rng, cols, 0.5, 1.5)?;
        let bias = upload(&mut rng, cols, -1.0, 1.0)?;
        let (w, bias) = (&*w, &*bias);
        time("sum_axis0", rs.clone(), Work::Bytes(4.0 * rf), &mut || {
            b.reduce(
                ReduceOp::Sum,
                x,
                out,
                ReduceDims {
                    outer: 1,
                    axis: rows_n,
                    inner: cols,
                },
            )
        })?;
        time("softmax", rs.clone(), Work::Bytes(8.0 * rf), &mut || {
            b.softmax(x, out, rows_n, cols)
        })?;
        time("rms_norm", rs.clone(), Work::Bytes(8.0 * rf), &mut || {
            b.rms_norm(x, w, out, rows_n, cols, 1e-6)
        })?;
        time("layer_norm", rs.clone(), Work::Bytes(8.0 * rf), &mut || {
            b.layer_norm(x, w, bias, out, rows_n, cols, 1e-6)
        })?;
        // matvec on the largest square that fits
        let side = (n as f64).sqrt() as usize;
        time(
            "matvec",
            format!("{side}x{side}"),
            Work::Flops(2.0 * (side * side) as f64),
            &mut || b.matvec(x, y, out, side, side),
        )?;
        // RoPE over [seq, 32 heads, 128]
        let seq = n / (32 * 128);
        if seq > 0 {
            let pos = b.upload(&(0..seq).map(|i| i as f32).collect::<Vec<_>>())?;
            let dims = RopeDims {
                seq,
                heads: 32,
                head_dim: 128,
                base: 10000.0,
            };
            time(
                "rope",
                format!("{seq}x32x128"),
                Work::Bytes(8.0 * (seq * 32 * 128) as f64),
                &mut || b.rope(x, &*pos, out, dims),
            )?;
        }
        // one decode step of attention: 32 heads of 128 over the K/V that fit in n
        let kv_len = n / (32 * 128);
        if kv_len > 0 {
            let dims = AttentionDims {
                batch_heads: 32,
                q_len: 1,
                kv_len,
                kv_stride: kv_len,
                head_dim: 128,
                scale: 1.0 / (128f32).sqrt(),
                causal: true,
                q_offset: kv_len - 1,
            };
            time(
                "attention",
                format!("decode 32x128, kv {kv_len}"),
                Work::Bytes(8.0 * (32 * 128 * kv_len) as f64),
                &mut || b.attention(x, x, y, out, dims),
            )?;
        }
    }
    for &m in &args.matmul {
        if m == 0 {
            continue;
        }
        let a = upload(&mut rng, m * m, -1.0, 1.0)?;
        let c = upload(&mut rng, m * m, -1.0, 1.0)?;
        let out = b.alloc(m * m)?;
        let dims = MatmulDims {
            batch: 1,
            m,
            k: m,
            n: m,
            b_batched: false,
        };
        time(
            "matmul",
            format!("{m}x{m}x{m}"),
            Work::Flops(2.0 * (m as f64).powi(3)),
            &mut || b.matmul(&*a, &*c, &*out, dims),
        )?;
    }
    Ok((dev, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> BenchOpsArgs {
        BenchOpsArgs {
            device: "cpu".into(),
            sizes: vec![8192],
            cols: 64,
            matmul: vec![16],
            threads: Some(1),
            repeats: 1,
            ops: vec![],
        }
    }

    #[test]
    fn measures_every_op_with_positive_throughput() {
        let (dev, rows) = measure(&small()).unwrap();
        assert_eq!(dev.kind(), BackendKind::Cpu);
        for op in [
            "add",
            "exp",
            "sum",
            "softmax",
            "rms_norm",
            "layer_norm",
            "matvec",
            "rope",
            "attention",
            "matmul",
        ] {
            let r = rows
                .iter()
                .find(|r| r.op == op)
                .unwrap_or_else(|| panic!("no {op}"));
            assert!(r.value > 0.0 && r.value.is_finite(), "{r:?}");
        }
    }

    #[test]
    fn filters_ops_and_rejects_bad_arguments() {
        let (_, rows) = measure(&BenchOpsArgs {
            ops: vec!["matmul".into()],
            ..small()
        })
        .unwrap();
        assert!(rows.iter().all(|r| r.op == "matmul") && rows.len() == 1);
        assert!(measure(&BenchOpsArgs {
            repeats: 0,
            ..small()
        })
        .is_err());
        assert!(measure(&BenchOpsArgs {
            sizes: vec![0],
            ..small()
        })
        .is_err());
        assert!(measure(&BenchOpsArgs {
            device: "tpu".into(),
            ..small()
        })
        .is_err());
    }
}
