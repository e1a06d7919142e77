//! What a launcher needs to run a kernel on any backend: the [`GpuKernel`] description
//! that `#[gpu_kernel]` generates, and the [`KernelArg`]s a launch passes by position.
//!
//! ```
//! use ringkernel_codegen::launch::{ArgError, KernelArg};
//! use ringkernel_codegen::args;
//!
//! let x = vec![1.0f32, 2.0];
//! let mut y = vec![0.0f32; 2];
//! let mut a = args![2.5f32, &x, &mut y, 2i32];
//! assert_eq!(a.len(), 4);
//! assert!(matches!(a[2], KernelArg::F32sMut(_)));
//! assert_eq!(a[0].type_name(), "f32");
//! // Positional access as the generated CPU entry point does it:
//! let n: i32 = ringkernel_codegen::launch::FromArg::from_arg(&mut a[3], "n").unwrap();
//! assert_eq!(n, 2);
//! let e: Result<f32, ArgError> = ringkernel_codegen::launch::FromArg::from_arg(&mut a[3], "n");
//! assert!(e.is_err());
//! ```

use crate::{KernelParam, ParamKind, ScalarType, StencilConfig, WgslKernel};

/// One parameter of a [`GpuKernel`] (a `'static` form of [`KernelParam`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticParam {
    /// The Rust name.
    pub name: &'static str,
    /// What it is.
    pub kind: ParamKind,
}

/// A stencil kernel's shape: 2 or 3 dimensions and the halo width it was translated
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StencilInfo {
    /// 2 (`GridPos`) or 3 (`GridPos3`).
    pub dims: u8,
    /// Halo width in cells.
    pub halo: u32,
}

impl StencilInfo {
    /// The translator's configuration of this stencil with the default workgroup size.
    pub fn config(&self) -> StencilConfig {
        if self.dims == 3 {
            StencilConfig::new_3d(self.halo)
        } else {
            StencilConfig::new(self.halo)
        }
    }

    /// Elements of a buffer with halo for an interior of `size` cells (`size[2]`
    /// ignored in 2-D).
    pub fn buffer_len(&self, size: [u32; 3]) -> usize {
        if self.dims == 3 {
            crate::dsl::GridPos3::buffer_len(size[0], size[1], size[2], self.halo)
        } else {
            crate::dsl::GridPos::buffer_len(size[0], size[1], self.halo)
        }
    }
}

