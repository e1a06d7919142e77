//! Several GPUs of one host: [`CudaRuntimeGroup`] (persistent kernels on every GPU that
//! message each other on the GPU, over peer access) and [`peer_link`] (what two GPUs can
//! do to each other's memory). Collectives over NCCL are in [`crate::nccl`].
//!
//! ## Cross-GPU K2K
//!
//! A group holds one [`CudaRuntime`] per GPU, all sharing one
//! [`RuntimeCore`]: kernel ids and names are unique across the group, host-side routing
//! ([`RuntimeCore::deliver`], pub/sub) reaches every GPU, and a `KernelHandle` works the
//! same whichever GPU its kernel runs on.
//!
//! Each GPU keeps its own routing table (indexed by kernel id, see the
//! [runtime docs](crate::runtime)); a kernel of the group publishes its inbox in the
//! table of *every* GPU of the group when it starts (stores through peer access) and
//! withdraws it there when it terminates. So `rk_send_to` on GPU A reads the route from
//! A's own memory and writes the message's stamped units straight into the inbox in B's
//! memory: no host hop, one link crossing per message. The receiver polls its own
//! memory as for a local sender. Stamped units are self-validating, so the receiver
//! needs no fence from the sender; the inbox's reservation counter (a CAS by the
//! sender) and its head (read by senders for room) use system-scope atomics in group
//! kernels (`RK_K2K_SYSTEM`, see `kernels/ringkernel.cuh`).
//!
//! Every pair of GPUs of the group must have peer access **with native atomics**
//! (NVLink-class links; a PCIe peer link usually has no native atomics, and 16-byte
//! stores over it are not promised to arrive whole): otherwise [`CudaRuntimeGroup::new`]
//! is [`Error::BackendUnavailable`] naming the pair (use NCCL or host routing there).
//!
//! ## Limits
//!
//! * Module loads wait for running kernels (see the runtime docs), and a group's
//!   runtimes share that rule: [`CudaRuntimeGroup::preload`] handlers (on every GPU)
//!   before launching any kernel. Create [`NcclGroup`](crate::NcclGroup)s and
//!   [`CudaCompute`](crate::CudaCompute)s before launching kernels too.
//! * Kernel ids at or above [`MAX_DEVICE_ROUTES`](crate::runtime::MAX_DEVICE_ROUTES)
//!   get no route on any GPU.
//! * `shutdown` of any member terminates every kernel of the group (they share one core).
//!
//! ```no_run
//! # async fn demo() -> ringkernel_core::Result<()> {
//! use ringkernel_core::builtin::{Token, STAGE};
//! use ringkernel_core::options::LaunchOptions;
//! use ringkernel_core::registry::KernelRegistry;
//! use ringkernel_core::runtime::RingKernelRuntime;
//! use ringkernel_cuda::CudaRuntimeGroup;
//! let group = CudaRuntimeGroup::new(KernelRegistry::new(), &[0, 1]).await?;
//! // rk.stage on GPU 0 forwards to rk.stage on GPU 1, which replies to the host.
//! let a = group.runtime(0)?.launch(STAGE, LaunchOptions::default().with_name("a")).await?;
//! let b = group.runtime(1)?.launch(STAGE, LaunchOptions::default().with_name("b")).await?;
//! a.send(Token::routed(1, 0.5, &[a.id(), b.id()])?).await?;
//! let t: Token = b.receive_timeout_as(std::time::Duration::from_secs(5)).await?;
//! assert_eq!((t.hops, t.value), (2, 2.5));
//! group.shutdown().await?;
//! # Ok(()) }
//! ```

use crate::driver::Device;
use crate::runtime::CudaRuntime;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{RingKernelRuntime, RuntimeCore, ShutdownReport};
use ringkernel_core::{BackendKind, Error, Result};
use std::sync::Arc;

/// What GPU `from` can do to GPU `to`'s memory (see [`peer_link`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLink {
    /// The accessing GPU.
    pub from: usize,
    /// The GPU whose memory is accessed.
    pub to: usize,
    /// Whether `from` can read and write `to`'s memory directly
    /// (`cuDeviceCanAccessPeer`).
    pub access: bool,
    /// Whether `from`'s atomics on `to`'s memory are native (NVLink-class links).
    pub native_atomics: bool,
    /// The driver's relative performance rank of the link (higher is faster; 0 where
    /// there is no peer access).
    pub performance_rank: i32,
}

impl PeerLink {
    /// Whether cross-GPU K2K may use this link: peer access with native atomics.
    pub fn supports_k2k(&self) -> bool {
        self.access && self.native_atomics
    }
}

/// What GPU `from` can do to GPU `to`'s memory. [`Error::InvalidArgument`] for a
/// missing device or `from == to`; [`Error::BackendUnavailable`] without a driver.
pub fn peer_link(from: usize, to: usize) -> Result<PeerLink> {
    if from == to {
        return Err(Error::invalid(format!(
            "peer_link: GPU {from} and itself are no peers"
        )));
    }
    let (a, b) = (Device::open(from)?, Device::open(to)?);
    link(&a, &b)
}

fn link(a: &Device, b: &Device) -> Result<PeerLink> {
    let (access, native_atomics, performance_rank) = a.peer_attributes(b)?;
    Ok(PeerLink {
        from: a.info.ordinal,
        to: b.info.ordinal,
        access,
        native_atomics,
        performance_rank,
    })
}

