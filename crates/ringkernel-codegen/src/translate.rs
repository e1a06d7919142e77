//! The translator: one kernel function to CUDA C or WGSL.

use crate::names::Names;
use crate::types::{check_array_len, parse_type, scalar_name, ScalarType, Ty};
use crate::{BindingKind, ParamField, StencilConfig, Target, WgslBinding, WgslKernel};
use quote::ToTokens;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use syn::spanned::Spanned;
use syn::{BinOp, Expr, Pat, Stmt, UnOp};

type Res<T> = syn::Result<T>;

const SUPPORTED_EXPRS: &str = "literals, variables, arithmetic, comparison, logical and bit \
     operators, `as` casts, indexing of slices and arrays, the dsl index functions, math \
     methods (sqrt, exp, ln, sin, cos, tanh, powf, abs, min, max, mul_add, floor, ceil, ...), \
     `if`/`match` with values";

const SUPPORTED_STMTS: &str = "`let`, assignments (`=`, `+=`, ...), `if`/`else`, `match` on \
     integers, `for` over ranges, `while`, `loop`, `break`, `continue` and `return`";

fn err<T>(span_of: &dyn ToTokens, msg: impl std::fmt::Display) -> Res<T> {
    Err(syn::Error::new_spanned(span_of, msg))
}

/// What kind of kernel is translated.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind<'a> {
    Global,
    Stencil(&'a StencilConfig),
}

#[derive(Debug, Clone)]
struct Var {
    emitted: String,
    ty: Ty,
    mutable: bool,
}

#[derive(Debug, Clone)]
struct Param {
    ident: syn::Ident,
    emitted: String,
    ty: Ty,
    mutable: bool,
}

struct Stencil {
    dims: u8,
    halo: u32,
}

pub(crate) struct Tx {
    target: Target,
    out: String,
    indent: usize,
    scopes: Vec<HashMap<String, Var>>,
    names: Names,
    loops: usize,
    stencil: Option<Stencil>,
    workgroup: [u32; 3],
    /// Emitted names of the slices that atomics touch (WGSL `array<atomic<T>>`).
    atomics: HashSet<String>,
}

/// An expression translated: code and type.
type Val = (String, Ty);

/// Result of translating a kernel.
pub(crate) enum Output {
    Cuda(String),
    Wgsl(WgslKernel),
}

fn is_untyped(e: &Expr) -> bool {
    match e {
        Expr::Lit(l) => match &l.lit {
            syn::Lit::Int(i) => i.suffix().is_empty(),
            syn::Lit::Float(f) => f.suffix().is_empty(),
            _ => false,
        },
        Expr::Paren(p) => is_untyped(&p.expr),
        Expr::Group(g) => is_untyped(&g.expr),
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => is_untyped(&u.expr),
        Expr::Binary(b) if arith_op(&b.op).is_some() => is_untyped(&b.left) && is_untyped(&b.right),
        _ => false,
    }
}

fn arith_op(op: &BinOp) -> Option<&'static str> {
    Some(match op {
        BinOp::Add(_) => "+",
        BinOp::Sub(_) => "-",
        BinOp::Mul(_) => "*",
        BinOp::Div(_) => "/",
        BinOp::Rem(_) => "%",
        _ => return None,
    })
}

fn compound_op(op: &BinOp) -> Option<BinOp> {
    use syn::token;
    let s = op.span();
    Some(match op {
        BinOp::AddAssign(_) => BinOp::Add(token::Plus(s)),
        BinOp::SubAssign(_) => BinOp::Sub(token::Minus(s)),
        BinOp::MulAssign(_) => BinOp::Mul(token::Star(s)),
        BinOp::DivAssign(_) => BinOp::Div(token::Slash(s)),
        BinOp::RemAssign(_) => BinOp::Rem(token::Percent(s)),
        BinOp::BitAndAssign(_) => BinOp::BitAnd(token::And(s)),
        BinOp::BitOrAssign(_) => BinOp::BitOr(token::Or(s)),
        BinOp::BitXorAssign(_) => BinOp::BitXor(token::Caret(s)),
        BinOp::ShlAssign(_) => BinOp::Shl(token::Shl(s)),
        BinOp::ShrAssign(_) => BinOp::Shr(token::Shr(s)),
        _ => return None,
    })
}

/// Strips parentheses and invisible groups.
fn peel(e: &Expr) -> &Expr {
    match e {
        Expr::Paren(p) => peel(&p.expr),
        Expr::Group(g) => peel(&g.expr),
        _ => e,
    }
}

/// Whether `block` (of a match arm) contains a `break` that leaves the loop around the
/// match (not one that belongs to a loop inside the arm).
fn has_loop_break_expr(e: &Expr) -> bool {
    match e {
        Expr::Break(_) => true,
        Expr::Paren(p) => has_loop_break_expr(&p.expr),
        Expr::Group(g) => has_loop_break_expr(&g.expr),
        Expr::Block(b) => has_loop_break_block(&b.block),
        Expr::If(i) => {
            has_loop_break_block(&i.then_branch)
                || i.else_branch
                    .as_ref()
                    .is_some_and(|(_, e)| has_loop_break_expr(e))
        }
        Expr::Match(m) => m.arms.iter().any(|a| has_loop_break_expr(&a.body)),
        _ => false,
    }
}

fn has_loop_break_block(b: &syn::Block) -> bool {
    b.stmts.iter().any(|s| match s {
        Stmt::Expr(e, _) => has_loop_break_expr(e),
        Stmt::Local(l) => l
            .init
            .as_ref()
            .is_some_and(|i| has_loop_break_expr(&i.expr)),
        _ => false,
    })
}

impl Tx {
    pub(crate) fn new(target: Target, workgroup: [u32; 3]) -> Self {
        let mut names = Names::default();
        names.reserve("RkParams");
        Tx {
            target,
            out: String::new(),
            indent: 1,
            scopes: vec![HashMap::new()],
            names,
            loops: 0,
            stencil: None,
            workgroup,
            atomics: HashSet::new(),
        }
    }

    fn cuda(&self) -> bool {
        self.target == Target::Cuda
    }

    fn line(&mut self, s: &str) {
        for _ in 0..self.indent {
            self.out.push_str("    ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn sname(&self, s: ScalarType, span_of: &dyn ToTokens) -> Res<&'static str> {
        scalar_name(s, self.target, span_of)
    }

    /// `T name` (CUDA) or `name: T` (WGSL) for a declaration.
    fn decl(&self, name: &str, ty: &Ty, span_of: &dyn ToTokens) -> Res<String> {
        match ty {
            Ty::Scalar(s) => {
                let t = self.sname(*s, span_of)?;
                Ok(if self.cuda() {
                    format!("{t} {name}")
                } else {
                    format!("{name}: {t}")
                })
            }
            Ty::Array { elem, len } => {
                let t = self.sname(*elem, span_of)?;
                Ok(if self.cuda() {
                    format!("{t} {name}[{len}]")
                } else {
                    format!("{name}: array<{t}, {len}>")
                })
            }
            other => err(
                span_of,
                format!(
                    "a local of type `{}` is not supported; locals are scalars or arrays",
                    other.describe()
                ),
            ),
        }
    }

    fn lookup(&self, ident: &syn::Ident) -> Res<Var> {
        let name = ident.to_string();
        for s in self.scopes.iter().rev() {
            if let Some(v) = s.get(&name) {
                return Ok(v.clone());
            }
        }
        err(
            ident,
            format!(
                "unknown name `{name}`: kernels can use their parameters and local variables \
                 only (no globals, constants or captured values)"
            ),
        )
    }

    fn declare(&mut self, ident: &syn::Ident, ty: Ty, mutable: bool) -> Res<String> {
        let emitted = self.names.fresh(ident)?;
        self.scopes
            .last_mut()
            .expect("a scope is always open")
            .insert(
                ident.to_string(),
                Var {
                    emitted: emitted.clone(),
                    ty,
                    mutable,
                },
            );
        Ok(emitted)
    }

    // ----------------------------------------------------------------- kernel

    pub(crate) fn kernel(mut self, f: &syn::ItemFn, kind: Kind<'_>) -> Res<Output> {
        let sig = &f.sig;
        if let Some(c) = &sig.constness {
            return err(
                c,
                "`const fn` kernels are not supported; write a plain `fn`",
            );
        }
        if let Some(a) = &sig.asyncness {
            return err(
                a,
                "`async fn` kernels are not supported; write a plain `fn`",
            );
        }
        if let Some(u) = &sig.unsafety {
            return err(
                u,
                "`unsafe fn` kernels are not supported; write a plain `fn`",
            );
        }
        if let Some(a) = &sig.abi {
            return err(a, "kernels take no `extern` ABI; write a plain `fn`");
        }
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            return err(
                &sig.generics,
                "generic kernels are not supported; use concrete types",
            );
        }
        if let Some(v) = &sig.variadic {
            return err(v, "variadic kernels are not supported");
        }
        if let syn::ReturnType::Type(_, t) = &sig.output {
            if parse_type(t, self.target)? != Ty::Unit {
                return err(
                    t,
                    "kernels return nothing; write results into a `&mut [T]` parameter",
                );
            }
        }
        let name = sig.ident.to_string();
        if Names::is_reserved(&name) || name.starts_with("rk_") || name.starts_with("__") {
            return err(
                &sig.ident,
                format!("`{name}` cannot name a kernel: it is reserved in CUDA C or WGSL"),
            );
        }
        self.names.reserve(&name);
        let [wx, wy, wz] = self.workgroup;
        let invocations = wx as u64 * wy as u64 * wz as u64;
        if wx == 0 || wy == 0 || wz == 0 || wz > 64 || invocations > 256 {
            return err(
                &sig.ident,
                format!(
                    "workgroup size {wx}x{wy}x{wz} is out of range: each dimension at least 1, \
                     z at most 64, at most 256 invocations (WebGPU's default limits)"
                ),
            );
        }

        // Parameters.
        let mut params = Vec::new();
        for arg in &sig.inputs {
            let syn::FnArg::Typed(pt) = arg else {
                return err(arg, "kernels are free functions; `self` is not supported");
            };
            let Pat::Ident(pi) = &*pt.pat else {
                return err(&pt.pat, "parameters must be plain names (`x: f32`)");
            };
            if pi.by_ref.is_some() || pi.subpat.is_some() {
                return err(&pt.pat, "parameters must be plain names (`x: f32`)");
            }
            let ty = parse_type(&pt.ty, self.target)?;
            match (&ty, kind) {
                (Ty::Scalar(ScalarType::Usize), _) => {
                    return err(
                        &pt.ty,
                        "`usize` parameters are not supported (no fixed size on the GPU); use \
                         `u32` or `i32`",
                    )
                }
                (Ty::Array { .. }, _) | (Ty::Unit, _) => {
                    return err(
                        &pt.ty,
                        "parameters are scalars (f32, f64 on CUDA, i32, u32, bool) or slices \
                         (`&[T]`, `&mut [T]`)",
                    )
                }
                (Ty::GridPos { .. }, Kind::Global) => {
                    return err(
                        &pt.ty,
                        "`GridPos` parameters belong to stencil kernels; translate this \
                         function with `transpile_stencil_kernel`",
                    )
                }
                (Ty::GridPos { dims }, Kind::Stencil(cfg)) => {
                    if self.stencil.is_some() {
                        return err(
                            &pt.ty,
                            "a stencil kernel has exactly one `GridPos` parameter",
                        );
                    }
                    self.stencil = Some(Stencil {
                        dims: *dims,
                        halo: cfg.halo,
                    });
                }
                _ => {}
            }
            let emitted = self.declare(&pi.ident, ty.clone(), pi.mutability.is_some())?;
            params.push(Param {
                ident: pi.ident.clone(),
                emitted,
                ty,
                mutable: pi.mutability.is_some(),
            });
        }
        if let Kind::Stencil(cfg) = kind {
            if self.stencil.is_none() {
                return err(
                    &sig.ident,
                    "a stencil kernel needs a `GridPos` (2-D) or `GridPos3` (3-D) parameter",
                );
            }
            if cfg.halo == 0 || cfg.halo > 16 {
                return err(&sig.ident, "the stencil halo must be 1 to 16 cells");
            }
        }
        for n in [
            "rk_x", "rk_y", "rk_z", "rk_nx", "rk_ny", "rk_nz", "rk_sy", "rk_sz", "rk_idx",
        ] {
            self.names.reserve(n);
        }

        // Slices that atomics touch: in WGSL their element type is `atomic<T>`.
        let mut targets = HashSet::new();
        atomic_targets(f.block.to_token_stream(), &mut targets);
        for t in targets {
            if let Some(p) = params.iter().find(|p| p.ident == t) {
                self.atomics.insert(p.emitted.clone());
            }
        }

        // Body, into self.out (indent 1).
        self.stencil_prologue()?;
        let body_start = self.out.len();
        self.block_stmts(&f.block.stmts, None)?;
        let body = self.out.split_off(body_start);
        let prologue = std::mem::take(&mut self.out);

        match self.target {
            Target::Cuda => Ok(Output::Cuda(
                self.finish_cuda(&name, &params, &prologue, &body)?,
            )),
            Target::Wgsl => Ok(Output::Wgsl(
                self.finish_wgsl(&name, &params, &prologue, &body)?,
            )),
        }
    }

    fn hidden_dims(&self) -> &'static [&'static str] {
        match &self.stencil {
            None => &[],
            Some(s) if s.dims == 2 => &["rk_nx", "rk_ny"],
            Some(_) => &["rk_nx", "rk_ny", "rk_nz"],
        }
    }

