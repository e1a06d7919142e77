//! [`NcclGroup`]: NCCL collectives across the GPUs of one process, on the buffers of
//! [`CudaCompute`]s, through cudarc's low-level NCCL bindings
//! (`cudarc::nccl::result`).
//!
//! One communicator per GPU (`ncclCommInitAll`, single process); every operation is
//! issued for all ranks inside one `ncclGroupStart`/`ncclGroupEnd`, each rank's part on
//! its [`CudaCompute`]'s stream. So collectives are ordered with the ops queued on that
//! backend (a matmul, then an all-reduce of its result, needs no synchronisation in
//! between), return once queued, and finish in stream order: read a result with
//! [`ComputeBackend::read`](ringkernel_core::compute::ComputeBackend::read) on that
//! backend, or wait with [`NcclGroup::synchronize`]. The buffers are f32 (the element
//! type of [`CudaBuffer`](crate::CudaBuffer)).
//!
//! ## Loading NCCL
//!
//! libnccl is opened at run time by cudarc, which looks for `libnccl.so` (and
//! `libnccl.so.1`, `.9` to `.13`) on the library path, not NCCL's own soname
//! `libnccl.so.2`. Without it every entry point is
//! [`Error::BackendUnavailable`] saying what was found and what to do, never a panic
//! ([`ensure_nccl`]). With PyTorch's wheels NCCL is in
//! `site-packages/nvidia/nccl/lib/libnccl.so.2`: link it as `libnccl.so` in a directory
//! on `LD_LIBRARY_PATH` (`scripts/multigpu.sh` does this).
//!
//! ## NVLink multicast
//!
//! [`ensure_nccl`] sets `NCCL_NVLS_ENABLE=0` before NCCL starts, whatever the
//! environment said: NVLink SHARP (multicast) stays off, as on shared machines it must (a
//! process using it can take the host's GPUs out of service). RingKernel never calls
//! `cuMulticastCreate` either.
//!
//! ## Limits
//!
//! Creating a group loads NCCL's kernels, and NCCL may allocate and free device memory
//! when connecting lazily or when a communicator is destroyed, which can wait for every
//! kernel of the device: with persistent kernels running ([`CudaRuntime`](crate::CudaRuntime)),
//! possibly forever. Create the group (and run each kind of collective once) before
//! launching persistent kernels, and drop it after they are gone.
//!
//! ```no_run
//! use ringkernel_core::compute::ComputeBackend;
//! use ringkernel_cuda::NcclGroup;
//! let group = NcclGroup::on_devices(&[0, 1])?;
//! let bufs = [group.compute(0)?.upload(&[1.0, 2.0])?, group.compute(1)?.upload(&[10.0, 20.0])?];
//! let refs: Vec<_> = bufs.iter().map(|b| &**b).collect();
//! group.all_reduce_sum_in_place(&refs, 2)?;
//! let mut out = [0.0f32; 2];
//! group.compute(1)?.read(&*bufs[1], 0, &mut out)?;
//! assert_eq!(out, [11.0, 22.0]);
//! # Ok::<(), ringkernel_core::Error>(())
//! ```

use crate::compute::CudaCompute;
use cudarc::nccl::result::{self as nccl, NcclError, NcclStatus};
use cudarc::nccl::sys;
use ringkernel_core::compute::{checks, DeviceBuffer};
use ringkernel_core::util::lock;
use ringkernel_core::{BackendKind, Error, Result};
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// NCCL's own soname, which cudarc does not try (see the [module docs](self)).
const NCCL_SONAME: &str = "libnccl.so.2";

fn unavailable(reason: impl Into<String>) -> Error {
    Error::unavailable(BackendKind::Cuda, reason)
}

/// The reason NCCL is unavailable, given whether NCCL's own soname loads.
fn missing_reason(soname_loads: bool) -> String {
    if soname_loads {
        format!(
            "NCCL is installed ({NCCL_SONAME} loads) but cudarc opens it as libnccl.so: link {NCCL_SONAME} \
             as libnccl.so in a directory on LD_LIBRARY_PATH (scripts/multigpu.sh does this)"
        )
    } else {
        "NCCL (libnccl) could not be loaded: install NCCL (e.g. the pip wheel nvidia-nccl-cu13) and put its \
         library, linked as libnccl.so, on LD_LIBRARY_PATH"
            .to_string()
    }
}

