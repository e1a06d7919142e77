//! Two GPUs of one host (prints SKIPPED with fewer, or without libnccl for part 1):
//!
//! ```text
//! cargo run --release -p ringkernel-cuda --example multi_gpu
//! ```
//!
//! 1. A data-parallel step: the rows of a batch are split over the GPUs; each GPU
//!    computes the weight gradient of a linear layer on its shard, `Gᵢ = Xᵢᵀ·Yᵢ`
//!    (cuBLAS), and an NCCL all-reduce sums the shards' gradients on every GPU, queued
//!    on the same stream as the matmul (no synchronisation in between). Checked
//!    against `Xᵀ·Y` of the whole batch on the CPU, in f64.
//! 2. An actor pipeline across the GPUs: `rk.stage` on GPU 0 forwards each token to
//!    `rk.stage` on GPU 1 through that kernel's inbox (K2K over peer access, no host
//!    hop), which replies to the host.

use ringkernel_core::builtin::{Token, STAGE};
use ringkernel_core::compute::{BufferRef, ComputeBackend, DeviceBuffer, MatmulDims};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_core::util::{rel_error, SplitMix64};
use ringkernel_core::{Error, Result};
use ringkernel_cuda::{CudaRuntimeGroup, NcclGroup};
use std::time::{Duration, Instant};

/// Rows of the batch, input and output features (awkward on purpose).
const ROWS: usize = 1001;
const K: usize = 96;
const N: usize = 80;

fn data_parallel_step(group: &NcclGroup) -> Result<()> {
    let ranks = group.len();
    let mut rng = SplitMix64::new(7);
    let x = rng.vec(ROWS * K, -1.0, 1.0); // row-major ROWS × K
    let y = rng.vec(ROWS * N, -1.0, 1.0); // row-major ROWS × N
                                          // Uneven shards: rank r takes rows [start(r), start(r + 1)).
    let start = |r: usize| r * ROWS / ranks;
    let mut grads: Vec<BufferRef> = Vec::with_capacity(ranks);
    for (r, gpu) in group.computes().iter().enumerate() {
        let rows = start(r + 1) - start(r);
        // Xᵢᵀ (K × rows) and Yᵢ (rows × N) of this shard.
        let mut xt = vec![0.0f32; K * rows];
        for i in 0..rows {
            for j in 0..K {
                xt[j * rows + i] = x[(start(r) + i) * K + j];
            }
        }
        let yi = &y[start(r) * N..start(r + 1) * N];
        let (xt, yi) = (gpu.upload(&xt)?, gpu.upload(yi)?);
        let g = gpu.upload(&vec![f32::NAN; K * N])?;
        let dims = MatmulDims {
            batch: 1,
            m: K,
            k: rows,
            n: N,
            b_batched: false,
        };
        gpu.matmul(&*xt, &*yi, &*g, dims)?;
        grads.push(g);
    }
    let refs: Vec<&dyn DeviceBuffer> = grads.iter().map(|b| &**b).collect();
    group.all_reduce_sum_in_place(&refs, K * N)?;
    // The whole batch's gradient on the CPU, in f64.
    let mut want = vec![0.0f64; K * N];
    for row in 0..ROWS {
        for j in 0..K {
            let xv = f64::from(x[row * K + j]);
            for n in 0..N {
                want[j * N + n] += xv * f64::from(y[row * N + n]);
            }
        }
    }
    for (r, gpu) in group.computes().iter().enumerate() {
        let mut got = vec![0.0f32; K * N];
        gpu.read(&*grads[r], 0, &mut got)?;
        let e = rel_error(&got, &want);
        println!(
            "data-parallel step: GPU {} holds the all-reduced gradient ({K}x{N}), relative error {e:.2e} against the CPU",
            gpu.device_info().ordinal
        );
        if e > 1e-4 {
            return Err(Error::Device(format!(
                "rank {r}: the all-reduced gradient is off by {e:.2e}"
            )));
        }
    }
    Ok(())
}

async fn pipeline(group: &CudaRuntimeGroup) -> Result<()> {
    let first = group
        .runtime(0)?
        .launch(STAGE, LaunchOptions::default().with_name("stage-gpu0"))
        .await?;
    let second = group
        .runtime(1)?
        .launch(STAGE, LaunchOptions::default().with_name("stage-gpu1"))
        .await?;
    let route = [first.id(), second.id()];
    let tokens = 2000u64;
    let t0 = Instant::now();
    let mut next = 0u64;
    while next < tokens {
        let end = (next + 250).min(tokens);
        for i in next..end {
            first.send(Token::routed(i, i as f64, &route)?).await?;
        }
        for i in next..end {
            let t: Token = second.receive_timeout_as(Duration::from_secs(10)).await?;
            if (t.id, t.hops, t.value) != (i, 2, i as f64 + 2.0) {
                return Err(Error::Device(format!(
                    "token {i} came back as id {} hops {} value {}",
                    t.id, t.hops, t.value
                )));
            }
        }
        next = end;
    }
    println!(
        "actor pipeline: {tokens} tokens host -> stage on GPU 0 -> (K2K over peer access) -> stage on GPU 1 -> host, in order, in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

fn main() -> Result<()> {
    let gpus = match ringkernel_cuda::device_count() {
        Ok(n) => n,
        Err(e) => {
            println!("SKIPPED: {e}");
            return Ok(());
        }
    };
    if gpus < 2 {
        println!("SKIPPED: {gpus} CUDA GPU(s); this example needs 2");
        return Ok(());
    }
    // NCCL first, and dropped before persistent kernels run (see the nccl module docs).
    match NcclGroup::on_devices(&[0, 1]) {
        Ok(group) => data_parallel_step(&group)?,
        Err(Error::BackendUnavailable { reason, .. }) => {
            println!("SKIPPED the data-parallel step: {reason}")
        }
        Err(e) => return Err(e),
    }
    let exec = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Device(format!("tokio: {e}")))?;
    exec.block_on(async {
        let group = CudaRuntimeGroup::new(KernelRegistry::new(), &[0, 1]).await?;
        pipeline(&group).await?;
        group.shutdown().await.map(|_| ())
    })
}
