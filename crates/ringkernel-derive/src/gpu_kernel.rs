//! `#[gpu_kernel]`: a Rust function in the codegen subset, kept as it is (the CPU
//! implementation) and described by a `GpuKernel` const with its CUDA C and WGSL,
//! translated here at compile time.

use crate::gpu_fn::{bare, carrier, free_calls, type_carrier, type_names};
use crate::paths::{codegen_path, gpu_kernel_path};
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use quote::{format_ident, quote};
use ringkernel_codegen::{ParamKind, ScalarType};
use syn::ItemFn;

/// Re-labels every message of a translator error, keeping its span.
fn labelled(e: syn::Error) -> syn::Error {
    let mut out: Option<syn::Error> = None;
    for one in e {
        let l = syn::Error::new(one.span(), format!("#[gpu_kernel]: {one}"));
        match &mut out {
            None => out = Some(l),
            Some(o) => o.combine(l),
        }
    }
    out.unwrap_or_else(|| syn::Error::new(Span::call_site(), "#[gpu_kernel]: translation failed"))
}

fn scalar_tokens(cg: &TokenStream, s: ScalarType) -> TokenStream {
    let v = match s {
        ScalarType::F32 => quote!(F32),
        ScalarType::F64 => quote!(F64),
        ScalarType::I32 => quote!(I32),
        ScalarType::U32 => quote!(U32),
        ScalarType::Usize => quote!(Usize),
        ScalarType::Bool => quote!(Bool),
        ScalarType::I64 => quote!(I64),
        ScalarType::U64 => quote!(U64),
    };
    quote!(#cg::ScalarType::#v)
}

/// Whether the tokens name `sync_threads` (the kernel then runs on the CPU through
/// `dsl::launch_with_barriers`).
fn uses_barrier(tokens: impl Iterator<Item = proc_macro2::TokenTree>) -> bool {
    use proc_macro2::TokenTree;
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == "sync_threads",
        TokenTree::Group(g) => uses_barrier(g.stream().into_iter()),
        _ => false,
    })
}

/// What the hand-over macros of `#[gpu_fn]` helpers and `GpuType` structs gave a
/// kernel's attribute when it is invoked again.
#[derive(Default)]
pub struct HandedOver {
    /// `#[gpu_fn]` helpers.
    pub helpers: Vec<ItemFn>,
    /// `GpuType` structs (fields only).
    pub structs: Vec<syn::ItemStruct>,
}

/// Splits `__rk_expanded (attr) [items]` (a re-invocation by the hand-over macros) into
/// the user's attribute and the items; any other attribute has none.
pub fn split_expanded(attr: TokenStream) -> syn::Result<(TokenStream, HandedOver)> {
    use proc_macro2::{Delimiter, TokenTree};
    let tts: Vec<TokenTree> = attr.clone().into_iter().collect();
    match tts.as_slice() {
        [TokenTree::Ident(i), TokenTree::Group(a), TokenTree::Group(h)]
            if i == "__rk_expanded"
                && a.delimiter() == Delimiter::Parenthesis
                && h.delimiter() == Delimiter::Bracket =>
        {
            let file: syn::File = syn::parse2(h.stream())?;
            let mut got = HandedOver::default();
            for it in file.items {
                match it {
                    syn::Item::Fn(f) => got.helpers.push(f),
                    syn::Item::Struct(st) => got.structs.push(st),
                    other => {
                        return Err(syn::Error::new_spanned(
                            other,
                            "expected a helper function or a struct",
                        ))
                    }
                }
            }
            Ok((a.stream(), got))
        }
        _ => Ok((attr, HandedOver::default())),
    }
}