/// Checks that `ordinals` name distinct devices and that every ordered pair of them can
/// carry cross-GPU K2K, then enables peer access both ways. Returns the open devices.
fn connect(ordinals: &[usize]) -> Result<Vec<Arc<Device>>> {
    if ordinals.is_empty() {
        return Err(Error::invalid("a GPU group needs at least one device"));
    }
    for (i, o) in ordinals.iter().enumerate() {
        if ordinals[..i].contains(o) {
            return Err(Error::invalid(format!(
                "GPU {o} appears twice in the group {ordinals:?}"
            )));
        }
    }
    let devs = ordinals
        .iter()
        .map(|&o| Device::open(o))
        .collect::<Result<Vec<_>>>()?;
    for a in &devs {
        for b in &devs {
            if Arc::ptr_eq(a, b) {
                continue;
            }
            let l = link(a, b)?;
            if !l.access {
                return Err(Error::unavailable(
                    BackendKind::Cuda,
                    format!(
                        "GPU {} cannot access GPU {}'s memory (no peer access): kernels on them cannot \
                         message each other on the GPU; use NCCL (NcclGroup) or host routing",
                        l.from, l.to
                    ),
                ));
            }
            if !l.native_atomics {
                return Err(Error::unavailable(
                    BackendKind::Cuda,
                    format!(
                        "GPU {} reaches GPU {}'s memory without native atomics (a PCIe peer link?): \
                         cross-GPU K2K needs an NVLink-class link; use NCCL (NcclGroup) or host routing",
                        l.from, l.to
                    ),
                ));
            }
        }
    }
    for a in &devs {
        for b in &devs {
            if !Arc::ptr_eq(a, b) {
                a.enable_peer_access(b)?;
            }
        }
    }
    Ok(devs)
}

/// Persistent-kernel runtimes on several GPUs of one host whose kernels send each
/// other K2K messages on the GPU (over peer access, no host hop). See the
/// [module docs](self).
pub struct CudaRuntimeGroup {
    runtimes: Vec<CudaRuntime>,
    core: Arc<RuntimeCore>,
    ordinals: Vec<usize>,
}

impl std::fmt::Debug for CudaRuntimeGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntimeGroup")
            .field("ordinals", &self.ordinals)
            .finish()
    }
}

impl CudaRuntimeGroup {
    /// One runtime on each GPU of `ordinals` (rank `i` runs on GPU `ordinals[i]`),
    /// sharing one core and `registry` (the CUDA built-ins are added as by
    /// [`CudaRuntime::with_registry`]).
    ///
    /// [`Error::InvalidArgument`] for an empty list, a repeated or missing device;
    /// [`Error::BackendUnavailable`] without a driver, NVRTC, or peer access with native
    /// atomics between every pair (the message names the pair).
    pub async fn new(registry: KernelRegistry, ordinals: &[usize]) -> Result<Self> {
        // Peer access (and access to each other's memory pools) before any runtime
        // allocates the memory its peers will write.
        let devs = connect(ordinals)?;
        // One GPU: a plain runtime (GPU-scope K2K); several: one shared core.
        let multi = ordinals.len() > 1;
        let shared = multi.then(|| RuntimeCore::new(BackendKind::Cuda, registry.clone()));
        let mut runtimes = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let rt = CudaRuntime::open(registry.clone(), o, shared.clone()).await?;
            runtimes.push(rt);
        }
        // Each runtime retains its device's context (with its peer access) itself now.
        drop(devs);
        let core = runtimes[0].core().clone();
        if multi {
            let tables: Vec<u64> = runtimes.iter().map(CudaRuntime::routes_ptr).collect();
            for (i, rt) in runtimes.iter().enumerate() {
                let others: Vec<u64> = tables
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, &t)| t)
                    .collect();
                rt.set_peer_tables(&others)?;
            }
        }
        Ok(CudaRuntimeGroup {
            runtimes,
            core,
            ordinals: ordinals.to_vec(),
        })
    }

    /// A group over every GPU of the machine ([`device_count`](crate::device_count)).
    pub async fn all(registry: KernelRegistry) -> Result<Self> {
        let n = crate::device_count()?;
        let ordinals: Vec<usize> = (0..n).collect();
        Self::new(registry, &ordinals).await
    }

    /// The runtime of rank `rank` (on GPU `ordinals()[rank]`);
    /// [`Error::InvalidArgument`] past the end.
    pub fn runtime(&self, rank: usize) -> Result<&CudaRuntime> {
        self.runtimes.get(rank).ok_or_else(|| {
            Error::invalid(format!(
                "rank {rank} is not in this group of {} GPU(s)",
                self.runtimes.len()
            ))
        })
    }

    /// Every runtime, by rank.
    pub fn runtimes(&self) -> &[CudaRuntime] {
        &self.runtimes
    }

    /// The GPU ordinal of each rank.
    pub fn ordinals(&self) -> &[usize] {
        &self.ordinals
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.runtimes.len()
    }

    /// Always false (a group has at least one GPU); for symmetry with [`Self::len`].
    pub fn is_empty(&self) -> bool {
        self.runtimes.is_empty()
    }

    /// The core every runtime of the group shares (kernel table, ids, clock, broker).
    pub fn core(&self) -> &Arc<RuntimeCore> {
        &self.core
    }

    /// Loads `handler`'s persistent-kernel module on every GPU of the group, so kernels
    /// can be launched in any order later (module loads wait for running kernels).
    pub fn preload(&self, handler: &str) -> Result<()> {
        self.runtimes.iter().try_for_each(|rt| rt.preload(handler))
    }

    /// Terminates every kernel of the group (on every GPU).
    pub async fn shutdown(&self) -> Result<ShutdownReport> {
        self.core.terminate_all().await
    }
}

impl Drop for CudaRuntimeGroup {
    fn drop(&mut self) {
        // Kernels write into other GPUs' memory: every kernel of every GPU exits before
        // any runtime (and its memory) goes.
        for rt in &self.runtimes {
            rt.stop_kernels();
        }
    }
}
