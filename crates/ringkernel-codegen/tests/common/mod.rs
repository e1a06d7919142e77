//! Shared test helpers: naga
//! validation + MSL of generated WGSL, execution on a wgpu adapter, random inputs.

#![allow(dead_code)]

use ringkernel_codegen::{BindingKind, ScalarType, WgslKernel};
use ringkernel_shaders::{Access, Binding, Specialization};
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// Parses and validates the WGSL with naga and translates it to MSL; returns the MSL.
pub fn check_wgsl(k: &WgslKernel) -> String {
    let v = ringkernel_shaders::validate_source(&k.entry_point, &k.source)
        .unwrap_or_else(|e| panic!("generated WGSL does not validate: {e}\n{}", k.source));
    let bindings: Vec<Binding> = k
        .bindings
        .iter()
        .map(|b| Binding {
            group: 0,
            binding: b.binding,
            name: Box::leak(b.name.clone().into_boxed_str()),
            access: match b.kind {
                BindingKind::Params => Access::Uniform,
                BindingKind::Storage {
                    read_only: true, ..
                }
                | BindingKind::Structs {
                    read_only: true, ..
                } => Access::Read,
                BindingKind::Storage { .. } | BindingKind::Structs { .. } => Access::ReadWrite,
            },
        })
        .collect();
    let msl =
        ringkernel_shaders::module_to_msl(&v, &k.entry_point, &bindings, &Specialization::none())
            .unwrap_or_else(|e| panic!("MSL translation failed: {e}\n{}", k.source));
    assert!(
        msl.source.contains("kernel void"),
        "MSL has no kernel function:\n{}",
        msl.source
    );
    assert_eq!(msl.workgroup_size, k.workgroup_size);
    msl.source
}

/// A small seeded generator (xorshift64*); the seed is printed so a failure can be
/// reproduced with `RK_TEST_SEED`.
pub struct Rng(u64);

impl Rng {
    pub fn fresh(test: &str) -> Rng {
        let seed = std::env::var("RK_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
                    ^ (test.len() as u64) << 32
            })
            | 1;
        println!("{test}: RK_TEST_SEED={seed}");
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [lo, hi).
    pub fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    /// Uniform in [lo, hi).
    pub fn i32(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next_u64() % (hi - lo) as u64) as i32
    }
    /// Uniform in [lo, hi).
    pub fn usize(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo) as u64) as usize
    }
    pub fn vec_f32(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(lo, hi)).collect()
    }
    pub fn vec_i32(&mut self, n: usize, lo: i32, hi: i32) -> Vec<i32> {
        (0..n).map(|_| self.i32(lo, hi)).collect()
    }
}

/// Asserts two float slices agree to a relative tolerance.
pub fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], rel: f32) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let tol = rel * c.abs().max(1.0);
        assert!(
            (g - c).abs() <= tol,
            "{what}[{i}]: GPU {g} vs CPU {c} (tolerance {tol})"
        );
    }
}

/// The wgpu device `RINGKERNEL_WGPU_ADAPTER` selects (by default the best adapter there
/// is: a GPU where there is one, lavapipe in CI), or `None` (printed as SKIPPED) when this
/// machine has no adapter at all.
pub fn gpu(test: &str) -> Option<Arc<ringkernel_wgpu::GpuContext>> {
    let sel = ringkernel_wgpu::AdapterSelection::from_env();
    match ringkernel_wgpu::GpuContext::shared(&sel) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            let any = ringkernel_wgpu::probe().map(|a| a.len()).unwrap_or(0);
            assert_eq!(
                any, 0,
                "{test}: adapters exist but the selected one failed to open: {e}"
            );
            println!("SKIPPED {test}: no wgpu adapter on this machine ({e})");
            None
        }
    }
}

/// A storage buffer's contents.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
    U32(Vec<u32>),
}

impl Data {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Data::F32(v) => bytemuck::cast_slice(v).to_vec(),
            Data::I32(v) => bytemuck::cast_slice(v).to_vec(),
            Data::U32(v) => bytemuck::cast_slice(v).to_vec(),
        }
    }
    fn elem(&self) -> ScalarType {
        match self {
            Data::F32(_) => ScalarType::F32,
            Data::I32(_) => ScalarType::I32,
            Data::U32(_) => ScalarType::U32,
        }
    }
    fn replace(&mut self, bytes: &[u8]) {
        match self {
            Data::F32(v) => v.copy_from_slice(bytemuck::cast_slice(bytes)),
            Data::I32(v) => v.copy_from_slice(bytemuck::cast_slice(bytes)),
            Data::U32(v) => v.copy_from_slice(bytemuck::cast_slice(bytes)),
        }
    }
    pub fn f32(&self) -> &[f32] {
        match self {
            Data::F32(v) => v,
            _ => panic!("not f32"),
        }
    }
    pub fn i32(&self) -> &[i32] {
        match self {
            Data::I32(v) => v,
            _ => panic!("not i32"),
        }
    }
    pub fn u32(&self) -> &[u32] {
        match self {
            Data::U32(v) => v,
            _ => panic!("not u32"),
        }
    }
}

