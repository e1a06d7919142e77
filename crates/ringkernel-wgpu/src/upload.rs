//! Upload buffers of the drain passes: host memory the drain engine writes a pass's
//! input slots and parameters into, which the pass copies to the device.
//!
//! wgpu offers only buffers it maps itself (`Upload::Mapped`). On Vulkan it places a
//! buffer mapped for writing in device-local, host-visible memory where the driver has
//! one: on a discrete NVIDIA GPU the PCIe BAR, which the CPU writes across the bus at a
//! few GB/s (about 7 GB/s on an H200 host, BENCHMARKS.md), and it must be mapped again
//! (`map_async`) after every pass. Where the device is Vulkan, the runtime instead
//! allocates its upload buffers itself (`Upload::Host`): ordinary host memory
//! (host-visible, coherent, cached where the driver offers it, and on a discrete GPU
//! never device-local; one allocation for all of a kernel's upload buffers), mapped
//! once for the buffers' life and handed to wgpu as buffers it copies from. The CPU
//! then writes at cache speed and the device's copy engine moves the bytes across the
//! bus. These buffers can also be bound for storage: a *compact* pass
//! ([`DrainTarget::stage_compact`](ringkernel_drain::engine::DrainTarget::stage_compact))
//! binds its upload buffer as its input, and the shader reads the requests from host
//! memory itself, with no copy into the input ring.
//!
//! [`UPLOAD_ENV`] chooses: `mapped` keeps wgpu's buffers; anything else (or unset)
//! takes host memory where the device is Vulkan and offers a fitting memory type.

use ringkernel_core::util::lock;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Environment variable: `mapped` makes the runtime's upload buffers wgpu's own mapped
/// buffers; unset or anything else, host memory where the device allows
/// ([module docs](self)).
pub const UPLOAD_ENV: &str = "RINGKERNEL_WGPU_UPLOAD";

/// Whether [`UPLOAD_ENV`]'s value (`None`: unset) asks for host-memory uploads.
pub(crate) fn host_uploads_wanted(env: Option<&str>) -> bool {
    env.is_none_or(|v| !v.trim().eq_ignore_ascii_case("mapped"))
}

/// An upload buffer (see the [module docs](self)).
pub(crate) enum Upload {
    /// A wgpu buffer with `MAP_WRITE | COPY_SRC`, mapped while it is free.
    Mapped(wgpu::Buffer),
    /// Host memory mapped for the buffer's life.
    Host(HostBuffer),
}

/// Host memory the device copies from, mapped for as long as `buf` lives.
#[cfg_attr(any(target_arch = "wasm32", target_vendor = "apple"), allow(dead_code))]
pub(crate) struct HostBuffer {
    pub(crate) buf: wgpu::Buffer,
    ptr: NonNull<u8>,
    len: usize,
    /// The drain bind group with this buffer as the pass's input (binding 2), for
    /// compact passes ([`DrainTarget::stage_compact`](ringkernel_drain::engine::DrainTarget::stage_compact)):
    /// set by the runtime once the kernel's buffers exist.
    pub(crate) bind: Option<wgpu::BindGroup>,
}

// SAFETY: `ptr` addresses `len` bytes of host memory that stays allocated and mapped
// while `buf` lives (it is freed only after wgpu has destroyed every buffer bound to
// it, once they are dropped and the device is done with them: `HostBlock`). The bytes
// are written only by the holder of the `Upload`, once it is out of the pool (a pool
// hands each buffer to one pass at a time): through `fill` (`&mut`), or through
// `host_ptr`'s pointer by the engine filling the pass it was staged for (an unsafe
// write whose caller answers for it). So moving the handle between threads is sound.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; `&HostBuffer` itself reads and writes none of the bytes.
unsafe impl Sync for HostBuffer {}