    fn stencil_prologue(&mut self) -> Res<()> {
        let Some(st) = &self.stencil else {
            return Ok(());
        };
        let (dims, h) = (st.dims, st.halo);
        let axes: &[(&str, &str, &str)] = if dims == 2 {
            &[("rk_x", "x", "rk_nx"), ("rk_y", "y", "rk_ny")]
        } else {
            &[
                ("rk_x", "x", "rk_nx"),
                ("rk_y", "y", "rk_ny"),
                ("rk_z", "z", "rk_nz"),
            ]
        };
        let mut bounds = Vec::new();
        if self.cuda() {
            for (v, c, n) in axes {
                self.line(&format!(
                    "int {v} = (int)(blockIdx.{c} * blockDim.{c} + threadIdx.{c});"
                ));
                bounds.push(format!("{v} >= {n}"));
            }
            self.line(&format!("if ({}) {{ return; }}", bounds.join(" || ")));
            self.line(&format!(
                "unsigned long long rk_sy = (unsigned long long)(rk_nx + {});",
                2 * h
            ));
            let mut idx = format!(
                "(unsigned long long)(rk_y + {h}) * rk_sy + (unsigned long long)(rk_x + {h})"
            );
            if dims == 3 {
                self.line(&format!(
                    "unsigned long long rk_sz = rk_sy * (unsigned long long)(rk_ny + {});",
                    2 * h
                ));
                idx = format!("(unsigned long long)(rk_z + {h}) * rk_sz + {idx}");
            }
            self.line(&format!("unsigned long long rk_idx = {idx};"));
        } else {
            let [wx, wy, wz] = self.workgroup;
            self.line(&format!(
                "let rk_gid: vec3<u32> = rk_wid * vec3<u32>({wx}u, {wy}u, {wz}u) + rk_lid;"
            ));
            for (v, c, n) in axes {
                self.line(&format!("let {v}: i32 = i32(rk_gid.{c});"));
                bounds.push(format!("{v} >= {n}"));
            }
            self.line(&format!("if ({}) {{ return; }}", bounds.join(" || ")));
            self.line(&format!("let rk_sy: u32 = u32(rk_nx + {}i);", 2 * h));
            let mut idx = format!("u32(rk_y + {h}i) * rk_sy + u32(rk_x + {h}i)");
            if dims == 3 {
                self.line(&format!(
                    "let rk_sz: u32 = rk_sy * u32(rk_ny + {}i);",
                    2 * h
                ));
                idx = format!("u32(rk_z + {h}i) * rk_sz + {idx}");
            }
            self.line(&format!("let rk_idx: u32 = {idx};"));
        }
        Ok(())
    }

    fn finish_cuda(&self, name: &str, params: &[Param], prologue: &str, body: &str) -> Res<String> {
        let mut args = Vec::new();
        for p in params {
            match &p.ty {
                Ty::Scalar(s) => args.push(format!("{} {}", s.cuda_name(), p.emitted)),
                Ty::Slice { elem, mutable } => args.push(format!(
                    "{}{}* {}",
                    if *mutable { "" } else { "const " },
                    elem.cuda_name(),
                    p.emitted
                )),
                _ => {}
            }
        }
        for d in self.hidden_dims() {
            args.push(format!("int {d}"));
        }
        let mut s = String::new();
        let _ = writeln!(
            s,
            "extern \"C\" __global__ void {name}({}) {{",
            args.join(", ")
        );
        s.push_str(prologue);
        s.push_str(body);
        s.push_str("}\n");
        Ok(s)
    }

    fn finish_wgsl(
        &self,
        name: &str,
        params: &[Param],
        prologue: &str,
        body: &str,
    ) -> Res<WgslKernel> {
        let mut fields: Vec<ParamField> = Vec::new();
        let mut bindings = Vec::new();
        let mut globals = String::new();
        let mut locals = String::new();
        let mut slice_no = 0u32;
        for p in params {
            match &p.ty {
                Ty::Scalar(s) => {
                    let offset = 4 * fields.len() as u32;
                    fields.push(ParamField {
                        name: p.emitted.clone(),
                        ty: *s,
                        offset,
                    });
                    let kw = if p.mutable { "var" } else { "let" };
                    let t = self.sname(*s, &p.ident)?;
                    if *s == ScalarType::Bool {
                        let _ = writeln!(
                            locals,
                            "    {kw} {0}: bool = rk_params.{0} != 0u;",
                            p.emitted
                        );
                    } else {
                        let _ = writeln!(locals, "    {kw} {0}: {t} = rk_params.{0};", p.emitted);
                    }
                }
                Ty::Slice { elem, mutable } => {
                    slice_no += 1;
                    let t = self.sname(*elem, &p.ident)?;
                    let access = if *mutable { "read_write" } else { "read" };
                    let atomic = self.atomics.contains(&p.emitted);
                    let elem_t = if atomic {
                        format!("atomic<{t}>")
                    } else {
                        t.to_string()
                    };
                    let _ = writeln!(
                        globals,
                        "@group(0) @binding({slice_no}) var<storage, {access}> {}: array<{elem_t}>;",
                        p.emitted
                    );
                    bindings.push(WgslBinding {
                        binding: slice_no,
                        name: p.emitted.clone(),
                        kind: BindingKind::Storage {
                            elem: *elem,
                            read_only: !mutable,
                            atomic,
                        },
                    });
                }
                _ => {}
            }
        }
        for d in self.hidden_dims() {
            let offset = 4 * fields.len() as u32;
            fields.push(ParamField {
                name: (*d).to_string(),
                ty: ScalarType::I32,
                offset,
            });
            let _ = writeln!(locals, "    let {d}: i32 = rk_params.{d};");
        }
        let mut src = String::new();
        let mut params_size = 0;
        if !fields.is_empty() {
            src.push_str("struct RkParams {\n");
            for f in &fields {
                let t = if f.ty == ScalarType::Bool {
                    "u32"
                } else {
                    f.ty.wgsl_name()
                        .expect("f64 rejected when the type was parsed")
                };
                let _ = writeln!(src, "    {}: {t},", f.name);
            }
            let n = fields.len();
            let padded = n.div_ceil(4) * 4;
            for i in n..padded {
                let _ = writeln!(src, "    rk_pad{}: u32,", i - n);
            }
            src.push_str("}\n\n");
            src.push_str("@group(0) @binding(0) var<uniform> rk_params: RkParams;\n");
            params_size = 4 * padded as u32;
            bindings.insert(
                0,
                WgslBinding {
                    binding: 0,
                    name: "rk_params".into(),
                    kind: BindingKind::Params,
                },
            );
        }
        src.push_str(&globals);
        let [wx, wy, wz] = self.workgroup;
        let _ = write!(
            src,
            "\n@compute @workgroup_size({wx}, {wy}, {wz})\nfn {name}(\
             @builtin(local_invocation_id) rk_lid: vec3<u32>, \
             @builtin(workgroup_id) rk_wid: vec3<u32>, \
             @builtin(num_workgroups) rk_nwg: vec3<u32>) {{\n"
        );
        src.push_str(&locals);
        src.push_str(prologue);
        src.push_str(body);
        src.push_str("}\n");
        Ok(WgslKernel {
            source: src,
            entry_point: name.to_string(),
            workgroup_size: self.workgroup,
            bindings,
            params: fields,
            params_size,
        })
    }

    // ------------------------------------------------------------- statements

    /// Statements of a block; the tail expression (no semicolon) is assigned to `dest`
    /// when given, else translated as a statement.
    fn block_stmts(&mut self, stmts: &[Stmt], dest: Option<(&str, &Ty)>) -> Res<()> {
        for (i, st) in stmts.iter().enumerate() {
            let last = i + 1 == stmts.len();
            match st {
                Stmt::Local(l) => self.local(l)?,
                Stmt::Expr(e, semi) => {
                    if last && semi.is_none() {
                        if let Some((place, ty)) = dest {
                            self.assign_value(place, ty, e)?;
                            continue;
                        }
                    }
                    self.stmt_expr(e)?;
                }
                Stmt::Item(it) => {
                    return err(
                        it,
                        "items (functions, structs, constants, uses) inside a kernel are not \
                         supported",
                    )
                }
                Stmt::Macro(m) => {
                    return err(
                        m,
                        format!("macros are not supported in kernels; supported statements: {SUPPORTED_STMTS}"),
                    )
                }
            }
        }
        if let Some((_, ty)) = dest {
            let ends_in_value = matches!(stmts.last(), Some(Stmt::Expr(_, None)));
            if !ends_in_value && *ty != Ty::Unit {
                let Some(last) = stmts.last() else {
                    return Err(syn::Error::new(
                        proc_macro2::Span::call_site(),
                        "an empty block has no value",
                    ));
                };
                return err(
                    last,
                    "this block must end in a value (an expression without `;`)",
                );
            }
        }
        Ok(())
    }

