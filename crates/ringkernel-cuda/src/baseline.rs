//! The comparison point for persistent kernels: one kernel launch per message.
//!
//! [`LaunchBaseline`] does what a non-persistent GPU actor has to do for every
//! message: write the request into a slot of mapped host memory, launch a kernel that
//! handles it (rk.echo's transformation of a [`Token`]), wait for the stream, read the
//! reply. [`LaunchBaseline::round_trip_graph`] replays the same launch from a captured
//! CUDA graph. The benchmark (`examples/cuda_bench.rs`) times these next to the
//! persistent kernel's round trip.

use crate::driver::{dev_err, Device, MappedMemory, Module, Stream};
use cudarc::driver::{result as cu, sys};
use ringkernel_core::builtin::Token;
use ringkernel_core::message::{
    read_slot, write_slot, MessageHeader, RingMessage, DEFAULT_SLOT_SIZE,
};
use ringkernel_core::{Error, Result};
use std::ffi::c_void;
use std::sync::Arc;

const SRC: &str = include_str!("../kernels/baseline.cu");

/// Launch-per-message echo of a [`Token`] (see the [module docs](self)).
pub struct LaunchBaseline {
    // Drop order: graph handles, then memory, module and stream.
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    func: sys::CUfunction,
    mem: MappedMemory,
    _module: Module,
    stream: Stream,
    dev: Arc<Device>,
}

// SAFETY: the raw handles are immutable after construction and usable from any thread
// with the context current (every method binds it first).
unsafe impl Send for LaunchBaseline {}

impl std::fmt::Debug for LaunchBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchBaseline")
            .field("device", &self.dev.info.name)
            .finish()
    }
}