impl Upload {
    /// The buffer a pass copies from.
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        match self {
            Upload::Mapped(b) => b,
            Upload::Host(h) => &h.buf,
        }
    }

    /// The host address of the buffer's first byte, where it stays writable while
    /// the buffer is free (`Host` only).
    pub(crate) fn host_ptr(&self) -> Option<NonNull<u8>> {
        match self {
            Upload::Mapped(_) => None,
            Upload::Host(h) => Some(h.ptr),
        }
    }

    /// Runs `f` with a writer of the first `len` bytes of the buffer (`put(at, bytes)`
    /// copies `bytes` to offset `at`, inside those `len`), then leaves them ready for
    /// the device to copy (a mapped buffer is unmapped).
    pub(crate) fn fill(
        &mut self,
        len: usize,
        f: impl FnOnce(&mut dyn FnMut(usize, &[u8])),
    ) -> std::result::Result<(), String> {
        match self {
            Upload::Mapped(buf) => {
                {
                    let mut view = buf
                        .get_mapped_range_mut(..len as u64)
                        .map_err(|e| e.to_string())?;
                    f(&mut |at, bytes| view.slice(at..at + bytes.len()).copy_from_slice(bytes));
                }
                buf.unmap();
                Ok(())
            }
            Upload::Host(h) => {
                if len > h.len {
                    return Err(format!("{len} bytes into an upload buffer of {}", h.len));
                }
                // SAFETY: `ptr` addresses `h.len >= len` writable bytes of mapped host
                // memory (see `HostBuffer`); `&mut self` is the only access to them, and
                // no pass uses the buffer while it is out of the pool.
                let dst = unsafe { std::slice::from_raw_parts_mut(h.ptr.as_ptr(), len) };
                f(&mut |at, bytes| dst[at..at + bytes.len()].copy_from_slice(bytes));
                Ok(())
            }
        }
    }

    /// Returns the buffer to `pool` once its pass is over: a mapped one is mapped for
    /// writing again first (a failed map drops it: the pool then has one buffer fewer,
    /// and a pass that finds none writes through the queue).
    pub(crate) fn recycle(self, pool: Arc<Mutex<Vec<Upload>>>) {
        match self {
            Upload::Mapped(buf) => {
                let b = buf.clone();
                buf.map_async(wgpu::MapMode::Write, .., move |r| {
                    if r.is_ok() {
                        lock(&pool).push(Upload::Mapped(b));
                    }
                });
            }
            host @ Upload::Host(_) => lock(&pool).push(host),
        }
    }
}

/// `count` upload buffers of `size` bytes each: host memory where `host` (the
/// [`UPLOAD_ENV`] choice) and the device allow, else wgpu's mapped buffers (mapped
/// at creation).
pub(crate) fn upload_buffers(
    dev: &wgpu::Device,
    count: usize,
    size: u64,
    discrete: bool,
    host: bool,
) -> Vec<Upload> {
    if host && count > 0 {
        if let Some(bufs) = host_buffers(dev, count, size, discrete) {
            return bufs.into_iter().map(Upload::Host).collect();
        }
    }
    (0..count)
        .map(|_| {
            Upload::Mapped(dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("rk upload"),
                size,
                usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            }))
        })
        .collect()
}

/// What [`pick_host_type`] reads of a Vulkan memory type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(any(target_arch = "wasm32", target_vendor = "apple"), allow(dead_code))]
pub(crate) struct MemoryType {
    pub host_visible: bool,
    pub host_coherent: bool,
    pub host_cached: bool,
    pub device_local: bool,
    /// Lazily allocated or protected: never mappable memory for us.
    pub special: bool,
}

/// The memory type for a host upload buffer among `types` (those allowed by the bit
/// mask `allowed`): host-visible and coherent, cached where one is, and on a discrete
/// GPU not device-local (that is the BAR, what this avoids). `None`: no such type.
#[cfg_attr(any(target_arch = "wasm32", target_vendor = "apple"), allow(dead_code))]
pub(crate) fn pick_host_type(types: &[MemoryType], allowed: u32, discrete: bool) -> Option<u32> {
    let fits = |i: usize, t: &MemoryType| {
        i < 32
            && allowed & (1 << i) != 0
            && t.host_visible
            && t.host_coherent
            && !t.special
            && !(discrete && t.device_local)
    };
    let find = |cached: bool| {
        types
            .iter()
            .enumerate()
            .find(|(i, t)| fits(*i, t) && (!cached || t.host_cached))
            .map(|(i, _)| i as u32)
    };
    find(true).or_else(|| find(false))
}