/// The CPU entry point of a [`GpuKernel`]: runs the Rust function for every thread of
/// `grid` × `block` (through [`crate::dsl::launch`]) with `args` bound by position. For
/// a stencil kernel `grid` is the interior size and `block` is ignored (it runs through
/// [`crate::dsl::stencil_2d`] / [`crate::dsl::stencil_3d`]), and `args` leave the
/// `GridPos` parameter out.
pub type CpuEntry =
    fn(grid: [u32; 3], block: [u32; 3], args: &mut [KernelArg<'_>]) -> Result<(), ArgError>;

/// A global kernel written once in Rust, as `#[gpu_kernel]` describes it: its
/// parameters, the CUDA C and WGSL it was translated to at compile time, the Rust source
/// (re-translated when a launch asks for another WGSL workgroup size) and the CPU entry
/// point that runs the Rust function itself.
#[derive(Debug, Clone, Copy)]
pub struct GpuKernel {
    /// The function's name (the CUDA and WGSL entry point).
    pub name: &'static str,
    /// Parameters in order.
    pub params: &'static [StaticParam],
    /// The function as Rust tokens (what the macro translated). Empty for a
    /// hand-written kernel: then [`cuda_source`](Self::cuda_source) and
    /// [`wgsl_source`](Self::wgsl_source) are used as they are (see
    /// [`wgsl`](Self::wgsl)) and [`cpu`](Self::cpu) is the CPU implementation.
    pub rust_source: &'static str,
    /// CUDA C (`extern "C" __global__ void name(...)`).
    pub cuda_source: &'static str,
    /// WGSL with [`crate::DEFAULT_WORKGROUP_SIZE`], or why the kernel has no WGSL form
    /// (an `f64`, say).
    pub wgsl_source: Result<&'static str, &'static str>,
    /// Runs the Rust function on the CPU.
    pub cpu: CpuEntry,
    /// `Some` for a stencil kernel (a `GridPos`/`GridPos3` parameter).
    pub stencil: Option<StencilInfo>,
}

impl GpuKernel {
    /// The parameters as [`KernelParam`]s.
    pub fn kernel_params(&self) -> Vec<KernelParam> {
        self.params
            .iter()
            .map(|p| KernelParam {
                name: p.name.to_string(),
                kind: p.kind,
            })
            .collect()
    }

    /// The WGSL of this kernel with `workgroup_size` (translated again from
    /// [`rust_source`](Self::rust_source); the size is checked as
    /// [`crate::transpile_global_kernel_wgsl_with`] checks it).
    ///
    /// A hand-written kernel (empty `rust_source`) keeps its WGSL as it is, which must
    /// follow the generated kernels' binding layout for its parameters (see the crate
    /// docs) and declare `@workgroup_size` equal to `workgroup_size`:
    ///
    /// ```
    /// use ringkernel_codegen::launch::{GpuKernel, StaticParam};
    /// use ringkernel_codegen::{ParamKind, ScalarType};
    ///
    /// const SCALE: GpuKernel = GpuKernel {
    ///     name: "scale",
    ///     params: &[
    ///         StaticParam { name: "x", kind: ParamKind::Slice { elem: ScalarType::F32, mutable: true } },
    ///         StaticParam { name: "k", kind: ParamKind::Scalar(ScalarType::F32) },
    ///     ],
    ///     rust_source: "",
    ///     cuda_source: "extern \"C\" __global__ void scale(float* x, float k) { x[threadIdx.x] *= k; }",
    ///     wgsl_source: Ok("struct RkParams { k: f32, p0: u32, p1: u32, p2: u32 }
    /// @group(0) @binding(0) var<uniform> rk_params: RkParams;
    /// @group(0) @binding(1) var<storage, read_write> x: array<f32>;
    /// @compute @workgroup_size(64, 1, 1)
    /// fn scale(@builtin(global_invocation_id) g: vec3<u32>) { x[g.x] *= rk_params.k; }"),
    ///     cpu: |_, _, _| Ok(()),
    ///     stencil: None,
    /// };
    /// let k = SCALE.wgsl([64, 1, 1]).unwrap();
    /// assert_eq!((k.bindings.len(), k.params_size), (2, 16));
    /// assert!(SCALE.wgsl([128, 1, 1]).is_err());
    /// ```
    pub fn wgsl(&self, workgroup_size: [u32; 3]) -> Result<WgslKernel, String> {
        let source = match self.wgsl_source {
            Err(e) => return Err(e.to_string()),
            Ok(s) => s,
        };
        if self.rust_source.is_empty() {
            return self.hand_written_wgsl(source, workgroup_size);
        }
        let f: syn::ItemFn = syn::parse_str(self.rust_source).map_err(|e| e.to_string())?;
        match self.stencil {
            None => crate::transpile_global_kernel_wgsl_with(&f, workgroup_size),
            Some(st) => crate::transpile_stencil_kernel_wgsl(
                &f,
                &StencilConfig {
                    halo: st.halo,
                    workgroup_size,
                },
            ),
        }
        .map_err(|e| e.to_string())
    }

    /// The WGSL of this kernel for a one-dimensional grid folded into two dimensions
    /// (see [`crate::transpile_global_kernel_wgsl_folded`]); an error for a stencil or a
    /// hand-written kernel, which cannot be folded.
    pub fn wgsl_folded(&self, workgroup_size: [u32; 3]) -> Result<WgslKernel, String> {
        if let Err(e) = self.wgsl_source {
            return Err(e.to_string());
        }
        if self.rust_source.is_empty() || self.stencil.is_some() {
            return Err(format!(
                "kernel `{}` cannot run a grid folded into two dimensions (it is {}); launch \
                 fewer workgroups per dimension",
                self.name,
                if self.stencil.is_some() {
                    "a stencil"
                } else {
                    "hand-written"
                }
            ));
        }
        let f: syn::ItemFn = syn::parse_str(self.rust_source).map_err(|e| e.to_string())?;
        crate::transpile_global_kernel_wgsl_folded(&f, workgroup_size).map_err(|e| e.to_string())
    }

    /// The layout of a hand-written kernel: that of a generated kernel with the same
    /// parameters, with `source` as the module.
    fn hand_written_wgsl(&self, source: &str, wg: [u32; 3]) -> Result<WgslKernel, String> {
        let [x, y, z] = wg;
        if !source.contains(&format!("@workgroup_size({x}, {y}, {z})")) {
            return Err(format!(
                "hand-written kernel `{}` does not declare @workgroup_size({x}, {y}, {z}), the \
                 launch's block",
                self.name
            ));
        }
        let mut params = Vec::new();
        for p in self.params {
            let name = syn::Ident::new(p.name, proc_macro2::Span::call_site());
            let ty: syn::Type = match p.kind {
                ParamKind::Scalar(s) => syn::parse_str(s.rust_name()),
                ParamKind::Slice { elem, mutable } => syn::parse_str(&format!(
                    "&{}[{}]",
                    if mutable { "mut " } else { "" },
                    elem.rust_name()
                )),
                ParamKind::Struct { name, .. } => syn::parse_str(name),
                ParamKind::StructSlice { name, mutable, .. } => {
                    syn::parse_str(&format!("&{}[{name}]", if mutable { "mut " } else { "" }))
                }
                ParamKind::GridPos { dims: 3 } => syn::parse_str("GridPos3"),
                ParamKind::GridPos { .. } => syn::parse_str("GridPos"),
            }
            .map_err(|e| e.to_string())?;
            params.push(quote::quote!(#name: #ty));
        }
        // Struct parameters: a stand-in of the same size (the binding layout only
        // depends on it).
        let mut structs = Vec::new();
        for p in self.params {
            if let ParamKind::Struct { name, size } | ParamKind::StructSlice { name, size, .. } =
                p.kind
            {
                let n = syn::Ident::new(name, proc_macro2::Span::call_site());
                let words = (size / 4) as usize;
                structs.push(quote::quote!(struct #n { words: [u32; #words] }));
            }
        }
        let ident = syn::Ident::new(self.name, proc_macro2::Span::call_site());
        let stub: syn::ItemFn = syn::parse_quote!(fn #ident(#(#params),*) { #(#structs)* });
        let mut layout = match self.stencil {
            None => crate::transpile_global_kernel_wgsl_with(&stub, wg),
            Some(st) => crate::transpile_stencil_kernel_wgsl(
                &stub,
                &StencilConfig {
                    halo: st.halo,
                    workgroup_size: wg,
                },
            ),
        }
        .map_err(|e| e.to_string())?;
        layout.source = source.to_string();
        Ok(layout)
    }

    /// The parameters a launch passes arguments for (all but a stencil's `GridPos`).
    pub fn launch_params(&self) -> impl Iterator<Item = &'static StaticParam> {
        self.params
            .iter()
            .filter(|p| !matches!(p.kind, ParamKind::GridPos { .. }))
    }

    /// Checks `args` against the parameters (count, then each type, mutability
    /// included): what every launcher does first.
    pub fn check_args(&self, args: &[KernelArg<'_>]) -> Result<(), ArgError> {
        let expected = self.launch_params().count();
        if args.len() != expected {
            return Err(ArgError::Count {
                kernel: self.name,
                expected,
                got: args.len(),
            });
        }
        for (p, a) in self.launch_params().zip(args) {
            if !a.fits(p.kind) {
                return Err(ArgError::Type {
                    param: p.name,
                    expected: kind_name(p.kind),
                    got: a.type_name(),
                });
            }
        }
        Ok(())
    }
}

/// How a parameter kind is written in Rust (for messages).
pub fn kind_name(kind: ParamKind) -> &'static str {
    use ScalarType::*;
    match kind {
        ParamKind::Struct { name, .. } => name,
        ParamKind::StructSlice {
            name,
            mutable: false,
            ..
        } => crate::intern(&format!("&[{name}]")),
        ParamKind::StructSlice { name, .. } => crate::intern(&format!("&mut [{name}]")),
        ParamKind::Scalar(s) => s.rust_name(),
        ParamKind::Slice { elem, mutable } => match (elem, mutable) {
            (F32, false) => "&[f32]",
            (F32, true) => "&mut [f32]",
            (F64, false) => "&[f64]",
            (F64, true) => "&mut [f64]",
            (I32, false) => "&[i32]",
            (I32, true) => "&mut [i32]",
            (U32, false) => "&[u32]",
            (U32, true) => "&mut [u32]",
            (Bool, false) => "&[bool]",
            (Bool, true) => "&mut [bool]",
            (Usize, false) => "&[usize]",
            (Usize, true) => "&mut [usize]",
            (I64, false) => "&[i64]",
            (I64, true) => "&mut [i64]",
            (U64, false) => "&[u64]",
            (U64, true) => "&mut [u64]",
        },
        ParamKind::GridPos { dims: 3 } => "GridPos3",
        ParamKind::GridPos { .. } => "GridPos",
    }
}

/// A wrong launch argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// Not one argument per parameter.
    #[error("kernel `{kernel}` takes {expected} arguments, {got} were given")]
    Count {
        /// The kernel.
        kernel: &'static str,
        /// Its parameter count.
        expected: usize,
        /// Arguments given.
        got: usize,
    },
    /// An argument of another type than its parameter's.
    #[error("parameter `{param}` is a `{expected}`, the argument is a `{got}`")]
    Type {
        /// The parameter.
        param: &'static str,
        /// Its type.
        expected: &'static str,
        /// The argument's type.
        got: &'static str,
    },
    /// A parameter no launcher can bind (a `&[bool]`).
    #[error("parameter `{param}` of type `{ty}` cannot be passed to a launch")]
    Unsupported {
        /// The parameter.
        param: &'static str,
        /// Its type.
        ty: &'static str,
    },
}

/// A launcher's device-resident buffer inside a [`KernelArg::Device`] (opaque here).
#[derive(Clone, Copy)]
pub struct DeviceRef<'a>(pub &'a (dyn std::any::Any + Send + Sync));

impl std::fmt::Debug for DeviceRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceRef(..)")
    }
}

/// One argument of a launch, by position: a scalar, or a host slice (read-only for a
/// `&[T]` parameter, read-write for a `&mut [T]` one; a mutable slice may also be passed
/// where a read-only one is expected). Build them with `From` or [`args!`](crate::args).
#[derive(Debug)]
pub enum KernelArg<'a> {
    /// An `f32` scalar.
    F32(f32),
    /// An `f64` scalar (CUDA and CPU only).
    F64(f64),
    /// An `i32` scalar.
    I32(i32),
    /// A `u32` scalar.
    U32(u32),
    /// A `bool` scalar.
    Bool(bool),
    /// An `i64` scalar (CUDA and CPU only).
    I64(i64),
    /// A `u64` scalar (CUDA and CPU only).
    U64(u64),
    /// `&[f32]`.
    F32s(&'a [f32]),
    /// `&mut [f32]`.
    F32sMut(&'a mut [f32]),
    /// `&[f64]`.
    F64s(&'a [f64]),
    /// `&mut [f64]`.
    F64sMut(&'a mut [f64]),
    /// `&[i32]`.
    I32s(&'a [i32]),
    /// `&mut [i32]`.
    I32sMut(&'a mut [i32]),
    /// `&[u32]`.
    U32s(&'a [u32]),
    /// `&mut [u32]`.
    U32sMut(&'a mut [u32]),
    /// `&[i64]` (CUDA and CPU only).
    I64s(&'a [i64]),
    /// `&mut [i64]`.
    I64sMut(&'a mut [i64]),
    /// `&[u64]` (CUDA and CPU only).
    U64s(&'a [u64]),
    /// `&mut [u64]`.
    U64sMut(&'a mut [u64]),
    /// A `GpuType` struct by value ([`KernelArg::value`]): its bytes and its type's
    /// name.
    Struct {
        /// The value's bytes (`#[repr(C)]`, the WGSL layout).
        bytes: &'a [u8],
        /// The struct's name (the last segment of its Rust path).
        ty: &'static str,
    },
    /// `&[T]` of a `GpuType` struct ([`KernelArg::structs`]).
    Structs {
        /// The elements' bytes.
        bytes: &'a [u8],
        /// The struct's name.
        ty: &'static str,
        /// Size of one element.
        size: usize,
    },
    /// `&mut [T]` of a `GpuType` struct ([`KernelArg::structs_mut`]).
    StructsMut {
        /// The elements' bytes.
        bytes: &'a mut [u8],
        /// The struct's name.
        ty: &'static str,
        /// Size of one element.
        size: usize,
    },
    /// f32 data already on a device (the `ringkernel` facade's `Tensor`), for an `f32`
    /// slice parameter: GPU launchers bind it without a copy; the CPU launcher stages it
    /// through host memory.
    Device {
        /// The launcher's buffer object (the facade downcasts it).
        buffer: DeviceRef<'a>,
        /// Elements.
        len: usize,
        /// Passed as `&mut` (the kernel may write it).
        mutable: bool,
    },
}

/// The name of `T` without its path (what a kernel's struct parameter is checked
/// against).
fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let no_generics = full.split('<').next().unwrap_or(full);
    no_generics.rsplit("::").next().unwrap_or(no_generics)
}

impl<'a> KernelArg<'a> {
    /// A `#[repr(C)]` `GpuType` struct passed by value (a kernel parameter `p: T`).
    ///
    /// ```
    /// use ringkernel_codegen::launch::KernelArg;
    /// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    /// #[repr(C)]
    /// struct Params { scale: f32, n: u32 }
    /// let p = Params { scale: 2.0, n: 3 };
    /// assert_eq!(KernelArg::value(&p).type_name(), "Params");
    /// ```
    pub fn value<T: bytemuck::Pod>(v: &'a T) -> Self {
        KernelArg::Struct {
            bytes: bytemuck::bytes_of(v),
            ty: short_type_name::<T>(),
        }
    }

    /// A slice of `#[repr(C)]` `GpuType` structs for a `&[T]` parameter.
    pub fn structs<T: bytemuck::Pod>(s: &'a [T]) -> Self {
        KernelArg::Structs {
            bytes: bytemuck::cast_slice(s),
            ty: short_type_name::<T>(),
            size: std::mem::size_of::<T>(),
        }
    }

    /// A mutable slice of `#[repr(C)]` `GpuType` structs for a `&mut [T]` (or `&[T]`)
    /// parameter; written back after a GPU launch.
    pub fn structs_mut<T: bytemuck::Pod>(s: &'a mut [T]) -> Self {
        KernelArg::StructsMut {
            bytes: bytemuck::cast_slice_mut(s),
            ty: short_type_name::<T>(),
            size: std::mem::size_of::<T>(),
        }
    }
}

impl KernelArg<'_> {
    /// The argument's Rust type.
    pub fn type_name(&self) -> &'static str {
        match self {
            KernelArg::Struct { ty, .. } => ty,
            KernelArg::Structs { ty, .. } => crate::intern(&format!("&[{ty}]")),
            KernelArg::StructsMut { ty, .. } => crate::intern(&format!("&mut [{ty}]")),
            KernelArg::F32(_) => "f32",
            KernelArg::F64(_) => "f64",
            KernelArg::I32(_) => "i32",
            KernelArg::U32(_) => "u32",
            KernelArg::Bool(_) => "bool",
            KernelArg::F32s(_) => "&[f32]",
            KernelArg::F32sMut(_) => "&mut [f32]",
            KernelArg::F64s(_) => "&[f64]",
            KernelArg::F64sMut(_) => "&mut [f64]",
            KernelArg::I32s(_) => "&[i32]",
            KernelArg::I32sMut(_) => "&mut [i32]",
            KernelArg::U32s(_) => "&[u32]",
            KernelArg::U32sMut(_) => "&mut [u32]",
            KernelArg::I64(_) => "i64",
            KernelArg::U64(_) => "u64",
            KernelArg::I64s(_) => "&[i64]",
            KernelArg::I64sMut(_) => "&mut [i64]",
            KernelArg::U64s(_) => "&[u64]",
            KernelArg::U64sMut(_) => "&mut [u64]",
            KernelArg::Device { mutable: false, .. } => "&Tensor",
            KernelArg::Device { mutable: true, .. } => "&mut Tensor",
        }
    }

    /// The same argument, borrowed for a shorter time (slices reborrowed).
    pub fn reborrow(&mut self) -> KernelArg<'_> {
        match self {
            KernelArg::F32(x) => KernelArg::F32(*x),
            KernelArg::F64(x) => KernelArg::F64(*x),
            KernelArg::I32(x) => KernelArg::I32(*x),
            KernelArg::U32(x) => KernelArg::U32(*x),
            KernelArg::Bool(x) => KernelArg::Bool(*x),
            KernelArg::F32s(s) => KernelArg::F32s(s),
            KernelArg::F32sMut(s) => KernelArg::F32sMut(s),
            KernelArg::F64s(s) => KernelArg::F64s(s),
            KernelArg::F64sMut(s) => KernelArg::F64sMut(s),
            KernelArg::I32s(s) => KernelArg::I32s(s),
            KernelArg::I32sMut(s) => KernelArg::I32sMut(s),
            KernelArg::U32s(s) => KernelArg::U32s(s),
            KernelArg::U32sMut(s) => KernelArg::U32sMut(s),
            KernelArg::I64(x) => KernelArg::I64(*x),
            KernelArg::U64(x) => KernelArg::U64(*x),
            KernelArg::I64s(s) => KernelArg::I64s(s),
            KernelArg::I64sMut(s) => KernelArg::I64sMut(s),
            KernelArg::U64s(s) => KernelArg::U64s(s),
            KernelArg::U64sMut(s) => KernelArg::U64sMut(s),
            KernelArg::Struct { bytes, ty } => KernelArg::Struct { bytes, ty },
            KernelArg::Structs { bytes, ty, size } => KernelArg::Structs {
                bytes,
                ty,
                size: *size,
            },
            KernelArg::StructsMut { bytes, ty, size } => KernelArg::StructsMut {
                bytes,
                ty,
                size: *size,
            },
            KernelArg::Device {
                buffer,
                len,
                mutable,
            } => KernelArg::Device {
                buffer: *buffer,
                len: *len,
                mutable: *mutable,
            },
        }
    }

    /// Whether this argument can be bound to a parameter of `kind`.
    pub fn fits(&self, kind: ParamKind) -> bool {
        use KernelArg as A;
        use ScalarType as S;
        match kind {
            ParamKind::Scalar(s) => matches!(
                (s, self),
                (S::F32, A::F32(_))
                    | (S::F64, A::F64(_))
                    | (S::I32, A::I32(_))
                    | (S::U32, A::U32(_))
                    | (S::Bool, A::Bool(_))
                    | (S::I64, A::I64(_))
                    | (S::U64, A::U64(_))
            ),
            ParamKind::Slice { elem, mutable } => match (elem, self) {
                (S::F32, A::F32sMut(_))
                | (S::F64, A::F64sMut(_))
                | (S::I32, A::I32sMut(_))
                | (S::U32, A::U32sMut(_))
                | (S::I64, A::I64sMut(_))
                | (S::U64, A::U64sMut(_)) => true,
                (S::F32, A::F32s(_))
                | (S::F64, A::F64s(_))
                | (S::I32, A::I32s(_))
                | (S::U32, A::U32s(_))
                | (S::I64, A::I64s(_))
                | (S::U64, A::U64s(_)) => !mutable,
                (S::F32, A::Device { mutable: m, .. }) => *m || !mutable,
                _ => false,
            },
            ParamKind::Struct { name, size } => {
                matches!(self, A::Struct { bytes, ty } if *ty == name && bytes.len() == size as usize)
            }
            ParamKind::StructSlice {
                name,
                size,
                mutable,
            } => match self {
                A::Structs { ty, size: s, .. } => !mutable && *ty == name && *s == size as usize,
                A::StructsMut { ty, size: s, .. } => *ty == name && *s == size as usize,
                _ => false,
            },
            ParamKind::GridPos { .. } => false,
        }
    }

    /// The scalar as its 4 or 8 little-endian bytes; `None` for a slice.
    pub fn scalar_bytes(&self) -> Option<Vec<u8>> {
        Some(match self {
            KernelArg::F32(x) => x.to_le_bytes().to_vec(),
            KernelArg::F64(x) => x.to_le_bytes().to_vec(),
            KernelArg::I32(x) => x.to_le_bytes().to_vec(),
            KernelArg::U32(x) => x.to_le_bytes().to_vec(),
            KernelArg::Bool(x) => vec![*x as u8],
            KernelArg::I64(x) => x.to_le_bytes().to_vec(),
            KernelArg::U64(x) => x.to_le_bytes().to_vec(),
            _ => return None,
        })
    }

    /// A slice argument's elements as 32-bit words (bit patterns; an `f64` is two
    /// words, low first): how launchers upload it into an f32 device buffer. `None` for
    /// a scalar.
    pub fn words(&self) -> Option<Vec<f32>> {
        fn w<T: Copy>(s: &[T], f: impl Fn(T) -> u32) -> Vec<f32> {
            s.iter().map(|&v| f32::from_bits(f(v))).collect()
        }
        Some(match self {
            KernelArg::F32s(s) => s.to_vec(),
            KernelArg::F32sMut(s) => s.to_vec(),
            KernelArg::I32s(s) => w(s, |v| v as u32),
            KernelArg::I32sMut(s) => w(s, |v| v as u32),
            KernelArg::U32s(s) => w(s, |v| v),
            KernelArg::U32sMut(s) => w(s, |v| v),
            KernelArg::F64s(s) => f64_words(s),
            KernelArg::F64sMut(s) => f64_words(s),
            KernelArg::I64s(s) => u64_words(s.iter().map(|&v| v as u64)),
            KernelArg::I64sMut(s) => u64_words(s.iter().map(|&v| v as u64)),
            KernelArg::U64s(s) => u64_words(s.iter().copied()),
            KernelArg::U64sMut(s) => u64_words(s.iter().copied()),
            KernelArg::Struct { bytes, .. } | KernelArg::Structs { bytes, .. } => byte_words(bytes),
            KernelArg::StructsMut { bytes, .. } => byte_words(bytes),
            _ => return None,
        })
    }

    /// Writes 32-bit words (as [`words`](Self::words) gives them) back into a mutable
    /// slice argument; `false` when this is not a mutable slice or the length differs.
    pub fn store_words(&mut self, words: &[f32]) -> bool {
        fn st<T>(s: &mut [T], words: &[f32], per: usize, f: impl Fn(&[f32]) -> T) -> bool {
            if words.len() != s.len() * per {
                return false;
            }
            for (d, w) in s.iter_mut().zip(words.chunks_exact(per)) {
                *d = f(w);
            }
            true
        }
        match self {
            KernelArg::F32sMut(s) => st(s, words, 1, |w| w[0]),
            KernelArg::I32sMut(s) => st(s, words, 1, |w| w[0].to_bits() as i32),
            KernelArg::U32sMut(s) => st(s, words, 1, |w| w[0].to_bits()),
            KernelArg::F64sMut(s) => st(s, words, 2, |w| f64::from_bits(word_pair(w))),
            KernelArg::I64sMut(s) => st(s, words, 2, |w| word_pair(w) as i64),
            KernelArg::U64sMut(s) => st(s, words, 2, word_pair),
            KernelArg::StructsMut { bytes, .. } => {
                if words.len() * 4 != bytes.len() {
                    return false;
                }
                for (d, w) in bytes.chunks_exact_mut(4).zip(words) {
                    d.copy_from_slice(&w.to_bits().to_le_bytes());
                }
                true
            }
            _ => false,
        }
    }

    /// Number of 32-bit words of a slice argument (0 for a scalar).
    pub fn word_len(&self) -> usize {
        match self {
            KernelArg::F32s(s) => s.len(),
            KernelArg::F32sMut(s) => s.len(),
            KernelArg::I32s(s) => s.len(),
            KernelArg::I32sMut(s) => s.len(),
            KernelArg::U32s(s) => s.len(),
            KernelArg::U32sMut(s) => s.len(),
            KernelArg::F64s(s) => 2 * s.len(),
            KernelArg::F64sMut(s) => 2 * s.len(),
            KernelArg::I64s(s) => 2 * s.len(),
            KernelArg::I64sMut(s) => 2 * s.len(),
            KernelArg::U64s(s) => 2 * s.len(),
            KernelArg::U64sMut(s) => 2 * s.len(),
            KernelArg::Struct { bytes, .. } | KernelArg::Structs { bytes, .. } => bytes.len() / 4,
            KernelArg::StructsMut { bytes, .. } => bytes.len() / 4,
            _ => 0,
        }
    }

    /// Whether this is a mutable slice (written back after a GPU launch).
    pub fn is_mut_slice(&self) -> bool {
        matches!(
            self,
            KernelArg::F32sMut(_)
                | KernelArg::F64sMut(_)
                | KernelArg::I32sMut(_)
                | KernelArg::U32sMut(_)
                | KernelArg::I64sMut(_)
                | KernelArg::U64sMut(_)
                | KernelArg::StructsMut { .. }
        )
    }
}

/// Bytes as 32-bit words (a `GpuType` struct's size is a multiple of 4; a ragged end is
/// padded with zeros).
fn byte_words(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            f32::from_bits(u32::from_le_bytes(w))
        })
        .collect()
}

fn f64_words(s: &[f64]) -> Vec<f32> {
    u64_words(s.iter().map(|v| v.to_bits()))
}

/// 64-bit values as pairs of 32-bit words, low word first.
fn u64_words(s: impl Iterator<Item = u64>) -> Vec<f32> {
    s.flat_map(|b| [f32::from_bits(b as u32), f32::from_bits((b >> 32) as u32)])
        .collect()
}

/// The 64-bit value of a pair of words (low first).
fn word_pair(w: &[f32]) -> u64 {
    w[0].to_bits() as u64 | (w[1].to_bits() as u64) << 32
}

macro_rules! from_impls {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for KernelArg<'_> {
            fn from(x: $t) -> Self {
                KernelArg::$v(x)
            }
        }
    )*};
}
from_impls!(f32 => F32, f64 => F64, i32 => I32, u32 => U32, bool => Bool, i64 => I64, u64 => U64);

macro_rules! from_slices {
    ($($t:ty => $v:ident, $m:ident;)*) => {$(
        impl<'a> From<&'a [$t]> for KernelArg<'a> {
            fn from(x: &'a [$t]) -> Self {
                KernelArg::$v(x)
            }
        }
        impl<'a> From<&'a mut [$t]> for KernelArg<'a> {
            fn from(x: &'a mut [$t]) -> Self {
                KernelArg::$m(x)
            }
        }
        impl<'a> From<&'a Vec<$t>> for KernelArg<'a> {
            fn from(x: &'a Vec<$t>) -> Self {
                KernelArg::$v(x)
            }
        }
        impl<'a> From<&'a mut Vec<$t>> for KernelArg<'a> {
            fn from(x: &'a mut Vec<$t>) -> Self {
                KernelArg::$m(x)
            }
        }
        impl<'a, const N: usize> From<&'a [$t; N]> for KernelArg<'a> {
            fn from(x: &'a [$t; N]) -> Self {
                KernelArg::$v(x)
            }
        }
        impl<'a, const N: usize> From<&'a mut [$t; N]> for KernelArg<'a> {
            fn from(x: &'a mut [$t; N]) -> Self {
                KernelArg::$m(x)
            }
        }
        impl<'a> FromArg<'a> for &'a [$t] {
            fn from_arg(arg: &'a mut KernelArg<'_>, name: &'static str) -> Result<Self, ArgError> {
                match arg {
                    KernelArg::$v(s) => Ok(s),
                    KernelArg::$m(s) => Ok(s),
                    other => Err(mismatch(name, concat!("&[", stringify!($t), "]"), other)),
                }
            }
        }
        impl<'a> FromArg<'a> for &'a mut [$t] {
            fn from_arg(arg: &'a mut KernelArg<'_>, name: &'static str) -> Result<Self, ArgError> {
                match arg {
                    KernelArg::$m(s) => Ok(s),
                    other => Err(mismatch(name, concat!("&mut [", stringify!($t), "]"), other)),
                }
            }
        }
    )*};
}

