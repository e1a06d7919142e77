//! Actor handlers: a `#[ring_kernel(gpu)]` function translated to the `handle` function of
//! the CUDA persistent template (`ringkernel-cuda`'s `kernels/ringkernel.cuh` documents
//! its ABI) and of the WGSL drain template (`ringkernel_shaders::drain`).
//!
//! The message, the reply and the K2K messages are `GpuType` structs: CUDA reads and
//! writes them in place (`*(M*)in_payload`), WGSL through generated functions that move
//! them word by word between the slot words and the struct. Type ids are the constants
//! `RK_TID_<Name>` the runtime defines in front of the source (see
//! [`crate::handler_prelude`]). The state is the kernel's state buffer: a C++ reference
//! on CUDA, a local on WGSL loaded at the start and stored at every exit.

use super::*;

/// The handler being translated.
#[derive(Debug, Clone)]
pub(crate) struct HandlerMode {
    /// Rust name of the context parameter.
    ctx: String,
    /// Emitted name and type of the state, when there is one.
    state: Option<(String, Ty)>,
    /// `Some(R)` for `-> Option<R>`.
    reply: Option<String>,
    /// Struct names of the messages the handler writes (reply and K2K sends).
    outputs: Vec<String>,
    /// The handler sends K2K messages.
    sends: bool,
}

/// One target's translation of a handler.
#[derive(Debug, Clone)]
pub(crate) struct HandlerParts {
    /// The handler source for the template (defines `handle`).
    pub(crate) text: String,
    /// Messages are handled one at a time, in order (state or K2K sends).
    pub(crate) serial: bool,
    /// The input message's struct.
    pub(crate) message: String,
    /// The reply's struct (`-> Option<R>`).
    pub(crate) reply: Option<String>,
    /// The state's type (`None`: no state) and its size in bytes.
    pub(crate) state: Option<(String, u32)>,
    /// Structs the handler writes as messages (reply, sends).
    pub(crate) outputs: Vec<String>,
    /// Every struct with its size.
    pub(crate) structs: Vec<(String, u32)>,
}

const SIGNATURE: &str = "a GPU handler is `fn name(ctx: &mut KernelContext<'_>, msg: M) -> R` or \
     `fn name(ctx: &mut KernelContext<'_>, state: &mut S, msg: M) -> R`, where M is a \
     `#[repr(C)]` message that derives `GpuType`, S a `GpuType` struct (or u32, i32, f32) and R \
     is `()` or `Option<Reply>` (a `GpuType` message)";

/// The ABI's names, which user names must not take.
const ABI_NAMES: &[&str] = &[
    "handle",
    "ctx",
    "in_hdr",
    "in_payload",
    "out_hdr",
    "out_payload",
    "in_slot",
    "out_slot",
    "state",
];