/// Host memory a kernel's upload buffers share: one allocation, freed when the last of
/// them is destroyed (each holds it, see `host_buffers`).
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
struct HostBlock {
    device: ash::Device,
    memory: ash::vk::DeviceMemory,
}

#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
impl Drop for HostBlock {
    fn drop(&mut self) {
        // SAFETY: every buffer bound to `memory` was destroyed before its hold on this
        // block was dropped (see `host_buffers`), so nothing uses the memory; freeing a
        // mapped allocation unmaps it.
        unsafe { self.device.free_memory(self.memory, None) };
    }
}

/// `count` upload buffers of `size` bytes each in one allocation of host memory (the
/// [module docs](self)), mapped once; `None` where the device is not Vulkan or offers
/// no fitting memory type, or a Vulkan call fails (nothing is left allocated then).
/// One allocation for the kernel, not one a buffer: drivers limit allocations (the
/// Vulkan minimum is 4,096), and each costs a call into the kernel driver.
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
fn host_buffers(
    dev: &wgpu::Device,
    count: usize,
    size: u64,
    discrete: bool,
) -> Option<Vec<HostBuffer>> {
    use ash::vk;
    use wgpu::hal::api::Vulkan;
    let len = usize::try_from(size).ok()?;
    let (hal_buffers, base, stride) = {
        // SAFETY: the guard is used only to create, bind and map objects of our own and
        // is dropped before they are handed to wgpu; nothing wgpu owns is destroyed
        // through it.
        let hal = unsafe { dev.as_hal::<Vulkan>() }?;
        let raw = hal.raw_device();
        let instance = hal.shared_instance().raw_instance();
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::STORAGE_BUFFER)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let mut buffers: Vec<vk::Buffer> = Vec::with_capacity(count);
        // Destroys what was made so far (on a failure, before any memory is bound).
        let undo = |buffers: &[vk::Buffer]| {
            for &b in buffers {
                // SAFETY: each is ours, unused by any queue.
                unsafe { raw.destroy_buffer(b, None) };
            }
        };
        for _ in 0..count {
            // SAFETY: a valid create info on the device's own handle.
            match unsafe { raw.create_buffer(&info, None) } {
                Ok(b) => buffers.push(b),
                Err(_) => {
                    undo(&buffers);
                    return None;
                }
            }
        }
        // Buffers of one create info have the same requirements.
        // SAFETY: `buffers[0]` was just created on `raw` (`count > 0`).
        let req = unsafe { raw.get_buffer_memory_requirements(buffers[0]) };
        let stride = req.size.checked_next_multiple_of(req.alignment.max(1));
        let total = stride.and_then(|s| s.checked_mul(count as u64));
        // SAFETY: the physical device of this logical device.
        let props =
            unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
        let types: Vec<MemoryType> = props
            .memory_types_as_slice()
            .iter()
            .map(|t| {
                let f = t.property_flags;
                MemoryType {
                    host_visible: f.contains(vk::MemoryPropertyFlags::HOST_VISIBLE),
                    host_coherent: f.contains(vk::MemoryPropertyFlags::HOST_COHERENT),
                    host_cached: f.contains(vk::MemoryPropertyFlags::HOST_CACHED),
                    device_local: f.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL),
                    special: f.intersects(
                        vk::MemoryPropertyFlags::LAZILY_ALLOCATED
                            | vk::MemoryPropertyFlags::PROTECTED,
                    ),
                }
            })
            .collect();
        let memory = pick_host_type(&types, req.memory_type_bits, discrete)
            .zip(total.zip(stride))
            .and_then(|(index, (total, stride))| {
                let alloc = vk::MemoryAllocateInfo::default()
                    .allocation_size(total)
                    .memory_type_index(index);
                // SAFETY: a valid allocate info for a type the buffers allow.
                let memory = unsafe { raw.allocate_memory(&alloc, None) }.ok()?;
                Some((memory, stride))
            });
        let Some((memory, stride)) = memory else {
            undo(&buffers);
            return None;
        };
        // From here on the block frees the memory when the last buffer lets go of it
        // (or now, on a failure below, once the buffers are destroyed).
        let block = Arc::new(HostBlock {
            device: raw.clone(),
            memory,
        });
        // SAFETY: buffer `i` is bound at `i · stride`, a multiple of the required
        // alignment, with `req.size` bytes left for it (`total = count · stride`); a
        // host-visible allocation is mapped until it is freed.
        let mapped = unsafe {
            buffers
                .iter()
                .enumerate()
                .try_for_each(|(i, &b)| raw.bind_buffer_memory(b, memory, i as u64 * stride))
                .and_then(|()| {
                    raw.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                })
        };
        // The buffers' offsets in the mapping as `usize`, checked before any buffer is
        // handed to wgpu-hal (whose handles a failure after that point would leak).
        let stride_host = usize::try_from(stride).ok();
        let Some((base, stride)) = mapped
            .ok()
            .and_then(|p| NonNull::new(p.cast::<u8>()))
            .zip(stride_host)
        else {
            undo(&buffers);
            drop(block);
            return None;
        };
        let hal_buffers: Vec<_> = buffers
            .into_iter()
            .map(|b| {
                let hold = block.clone();
                let release: wgpu::hal::DropCallback = Box::new(move || {
                    // SAFETY: wgpu-hal runs this when wgpu destroys its buffer over `b`
                    // (after the device is done with it): nothing uses the handle any
                    // more. The memory goes with the last hold.
                    unsafe { hold.device.destroy_buffer(b, None) };
                    drop(hold);
                });
                // SAFETY: `b` is ours and bound to memory `release` keeps alive;
                // wgpu-hal neither destroys it nor maps it (its usage below has no MAP
                // flag), and runs `release` once, when the buffer is destroyed.
                unsafe { wgpu::hal::vulkan::Buffer::from_raw_externally_owned(b, release) }
            })
            .collect();
        (hal_buffers, base, stride)
    };
    Some(
        hal_buffers
            .into_iter()
            .enumerate()
            .map(|(i, hal_buffer)| {
                // SAFETY: `hal_buffer` was created on this device's handle with exactly
                // this size and the `TRANSFER_SRC` and `STORAGE_BUFFER` usages (what
                // `COPY_SRC` and `STORAGE` need), is bound
                // to memory and non-empty (the caller's passes are at least one slot);
                // its bytes count as initialised (host memory the engine writes before
                // every copy).
                let buf = unsafe {
                    dev.create_buffer_from_hal::<Vulkan>(
                        hal_buffer,
                        &wgpu::BufferDescriptor {
                            label: Some("rk upload (host)"),
                            size,
                            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::STORAGE,
                            mapped_at_creation: false,
                        },
                    )
                };
                HostBuffer {
                    bind: None,
                    buf,
                    // SAFETY: buffer `i`'s bytes start `i · stride` into the mapped
                    // allocation, inside it (`i · stride < count · stride = total`).
                    ptr: unsafe { base.add(i * stride) },
                    len,
                }
            })
            .collect(),
    )
}