/// Takes a parameter's value out of its [`KernelArg`] (what the CPU entry point that
/// `#[gpu_kernel]` generates does for each parameter).
pub trait FromArg<'a>: Sized {
    /// The value, or [`ArgError::Type`] naming `name`.
    fn from_arg(arg: &'a mut KernelArg<'_>, name: &'static str) -> Result<Self, ArgError>;
}

fn mismatch(param: &'static str, expected: &'static str, got: &KernelArg<'_>) -> ArgError {
    ArgError::Type {
        param,
        expected,
        got: got.type_name(),
    }
}

macro_rules! from_arg_scalars {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl<'a> FromArg<'a> for $t {
            fn from_arg(arg: &'a mut KernelArg<'_>, name: &'static str) -> Result<Self, ArgError> {
                match arg {
                    KernelArg::$v(x) => Ok(*x),
                    other => Err(mismatch(name, stringify!($t), other)),
                }
            }
        }
    )*};
}
from_arg_scalars!(f32 => F32, f64 => F64, i32 => I32, u32 => U32, bool => Bool, i64 => I64, u64 => U64);

from_slices! {
    f32 => F32s, F32sMut;
    f64 => F64s, F64sMut;
    i32 => I32s, I32sMut;
    u32 => U32s, U32sMut;
    i64 => I64s, I64sMut;
    u64 => U64s, U64sMut;
}

