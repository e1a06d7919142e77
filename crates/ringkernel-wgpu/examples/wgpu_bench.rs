//! Benchmarks of the wgpu backend: memory-bound ops against the device's copy bandwidth,
//! matmul GFLOP/s, actor throughput with batching and single-message round trips.
//!
//! ```text
//! cargo run --release -p ringkernel-wgpu --example wgpu_bench -- [--elems N] [--cols C] [--matmul N] [--msgs N] [--calls N] [--batch N] [--senders N] [--capacity N] [--slot B] [--actors-only] [--ops-only] [--batched-only]
//! ```
//!
//! `--batch N` sets the batch of the echo through `send_batch`/`receive_batch_into`
//! (8,192: a batch of 576 KB of tokens stays in the sending core's cache between the
//! bench filling it and `send_batch` copying it; 16,384 made 0.95× the throughput on
//! the H200 host, BENCHMARKS.md) and `--senders N` the tasks sending it at once (1),
//! `--capacity N` the queue capacity of the echo kernels (65,536; a pass takes at most
//! a sixth of it), `--slot B` their slot size in bytes (256, the default; a `Token`
//! request fits 144).
//! `--ops-only` skips the actors. `--actors-only` skips the compute ops (matmul 4096³
//! takes minutes on a software adapter). `--batched-only` runs the batched echo alone
//! (for profiling). The actor figures come with the **floor** of the same run, measured
//! on the same device as `wgpu-floor` does: the round trip of the smallest useful pass
//! (write the inputs, one dispatch that transforms them, copy back, map, read) over 4
//! words, the same pass over 65,536 words, and over the bytes 16,384 echo messages move
//! (a slot of `--slot` bytes each way, as the runtime's rings hold them: the batched
//! echo's floor for its data). Beside the floor, the echo kernel's own pass over 65,536
//! `Token` requests already on the device (dispatch and wait, nothing copied, no host
//! work): the device's share of a batched echo message, checked reply by reply against
//! its request.
//!
//! Timing: each op is recorded `REPS` times back to back (the backend's batching: it
//! submits as it goes), and two figures are taken per run of `REPS`: the wall time from
//! the first record to the end of `synchronize`, and, where the adapter has timestamp
//! queries, the device's own clock from before the first op to after the last
//! (`gpu`: what the device spent, gaps between submissions included, host recording
//! not); each divided by `REPS`, the best of 5 runs after a warm-up. The ratios use the
//! device time where there is one (as `torch_peer.py`'s CUDA events do). Bytes are the
//! fewest the op must move (inputs read once, output written once; a copy counts its
//! read and its write), as in `torch_peer.py`.

use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::compute::{BinaryOp, BufferRef, ComputeBackend, MatmulDims};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_core::util::SplitMix64;
use ringkernel_core::Error;
use ringkernel_wgpu::{WgpuCompute, WgpuRuntime, WgslResource};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wgpu::util::DeviceExt;

const REPS: usize = 20;

/// Copy kernels with 1, 2, 4 and 8 vec4s per invocation: the in-run references for the
/// memory-bound ops.
const COPY_WGSL: &str = include_str!("kernels/copy.wgsl");

/// The floor pass's kernel.
const FLOOR_WGSL: &str = include_str!("kernels/floor.wgsl");

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Seconds per op: wall time, and the device's own time where it has timestamps.
#[derive(Clone, Copy)]
struct Timing {
    wall: f64,
    gpu: Option<f64>,
}

impl Timing {
    /// The device time where there is one, else the wall time.
    fn best(&self) -> f64 {
        self.gpu.unwrap_or(self.wall)
    }

    /// "wall X ms, device Y ms".
    fn show(&self) -> String {
        match self.gpu {
            Some(d) => format!("device {:.3} ms (wall {:.3} ms)", d * 1e3, self.wall * 1e3),
            None => format!("wall {:.3} ms", self.wall * 1e3),
        }
    }
}

/// Two timestamp queries written between submissions, around a run of ops.
struct GpuClock {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    period_ns: f64,
}

