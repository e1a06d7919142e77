//! Benchmarks of several GPUs of one host (run on a machine with two or more GPUs,
//! release build, libnccl on the library path; `scripts/multigpu.sh` does all of it and
//! compares with PyTorch):
//!
//! ```text
//! cargo run --release -p ringkernel-cuda --example multi_gpu_bench -- [--quick] [--json out.json]
//! ```
//!
//! 1. NCCL all-reduce (f32 sum, in place) through [`NcclGroup`] on GPUs 0 and 1, at
//!    1 MiB to 1 GiB: time per call and bus bandwidth, `busbw = 2 (n - 1) / n × bytes /
//!    time` (NCCL's definition). The 1 GiB run also checks the sums.
//! 2. K2K between persistent kernels: one-way latency (a ball bounced between two
//!    kernels, timed on the origin's own clock, so no clock is shared between GPUs) and
//!    throughput (128 sender threads flooding one kernel's inbox), for two kernels on
//!    GPU 0 of a plain runtime, on GPU 0 of a [`CudaRuntimeGroup`] (system-scope inbox
//!    atomics) and on GPUs 0 and 1 of that group (peer writes over the GPUs' link).

use ringkernel_core::compute::{ComputeBackend, DeviceBuffer};
use ringkernel_core::message::Envelope;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::{GpuHandler, KernelRegistry};
use ringkernel_core::runtime::{KernelHandle, RingKernelRuntime};
use ringkernel_core::{Error, Result};
use ringkernel_cuda::{CudaRuntime, CudaRuntimeGroup, NcclGroup};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const PINGPONG: &str = "xgpu.pingpong";
const FLOOD_SRC: &str = "xgpu.flood_src";
const FLOOD_SINK: &str = "xgpu.flood_sink";

fn registry() -> KernelRegistry {
    let reg = KernelRegistry::new();
    reg.register_gpu(GpuHandler::new(PINGPONG).with_cuda(include_str!("kernels/pingpong.cu")));
    reg.register_gpu(GpuHandler::new(FLOOD_SRC).with_cuda(include_str!("kernels/flood_src.cu")));
    reg.register_gpu(
        GpuHandler::new(FLOOD_SINK)
            .with_cuda(include_str!("kernels/flood_sink.cu"))
            .with_state_bytes(16),
    );
    reg
}

/// Prints lines and keeps them for the JSON file.
#[derive(Default)]
struct Report {
    json: Vec<String>,
}