#[cfg(any(target_arch = "wasm32", target_vendor = "apple"))]
fn host_buffers(
    _dev: &wgpu::Device,
    _count: usize,
    _size: u64,
    _discrete: bool,
) -> Option<Vec<HostBuffer>> {
    None
}

#[cfg(test)]
mod tests {
    use super::{host_uploads_wanted, pick_host_type, upload_buffers, MemoryType, Upload};
    use ringkernel_core::util::SplitMix64;
    use std::sync::{Arc, Mutex};

    /// Writes fresh random bytes into each upload buffer of a pool (host memory where
    /// `host`), copies them to a device buffer, and reads them back; twice, the second
    /// time through buffers that went back to the pool after the first pass.
    #[test]
    fn uploads_reach_the_device_intact_and_are_reused() {
        let Some(ctx) = crate::test_context() else {
            return;
        };
        let dev = &ctx.device;
        let len = 4096 + 48;
        let vulkan = ctx.info.backend == "Vulkan";
        let mut rng = SplitMix64::new(0x5EED_u64 ^ std::process::id() as u64);
        for host in [true, false] {
            let pool = Arc::new(Mutex::new(upload_buffers(
                dev,
                2,
                len as u64,
                ctx.info.discrete,
                host,
            )));
            let kinds: Vec<bool> = pool
                .lock()
                .unwrap()
                .iter()
                .map(|u| matches!(u, Upload::Host(_)))
                .collect();
            assert_eq!(kinds, vec![host && vulkan; 2], "{}", ctx.info);
            let dst = dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("upload test"),
                size: len as u64,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            for round in 0..2 {
                for k in 0..2 {
                    // A recycled mapped buffer is back once its map completes.
                    let mut up = loop {
                        if let Some(u) = pool.lock().unwrap().pop() {
                            break u;
                        }
                        ctx.wait().unwrap();
                    };
                    let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                    up.fill(len, |put| {
                        put(0, &bytes[..1000]);
                        put(1000, &bytes[1000..]);
                    })
                    .unwrap();
                    if matches!(up, Upload::Host(_)) {
                        assert!(up.fill(len + 1, |_| {}).is_err());
                    }
                    let mut enc = dev.create_command_encoder(&Default::default());
                    enc.copy_buffer_to_buffer(up.buffer(), 0, &dst, 0, len as u64);
                    ctx.queue.submit([enc.finish()]);
                    let back = ctx.read_bytes(&dst, 0, len as u64).unwrap();
                    assert!(back == bytes, "host {host}, round {round}, buffer {k}");
                    up.recycle(pool.clone());
                }
            }
        }
    }