/// Checks once per process that the CUDA driver and libnccl load (and turns NVLink
/// multicast off, see the [module docs](self)).
/// [`Error::BackendUnavailable`] with the reason otherwise.
pub fn ensure_nccl() -> Result<()> {
    crate::driver::ensure_driver()?;
    static STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            if std::env::var_os("NCCL_NVLS_ENABLE").is_some_and(|v| v != "0") {
                tracing::warn!(
                    "NCCL_NVLS_ENABLE overridden to 0: RingKernel keeps NVLink multicast off"
                );
            }
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
            // SAFETY: is_culib_present only tries to dlopen cudarc's candidate names.
            if unsafe { sys::is_culib_present() } {
                return nccl::get_nccl_version()
                    .map(|_| ())
                    .map_err(|e| format!("ncclGetVersion failed: {}", describe(&e)));
            }
            // SAFETY: loading libnccl runs its initialisers, which have no
            // preconditions; the handle is dropped at once.
            let soname = unsafe { libloading::Library::new(NCCL_SONAME) }.is_ok();
            Err(missing_reason(soname))
        })
        .clone()
        .map_err(unavailable)
}

/// The NCCL version as `major.minor.patch` (e.g. "2.28.3").
pub fn nccl_version() -> Result<String> {
    ensure_nccl()?;
    let v = nccl::get_nccl_version().map_err(nccl_err("ncclGetVersion"))?;
    // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
}

/// NCCL's description of an error.
fn describe(e: &NcclError) -> String {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string (or null) for
    // any result code; libnccl is loaded (this is an error it returned).
    let s = unsafe { sys::ncclGetErrorString(e.0) };
    let text = if s.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { std::ffi::CStr::from_ptr(s) }
            .to_string_lossy()
            .into_owned()
    };
    format!("{:?} ({text})", e.0)
}

fn nccl_err(what: &str) -> impl FnOnce(NcclError) -> Error + '_ {
    move |e| Error::Device(format!("NCCL {what}: {}", describe(&e)))
}

/// One communicator.
struct Comm(sys::ncclComm_t);

// SAFETY: a communicator handle may be used from any thread; NcclGroup issues all its
// calls under one mutex, so a communicator is never used by two threads at once.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// A point-to-point copy of `len` elements from `src` (on rank `from`) to `dst` (on
/// rank `to`) through NCCL (see [`NcclGroup::p2p`]).
#[derive(Clone, Copy)]
pub struct Transfer<'a> {
    /// The sending rank.
    pub from: usize,
    /// The source buffer, of rank `from`'s backend.
    pub src: &'a dyn DeviceBuffer,
    /// The receiving rank.
    pub to: usize,
    /// The destination buffer, of rank `to`'s backend.
    pub dst: &'a dyn DeviceBuffer,
    /// Elements (f32) to copy, from the start of both buffers.
    pub len: usize,
}

impl std::fmt::Debug for Transfer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("len", &self.len)
            .finish()
    }
}

/// NCCL communicators over several GPUs of this process, one per [`CudaCompute`]
/// (rank `i` is `computes()[i]`). See the [module docs](self).
pub struct NcclGroup {
    comms: Vec<Comm>,
    computes: Vec<CudaCompute>,
    /// Serialises the issuing of operations (communicators are not thread-safe).
    issue: Mutex<()>,
}

