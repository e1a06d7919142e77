//! `#[derive(RingMessage)]`.
//!
//! Two kinds of message come out of it:
//!
//! * a `#[repr(C)]`/`#[repr(transparent)]` struct is plain data: `bytemuck::Pod` is
//!   checked and implemented, the payload is the value's bytes;
//! * any other (non-generic) struct is archived with rkyv: the derive emits a hidden
//!   shadow struct with rkyv's remote derive (`#[rkyv(remote = TheStruct)]`) and
//!   implements `rkyv::Archive`/`Serialize`/`Deserialize` for the struct itself through
//!   it, so the struct needs no other derive and can be nested in other rkyv types.

use crate::paths::core_path;
use crate::plain::{has_fixed_repr, parse_plain, pod_checks, pod_impls, reject_generics};
use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Expr, Fields, LitStr, Member, Type};

/// The arguments of `#[message(type_id = N, name = "...")]`.
struct MessageArgs {
    type_id: Expr,
    name: Option<LitStr>,
}

fn parse_args(input: &DeriveInput) -> syn::Result<MessageArgs> {
    let mut type_id: Option<Expr> = None;
    let mut name: Option<LitStr> = None;
    let mut seen = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("message")) {
        if seen {
            return Err(syn::Error::new_spanned(
                attr,
                "duplicate #[message(...)] attribute",
            ));
        }
        seen = true;
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("type_id") {
                if type_id.is_some() {
                    return Err(meta.error("duplicate `type_id`"));
                }
                type_id = Some(meta.value()?.parse()?);
                Ok(())
            } else if meta.path.is_ident("name") {
                if name.is_some() {
                    return Err(meta.error("duplicate `name`"));
                }
                name = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error(
                    "unknown #[message] argument: expected `type_id = N` or `name = \"...\"`",
                ))
            }
        })?;
    }
    match type_id {
        Some(type_id) => Ok(MessageArgs { type_id, name }),
        None => Err(syn::Error::new(
            input.ident.span(),
            "#[derive(RingMessage)] needs a stable message type id: add #[message(type_id = N)] \
             (a u32 unique among the message types of your program)",
        )),
    }
}

/// The field marked `#[message(id)]`, if any: its member and type. Two marked fields,
/// an unknown field argument or a type other than `MessageId` are errors.
fn id_field(fields: &Fields) -> syn::Result<Option<(Member, Type)>> {
    let mut found: Option<(Member, Type)> = None;
    for (i, f) in fields.iter().enumerate() {
        let mut marked = false;
        for attr in f.attrs.iter().filter(|a| a.path().is_ident("message")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("id") {
                    marked = true;
                    Ok(())
                } else {
                    Err(meta.error(
                        "unknown #[message] field argument: expected `id` (the field that carries the message id)",
                    ))
                }
            })?;
        }
        if !marked {
            continue;
        }
        if found.is_some() {
            return Err(syn::Error::new_spanned(
                f,
                "#[derive(RingMessage)]: only one field can be #[message(id)]",
            ));
        }
        let is_message_id = match &f.ty {
            Type::Path(p) => p
                .path
                .segments
                .last()
                .is_some_and(|s| s.ident == "MessageId" && s.arguments.is_empty()),
            _ => false,
        };
        if !is_message_id {
            return Err(syn::Error::new_spanned(
                &f.ty,
                "#[derive(RingMessage)]: the #[message(id)] field must have type `MessageId` \
                 (ringkernel::message::MessageId)",
            ));
        }
        let member = match &f.ident {
            Some(id) => Member::Named(id.clone()),
            None => Member::Unnamed(syn::Index::from(i)),
        };
        found = Some((member, f.ty.clone()));
    }
    Ok(found)
}

/// Expands `#[derive(RingMessage)]`.
pub fn derive(input: DeriveInput) -> syn::Result<TokenStream> {
    let args = parse_args(&input)?;
    let core = core_path();
    let ident = &input.ident;
    let type_id = &args.type_id;
    let name = args
        .name
        .map(|n| n.value())
        .unwrap_or_else(|| ident.to_string());

    let fields = match &input.data {
        Data::Struct(s) => &s.fields,
        // parse_plain words the errors for enums and unions.
        _ => return parse_plain(&input, "RingMessage").map(|_| TokenStream::new()),
    };
    let id = id_field(fields)?;
    let set_id = match &id {
        Some((member, ty)) => quote_spanned! {ty.span()=>
            #[inline]
            fn set_message_id(&mut self, id: #core::message::MessageId) {
                self.#member = id;
            }
        },
        None => TokenStream::new(),
    };
    let ring_message = quote! {
        impl #core::message::RingMessage for #ident {
            const TYPE_ID: u32 = #type_id;
            const NAME: &'static str = #name;
            #set_id
        }
    };

    if has_fixed_repr(&input)? {
        // Plain data: the value's bytes are the payload.
        let s = parse_plain(&input, "RingMessage")?;
        let checks = pod_checks(&s, &core, "RingMessage");
        let impls = pod_impls(&s, &core);
        return Ok(quote! {
            #checks
            #impls
            #ring_message
        });
    }

    reject_generics(&input, "RingMessage")?;
    let rkyv_impls = rkyv_impls(&input, fields, &core)?;
    Ok(quote! {
        #rkyv_impls
        #ring_message
    })
}

