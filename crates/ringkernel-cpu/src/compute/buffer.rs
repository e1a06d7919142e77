//! The CPU buffer type and deadlock-free locking of an op's buffers.

use ringkernel_core::compute::{downcast, DeviceBuffer};
use ringkernel_core::{BackendKind, Error, Result};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// An f32 buffer in host memory, owned by the CPU backend.
///
/// The storage sits behind a [`RwLock`], so ops running concurrently on different
/// threads never race: inputs are read-locked, the output write-locked, always in
/// address order (so two ops with crossed buffers cannot deadlock).
///
/// ```
/// use ringkernel_core::compute::ComputeBackend;
/// use ringkernel_cpu::compute::{CpuBuffer, CpuCompute};
/// let cpu = CpuCompute::new();
/// let buf = cpu.upload(&[1.0, 2.0]).unwrap();
/// let cpu_buf = buf.as_any().downcast_ref::<CpuBuffer>().unwrap();
/// assert_eq!(cpu_buf.to_vec(), vec![1.0, 2.0]);
/// ```
#[derive(Debug)]
pub struct CpuBuffer {
    len: usize,
    data: RwLock<Vec<f32>>,
}

impl CpuBuffer {
    /// Takes ownership of `data`.
    pub fn from_vec(data: Vec<f32>) -> Self {
        CpuBuffer {
            len: data.len(),
            data: RwLock::new(data),
        }
    }

    /// `len` zeros, or [`Error::Device`] when the memory cannot be had.
    pub fn zeros(len: usize) -> Result<Self> {
        let mut v = reserve(len)?;
        v.resize(len, 0.0);
        Ok(Self::from_vec(v))
    }

    /// A copy of `data`, or [`Error::Device`] when the memory cannot be had.
    pub fn from_slice(data: &[f32]) -> Result<Self> {
        let mut v = reserve(data.len())?;
        v.extend_from_slice(data);
        Ok(Self::from_vec(v))
    }

    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<f32> {
        self.read().clone()
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Vec<f32>> {
        // A poisoned lock only means another op panicked mid-write; the data is still
        // plain floats, so carry on.
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Vec<f32>> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }

    fn addr(&self) -> usize {
        self as *const Self as usize
    }
}

ringkernel_core::impl_device_buffer!(CpuBuffer, BackendKind::Cpu);

/// An empty vector with room for `len` elements; large ones are backed by transparent
/// huge pages where the OS offers them (as numpy does), which saves TLB misses when an
/// op streams through tens of megabytes.
fn reserve(len: usize) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|e| {
        Error::Device(format!(
            "cannot allocate {len} f32 elements on the host: {e}"
        ))
    })?;
    advise_huge_pages(&mut v);
    Ok(v)
}

