//! Recorded programs: a sequence of ops run as one cooperative launch of `rk_program`
//! (`kernels/program.cu`) instead of one kernel each.
//!
//! [`CudaCompute::record_program`] runs the caller's ops in *program mode*: on the
//! recording thread, the ops the program kernel knows (the decode step's: `embedding`,
//! `qmatmul` and its fused forms with RMSNorm and SwiGLU, `rope_attention_kv` for one
//! token) check their arguments as always and append an instruction instead of
//! launching; any other op ends the attempt (it returns an error only the recorder sees)
//! and no program is made. A program also keeps the same ops as a CUDA graph and replays
//! that instead while persistent kernels run in the process, because a cooperative launch
//! over every SM would wait behind them.
//!
//! Every block of the program's grid (one per SM) runs every instruction: its share of
//! the rows (qmatmul: a warp per row, four rows at once where a warp has several, as in
//! the output head), heads (attention: a block per head) or elements (embedding), then a
//! grid-wide barrier. Attention over a long cache is split over the keys (from 512 keys a
//! block): a head gets up to grid/heads blocks (at most 16, what the merge takes), and the
//! last of them to finish merges their partial results.
//!
//! **Measured, not the default.** On an H100 (2026-11-27, SmolLM2-135M, 152 instructions
//! a step) a program step decoded 899–909 tokens/s against 1,026–1,029 for the same step
//! as a CUDA graph in the same call (0.88×), so
//! [`ComputeBackend::record`](ringkernel_core::compute::ComputeBackend::record) records
//! graphs unless `RINGKERNEL_CUDA_PROGRAM=1`. The per-instruction trace showed why: a grid
//! barrier costs ~1–1.3 µs (release/acquire; `scripts/grid_barrier.cu`, equal to
//! cooperative groups' `grid.sync()`) and each instruction's own chain of dependent memory
//! trips 3–10 µs, about what a kernel boundary in the graph costs. Prefetching the next
//! instruction's weights and cached keys into L2 before the barrier, and f32 RoPE angles,
//! moved nothing beyond the noise and were dropped (BENCHMARKS.md has the runs).
//!
//! `RINGKERNEL_CUDA_PROGRAM_SPLIT=0` turns the split attention off;
//! `RINGKERNEL_CUDA_PROGRAM_TRACE=1` times each instruction on the device (one
//! synchronising read after each replay) and prints the totals by op, split into the
//! work and the barrier, when the program is dropped.

use super::{arg, CudaCompute, CudaGraph};
use bytemuck::{Pod, Zeroable};
use cudarc::driver::sys;
use ringkernel_core::compute::{BufferRef, ComputeBackend, Replay};
use ringkernel_core::{Error, Result};
use std::sync::Mutex;
use std::thread::ThreadId;

/// Threads per block of `rk_program` (`PROG_THREADS`).
const PROG_THREADS: u32 = 512;
/// Op codes (`PROG_*` in `program.cu`).
pub(super) const OP_EMBED: u32 = 1;
pub(super) const OP_ROPE_ATT: u32 = 8;
pub(super) const OP_QM: u32 = 16;

/// One instruction (`RkInstr` in `program.cu`): an op code, up to four sizes, padding,
/// two floats and up to eight device pointers.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, Pod, Zeroable)]
pub(super) struct Instr {
    pub op: u32,
    pub a: u32,
    pub b: u32,
    pub c: u32,
    pub d: u32,
    pub pad: u32,
    pub f0: f32,
    pub f1: f32,
    pub p: [u64; 8],
}

/// A size as an instruction field; `None` (the op is left to a graph) past `u32`.
pub(super) fn field(v: usize) -> Option<u32> {
    u32::try_from(v).ok()
}

/// The instructions recorded so far on `thread`.
pub(super) struct Recording {
    thread: ThreadId,
    instrs: Vec<Instr>,
    /// The first op that cannot be in a program.
    refused: Option<String>,
}

/// Whether the switch `name` is on (anything but `0`; on when unset).
pub(super) fn switch(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}

/// Whether `record` tries a program first (`RINGKERNEL_CUDA_PROGRAM=1`; off by default:
/// measured slower than the graph, see the module documentation).
fn programs_wanted() -> bool {
    std::env::var("RINGKERNEL_CUDA_PROGRAM").is_ok_and(|v| v == "1")
}

impl CudaCompute {
    /// `f` on the recording, when this thread records a program (checked without the
    /// lock first: every op asks).
    fn with_own_recording<R>(&self, f: impl FnOnce(&mut Recording) -> R) -> Option<R> {
        use std::sync::atomic::Ordering;
        if !self.inner.recording_any.load(Ordering::Acquire) {
            return None;
        }
        let mut rec = self.inner.recording.lock().ok()?;
        rec.as_mut()
            .filter(|r| r.thread == std::thread::current().id())
            .map(f)
    }

