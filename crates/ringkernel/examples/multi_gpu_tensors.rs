//! A data-parallel step on two CUDA GPUs with tensors: each GPU multiplies its shard of
//! a batch (the weight gradient of a linear layer, `Gᵢ = Xᵢᵀ·Yᵢ`), then NCCL
//! all-reduces the gradients ([`Collectives`]); checked against the whole batch on the
//! CPU. Then all-gather, broadcast and a GPU-to-GPU send, each checked.
//!
//! ```text
//! cargo run --release -p ringkernel --features cuda --example multi_gpu_tensors
//! ```
//!
//! Prints SKIPPED and succeeds where it cannot run: without the `cuda` feature, with
//! fewer than two GPUs, or without libnccl (see `ringkernel_cuda::nccl` for loading it).

use ringkernel::compute::{reference, Collectives, Device, MatmulDims, Tensor};
use ringkernel::core::util::{rel_error, SplitMix64};
use ringkernel::{Error, Result};
use std::process::ExitCode;

const ROWS: usize = 777;
const K: usize = 64;
const N: usize = 48;

/// `data` (rows × cols, row-major) transposed.
fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = data[r * cols + c];
        }
    }
    t
}

fn check(what: &str, got: &[f32], want: &[f64]) -> Result<()> {
    let e = rel_error(got, want);
    println!("{what}: relative error {e:.2e}");
    if e > 1e-4 {
        return Err(Error::Device(format!("{what}: relative error {e:.2e}")));
    }
    Ok(())
}

fn run() -> Result<()> {
    let gpus = [Device::cuda(0)?, Device::cuda(1)?];
    let nccl = Collectives::new(&gpus)?;
    println!("devices: {} | {}", gpus[0], gpus[1]);
    let mut rng = SplitMix64::new(16);
    let x = rng.vec(ROWS * K, -1.0, 1.0);
    let y = rng.vec(ROWS * N, -1.0, 1.0);
    // GPU 0 takes the first `split` rows, GPU 1 the rest.
    let split = ROWS / 2 + 1;
    let mut grads = Vec::new();
    for (gpu, (lo, hi)) in gpus.iter().zip([(0, split), (split, ROWS)]) {
        let rows = hi - lo;
        let xt = transpose(&x[lo * K..hi * K], rows, K);
        let xt = Tensor::from_slice(gpu, &xt, &[K, rows])?;
        let yi = Tensor::from_slice(gpu, &y[lo * N..hi * N], &[rows, N])?;
        grads.push(xt.matmul(&yi)?);
    }
    let summed = nccl.all_reduce_sum(&grads)?;
    let dims = MatmulDims {
        batch: 1,
        m: K,
        k: ROWS,
        n: N,
        b_batched: false,
    };
    let want = reference::matmul(&transpose(&x, ROWS, K), &y, dims);
    for (r, g) in summed.iter().enumerate() {
        check(
            &format!("data-parallel gradient ({K}x{N}) all-reduced, on GPU {r}"),
            &g.to_vec()?,
            &want,
        )?;
    }

    // all_gather: every GPU gets both shards' first rows of Y, in rank order.
    let parts = [
        Tensor::from_slice(&gpus[0], &y[..N], &[1, N])?,
        Tensor::from_slice(&gpus[1], &y[split * N..(split + 1) * N], &[1, N])?,
    ];
    let gathered = nccl.all_gather(&parts)?;
    let want: Vec<f64> = y[..N]
        .iter()
        .chain(&y[split * N..(split + 1) * N])
        .map(|&v| f64::from(v))
        .collect();
    for (r, g) in gathered.iter().enumerate() {
        assert_eq!(g.shape(), &[2, N]);
        check(&format!("all_gather on GPU {r}"), &g.to_vec()?, &want)?;
    }

    // broadcast from GPU 1, and a send from GPU 0 to GPU 1.
    let copies = nccl.broadcast(1, &parts[1])?;
    check(
        "broadcast from GPU 1, on GPU 0",
        &copies[0].to_vec()?,
        &want[N..],
    )?;
    let moved = nccl.send(&parts[0], 1)?;
    assert_eq!(moved.device(), &gpus[1]);
    check("send GPU 0 -> GPU 1", &moved.to_vec()?, &want[..N])?;
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::BackendUnavailable { reason, .. }) => {
            println!("SKIPPED: {reason}");
            ExitCode::SUCCESS
        }
        Err(Error::InvalidArgument(m)) if m.contains("does not exist") => {
            println!("SKIPPED: {m}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