impl GpuClock {
    fn new(ctx: &ringkernel_wgpu::GpuContext) -> Option<Self> {
        let need =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        if !ctx.device.features().contains(need) {
            return None;
        }
        let dev = &ctx.device;
        let buffer = |usage| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench timestamps"),
                size: 16,
                usage,
                mapped_at_creation: false,
            })
        };
        Some(GpuClock {
            queries: dev.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("bench timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolve: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            read: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            period_ns: f64::from(ctx.queue.get_timestamp_period()),
        })
    }

    /// Submits what `g` recorded, then a timestamp write into query `i`.
    fn stamp(&self, g: &WgpuCompute, i: u32) -> Result<(), Error> {
        g.flush()?;
        let ctx = g.context();
        let mut e = ctx.device.create_command_encoder(&Default::default());
        e.write_timestamp(&self.queries, i);
        ctx.queue.submit([e.finish()]);
        Ok(())
    }

    /// Seconds between the two stamps (after they were written).
    fn elapsed(&self, g: &WgpuCompute) -> Result<f64, Error> {
        let ctx = g.context();
        let mut e = ctx.device.create_command_encoder(&Default::default());
        e.resolve_query_set(&self.queries, 0..2, &self.resolve, 0);
        e.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, 16);
        ctx.queue.submit([e.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        self.read.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| dev_err(&e))?;
        rx.recv()
            .map_err(|e| dev_err(&e))?
            .map_err(|e| dev_err(&e))?;
        let ticks: [u64; 2] = {
            let m = self.read.get_mapped_range(..).map_err(|e| dev_err(&e))?;
            bytemuck::pod_read_unaligned(&m[..16])
        };
        self.read.unmap();
        Ok(ticks[1].saturating_sub(ticks[0]) as f64 * self.period_ns * 1e-9)
    }
}

fn time_op(
    g: &WgpuCompute,
    reps: usize,
    mut op: impl FnMut() -> Result<(), Error>,
) -> Result<Timing, Error> {
    let clock = GpuClock::new(g.context());
    op()?;
    g.synchronize()?;
    let mut best = Timing {
        wall: f64::INFINITY,
        gpu: clock.as_ref().map(|_| f64::INFINITY),
    };
    for _ in 0..5 {
        if let Some(c) = &clock {
            c.stamp(g, 0)?;
        }
        let t = Instant::now();
        for _ in 0..reps {
            op()?;
        }
        if let Some(c) = &clock {
            c.stamp(g, 1)?;
        }
        g.synchronize()?;
        best.wall = best.wall.min(t.elapsed().as_secs_f64() / reps as f64);
        if let (Some(c), Some(b)) = (&clock, best.gpu.as_mut()) {
            *b = b.min(c.elapsed(g)? / reps as f64);
        }
    }
    Ok(best)
}

fn random(g: &WgpuCompute, n: usize, seed: u64) -> Result<BufferRef, Error> {
    let mut r = SplitMix64::new(seed);
    g.upload(&r.vec(n, -1.0, 1.0))
}

/// p50 and p99 of `v` (sorted in place).
fn p50_p99(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

/// The floor of one pass over `words` u32 inputs on a device, as `wgpu-floor` measures
/// it: write them, dispatch one transform, copy the outputs back, map and read.
struct Floor {
    ctx: Arc<ringkernel_wgpu::GpuContext>,
    words: u64,
    input: Vec<u32>,
    pipe: wgpu::ComputePipeline,
    buf: wgpu::Buffer,
    staging: wgpu::Buffer,
    bind: wgpu::BindGroup,
}

fn dev_err(e: &dyn std::fmt::Display) -> Error {
    Error::Device(format!("floor pass: {e}"))
}

/// Maps `buf` for reading and waits until it is mapped (after the work submitted so far).
fn map_read(dev: &wgpu::Device, buf: &wgpu::Buffer) -> Result<(), Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    buf.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    dev.poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| dev_err(&e))?;
    rx.recv().map_err(|e| dev_err(&e))?.map_err(|e| dev_err(&e))
}

impl Floor {
    fn new(ctx: &Arc<ringkernel_wgpu::GpuContext>, words: u64) -> Self {
        let dev = &ctx.device;
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("floor"),
            source: wgpu::ShaderSource::Wgsl(FLOOR_WGSL.into()),
        });
        let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("floor"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("floor"),
            contents: bytemuck::cast_slice(&vec![0u32; 2 * words as usize]),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        });
        let staging = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("floor readback"),
            size: words * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("floor"),
            layout: &pipe.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: buf.as_entire_binding(),
            }],
        });
        Floor {
            ctx: ctx.clone(),
            words,
            input: (0..words as u32).collect(),
            pipe,
            buf,
            staging,
            bind,
        }
    }

    /// One pass; its round trip in µs.
    fn pass(&self) -> Result<f64, Error> {
        let (dev, q) = (&self.ctx.device, &self.ctx.queue);
        let t = Instant::now();
        q.write_buffer(&self.buf, 0, bytemuck::cast_slice(&self.input));
        let mut enc = dev.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipe);
            pass.set_bind_group(0, &self.bind, &[]);
            pass.dispatch_workgroups(self.words.div_ceil(64) as u32, 1, 1);
        }
        let half = self.words * 4;
        enc.copy_buffer_to_buffer(&self.buf, half, &self.staging, 0, half);
        q.submit([enc.finish()]);
        map_read(dev, &self.staging)?;
        let ok = {
            let m = self.staging.get_mapped_range(..).map_err(|e| dev_err(&e))?;
            u32::from_le_bytes([m[4], m[5], m[6], m[7]]) == 3
        };
        self.staging.unmap();
        if !ok {
            return Err(Error::Device("floor pass computed a wrong value".into()));
        }
        Ok(t.elapsed().as_secs_f64() * 1e6)
    }

    /// `n` passes after a few warm-up ones: their round trips in µs.
    fn passes(&self, n: usize) -> Result<Vec<f64>, Error> {
        for _ in 0..n.div_ceil(10) {
            self.pass()?;
        }
        (0..n).map(|_| self.pass()).collect()
    }
}