    /// Whether this thread records a program (ops become its instructions).
    pub(super) fn in_program(&self) -> bool {
        self.with_own_recording(|_| ()).is_some()
    }

    /// In program mode on this thread: appends the instruction `make` builds and returns
    /// `Some(Ok)`, or the refusal when `make` gives nothing (the op's sizes do not fit an
    /// instruction). Outside program mode: `None`, and the op launches.
    pub(super) fn program_op(&self, make: impl FnOnce() -> Option<Instr>) -> Option<Result<()>> {
        self.with_own_recording(|r| match make() {
            Some(i) => {
                r.instrs.push(i);
                Ok(())
            }
            None => Err(Self::refuse(r, "an op with sizes past 32 bits")),
        })
    }

    /// Called by every path that queues work on the stream other than a program
    /// instruction: in program mode on this thread, the error that ends the attempt.
    pub(crate) fn refuse_in_program(&self, what: &str) -> Result<()> {
        self.with_own_recording(|r| Err(Self::refuse(r, what)))
            .unwrap_or(Ok(()))
    }

    fn refuse(r: &mut Recording, what: &str) -> Error {
        r.refused.get_or_insert_with(|| what.to_string());
        Error::Device(format!("{what} cannot run inside a recorded program"))
    }

    /// `ComputeBackend::record`: with `RINGKERNEL_CUDA_PROGRAM=1` a [`CudaProgram`] when
    /// every op has an instruction; otherwise a [`CudaGraph`].
    pub(super) fn record_impl(
        &self,
        ops: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Option<Box<dyn Replay>>> {
        if programs_wanted() {
            if let Some(p) = self.record_program(ops)? {
                return Ok(Some(Box::new(p)));
            }
        }
        let graph = self.capture(|_| ops())?;
        Ok(Some(Box::new(graph)))
    }

    /// Records the ops `ops` queues on this thread as one [`CudaProgram`] without running
    /// them. Only the decode step's ops have program instructions: `embedding`,
    /// `qmatmul`, `qmatmul_swiglu`, `rms_norm_qmatmul` for up to 4 tokens and
    /// `rope_attention_kv` for one token, with sizes that fit `u32`. `Ok(None)` when any
    /// other op is queued, when none is, or while another thread records; the ops' own
    /// error when one fails its checks. The buffers the ops use must outlive the
    /// program. [`ComputeBackend::record`] tries this first, then a CUDA graph.
    pub fn record_program(
        &self,
        ops: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Option<CudaProgram>> {
        use std::sync::atomic::Ordering;
        {
            let mut rec = self
                .inner
                .recording
                .lock()
                .map_err(|_| Error::Device("program recorder poisoned".into()))?;
            if rec.is_some() {
                return Ok(None); // another thread records: this one records a graph
            }
            *rec = Some(Recording {
                thread: std::thread::current().id(),
                instrs: Vec::new(),
                refused: None,
            });
            self.inner.recording_any.store(true, Ordering::Release);
        }
        let ran = ops();
        let rec = {
            let mut g = self
                .inner
                .recording
                .lock()
                .map_err(|_| Error::Device("program recorder poisoned".into()))?;
            self.inner.recording_any.store(false, Ordering::Release);
            g.take()
        };
        let Some(rec) = rec else {
            return Ok(None);
        };
        if let Some(why) = rec.refused {
            tracing::debug!("ops recorded as a CUDA graph, not a program: {why}");
            return Ok(None);
        }
        ran?;
        if rec.instrs.is_empty() {
            return Ok(None);
        }
        let Some(grid) = self.program_grid()? else {
            return Ok(None);
        };
        // The same ops as a graph, for replays while persistent kernels run.
        let graph = self.capture(|_| ops())?;
        CudaProgram::new(self, rec.instrs, grid, graph).map(Some)
    }

    /// Blocks of a program launch: as many as fit on the device at once (cooperative
    /// launches need every block resident), at most one per SM; `None` if none fits.
    fn program_grid(&self) -> Result<Option<u32>> {
        let per_sm = self.blocks_per_sm("rk_program", PROG_THREADS)?;
        Ok((per_sm > 0).then(|| self.sms()))
    }

    /// How many blocks of `threads` threads of the kernel `name` (no dynamic shared
    /// memory) fit on one SM at once.
    pub(super) fn blocks_per_sm(&self, name: &str, threads: u32) -> Result<u32> {
        let f = self.func(name)?;
        self.inner.dev.bind()?;
        let mut per_sm: std::ffi::c_int = 0;
        // SAFETY: `f` is a kernel of our loaded module; `per_sm` outlives the call.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                f.0,
                threads as std::ffi::c_int,
                0,
            )
        }
        .result()
        .map_err(|e| Error::Device(format!("occupancy of {name}: {e}")))?;
        Ok(per_sm.max(0) as u32)
    }
}