impl Report {
    fn line(&mut self, s: String) {
        println!("{s}");
    }
    fn json(&mut self, key: &str, value: String) {
        self.json.push(format!("\"{key}\": {value}"));
    }
    fn write(&self, path: &str) -> Result<()> {
        let text = format!("{{\n  {}\n}}\n", self.json.join(",\n  "));
        std::fs::write(path, text).map_err(|e| Error::Device(format!("writing {path}: {e}")))
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// All-reduce bus bandwidth on every GPU of `group`, in place, at each size.
fn all_reduce(rep: &mut Report, group: &NcclGroup, quick: bool) -> Result<()> {
    let n = group.len();
    let sizes: &[usize] = if quick {
        &[1 << 20, 64 << 20, 1 << 30]
    } else {
        &[1 << 20, 16 << 20, 256 << 20, 1 << 30]
    };
    let mut rows = Vec::new();
    for &bytes in sizes {
        let len = bytes / 4;
        let ones = vec![1.0f32; len];
        let bufs = group
            .computes()
            .iter()
            .map(|c| c.upload(&ones))
            .collect::<Result<Vec<_>>>()?;
        drop(ones);
        let refs: Vec<&dyn DeviceBuffer> = bufs.iter().map(|b| &**b).collect();
        let warm = 5usize;
        let iters = ((4usize << 30) / bytes).clamp(20, 500);
        for _ in 0..warm {
            group.all_reduce_sum_in_place(&refs, len)?;
        }
        group.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            group.all_reduce_sum_in_place(&refs, len)?;
        }
        group.synchronize()?;
        let secs = t0.elapsed().as_secs_f64() / iters as f64;
        // Every element started at 1 and was summed over n ranks each call: n^calls,
        // exact in f32 for n = 2 up to 2^127 (checked where it stays finite).
        let calls = (warm + iters) as i32;
        let want = (n as f64).powi(calls);
        if want < f64::from(f32::MAX) {
            for (r, c) in group.computes().iter().enumerate() {
                let mut probe = [0.0f32; 3];
                for (slot, at) in probe.iter_mut().zip([0, len / 2, len - 1]) {
                    let mut one = [0.0f32];
                    c.read(&*bufs[r], at, &mut one)?;
                    *slot = one[0];
                }
                if probe.iter().any(|&v| f64::from(v) != want) {
                    return Err(Error::Device(format!(
                        "all_reduce of {bytes} bytes: rank {r} holds {probe:?}, expected {want}"
                    )));
                }
            }
        }
        let algbw = bytes as f64 / secs / 1e9;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        rep.line(format!(
            "all_reduce f32 sum, {n} GPUs, {:>5} MiB: {:>9.1} us  algbw {algbw:>6.1} GB/s  busbw {busbw:>6.1} GB/s  ({iters} calls)",
            bytes >> 20,
            secs * 1e6
        ));
        rows.push(format!(
            "{{\"bytes\": {bytes}, \"time_us\": {:.2}, \"algbw_gbs\": {algbw:.2}, \"busbw_gbs\": {busbw:.2}}}",
            secs * 1e6
        ));
    }
    rep.json("all_reduce", format!("[{}]", rows.join(", ")));
    Ok(())
}

async fn receive(k: &KernelHandle, secs: u64) -> Result<Envelope> {
    k.receive_envelope(Some(Duration::from_secs(secs))).await
}

/// One-way K2K latency between `a` and `b`: `runs` balls of `rounds` round trips each,
/// started by `a`; the median of the runs' mean hop time, in µs.
async fn pingpong(a: &KernelHandle, b: &KernelHandle, rounds: u32, runs: usize) -> Result<f64> {
    let mut per_hop = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut start = [0u8; 8];
        start[..4].copy_from_slice(&b.id().0.to_le_bytes());
        start[4..].copy_from_slice(&rounds.to_le_bytes());
        a.send_envelope(Envelope::from_bytes(0x4B01, &start))
            .await?;
        let done = receive(a, 30).await?;
        let word =
            |i: usize| u64::from_le_bytes(done.payload[i * 8..i * 8 + 8].try_into().unwrap());
        if done.payload.len() != 16 || word(0) != 2 * u64::from(rounds) {
            return Err(Error::Device(format!(
                "ping-pong: unexpected reply {:?}",
                done.payload
            )));
        }
        per_hop.push(word(1) as f64 / word(0) as f64 / 1e3);
    }
    Ok(median(&mut per_hop))
}