/// The hand-over macros `item` still needs (its helpers' and structs' that are neither
/// defined in its body nor handed over yet), in chain order.
pub fn missing_carriers(item: &ItemFn, got: &HandedOver) -> Vec<syn::Ident> {
    // Functions called that are neither nested helpers nor `#[gpu_fn]` helpers already
    // handed over, and the structs named that are not known either.
    let mut calls = Vec::new();
    free_calls(item.block.to_token_stream(), &mut calls);
    for h in &got.helpers {
        free_calls(h.block.to_token_stream(), &mut calls);
    }
    let nested = |f: &dyn Fn(&syn::Item) -> Option<String>| -> Vec<String> {
        item.block
            .stmts
            .iter()
            .filter_map(|s| match s {
                syn::Stmt::Item(it) => f(it),
                _ => None,
            })
            .collect()
    };
    let mut known_fns = nested(&|it| match it {
        syn::Item::Fn(f) => Some(f.sig.ident.to_string()),
        _ => None,
    });
    known_fns.extend(got.helpers.iter().map(|h| h.sig.ident.to_string()));
    calls.retain(|c| !known_fns.contains(&c.to_string()));
    let mut types = Vec::new();
    type_names(item.sig.to_token_stream(), &mut types);
    type_names(item.block.to_token_stream(), &mut types);
    for h in &got.helpers {
        type_names(h.to_token_stream(), &mut types);
    }
    let mut known_types = nested(&|it| match it {
        syn::Item::Struct(s) => Some(s.ident.to_string()),
        _ => None,
    });
    known_types.extend(got.structs.iter().map(|s| s.ident.to_string()));
    types.retain(|t| !known_types.contains(&t.to_string()));
    calls
        .iter()
        .map(carrier)
        .chain(types.iter().map(type_carrier))
        .collect()
}

/// The first macro of the hand-over chain for `item` (`path` is the attribute to invoke
/// again at its end).
pub fn chain(
    macs: &[syn::Ident],
    got: &HandedOver,
    path: &TokenStream,
    attr: &TokenStream,
    item: &ItemFn,
) -> TokenStream {
    let (first, rest) = (&macs[0], &macs[1..]);
    let (helpers, structs) = (&got.helpers, &got.structs);
    quote! {
        #first! { [#(#rest),*] [#(#helpers)* #(#structs)*] {#path} (#attr) #item }
    }
}

/// `item` with the handed-over structs and helpers at the top of its body (as nested
/// ones are written): what is translated.
pub fn with_handed_over(item: &ItemFn, got: &HandedOver) -> ItemFn {
    let mut tx_item = item.clone();
    tx_item.block.stmts.splice(
        0..0,
        got.structs
            .iter()
            .map(|s| syn::Stmt::Item(syn::Item::Struct(s.clone())))
            .chain(
                got.helpers
                    .iter()
                    .map(|h| syn::Stmt::Item(syn::Item::Fn(bare(h)))),
            ),
    );
    tx_item
}

/// Expands `#[gpu_kernel]` on `item`.
pub fn expand(attr: TokenStream, item: ItemFn) -> syn::Result<TokenStream> {
    let (attr, got) = split_expanded(attr)?;
    let macs = missing_carriers(&item, &got);
    if !macs.is_empty() {
        return Ok(chain(&macs, &got, &gpu_kernel_path(), &attr, &item));
    }
    // What is translated (and kept for re-translation): the kernel with the handed-over
    // structs and helpers at the top of its body.
    let tx_item = with_handed_over(&item, &got);
    expand_resolved(attr, &item, &tx_item)
}

