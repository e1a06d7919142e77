//! Statements and control flow.

use super::*;

impl Tx {
    /// Statements of a block; the tail expression (no semicolon) is assigned to `dest`
    /// when given, else translated as a statement.
    pub(super) fn block_stmts(&mut self, block: &syn::Block, dest: Option<(&str, &Ty)>) -> Res<()> {
        let stmts = &block.stmts;
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
                Stmt::Item(syn::Item::Fn(h))
                    if self.func_ret.is_none()
                        && self.scopes.len() == 1
                        && self.helpers.contains_key(&h.sig.ident.to_string()) =>
                {
                    // A helper function, translated on its own.
                }
                Stmt::Item(syn::Item::Struct(st))
                    if self.func_ret.is_none()
                        && self.scopes.len() == 1
                        && self.structs.get(&st.ident.to_string()).is_some() =>
                {
                    // A struct the kernel uses, declared on its own.
                }
                Stmt::Item(syn::Item::Fn(h)) => {
                    return err(
                        &h.sig.ident,
                        "helper functions are defined at the top level of the kernel body \
                         (not inside blocks or other helpers)",
                    )
                }
                Stmt::Item(it) => {
                    return err(
                        it,
                        "items inside a kernel are not supported (structs, constants and uses \
                         go outside; helper functions at the top level of the body)",
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
            // A value, or a block that leaves (`return;`, `break;`, `continue;`).
            let ends_well = match stmts.last() {
                Some(Stmt::Expr(_, None)) => true,
                Some(Stmt::Expr(e, Some(_))) => matches!(
                    peel(e),
                    Expr::Return(_) | Expr::Break(_) | Expr::Continue(_)
                ),
                _ => false,
            };
            if !ends_well && *ty != Ty::Unit {
                return err(
                    block,
                    "this block must end in a value (an expression without `;`)",
                );
            }
        }
        Ok(())
    }

    pub(super) fn scoped_block(
        &mut self,
        block: &syn::Block,
        dest: Option<(&str, &Ty)>,
    ) -> Res<()> {
        self.scopes.push(HashMap::new());
        self.indent += 1;
        let r = self.block_stmts(block, dest);
        self.indent -= 1;
        self.scopes.pop();
        r
    }

    /// Assigns the value of `e` to `place`; `if`, `match` and blocks become control flow,
    /// `return`/`break`/`continue` are statements.
    pub(super) fn assign_value(&mut self, place: &str, ty: &Ty, e: &Expr) -> Res<()> {
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
            other if *ty == Ty::Reply => self.reply_exit(other),
            other => {
                let (code, t) = self.value_for(other, ty)?;
                self.expect_ty(&t, ty, other)?;
                self.line(&format!("{place} = {code};"));
                Ok(())
            }
        }
    }

