//! The translator: one kernel function to CUDA C or WGSL.
//!
//! `kernel`: the signature, the stencil prologue and the final text of each target;
//! `stmt`: statements and control flow; `expr`: expressions and literals; `builtins`:
//! math methods, `GridPos` and atomics.

mod barrier;
mod builtins;
mod expr;
mod handler;
mod helpers;
mod kernel;
mod shared;
mod stmt;

use builtins::{atomic_fn, atomic_targets, calls_atomic};
use handler::HandlerMode;
pub(crate) use helpers::Helpers;
use shared::dsl_call;

use crate::names::Names;
use crate::structs::{StructDef, Structs};
use crate::types::{check_array_len, parse_type, scalar_name, ScalarType, Ty};
use crate::{BindingKind, ParamField, StencilConfig, Target, WgslBinding, WgslKernel};
use quote::ToTokens;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::rc::Rc;
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

/// `what` (helper functions, GPU handlers) are plain, non-generic `fn`s.
fn plain_signature(sig: &syn::Signature, what: &str) -> Res<()> {
    if sig.constness.is_some()
        || sig.asyncness.is_some()
        || sig.unsafety.is_some()
        || sig.abi.is_some()
        || sig.variadic.is_some()
    {
        return err(
            &sig.ident,
            format!("{what} are plain `fn`s (no const, async, unsafe, extern)"),
        );
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return err(&sig.generics, format!("generic {what} are not supported"));
    }
    Ok(())
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
    /// A `&mut T` handler state parameter: used as `*state` or through its fields.
    by_ref: bool,
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
    /// WGSL module-scope `var<workgroup>` declarations of the shared arrays.
    workgroup_globals: String,
    /// Helper functions the body may call.
    helpers: Helpers,
    /// Their translated definitions.
    helper_text: String,
    /// `Some(return type)` while translating a helper function.
    func_ret: Option<Ty>,
    /// The `GpuType` structs the kernel may use.
    structs: Rc<Structs>,
    /// Set while translating the value of a 64-bit struct field assignment: WGSL has no
    /// 64-bit integers, but a field can be copied to another field as its two words.
    wide_move: bool,
    /// `Some` while translating an actor handler.
    handler: Option<HandlerMode>,
    /// WGSL of a global kernel for a 1-D grid folded into two dimensions (see
    /// `transpile_global_kernel_wgsl_folded`).
    pub(crate) fold: bool,
}

/// An expression translated: code and type.
type Val = (String, Ty);

/// A place expression translated (see `Tx::place_ref`).
struct PlaceRef {
    code: String,
    ty: Ty,
    /// The variable it starts from.
    root: Var,
    /// That variable as written (for error spans).
    root_expr: Expr,
}

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
            workgroup_globals: String::new(),
            helpers: Helpers::default(),
            helper_text: String::new(),
            func_ret: None,
            structs: Rc::new(Structs::default()),
            wide_move: false,
            handler: None,
            fold: false,
        }
    }

    /// A type of the subset (struct names resolve through the kernel's structs).
    fn parse_ty(&self, t: &syn::Type) -> Res<Ty> {
        parse_type(t, self.target, &*self.structs)
    }

    /// The definition of struct `name` (known: its type was parsed).
    fn struct_def(&self, name: &str) -> Rc<StructDef> {
        self.structs
            .get(name)
            .cloned()
            .expect("struct types are parsed against the kernel's structs")
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
            Ty::Struct(n) => Ok(if self.cuda() {
                format!("{n} {name}")
            } else {
                format!("{name}: {n}")
            }),
            other => err(
                span_of,
                format!(
                    "a local of type `{}` is not supported; locals are scalars, arrays or \
                     GpuType structs",
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
                    by_ref: false,
                },
            );
        Ok(emitted)
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
