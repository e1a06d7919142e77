//! # ringkernel-cuda-codegen
//!
//! Rust kernels translated to CUDA C: the CUDA face of [`ringkernel_codegen`], under the
//! names the RingKernel README uses. Everything here is a re-export; see
//! [`ringkernel_codegen`] for the supported subset, the type mapping and the WGSL target.
//!
//! ```
//! use ringkernel_cuda_codegen::{transpile_global_kernel, dsl::*};
//!
//! let kernel: syn::ItemFn = syn::parse_quote! {
//!     fn double_all(data: &mut [f32], n: i32) {
//!         let idx = block_idx_x() * block_dim_x() + thread_idx_x();
//!         if idx >= n { return; }
//!         data[idx as usize] = data[idx as usize] * 2.0;
//!     }
//! };
//! let cuda = transpile_global_kernel(&kernel)?;
//! assert!(cuda.contains("__global__ void double_all(float* data, int n)"));
//!
//! // The same function body runs on the CPU through `dsl`:
//! let mut data = vec![1.5f32; 10];
//! launch([1, 1, 1], [16, 1, 1], || {
//!     let idx = block_idx_x() * block_dim_x() + thread_idx_x();
//!     if idx < 10 {
//!         data[idx as usize] *= 2.0;
//!     }
//! });
//! assert_eq!(data[9], 3.0);
//! # Ok::<(), syn::Error>(())
//! ```

#![warn(missing_docs)]

pub use ringkernel_codegen::{
    dsl, kernel_params, transpile_global_kernel, transpile_stencil_kernel, KernelParam, ParamKind,
    ScalarType, StencilConfig,
};

/// The WGSL target of the same translator, for code that wants both.
pub use ringkernel_codegen as codegen;