/// The echo kernel's own pass, without the host: `rk.echo`'s drain module (the one the
/// runtime compiles) dispatched over `count` valid `Token` requests already on the
/// device, waited for, nothing copied. The device's share of a batched echo message.
struct EchoPass {
    ctx: Arc<ringkernel_wgpu::GpuContext>,
    count: u32,
    pipe: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
    output: wgpu::Buffer,
    ring_bytes: u64,
    slot: usize,
}

/// Default slot size of the echo kernels (`--slot`): the runtime's default.
const ECHO_SLOT: usize = ringkernel_core::message::DEFAULT_SLOT_SIZE;

impl EchoPass {
    fn new(ctx: &Arc<ringkernel_wgpu::GpuContext>, count: u32, slot: usize) -> Result<Self, Error> {
        use ringkernel_core::message::{MessageHeader, RingMessage, HEADER_SIZE};
        let dev = &ctx.device;
        let wgsl = ringkernel_shaders::drain::builtin_handlers()
            .into_iter()
            .find(|(name, _, _)| *name == ECHO)
            .map(|(_, wgsl, _)| ringkernel_shaders::drain::compose(&wgsl))
            .ok_or_else(|| Error::Device("no WGSL rk.echo".into()))?;
        let capacity = (count as usize).next_power_of_two();
        let words = slot / 4;
        let params = ringkernel_shaders::params::Drain {
            kernel_id: 7,
            count,
            hlc_lo: 1000,
            slot_words: words as u32,
            mask: capacity as u32 - 1,
            state_words: 4,
            ..Default::default()
        };
        // The rings: a 128-byte queue header, then the slots.
        let ring_bytes = 128 + capacity * slot;
        let mut input = vec![0u8; ring_bytes];
        for i in 0..count as usize {
            let at = 128 + i * slot;
            let mut h = MessageHeader::new(Token::TYPE_ID, std::mem::size_of::<Token>());
            h.correlation_id = i as u64;
            input[at..at + HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&h));
            let t = Token::new(i as u64, i as f64 + 0.5);
            input[at + HEADER_SIZE..at + HEADER_SIZE + 72].copy_from_slice(bytemuck::bytes_of(&t));
        }
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let init = |contents: &[u8], usage| {
            dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("echo pass"),
                contents,
                usage,
            })
        };
        let uniform = init(bytemuck::bytes_of(&params), wgpu::BufferUsages::UNIFORM);
        let control = init(&[0u8; 128], storage);
        let in_ring = init(&input, storage);
        // Poisoned, so that a pass that wrote nothing cannot pass the check.
        let output = init(&vec![0xA5u8; ring_bytes], storage);
        let state = init(&[0u8; 16], storage);
        let layout = ringkernel_wgpu::runtime::drain_bind_group_layout(dev);
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("echo pass"),
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        });
        let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("echo pass"),
            layout: Some(
                &dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some("echo pass"),
                    bind_group_layouts: &[Some(&layout)],
                    immediate_size: 0,
                }),
            ),
            module: &module,
            entry_point: Some("rk_drain"),
            compilation_options: Default::default(),
            cache: None,
        });
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("echo pass"),
            layout: &layout,
            entries: &[&uniform, &control, &in_ring, &output, &state]
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect::<Vec<_>>(),
        });
        ctx.take_error()?;
        Ok(EchoPass {
            ctx: ctx.clone(),
            count,
            pipe,
            bind,
            output,
            ring_bytes: ring_bytes as u64,
            slot,
        })
    }

    /// One pass (dispatch, wait); its time in µs.
    fn pass(&self) -> Result<f64, Error> {
        let (dev, q) = (&self.ctx.device, &self.ctx.queue);
        let t = Instant::now();
        let mut enc = dev.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipe);
            pass.set_bind_group(0, &self.bind, &[]);
            let [x, y, z] = ringkernel_shaders::grid_for(
                u64::from(self.count)
                    .div_ceil(u64::from(ringkernel_shaders::drain::DRAIN_WORKGROUP_SIZE)),
            );
            pass.dispatch_workgroups(x, y, z);
        }
        q.submit([enc.finish()]);
        dev.poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| dev_err(&e))?;
        Ok(t.elapsed().as_secs_f64() * 1e6)
    }

    /// `n` passes after a few warm-up ones, then a check of every reply; the passes'
    /// times in µs.
    fn passes(&self, n: usize) -> Result<Vec<f64>, Error> {
        for _ in 0..3 {
            self.pass()?;
        }
        let times = (0..n).map(|_| self.pass()).collect::<Result<Vec<_>, _>>()?;
        self.check()?;
        Ok(times)
    }

    /// Every reply is the echo of its request (value doubled, one hop, a reply's output
    /// unit: see "Outputs" in `ringkernel_shaders::drain`).
    fn check(&self) -> Result<(), Error> {
        use ringkernel_core::message::{flags, RingMessage, HEADER_SIZE};
        use ringkernel_shaders::drain::Output;
        let (dev, q) = (&self.ctx.device, &self.ctx.queue);
        let back = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("echo pass readback"),
            size: self.ring_bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = dev.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&self.output, 0, &back, 0, self.ring_bytes);
        q.submit([enc.finish()]);
        map_read(dev, &back)?;
        let m = back.get_mapped_range(..).map_err(|e| dev_err(&e))?;
        for i in 0..self.count as usize {
            let at = 128 + i * self.slot;
            let reply = Output::Message {
                flags: flags::REPLY,
                type_id: Token::TYPE_ID,
                payload_len: 72,
                dest_kernel: 0,
            };
            let t: Token =
                bytemuck::pod_read_unaligned(&m[at + HEADER_SIZE..at + HEADER_SIZE + 72]);
            if Output::read(&m[at..]) != reply
                || t.id != i as u64
                || t.value != 2.0 * (i as f64 + 0.5)
                || t.hops != 1
            {
                return Err(Error::Device(format!("echo pass: reply {i} wrong: {t:?}")));
            }
        }
        Ok(())
    }
}