impl Tx {
    /// Translates the handler `f` for this target.
    pub(crate) fn handler(mut self, f: &syn::ItemFn) -> Res<HandlerParts> {
        let sig = &f.sig;
        plain_signature(sig, "GPU handlers")?;
        self.structs = Rc::new(Structs::of(f)?);
        for d in self.structs.iter() {
            self.names.reserve(&d.name);
        }
        for n in ABI_NAMES {
            self.names.reserve(n);
        }
        let nested = helpers::nested_helpers(f);
        if !nested.is_empty() {
            let (sigs, text) = helpers::translate_helpers(&nested, self.target, &self.structs)?;
            self.helpers = sigs;
            self.helper_text = text;
        }

        // Parameters: the context, the state, the message.
        let params: Vec<&syn::PatType> = sig
            .inputs
            .iter()
            .map(|a| match a {
                syn::FnArg::Typed(pt) => Ok(pt),
                syn::FnArg::Receiver(r) => err(r, SIGNATURE),
            })
            .collect::<Res<_>>()?;
        let (ctx, state, msg) = match params.as_slice() {
            [c, m] => (*c, None, *m),
            [c, s, m] => (*c, Some(*s), *m),
            _ => return err(&sig.inputs, SIGNATURE),
        };
        let ctx_ident = plain_ident(ctx)?;
        if !is_context_ref(&ctx.ty) {
            return err(&ctx.ty, SIGNATURE);
        }
        let state =
            match state {
                None => None,
                Some(s) => {
                    let ident = plain_ident(s)?;
                    let syn::Type::Reference(r) = &*s.ty else {
                        return err(
                            &s.ty,
                            format!("the state parameter is `&mut S`; {SIGNATURE}"),
                        );
                    };
                    if r.mutability.is_none() {
                        return err(
                            &s.ty,
                            format!("the state parameter is `&mut S`; {SIGNATURE}"),
                        );
                    }
                    let ty = self.parse_ty(&r.elem)?;
                    match &ty {
                        Ty::Struct(_)
                        | Ty::Scalar(ScalarType::U32 | ScalarType::I32 | ScalarType::F32) => {}
                        _ => return err(
                            &r.elem,
                            "the state is a GpuType struct or a u32, i32 or f32 (the GPU keeps \
                             it in the kernel's state buffer, zeroed at launch)",
                        ),
                    }
                    Some((ident, ty))
                }
            };
        let msg_ident = plain_ident(msg)?;
        let msg_mut = match &*msg.pat {
            Pat::Ident(pi) => pi.mutability.is_some(),
            _ => false,
        };
        let message = match self.parse_ty(&msg.ty)? {
            Ty::Struct(n) => n,
            other => {
                return err(
                    &msg.ty,
                    format!(
                        "a GPU handler's message is a `#[repr(C)]` struct that derives GpuType, \
                         not `{}`",
                        other.describe()
                    ),
                )
            }
        };
        let reply = match &sig.output {
            syn::ReturnType::Default => None,
            syn::ReturnType::Type(_, t) => match option_of(t) {
                Some(inner) => match self.parse_ty(inner)? {
                    Ty::Struct(n) => Some(n),
                    other => {
                        return err(
                            inner,
                            format!(
                                "a GPU handler replies with a GpuType message, not `{}`",
                                other.describe()
                            ),
                        )
                    }
                },
                None if matches!(&**t, syn::Type::Tuple(tt) if tt.elems.is_empty()) => None,
                None => {
                    return err(
                        t,
                        format!("GPU handlers return `()` or `Option<Reply>`; {SIGNATURE}"),
                    )
                }
            },
        };

        // Scope: the context, the state, the message.
        let scope = self.scopes.last_mut().expect("a scope is always open");
        scope.insert(
            ctx_ident.to_string(),
            Var {
                emitted: "ctx".into(),
                ty: Ty::Context,
                mutable: false,
                by_ref: false,
            },
        );
        let state = match state {
            None => None,
            Some((ident, ty)) => {
                self.scopes.last_mut().expect("scope").insert(
                    ident.to_string(),
                    Var {
                        emitted: "state".into(),
                        ty: ty.clone(),
                        mutable: true,
                        by_ref: true,
                    },
                );
                Some(("state".to_string(), ty))
            }
        };
        let msg_emitted = self.declare(msg_ident, Ty::Struct(message.clone()), msg_mut)?;
        self.handler = Some(HandlerMode {
            ctx: ctx_ident.to_string(),
            state: state.clone(),
            reply: reply.clone(),
            outputs: Vec::new(),
            sends: false,
        });

        // Body (indent 1).
        match &reply {
            Some(_) => self.block_stmts(&f.block, Some(("", &Ty::Reply)))?,
            None => {
                self.block_stmts(&f.block, None)?;
                self.exit(None)?;
            }
        }
        let body = std::mem::take(&mut self.out);
        let mode = self.handler.clone().expect("set above");
        let serial = state.is_some() || mode.sends;
        let msg_def = self.struct_def(&message);

        // Prologue: check the message, read it, bind the state.
        let mut pro = String::new();
        let state_def = match &state {
            Some((_, Ty::Struct(n))) => Some(self.struct_def(n)),
            _ => None,
        };
        let state_info = state.as_ref().map(|(_, ty)| match ty {
            Ty::Struct(n) => (n.clone(), self.struct_def(n).size),
            Ty::Scalar(s) => (s.rust_name().to_string(), 4),
            _ => unreachable!("checked above"),
        });
        let mut text = String::new();
        if self.cuda() {
            let _ = writeln!(
                pro,
                "    if (in_hdr->type_id != RK_TID_{message} || in_hdr->payload_len != (rk_u32)sizeof({message})) return -(int)RK_ERR_HANDLER;"
            );
            let _ = writeln!(
                pro,
                "    {}{message} {msg_emitted} = *(const {message}*)in_payload;",
                if msg_mut { "" } else { "const " }
            );
            match &state {
                Some((_, Ty::Struct(n))) => {
                    let _ = writeln!(pro, "    {n}& state = *({n}*)rk_state;");
                }
                Some((_, Ty::Scalar(s))) => {
                    let t = s.cuda_name();
                    let _ = writeln!(pro, "    {t}& state = *({t}*)rk_state;");
                }
                _ => {
                    let _ = writeln!(pro, "    (void)rk_state;");
                }
            }
            if serial {
                text.push_str("#define RK_HANDLER_SERIAL 1\n");
            }
            text.push_str(&self.structs.declarations(Target::Cuda));
            text.push_str(&self.helper_text);
            text.push_str(
                "__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const \
                 unsigned char* in_payload, RkMessageHeader* out_hdr, unsigned char* \
                 out_payload, void* rk_state) {\n",
            );
            text.push_str(&pro);
            text.push_str(&body);
            text.push_str("    return 0;\n}\n");
        } else {
            let _ = writeln!(
                pro,
                "    if ((*ctx).request.type_id != RK_TID_{message} || (*ctx).request.payload_len != {}u) {{ return RK_ERR_TYPE_MISMATCH; }}",
                msg_def.size
            );
            let _ = writeln!(
                pro,
                "    var {msg_emitted}: {message} = rk_ld_in_{message}(in_slot);"
            );
            match &state {
                Some((_, Ty::Struct(n))) => {
                    let _ = writeln!(pro, "    var state: {n} = rk_ld_state_{n}(0u);");
                }
                Some((_, Ty::Scalar(s))) => {
                    let t = s.wgsl_name().expect("32-bit state");
                    let _ = writeln!(pro, "    var state: {t} = {};", word_to(*s, "rk_state[0u]"));
                }
                _ => {}
            }
            let _ = writeln!(pro, "    var rk_outs: u32 = 0u;");
            if serial {
                text.push_str("const RK_SERIAL: bool = true;\n\n");
            }
            text.push_str(&self.structs.declarations(Target::Wgsl));
            text.push_str(&wgsl_load("in", "rk_input", &msg_def));
            for o in &mode.outputs {
                text.push_str(&wgsl_store("out", "rk_output", &self.struct_def(o)));
            }
            if let Some(d) = &state_def {
                text.push_str(&wgsl_load("state", "rk_state", d));
                text.push_str(&wgsl_store("state", "rk_state", d));
            }
            text.push_str(&self.helper_text);
            text.push_str(
                "fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {\n",
            );
            text.push_str(&pro);
            text.push_str(&body);
            text.push_str("    return 0u;\n}\n");
        }
        Ok(HandlerParts {
            text,
            serial,
            message,
            reply,
            state: state_info,
            outputs: mode.outputs,
            structs: self
                .structs
                .iter()
                .map(|d| (d.name.clone(), d.size))
                .collect(),
        })
    }