/// Per-instruction device time of traced replays.
#[derive(Default)]
struct Trace {
    buf: Option<BufferRef>,
    replays: u64,
    /// ns per instruction, summed over replays: from block 0's start to the last block's
    /// end of its share (work), and from there to block 0's start of the next (barrier).
    work: Vec<u64>,
    barrier: Vec<u64>,
}

/// A recorded program (see the module documentation): replays as one launch.
pub struct CudaProgram {
    owner: CudaCompute,
    instrs: Vec<Instr>,
    code: BufferRef,
    /// The grid barrier's arrival counter and generation word (`program.cu`).
    count: BufferRef,
    /// Scratch of the split attention instructions (parts and counters).
    _scratch: Vec<BufferRef>,
    grid: u32,
    /// Launches so far (each passes `instrs.len() - 1` barriers).
    epoch: Mutex<u64>,
    trace: Mutex<Trace>,
    graph: CudaGraph,
}

impl std::fmt::Debug for CudaProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaProgram")
            .field("instructions", &self.instrs.len())
            .field("grid", &self.grid)
            .finish()
    }
}

fn poisoned<T>(_: T) -> Error {
    Error::Device("program state poisoned".into())
}

impl CudaProgram {
    fn new(c: &CudaCompute, mut instrs: Vec<Instr>, grid: u32, graph: CudaGraph) -> Result<Self> {
        // Each attention instruction gets its own parts (hd + 2 floats a block) and
        // per-head counters (zero bits).
        let mut scratch = Vec::new();
        if switch("RINGKERNEL_CUDA_PROGRAM_SPLIT") {
            for i in instrs.iter_mut().filter(|i| i.op == OP_ROPE_ATT) {
                let part = c.alloc(grid as usize * (i.c as usize + 2))?;
                let done = c.upload(&vec![0.0; i.a as usize])?;
                i.p[6] = c.device_ptr_of(&*part)?;
                i.p[7] = c.device_ptr_of(&*done)?;
                scratch.extend([part, done]);
            }
        }
        let code = c.upload(bytemuck::cast_slice(&instrs))?;
        let count = c.upload(&[0.0; 64])?; // all-zero bits: u64 zeros
        let traced = std::env::var("RINGKERNEL_CUDA_PROGRAM_TRACE").is_ok_and(|v| v == "1");
        let n = instrs.len();
        let trace = Trace {
            buf: if traced {
                Some(c.alloc(2 * (2 * n + 1))?)
            } else {
                None
            },
            replays: 0,
            work: vec![0; n],
            barrier: vec![0; n],
        };
        Ok(CudaProgram {
            owner: c.clone(),
            instrs,
            code,
            count,
            _scratch: scratch,
            grid,
            epoch: Mutex::new(0),
            trace: Mutex::new(trace),
            graph,
        })
    }

    /// Instructions in the program.
    pub fn len(&self) -> usize {
        self.instrs.len()
    }

    /// Whether the program has no instructions (never: such a recording is a graph).
    pub fn is_empty(&self) -> bool {
        self.instrs.is_empty()
    }

