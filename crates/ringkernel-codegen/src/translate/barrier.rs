//! Which barriers a WGSL kernel needs.
//!
//! `sync_threads()` means what CUDA's `__syncthreads()` means: every thread of the block
//! waits there, and its memory writes before it (shared arrays and slices) are seen by the
//! other threads after it. In WGSL `workgroupBarrier()` orders workgroup memory only; the
//! slices (storage buffers) need `storageBarrier()` as well, which costs time. So the
//! translator adds `storageBarrier()` only where a thread may read, after a barrier, a
//! storage element another thread of its workgroup wrote before it. It assumes it may
//! unless it can show otherwise for every `&mut` slice the kernel both reads and writes:
//!
//! * a slice that atomics touch always needs it;
//! * a slice is *private to its invocations* when every access to it (read or write)
//!   indexes it with `thread_idx_x() + S` up to multiples of the workgroup's width, with
//!   the same `S` everywhere, `S` made of values that are the same in every thread
//!   (literals, scalar parameters, `block_idx_*()`, `block_dim_*()`, `grid_dim_*()` and
//!   immutable locals of those) and a one-dimensional workgroup: then two threads never
//!   touch the same element. The index may be built through mutable locals whose every
//!   assignment keeps that form (`c = t; .. c += block_dim_x()`), `as` casts and loops
//!   `for i in (t..n).step_by(block_dim_x())`.
//!
//! The analysis is flow-insensitive (it looks at every assignment of a name, whatever
//! the scope) and errs on the side of the storage barrier.

use super::*;
use std::collections::BTreeMap;

/// What is known of a value across the threads of a workgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cls {
    /// Nothing yet (fixpoint start).
    Bottom,
    /// The same in every thread of the workgroup; the key names the value.
    Uniform(String),
    /// `thread_idx_x() + S` modulo the workgroup width, `S` uniform (its terms, sorted).
    Tid(Vec<String>),
    /// Anything.
    Unknown,
}

impl Cls {
    fn join(self, other: Cls) -> Cls {
        match (self, other) {
            (Cls::Bottom, c) | (c, Cls::Bottom) => c,
            (a, b) if a == b => a,
            _ => Cls::Unknown,
        }
    }
}

/// One name's bindings and assignments.
#[derive(Default)]
struct Defs {
    /// `let` initialisers and `=` values (`None`: a value the analysis does not follow).
    values: Vec<Option<Expr>>,
    /// `op=` steps (operator, value).
    steps: Vec<(BinOp, Expr)>,
}

struct Analysis {
    width: u32,
    one_dim: bool,
    params: HashSet<String>,
    defs: BTreeMap<String, Defs>,
    cls: BTreeMap<String, Cls>,
}

/// Whether the `sync_threads()` of kernel `f`, translated to WGSL with `workgroup`,
/// need `storageBarrier()`. `slices` are the kernel's `&mut` slice parameters (by Rust
/// name), `atomic` whether any slice takes atomics, `scalars` the scalar parameters.
pub(super) fn needs_storage_barrier(
    f: &syn::ItemFn,
    workgroup: [u32; 3],
    slices: &[String],
    scalars: &[String],
    atomic: bool,
) -> bool {
    if atomic {
        return true;
    }
    let mut a = Analysis {
        width: workgroup[0],
        one_dim: workgroup[1] == 1 && workgroup[2] == 1,
        params: scalars.iter().cloned().collect(),
        defs: BTreeMap::new(),
        cls: BTreeMap::new(),
    };
    a.collect_block(&f.block);
    // A scalar parameter reassigned is an ordinary mutable local.
    let reassigned: Vec<String> = a
        .params
        .iter()
        .filter(|p| a.defs.contains_key(*p))
        .cloned()
        .collect();
    for p in reassigned {
        a.params.remove(&p);
        a.defs.get_mut(&p).expect("present").values.push(None);
    }
    a.solve();
    let mut accesses: Vec<(String, Expr, bool)> = Vec::new();
    access_block(&f.block, &mut accesses);
    for s in slices {
        let mine: Vec<&(String, Expr, bool)> = accesses.iter().filter(|(b, _, _)| b == s).collect();
        let read = mine.iter().any(|(_, _, w)| !w);
        let written = mine.iter().any(|(_, _, w)| *w);
        if !(read && written) {
            continue;
        }
        let mut common: Option<Vec<String>> = None;
        let private = mine.iter().all(|(_, idx, _)| match a.class(idx) {
            Cls::Tid(s) => match &common {
                None => {
                    common = Some(s);
                    true
                }
                Some(c) => *c == s,
            },
            _ => false,
        });
        if !private {
            return true;
        }
    }
    false
}