    const fn ty(visible: bool, coherent: bool, cached: bool, local: bool) -> MemoryType {
        MemoryType {
            host_visible: visible,
            host_coherent: coherent,
            host_cached: cached,
            device_local: local,
            special: false,
        }
    }

    #[test]
    fn a_discrete_gpu_uploads_from_cached_host_memory_not_its_bar() {
        // The types an NVIDIA driver lists with a resizable BAR: device memory, host
        // memory (write-combined, then cached), the BAR.
        let nvidia = [
            ty(false, false, false, true),
            ty(true, true, false, false),
            ty(true, true, true, false),
            ty(true, true, false, true),
        ];
        assert_eq!(pick_host_type(&nvidia, !0, true), Some(2));
        // Without the cached type, the uncached host memory; never the BAR.
        assert_eq!(pick_host_type(&nvidia, 0b1011, true), Some(1));
        assert_eq!(pick_host_type(&nvidia, 0b1001, true), None);
        // An integrated or software adapter's one heap is device-local and host memory.
        let lavapipe = [ty(true, true, true, true)];
        assert_eq!(pick_host_type(&lavapipe, !0, false), Some(0));
        assert_eq!(pick_host_type(&lavapipe, !0, true), None);
        // Incoherent or special memory never.
        let odd = [ty(true, false, true, false), {
            let mut t = ty(true, true, true, false);
            t.special = true;
            t
        }];
        assert_eq!(pick_host_type(&odd, !0, false), None);
    }

    #[test]
    fn mapped_uploads_are_chosen_only_by_name() {
        assert!(host_uploads_wanted(None));
        assert!(host_uploads_wanted(Some("host")));
        assert!(!host_uploads_wanted(Some(" Mapped ")));
    }
}