fn main() -> Result<(), Error> {
    let elems = arg("--elems", 64 << 20);
    let cols = arg("--cols", 4096);
    let mm = arg("--matmul", 4096);
    let msgs = arg("--msgs", 1_000_000);
    let calls = arg("--calls", 2000);
    let batch = arg("--batch", 8192);
    let actors_only = std::env::args().any(|a| a == "--actors-only");
    let g = match WgpuCompute::new() {
        Ok(g) => g,
        Err(e @ Error::BackendUnavailable { .. }) => {
            println!("no usable wgpu adapter: {e}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    println!("device: {}", g.device_name());
    let ops_only = std::env::args().any(|a| a == "--ops-only");
    if !actors_only {
        ops(&g, elems, cols, mm)?;
    }
    if ops_only {
        return Ok(());
    }
    let batched_only = std::env::args().any(|a| a == "--batched-only");
    let capacity = arg("--capacity", 65536);
    let senders = arg("--senders", 1);
    let slot = arg("--slot", ECHO_SLOT);
    let shape = Shape {
        msgs,
        calls,
        batch,
        senders,
        capacity,
        slot,
    };
    actors(&g, shape, batched_only)
}

/// CPU time this process has used (user + system) in seconds, from `/proc/self/stat`
/// (`None` where there is none).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may contain spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line (11 and 12 of `rest`), in
    // clock ticks of USER_HZ = 100 on Linux.
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// CPU time of each thread of this process, by thread id: its name (`comm`) and
/// nanoseconds on a CPU (`/proc/self/task/*/schedstat`, or `stat`'s utime + stime in
/// ticks of 10 ms where there is no schedstat). `None` off Linux.
fn thread_cpu() -> Option<std::collections::HashMap<u32, (String, u64)>> {
    let mut out = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let dir = e.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .or_else(|| {
                let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
                let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
                let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
                Some(ticks * 10_000_000)
            });
        if let Some(ns) = ns {
            out.insert(tid, (comm.trim().to_string(), ns));
        }
    }
    Some(out)
}

/// The tokio worker threads' name (`comm` keeps 15 bytes of it).
const WORKER_NAME: &str = "bench-worker";

/// CPU ns a message per thread group between two [`thread_cpu`] snapshots: the
/// receiver (the main thread, which runs `block_on`), the tokio workers (the sender
/// task), the wgpu poller, then every other thread by name with trailing digits folded
/// (`llvmpipe-*`), those without a name of their own as `unnamed` (they carry the
/// process's: lavapipe's threads, which run the shader and the copies here, do). Ours
/// first, the busiest of ours named.
fn per_thread(
    before: &Option<std::collections::HashMap<u32, (String, u64)>>,
    msgs: usize,
) -> String {
    let (Some(before), Some(after)) = (before, thread_cpu()) else {
        return "per thread: n/a".into();
    };
    let pid = std::process::id();
    let mut ours: Vec<(&str, f64)> = vec![
        ("receiver (main)", 0.0),
        ("sender (tokio workers)", 0.0),
        ("wgpu poller", 0.0),
        ("wgpu launcher", 0.0),
    ];
    let mut others: std::collections::BTreeMap<String, f64> = Default::default();
    // Threads started without a name carry the process's (lavapipe's do).
    let process = after.get(&pid).map(|t| t.0.clone()).unwrap_or_default();
    for (tid, (name, ns)) in &after {
        let was = before.get(tid).filter(|b| &b.0 == name).map_or(0, |b| b.1);
        let per = ns.saturating_sub(was) as f64 / msgs as f64;
        if *tid == pid {
            ours[0].1 += per;
        } else if WORKER_NAME.starts_with(name.as_str()) {
            ours[1].1 += per;
        } else if "ringkernel-wgpu-poll".starts_with(name.as_str()) {
            ours[2].1 += per;
        } else if ringkernel_wgpu::runtime::LAUNCHER_THREAD.starts_with(name.as_str()) {
            ours[3].1 += per;
        } else if *name == process {
            *others.entry("unnamed".into()).or_default() += per;
        } else {
            let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
            let key = if base.len() < name.len() {
                format!("{base}*")
            } else {
                name.clone()
            };
            *others.entry(key).or_default() += per;
        }
    }
    let busiest = ours
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("", |o| o.0);
    let mut line: Vec<String> = ours.iter().map(|(n, v)| format!("{n} {v:.0}")).collect();
    let mut rest: Vec<(String, f64)> = others.into_iter().filter(|o| o.1 >= 0.5).collect();
    rest.sort_by(|a, b| b.1.total_cmp(&a.1));
    let rest: Vec<String> = rest.iter().map(|(n, v)| format!("{n} {v:.0}")).collect();
    line.push(format!(
        "busiest of ours: {busiest}; other threads (driver, runtime): {}",
        if rest.is_empty() {
            "none".into()
        } else {
            rest.join(", ")
        }
    ));
    format!("per thread CPU ns/msg: {}", line.join(", "))
}

fn ops(g: &WgpuCompute, elems: usize, cols: usize, mm: usize) -> Result<(), Error> {
    let gb = |bytes: f64, s: f64| bytes / s / 1e9;
    println!(
        "timing: {}",
        if GpuClock::new(g.context()).is_some() {
            "device timestamps around each run of ops (wall time beside)"
        } else {
            "wall time (the adapter has no timestamp queries)"
        }
    );

    // Copy bandwidth: a 1 GiB buffer-to-buffer copy.
    // (Halved until it fits the adapter's buffer limit, e.g. 128 MiB on lavapipe.)
    let mut copy_elems = (1usize << 30) / 4;
    let (src, dst) = loop {
        match (g.alloc(copy_elems), g.alloc(copy_elems)) {
            (Ok(s), Ok(d)) => break (s, d),
            _ if copy_elems > 1 << 20 => copy_elems /= 2,
            (Err(e), _) | (_, Err(e)) => return Err(e),
        }
    };
    let t = time_op(g, 5, || g.copy(&*src, 0, &*dst, 0, copy_elems))?;
    let copy_bw = gb(2.0 * (copy_elems * 4) as f64, t.best());
    println!(
        "copy {} MiB (copy_buffer_to_buffer): {}, {:.1} GB/s (read + write)",
        (copy_elems * 4) >> 20,
        t.show(),
        copy_bw
    );
    drop((src, dst));

    let bytes = (elems * 4) as f64;
    let a = random(g, elems, 1)?;
    let b = random(g, elems, 2)?;
    let out = g.alloc(elems)?;
    // The in-run references for memory-bound kernels: plain vec4 copy kernels with 1, 2,
    // 4 and 8 vec4s per invocation, recorded and submitted the way the ops are.
    let vec4s = elems / 4;
    let mut kernel_bw = 0.0f64;
    for per in [1usize, 2, 4, 8] {
        let entry = format!("copy_x{per}");
        let kernel = g.compile_wgsl(
            &entry,
            COPY_WGSL,
            &entry,
            &[
                (1, WgslResource::Storage { read_only: true }),
                (2, WgslResource::Storage { read_only: false }),
            ],
        )?;
        let groups = ringkernel_shaders::grid_for(vec4s.div_ceil(256 * per) as u64);
        let t = time_op(g, REPS, || {
            g.dispatch_wgsl(&kernel, None, &[(1, &*a), (2, &*out)], groups)
        })?;
        let bw = gb(2.0 * bytes, t.best());
        if per == ringkernel_drain::plan::VEC4_PER_THREAD {
            kernel_bw = bw;
        }
        println!(
            "copy kernel (WGSL, {per} vec4 per invocation) {elems} f32: {}, {:.1} GB/s = {:.0}% of copy",
            t.show(),
            bw,
            100.0 * bw / copy_bw
        );
    }
    let t = time_op(g, REPS, || g.binary(BinaryOp::Add, &*a, &*b, &*out, elems))?;
    let bw = gb(3.0 * bytes, t.best());
    println!(
        "add {elems} f32: {}, {:.1} GB/s = {:.0}% of copy, {:.0}% of the copy kernel with the same vec4s per invocation",
        t.show(),
        bw,
        100.0 * bw / copy_bw,
        100.0 * bw / kernel_bw
    );
    let rows = elems / cols;
    let t = time_op(g, REPS, || g.softmax(&*a, &*out, rows, cols))?;
    let bw = gb(2.0 * bytes, t.best());
    println!(
        "softmax {rows}x{cols}: {}, {:.1} GB/s = {:.0}% of copy",
        t.show(),
        bw,
        100.0 * bw / copy_bw
    );
    let w = random(g, cols, 3)?;
    let t = time_op(g, REPS, || g.rms_norm(&*a, &*w, &*out, rows, cols, 1e-6))?;
    let bw = gb(2.0 * bytes, t.best());
    println!(
        "rms_norm {rows}x{cols}: {}, {:.1} GB/s = {:.0}% of copy",
        t.show(),
        bw,
        100.0 * bw / copy_bw
    );
    drop((a, b, out, w));

    let ma = random(g, mm * mm, 4)?;
    let mb = random(g, mm * mm, 5)?;
    let mc = g.alloc(mm * mm)?;
    let dims = MatmulDims {
        batch: 1,
        m: mm,
        k: mm,
        n: mm,
        b_batched: false,
    };
    let t = time_op(g, 5, || g.matmul(&*ma, &*mb, &*mc, dims))?;
    let flops = 2.0 * (mm as f64).powi(3);
    println!(
        "matmul {mm}^3 f32: {}, {:.0} GFLOP/s (tile {})",
        t.show(),
        flops / t.best() / 1e9,
        g.matmul_tile_for(dims)?
    );
    // The 64×64 kernel this one replaced (still Metal's non-MPS path), same buffers.
    let old = ringkernel_drain::plan::matmul(dims)?;
    let args: [&dyn ringkernel_core::compute::DeviceBuffer; 3] = [&*ma, &*mb, &*mc];
    let t_old = time_op(g, 5, || ringkernel_drain::exec::run(g, &old, &args))?;
    println!(
        "  matmul, the 64x64 kernel before issue 17: {}, {:.0} GFLOP/s (ours {:.2}x it)",
        t_old.show(),
        flops / t_old.best() / 1e9,
        t_old.best() / t.best()
    );
    // Every tile shape the tuner chooses from, timed here on this size (wall time of
    // the tuner's own runs).
    for (tile, d) in g.time_matmul_tiles(dims)? {
        println!(
            "  matmul tile {tile}: wall {:.3} ms, {:.0} GFLOP/s",
            d.as_secs_f64() * 1e3,
            flops / d.as_secs_f64() / 1e9
        );
    }
    drop((ma, mb, mc));
    Ok(())
}

/// The echo through the batched API: `senders` tasks send `batch` messages per
/// `send_batch` (sender `s` the ids of its own share of `0..msgs`, in order), another
/// takes the replies with `receive_batch_into`: each sender's replies in its order.
async fn echo_batched(runtime: &WgpuRuntime, shape: Shape) -> Result<(), Error> {
    let Shape {
        msgs,
        batch,
        capacity,
        senders,
        slot,
        ..
    } = shape;
    let opts = LaunchOptions::default()
        .with_queue_capacity(capacity)
        .with_slot_size(slot);
    let k = runtime.launch(ECHO, opts).await?;
    let batch = batch.max(1);
    let senders = senders.clamp(1, msgs.max(1));
    // Sender `s` sends the ids `share * s ..` (the last one the rest as well).
    let share = msgs / senders;
    let range = move |s: usize| {
        let end = if s + 1 == senders {
            msgs
        } else {
            share * (s + 1)
        };
        (share * s) as u64..end as u64
    };
    let start = Instant::now();
    let cpu0 = cpu_seconds();
    let threads0 = thread_cpu();
    let tasks: Vec<_> = (0..senders)
        .map(|s| {
            let k = k.clone();
            let ids = range(s);
            tokio::spawn(async move {
                let mut busy = Duration::ZERO;
                let mut next = ids.start;
                // The batch's tokens are made once and only their id and value change
                // from one batch to the next: building each token anew (`Token::new`,
                // returned through the stack and copied) took a fifth to a third of this
                // thread's time on the development VM, which is the bench's, not the
                // runtime's.
                let mut buf = vec![Token::default(); batch];
                while next < ids.end {
                    let n = batch.min((ids.end - next) as usize);
                    buf.truncate(n);
                    for (t, i) in buf.iter_mut().zip(next..) {
                        (t.id, t.value) = (i, i as f64);
                    }
                    let t = Instant::now();
                    k.send_batch(&buf).await?;
                    busy += t.elapsed();
                    next += n as u64;
                }
                Ok::<_, Error>(busy)
            })
        })
        .collect();
    let (mut got, mut calls, mut recv_busy) = (0usize, 0usize, Duration::ZERO);
    let mut replies: Vec<Token> = Vec::with_capacity(msgs.min(1 << 20));
    // The next id expected from each sender.
    let mut next: Vec<u64> = (0..senders).map(|s| range(s).start).collect();
    while got < msgs {
        let t = Instant::now();
        replies.clear();
        k.receive_batch_into(&mut replies, msgs - got, Some(Duration::from_secs(30)))
            .await?;
        recv_busy += t.elapsed();
        calls += 1;
        for t in &replies {
            // No division with one sender: it took about a sixth of this check's time
            // on the receiving thread (perf, H200).
            let s = if senders == 1 {
                0
            } else {
                ((t.id as usize) / share.max(1)).min(senders - 1)
            };
            if t.id != next[s] || t.value != 2.0 * t.id as f64 {
                return Err(Error::Device(format!(
                    "batched reply {got} wrong (sender {s} expected id {}): {t:?}",
                    next[s]
                )));
            }
            next[s] += 1;
            got += 1;
        }
    }
    let mut send_busy = Duration::ZERO;
    for t in tasks {
        send_busy += t.await.map_err(|e| Error::Device(e.to_string()))??;
    }
    let s = start.elapsed().as_secs_f64();
    let cpu = cpu0.zip(cpu_seconds()).map(|(a, b)| b - a);
    let threads = per_thread(&threads0, msgs);
    let m = k.metrics();
    println!(
        "actor echo, {msgs} messages, batched API ({senders} sender(s), send_batch of {batch}, receive_batch_into): {:.3} s, {:.0} msgs/s",
        s,
        msgs as f64 / s,
    );
    println!(
        "  where the time goes: process CPU {} ns/msg ({:.2} cores busy); in send_batch {:.1} ns/msg (waits for ring room included); {} receive_batch_into calls ({:.0} msgs each, {:.1} ns/msg inside them, waits included); pass time per message (launch to completion / messages) {:.1} ns mean; {}",
        cpu.map_or("?".into(), |c| format!("{:.0}", c * 1e9 / msgs as f64)),
        cpu.map_or(0.0, |c| c / s),
        send_busy.as_secs_f64() * 1e9 / msgs as f64,
        calls,
        msgs as f64 / calls.max(1) as f64,
        recv_busy.as_secs_f64() * 1e9 / msgs as f64,
        m.latency.mean_ns,
        threads,
    );
    k.terminate().await?;
    Ok(())
}

/// The actor benches' sizes (their command-line flags).
#[derive(Clone, Copy)]
struct Shape {
    /// Messages of each throughput run (`--msgs`).
    msgs: usize,
    /// Round trips (`--calls`).
    calls: usize,
    /// Messages per `send_batch` (`--batch`).
    batch: usize,
    /// Tasks sending the batched echo at once (`--senders`).
    senders: usize,
    /// Queue capacity of the throughput kernels (`--capacity`).
    capacity: usize,
    /// Slot size of the throughput kernels (`--slot`).
    slot: usize,
}

fn actors(g: &WgpuCompute, shape: Shape, batched_only: bool) -> Result<(), Error> {
    let Shape {
        msgs,
        calls,
        capacity,
        slot,
        ..
    } = shape;
    // The floor of this run, as `wgpu-floor` measures it.
    let (floor_one, floor_batch) = (Floor::new(g.context(), 4), Floor::new(g.context(), 65536));
    let (b50, b99) = p50_p99(&mut floor_batch.passes(if batched_only { 20 } else { 200 })?);
    println!(
        "floor, 65,536 messages per pass: p50 {b50:.1} us, p99 {b99:.1} us = {:.1} M msgs/s",
        65536.0 / b50
    );
    // The same pass over the bytes a batched echo message moves: a slot up and one down
    // (`--slot`: 256 bytes by default; a `Token` request fits 144), for 16,384 messages
    // (4 MiB each way at 256 bytes; the floor's one-dimensional dispatch allows at most
    // 65,535 groups of 64 words), about the size of the batched echo's passes.
    let slot_words = (slot / 4) as u64;
    let floor_slots = Floor::new(g.context(), 16384 * slot_words);
    let (s50, _) = p50_p99(&mut floor_slots.passes(20)?);
    println!(
        "floor, 16,384 echo slots of {slot} bytes each way per pass: p50 {s50:.1} us = {:.1} M msgs/s ({:.1} GB/s each way)",
        16384.0 / s50,
        16384.0 * slot as f64 / s50 / 1e3
    );
    drop(floor_slots);
    // The device's share of a batched echo message: the echo kernel's pass alone.
    let (e50, _) = p50_p99(&mut EchoPass::new(g.context(), 65536, slot)?.passes(20)?);
    println!(
        "echo kernel alone, 65,536 requests per pass (dispatch and wait, no copies, no host work): p50 {e50:.1} us = {:.1} M msgs/s",
        65536.0 / e50
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name(WORKER_NAME)
        .enable_all()
        .build()
        .map_err(|e| Error::Device(e.to_string()))?;
    rt.block_on(async {
        let runtime = WgpuRuntime::with_context(KernelRegistry::new(), g.context().clone());
        let opts = LaunchOptions::default()
            .with_queue_capacity(capacity)
            .with_slot_size(slot);
        if batched_only {
            return echo_batched(&runtime, shape).await;
        }
        let k = runtime.launch(ECHO, opts).await?;
        // Throughput: one task sends, another receives, as fast as they can.
        let start = Instant::now();
        let sender = {
            let k = k.clone();
            tokio::spawn(async move {
                for i in 0..msgs as u64 {
                    k.send(Token::new(i, i as f64)).await?;
                }
                Ok::<_, Error>(())
            })
        };
        for i in 0..msgs as u64 {
            let t: Token = k.receive_timeout_as(Duration::from_secs(30)).await?;
            if t.id != i || t.value != 2.0 * i as f64 {
                return Err(Error::Device(format!("reply {i} wrong: {t:?}")));
            }
        }
        sender.await.map_err(|e| Error::Device(e.to_string()))??;
        let s = start.elapsed().as_secs_f64();
        let m = k.metrics();
        println!("actor echo, {msgs} messages, one send/receive per message (drain passes batch them): {:.3} s, {:.0} msgs/s (handler latency p50 {} ns/msg amortised)", s, msgs as f64 / s, m.latency.p50_ns);
        k.terminate().await?;
        echo_batched(&runtime, shape).await?;
        // Round trip: one call at a time, on a kernel with the default options, in
        // blocks alternating with blocks of floor passes (so both see the same load).
        let k = runtime.launch(ECHO, LaunchOptions::default()).await?;
        let (mut lat, mut floor) = (Vec::new(), Vec::new());
        let block = 100.min(calls.max(1));
        for b in 0..calls.div_ceil(block) {
            floor.extend(floor_one.passes(block)?);
            for i in 0..block as u64 {
                let t = Instant::now();
                let r: Token = k
                    .call(Token::new(i, 1.0), Duration::from_secs(10))
                    .await?;
                lat.push(t.elapsed().as_secs_f64() * 1e6);
                if r.id != i || r.value != 2.0 {
                    return Err(Error::Device(format!("call {b}/{i} wrong: {r:?}")));
                }
            }
        }
        let (f50, f99) = p50_p99(&mut floor);
        let (p50, p99) = p50_p99(&mut lat);
        println!(
            "floor, 4 messages per pass (write, dispatch, copy back, map, read): p50 {f50:.1} us, p99 {f99:.1} us"
        );
        println!(
            "actor round trip (call, 1 message): p50 {p50:.1} us ({:.2}x floor), p99 {p99:.1} us ({:.2}x floor)",
            p50 / f50,
            p99 / f99,
        );
        runtime.shutdown().await?;
        Ok::<_, Error>(())
    })
}