/// Asks Linux to back the vector's (not yet touched) allocation with huge pages when it
/// is at least 4 MiB. Best effort: a refusal changes nothing.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn advise_huge_pages(v: &mut Vec<f32>) {
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    const MADV_HUGEPAGE: i32 = 14;
    const PAGE: usize = 4096;
    let bytes = v.capacity() * std::mem::size_of::<f32>();
    if bytes < 4 << 20 {
        return;
    }
    let start = v.as_mut_ptr() as usize;
    let first = start.div_ceil(PAGE) * PAGE;
    let end = (start + bytes) / PAGE * PAGE;
    if end > first {
        // SAFETY: `[first, end)` lies inside the vector's own allocation (`bytes` bytes
        // from its pointer) and is page-aligned, as madvise requires. MADV_HUGEPAGE only
        // changes how the kernel backs those pages, never their contents or validity;
        // the result is ignored because a refusal (THP disabled) is harmless.
        unsafe {
            madvise(first as *mut std::ffi::c_void, end - first, MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn advise_huge_pages(_v: &mut Vec<f32>) {}

/// Downcasts to [`CpuBuffer`] or [`Error::Device`].
pub(crate) fn cpu(buf: &dyn DeviceBuffer) -> Result<&CpuBuffer> {
    downcast::<CpuBuffer>(buf, BackendKind::Cpu)
}

/// The locks one op holds: its distinct inputs read-locked, its output write-locked.
pub(crate) struct Locked<'a> {
    reads: Vec<(usize, RwLockReadGuard<'a, Vec<f32>>)>,
    order: Vec<usize>,
    write: RwLockWriteGuard<'a, Vec<f32>>,
}

/// Locks `inputs` for reading and `out` for writing, in address order. An output that
/// is also an input is an [`Error::InvalidArgument`] (it would need an in-place op).
pub(crate) fn lock_buffers<'a>(inputs: &[&'a CpuBuffer], out: &'a CpuBuffer) -> Result<Locked<'a>> {
    if inputs.iter().any(|b| b.addr() == out.addr()) {
        return Err(Error::invalid(
            "the output buffer is also an input of the op; use a separate output buffer",
        ));
    }
    let mut uniq: Vec<&CpuBuffer> = inputs.to_vec();
    uniq.sort_by_key(|b| b.addr());
    uniq.dedup_by_key(|b| b.addr());
    let mut reads = Vec::with_capacity(uniq.len());
    let mut write = None;
    for b in uniq {
        if write.is_none() && out.addr() < b.addr() {
            write = Some(out.write());
        }
        reads.push((b.addr(), b.read()));
    }
    let write = write.unwrap_or_else(|| out.write());
    let order = inputs
        .iter()
        .map(|b| reads.iter().position(|(a, _)| *a == b.addr()).unwrap_or(0))
        .collect();
    Ok(Locked {
        reads,
        order,
        write,
    })
}

impl Locked<'_> {
    /// The inputs in the order given to [`lock`], and the output.
    pub(crate) fn parts(&mut self) -> (Vec<&[f32]>, &mut [f32]) {
        let ins = self
            .order
            .iter()
            .map(|&i| self.reads[i].1.as_slice())
            .collect();
        (ins, self.write.as_mut_slice())
    }
}

/// The locks of an op with several outputs: inputs read-locked, outputs write-locked,
/// all taken in address order.
pub(crate) struct LockedMany<'a> {
    reads: Vec<(usize, RwLockReadGuard<'a, Vec<f32>>)>,
    writes: Vec<(usize, RwLockWriteGuard<'a, Vec<f32>>)>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
}

/// Locks `inputs` for reading and `outputs` for writing, in address order. Outputs must
/// be distinct from each other and from every input ([`Error::InvalidArgument`]).
pub(crate) fn lock_many<'a>(
    inputs: &[&'a CpuBuffer],
    outputs: &[&'a CpuBuffer],
) -> Result<LockedMany<'a>> {
    for (i, o) in outputs.iter().enumerate() {
        if inputs
            .iter()
            .chain(&outputs[..i])
            .any(|b| b.addr() == o.addr())
        {
            return Err(Error::invalid(
                "an output buffer of the op is also one of its inputs or outputs; use \
                 separate buffers",
            ));
        }
    }
    let mut all: Vec<(&CpuBuffer, bool)> = inputs.iter().map(|b| (*b, false)).collect();
    all.extend(outputs.iter().map(|b| (*b, true)));
    all.sort_by_key(|(b, _)| b.addr());
    all.dedup_by_key(|(b, _)| b.addr());
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for (b, w) in all {
        if w {
            writes.push((b.addr(), b.write()));
        } else {
            reads.push((b.addr(), b.read()));
        }
    }
    let pos = |v: &[usize], a: usize| v.iter().position(|&x| x == a).unwrap_or(0);
    let read_addrs: Vec<usize> = reads.iter().map(|(a, _)| *a).collect();
    let write_addrs: Vec<usize> = writes.iter().map(|(a, _)| *a).collect();
    Ok(LockedMany {
        inputs: inputs.iter().map(|b| pos(&read_addrs, b.addr())).collect(),
        outputs: outputs
            .iter()
            .map(|b| pos(&write_addrs, b.addr()))
            .collect(),
        reads,
        writes,
    })
}

impl LockedMany<'_> {
    /// The inputs and the outputs, each in the order given to [`lock_many`].
    pub(crate) fn parts(&mut self) -> (Vec<&[f32]>, Vec<&mut [f32]>) {
        let ins = self
            .inputs
            .iter()
            .map(|&i| self.reads[i].1.as_slice())
            .collect();
        let mut slots: Vec<Option<&mut [f32]>> = self
            .writes
            .iter_mut()
            .map(|(_, g)| Some(g.as_mut_slice()))
            .collect();
        let outs = self
            .outputs
            .iter()
            .map(|&i| slots[i].take().unwrap_or_default())
            .collect();
        (ins, outs)
    }
}