impl Analysis {
    fn def(&mut self, name: &str) -> &mut Defs {
        self.defs.entry(name.to_string()).or_default()
    }

    fn collect_block(&mut self, b: &syn::Block) {
        for st in &b.stmts {
            match st {
                Stmt::Local(l) => {
                    let pat = match &l.pat {
                        Pat::Type(pt) => &*pt.pat,
                        p => p,
                    };
                    if let Pat::Ident(pi) = pat {
                        let v = l.init.as_ref().map(|i| (*i.expr).clone());
                        self.def(&pi.ident.to_string()).values.push(v);
                    }
                    if let Some(i) = &l.init {
                        self.collect_expr(&i.expr);
                    }
                }
                Stmt::Expr(e, _) => self.collect_expr(e),
                _ => {}
            }
        }
    }

    fn collect_expr(&mut self, e: &Expr) {
        match e {
            Expr::Assign(a) => {
                if let Expr::Path(p) = peel(&a.left) {
                    if let Some(id) = p.path.get_ident() {
                        self.def(&id.to_string())
                            .values
                            .push(Some((*a.right).clone()));
                    }
                }
                self.collect_expr(&a.right);
            }
            Expr::Binary(b) if compound_op(&b.op).is_some() => {
                if let Expr::Path(p) = peel(&b.left) {
                    if let Some(id) = p.path.get_ident() {
                        let op = compound_op(&b.op).expect("checked");
                        self.def(&id.to_string())
                            .steps
                            .push((op, (*b.right).clone()));
                    }
                }
                self.collect_expr(&b.right);
            }
            Expr::ForLoop(f) => {
                if let Pat::Ident(pi) = &*f.pat {
                    let (start, step) = match peel(&f.expr) {
                        Expr::Range(r) => (r.start.as_deref().cloned(), None),
                        Expr::MethodCall(mc) if mc.method == "step_by" => {
                            match peel(&mc.receiver) {
                                Expr::Range(r) => {
                                    (r.start.as_deref().cloned(), mc.args.first().cloned())
                                }
                                _ => (None, None),
                            }
                        }
                        _ => (None, None),
                    };
                    let one: Expr = syn::parse_quote!(1);
                    let d = self.def(&pi.ident.to_string());
                    d.values.push(start);
                    d.steps
                        .push((BinOp::AddAssign(Default::default()), step.unwrap_or(one)));
                }
                self.collect_block(&f.body);
            }
            Expr::If(i) => {
                self.collect_block(&i.then_branch);
                if let Some((_, el)) = &i.else_branch {
                    self.collect_expr(el);
                }
            }
            Expr::While(w) => self.collect_block(&w.body),
            Expr::Loop(l) => self.collect_block(&l.body),
            Expr::Block(b) => self.collect_block(&b.block),
            Expr::Match(m) => {
                for arm in &m.arms {
                    self.collect_expr(&arm.body);
                }
            }
            Expr::Paren(p) => self.collect_expr(&p.expr),
            Expr::Group(g) => self.collect_expr(&g.expr),
            _ => {}
        }
    }