    /// The handler's state stored back (WGSL keeps it in a local).
    fn store_state(&mut self) {
        if self.cuda() {
            return;
        }
        let Some(HandlerMode {
            state: Some((_, ty)),
            ..
        }) = &self.handler
        else {
            return;
        };
        let line = match ty {
            Ty::Struct(n) => format!("rk_st_state_{n}(0u, state);"),
            Ty::Scalar(s) => format!("rk_state[0u] = {};", to_word(*s, "state")),
            _ => return,
        };
        self.line(&line);
    }

    /// Leaves the handler: with the reply `value` (a struct expression) or without one.
    pub(super) fn exit(&mut self, value: Option<&Expr>) -> Res<()> {
        let Some(e) = value else {
            self.store_state();
            self.line(if self.cuda() {
                "return 0;"
            } else {
                "return 0u;"
            });
            return Ok(());
        };
        let want = self
            .handler
            .as_ref()
            .and_then(|h| h.reply.clone())
            .expect("replies are checked by the caller");
        let (code, t) = self.expr(e, Some(&Ty::Struct(want.clone())))?;
        self.expect_ty(&t, &Ty::Struct(want.clone()), e)?;
        self.note_output(&want);
        if self.cuda() {
            self.line("{");
            self.indent += 1;
            self.fits_check(&want);
            self.line(&format!("*({want}*)out_payload = {code};"));
            self.line(&format!("out_hdr->type_id = RK_TID_{want};"));
            self.line(&format!("out_hdr->payload_len = (rk_u32)sizeof({want});"));
            self.line("return 1;");
            self.indent -= 1;
            self.line("}");
        } else {
            let size = self.struct_def(&want).size;
            self.line("{");
            self.indent += 1;
            self.second_output_check();
            self.fits_check(&want);
            self.line(&format!("rk_st_out_{want}(out_slot, {code});"));
            self.line(&format!("rk_reply(ctx, RK_TID_{want}, {size}u);"));
            self.store_state();
            self.line("return 0u;");
            self.indent -= 1;
            self.line("}");
        }
        Ok(())
    }