/// Runs `k` once over `groups` workgroups with the parameter block `params` and the
/// slice buffers `data` (in binding order); writable buffers are read back into `data`.
pub fn run(
    ctx: &ringkernel_wgpu::GpuContext,
    k: &WgslKernel,
    params: &[u8],
    data: &mut [Data],
    groups: [u32; 3],
) {
    let dev = &ctx.device;
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(&k.entry_point),
        source: wgpu::ShaderSource::Wgsl(k.source.as_str().into()),
    });
    let mut layout_entries = Vec::new();
    let mut buffers = Vec::new();
    let mut slices = data.iter();
    for b in &k.bindings {
        let (ty, buf) = match b.kind {
            BindingKind::Params => {
                assert_eq!(params.len() as u32, k.params_size, "params size");
                let buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("params"),
                    contents: params,
                    usage: wgpu::BufferUsages::UNIFORM,
                });
                (wgpu::BufferBindingType::Uniform, buf)
            }
            BindingKind::Storage { .. } | BindingKind::Structs { .. } => {
                let (elem, read_only) = match b.kind {
                    BindingKind::Storage {
                        elem, read_only, ..
                    } => (elem, read_only),
                    // Struct buffers are passed as their 32-bit words.
                    BindingKind::Structs { read_only, .. } => (ScalarType::U32, read_only),
                    BindingKind::Params => unreachable!("matched above"),
                };
                let d = slices.next().expect("a Data per slice binding");
                assert_eq!(d.elem(), elem, "element type of binding {}", b.name);
                let mut bytes = d.bytes();
                if bytes.is_empty() {
                    bytes.resize(4, 0);
                }
                let buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(&b.name),
                    contents: &bytes,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                });
                (wgpu::BufferBindingType::Storage { read_only }, buf)
            }
        };
        layout_entries.push(wgpu::BindGroupLayoutEntry {
            binding: b.binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
        buffers.push(buf);
    }
    assert!(slices.next().is_none(), "more Data than slice bindings");
    let bgl = dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &layout_entries,
    });
    let entries: Vec<wgpu::BindGroupEntry> = k
        .bindings
        .iter()
        .zip(&buffers)
        .map(|(b, buf)| wgpu::BindGroupEntry {
            binding: b.binding,
            resource: buf.as_entire_binding(),
        })
        .collect();
    let group = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &bgl,
        entries: &entries,
    });
    let layout = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &[Some(&bgl)],
        immediate_size: 0,
    });
    let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&k.entry_point),
        layout: Some(&layout),
        module: &module,
        entry_point: Some(&k.entry_point),
        compilation_options: Default::default(),
        cache: None,
    });
    let mut enc = dev.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }
    ctx.queue.submit([enc.finish()]);
    ctx.wait().expect("dispatch");
    let mut slice_bufs = k
        .bindings
        .iter()
        .zip(&buffers)
        .filter(|(b, _)| !matches!(b.kind, BindingKind::Params));
    for d in data.iter_mut() {
        let (b, buf) = slice_bufs.next().expect("binding");
        if matches!(
            b.kind,
            BindingKind::Storage {
                read_only: false,
                ..
            } | BindingKind::Structs {
                read_only: false,
                ..
            }
        ) {
            let n = d.bytes().len() as u64;
            if n > 0 {
                let bytes = ctx.read_bytes(buf, 0, n).expect("read back");
                d.replace(&bytes);
            }
        }
    }
}

/// Declarations that let a host C++ compiler type-check generated CUDA C: the built-in
/// index variables, the integer `min`/`max` overloads and the atomics CUDA provides.
const CUDA_SHIM: &str = r#"
#include <math.h>
#include <stdlib.h>
#define __global__
#define __shared__ static
#define __device__ static
static inline void __syncthreads() {}
struct rk_dim3 { unsigned int x, y, z; };
static rk_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define RK_MINMAX(T) \
    static inline T min(T a, T b) { return a < b ? a : b; } \
    static inline T max(T a, T b) { return a < b ? b : a; }
RK_MINMAX(int)
RK_MINMAX(unsigned int)
RK_MINMAX(unsigned long long)
RK_MINMAX(long long)
#define RK_ATOMIC(name, expr) \
    template <class T> static inline T name(T* p, T v) { T o = *p; *p = (expr); return o; }
RK_ATOMIC(atomicAdd, o + v)
RK_ATOMIC(atomicSub, o - v)
RK_ATOMIC(atomicMin, o < v ? o : v)
RK_ATOMIC(atomicMax, o < v ? v : o)
RK_ATOMIC(atomicAnd, o & v)
RK_ATOMIC(atomicOr, o | v)
RK_ATOMIC(atomicXor, o ^ v)
RK_ATOMIC(atomicExch, v)
static inline float __int_as_float(int i) { float f; __builtin_memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double d; __builtin_memcpy(&d, &i, 8); return d; }
"#;

/// Type-checks generated CUDA C with the host C++ compiler (`c++ -fsyntax-only`) and the
/// shim above; prints SKIPPED when there is no `c++`. NVRTC itself runs in the ignored
/// CUDA tests.
pub fn check_cuda_syntax(cuda: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new("c++")
        .args(["-fsyntax-only", "-std=c++17", "-x", "c++", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            println!("SKIPPED CUDA syntax check: no c++ compiler ({e})");
            return;
        }
    };
    let src = format!("{CUDA_SHIM}\n{cuda}");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(src.as_bytes())
        .expect("write to c++");
    let out = child.wait_with_output().expect("c++ runs");
    assert!(
        out.status.success(),
        "generated CUDA does not compile as C++:\n{}\n{cuda}",
        String::from_utf8_lossy(&out.stderr)
    );
}