    fn scoped_block(&mut self, block: &syn::Block, dest: Option<(&str, &Ty)>) -> Res<()> {
        self.scopes.push(HashMap::new());
        self.indent += 1;
        let r = self.block_stmts(&block.stmts, dest);
        self.indent -= 1;
        self.scopes.pop();
        r
    }

    /// Assigns the value of `e` to `place`; `if`, `match` and blocks become control flow,
    /// `return`/`break`/`continue` are statements.
    fn assign_value(&mut self, place: &str, ty: &Ty, e: &Expr) -> Res<()> {
        match peel(e) {
            Expr::If(i) => self.if_stmt(i, Some((place, ty))),
            Expr::Match(m) => self.match_stmt(m, Some((place, ty))),
            Expr::Block(b) if b.label.is_none() => {
                self.line("{");
                self.scoped_block(&b.block, Some((place, ty)))?;
                self.line("}");
                Ok(())
            }
            Expr::Return(_) | Expr::Break(_) | Expr::Continue(_) => self.stmt_expr(e),
            other => {
                let (code, t) = self.expr(other, Some(ty))?;
                self.expect_ty(&t, ty, other)?;
                self.line(&format!("{place} = {code};"));
                Ok(())
            }
        }
    }

    fn expect_ty(&self, got: &Ty, want: &Ty, span_of: &dyn ToTokens) -> Res<()> {
        if got != want {
            return err(
                span_of,
                format!(
                    "mismatched types: expected `{}`, found `{}` (the subset has no implicit \
                     conversions; use `as`)",
                    want.describe(),
                    got.describe()
                ),
            );
        }
        Ok(())
    }