    /// WGSL: the drain template carries one output per message; a second one drops the
    /// message with `RK_ERR_SECOND_OUTPUT`.
    fn second_output_check(&mut self) {
        self.line("if (rk_outs != 0u) {");
        self.indent += 1;
        self.store_state();
        self.line("return RK_ERR_SECOND_OUTPUT;");
        self.indent -= 1;
        self.line("}");
        self.line("rk_outs = 1u;");
    }

    /// A message of struct `name` must fit the kernel's slots (the launch's slot size):
    /// else the request is dropped with an error (CUDA `RK_ERR_HANDLER`, WGSL
    /// `RK_ERR_OUTPUT_TOO_LARGE`), as the CPU's reply or send fails with
    /// `MessageTooLarge`.
    fn fits_check(&mut self, name: &str) {
        if self.cuda() {
            self.line(&format!(
                "if ((rk_u32)sizeof({name}) > ctx->max_payload) return -(int)RK_ERR_HANDLER;"
            ));
        } else {
            let words = self.struct_def(name).size / 4;
            self.line(&format!(
                "if ({words}u > rk_params.slot_words - RK_HEADER_WORDS) {{"
            ));
            self.indent += 1;
            self.store_state();
            self.line("return RK_ERR_OUTPUT_TOO_LARGE;");
            self.indent -= 1;
            self.line("}");
        }
    }

    fn note_output(&mut self, name: &str) {
        let h = self.handler.as_mut().expect("in a handler");
        if !h.outputs.iter().any(|o| o == name) {
            h.outputs.push(name.to_string());
        }
    }

    /// The tail of an `Option<R>` handler, or `return None;` / `return Some(r);`.
    pub(super) fn reply_exit(&mut self, e: &Expr) -> Res<()> {
        match peel(e) {
            Expr::Path(p) if p.path.is_ident("None") => self.exit(None),
            Expr::Call(c)
                if matches!(peel(&c.func), Expr::Path(p) if p.path.is_ident("Some"))
                    && c.args.len() == 1 =>
            {
                self.exit(Some(&c.args[0]))
            }
            other => err(
                other,
                "an `Option<Reply>` handler ends in `Some(reply)` or `None` (or an \
                 `if`/`match` whose branches do)",
            ),
        }
    }

    /// `return ...;` in a handler.
    pub(super) fn handler_return(&mut self, r: &syn::ExprReturn) -> Res<()> {
        let has_reply = self.handler.as_ref().is_some_and(|h| h.reply.is_some());
        match (&r.expr, has_reply) {
            (None, false) => self.exit(None),
            (Some(v), true) => self.reply_exit(v),
            (None, true) => err(
                r,
                "this handler returns `Option<Reply>`: `return None;` or `return Some(reply);`",
            ),
            (Some(v), false) => err(v, "this handler returns nothing: `return;`"),
        }
    }

    /// Whether `e` is a call of a method of the handler's context.
    pub(super) fn is_ctx_call(&self, e: &Expr, method: &str) -> bool {
        let Some(h) = &self.handler else {
            return false;
        };
        matches!(peel(e), Expr::MethodCall(mc)
            if mc.method == method && matches!(peel(&mc.receiver), Expr::Path(p) if p.path.is_ident(&h.ctx)))
    }