impl LaunchBaseline {
    /// Compiles the baseline kernel for device `ordinal` and captures its graph.
    pub fn new(ordinal: usize) -> Result<Self> {
        let dev = Device::open(ordinal)?;
        let src = format!(
            "{}\n{}\n{}",
            crate::runtime::HEADER_SRC,
            crate::runtime::TOKEN_SRC,
            SRC
        );
        let cubin =
            crate::nvrtc::compile_cubin(&src, "baseline", dev.info.cc, dev.info.driver_version)?;
        let module = dev.load_module(&cubin)?;
        let func = module.function("rk_baseline_echo")?;
        let stream = dev.new_stream()?;
        let mem = MappedMemory::new(&dev, 2 * DEFAULT_SLOT_SIZE)?;
        let (mut pin, mut pout) = (
            mem.device_ptr(),
            mem.device_ptr() + DEFAULT_SLOT_SIZE as u64,
        );
        let mut args = [
            &mut pin as *mut u64 as *mut c_void,
            &mut pout as *mut u64 as *mut c_void,
        ];
        // SAFETY: valid stream; thread-local capture; the captured launch's arguments
        // are copied into the graph when it is recorded.
        unsafe {
            cu::stream::begin_capture(
                stream.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(dev_err("begin capture"))?;
        // SAFETY: rk_baseline_echo takes two byte pointers; both point into `mem`
        // (one slot each), which outlives the graph.
        let launched =
            unsafe { cu::launch_kernel(func, (1, 1, 1), (32, 1, 1), 0, stream.raw, &mut args) };
        // SAFETY: ends the capture begun above.
        let graph =
            unsafe { cu::stream::end_capture(stream.raw) }.map_err(dev_err("end capture"))?;
        launched.map_err(dev_err("capture launch"))?;
        // SAFETY: graph was just captured.
        let exec = unsafe { cu::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
            .map_err(dev_err("instantiate graph"))?;
        Ok(LaunchBaseline {
            graph,
            exec,
            func,
            mem,
            _module: module,
            stream,
            dev,
        })
    }

    fn write_request(&self, t: &Token, id: u64) -> Result<()> {
        let mut h = MessageHeader::new(Token::TYPE_ID, std::mem::size_of::<Token>());
        h.message_id = id;
        // SAFETY: the first slot of `mem` is DEFAULT_SLOT_SIZE bytes and no kernel runs
        // now (every round trip ends with a stream synchronisation).
        let slot =
            unsafe { std::slice::from_raw_parts_mut(self.mem.host_ptr(), DEFAULT_SLOT_SIZE) };
        write_slot(slot, &h, bytemuck::bytes_of(t))
    }

    fn read_reply(&self) -> Result<Token> {
        // SAFETY: the second slot; the kernel that wrote it has finished (synchronised).
        let slot = unsafe {
            std::slice::from_raw_parts(
                self.mem.host_ptr().add(DEFAULT_SLOT_SIZE),
                DEFAULT_SLOT_SIZE,
            )
        };
        read_slot(slot)?.decode::<Token>()
    }

    /// One message: write, launch, synchronise, read.
    pub fn round_trip_launch(&self, t: &Token, id: u64) -> Result<Token> {
        self.dev.bind()?;
        self.write_request(t, id)?;
        let (mut pin, mut pout) = (
            self.mem.device_ptr(),
            self.mem.device_ptr() + DEFAULT_SLOT_SIZE as u64,
        );
        let mut args = [
            &mut pin as *mut u64 as *mut c_void,
            &mut pout as *mut u64 as *mut c_void,
        ];
        // SAFETY: as in `new`: two pointers into `mem`.
        unsafe {
            cu::launch_kernel(
                self.func,
                (1, 1, 1),
                (32, 1, 1),
                0,
                self.stream.raw,
                &mut args,
            )
        }
        .map_err(dev_err("launch"))?;
        self.stream.synchronize()?;
        self.read_reply()
    }

    /// One message: write, replay the captured graph, synchronise, read.
    pub fn round_trip_graph(&self, t: &Token, id: u64) -> Result<Token> {
        self.dev.bind()?;
        self.write_request(t, id)?;
        // SAFETY: valid executable graph and stream of this context.
        unsafe { cu::graph::launch(self.exec, self.stream.raw) }
            .map_err(dev_err("graph launch"))?;
        self.stream.synchronize()?;
        self.read_reply()
    }
}

impl Drop for LaunchBaseline {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            let _ = self.stream.synchronize();
            // SAFETY: destroys the graph handles created in new, exactly once, after the
            // stream has finished every replay.
            unsafe {
                let _ = cu::graph::exec_destroy(self.exec);
                let _ = cu::graph::destroy(self.graph);
            }
        }
    }
}

/// Checks a baseline reply (for the benchmark's sanity check).
pub fn check_echo(req: &Token, reply: &Token) -> Result<()> {
    if reply.value == req.value * 2.0 && reply.hops == req.hops + 1 && reply.id == req.id {
        Ok(())
    } else {
        Err(Error::Device(format!(
            "baseline echo returned {reply:?} for {req:?}"
        )))
    }
}

/// The host link's copy bandwidth of device `ordinal` in bytes per second, `(host to
/// device, device to host)`: the best of five copies of `bytes` between pinned host
/// memory and device memory (what a persistent kernel's queues in pinned memory can
/// move at most). The streaming benchmark reports its traffic as a fraction of it.
pub fn host_link_bandwidth(ordinal: usize, bytes: usize) -> Result<(f64, f64)> {
    let dev = Device::open(ordinal)?;
    let stream = Arc::new(dev.new_stream()?);
    let host = MappedMemory::new(&dev, bytes)?;
    let device = crate::driver::DeviceMemory::zeroed(&stream, bytes)?;
    stream.synchronize()?;
    // SAFETY: `host` is `bytes` of pinned memory this function owns; the slice is only
    // handed to the copies below, which are waited for before it is dropped.
    let buf = unsafe { std::slice::from_raw_parts_mut(host.host_ptr(), bytes) };
    let mut best = [f64::MAX; 2];
    for _ in 0..5 {
        for (dir, b) in best.iter_mut().enumerate() {
            let t = std::time::Instant::now();
            // SAFETY: both ranges are `bytes` long and stay alive until the stream
            // synchronises right after.
            let r = unsafe {
                if dir == 0 {
                    cu::memcpy_htod_async(device.ptr(), &buf[..], stream.raw)
                } else {
                    cu::memcpy_dtoh_async(&mut buf[..], device.ptr(), stream.raw)
                }
            };
            r.map_err(dev_err("bandwidth copy"))?;
            stream.synchronize()?;
            *b = b.min(t.elapsed().as_secs_f64());
        }
    }
    if best.iter().any(|&s| s <= 0.0) {
        return Err(Error::Device(
            "bandwidth copies took no measurable time".into(),
        ));
    }
    Ok((bytes as f64 / best[0], bytes as f64 / best[1]))
}