    fn local(&mut self, l: &syn::Local) -> Res<()> {
        let (pat, annot) = match &l.pat {
            Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
            p => (p, None),
        };
        let annot_ty = annot.map(|t| parse_type(t, self.target)).transpose()?;
        if let Some(init) = &l.init {
            if let Some((_, d)) = &init.diverge {
                return err(d, "`let ... else` is not supported");
            }
        }
        match pat {
            Pat::Wild(_) => {
                let Some(init) = &l.init else {
                    return Ok(());
                };
                let (code, _) = self.expr(&init.expr, annot_ty.as_ref())?;
                if self.cuda() {
                    self.line(&format!("(void)({code});"));
                } else {
                    self.line(&format!("_ = {code};"));
                }
                Ok(())
            }
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                let mutable = pi.mutability.is_some();
                let Some(init) = &l.init else {
                    let Some(ty) = annot_ty else {
                        return err(
                            pi,
                            "a `let` without a value needs a type annotation (`let x: f32;`)",
                        );
                    };
                    let name = self.declare(&pi.ident, ty.clone(), true)?;
                    let d = self.decl(&name, &ty, &pi.ident)?;
                    self.line(&if self.cuda() {
                        format!("{d};")
                    } else {
                        format!("var {d};")
                    });
                    return Ok(());
                };
                let value = peel(&init.expr);
                match value {
                    Expr::Array(_) | Expr::Repeat(_) => {
                        let (code, ty) = self.array_init(value, annot_ty.as_ref())?;
                        let name = self.declare(&pi.ident, ty.clone(), mutable)?;
                        let d = self.decl(&name, &ty, &pi.ident)?;
                        self.line(&if self.cuda() {
                            format!("{d} = {code};")
                        } else {
                            // Always `var`: naga indexes value arrays (`let`) by constants
                            // only on some back ends.
                            format!("var {d} = {code};")
                        });
                        Ok(())
                    }
                    Expr::If(_) | Expr::Match(_) | Expr::Block(_) if !self.is_simple_if(value) => {
                        let ty = match annot_ty {
                            Some(t) => t,
                            None => self.infer_value_type(value)?,
                        };
                        // Declared first (the value's control flow assigns it), visible only
                        // after this statement as in Rust.
                        let name = self.names.fresh(&pi.ident)?;
                        let d = self.decl(&name, &ty, &pi.ident)?;
                        self.line(&if self.cuda() {
                            format!("{d};")
                        } else {
                            format!("var {d};")
                        });
                        self.assign_value(&name, &ty, value)?;
                        self.scopes.last_mut().expect("scope").insert(
                            pi.ident.to_string(),
                            Var {
                                emitted: name,
                                ty,
                                mutable,
                            },
                        );
                        Ok(())
                    }
                    _ => {
                        let (code, ty) = self.expr(value, annot_ty.as_ref())?;
                        if let Some(a) = &annot_ty {
                            self.expect_ty(&ty, a, value)?;
                        }
                        if ty.scalar().is_none() {
                            return err(
                                value,
                                format!(
                                    "a local of type `{}` is not supported; locals are scalars \
                                     or arrays",
                                    ty.describe()
                                ),
                            );
                        }
                        let name = self.declare(&pi.ident, ty.clone(), mutable)?;
                        let d = self.decl(&name, &ty, &pi.ident)?;
                        self.line(&if self.cuda() {
                            format!("{d} = {code};")
                        } else {
                            format!("{} {d} = {code};", if mutable { "var" } else { "let" })
                        });
                        Ok(())
                    }
                }
            }
            other => err(
                other,
                "only simple `let name` / `let mut name` bindings are supported (no tuple, \
                 struct or reference patterns)",
            ),
        }
    }

    /// The type of an `if`/`match`/block value, from its first arm that is a plain
    /// expression.
    fn infer_value_type(&mut self, e: &Expr) -> Res<Ty> {
        let candidates: Vec<&Expr> = match peel(e) {
            Expr::If(i) => {
                let mut v = Vec::new();
                if let Some(Stmt::Expr(t, None)) = i.then_branch.stmts.last() {
                    if i.then_branch.stmts.len() == 1 {
                        v.push(t);
                    }
                }
                if let Some((_, el)) = &i.else_branch {
                    v.push(el);
                }
                v
            }
            Expr::Match(m) => m.arms.iter().map(|a| &*a.body).collect(),
            Expr::Block(b) => match b.block.stmts.as_slice() {
                [Stmt::Expr(t, None)] => vec![t],
                _ => vec![],
            },
            _ => vec![e],
        };
        for c in candidates {
            let c = peel(c);
            match c {
                Expr::Return(_) | Expr::Break(_) | Expr::Continue(_) => continue,
                Expr::If(_) | Expr::Match(_) | Expr::Block(_) => {
                    if let Ok(t) = self.infer_value_type(c) {
                        return Ok(t);
                    }
                }
                _ if is_untyped(c) => {}
                _ => {
                    if let Ok((_, t)) = self.expr(c, None) {
                        return Ok(t);
                    }
                }
            }
        }
        // Only untyped literals (or nothing simple): Rust's defaults.
        for c in match peel(e) {
            Expr::Match(m) => m.arms.iter().map(|a| &*a.body).collect::<Vec<_>>(),
            _ => vec![],
        } {
            if is_untyped(c) {
                return Ok(self.expr(c, None)?.1);
            }
        }
        err(
            e,
            "cannot tell the type of this value; annotate the binding (`let x: f32 = ...`)",
        )
    }

    fn is_simple_if(&self, e: &Expr) -> bool {
        let Expr::If(i) = e else {
            return false;
        };
        let simple_block = |b: &syn::Block| matches!(b.stmts.as_slice(), [Stmt::Expr(_, None)]);
        simple_block(&i.then_branch)
            && match &i.else_branch {
                Some((_, el)) => match peel(el) {
                    Expr::Block(b) => simple_block(&b.block),
                    e2 @ Expr::If(_) => self.is_simple_if(e2),
                    _ => false,
                },
                None => false,
            }
    }

    fn array_init(&mut self, e: &Expr, annot: Option<&Ty>) -> Res<Val> {
        let want_elem = match annot {
            Some(Ty::Array { elem, .. }) => Some(Ty::Scalar(*elem)),
            Some(other) => {
                return err(
                    e,
                    format!("an array value cannot initialise a `{}`", other.describe()),
                )
            }
            None => None,
        };
        let (items, elem_ty, len): (Vec<String>, Ty, usize) = match e {
            Expr::Array(a) => {
                let mut items = Vec::new();
                let mut ety = want_elem.clone();
                for el in &a.elems {
                    let (c, t) = self.expr(el, ety.as_ref())?;
                    if let Some(w) = &ety {
                        self.expect_ty(&t, w, el)?;
                    }
                    ety = Some(t);
                    items.push(c);
                }
                let Some(ety) = ety else {
                    return err(e, "empty arrays are not supported");
                };
                let n = items.len();
                (items, ety, n)
            }
            Expr::Repeat(r) => {
                let len = match peel(&r.len) {
                    Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i),
                        ..
                    }) => i.base10_parse::<usize>()?,
                    other => return err(other, "array lengths must be integer literals"),
                };
                check_array_len(len, &r.len)?;
                let (c, t) = self.expr(&r.expr, want_elem.as_ref())?;
                if !is_const_like(&r.expr) {
                    return err(
                        &r.expr,
                        "`[value; N]` needs a literal value; assign the elements in a loop",
                    );
                }
                (vec![c; len], t, len)
            }
            _ => unreachable!("array_init is called for array expressions"),
        };
        check_array_len(len, e)?;
        let Some(elem) = elem_ty.scalar() else {
            return err(e, "array elements must be scalars");
        };
        let ty = Ty::Array { elem, len };
        if let Some(a) = annot {
            self.expect_ty(&ty, a, e)?;
        }
        let code = if self.cuda() {
            format!("{{{}}}", items.join(", "))
        } else {
            let t = self.sname(elem, e)?;
            format!("array<{t}, {len}>({})", items.join(", "))
        };
        Ok((code, ty))
    }

    /// A place that can be assigned: a mutable local or an element of a `&mut [T]` / a
    /// mutable array.
    fn place(&mut self, e: &Expr) -> Res<(String, Ty, bool)> {
        match peel(e) {
            Expr::Path(p) => {
                let ident = path_ident(p)?;
                let v = self.lookup(ident)?;
                if !v.mutable {
                    return err(
                        e,
                        format!("cannot assign to `{ident}`: it is not declared `mut`"),
                    );
                }
                if v.ty.scalar().is_none() {
                    return err(e, "only scalars and elements can be assigned");
                }
                Ok((v.emitted, v.ty, false))
            }
            Expr::Index(ix) => {
                let (code, ty, base) = self.index(ix)?;
                match base.ty {
                    Ty::Slice { mutable: true, .. } => {}
                    Ty::Array { .. } if base.mutable => {}
                    Ty::Slice { .. } => {
                        return err(
                            &ix.expr,
                            "cannot assign into a `&[T]` parameter; declare it `&mut [T]`",
                        )
                    }
                    _ => return err(&ix.expr, "cannot assign into an array that is not `mut`"),
                }
                let atomic = self.is_atomic(&base);
                Ok((code, ty, atomic))
            }
            Expr::Unary(u) if matches!(u.op, UnOp::Deref(_)) => err(
                e,
                "dereferencing is not supported; assign to `name` or `slice[i]`",
            ),
            other => err(
                other,
                "this cannot be assigned; assign to a `mut` local or an element `slice[i]`",
            ),
        }
    }

    fn stmt_expr(&mut self, e: &Expr) -> Res<()> {
        match e {
            Expr::Paren(p) => self.stmt_expr(&p.expr),
            Expr::Group(g) => self.stmt_expr(&g.expr),
            Expr::Assign(a) => {
                let (place, ty, atomic) = self.place(&a.left)?;
                if atomic {
                    // WGSL atomics are written with atomicStore; an `if`/`match` value
                    // goes through a temporary.
                    let value = match peel(&a.right) {
                        v @ (Expr::If(_) | Expr::Match(_) | Expr::Block(_))
                            if !self.is_simple_if(v) =>
                        {
                            let tmp = self.names.temp("v");
                            let d = self.decl(&tmp, &ty, &a.right)?;
                            self.line(&format!("var {d};"));
                            self.assign_value(&tmp, &ty, v)?;
                            tmp
                        }
                        _ => {
                            let (code, t) = self.expr(&a.right, Some(&ty))?;
                            self.expect_ty(&t, &ty, &a.right)?;
                            code
                        }
                    };
                    self.line(&format!("atomicStore(&{place}, {value});"));
                    return Ok(());
                }
                match peel(&a.right) {
                    v @ (Expr::If(_) | Expr::Match(_) | Expr::Block(_))
                        if !self.is_simple_if(v) =>
                    {
                        self.assign_value(&place, &ty, v)
                    }
                    _ => {
                        let (code, t) = self.expr(&a.right, Some(&ty))?;
                        self.expect_ty(&t, &ty, &a.right)?;
                        self.line(&format!("{place} = {code};"));
                        Ok(())
                    }
                }
            }
            Expr::Binary(b) if compound_op(&b.op).is_some() => {
                let op = compound_op(&b.op).expect("checked");
                let (place, ty, atomic) = self.place(&b.left)?;
                let (rhs, rt) = if matches!(op, BinOp::Shl(_) | BinOp::Shr(_)) {
                    self.expr(&b.right, None)?
                } else {
                    self.expr(&b.right, Some(&ty))?
                };
                if atomic {
                    // Not one atomic step (neither is `+=` in Rust): use `atomic_add`.
                    let load = format!("atomicLoad(&{place})");
                    let combined = self.binop_code(&op, (&load, &ty), (&rhs, &rt), &b.right)?;
                    self.line(&format!("atomicStore(&{place}, {});", combined.0));
                    return Ok(());
                }
                let combined = self.binop_code(&op, (&place, &ty), (&rhs, &rt), &b.right)?;
                self.line(&format!("{place} = {};", combined.0));
                Ok(())
            }
            Expr::If(i) => self.if_stmt(i, None),
            Expr::Match(m) => self.match_stmt(m, None),
            Expr::Block(b) => {
                if let Some(l) = &b.label {
                    return err(l, "labeled blocks are not supported");
                }
                if b.block.stmts.is_empty() {
                    return Ok(());
                }
                self.line("{");
                self.scoped_block(&b.block, None)?;
                self.line("}");
                Ok(())
            }
            Expr::ForLoop(f) => self.for_loop(f),
            Expr::While(w) => {
                if let Some(l) = &w.label {
                    return err(l, "loop labels are not supported");
                }
                if let Expr::Let(l) = peel(&w.cond) {
                    return err(l, "`while let` is not supported; use `while cond`");
                }
                let (c, t) = self.expr(&w.cond, Some(&Ty::Scalar(ScalarType::Bool)))?;
                self.expect_ty(&t, &Ty::Scalar(ScalarType::Bool), &w.cond)?;
                self.line(&format!("while ({c}) {{"));
                self.loops += 1;
                let r = self.scoped_block(&w.body, None);
                self.loops -= 1;
                r?;
                self.line("}");
                Ok(())
            }
            Expr::Loop(l) => {
                if let Some(lb) = &l.label {
                    return err(lb, "loop labels are not supported");
                }
                self.line(if self.cuda() { "for (;;) {" } else { "loop {" });
                self.loops += 1;
                let r = self.scoped_block(&l.body, None);
                self.loops -= 1;
                r?;
                self.line("}");
                Ok(())
            }
            Expr::Return(r) => {
                if let Some(v) = &r.expr {
                    return err(v, "kernels return nothing; write `return;`");
                }
                self.line("return;");
                Ok(())
            }
            Expr::Break(b) => {
                if let Some(l) = &b.label {
                    return err(l, "labeled `break` is not supported");
                }
                if let Some(v) = &b.expr {
                    return err(v, "`break` with a value is not supported");
                }
                if self.loops == 0 {
                    return err(b, "`break` outside a loop");
                }
                self.line("break;");
                Ok(())
            }
            Expr::Continue(c) => {
                if let Some(l) = &c.label {
                    return err(l, "labeled `continue` is not supported");
                }
                if self.loops == 0 {
                    return err(c, "`continue` outside a loop");
                }
                self.line("continue;");
                Ok(())
            }
            Expr::Tuple(t) if t.elems.is_empty() => Ok(()),
            Expr::Call(c) if atomic_fn(c).is_some() => {
                let (code, _) = self.expr(e, None)?;
                self.line(&format!("{code};"));
                Ok(())
            }
            Expr::Macro(m) => err(
                m,
                format!(
                    "macros are not supported in kernels; supported statements: {SUPPORTED_STMTS}"
                ),
            ),
            other => {
                // Translate it to report unsupported parts at their own span first.
                self.expr(other, None)?;
                err(
                    other,
                    format!(
                        "this expression has no effect as a statement; supported statements: \
                         {SUPPORTED_STMTS}"
                    ),
                )
            }
        }
    }

    fn cond(&mut self, e: &Expr) -> Res<String> {
        if let Expr::Let(l) = peel(e) {
            return err(l, "`if let` is not supported; compare values with `==`");
        }
        let (c, t) = self.expr(e, Some(&Ty::Scalar(ScalarType::Bool)))?;
        self.expect_ty(&t, &Ty::Scalar(ScalarType::Bool), e)?;
        Ok(c)
    }

    fn if_stmt(&mut self, i: &syn::ExprIf, dest: Option<(&str, &Ty)>) -> Res<()> {
        let c = self.cond(&i.cond)?;
        self.line(&format!("if ({c}) {{"));
        self.scoped_block(&i.then_branch, dest)?;
        let mut el = i.else_branch.as_ref().map(|(_, e)| &**e);
        while let Some(e) = el {
            match peel(e) {
                Expr::If(i2) => {
                    let c = self.cond(&i2.cond)?;
                    self.line(&format!("}} else if ({c}) {{"));
                    self.scoped_block(&i2.then_branch, dest)?;
                    el = i2.else_branch.as_ref().map(|(_, e)| &**e);
                }
                Expr::Block(b) => {
                    self.line("} else {");
                    self.scoped_block(&b.block, dest)?;
                    el = None;
                }
                other => return err(other, "unexpected `else` branch"),
            }
        }
        if dest.is_some_and(|(_, t)| *t != Ty::Unit) && !has_final_else(i) {
            return err(i, "an `if` used as a value needs an `else` branch");
        }
        self.line("}");
        Ok(())
    }

    fn match_stmt(&mut self, m: &syn::ExprMatch, dest: Option<(&str, &Ty)>) -> Res<()> {
        let (scrut, sty) = self.expr(&m.expr, None)?;
        let s = match sty.scalar() {
            Some(s) if s.is_int() => s,
            _ => {
                return err(
                    &m.expr,
                    format!(
                        "`match` is supported on integers (i32, u32, usize) only, not `{}`; use \
                         if/else",
                        sty.describe()
                    ),
                )
            }
        };
        // Arms: case values (empty for the default arm).
        let mut arms: Vec<(Vec<String>, &Expr)> = Vec::new();
        let mut seen: Vec<i128> = Vec::new();
        let mut has_default = false;
        for arm in &m.arms {
            if let Some((_, g)) = &arm.guard {
                return err(g, "match guards (`if` in an arm) are not supported");
            }
            if has_default {
                return err(
                    &arm.pat,
                    "this arm comes after the `_` arm and can never match; remove it",
                );
            }
            let mut values = Vec::new();
            let pats: Vec<&Pat> = match &arm.pat {
                Pat::Or(o) => o.cases.iter().collect(),
                p => vec![p],
            };
            for p in pats {
                match p {
                    Pat::Wild(_) => has_default = true,
                    Pat::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(li),
                        ..
                    }) => {
                        let v: i128 = li.base10_parse()?;
                        if seen.contains(&v) {
                            return err(li, "this value is already matched by an earlier arm");
                        }
                        seen.push(v);
                        values.push(self.int_literal(v, s, li)?);
                    }
                    Pat::Range(_) => {
                        return err(
                            p,
                            "range patterns are not supported; use if/else with comparisons",
                        )
                    }
                    other => {
                        return err(
                            other,
                            "match patterns must be integer literals, `a | b` or `_`",
                        )
                    }
                }
            }
            if has_default {
                values.clear();
            }
            arms.push((values, &arm.body));
        }
        if !has_default {
            return err(
                m,
                "a `match` on integers needs a final `_ => ...` arm (it becomes the default \
                 case)",
            );
        }
        let chain = self.loops > 0 && arms.iter().any(|(_, b)| has_loop_break_expr(b));
        if chain {
            // `break` inside a C/WGSL switch would leave the switch, not the loop: an
            // if/else chain keeps Rust's meaning.
            let tmp = self.names.temp("m");
            let d = self.decl(&tmp, &sty, &m.expr)?;
            self.line("{");
            self.indent += 1;
            self.line(&if self.cuda() {
                format!("{d} = {scrut};")
            } else {
                format!("let {d} = {scrut};")
            });
            let mut first = true;
            for (values, body) in &arms {
                let head = if values.is_empty() {
                    if first {
                        "if (true) {".to_string()
                    } else {
                        "} else {".to_string()
                    }
                } else {
                    let c = values
                        .iter()
                        .map(|v| format!("{tmp} == {v}"))
                        .collect::<Vec<_>>()
                        .join(" || ");
                    format!("{}if ({c}) {{", if first { "" } else { "} else " })
                };
                self.line(&head);
                self.arm_body(body, dest)?;
                first = false;
            }
            self.line("}");
            self.indent -= 1;
            self.line("}");
            return Ok(());
        }
        self.line(&format!("switch ({scrut}) {{"));
        self.indent += 1;
        for (values, body) in &arms {
            if self.cuda() {
                if values.is_empty() {
                    self.line("default: {");
                } else {
                    for (k, v) in values.iter().enumerate() {
                        if k + 1 == values.len() {
                            self.line(&format!("case {v}: {{"));
                        } else {
                            self.line(&format!("case {v}:"));
                        }
                    }
                }
                self.arm_body(body, dest)?;
                self.indent += 1;
                self.line("break;");
                self.indent -= 1;
                self.line("}");
            } else {
                if values.is_empty() {
                    self.line("default: {");
                } else {
                    self.line(&format!("case {}: {{", values.join(", ")));
                }
                self.arm_body(body, dest)?;
                self.line("}");
            }
        }
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    fn arm_body(&mut self, body: &Expr, dest: Option<(&str, &Ty)>) -> Res<()> {
        self.scopes.push(HashMap::new());
        self.indent += 1;
        let r = match peel(body) {
            Expr::Block(b) if b.label.is_none() => self.block_stmts(&b.block.stmts, dest),
            e => match dest {
                Some((place, ty)) => self.assign_value(place, ty, e),
                None => self.stmt_expr(e),
            },
        };
        self.indent -= 1;
        self.scopes.pop();
        r
    }

    fn for_loop(&mut self, f: &syn::ExprForLoop) -> Res<()> {
        if let Some(l) = &f.label {
            return err(l, "loop labels are not supported");
        }
        let range_err = || {
            err(
                &f.expr,
                "`for` loops run over integer ranges only: `a..b`, `a..=b` or \
                 `(a..b).step_by(k)`",
            )
        };
        let (range, step) = match peel(&f.expr) {
            Expr::Range(r) => (r, None),
            Expr::MethodCall(mc) if mc.method == "step_by" && mc.args.len() == 1 => {
                match peel(&mc.receiver) {
                    Expr::Range(r) => (r, Some(&mc.args[0])),
                    _ => return range_err(),
                }
            }
            Expr::MethodCall(mc) if mc.method == "rev" => {
                return err(
                    &mc.method,
                    "`.rev()` is not supported; count down with a `while` loop",
                )
            }
            _ => return range_err(),
        };
        let (Some(start), Some(end)) = (&range.start, &range.end) else {
            return err(range, "ranges need both bounds (`a..b`)");
        };
        let ((s, st), (e, et)) = self.pair(start, end, None)?;
        self.expect_ty(&et, &st, end)?;
        let Some(sc) = st.scalar().filter(|s| s.is_int()) else {
            return err(start, "range bounds must be integers (i32, u32, usize)");
        };
        let step_code = match step {
            Some(k) => {
                if let Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(i),
                    ..
                }) = peel(k)
                {
                    if i.base10_parse::<u128>()? == 0 {
                        return err(k, "`step_by(0)` never advances");
                    }
                }
                // Rust's step is a usize; the loop variable keeps the bounds' type.
                let (c, t) = self.expr(k, Some(&st))?;
                if t.scalar().is_none_or(|t| !t.is_int()) {
                    return err(k, "the step must be an integer");
                }
                Some(self.convert(&c, t.scalar().expect("int"), sc))
            }
            None => None,
        };
        let var = match &*f.pat {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                if pi.mutability.is_some() {
                    return err(
                        pi,
                        "a `for` loop variable cannot be `mut` in the kernel subset",
                    );
                }
                Some(&pi.ident)
            }
            Pat::Wild(_) => None,
            other => return err(other, "the loop variable must be a name or `_`"),
        };
        let tname = self.sname(sc, &f.expr)?;
        let end_tmp = self.names.temp("end");
        let cmp = match range.limits {
            syn::RangeLimits::HalfOpen(_) => "<",
            syn::RangeLimits::Closed(_) => "<=",
        };
        self.line("{");
        self.indent += 1;
        self.scopes.push(HashMap::new());
        let step_val = match step_code {
            Some(c) => {
                let tmp = self.names.temp("step");
                self.line(&if self.cuda() {
                    format!("{tname} {tmp} = {c};")
                } else {
                    format!("let {tmp}: {tname} = {c};")
                });
                tmp
            }
            None => self.literal_one(sc),
        };
        self.line(&if self.cuda() {
            format!("{tname} {end_tmp} = {e};")
        } else {
            format!("let {end_tmp}: {tname} = {e};")
        });
        let iv = match var {
            Some(id) => self.declare(id, st.clone(), false)?,
            None => self.names.temp("i"),
        };
        self.line(&if self.cuda() {
            format!("for ({tname} {iv} = {s}; {iv} {cmp} {end_tmp}; {iv} += {step_val}) {{")
        } else {
            format!("for (var {iv}: {tname} = {s}; {iv} {cmp} {end_tmp}; {iv} += {step_val}) {{")
        });
        self.loops += 1;
        let r = self.scoped_block(&f.body, None);
        self.loops -= 1;
        r?;
        self.line("}");
        self.scopes.pop();
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    fn literal_one(&self, s: ScalarType) -> String {
        match (self.target, s) {
            (Target::Cuda, ScalarType::U32) => "1u".into(),
            (Target::Cuda, ScalarType::Usize) => "1ull".into(),
            (Target::Cuda, _) => "1".into(),
            (Target::Wgsl, ScalarType::I32) => "1i".into(),
            (Target::Wgsl, _) => "1u".into(),
        }
    }

    /// `code` of type `from` converted to `to` (no-op when equal).
    fn convert(&self, code: &str, from: ScalarType, to: ScalarType) -> String {
        if from == to || (self.target == Target::Wgsl && from.wgsl_name() == to.wgsl_name()) {
            return code.to_string();
        }
        if self.cuda() {
            format!("(({})({code}))", to.cuda_name())
        } else {
            format!("{}({code})", to.wgsl_name().unwrap_or("f32"))
        }
    }

    // ------------------------------------------------------------ expressions

    /// Translates `a` and `b` that must have one type: an untyped literal side takes the
    /// other side's type.
    fn pair(&mut self, a: &Expr, b: &Expr, expected: Option<&Ty>) -> Res<(Val, Val)> {
        if is_untyped(a) && !is_untyped(b) {
            let vb = self.expr(b, expected)?;
            let va = self.expr(a, Some(&vb.1))?;
            Ok((va, vb))
        } else {
            let va = self.expr(a, expected)?;
            let vb = self.expr(b, Some(&va.1))?;
            Ok((va, vb))
        }
    }

    pub(crate) fn expr(&mut self, e: &Expr, expected: Option<&Ty>) -> Res<Val> {
        match e {
            Expr::Lit(l) => self.literal(&l.lit, expected),
            Expr::Paren(p) => {
                let (c, t) = self.expr(&p.expr, expected)?;
                Ok((format!("({c})"), t))
            }
            Expr::Group(g) => self.expr(&g.expr, expected),
            Expr::Path(p) => self.path_value(p),
            Expr::Binary(b) => {
                if compound_op(&b.op).is_some() {
                    return err(e, "compound assignment is a statement, not a value");
                }
                self.binary(b, expected)
            }
            Expr::Unary(u) => self.unary(u, expected),
            Expr::Cast(c) => self.cast(c),
            Expr::Index(ix) => {
                let (code, ty, base) = self.index(ix)?;
                if self.is_atomic(&base) {
                    return Ok((format!("atomicLoad(&{code})"), ty));
                }
                Ok((code, ty))
            }
            Expr::MethodCall(mc) => self.method_call(mc, expected),
            Expr::Call(c) => self.call(c, expected),
            Expr::If(i) if self.is_simple_if(e) => self.if_value(i, expected),
            Expr::Block(b) if b.label.is_none() => match b.block.stmts.as_slice() {
                [Stmt::Expr(inner, None)] => {
                    let (c, t) = self.expr(inner, expected)?;
                    Ok((format!("({c})"), t))
                }
                _ => err(
                    e,
                    "a block with statements is a value only as a `let` initializer or the \
                     right side of an assignment",
                ),
            },
            Expr::If(_) | Expr::Match(_) => err(
                e,
                "an `if` with statements in its branches, or a `match`, is a value only as a \
                 `let` initializer or the right side of an assignment",
            ),
            Expr::Assign(_) => err(e, "assignment is a statement, not a value"),
            Expr::Array(_) | Expr::Repeat(_) => {
                err(e, "array values are supported as `let` initializers only")
            }
            Expr::Reference(_) => err(
                e,
                "references are not supported here (`&buf` is accepted as a GridPos neighbour \
                 argument only)",
            ),
            Expr::Closure(_) => err(
                e,
                format!("closures are not supported in kernels; supported expressions: {SUPPORTED_EXPRS}"),
            ),
            Expr::Macro(m) => err(
                m,
                format!("macros are not supported in kernels; supported expressions: {SUPPORTED_EXPRS}"),
            ),
            Expr::Field(_) => err(
                e,
                "field access is not supported (no structs in the kernel subset yet)",
            ),
            Expr::Tuple(_) => err(e, "tuples are not supported in the kernel subset"),
            Expr::Range(_) => err(e, "ranges are supported as `for` loop iterators only"),
            Expr::Return(_) | Expr::Break(_) | Expr::Continue(_) => err(
                e,
                "`return`, `break` and `continue` are statements here, not values",
            ),
            Expr::Try(_) => err(e, "`?` is not supported in kernels"),
            Expr::Unsafe(_) => err(e, "`unsafe` blocks are not supported in kernels"),
            _ => err(
                e,
                format!("unsupported expression; supported expressions: {SUPPORTED_EXPRS}"),
            ),
        }
    }

    fn int_literal(&self, v: i128, s: ScalarType, span_of: &dyn ToTokens) -> Res<String> {
        let (lo, hi): (i128, i128) = match s {
            ScalarType::I32 => (i32::MIN as i128, i32::MAX as i128),
            ScalarType::U32 => (0, u32::MAX as i128),
            ScalarType::Usize if self.target == Target::Wgsl => (0, u32::MAX as i128),
            ScalarType::Usize => (0, u64::MAX as i128),
            _ => return err(span_of, "an integer literal cannot have this type"),
        };
        if v < lo || v > hi {
            return err(
                span_of,
                format!("literal {v} does not fit in `{}`", s.rust_name()),
            );
        }
        if v < 0 {
            // Only i32 reaches here; i32::MIN has no positive literal to negate.
            let text = match (self.target, v == i32::MIN as i128) {
                (Target::Cuda, true) => "-2147483647 - 1".to_string(),
                (Target::Wgsl, true) => "-2147483647i - 1i".to_string(),
                (Target::Cuda, false) => format!("{v}"),
                (Target::Wgsl, false) => format!("{v}i"),
            };
            return Ok(format!("({text})"));
        }
        Ok(match (self.target, s) {
            (Target::Cuda, ScalarType::I32) => format!("{v}"),
            (Target::Cuda, ScalarType::U32) => format!("{v}u"),
            (Target::Cuda, _) => format!("{v}ull"),
            (Target::Wgsl, ScalarType::I32) => format!("{v}i"),
            (Target::Wgsl, _) => format!("{v}u"),
        })
    }

    fn float_literal(&self, v: f64, s: ScalarType, span_of: &dyn ToTokens) -> Res<String> {
        if !v.is_finite() {
            return err(span_of, "float literal out of range");
        }
        Ok(match s {
            ScalarType::F32 => {
                let f = v as f32;
                if !f.is_finite() {
                    return err(span_of, "literal does not fit in `f32`");
                }
                let mut t = format!("{f:?}");
                if !t.contains(['.', 'e']) {
                    t.push_str(".0");
                }
                if self.cuda() && !t.contains('.') {
                    // `1e30f` is not valid C; give it a point.
                    t = t.replacen('e', ".0e", 1);
                }
                format!("{t}f")
            }
            ScalarType::F64 => {
                if self.target == Target::Wgsl {
                    return Err(crate::types::f64_error(span_of));
                }
                let mut t = format!("{v:?}");
                if !t.contains('.') {
                    t = if t.contains('e') {
                        t.replacen('e', ".0e", 1)
                    } else {
                        format!("{t}.0")
                    };
                }
                t
            }
            _ => return err(span_of, "a float literal cannot have this type"),
        })
    }

    fn literal(&self, lit: &syn::Lit, expected: Option<&Ty>) -> Res<Val> {
        match lit {
            syn::Lit::Bool(b) => Ok((b.value.to_string(), Ty::Scalar(ScalarType::Bool))),
            syn::Lit::Int(i) => {
                let s = match i.suffix() {
                    "" => match expected.and_then(Ty::scalar) {
                        Some(s) if s.is_int() => s,
                        _ => ScalarType::I32,
                    },
                    suf => match ScalarType::from_name(suf) {
                        Some(s) if s.is_int() => s,
                        Some(s) if s.is_float() => {
                            let v: f64 = i.base10_parse()?;
                            return Ok((self.float_literal(v, s, i)?, Ty::Scalar(s)));
                        }
                        _ => {
                            return err(
                                i,
                                format!(
                                    "literal suffix `{suf}` is not supported; integers are i32, \
                                     u32 or usize"
                                ),
                            )
                        }
                    },
                };
                let v: i128 = i.base10_parse()?;
                Ok((self.int_literal(v, s, i)?, Ty::Scalar(s)))
            }
            syn::Lit::Float(f) => {
                let s = match f.suffix() {
                    "" => match expected.and_then(Ty::scalar) {
                        Some(s) if s.is_float() => s,
                        _ => ScalarType::F32,
                    },
                    "f32" => ScalarType::F32,
                    "f64" => ScalarType::F64,
                    suf => return err(f, format!("literal suffix `{suf}` is not supported")),
                };
                let v: f64 = f.base10_parse()?;
                Ok((self.float_literal(v, s, f)?, Ty::Scalar(s)))
            }
            other => err(
                other,
                "only integer, float and bool literals are supported in kernels",
            ),
        }
    }

    fn path_value(&mut self, p: &syn::ExprPath) -> Res<Val> {
        if p.qself.is_none() && p.path.segments.len() >= 2 {
            return self.constant(p);
        }
        let ident = path_ident(p)?;
        let v = self.lookup(ident)?;
        match &v.ty {
            Ty::Scalar(_) | Ty::Array { .. } | Ty::Slice { .. } => Ok((v.emitted, v.ty)),
            Ty::GridPos { .. } => err(
                p,
                "a `GridPos` is used through its methods (`pos.idx()`, `pos.north(&buf)`, ...)",
            ),
            Ty::Unit => err(p, "unit values are not supported"),
        }
    }

    fn constant(&self, p: &syn::ExprPath) -> Res<Val> {
        let segs: Vec<String> = p
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
        let tail = match segs.as_slice() {
            ["std" | "core", rest @ ..] => rest,
            all => all,
        };
        let unsupported = || {
            err(
                p,
                "unsupported path; constants supported: f32/f64::{MAX, MIN, EPSILON, \
                 INFINITY, NEG_INFINITY, consts::PI, consts::E}, i32/u32::{MAX, MIN}",
            )
        };
        let (ty, name) = match tail {
            [t, n] => (*t, *n),
            [t, "consts", n] => (*t, *n),
            _ => return unsupported(),
        };
        let Some(s) = ScalarType::from_name(ty) else {
            return unsupported();
        };
        if s.is_float() {
            let v = match name {
                "MAX" => f32::MAX as f64,
                "MIN" => f32::MIN as f64,
                "EPSILON" => f32::EPSILON as f64,
                "PI" => std::f64::consts::PI,
                "E" => std::f64::consts::E,
                "INFINITY" | "NEG_INFINITY" => {
                    let sign = if name == "INFINITY" { "" } else { "-" };
                    if s == ScalarType::F64 && self.target == Target::Wgsl {
                        return Err(crate::types::f64_error(p));
                    }
                    let code = match self.target {
                        Target::Cuda if s == ScalarType::F32 => {
                            format!("({sign}__int_as_float(0x7f800000))")
                        }
                        Target::Cuda => {
                            format!("({sign}__longlong_as_double(0x7ff0000000000000ll))")
                        }
                        Target::Wgsl => format!("({sign}bitcast<f32>(0x7f800000u))"),
                    };
                    return Ok((code, Ty::Scalar(s)));
                }
                _ => return unsupported(),
            };
            let v = if s == ScalarType::F64 {
                match name {
                    "MAX" => f64::MAX,
                    "MIN" => f64::MIN,
                    "EPSILON" => f64::EPSILON,
                    _ => v,
                }
            } else {
                v
            };
            return Ok((self.float_literal(v, s, p)?, Ty::Scalar(s)));
        }
        if s.is_int() && s != ScalarType::Usize {
            let v: i128 = match (s, name) {
                (ScalarType::I32, "MAX") => i32::MAX as i128,
                (ScalarType::I32, "MIN") => i32::MIN as i128,
                (ScalarType::U32, "MAX") => u32::MAX as i128,
                (ScalarType::U32, "MIN") => 0,
                _ => return unsupported(),
            };
            return Ok((self.int_literal(v, s, p)?, Ty::Scalar(s)));
        }
        unsupported()
    }

    fn binary(&mut self, b: &syn::ExprBinary, expected: Option<&Ty>) -> Res<Val> {
        match &b.op {
            BinOp::And(_) | BinOp::Or(_) => {
                let bool_ty = Ty::Scalar(ScalarType::Bool);
                let (l, lt) = self.expr(&b.left, Some(&bool_ty))?;
                let (r, rt) = self.expr(&b.right, Some(&bool_ty))?;
                self.expect_ty(&lt, &bool_ty, &b.left)?;
                self.expect_ty(&rt, &bool_ty, &b.right)?;
                let op = if matches!(b.op, BinOp::And(_)) {
                    "&&"
                } else {
                    "||"
                };
                Ok((format!("({l} {op} {r})"), bool_ty))
            }
            BinOp::Shl(_) | BinOp::Shr(_) => {
                let (l, lt) = self.expr(&b.left, expected)?;
                let (r, rt) = self.expr(&b.right, None)?;
                self.binop_code(&b.op, (&l, &lt), (&r, &rt), &b.right)
            }
            BinOp::Eq(_)
            | BinOp::Ne(_)
            | BinOp::Lt(_)
            | BinOp::Le(_)
            | BinOp::Gt(_)
            | BinOp::Ge(_) => {
                let ((l, lt), (r, rt)) = self.pair(&b.left, &b.right, None)?;
                self.expect_ty(&rt, &lt, &b.right)?;
                let s = lt.scalar().ok_or_else(|| {
                    syn::Error::new_spanned(&b.left, "only scalars can be compared")
                })?;
                let op = match b.op {
                    BinOp::Eq(_) => "==",
                    BinOp::Ne(_) => "!=",
                    BinOp::Lt(_) => "<",
                    BinOp::Le(_) => "<=",
                    BinOp::Gt(_) => ">",
                    _ => ">=",
                };
                if s == ScalarType::Bool && !matches!(b.op, BinOp::Eq(_) | BinOp::Ne(_)) {
                    return err(&b.op, "bools can be compared with `==` and `!=` only");
                }
                Ok((format!("({l} {op} {r})"), Ty::Scalar(ScalarType::Bool)))
            }
            _ => {
                let ((l, lt), (r, rt)) = self.pair(&b.left, &b.right, expected)?;
                self.binop_code(&b.op, (&l, &lt), (&r, &rt), &b.right)
            }
        }
    }

    /// Code for `l op r` (arithmetic, bit and shift operators) with type checks.
    fn binop_code(
        &self,
        op: &BinOp,
        (l, lt): (&str, &Ty),
        (r, rt): (&str, &Ty),
        rspan: &dyn ToTokens,
    ) -> Res<Val> {
        let ls = lt
            .scalar()
            .ok_or_else(|| syn::Error::new_spanned(op, "operators apply to scalars only"))?;
        let rs = rt
            .scalar()
            .ok_or_else(|| syn::Error::new_spanned(rspan, "operators apply to scalars only"))?;
        match op {
            BinOp::Shl(_) | BinOp::Shr(_) => {
                if !ls.is_int() || !rs.is_int() {
                    return err(op, "shifts apply to integers only");
                }
                let sym = if matches!(op, BinOp::Shl(_)) {
                    "<<"
                } else {
                    ">>"
                };
                let r = if self.cuda() {
                    r.to_string()
                } else {
                    self.convert(r, rs, ScalarType::U32)
                };
                return Ok((format!("({l} {sym} {r})"), lt.clone()));
            }
            _ => {}
        }
        self.expect_ty(rt, lt, rspan)?;
        if let Some(sym) = arith_op(op) {
            if ls == ScalarType::Bool {
                return err(op, "arithmetic does not apply to `bool`");
            }
            if sym == "%" && ls.is_float() && self.cuda() {
                let f = if ls == ScalarType::F32 {
                    "fmodf"
                } else {
                    "fmod"
                };
                return Ok((format!("{f}({l}, {r})"), lt.clone()));
            }
            return Ok((format!("({l} {sym} {r})"), lt.clone()));
        }
        let sym = match op {
            BinOp::BitAnd(_) => "&",
            BinOp::BitOr(_) => "|",
            BinOp::BitXor(_) => "^",
            _ => return err(op, "unsupported operator"),
        };
        if ls.is_float() {
            return err(op, "bit operators apply to integers and bools only");
        }
        if ls == ScalarType::Bool && sym == "^" {
            return Ok((format!("({l} != {r})"), lt.clone()));
        }
        Ok((format!("({l} {sym} {r})"), lt.clone()))
    }

    fn unary(&mut self, u: &syn::ExprUnary, expected: Option<&Ty>) -> Res<Val> {
        match u.op {
            UnOp::Neg(_) => {
                // `-2147483648` is a valid i32 literal in Rust: fold the sign in.
                if let Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(li),
                    ..
                }) = peel(&u.expr)
                {
                    let s = match li.suffix() {
                        "" => match expected.and_then(Ty::scalar) {
                            Some(s) if s.is_int() => s,
                            _ => ScalarType::I32,
                        },
                        suf => ScalarType::from_name(suf).unwrap_or(ScalarType::I32),
                    };
                    if s.is_int() {
                        if !s.is_signed() {
                            return err(u, format!("cannot negate a `{}`", s.rust_name()));
                        }
                        let v: i128 = li.base10_parse()?;
                        return Ok((self.int_literal(-v, s, u)?, Ty::Scalar(s)));
                    }
                }
                let (c, t) = self.expr(&u.expr, expected)?;
                match t.scalar() {
                    Some(s) if s.is_signed() => Ok((format!("(-{c})"), t)),
                    _ => err(
                        u,
                        format!("cannot negate a value of type `{}`", t.describe()),
                    ),
                }
            }
            UnOp::Not(_) => {
                let (c, t) = self.expr(&u.expr, expected)?;
                match t.scalar() {
                    Some(ScalarType::Bool) => Ok((format!("(!{c})"), t)),
                    Some(s) if s.is_int() => Ok((format!("(~{c})"), t)),
                    _ => err(u, format!("`!` does not apply to `{}`", t.describe())),
                }
            }
            UnOp::Deref(_) => err(u, "dereferencing (`*x`) is not supported in kernels"),
            _ => err(u, "unsupported unary operator"),
        }
    }

    fn cast(&mut self, c: &syn::ExprCast) -> Res<Val> {
        let to = parse_type(&c.ty, self.target)?;
        let Some(ts) = to.scalar() else {
            return err(&c.ty, "`as` casts to scalar types only");
        };
        if ts == ScalarType::Bool {
            return err(
                &c.ty,
                "casting to `bool` is not allowed; compare with `!= 0`",
            );
        }
        let hint = if is_untyped(&c.expr) { None } else { Some(&to) };
        let (code, from) = self.expr(&c.expr, hint)?;
        let Some(fs) = from.scalar() else {
            return err(&c.expr, "only scalars can be cast with `as`");
        };
        if fs == ScalarType::Bool && ts.is_float() {
            return err(c, "a `bool` casts to integers only");
        }
        if self.cuda() {
            Ok((format!("(({})({code}))", ts.cuda_name()), to))
        } else {
            let t = self.sname(ts, &c.ty)?;
            Ok((format!("{t}({code})"), to))
        }
    }

    /// `base[i]`: code, element type, and the base variable.
    fn index(&mut self, ix: &syn::ExprIndex) -> Res<(String, Ty, Var)> {
        let base = match peel(&ix.expr) {
            Expr::Path(p) => self.lookup(path_ident(p)?)?,
            other => {
                return err(
                    other,
                    "only slices and arrays named by a variable can be indexed (`data[i]`)",
                )
            }
        };
        let elem = match &base.ty {
            Ty::Slice { elem, .. } | Ty::Array { elem, .. } => *elem,
            other => {
                return err(
                    &ix.expr,
                    format!("a `{}` cannot be indexed", other.describe()),
                )
            }
        };
        if let Expr::Range(r) = peel(&ix.index) {
            return err(
                r,
                "sub-slices (`data[a..b]`) are not supported; index elements",
            );
        }
        let (i, it) = self.expr(&ix.index, Some(&Ty::Scalar(ScalarType::Usize)))?;
        if it.scalar().is_none_or(|s| !s.is_int()) {
            return err(&ix.index, "indices must be integers (usize, u32, i32)");
        }
        Ok((format!("{}[{i}]", base.emitted), Ty::Scalar(elem), base))
    }

    fn is_atomic(&self, base: &Var) -> bool {
        self.target == Target::Wgsl
            && matches!(base.ty, Ty::Slice { .. })
            && self.atomics.contains(&base.emitted)
    }

    /// `atomic_add(&mut data[i], v)` and the other atomics: the element's old value.
    fn atomic_call(
        &mut self,
        c: &syn::ExprCall,
        name: &str,
        cuda_fn: &str,
        wgsl_fn: &str,
    ) -> Res<Val> {
        let usage = || {
            err(
                c,
                format!(
                    "atomics take an element of a `&mut [u32]` or `&mut [i32]` parameter and a \
                     value: `{name}(&mut data[i], v)`"
                ),
            )
        };
        if c.args.len() != 2 {
            return usage();
        }
        let Expr::Reference(r) = peel(&c.args[0]) else {
            return usage();
        };
        let Expr::Index(ix) = peel(&r.expr) else {
            return usage();
        };
        if r.mutability.is_none() {
            return usage();
        }
        let (code, ty, base) = self.index(ix)?;
        let elem = match base.ty {
            Ty::Slice {
                elem: e @ (ScalarType::U32 | ScalarType::I32),
                mutable: true,
            } => e,
            _ => return usage(),
        };
        let (v, vt) = self.expr(&c.args[1], Some(&ty))?;
        self.expect_ty(&vt, &ty, &c.args[1])?;
        let f = if self.cuda() { cuda_fn } else { wgsl_fn };
        Ok((format!("{f}(&{code}, {v})"), Ty::Scalar(elem)))
    }

    fn if_value(&mut self, i: &syn::ExprIf, expected: Option<&Ty>) -> Res<Val> {
        let c = self.cond(&i.cond)?;
        let Some(Stmt::Expr(then, None)) = i.then_branch.stmts.first() else {
            return err(i, "unexpected `if` form");
        };
        let Some((_, el)) = &i.else_branch else {
            return err(i, "an `if` used as a value needs an `else` branch");
        };
        let el_expr: &Expr = match peel(el) {
            Expr::Block(b) => match b.block.stmts.first() {
                Some(Stmt::Expr(x, None)) => x,
                _ => return err(el, "unexpected `else` form"),
            },
            other => other,
        };
        let ((a, at), (b, bt)) = self.pair(then, el_expr, expected)?;
        self.expect_ty(&bt, &at, el_expr)?;
        if at.scalar().is_none() {
            return err(then, "`if` values must be scalars");
        }
        Ok(if self.cuda() {
            (format!("({c} ? {a} : {b})"), at)
        } else {
            (format!("select({b}, {a}, {c})"), at)
        })
    }

    fn call(&mut self, c: &syn::ExprCall, expected: Option<&Ty>) -> Res<Val> {
        let Expr::Path(p) = peel(&c.func) else {
            return err(
                &c.func,
                "only dsl functions and `f32::sqrt(x)`-style calls are supported",
            );
        };
        let segs: Vec<String> = p
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        let last = segs.last().cloned().unwrap_or_default();
        // `f32::sqrt(x)`, `i32::max(a, b)`: method calls in disguise.
        if segs.len() == 2 {
            if let Some(s) = ScalarType::from_name(&segs[0]) {
                let mut args = c.args.iter();
                let Some(recv) = args.next() else {
                    return err(c, "missing receiver argument");
                };
                let rest: Vec<&Expr> = args.collect();
                let method = &p.path.segments[1].ident;
                return self.math(Some(s), recv, method, &rest, c, expected);
            }
        }
        let is_dsl = segs.len() == 1 || segs.iter().rev().nth(1).is_some_and(|s| s == "dsl");
        if let (Some((cuda_fn, wgsl_fn)), true) = (atomic_fn(c), is_dsl) {
            return self.atomic_call(c, &last, cuda_fn, wgsl_fn);
        }
        let dims = ["x", "y", "z"];
        let builtin = ["thread_idx", "block_idx", "block_dim", "grid_dim"]
            .iter()
            .find_map(|b| {
                dims.iter()
                    .position(|d| last == format!("{b}_{d}"))
                    .map(|k| (*b, k))
            });
        match builtin {
            Some((b, k)) if is_dsl => {
                if !c.args.is_empty() {
                    return err(&c.args, format!("`{last}()` takes no arguments"));
                }
                if self.stencil.is_some() {
                    return err(
                        c,
                        "thread and block indices are not available in stencil kernels; use \
                         the `GridPos` parameter (`pos.x()`, `pos.idx()`, ...)",
                    );
                }
                let d = dims[k];
                let code = if self.cuda() {
                    let v = match b {
                        "thread_idx" => "threadIdx",
                        "block_idx" => "blockIdx",
                        "block_dim" => "blockDim",
                        _ => "gridDim",
                    };
                    format!("((int){v}.{d})")
                } else {
                    match b {
                        "thread_idx" => format!("i32(rk_lid.{d})"),
                        "block_idx" => format!("i32(rk_wid.{d})"),
                        "block_dim" => format!("{}i", self.workgroup[k]),
                        _ => format!("i32(rk_nwg.{d})"),
                    }
                };
                Ok((code, Ty::Scalar(ScalarType::I32)))
            }
            _ => err(
                c,
                format!(
                    "unsupported call `{}`: kernels can call the dsl index functions \
                     (thread_idx_x(), block_idx_x(), block_dim_x(), grid_dim_x() and their y/z \
                     forms) and math methods; other functions are not supported yet",
                    segs.join("::")
                ),
            ),
        }
    }

    fn method_call(&mut self, mc: &syn::ExprMethodCall, expected: Option<&Ty>) -> Res<Val> {
        if let Some(t) = &mc.turbofish {
            return err(t, "turbofish is not supported");
        }
        // GridPos methods.
        if let Expr::Path(p) = peel(&mc.receiver) {
            if let Ok(ident) = path_ident(p) {
                if let Ok(v) = self.lookup(ident) {
                    if let Ty::GridPos { dims } = v.ty {
                        return self.grid_pos(dims, mc);
                    }
                }
            }
        }
        let args: Vec<&Expr> = mc.args.iter().collect();
        self.math(None, &mc.receiver, &mc.method, &args, mc, expected)
    }

    /// `recv.method(args)` for the math methods; `ty` is the type named in the
    /// `f32::method(recv, ...)` form.
    fn math(
        &mut self,
        ty: Option<ScalarType>,
        recv: &Expr,
        method: &syn::Ident,
        args: &[&Expr],
        whole: &dyn ToTokens,
        expected: Option<&Ty>,
    ) -> Res<Val> {
        let hint = ty.map(Ty::Scalar).or_else(|| expected.cloned());
        let (r, rt) = self.expr(recv, hint.as_ref())?;
        let Some(s) = rt.scalar() else {
            if method == "len" && matches!(rt, Ty::Slice { .. }) {
                return err(
                    method,
                    "`len()` is not supported (a CUDA pointer has no length); pass the length \
                     as a parameter",
                );
            }
            return err(
                recv,
                format!("`{}` has no methods in the kernel subset", rt.describe()),
            );
        };
        if let Some(t) = ty {
            self.expect_ty(&rt, &Ty::Scalar(t), recv)?;
        }
        let m = method.to_string();
        let arity = |n: usize| -> Res<()> {
            if args.len() != n {
                return err(
                    whole,
                    format!("`{m}` takes {n} argument{}", if n == 1 { "" } else { "s" }),
                );
            }
            Ok(())
        };
        let mut a = Vec::new();
        for x in args {
            let (c, t) = self.expr(x, Some(&rt))?;
            self.expect_ty(&t, &rt, x)?;
            a.push(c);
        }
        let cuda = self.cuda();
        if s.is_float() {
            let f32 = s == ScalarType::F32;
            // (rust name, C name, WGSL name, arity)
            let unary: &[(&str, &str, &str)] = &[
                ("sqrt", "sqrt", "sqrt"),
                ("exp", "exp", "exp"),
                ("exp2", "exp2", "exp2"),
                ("ln", "log", "log"),
                ("log2", "log2", "log2"),
                ("sin", "sin", "sin"),
                ("cos", "cos", "cos"),
                ("tan", "tan", "tan"),
                ("tanh", "tanh", "tanh"),
                ("sinh", "sinh", "sinh"),
                ("cosh", "cosh", "cosh"),
                ("asin", "asin", "asin"),
                ("acos", "acos", "acos"),
                ("atan", "atan", "atan"),
                ("abs", "fabs", "abs"),
                ("floor", "floor", "floor"),
                ("ceil", "ceil", "ceil"),
                ("trunc", "trunc", "trunc"),
            ];
            let binary: &[(&str, &str, &str)] = &[
                ("powf", "pow", "pow"),
                ("min", "fmin", "min"),
                ("max", "fmax", "max"),
                ("atan2", "atan2", "atan2"),
            ];
            let cname = |c: &str| if f32 { format!("{c}f") } else { c.to_string() };
            if let Some((_, c, w)) = unary.iter().find(|(n, _, _)| *n == m) {
                arity(0)?;
                let f = if cuda { cname(c) } else { (*w).to_string() };
                return Ok((format!("{f}({r})"), rt));
            }
            if let Some((_, c, w)) = binary.iter().find(|(n, _, _)| *n == m) {
                arity(1)?;
                let f = if cuda { cname(c) } else { (*w).to_string() };
                return Ok((format!("{f}({r}, {})", a[0]), rt));
            }
            match m.as_str() {
                "mul_add" => {
                    arity(2)?;
                    let f = if cuda { cname("fma") } else { "fma".into() };
                    return Ok((format!("{f}({r}, {}, {})", a[0], a[1]), rt));
                }
                "clamp" => {
                    arity(2)?;
                    return Ok(if cuda {
                        (
                            format!(
                                "{}({}({r}, {}), {})",
                                cname("fmin"),
                                cname("fmax"),
                                a[0],
                                a[1]
                            ),
                            rt,
                        )
                    } else {
                        (format!("clamp({r}, {}, {})", a[0], a[1]), rt)
                    });
                }
                "recip" => {
                    arity(0)?;
                    let one = self.float_literal(1.0, s, whole)?;
                    return Ok((format!("({one} / {r})"), rt));
                }
                _ => {}
            }
        } else if s.is_int() {
            match m.as_str() {
                "min" | "max" => {
                    arity(1)?;
                    return Ok((format!("{m}({r}, {})", a[0]), rt));
                }
                "abs" if s == ScalarType::I32 => {
                    arity(0)?;
                    return Ok((format!("abs({r})"), rt));
                }
                "clamp" => {
                    arity(2)?;
                    return Ok(if cuda {
                        (format!("min(max({r}, {}), {})", a[0], a[1]), rt)
                    } else {
                        (format!("clamp({r}, {}, {})", a[0], a[1]), rt)
                    });
                }
                "wrapping_add" | "wrapping_sub" | "wrapping_mul" => {
                    arity(1)?;
                    let op = match m.as_str() {
                        "wrapping_add" => "+",
                        "wrapping_sub" => "-",
                        _ => "*",
                    };
                    if cuda && s == ScalarType::I32 {
                        // Signed overflow is undefined in C: wrap through unsigned.
                        return Ok((
                            format!("((int)((unsigned int)({r}) {op} (unsigned int)({})))", a[0]),
                            rt,
                        ));
                    }
                    return Ok((format!("({r} {op} {})", a[0]), rt));
                }
                _ => {}
            }
        }
        err(
            method,
            format!(
                "unsupported method `{m}` on `{}`; supported: float sqrt, exp, exp2, ln, log2, \
                 sin, cos, tan, tanh, sinh, cosh, asin, acos, atan, atan2, abs, floor, ceil, \
                 trunc, recip, powf, min, max, clamp, mul_add; integer min, max, clamp, abs \
                 (i32), wrapping_add/sub/mul",
                s.rust_name()
            ),
        )
    }

    fn grid_pos(&mut self, dims: u8, mc: &syn::ExprMethodCall) -> Res<Val> {
        let st = self
            .stencil
            .as_ref()
            .expect("GridPos only exists in stencil kernels");
        let halo = st.halo as i128;
        let m = mc.method.to_string();
        let i32t = Ty::Scalar(ScalarType::I32);
        let no_args = |what: &str| -> Res<()> {
            if !mc.args.is_empty() {
                return err(&mc.args, format!("`{what}()` takes no arguments"));
            }
            Ok(())
        };
        let simple = match (m.as_str(), dims) {
            ("x", _) => Some(("rk_x", i32t.clone())),
            ("y", _) => Some(("rk_y", i32t.clone())),
            ("z", 3) => Some(("rk_z", i32t.clone())),
            ("nx", _) => Some(("rk_nx", i32t.clone())),
            ("ny", _) => Some(("rk_ny", i32t.clone())),
            ("nz", 3) => Some(("rk_nz", i32t.clone())),
            ("idx", _) => Some(("rk_idx", Ty::Scalar(ScalarType::Usize))),
            _ => None,
        };
        if let Some((code, ty)) = simple {
            no_args(&m)?;
            return Ok((code.to_string(), ty));
        }
        // Neighbours: (method, dx, dy, dz).
        let fixed: &[(&str, i32, i32, i32)] = &[
            ("north", 0, -1, 0),
            ("south", 0, 1, 0),
            ("west", -1, 0, 0),
            ("east", 1, 0, 0),
            ("down", 0, 0, -1),
            ("up", 0, 0, 1),
        ];
        let buf_of = |this: &Self, e: &Expr| -> Res<Var> {
            let inner = match peel(e) {
                Expr::Reference(r) if r.mutability.is_none() => peel(&r.expr),
                other => other,
            };
            let Expr::Path(p) = inner else {
                return err(
                    e,
                    "the neighbour's buffer must be a slice parameter (`&buf`)",
                );
            };
            let v = this.lookup(path_ident(p)?)?;
            if !matches!(v.ty, Ty::Slice { .. }) {
                return err(
                    e,
                    "the neighbour's buffer must be a slice parameter (`&buf`)",
                );
            }
            Ok(v)
        };
        if let Some((_, dx, dy, dz)) = fixed
            .iter()
            .find(|(n, _, _, dz)| *n == m && (dims == 3 || *dz == 0))
        {
            if mc.args.len() != 1 {
                return err(mc, format!("`{m}` takes the buffer: `pos.{m}(&buf)`"));
            }
            let v = buf_of(self, &mc.args[0])?;
            let Ty::Slice { elem, .. } = v.ty else {
                unreachable!()
            };
            let (off, sign) = match (dx, dy, dz) {
                (1, _, _) | (-1, _, _) => (if self.cuda() { "1ull" } else { "1u" }, *dx),
                (_, 1, _) | (_, -1, _) => ("rk_sy", *dy),
                _ => ("rk_sz", *dz),
            };
            let op = if sign > 0 { "+" } else { "-" };
            return Ok((
                format!("{}[rk_idx {op} {off}]", v.emitted),
                Ty::Scalar(elem),
            ));
        }
        if m == "at" {
            let want = dims as usize + 1;
            if mc.args.len() != want {
                let form = if dims == 2 {
                    "pos.at(&buf, dx, dy)"
                } else {
                    "pos.at(&buf, dx, dy, dz)"
                };
                return err(
                    mc,
                    format!("`at` takes the buffer and {dims} offsets: `{form}`"),
                );
            }
            let v = buf_of(self, &mc.args[0])?;
            let Ty::Slice { elem, .. } = v.ty else {
                unreachable!()
            };
            let mut offs = Vec::new();
            for a in mc.args.iter().skip(1) {
                let lit = match peel(a) {
                    Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i),
                        ..
                    }) => Some(i.base10_parse::<i128>()?),
                    Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => match peel(&u.expr) {
                        Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Int(i),
                            ..
                        }) => Some(-i.base10_parse::<i128>()?),
                        _ => None,
                    },
                    _ => None,
                };
                if let Some(l) = lit {
                    if l.abs() > halo {
                        return err(
                            a,
                            format!("offset {l} reaches past the halo of {halo} cells"),
                        );
                    }
                }
                let (c, t) = self.expr(a, Some(&i32t))?;
                self.expect_ty(&t, &i32t, a)?;
                offs.push(c);
            }
            let strides = ["", "rk_sy", "rk_sz"];
            let idx = if self.cuda() {
                let mut s = "(long long)rk_idx".to_string();
                for (k, o) in offs.iter().enumerate() {
                    if k == 0 {
                        let _ = write!(s, " + (long long)({o})");
                    } else {
                        let _ = write!(s, " + (long long)({o}) * (long long){}", strides[k]);
                    }
                }
                format!("(unsigned long long)({s})")
            } else {
                let mut s = "i32(rk_idx)".to_string();
                for (k, o) in offs.iter().enumerate() {
                    if k == 0 {
                        let _ = write!(s, " + {o}");
                    } else {
                        let _ = write!(s, " + {o} * i32({})", strides[k]);
                    }
                }
                format!("u32({s})")
            };
            return Ok((format!("{}[{idx}]", v.emitted), Ty::Scalar(elem)));
        }
        let list = if dims == 2 {
            "x, y, nx, ny, idx, north, south, west, east, at"
        } else {
            "x, y, z, nx, ny, nz, idx, north, south, west, east, up, down, at"
        };
        err(
            &mc.method,
            format!("unsupported `GridPos` method `{m}`; supported: {list}"),
        )
    }
}