fn struct_bytes_of<'b>(
    arg: &'b KernelArg<'_>,
    name: &'static str,
    want: &'static str,
) -> Result<&'b [u8], ArgError> {
    match arg {
        KernelArg::Struct { bytes, ty } | KernelArg::Structs { bytes, ty, .. } if *ty == want => {
            Ok(bytes)
        }
        KernelArg::StructsMut { bytes, ty, .. } if *ty == want => Ok(bytes),
        other => Err(mismatch(name, want, other)),
    }
}

/// The value of a struct parameter `name: T` (what the CPU entry point that
/// `#[gpu_kernel]` generates does for it).
pub fn struct_arg<T: bytemuck::Pod>(
    arg: &mut KernelArg<'_>,
    name: &'static str,
) -> Result<T, ArgError> {
    let want = short_type_name::<T>();
    let bytes = struct_bytes_of(arg, name, want)?;
    if bytes.len() != std::mem::size_of::<T>() {
        return Err(mismatch(name, want, arg));
    }
    Ok(bytemuck::pod_read_unaligned(bytes))
}

/// The slice of a `&[T]` struct parameter.
pub fn struct_slice_arg<'a, T: bytemuck::Pod>(
    arg: &'a mut KernelArg<'_>,
    name: &'static str,
) -> Result<&'a [T], ArgError> {
    let want = short_type_name::<T>();
    let got = arg.type_name();
    let bytes = match arg {
        KernelArg::Structs { bytes, ty, .. } if *ty == want => &**bytes,
        KernelArg::StructsMut { bytes, ty, .. } if *ty == want => &**bytes,
        _ => {
            return Err(ArgError::Type {
                param: name,
                expected: want,
                got,
            })
        }
    };
    bytemuck::try_cast_slice(bytes).map_err(|_| ArgError::Type {
        param: name,
        expected: want,
        got: "a byte slice of another size or alignment",
    })
}

