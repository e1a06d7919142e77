//! Where the generated code finds `ringkernel-core`.

use proc_macro2::{Span, TokenStream};
use proc_macro_crate::{crate_name, FoundCrate};
use quote::quote;

/// The path of `ringkernel-core` as the user's crate sees it: `::ringkernel_core` (or
/// its renamed form) when the user depends on it directly, `::ringkernel::core` (or the
/// facade's renamed form) when the user depends only on the `ringkernel` facade.
pub fn core_path() -> TokenStream {
    match crate_name("ringkernel-core") {
        // Inside ringkernel-core's own tests, examples and doc tests the crate is an
        // extern crate under its own name.
        Ok(FoundCrate::Itself) => quote!(::ringkernel_core),
        Ok(FoundCrate::Name(n)) => {
            let id = syn::Ident::new(&n, Span::call_site());
            quote!(::#id)
        }
        Err(_) => match crate_name("ringkernel") {
            Ok(FoundCrate::Itself) => quote!(::ringkernel::core),
            Ok(FoundCrate::Name(n)) => {
                let id = syn::Ident::new(&n, Span::call_site());
                quote!(::#id::core)
            }
            // Neither found (e.g. an unusual build system): assume the direct name.
            Err(_) => quote!(::ringkernel_core),
        },
    }
}

/// The path of `ringkernel-codegen` as the user's crate sees it: `::ringkernel_codegen`
/// with a direct dependency, `::ringkernel::codegen` through the facade,
/// `::ringkernel_cuda_codegen::codegen` through the CUDA-named re-export.
pub fn codegen_path() -> TokenStream {
    let named = |n: String| {
        let id = syn::Ident::new(&n, Span::call_site());
        quote!(::#id)
    };
    if let Ok(found) = crate_name("ringkernel-codegen") {
        return match found {
            FoundCrate::Itself => quote!(::ringkernel_codegen),
            FoundCrate::Name(n) => named(n),
        };
    }
    if let Ok(found) = crate_name("ringkernel") {
        return match found {
            FoundCrate::Itself => quote!(::ringkernel::codegen),
            FoundCrate::Name(n) => {
                let p = named(n);
                quote!(#p::codegen)
            }
        };
    }
    match crate_name("ringkernel-cuda-codegen") {
        Ok(FoundCrate::Itself) => quote!(::ringkernel_cuda_codegen::codegen),
        Ok(FoundCrate::Name(n)) => {
            let p = named(n);
            quote!(#p::codegen)
        }
        Err(_) => quote!(::ringkernel_codegen),
    }
}

/// The path of the `gpu_kernel` attribute as the user's crate sees it (for the
/// `#[gpu_fn]` hand-over, which invokes it again): `::ringkernel_derive::gpu_kernel` with
/// a direct dependency, else `::ringkernel::gpu_kernel` through the facade.
pub fn gpu_kernel_path() -> TokenStream {
    attribute_path("gpu_kernel")
}

/// The path of the `ring_kernel` attribute as the user's crate sees it (see
/// [`gpu_kernel_path`]).
pub fn ring_kernel_path() -> TokenStream {
    attribute_path("ring_kernel")
}

fn attribute_path(attr: &str) -> TokenStream {
    let a = syn::Ident::new(attr, Span::call_site());
    let named = |n: String| {
        let id = syn::Ident::new(&n, Span::call_site());
        quote!(::#id)
    };
    match crate_name("ringkernel-derive") {
        Ok(FoundCrate::Itself) => quote!(::ringkernel_derive::#a),
        Ok(FoundCrate::Name(n)) => {
            let p = named(n);
            quote!(#p::#a)
        }
        Err(_) => match crate_name("ringkernel") {
            Ok(FoundCrate::Name(n)) => {
                let p = named(n);
                quote!(#p::#a)
            }
            _ => quote!(::ringkernel::#a),
        },
    }
}