fn has_final_else(i: &syn::ExprIf) -> bool {
    match &i.else_branch {
        None => false,
        Some((_, e)) => match peel(e) {
            Expr::If(i2) => has_final_else(i2),
            _ => true,
        },
    }
}

/// Literals and negated literals (safe to repeat in `[v; N]`).
fn is_const_like(e: &Expr) -> bool {
    match peel(e) {
        Expr::Lit(_) => true,
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => is_const_like(&u.expr),
        _ => false,
    }
}

fn path_ident(p: &syn::ExprPath) -> Res<&syn::Ident> {
    if p.qself.is_some() || p.path.segments.len() != 1 {
        return err(p, "expected a variable name");
    }
    let seg = &p.path.segments[0];
    if !seg.arguments.is_none() {
        return err(p, "expected a variable name");
    }
    Ok(&seg.ident)
}

/// The CUDA and WGSL names of a call of a dsl atomic function.
fn atomic_fn(c: &syn::ExprCall) -> Option<(&'static str, &'static str)> {
    let Expr::Path(p) = peel(&c.func) else {
        return None;
    };
    let last = p.path.segments.last()?.ident.to_string();
    ATOMICS
        .iter()
        .find(|(n, _, _)| *n == last)
        .map(|(_, cu, w)| (*cu, *w))
}