/// The slice of a `&mut [T]` struct parameter.
pub fn struct_slice_mut_arg<'a, T: bytemuck::Pod>(
    arg: &'a mut KernelArg<'_>,
    name: &'static str,
) -> Result<&'a mut [T], ArgError> {
    let want = short_type_name::<T>();
    let got = arg.type_name();
    match arg {
        KernelArg::StructsMut { bytes, ty, .. } if *ty == want => {
            bytemuck::try_cast_slice_mut(bytes).map_err(|_| ArgError::Type {
                param: name,
                expected: want,
                got: "a byte slice of another size or alignment",
            })
        }
        _ => Err(ArgError::Type {
            param: name,
            expected: want,
            got,
        }),
    }
}

/// An array of [`KernelArg`]s from scalars, slices, arrays and `Vec`s (`&v` read-only,
/// `&mut v` read-write): `args![2.0f32, &x, &mut y, n as i32]`.
#[macro_export]
macro_rules! args {
    ($($e:expr),* $(,)?) => {
        [$($crate::launch::KernelArg::from($e)),*]
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_every_element_type() {
        let mut f = vec![1.5f32, -0.0, f32::NAN];
        let mut i = vec![-1i32, i32::MIN, 7];
        let mut u = vec![u32::MAX, 0, 3];
        let mut d = vec![1.0e300f64, -2.5, f64::MIN_POSITIVE];
        let mut l = vec![i64::MIN, -3, i64::MAX];
        let mut q = vec![u64::MAX, 1 << 40, 9];
        for a in [
            KernelArg::from(&mut f),
            KernelArg::from(&mut i),
            KernelArg::from(&mut u),
            KernelArg::from(&mut d),
            KernelArg::from(&mut l),
            KernelArg::from(&mut q),
        ]
        .iter_mut()
        {
            let w = a.words().unwrap();
            assert_eq!(w.len(), a.word_len());
            // write back something else, then the original words
            let other: Vec<f32> = w.iter().map(|x| f32::from_bits(!x.to_bits())).collect();
            assert!(a.store_words(&other));
            assert!(a.store_words(&w));
            assert!(!a.store_words(&w[1..]), "a wrong length is refused");
        }
        assert_eq!(f[0], 1.5);
        assert!(f[1] == 0.0 && f[1].is_sign_negative() && f[2].is_nan());
        assert_eq!(i, vec![-1, i32::MIN, 7]);
        assert_eq!(u, vec![u32::MAX, 0, 3]);
        assert_eq!(d, vec![1.0e300, -2.5, f64::MIN_POSITIVE]);
        assert_eq!(l, vec![i64::MIN, -3, i64::MAX]);
        assert_eq!(q, vec![u64::MAX, 1 << 40, 9]);
        assert_eq!(
            KernelArg::from(-2i64).scalar_bytes(),
            Some((-2i64).to_le_bytes().to_vec())
        );
        let ro = [1.0f32];
        let mut a = KernelArg::from(&ro);
        assert!(!a.is_mut_slice() && !a.store_words(&[2.0]));
        assert_eq!(KernelArg::from(3u32).words(), None);
        assert_eq!(KernelArg::from(3u32).scalar_bytes(), Some(vec![3, 0, 0, 0]));
    }

    #[test]
    fn fits_checks_type_and_mutability() {
        let k = |elem, mutable| ParamKind::Slice { elem, mutable };
        let x = [0.0f32];
        let mut y = [0.0f32];
        assert!(KernelArg::from(&x).fits(k(ScalarType::F32, false)));
        assert!(!KernelArg::from(&x).fits(k(ScalarType::F32, true)));
        assert!(KernelArg::from(&mut y).fits(k(ScalarType::F32, false)));
        assert!(!KernelArg::from(&mut y).fits(k(ScalarType::I32, true)));
        assert!(KernelArg::from(1i32).fits(ParamKind::Scalar(ScalarType::I32)));
        assert!(!KernelArg::from(1i32).fits(ParamKind::Scalar(ScalarType::U32)));
        assert!(!KernelArg::from(1i32).fits(ParamKind::GridPos { dims: 2 }));
        assert_eq!(kind_name(k(ScalarType::U32, true)), "&mut [u32]");
    }
}