    /// `ctx.send_to(KernelId(dest), &msg)` as a statement (also `let _ = ..;` and
    /// `.ok();`): a K2K send. The GPU waits while the destination's queue is full.
    pub(super) fn send_stmt(&mut self, e: &Expr) -> Res<()> {
        let Expr::MethodCall(mc) = peel(e) else {
            unreachable!("checked by is_ctx_call");
        };
        let usage = "K2K sends are `ctx.send_to(KernelId(dest), &message)` with `dest` a u32 and \
                     the message a GpuType struct, as a statement";
        if mc.args.len() != 2 || mc.turbofish.is_some() {
            return err(mc, usage);
        }
        let dest = match peel(&mc.args[0]) {
            Expr::Call(c)
                if matches!(peel(&c.func), Expr::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "KernelId"))
                    && c.args.len() == 1 =>
            {
                let (code, t) = self.expr(&c.args[0], Some(&Ty::Scalar(ScalarType::U32)))?;
                self.expect_ty(&t, &Ty::Scalar(ScalarType::U32), &c.args[0])?;
                code
            }
            d if self.is_ctx_call(d, "kernel_id") => self.ctx_kernel_id(),
            other => return err(other, usage),
        };
        let Expr::Reference(r) = peel(&mc.args[1]) else {
            return err(&mc.args[1], usage);
        };
        let (code, t) = self.expr(&r.expr, None)?;
        let Ty::Struct(name) = t else {
            return err(&r.expr, usage);
        };
        self.note_output(&name);
        if let Some(h) = self.handler.as_mut() {
            h.sends = true;
        }
        self.line("{");
        self.indent += 1;
        self.fits_check(&name);
        if self.cuda() {
            self.line(&format!("{name} rk_msg = {code};"));
            self.line(&format!("unsigned int rk_dest = {dest};"));
            self.line("unsigned int rk_wait = 32;");
            self.line(&format!(
                "while (rk_send_to(ctx, rk_dest, RK_TID_{name}, &rk_msg, (rk_u32)sizeof({name})) == RK_K2K_QUEUE_FULL) {{"
            ));
            self.indent += 1;
            self.line("__nanosleep(rk_wait);");
            self.line("if (rk_wait < 4096) rk_wait *= 2;");
            self.indent -= 1;
            self.line("}");
        } else {
            let size = self.struct_def(&name).size;
            self.second_output_check();
            self.line(&format!("rk_st_out_{name}(out_slot, {code});"));
            self.line(&format!("rk_send(ctx, {dest}, RK_TID_{name}, {size}u);"));
        }
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    /// This kernel's id (`ctx.kernel_id().0`).
    pub(super) fn ctx_kernel_id(&self) -> String {
        if self.cuda() {
            "ctx->kernel_id".into()
        } else {
            "(*ctx).kernel_id".into()
        }
    }

    /// Whether `u` is `*state` of a handler's `&mut S` state.
    pub(super) fn deref_state_ok(&mut self, u: &syn::ExprUnary) -> bool {
        self.handler.is_some() && self.deref_state(u).is_some_and(|r| r.is_ok())
    }

    /// A handler's `*state` (its place) when `e` is `state` of a `&mut S` parameter.
    pub(super) fn deref_state(&mut self, u: &syn::ExprUnary) -> Option<Res<PlaceRef>> {
        if !matches!(u.op, UnOp::Deref(_)) {
            return None;
        }
        let Expr::Path(p) = peel(&u.expr) else {
            return None;
        };
        let ident = p.path.get_ident()?;
        let v = self.lookup(ident).ok()?;
        if !v.by_ref {
            return None;
        }
        Some(Ok(PlaceRef {
            code: v.emitted.clone(),
            ty: v.ty.clone(),
            root: Var { by_ref: false, ..v },
            root_expr: Expr::Unary(u.clone()),
        }))
    }
}

/// The name of a parameter (`name: T`, `mut name: T`, `_name: T`).
fn plain_ident(pt: &syn::PatType) -> Res<&syn::Ident> {
    match &*pt.pat {
        Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => Ok(&pi.ident),
        other => err(other, "parameters must be plain names (`msg: M`)"),
    }
}

/// `&mut KernelContext<..>` (any path ending in `KernelContext`).
fn is_context_ref(t: &syn::Type) -> bool {
    let syn::Type::Reference(r) = t else {
        return false;
    };
    r.mutability.is_some()
        && matches!(&*r.elem, syn::Type::Path(p)
            if p.path.segments.last().is_some_and(|s| s.ident == "KernelContext"))
}

/// `T` of `Option<T>`.
fn option_of(t: &syn::Type) -> Option<&syn::Type> {
    let syn::Type::Path(p) = t else {
        return None;
    };
    let last = p.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(ab) = &last.arguments else {
        return None;
    };
    match ab.args.iter().collect::<Vec<_>>().as_slice() {
        [syn::GenericArgument::Type(t)] => Some(t),
        _ => None,
    }
}

/// A 32-bit word `w` (a `u32` expression) as a value of `s`.
fn word_to(s: ScalarType, w: &str) -> String {
    match s {
        ScalarType::U32 => w.to_string(),
        ScalarType::I32 => format!("bitcast<i32>({w})"),
        ScalarType::F32 => format!("bitcast<f32>({w})"),
        _ => unreachable!("32-bit scalars only"),
    }
}

