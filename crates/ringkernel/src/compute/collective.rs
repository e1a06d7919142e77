//! [`Collectives`]: NCCL collectives on [`Tensor`]s of several CUDA devices.

use super::{Device, Tensor};
use crate::{Error, Result};

/// NCCL collectives (all-reduce, all-gather, broadcast, send) over CUDA [`Device`]s of
/// this process, one NCCL communicator per GPU (`ringkernel_cuda::NcclGroup`, where
/// loading NCCL and its limits are documented). Tensor `i` of every call lives on
/// device `i`; results are new tensors, one per device, queued on each device's stream
/// after the work that made the inputs (no synchronisation in between).
///
/// Needs the `cuda` feature (else [`Error::BackendUnavailable`] "not compiled in") and
/// libnccl at run time (else [`Error::BackendUnavailable`] saying how to provide it).
/// Every device must be a distinct CUDA GPU ([`Error::InvalidArgument`]).
///
/// ```no_run
/// use ringkernel::compute::{Collectives, Device, Tensor};
/// let gpus = [Device::cuda(0)?, Device::cuda(1)?];
/// let nccl = Collectives::new(&gpus)?;
/// let parts = [
///     Tensor::from_slice(&gpus[0], &[1.0, 2.0], &[2])?,
///     Tensor::from_slice(&gpus[1], &[10.0, 20.0], &[2])?,
/// ];
/// let sums = nccl.all_reduce_sum(&parts)?;
/// assert_eq!(sums[1].to_vec()?, vec![11.0, 22.0]);
/// let all = nccl.all_gather(&parts)?;
/// assert_eq!(all[0].shape(), &[4]);
/// let on_gpu1 = nccl.send(&parts[0], 1)?;
/// assert_eq!(on_gpu1.device(), &gpus[1]);
/// # Ok::<(), ringkernel::Error>(())
/// ```
pub struct Collectives {
    devices: Vec<Device>,
    #[cfg(feature = "cuda")]
    group: ringkernel_cuda::NcclGroup,
}

impl std::fmt::Debug for Collectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collectives")
            .field("devices", &self.devices)
            .finish()
    }
}

impl Collectives {
    /// One communicator per device of `devices` (rank `i` is `devices[i]`).
    pub fn new(devices: &[Device]) -> Result<Self> {
        #[cfg(feature = "cuda")]
        {
            use crate::backends::Native;
            let computes = devices
                .iter()
                .enumerate()
                .map(|(i, d)| match d.native() {
                    Native::Cuda(c) => Ok((*c).clone()),
                    _ => Err(Error::invalid(format!(
                        "Collectives: device {i} is {d}, not a CUDA GPU (NCCL needs CUDA devices)"
                    ))),
                })
                .collect::<Result<Vec<_>>>()?;
            let group = ringkernel_cuda::NcclGroup::new(&computes)?;
            Ok(Collectives {
                devices: devices.to_vec(),
                group,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = devices;
            Err(Self::not_compiled())
        }
    }

    /// The devices, by rank.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Checks one tensor per rank, each on its rank's device, all of one shape; returns
    /// the shape.
    fn per_rank<'a>(&self, op: &str, tensors: &'a [Tensor]) -> Result<&'a [usize]> {
        if tensors.len() != self.devices.len() {
            return Err(Error::invalid(format!(
                "{op}: {} tensors given for {} devices (one per device)",
                tensors.len(),
                self.devices.len()
            )));
        }
        for (r, (t, d)) in tensors.iter().zip(&self.devices).enumerate() {
            if t.device() != d {
                return Err(Error::Device(format!(
                    "{op}: tensor {r} is on {}, not on device {r} ({d})",
                    t.device()
                )));
            }
            if t.shape() != tensors[0].shape() {
                return Err(Error::shape(format!(
                    "{op}: tensor {r} has shape {:?}, tensor 0 {:?}",
                    t.shape(),
                    tensors[0].shape()
                )));
            }
        }
        Ok(tensors[0].shape())
    }

    /// The rank of `device`.
    fn rank_of(&self, op: &str, device: &Device) -> Result<usize> {
        self.devices
            .iter()
            .position(|d| d == device)
            .ok_or_else(|| Error::Device(format!("{op}: {device} is not a device of this group")))
    }

    fn device(&self, rank: usize) -> Result<&Device> {
        self.devices.get(rank).ok_or_else(|| {
            Error::invalid(format!(
                "rank {rank} is not in this group of {} device(s)",
                self.devices.len()
            ))
        })
    }