impl std::fmt::Debug for NcclGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclGroup")
            .field(
                "devices",
                &self
                    .computes
                    .iter()
                    .map(|c| c.device_info().ordinal)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl NcclGroup {
    /// A group over `computes`, one communicator per GPU. The backends must be on
    /// distinct GPUs ([`Error::InvalidArgument`] otherwise, or for an empty list);
    /// [`Error::BackendUnavailable`] without libnccl ([`ensure_nccl`]).
    pub fn new(computes: &[CudaCompute]) -> Result<Self> {
        if computes.is_empty() {
            return Err(Error::invalid("an NCCL group needs at least one GPU"));
        }
        let ordinals: Vec<usize> = computes.iter().map(|c| c.device_info().ordinal).collect();
        for (i, o) in ordinals.iter().enumerate() {
            if ordinals[..i].contains(o) {
                return Err(Error::invalid(format!(
                    "GPU {o} appears twice in the NCCL group {ordinals:?} (one backend per GPU)"
                )));
            }
        }
        ensure_nccl()?;
        let n = computes.len();
        let devlist: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut raw: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); n];
        // SAFETY: `raw` has room for n communicators and `devlist` names n distinct,
        // existing devices (each backend opened its device).
        unsafe { nccl::comm_init_all(raw.as_mut_ptr(), n as i32, devlist.as_ptr()) }
            .map_err(nccl_err("ncclCommInitAll"))?;
        Ok(NcclGroup {
            comms: raw.into_iter().map(Comm).collect(),
            computes: computes.to_vec(),
            issue: Mutex::new(()),
        })
    }

    /// A group over GPUs `ordinals`, with a new [`CudaCompute`] on each
    /// ([`CudaCompute::new`]'s errors; a missing device is [`Error::InvalidArgument`]).
    pub fn on_devices(ordinals: &[usize]) -> Result<Self> {
        let computes = ordinals
            .iter()
            .map(|&o| CudaCompute::new(o))
            .collect::<Result<Vec<_>>>()?;
        Self::new(&computes)
    }

    /// Number of GPUs (ranks).
    pub fn len(&self) -> usize {
        self.computes.len()
    }

    /// Always false (a group has at least one GPU); for symmetry with [`Self::len`].
    pub fn is_empty(&self) -> bool {
        self.computes.is_empty()
    }

    /// The backend of rank `rank`; [`Error::InvalidArgument`] past the end.
    pub fn compute(&self, rank: usize) -> Result<&CudaCompute> {
        self.computes.get(rank).ok_or_else(|| self.bad_rank(rank))
    }

    /// Every rank's backend.
    pub fn computes(&self) -> &[CudaCompute] {
        &self.computes
    }

    /// The rank of `compute` (the same backend, not just the same GPU), if it is one.
    pub fn rank_of(&self, compute: &CudaCompute) -> Option<usize> {
        self.computes.iter().position(|c| c.same_backend(compute))
    }

    fn bad_rank(&self, rank: usize) -> Error {
        Error::invalid(format!(
            "rank {rank} is not in this NCCL group of {} GPU(s)",
            self.computes.len()
        ))
    }

    /// Checks that `bufs` holds one buffer per rank, each of that rank's backend and at
    /// least `need` elements long; returns their device addresses.
    fn per_rank(&self, what: &str, bufs: &[&dyn DeviceBuffer], need: usize) -> Result<Vec<u64>> {
        if bufs.len() != self.len() {
            return Err(Error::invalid(format!(
                "{what}: {} buffers given for {} ranks (one per rank)",
                bufs.len(),
                self.len()
            )));
        }
        bufs.iter()
            .enumerate()
            .map(|(r, b)| self.on_rank(what, r, *b, need))
            .collect()
    }

    /// The device address of `b`, checked to belong to rank `rank` and to hold `need`
    /// elements.
    fn on_rank(&self, what: &str, rank: usize, b: &dyn DeviceBuffer, need: usize) -> Result<u64> {
        let c = self.compute(rank)?;
        checks::range(b, 0, need, &format!("{what} (rank {rank})"))?;
        c.device_ptr_of(b)
    }

    /// Issues `each(rank, comm, stream)` for every rank inside one NCCL group call.
    fn grouped(
        &self,
        what: &str,
        mut each: impl FnMut(
            usize,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> std::result::Result<NcclStatus, NcclError>,
    ) -> Result<()> {
        for c in &self.computes {
            c.refuse_in_program(what)?;
        }
        let _issue = lock(&self.issue);
        nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
        let mut issued = Ok(());
        for (r, c) in self.comms.iter().enumerate() {
            let stream = self.computes[r].raw_stream() as sys::cudaStream_t;
            if let Err(e) = each(r, c.0, stream) {
                issued = Err(nccl_err(what)(e));
                break;
            }
        }
        // The group is always closed, also after a failed call inside it.
        let ended = nccl::group_end().map(|_| ()).map_err(nccl_err(what));
        issued.and(ended)
    }

    /// `recv[r] = Σ send[i]` over every rank `i`, element-wise for the first `len`
    /// elements (f32 sum). `send[r]` and `recv[r]` may be the same buffer (in place).
    /// One buffer per rank, of that rank's backend: [`Error::InvalidArgument`]
    /// for a wrong count, [`Error::ShapeMismatch`] for a buffer shorter than `len`,
    /// [`Error::Device`] for a buffer of another backend.
    pub fn all_reduce_sum(
        &self,
        send: &[&dyn DeviceBuffer],
        recv: &[&dyn DeviceBuffer],
        len: usize,
    ) -> Result<()> {
        let s = self.per_rank("all_reduce send", send, len)?;
        let d = self.per_rank("all_reduce recv", recv, len)?;
        if len == 0 {
            return Ok(());
        }
        self.grouped("ncclAllReduce", |r, comm, stream| {
            // SAFETY: both buffers belong to rank r's device and hold `len` f32 (checked
            // above); the operation runs in the order of rank r's stream, where the
            // buffers' frees are ordered too (so they outlive it).
            unsafe {
                nccl::all_reduce(
                    s[r] as *const c_void,
                    d[r] as *mut c_void,
                    len,
                    sys::ncclDataType_t::ncclFloat32,
                    sys::ncclRedOp_t::ncclSum,
                    comm,
                    stream,
                )
            }
        })
    }

    /// [`Self::all_reduce_sum`] with each rank's buffer as both input and output.
    pub fn all_reduce_sum_in_place(&self, bufs: &[&dyn DeviceBuffer], len: usize) -> Result<()> {
        self.all_reduce_sum(bufs, bufs, len)
    }

    /// `recv[r][i * len .. (i + 1) * len] = send[i][..len]` for every rank `i`: each
    /// rank gets everyone's `len` elements, in rank order. `recv[r]` must hold
    /// `len × ranks` elements and be a different buffer from `send[r]`
    /// ([`Error::InvalidArgument`]); the other errors as [`Self::all_reduce_sum`].
    pub fn all_gather(
        &self,
        send: &[&dyn DeviceBuffer],
        recv: &[&dyn DeviceBuffer],
        len: usize,
    ) -> Result<()> {
        let total = len.checked_mul(self.len()).ok_or_else(|| {
            Error::shape(format!(
                "all_gather: {len} × {} elements overflow",
                self.len()
            ))
        })?;
        let s = self.per_rank("all_gather send", send, len)?;
        let d = self.per_rank("all_gather recv", recv, total)?;
        if send.iter().zip(recv).any(|(a, b)| checks::same(*a, *b)) {
            return Err(Error::invalid(
                "all_gather: a rank's receive buffer must not be its send buffer",
            ));
        }
        if len == 0 {
            return Ok(());
        }
        self.grouped("ncclAllGather", |r, comm, stream| {
            // SAFETY: send holds `len` and recv `len × ranks` f32 of rank r's device
            // (checked above), distinct buffers; stream-ordered as in all_reduce_sum.
            unsafe {
                nccl::all_gather(
                    s[r] as *const c_void,
                    d[r] as *mut c_void,
                    len,
                    sys::ncclDataType_t::ncclFloat32,
                    comm,
                    stream,
                )
            }
        })
    }

    /// Copies the first `len` elements of `bufs[root]` into every other rank's
    /// `bufs[r]` (in place). Errors as [`Self::all_reduce_sum`];
    /// [`Error::InvalidArgument`] for a root past the end.
    pub fn broadcast(&self, root: usize, bufs: &[&dyn DeviceBuffer], len: usize) -> Result<()> {
        if root >= self.len() {
            return Err(self.bad_rank(root));
        }
        let p = self.per_rank("broadcast", bufs, len)?;
        if len == 0 {
            return Ok(());
        }
        let root_ptr = p[root];
        self.grouped("ncclBroadcast", |r, comm, stream| {
            // SAFETY: every buffer holds `len` f32 of its rank's device (checked above);
            // the root's send buffer is only read on the root (NCCL ignores it
            // elsewhere); stream-ordered as in all_reduce_sum.
            unsafe {
                nccl::broadcast(
                    root_ptr as *const c_void,
                    p[r] as *mut c_void,
                    len,
                    sys::ncclDataType_t::ncclFloat32,
                    root as i32,
                    comm,
                    stream,
                )
            }
        })
    }

    /// Copies the first `len` elements of `src` (rank `from`) into `dst` (rank `to`):
    /// an `ncclSend` on `from` and the matching `ncclRecv` on `to`, issued together.
    /// [`Error::InvalidArgument`] for a rank past the end or `from == to`.
    pub fn send(
        &self,
        from: usize,
        src: &dyn DeviceBuffer,
        to: usize,
        dst: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()> {
        self.p2p(&[Transfer {
            from,
            src,
            to,
            dst,
            len,
        }])
    }

    /// Several point-to-point copies issued in one NCCL group (so pairs that send to
    /// each other at once do not deadlock). Each as [`Self::send`]; all checks come
    /// before anything is issued.
    pub fn p2p(&self, transfers: &[Transfer<'_>]) -> Result<()> {
        let mut plan = Vec::with_capacity(transfers.len());
        for t in transfers {
            if t.from >= self.len() {
                return Err(self.bad_rank(t.from));
            }
            if t.to >= self.len() {
                return Err(self.bad_rank(t.to));
            }
            if t.from == t.to {
                return Err(Error::invalid(format!(
                    "send: rank {} to itself (use ComputeBackend::copy)",
                    t.from
                )));
            }
            let s = self.on_rank("send source", t.from, t.src, t.len)?;
            let d = self.on_rank("send destination", t.to, t.dst, t.len)?;
            if t.len > 0 {
                plan.push((t.from, s, t.to, d, t.len));
            }
        }
        if plan.is_empty() {
            return Ok(());
        }
        self.grouped("ncclSend/ncclRecv", |r, comm, stream| {
            for &(from, s, to, d, len) in &plan {
                if from == r {
                    // SAFETY: `s` holds `len` f32 of rank r's device (checked above);
                    // stream-ordered as in all_reduce_sum.
                    unsafe {
                        nccl::send(
                            s as *const c_void,
                            len,
                            sys::ncclDataType_t::ncclFloat32,
                            to as i32,
                            comm,
                            stream,
                        )
                    }?;
                }
                if to == r {
                    // SAFETY: `d` holds `len` f32 of rank r's device (checked above).
                    unsafe {
                        nccl::recv(
                            d as *mut c_void,
                            len,
                            sys::ncclDataType_t::ncclFloat32,
                            from as i32,
                            comm,
                            stream,
                        )
                    }?;
                }
            }
            Ok(NcclStatus::Success)
        })
    }

    /// Waits until everything queued on every rank's backend has finished.
    pub fn synchronize(&self) -> Result<()> {
        use ringkernel_core::compute::ComputeBackend;
        self.computes.iter().try_for_each(|c| c.synchronize())
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        // Let queued collectives finish first (destroying a communicator with work in
        // flight would wait inside NCCL anyway).
        let _ = self.synchronize();
        for c in self.comms.drain(..) {
            // SAFETY: each communicator was created by ncclCommInitAll and is destroyed
            // exactly once, with no operation of it in flight (synchronised above).
            if let Err(e) = unsafe { nccl::comm_destroy(c.0) } {
                tracing::warn!(error = %describe(&e), "ncclCommDestroy failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_library_reason_says_what_to_do() {
        let found = missing_reason(true);
        assert!(
            found.contains(NCCL_SONAME) && found.contains("LD_LIBRARY_PATH"),
            "{found}"
        );
        let absent = missing_reason(false);
        assert!(
            absent.contains("libnccl") && absent.contains("install"),
            "{absent}"
        );
    }
}