    pub(super) fn local(&mut self, l: &syn::Local) -> Res<()> {
        let (pat, annot) = match &l.pat {
            Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
            p => (p, None),
        };
        let annot_ty = annot.map(|t| self.parse_ty(t)).transpose()?;
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
                if self.is_ctx_call(&init.expr, "send_to") {
                    return self.send_stmt(&init.expr);
                }
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
                if let Expr::Call(c) = value {
                    if let Some(seg) = dsl_call(c, "shared_array") {
                        return self.shared_local(pi, annot_ty.as_ref(), c, seg);
                    }
                }
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
                                by_ref: false,
                            },
                        );
                        Ok(())
                    }
                    _ => {
                        let (code, ty) = self.expr(value, annot_ty.as_ref())?;
                        if let Some(a) = &annot_ty {
                            self.expect_ty(&ty, a, value)?;
                        }
                        if !matches!(ty, Ty::Scalar(_) | Ty::Struct(_)) {
                            return err(
                                value,
                                format!(
                                    "a local of type `{}` is not supported; locals are scalars, \
                                     arrays or GpuType structs",
                                    ty.describe()
                                ),
                            );
                        }
                        let name = self.declare(&pi.ident, ty.clone(), mutable)?;
                        let d = self.decl(&name, &ty, &pi.ident)?;
                        // WGSL structs are always `var`: naga indexes arrays inside a `let`
                        // value by constants only on some back ends.
                        let var = mutable || matches!(ty, Ty::Struct(_));
                        self.line(&if self.cuda() {
                            format!("{d} = {code};")
                        } else {
                            format!("{} {d} = {code};", if var { "var" } else { "let" })
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

    /// The type of an `if`/`match`/block value: that of its first result expression that
    /// translates on its own, else (only unsuffixed literals) Rust's default for them.
    pub(super) fn infer_value_type(&mut self, e: &Expr) -> Res<Ty> {
        let mut results = Vec::new();
        value_results(e, &mut results);
        for c in &results {
            if !is_untyped(c) {
                // A result naming locals of its own block does not translate here: skip it.
                if let Ok((_, t)) = self.expr(c, None) {
                    return Ok(t);
                }
            }
        }
        if let Some(c) = results.iter().find(|c| is_untyped(c)) {
            return Ok(self.expr(c, None)?.1);
        }
        err(
            e,
            "cannot tell the type of this value; annotate the binding (`let x: f32 = ...`)",
        )
    }

    pub(super) fn is_simple_if(&self, e: &Expr) -> bool {
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

    pub(super) fn array_init(&mut self, e: &Expr, annot: Option<&Ty>) -> Res<Val> {
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
                if ety.is_none() {
                    // Unsuffixed literals take the type of the first typed element.
                    if let Some(typed) = a.elems.iter().find(|el| !is_untyped(el)) {
                        ety = Some(self.expr(typed, None)?.1);
                    }
                }
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

    /// A place that can be assigned: a mutable local (a struct's field included) or an
    /// element of a `&mut [T]` / a mutable array.
    pub(super) fn place(&mut self, e: &Expr) -> Res<(String, Ty, bool)> {
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
                if !matches!(v.ty, Ty::Scalar(_) | Ty::Struct(_)) {
                    return err(e, "only scalars, structs and elements can be assigned");
                }
                Ok((v.emitted, v.ty, false))
            }
            pe @ (Expr::Index(_) | Expr::Field(_)) => {
                let r = self.place_ref(pe)?;
                match &r.root.ty {
                    Ty::Slice { mutable: true, .. } | Ty::StructSlice { mutable: true, .. } => {}
                    Ty::Slice { .. } | Ty::StructSlice { .. } => {
                        return err(
                            &r.root_expr,
                            "cannot assign into a `&[T]` parameter; declare it `&mut [T]`",
                        )
                    }
                    _ if r.root.mutable => {}
                    Ty::Array { .. } => {
                        return err(
                            &r.root_expr,
                            "cannot assign into an array that is not `mut`",
                        )
                    }
                    _ => {
                        return err(
                            &r.root_expr,
                            format!(
                                "cannot assign to a field of `{}`: it is not declared `mut`",
                                r.root_expr.to_token_stream()
                            ),
                        )
                    }
                }
                if !matches!(r.ty, Ty::Scalar(_) | Ty::Struct(_)) {
                    return err(
                        pe,
                        "a whole array cannot be assigned; assign its elements (`a[i] = v`)",
                    );
                }
                let atomic = self.is_atomic(&r.root);
                Ok((r.code, r.ty, atomic))
            }
            Expr::Unary(u) if matches!(u.op, UnOp::Deref(_)) => match self.deref_state(u) {
                Some(r) => {
                    let r = r?;
                    Ok((r.code, r.ty, false))
                }
                None => err(
                    e,
                    "dereferencing is not supported; assign to `name` or `slice[i]`",
                ),
            },
            other => err(
                other,
                "this cannot be assigned; assign to a `mut` local or an element `slice[i]`",
            ),
        }
    }

    pub(super) fn stmt_expr(&mut self, e: &Expr) -> Res<()> {
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
                        let (code, t) = self.value_for(&a.right, &ty)?;
                        self.expect_ty(&t, &ty, &a.right)?;
                        self.line(&format!("{place} = {code};"));
                        Ok(())
                    }
                }
            }
            Expr::Binary(b) if compound_op(&b.op).is_some() => {
                let op = compound_op(&b.op).expect("checked");
                if calls_atomic(b.left.to_token_stream()) {
                    // `a[i] op= v` becomes `a[i] = a[i] op v`: the index must not change.
                    return err(
                        &b.left,
                        "the place of a compound assignment cannot call an atomic (it would \
                         run twice); compute the index into a `let` first",
                    );
                }
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
            Expr::Return(r) if self.func_ret.is_some() => {
                let ret = self.func_ret.clone().expect("checked");
                let Some(v) = &r.expr else {
                    return err(r, "a helper function returns a value: `return value;`");
                };
                let (code, t) = self.expr(v, Some(&ret))?;
                self.expect_ty(&t, &ret, v)?;
                self.line(&format!("return {code};"));
                Ok(())
            }
            Expr::Return(r) if self.handler.is_some() => self.handler_return(r),
            Expr::MethodCall(_) if self.is_ctx_call(e, "send_to") => self.send_stmt(e),
            Expr::MethodCall(mc)
                if mc.method == "ok"
                    && mc.args.is_empty()
                    && self.is_ctx_call(&mc.receiver, "send_to") =>
            {
                self.send_stmt(&mc.receiver)
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
            Expr::Call(c) if dsl_call(c, "sync_threads").is_some() => self.sync_stmt(c),
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

    pub(super) fn cond(&mut self, e: &Expr) -> Res<String> {
        if let Expr::Let(l) = peel(e) {
            return err(l, "`if let` is not supported; compare values with `==`");
        }
        let (c, t) = self.expr(e, Some(&Ty::Scalar(ScalarType::Bool)))?;
        self.expect_ty(&t, &Ty::Scalar(ScalarType::Bool), e)?;
        Ok(c)
    }

    pub(super) fn if_stmt(&mut self, i: &syn::ExprIf, dest: Option<(&str, &Ty)>) -> Res<()> {
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

    pub(super) fn match_stmt(&mut self, m: &syn::ExprMatch, dest: Option<(&str, &Ty)>) -> Res<()> {
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

    pub(super) fn arm_body(&mut self, body: &Expr, dest: Option<(&str, &Ty)>) -> Res<()> {
        self.scopes.push(HashMap::new());
        self.indent += 1;
        let r = match peel(body) {
            Expr::Block(b) if b.label.is_none() => self.block_stmts(&b.block, dest),
            e => match dest {
                Some((place, ty)) => self.assign_value(place, ty, e),
                None => self.stmt_expr(e),
            },
        };
        self.indent -= 1;
        self.scopes.pop();
        r
    }

    pub(super) fn for_loop(&mut self, f: &syn::ExprForLoop) -> Res<()> {
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
}

/// The expressions whose value an `if`/`match`/block value can be: the tails of its
/// branches, arms and blocks (not `return`/`break`/`continue`).
fn value_results<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match peel(e) {
        Expr::If(i) => {
            value_results_block(&i.then_branch, out);
            if let Some((_, el)) = &i.else_branch {
                value_results(el, out);
            }
        }
        Expr::Match(m) => {
            for a in &m.arms {
                value_results(&a.body, out);
            }
        }
        Expr::Block(b) => value_results_block(&b.block, out),
        Expr::Return(_) | Expr::Break(_) | Expr::Continue(_) => {}
        other => out.push(other),
    }
}

fn value_results_block<'e>(b: &'e syn::Block, out: &mut Vec<&'e Expr>) {
    if let Some(Stmt::Expr(t, None)) = b.stmts.last() {
        value_results(t, out);
    }
}