/// A value `v` of `s` as a 32-bit word.
fn to_word(s: ScalarType, v: &str) -> String {
    match s {
        ScalarType::U32 => v.to_string(),
        ScalarType::I32 | ScalarType::F32 => format!("bitcast<u32>({v})"),
        _ => unreachable!("32-bit scalars only"),
    }
}

/// Word `word` of the drain template's buffer `buf`: the rings are bound as 16-byte
/// units (`array<vec4<u32>>`) and read through the template's accessors, the state as
/// words.
fn ring_word(buf: &str, word: &str) -> String {
    match buf {
        "rk_input" => format!("rk_in({word})"),
        "rk_output" => format!("rk_out({word})"),
        _ => format!("{buf}[{word}]"),
    }
}

/// The statement that stores `val` in word `word` of `buf` (see [`ring_word`]).
fn set_ring_word(buf: &str, word: &str, val: &str) -> String {
    match buf {
        "rk_output" => format!("rk_out_set({word}, {val});"),
        _ => format!("{buf}[{word}] = {val};"),
    }
}

/// `fn rk_ld_<what>_<S>(w: u32) -> S`: the struct from the words of `buf` at word `w`.
fn wgsl_load(what: &str, buf: &str, d: &StructDef) -> String {
    let mut s = format!(
        "fn rk_ld_{what}_{0}(w: u32) -> {0} {{\n    var v: {0};\n",
        d.name
    );
    for f in &d.fields {
        let at = f.offset / 4;
        let one = |elem: ScalarType, word: &str| -> String {
            let (lo, hi) = (
                ring_word(buf, word),
                ring_word(buf, &format!("{word} + 1u")),
            );
            match elem {
                ScalarType::U64 => format!("vec2<u32>({lo}, {hi})"),
                ScalarType::I64 => format!("bitcast<vec2<i32>>(vec2<u32>({lo}, {hi}))"),
                e => word_to(e, &lo),
            }
        };
        match f.ty {
            Ty::Scalar(e) => {
                let _ = writeln!(
                    s,
                    "    v.{} = {};",
                    f.emitted,
                    one(e, &format!("w + {at}u"))
                );
            }
            Ty::Array { elem, len } => {
                let step = if matches!(elem, ScalarType::U64 | ScalarType::I64) {
                    2
                } else {
                    1
                };
                let _ = writeln!(
                    s,
                    "    for (var k = 0u; k < {len}u; k++) {{ v.{}[k] = {}; }}",
                    f.emitted,
                    one(elem, &format!("w + {at}u + {step}u * k"))
                );
            }
            _ => unreachable!("fields are scalars or arrays"),
        }
    }
    s.push_str("    return v;\n}\n\n");
    s
}

/// `fn rk_st_<what>_<S>(w: u32, v: S)`: the struct into the words of `buf` at word `w`.
fn wgsl_store(what: &str, buf: &str, d: &StructDef) -> String {
    let mut s = format!("fn rk_st_{what}_{0}(w: u32, v: {0}) {{\n", d.name);
    for f in &d.fields {
        let at = f.offset / 4;
        let one = |elem: ScalarType, word: &str, val: &str| -> String {
            let hi = format!("{word} + 1u");
            match elem {
                ScalarType::U64 => format!(
                    "{} {}",
                    set_ring_word(buf, word, &format!("{val}.x")),
                    set_ring_word(buf, &hi, &format!("{val}.y"))
                ),
                ScalarType::I64 => format!(
                    "{} {}",
                    set_ring_word(buf, word, &format!("bitcast<u32>({val}.x)")),
                    set_ring_word(buf, &hi, &format!("bitcast<u32>({val}.y)"))
                ),
                e => set_ring_word(buf, word, &to_word(e, val)),
            }
        };
        match f.ty {
            Ty::Scalar(e) => {
                let _ = writeln!(
                    s,
                    "    {}",
                    one(e, &format!("w + {at}u"), &format!("v.{}", f.emitted))
                );
            }
            Ty::Array { elem, len } => {
                let step = if matches!(elem, ScalarType::U64 | ScalarType::I64) {
                    2
                } else {
                    1
                };
                let _ = writeln!(
                    s,
                    "    for (var k = 0u; k < {len}u; k++) {{ {} }}",
                    one(
                        elem,
                        &format!("w + {at}u + {step}u * k"),
                        &format!("v.{}[k]", f.emitted)
                    )
                );
            }
            _ => unreachable!("fields are scalars or arrays"),
        }
    }
    s.push_str("}\n\n");
    s
}