    /// The element-wise sum of every rank's tensor, on every device.
    pub fn all_reduce_sum(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        let shape = self.per_rank("all_reduce_sum", tensors)?;
        let outs = self
            .devices
            .iter()
            .map(|d| Tensor::alloc(d, shape.to_vec()))
            .collect::<Result<Vec<_>>>()?;
        self.issue_all_reduce(tensors, &outs)?;
        Ok(outs)
    }

    /// Every rank's tensor, concatenated in rank order along the first axis (a scalar
    /// becomes a vector of one element per rank), on every device.
    pub fn all_gather(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        let shape = self.per_rank("all_gather", tensors)?;
        let mut out_shape = shape.to_vec();
        match out_shape.first_mut() {
            Some(d0) => *d0 *= self.devices.len(),
            None => out_shape.push(self.devices.len()),
        }
        let outs = self
            .devices
            .iter()
            .map(|d| Tensor::alloc(d, out_shape.clone()))
            .collect::<Result<Vec<_>>>()?;
        self.issue_all_gather(tensors, &outs)?;
        Ok(outs)
    }

    /// `tensor` (on device `root`) copied to every device; the root's entry is `tensor`
    /// itself.
    pub fn broadcast(&self, root: usize, tensor: &Tensor) -> Result<Vec<Tensor>> {
        if self.device(root)? != tensor.device() {
            return Err(Error::Device(format!(
                "broadcast: the tensor is on {}, not on the root device {root}",
                tensor.device()
            )));
        }
        let outs = self
            .devices
            .iter()
            .enumerate()
            .map(|(r, d)| {
                if r == root {
                    Ok(tensor.clone())
                } else {
                    Tensor::alloc(d, tensor.shape().to_vec())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        self.issue_broadcast(root, &outs)?;
        Ok(outs)
    }

    /// A copy of `tensor` (on one of the group's devices) on device `to`, through NCCL
    /// (GPU to GPU, no host hop).
    pub fn send(&self, tensor: &Tensor, to: usize) -> Result<Tensor> {
        let from = self.rank_of("send", tensor.device())?;
        let dst = Tensor::alloc(self.device(to)?, tensor.shape().to_vec())?;
        self.issue_send(tensor, from, &dst, to)?;
        Ok(dst)
    }
}

#[cfg(feature = "cuda")]
impl Collectives {
    fn issue_all_reduce(&self, ins: &[Tensor], outs: &[Tensor]) -> Result<()> {
        let (i, o) = (buffers(ins), buffers(outs));
        self.group.all_reduce_sum(&i, &o, ins[0].len())
    }
    fn issue_all_gather(&self, ins: &[Tensor], outs: &[Tensor]) -> Result<()> {
        let (i, o) = (buffers(ins), buffers(outs));
        self.group.all_gather(&i, &o, ins[0].len())
    }
    fn issue_broadcast(&self, root: usize, bufs: &[Tensor]) -> Result<()> {
        self.group.broadcast(root, &buffers(bufs), bufs[root].len())
    }
    fn issue_send(&self, src: &Tensor, from: usize, dst: &Tensor, to: usize) -> Result<()> {
        self.group
            .send(from, &**src.buffer(), to, &**dst.buffer(), src.len())
    }
}

#[cfg(feature = "cuda")]
fn buffers(ts: &[Tensor]) -> Vec<&dyn crate::core::compute::DeviceBuffer> {
    ts.iter().map(|t| &**t.buffer()).collect()
}

// Without the `cuda` feature no `Collectives` can be made (`new` fails), so these are
// never reached.
#[cfg(not(feature = "cuda"))]
impl Collectives {
    fn issue_all_reduce(&self, _: &[Tensor], _: &[Tensor]) -> Result<()> {
        Err(Self::not_compiled())
    }
    fn issue_all_gather(&self, _: &[Tensor], _: &[Tensor]) -> Result<()> {
        Err(Self::not_compiled())
    }
    fn issue_broadcast(&self, _: usize, _: &[Tensor]) -> Result<()> {
        Err(Self::not_compiled())
    }
    fn issue_send(&self, _: &Tensor, _: usize, _: &Tensor, _: usize) -> Result<()> {
        Err(Self::not_compiled())
    }
    fn not_compiled() -> Error {
        use crate::BackendKind::Cuda;
        Error::unavailable(Cuda, crate::backends::not_compiled_reason(Cuda))
    }
}