fn expand_resolved(attr: TokenStream, item: &ItemFn, tx_item: &ItemFn) -> syn::Result<TokenStream> {
    let mut halo: Option<syn::LitInt> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("halo") {
            if halo.is_some() {
                return Err(meta.error("duplicate `halo`"));
            }
            halo = Some(meta.value()?.parse()?);
            Ok(())
        } else {
            Err(meta.error(
                "unknown #[gpu_kernel] argument: the only one is `halo = N` for stencil kernels \
                 (the WGSL workgroup size is the launch's block size)",
            ))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    let params = ringkernel_codegen::kernel_params(tx_item).map_err(labelled)?;
    let mut stencil_dims = None;
    for (p, arg) in params.iter().zip(&item.sig.inputs) {
        match p.kind {
            ParamKind::GridPos { dims } => {
                if stencil_dims.is_some() {
                    return Err(syn::Error::new_spanned(
                        arg,
                        "#[gpu_kernel]: a stencil kernel takes one `GridPos` or `GridPos3`",
                    ));
                }
                stencil_dims = Some(dims);
            }
            ParamKind::Slice {
                elem: ScalarType::Bool,
                ..
            } => {
                return Err(syn::Error::new_spanned(
                    arg,
                    "#[gpu_kernel]: `bool` slices cannot be passed to a launch (no common layout \
                     on every backend); use `&[u32]` with 0 and 1",
                ))
            }
            _ => {}
        }
    }
    let stencil =
        match (stencil_dims, &halo) {
            (None, None) => None,
            (None, Some(h)) => {
                return Err(syn::Error::new_spanned(
                    h,
                    "#[gpu_kernel]: `halo` is for stencil kernels (with a `GridPos` parameter)",
                ))
            }
            (Some(_), None) => return Err(syn::Error::new_spanned(
                &item.sig.ident,
                "#[gpu_kernel]: a stencil kernel (a `GridPos` parameter) needs its halo width: \
                 #[gpu_kernel(halo = 1)]",
            )),
            (Some(dims), Some(h)) => {
                let halo: u32 = h.base10_parse()?;
                Some((dims, halo, h.span()))
            }
        };
    let config = stencil.map(|(dims, halo, _)| {
        if dims == 3 {
            ringkernel_codegen::StencilConfig::new_3d(halo)
        } else {
            ringkernel_codegen::StencilConfig::new(halo)
        }
    });
    let cuda = match &config {
        None => ringkernel_codegen::transpile_global_kernel(tx_item),
        Some(cfg) => ringkernel_codegen::transpile_stencil_kernel(tx_item, cfg),
    }
    .map_err(labelled)?;
    let wgsl_result = match &config {
        None => ringkernel_codegen::transpile_global_kernel_wgsl(tx_item),
        Some(cfg) => ringkernel_codegen::transpile_stencil_kernel_wgsl(tx_item, cfg),
    };
    let wgsl = match wgsl_result {
        Ok(k) => {
            let s = k.source;
            quote!(::core::result::Result::Ok(#s))
        }
        // Only the WGSL target refused it (an f64, say): the kernel still runs on the CPU
        // and CUDA; a launch on wgpu or Metal reports this message.
        Err(e) => {
            let msg = e
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            quote!(::core::result::Result::Err(#msg))
        }
    };

    let cg = codegen_path();
    let ident = &item.sig.ident;
    let vis = &item.vis;
    let name = ident.to_string();
    let const_ident = format_ident!("{}", name.to_uppercase(), span = ident.span());
    let rust_source = quote!(#tx_item).to_string();

    let static_params = params.iter().map(|p| {
        let n = &p.name;
        let kind = match p.kind {
            ParamKind::Scalar(s) => {
                let s = scalar_tokens(&cg, s);
                quote!(#cg::ParamKind::Scalar(#s))
            }
            ParamKind::Slice { elem, mutable } => {
                let e = scalar_tokens(&cg, elem);
                quote!(#cg::ParamKind::Slice { elem: #e, mutable: #mutable })
            }
            ParamKind::GridPos { dims } => quote!(#cg::ParamKind::GridPos { dims: #dims }),
            ParamKind::Struct { name, size } => {
                quote!(#cg::ParamKind::Struct { name: #name, size: #size })
            }
            ParamKind::StructSlice {
                name,
                size,
                mutable,
            } => {
                quote!(#cg::ParamKind::StructSlice { name: #name, size: #size, mutable: #mutable })
            }
        };
        quote!(#cg::launch::StaticParam { name: #n, kind: #kind })
    });
    // The translator's layout of each struct parameter is the Rust one.
    let size_checks = params.iter().filter_map(|p| match p.kind {
        ParamKind::Struct { name, size } | ParamKind::StructSlice { name, size, .. } => {
            let t = format_ident!("{name}");
            let size = size as usize;
            let msg = format!(
                "#[gpu_kernel]: `{name}` is not laid out as the kernel's translation assumes \
                 ({size} bytes, WGSL's layout): derive GpuType on it with #[repr(C)]"
            );
            Some(quote!(assert!(::core::mem::size_of::<#t>() == #size, #msg);))
        }
        _ => None,
    });

    let n_args = params
        .iter()
        .filter(|p| !matches!(p.kind, ParamKind::GridPos { .. }))
        .count();
    let arg_idents: Vec<_> = (0..n_args).map(|i| format_ident!("__rk_a{i}")).collect();
    let mut binds = Vec::new();
    let mut call_args = Vec::new();
    let mut next = 0;
    for p in &params {
        let pname = &p.name;
        if let ParamKind::GridPos { .. } = p.kind {
            call_args.push(quote!(__rk_pos));
            continue;
        }
        let a = &arg_idents[next];
        let v = format_ident!("__rk_p{next}");
        next += 1;
        let (ty, call) = match p.kind {
            ParamKind::Scalar(s) => {
                let t = format_ident!("{}", s.rust_name());
                (quote!(#t), quote!(#v))
            }
            ParamKind::Slice {
                elem,
                mutable: false,
            } => {
                let t = format_ident!("{}", elem.rust_name());
                (quote!(&[#t]), quote!(#v))
            }
            ParamKind::Slice {
                elem,
                mutable: true,
            } => {
                let t = format_ident!("{}", elem.rust_name());
                (quote!(&mut [#t]), quote!(&mut *#v))
            }
            ParamKind::Struct { name, .. } => {
                let t = format_ident!("{name}");
                binds.push(quote! {
                    let #v: #t = #cg::launch::struct_arg::<#t>(#a, #pname)?;
                });
                call_args.push(quote!(#v));
                continue;
            }
            ParamKind::StructSlice { name, mutable, .. } => {
                let t = format_ident!("{name}");
                if mutable {
                    binds.push(quote! {
                        let #v: &mut [#t] = #cg::launch::struct_slice_mut_arg::<#t>(#a, #pname)?;
                    });
                    call_args.push(quote!(&mut *#v));
                } else {
                    binds.push(quote! {
                        let #v: &[#t] = #cg::launch::struct_slice_arg::<#t>(#a, #pname)?;
                    });
                    call_args.push(quote!(#v));
                }
                continue;
            }
            ParamKind::GridPos { .. } => unreachable!("handled above"),
        };
        binds.push(quote! {
            let #v: #ty = #cg::launch::FromArg::from_arg(#a, #pname)?;
        });
        call_args.push(call);
    }
    let run = match stencil {
        None if uses_barrier(quote!(#tx_item).into_iter()) => quote! {
            #cg::dsl::launch_with_barriers(grid, block, || #ident(#(#call_args),*));
        },
        None => quote! {
            #cg::dsl::launch(grid, block, || #ident(#(#call_args),*));
        },
        Some((2, halo, _)) => quote! {
            let _ = block;
            #cg::dsl::stencil_2d(grid[0], grid[1], #halo, |__rk_pos| #ident(#(#call_args),*));
        },
        Some((_, halo, _)) => quote! {
            let _ = block;
            #cg::dsl::stencil_3d(grid[0], grid[1], grid[2], #halo, |__rk_pos| #ident(#(#call_args),*));
        },
    };
    let stencil_tokens = match stencil {
        None => quote!(::core::option::Option::None),
        Some((dims, halo, _)) => {
            quote!(::core::option::Option::Some(#cg::launch::StencilInfo { dims: #dims, halo: #halo }))
        }
    };
    let count = n_args;
    let doc = format!(
        "The `{name}` kernel, written in Rust and translated to CUDA C and WGSL by \
         `#[gpu_kernel]`: launch it with `Device::launch`."
    );

    Ok(quote! {
        #item

        const _: () = { #(#size_checks)* };

        #[doc = #doc]
        #[allow(non_upper_case_globals)]
        #vis const #const_ident: #cg::launch::GpuKernel = #cg::launch::GpuKernel {
            name: #name,
            params: &[#(#static_params),*],
            rust_source: #rust_source,
            cuda_source: #cuda,
            wgsl_source: #wgsl,
            cpu: {
                fn __rk_cpu_entry(
                    grid: [u32; 3],
                    block: [u32; 3],
                    args: &mut [#cg::launch::KernelArg<'_>],
                ) -> ::core::result::Result<(), #cg::launch::ArgError> {
                    let got = args.len();
                    let [#(#arg_idents),*] = args else {
                        return ::core::result::Result::Err(#cg::launch::ArgError::Count {
                            kernel: #name,
                            expected: #count,
                            got,
                        });
                    };
                    #(#binds)*
                    #run
                    ::core::result::Result::Ok(())
                }
                __rk_cpu_entry
            },
            stencil: #stencil_tokens,
        };
    })
}