/// K2K messages per second from `senders` threads of `src` into `sink`'s inbox.
async fn flood(src: &KernelHandle, sink: &KernelHandle, senders: u32, per: u32) -> Result<f64> {
    let total = u64::from(senders) * u64::from(per);
    let before = sink.metrics().processed;
    sink.send_envelope(Envelope::from_bytes(0x4B12, &total.to_le_bytes()))
        .await?;
    // The sink must be armed before the first message can complete the count.
    let armed = Instant::now();
    while sink.metrics().processed == before {
        if armed.elapsed() > Duration::from_secs(10) {
            return Err(Error::Timeout(Duration::from_secs(10)));
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    let mut trig = [0u8; 8];
    trig[..4].copy_from_slice(&sink.id().0.to_le_bytes());
    trig[4..].copy_from_slice(&per.to_le_bytes());
    let t0 = Instant::now();
    for _ in 0..senders {
        src.send_envelope(Envelope::from_bytes(0x4B10, &trig))
            .await?;
    }
    let done = receive(sink, 60).await?;
    let secs = t0.elapsed().as_secs_f64();
    let got = u64::from_le_bytes(done.payload[..8].try_into().unwrap());
    if got != total {
        return Err(Error::Device(format!(
            "flood: sink counted {got} of {total}"
        )));
    }
    for _ in 0..senders {
        receive(src, 10).await?;
    }
    Ok(total as f64 / secs)
}

/// Latency and throughput between a kernel of `ra` and one of `rb`.
async fn k2k_pair(
    rep: &mut Report,
    label: &str,
    ra: &CudaRuntime,
    rb: &CudaRuntime,
    quick: bool,
) -> Result<String> {
    let opts = |name: &str| LaunchOptions::default().with_name(format!("{label}-{name}"));
    let a = ra.launch(PINGPONG, opts("ping")).await?;
    let b = rb.launch(PINGPONG, opts("pong")).await?;
    let (rounds, runs) = if quick { (500, 5) } else { (2000, 15) };
    let lat = pingpong(&a, &b, rounds, runs).await?;
    a.terminate().await?;
    b.terminate().await?;
    let src = ra
        .launch(FLOOD_SRC, opts("src").with_block_size(256))
        .await?;
    let sink = rb
        .launch(
            FLOOD_SINK,
            opts("sink")
                .with_queue_capacity(1 << 14)
                .with_block_size(512),
        )
        .await?;
    let (senders, per) = if quick { (128, 1000) } else { (128, 5000) };
    let rate = flood(&src, &sink, senders, per).await?;
    src.terminate().await?;
    sink.terminate().await?;
    rep.line(format!(
        "K2K {label:<28} one-way latency {lat:>6.2} us   throughput {:>6.2} M msgs/s ({senders} senders)",
        rate / 1e6
    ));
    Ok(format!(
        "{{\"pair\": \"{label}\", \"one_way_us\": {lat:.3}, \"msgs_per_s\": {rate:.0}}}"
    ))
}

async fn k2k(rep: &mut Report, quick: bool) -> Result<()> {
    // Every runtime and every module exists before the first persistent kernel runs.
    let plain = CudaRuntime::on_device(registry(), 0).await?;
    let group = CudaRuntimeGroup::new(registry(), &[0, 1]).await?;
    for h in [PINGPONG, FLOOD_SRC, FLOOD_SINK] {
        plain.preload(h)?;
        group.preload(h)?;
    }
    let link = ringkernel_cuda::peer_link(0, 1)?;
    rep.line(format!("peer link 0 -> 1: {link:?}"));
    let (g0, g1) = (group.runtime(0)?, group.runtime(1)?);
    let rows = [
        k2k_pair(rep, "GPU0 -> GPU0 (one runtime)", &plain, &plain, quick).await?,
        k2k_pair(rep, "GPU0 -> GPU0 (group)", g0, g0, quick).await?,
        k2k_pair(rep, "GPU0 -> GPU1 (group)", g0, g1, quick).await?,
        k2k_pair(rep, "GPU1 -> GPU0 (group)", g1, g0, quick).await?,
    ];
    rep.json("k2k", format!("[{}]", rows.join(", ")));
    plain.shutdown().await?;
    group.shutdown().await?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned());
    let n = match ringkernel_cuda::device_count() {
        Ok(n) => n,
        Err(e) => {
            println!("SKIPPED: {e}");
            return Ok(());
        }
    };
    if n < 2 {
        println!("SKIPPED: {n} CUDA GPU(s); this benchmark needs 2");
        return Ok(());
    }
    let mut rep = Report::default();
    let mut gpus = String::new();
    for o in 0..2 {
        let _ = write!(
            gpus,
            "{}{}",
            if o > 0 { "; " } else { "" },
            ringkernel_cuda::probe_device(o)?
        );
    }
    rep.line(format!("GPUs: {gpus}"));
    rep.json("gpus", format!("{gpus:?}"));
    {
        // NCCL first: its set-up loads modules and may wait for running kernels.
        let group = NcclGroup::on_devices(&[0, 1])?;
        let version = ringkernel_cuda::nccl::nccl_version()?;
        rep.line(format!(
            "NCCL {version}, NCCL_NVLS_ENABLE={}",
            std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default()
        ));
        rep.json("nccl_version", format!("{version:?}"));
        all_reduce(&mut rep, &group, quick)?;
    }
    let exec = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|e| Error::Device(format!("tokio: {e}")))?;
    exec.block_on(k2k(&mut rep, quick))?;
    if let Some(path) = json {
        rep.write(&path)?;
    }
    Ok(())
}