/// (dsl name, CUDA function, WGSL function).
const ATOMICS: &[(&str, &str, &str)] = &[
    ("atomic_add", "atomicAdd", "atomicAdd"),
    ("atomic_sub", "atomicSub", "atomicSub"),
    ("atomic_min", "atomicMin", "atomicMin"),
    ("atomic_max", "atomicMax", "atomicMax"),
    ("atomic_and", "atomicAnd", "atomicAnd"),
    ("atomic_or", "atomicOr", "atomicOr"),
    ("atomic_xor", "atomicXor", "atomicXor"),
    ("atomic_exchange", "atomicExch", "atomicExchange"),
];

/// Names `x` of every `atomic_*(&mut x[...], ...)` in `tokens`.
fn atomic_targets(tokens: proc_macro2::TokenStream, out: &mut HashSet<syn::Ident>) {
    use proc_macro2::TokenTree;
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    for (k, tt) in tts.iter().enumerate() {
        let TokenTree::Group(g) = tt else {
            continue;
        };
        let is_call = k > 0
            && matches!(&tts[k - 1], TokenTree::Ident(i)
                if ATOMICS.iter().any(|(n, _, _)| i == n));
        if is_call && g.delimiter() == proc_macro2::Delimiter::Parenthesis {
            let inner: Vec<TokenTree> = g.stream().into_iter().take(3).collect();
            if let [TokenTree::Punct(amp), TokenTree::Ident(m), TokenTree::Ident(name)] =
                inner.as_slice()
            {
                if amp.as_char() == '&' && m == "mut" {
                    out.insert(name.clone());
                }
            }
        }
        atomic_targets(g.stream(), out);
    }
}
