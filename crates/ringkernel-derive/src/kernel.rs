//! `#[ring_kernel]`: a CPU handler registered by name and, with `gpu`, its CUDA and WGSL
//! translations registered as the GPU handler of the same name.

use crate::gpu_kernel::{chain, missing_carriers, split_expanded, with_handed_over};
use crate::paths::{codegen_path, core_path, ring_kernel_path};
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitStr, Type};

/// Expands `#[ring_kernel(name = "...")]` (and `#[ring_kernel(name = "...", gpu)]`) on
/// `item`.
pub fn expand(attr: TokenStream, item: ItemFn) -> syn::Result<TokenStream> {
    let (attr, got) = split_expanded(attr)?;
    let mut name: Option<LitStr> = None;
    let mut gpu = false;
    // Set on the re-invocation at the end of the hand-over chain: the function and its
    // CPU registration were emitted by the first expansion; only the GPU part is left.
    let mut gpu_only = false;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("__rk_gpu_only") {
            gpu_only = true;
            return Ok(());
        }
        if meta.path.is_ident("name") {
            if name.is_some() {
                return Err(meta.error("duplicate `name`"));
            }
            name = Some(meta.value()?.parse()?);
            Ok(())
        } else if meta.path.is_ident("gpu") {
            if gpu {
                return Err(meta.error("duplicate `gpu`"));
            }
            gpu = true;
            Ok(())
        } else {
            Err(meta.error("unknown #[ring_kernel] argument: expected `name = \"...\"` or `gpu`"))
        }
    });
    syn::parse::Parser::parse2(parser, attr.clone())?;

    let sig = &item.sig;
    let ident = &sig.ident;
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "#[ring_kernel] handlers cannot be generic: the registry needs one concrete handler per name",
        ));
    }
    if let Some(a) = &sig.asyncness {
        return Err(syn::Error::new(
            a.span,
            "#[ring_kernel] handlers are synchronous: they run on the kernel's own thread",
        ));
    }
    if let Some(v) = &sig.variadic {
        return Err(syn::Error::new(
            v.span(),
            "#[ring_kernel] handlers cannot be variadic",
        ));
    }
    if let Some(FnArg::Receiver(r)) = sig.inputs.first() {
        return Err(syn::Error::new(
            r.span(),
            "#[ring_kernel] goes on a free function, not a method",
        ));
    }
    let name = match name {
        Some(n) if n.value().is_empty() => {
            return Err(syn::Error::new(
                n.span(),
                "#[ring_kernel]: the kernel name must not be empty",
            ))
        }
        Some(n) => n.value(),
        None => ident.to_string(),
    };

    let core = core_path();
    let handler = match sig.inputs.len() {
        2 => match archived_param(&sig.inputs[1]) {
            Some(m) => quote!(#core::registry::archived_fn::<#m, _, _>(#ident)),
            None => quote!(#core::registry::handler_fn(#ident)),
        },
        3 => {
            let state_ty = match &sig.inputs[1] {
                FnArg::Typed(pt) => match &*pt.ty {
                    Type::Reference(r) if r.mutability.is_some() => (*r.elem).clone(),
                    other => return Err(syn::Error::new_spanned(
                        other,
                        "#[ring_kernel]: the state argument must be `&mut S` (S: Default + Send)",
                    )),
                },
                FnArg::Receiver(r) => return Err(syn::Error::new(r.span(), "unexpected receiver")),
            };
            let init = quote_spanned! {state_ty.span()=> <#state_ty as ::core::default::Default>::default() };
            match archived_param(&sig.inputs[2]) {
                Some(m) => {
                    quote!(#core::registry::stateful_archived_fn::<_, #m, _, _>(#init, #ident))
                }
                None => quote!(#core::registry::stateful_fn(#init, #ident)),
            }
        }
        _ => {
            return Err(syn::Error::new(
                sig.inputs.span(),
                "#[ring_kernel] handlers take `(ctx: &mut KernelContext<'_>, msg: Req)` or \
                 `(ctx: &mut KernelContext<'_>, state: &mut S, msg: Req)`",
            ))
        }
    };

    let cpu = quote! {
        #item
        #[allow(non_upper_case_globals)]
        const _: () = {
            fn __rk_factory() -> ::std::boxed::Box<dyn #core::registry::CpuHandler> {
                ::std::boxed::Box::new(#handler)
            }
            #core::__private::inventory::submit! {
                #core::registry::StaticCpuHandler { name: #name, factory: __rk_factory }
            }
        };
    };
    if !gpu {
        return Ok(cpu);
    }
    // The structs and helpers the handler names come through their hand-over macros: the
    // function and its CPU registration now, the GPU part at the end of the chain (so a
    // missing hand-over macro is the only error).
    let macs = missing_carriers(&item, &got);
    if !macs.is_empty() {
        let again = quote!(__rk_gpu_only, #attr);
        let rest = chain(&macs, &got, &ring_kernel_path(), &again, &item);
        return Ok(quote!(#cpu #rest));
    }
    let tx_item = with_handed_over(&item, &got);
    let h = ringkernel_codegen::transpile_handler(&tx_item).map_err(labelled)?;
    let gpu_part = gpu_registration(&h, &name);
    if gpu_only {
        return Ok(gpu_part);
    }
    Ok(quote!(#cpu #gpu_part))
}

/// Re-labels every message of a translator error, keeping its span.
fn labelled(e: syn::Error) -> syn::Error {
    let mut out: Option<syn::Error> = None;
    for one in e {
        let l = syn::Error::new(one.span(), format!("#[ring_kernel(gpu)]: {one}"));
        match &mut out {
            None => out = Some(l),
            Some(o) => o.combine(l),
        }
    }
    out.unwrap_or_else(|| {
        syn::Error::new(Span::call_site(), "#[ring_kernel(gpu)]: translation failed")
    })
}

/// The GPU handler of `h` registered under `name`: its sources with the type ids of its
/// messages in front, its state size and its input type; layout and plain-data checks at
/// compile time, the state's all-zero `Default` when it is built.
fn gpu_registration(h: &ringkernel_codegen::HandlerSource, name: &str) -> TokenStream {
    let core = core_path();
    let cg = codegen_path();
    let ty = |n: &str| format_ident!("{n}");
    let size_checks = h.structs.iter().map(|(n, size)| {
        let t = ty(n);
        let size = *size as usize;
        let msg = format!(
            "#[ring_kernel(gpu)]: `{n}` is not laid out as the handler's translation assumes \
             ({size} bytes, WGSL's layout): derive GpuType on it with #[repr(C)]"
        );
        quote!(assert!(::core::mem::size_of::<#t>() == #size, #msg);)
    });
    let message_types: Vec<syn::Ident> = h.type_ids.iter().map(|n| ty(n)).collect();
    let id_names = &h.type_ids;
    let input = ty(&h.message);
    let (state_bytes, state_check) = match &h.state {
        None => (0usize, TokenStream::new()),
        // A scalar state: zero is its default.
        Some((n, size)) if ringkernel_codegen::ScalarType::from_rust_name(n).is_some() => {
            (*size as usize, TokenStream::new())
        }
        Some((n, size)) => {
            let t = ty(n);
            let msg = format!(
                "handler {name:?}: the state `{n}`'s Default is not all zeros, but a GPU starts \
                 the state zeroed; make Default::default() all zeros to run it on a GPU"
            );
            (
                *size as usize,
                quote! {
                    let __rk_zero = <#t as #core::gpu_type::GpuType>::to_bytes(
                        &<#t as ::core::default::Default>::default(),
                    );
                    if __rk_zero.iter().any(|&b| b != 0) {
                        return ::core::result::Result::Err(#core::Error::invalid(#msg));
                    }
                },
            )
        }
    };
    let cuda = &h.cuda;
    let wgsl = match &h.wgsl {
        Ok(w) => quote! {
            let __rk_h = __rk_h.with_wgsl(::std::format!(
                "{}{}",
                #cg::handler_prelude(#cg::Target::Wgsl, __rk_ids),
                #w
            ));
        },
        // Only WGSL refused it (a type WGSL lacks): CUDA and the CPU still run it.
        Err(_) => TokenStream::new(),
    };
    quote! {
        #[allow(non_upper_case_globals)]
        const _: () = {
            #(#size_checks)*
            fn __rk_gpu_factory() -> #core::Result<#core::registry::GpuHandler> {
                // Messages a GPU reads and writes in place are plain data.
                fn __rk_plain<T: #core::__private::bytemuck::Pod + #core::message::RingMessage>() {}
                #(__rk_plain::<#message_types>();)*
                #state_check
                let __rk_ids: &[(&str, u32)] = &[
                    #((#id_names, <#message_types as #core::message::RingMessage>::TYPE_ID)),*
                ];
                let __rk_h = #core::registry::GpuHandler::new(#name)
                    .with_cuda(::std::format!(
                        "{}{}",
                        #cg::handler_prelude(#cg::Target::Cuda, __rk_ids),
                        #cuda
                    ))
                    .with_state_bytes(#state_bytes)
                    .with_input::<#input>();
                #wgsl
                ::core::result::Result::Ok(__rk_h)
            }
            #core::__private::inventory::submit! {
                #core::registry::StaticGpuHandler { name: #name, factory: __rk_gpu_factory }
            }
        };
    }
}

/// `M` when the parameter's type is `&Archived<M>` (a handler that reads an rkyv
/// message in place, registered through `archived_fn`).
fn archived_param(arg: &FnArg) -> Option<Type> {
    let FnArg::Typed(pt) = arg else { return None };
    let Type::Reference(r) = &*pt.ty else {
        return None;
    };
    if r.mutability.is_some() {
        return None;
    }
    let Type::Path(p) = &*r.elem else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Archived" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [syn::GenericArgument::Type(t)] => Some(t.clone()),
        _ => None,
    }
}