/// rkyv `Archive`/`Serialize`/`Deserialize` for the struct through a remote-derived
/// shadow, and its `MessageCodec`.
fn rkyv_impls(
    input: &DeriveInput,
    fields: &Fields,
    core: &TokenStream,
) -> syn::Result<TokenStream> {
    let ident = &input.ident;
    let vis = &input.vis;
    let shadow = format_ident!("__RkShadow{}", ident);
    let archived = format_ident!("Archived{}", ident);
    let rk = quote!(#core::rkyv);

    let (shadow_body, from_body) = match fields {
        Fields::Named(named) => {
            let decl = named.named.iter().map(|f| {
                let (fv, fi, ft) = (&f.vis, &f.ident, &f.ty);
                quote!(#fv #fi: #ft)
            });
            let moves = named.named.iter().map(|f| {
                let fi = &f.ident;
                quote!(#fi: s.#fi)
            });
            (quote!({ #(#decl),* }), quote!(#ident { #(#moves),* }))
        }
        Fields::Unnamed(unnamed) => {
            let decl = unnamed.unnamed.iter().map(|f| {
                let (fv, ft) = (&f.vis, &f.ty);
                quote!(#fv #ft)
            });
            let moves = (0..unnamed.unnamed.len()).map(|i| {
                let i = syn::Index::from(i);
                quote!(s.#i)
            });
            (quote!(( #(#decl),* );), quote!(#ident( #(#moves),* )))
        }
        Fields::Unit => (quote!(;), quote!(#ident)),
    };

    Ok(quote! {
        const _: () = {
            #[derive(#rk::Archive, #rk::Serialize, #rk::Deserialize)]
            #[rkyv(remote = #ident, crate = #rk, archived = #archived)]
            #[allow(dead_code, non_camel_case_types)]
            #vis struct #shadow #shadow_body

            impl ::core::convert::From<#shadow> for #ident {
                #[inline]
                fn from(s: #shadow) -> Self {
                    #from_body
                }
            }

            impl #rk::Archive for #ident {
                type Archived = <#shadow as #rk::with::ArchiveWith<#ident>>::Archived;
                type Resolver = <#shadow as #rk::with::ArchiveWith<#ident>>::Resolver;
                #[inline]
                fn resolve(&self, resolver: Self::Resolver, out: #rk::Place<Self::Archived>) {
                    <#shadow as #rk::with::ArchiveWith<#ident>>::resolve_with(self, resolver, out)
                }
            }

            impl<__S> #rk::Serialize<__S> for #ident
            where
                __S: #rk::rancor::Fallible + ?Sized,
                #shadow: #rk::with::SerializeWith<#ident, __S>,
            {
                #[inline]
                fn serialize(
                    &self,
                    serializer: &mut __S,
                ) -> ::core::result::Result<Self::Resolver, <__S as #rk::rancor::Fallible>::Error> {
                    <#shadow as #rk::with::SerializeWith<#ident, __S>>::serialize_with(self, serializer)
                }
            }

            impl<__D> #rk::Deserialize<#ident, __D> for #archived
            where
                __D: #rk::rancor::Fallible + ?Sized,
                #shadow: #rk::with::DeserializeWith<#archived, #ident, __D>,
            {
                #[inline]
                fn deserialize(
                    &self,
                    deserializer: &mut __D,
                ) -> ::core::result::Result<#ident, <__D as #rk::rancor::Fallible>::Error> {
                    <#shadow as #rk::with::DeserializeWith<#archived, #ident, __D>>::deserialize_with(
                        self,
                        deserializer,
                    )
                }
            }

            impl #core::message::MessageCodec for #ident {
                const ENCODING: #core::message::Encoding = #core::message::Encoding::Rkyv;
                #[inline]
                fn to_payload(&self) -> #core::Result<#core::message::Payload<'_>> {
                    #core::message::rkyv_encode(self, <Self as #core::message::RingMessage>::NAME)
                }
                #[inline]
                fn from_payload(payload: &[u8], name: &'static str) -> #core::Result<Self> {
                    #core::message::rkyv_decode::<Self>(payload, name)
                }
            }
        };
    })
}