    /// Queues one run of the program on the compute stream (asynchronously).
    pub fn launch(&self) -> Result<()> {
        let c = &self.owner;
        if crate::driver::RUNNING_PERSISTENT_KERNELS.load(std::sync::atomic::Ordering::Acquire) > 0
        {
            return self.graph.launch();
        }
        let f = c.func("rk_program")?;
        let mut epoch = self.epoch.lock().map_err(poisoned)?;
        let n = self.instrs.len();
        let trace_ptr = match &self.trace.lock().map_err(poisoned)?.buf {
            Some(b) => {
                // the latest-arrival stamps are atomicMax'ed from zero
                c.write(&**b, 2 * (n + 1), &vec![0.0; 2 * n])?;
                c.device_ptr_of(&**b)?
            }
            None => 0,
        };
        let (mut code, mut nn, mut count, mut ep, mut tr) = (
            c.device_ptr_of(&*self.code)?,
            n as u32,
            c.device_ptr_of(&*self.count)?,
            *epoch,
            trace_ptr,
        );
        let mut args = [
            arg(&mut code),
            arg(&mut nn),
            arg(&mut count),
            arg(&mut ep),
            arg(&mut tr),
        ];
        c.inner.dev.bind()?;
        // SAFETY: an all-zero CUlaunchAttribute is a valid plain C struct; both fields
        // are set below.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attr.value.cooperative = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: self.grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: PROG_THREADS,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: c.inner.stream_op(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: rk_program's parameters are (const RkInstr*, u32, u64*, u64, u64*),
        // the types of `args` in order; `code` holds `n` instructions whose pointers were
        // checked against their buffers when recorded (the buffers outlive the program:
        // the `record` contract; the attention scratch and the trace are the program's
        // own, sized for this grid and `n`); `count` is this program's own counter (64
        // words), which only its launches touch, on one stream, in epoch order (the
        // epoch lock is held until the launch is queued); the cooperative attribute
        // makes the driver refuse a grid whose blocks cannot all be resident, so the
        // barriers cannot wait on a block that never starts; the occupancy query sized
        // the grid to one block per SM.
        unsafe { sys::cuLaunchKernelEx(&config, f.0, args.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| Error::Device(format!("CUDA launch of rk_program: {e}")))?;
        *epoch += 1;
        drop(epoch);
        if trace_ptr != 0 {
            self.collect_trace()?;
        }
        Ok(())
    }

    /// Adds this replay's instruction times to the trace.
    fn collect_trace(&self) -> Result<()> {
        let mut t = self.trace.lock().map_err(poisoned)?;
        let Some(buf) = t.buf.clone() else {
            return Ok(());
        };
        let n = self.instrs.len();
        let mut words = vec![0f32; 2 * (2 * n + 1)];
        self.owner.read(&*buf, 0, &mut words)?;
        let stamps: &[u64] = bytemuck::cast_slice(&words);
        let (start, done) = stamps.split_at(n + 1);
        for i in 0..n {
            t.work[i] += done[i].saturating_sub(start[i]);
            t.barrier[i] += start[i + 1].saturating_sub(done[i]);
        }
        t.replays += 1;
        Ok(())
    }

    /// The traced mean ns per replay of each op kind, in first-seen order: (name,
    /// instructions, work, barrier). Empty when not traced.
    pub fn trace_summary(&self) -> Vec<(String, u32, f64, f64)> {
        let Ok(t) = self.trace.lock() else {
            return Vec::new();
        };
        if t.replays == 0 {
            return Vec::new();
        }
        let per = |v: u64| v as f64 / t.replays as f64;
        let mut out: Vec<(String, u32, f64, f64)> = Vec::new();
        for (i, ins) in self.instrs.iter().enumerate() {
            let name = op_name(ins);
            let (w, b) = (per(t.work[i]), per(t.barrier[i]));
            match out.iter_mut().find(|e| e.0 == name) {
                Some(e) => {
                    e.1 += 1;
                    e.2 += w;
                    e.3 += b;
                }
                None => out.push((name, 1, w, b)),
            }
        }
        out
    }
}

/// A readable name of an instruction's op, with its shape.
fn op_name(i: &Instr) -> String {
    const FORMATS: [&str; 3] = ["f32", "q4_1", "q8_0"];
    match i.op {
        OP_ROPE_ATT => "rope_attention_kv".into(),
        op if op >= OP_QM => {
            let k = op - OP_QM;
            format!(
                "qmatmul{}{} {} {}x{}",
                if k & 1 != 0 { "+norm" } else { "" },
                if k & 2 != 0 { "+swiglu" } else { "" },
                FORMATS[(k / 4).min(2) as usize],
                i.b,
                i.c
            )
        }
        op => format!("embedding {}", FORMATS[(op - OP_EMBED).min(2) as usize]),
    }
}

impl Drop for CudaProgram {
    fn drop(&mut self) {
        let s = self.trace_summary();
        if s.is_empty() {
            return;
        }
        let total: f64 = s.iter().map(|e| e.2 + e.3).sum();
        eprintln!(
            "rk_program trace: {} instructions, {:.1} us a replay on the device",
            self.instrs.len(),
            total / 1e3
        );
        for (name, n, work, barrier) in s {
            eprintln!(
                "  {name:<40} x{n:<4} {:>8.1} us = work {:.2} + barrier {:.2} us each ({:.0}%)",
                (work + barrier) / 1e3,
                work / 1e3 / n as f64,
                barrier / 1e3 / n as f64,
                100.0 * (work + barrier) / total
            );
        }
    }
}

impl Replay for CudaProgram {
    fn replay(&self) -> Result<()> {
        self.launch()
    }
    fn describe(&self) -> String {
        format!(
            "CUDA program: {} instructions in one launch of {} blocks",
            self.instrs.len(),
            self.grid
        )
    }
}