    /// Fixpoint over the names: each name's class is the join of its values' classes;
    /// a mutable name is never uniform (it changes), and its steps must keep `Tid`.
    fn solve(&mut self) {
        for _ in 0..32 {
            let mut changed = false;
            let names: Vec<String> = self.defs.keys().cloned().collect();
            for n in names {
                let new = self.class_of_name(&n);
                if self.cls.get(&n) != Some(&new) {
                    self.cls.insert(n, new);
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
        // No fixpoint in time (cannot happen with this lattice): know nothing.
        for c in self.cls.values_mut() {
            *c = Cls::Unknown;
        }
    }

    fn class_of_name(&self, n: &str) -> Cls {
        let d = &self.defs[n];
        let immutable = d.values.len() == 1 && d.steps.is_empty();
        let mut c = Cls::Bottom;
        for v in &d.values {
            c = c.join(match v {
                Some(e) => self.class(e),
                None => Cls::Unknown,
            });
        }
        match c {
            // One binding of a uniform value: the name itself names it.
            Cls::Uniform(_) if immutable => Cls::Uniform(n.to_string()),
            Cls::Uniform(_) => Cls::Unknown,
            Cls::Tid(s) => {
                if d.steps.iter().all(|(op, e)| self.keeps_tid(op, e)) {
                    Cls::Tid(s)
                } else {
                    Cls::Unknown
                }
            }
            other => other,
        }
    }

    /// `x op= e` keeps `x ≡ thread_idx_x() + S` (mod width): adding or subtracting a
    /// multiple of the width.
    fn keeps_tid(&self, op: &BinOp, e: &Expr) -> bool {
        if !matches!(
            op,
            BinOp::Add(_) | BinOp::Sub(_) | BinOp::AddAssign(_) | BinOp::SubAssign(_)
        ) {
            return false;
        }
        match peel(e) {
            Expr::Call(c) if c.args.is_empty() && dsl_call(c, "block_dim_x").is_some() => true,
            Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            }) => i
                .base10_parse::<u64>()
                .is_ok_and(|v| self.width > 0 && v % self.width as u64 == 0),
            Expr::Cast(c) => self.keeps_tid(op, &c.expr),
            _ => false,
        }
    }

    fn class(&self, e: &Expr) -> Cls {
        match e {
            Expr::Paren(p) => self.class(&p.expr),
            Expr::Group(g) => self.class(&g.expr),
            Expr::Cast(c) => self.class(&c.expr),
            Expr::Lit(l) => Cls::Uniform(l.to_token_stream().to_string()),
            Expr::Path(p) => {
                let Some(id) = p.path.get_ident() else {
                    // `f32::MAX` and other constants.
                    return Cls::Uniform(p.to_token_stream().to_string());
                };
                let n = id.to_string();
                if self.params.contains(&n) {
                    return Cls::Uniform(n);
                }
                match self.cls.get(&n) {
                    Some(c) => c.clone(),
                    None if self.defs.contains_key(&n) => Cls::Bottom,
                    None => Cls::Unknown,
                }
            }
            Expr::Call(c) if c.args.is_empty() => {
                let f = c.func.to_token_stream().to_string();
                let last = f.rsplit(' ').next().unwrap_or(&f).to_string();
                if last == "thread_idx_x" {
                    if self.one_dim {
                        Cls::Tid(Vec::new())
                    } else {
                        Cls::Unknown
                    }
                } else if ["block_idx_", "block_dim_", "grid_dim_"].iter().any(|p| {
                    last.strip_prefix(p)
                        .is_some_and(|d| ["x", "y", "z"].contains(&d))
                }) {
                    Cls::Uniform(format!("{last}()"))
                } else {
                    Cls::Unknown
                }
            }
            Expr::Binary(b) => {
                let (l, r) = (self.class(&b.left), self.class(&b.right));
                if l == Cls::Bottom || r == Cls::Bottom {
                    return Cls::Bottom;
                }
                match (&b.op, l, r) {
                    (_, Cls::Uniform(x), Cls::Uniform(y)) => {
                        Cls::Uniform(format!("({x} {} {y})", b.op.to_token_stream()))
                    }
                    (BinOp::Add(_), Cls::Tid(mut s), Cls::Uniform(u))
                    | (BinOp::Add(_), Cls::Uniform(u), Cls::Tid(mut s)) => {
                        s.push(u);
                        s.sort();
                        Cls::Tid(s)
                    }
                    (BinOp::Sub(_), Cls::Tid(mut s), Cls::Uniform(u)) => {
                        s.push(format!("-{u}"));
                        s.sort();
                        Cls::Tid(s)
                    }
                    _ => Cls::Unknown,
                }
            }
            Expr::MethodCall(mc) => {
                let mut parts = vec![self.class(&mc.receiver)];
                parts.extend(mc.args.iter().map(|a| self.class(a)));
                if parts.contains(&Cls::Bottom) {
                    return Cls::Bottom;
                }
                if parts.iter().all(|p| matches!(p, Cls::Uniform(_))) {
                    Cls::Uniform(e.to_token_stream().to_string())
                } else {
                    Cls::Unknown
                }
            }
            _ => Cls::Unknown,
        }
    }
}

/// Every `name[index]` in `b`: the name, the index and whether it is the place an
/// assignment writes (`name[i] = v`, or a field of it); a compound assignment reads too.
fn access_block(b: &syn::Block, out: &mut Vec<(String, Expr, bool)>) {
    for st in &b.stmts {
        match st {
            Stmt::Local(l) => {
                if let Some(i) = &l.init {
                    access_expr(&i.expr, out, false);
                }
            }
            Stmt::Expr(e, _) => access_expr(e, out, false),
            _ => {}
        }
    }
}

fn access_expr(e: &Expr, out: &mut Vec<(String, Expr, bool)>, write: bool) {
    match e {
        Expr::Assign(a) => {
            access_expr(&a.left, out, true);
            access_expr(&a.right, out, false);
        }
        Expr::Binary(b) if compound_op(&b.op).is_some() => {
            access_expr(&b.left, out, true);
            access_expr(&b.left, out, false);
            access_expr(&b.right, out, false);
        }
        Expr::Index(ix) => {
            if let Expr::Path(p) = peel(&ix.expr) {
                if let Some(id) = p.path.get_ident() {
                    out.push((id.to_string(), (*ix.index).clone(), write));
                }
            } else {
                access_expr(&ix.expr, out, write);
            }
            access_expr(&ix.index, out, false);
        }
        // A field of an element: the element is what is read or written.
        Expr::Field(f) => access_expr(&f.base, out, write),
        Expr::Block(b) => access_block(&b.block, out),
        Expr::If(i) => {
            access_expr(&i.cond, out, false);
            access_block(&i.then_branch, out);
            if let Some((_, el)) = &i.else_branch {
                access_expr(el, out, false);
            }
        }
        Expr::While(w) => {
            access_expr(&w.cond, out, false);
            access_block(&w.body, out);
        }
        Expr::Loop(l) => access_block(&l.body, out),
        Expr::ForLoop(f) => {
            access_expr(&f.expr, out, false);
            access_block(&f.body, out);
        }
        Expr::Match(m) => {
            access_expr(&m.expr, out, false);
            for arm in &m.arms {
                access_expr(&arm.body, out, false);
            }
        }
        Expr::Struct(s) => {
            for f in &s.fields {
                access_expr(&f.expr, out, false);
            }
            if let Some(r) = &s.rest {
                access_expr(r, out, false);
            }
        }
        _ => {
            // Every other expression: its sub-expressions are reads.
            for_each_child(e, |c| access_expr(c, out, false));
        }
    }
}

/// Calls `f` on the direct sub-expressions of the expressions the subset has.
fn for_each_child(e: &Expr, mut f: impl FnMut(&Expr)) {
    match e {
        Expr::Binary(b) => {
            f(&b.left);
            f(&b.right);
        }
        Expr::Unary(u) => f(&u.expr),
        Expr::Cast(c) => f(&c.expr),
        Expr::Paren(p) => f(&p.expr),
        Expr::Group(g) => f(&g.expr),
        Expr::Call(c) => c.args.iter().for_each(f),
        Expr::MethodCall(mc) => {
            f(&mc.receiver);
            mc.args.iter().for_each(f);
        }
        Expr::Reference(r) => f(&r.expr),
        Expr::Array(a) => a.elems.iter().for_each(f),
        Expr::Repeat(r) => f(&r.expr),
        Expr::Return(r) => {
            if let Some(v) = &r.expr {
                f(v)
            }
        }
        Expr::Range(r) => {
            if let Some(s) = &r.start {
                f(s)
            }
            if let Some(s) = &r.end {
                f(s)
            }
        }
        _ => {}
    }
}
