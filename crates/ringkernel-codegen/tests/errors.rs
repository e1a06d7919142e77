//! Unsupported Rust is a `syn::Error` whose message says what is supported. (The error
//! carries the construct's span; checking spans needs a proc-macro context: the trybuild
//! UI tests of the kernel attribute do that.)

use ringkernel_codegen::{
    transpile_global_kernel, transpile_global_kernel_wgsl, transpile_stencil_kernel, StencilConfig,
};
use syn::parse_quote;

mod common;

/// The error of translating `f` to CUDA and to WGSL; both must fail with `needle`.
fn fails(f: syn::ItemFn, needle: &str) {
    let cuda = transpile_global_kernel(&f).expect_err("CUDA translation should fail");
    assert!(
        cuda.to_string().contains(needle),
        "CUDA error {:?} lacks {needle:?}",
        cuda.to_string()
    );
    let wgsl = transpile_global_kernel_wgsl(&f).expect_err("WGSL translation should fail");
    assert!(
        wgsl.to_string().contains(needle),
        "WGSL error {:?} lacks {needle:?}",
        wgsl.to_string()
    );
}

#[test]
fn signatures() {
    fails(
        parse_quote! { fn k<T>(x: &mut [f32]) {} },
        "generic kernels are not supported",
    );
    fails(
        parse_quote! { async fn k(x: &mut [f32]) {} },
        "`async fn` kernels are not supported",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) -> f32 { 1.0 } },
        "kernels return nothing",
    );
    fails(
        parse_quote! { fn k(n: usize) {} },
        "`usize` parameters are not supported",
    );
    fails(parse_quote! { fn k(v: Vec<f32>) {} }, "unsupported type `Vec < f32 >`; the kernel subset supports f32, f64 (CUDA only), i32, u32, i64 and u64 (CUDA only), bool");
    fails(
        parse_quote! { fn k(v: &f32) {} },
        "references other than slices are not supported",
    );
    fails(
        parse_quote! { fn k((a, b): (f32, f32)) {} },
        "parameters must be plain names",
    );
    fails(
        parse_quote! { fn k(x: &[i128]) {} },
        "unsupported type `i128`",
    );
    fails(
        parse_quote! { fn float(x: &[f32]) {} },
        "`float` cannot name a kernel",
    );
    fails(
        parse_quote! { fn k(rk_x: f32) {} },
        "names starting with `rk_` are reserved",
    );
    fails(
        parse_quote! { fn k(p: GridPos) {} },
        "`GridPos` parameters belong to stencil kernels",
    );
}

#[test]
fn statements() {
    fails(
        parse_quote! { fn k(x: &mut [f32]) { println!("hi"); } },
        "macros are not supported in kernels; supported statements: `let`, assignments",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { const C: u32 = 1; } },
        "items inside a kernel are not supported",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { struct S; } },
        "structs used in kernels have named fields",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let (a, b) = (1.0, 2.0); } },
        "only simple `let name` / `let mut name` bindings are supported",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let a = 1.0; a = 2.0; } },
        "cannot assign to `a`: it is not declared `mut`",
    );
    fails(
        parse_quote! { fn k(x: &[f32]) { x[0] = 1.0; } },
        "cannot assign into a `&[T]` parameter; declare it `&mut [T]`",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { for v in x.iter() { } } },
        "`for` loops run over integer ranges only",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { for i in (0..4).rev() { } } },
        "`.rev()` is not supported; count down with a `while` loop",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { 'outer: loop { break 'outer; } } },
        "loop labels are not supported",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { x[0]; } },
        "this expression has no effect as a statement; supported statements:",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let y; } },
        "a `let` without a value needs a type annotation",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { break; } },
        "`break` outside a loop",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32], c: i32) { let v: f32 = match c { 0 => {} _ => 1.0 }; } },
        "this block must end in a value (an expression without `;`)",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { if let 1 = 2 { } } },
        "`if let` is not supported",
    );
}

#[test]
fn matches() {
    fails(
        parse_quote! { fn k(x: &mut [f32], c: i32) { match c { 1..=3 => {} _ => {} } } },
        "range patterns are not supported; use if/else with comparisons",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32], c: i32) { match c { 1 => {} } } },
        "a `match` on integers needs a final `_ => ...` arm",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32], c: i32) { match c { v if v > 2 => {} _ => {} } } },
        "match guards (`if` in an arm) are not supported",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32], c: f32) { match c { _ => {} } } },
        "`match` is supported on integers (i32, u32, usize) only, not `f32`",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32], c: i32) { match c { _ => {} 1 => {} } } },
        "this arm comes after the `_` arm and can never match",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32], c: i32) { match c { 1 | 1 => {} _ => {} } } },
        "this value is already matched by an earlier arm",
    );
}

#[test]
fn expressions() {
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let f = |a: f32| a; } },
        "closures are not supported in kernels; supported expressions: literals, variables",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { x[0] = helper(1.0); } },
        "unsupported call `helper`: kernels can call the dsl index functions",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { x[0] = x[0].signum(); } },
        "unsupported method `signum` on `f32`; supported: float sqrt, exp",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32], n: i32) { x[0] = n; } },
        "mismatched types: expected `f32`, found `i32` (the subset has no implicit conversions; use `as`)",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { x[0] = GLOBAL; } },
        "unknown name `GLOBAL`: kernels can use their parameters and local variables only",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let n = x.len(); } },
        "`len()` is not supported (a CUDA pointer has no length); pass the length as a parameter",
    );
    fails(
        parse_quote! { fn k(x: &mut [u32]) { x[0] = -x[1]; } },
        "cannot negate a value of type `u32`",
    );
    fails(
        parse_quote! { fn k(x: &mut [u32]) { x[0] = 5000000000; } },
        "literal 5000000000 does not fit in `u32`",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { x[0] = x[1..2][0]; } },
        "sub-slices (`data[a..b]`) are not supported",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { x[0] = (x[1] + 1.0)[0]; } },
        "only slices and arrays named by a variable can be indexed",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let y = (1.0, 2.0); } },
        "tuples are not supported in the kernel subset",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let y = x[0] as bool; } },
        "casting to `bool` is not allowed",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32], b: bool) { let y = b + b; } },
        "arithmetic does not apply to `bool`",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let y = [x[0]; 4]; } },
        "`[value; N]` needs a literal value",
    );
}

#[test]
fn atomics_need_mutable_integer_elements() {
    let needle = "atomics take an element of a `&mut [u32]` or `&mut [i32]` parameter";
    fails(
        parse_quote! { fn k(x: &mut [f32]) { atomic_add(&mut x[0], 1.0); } },
        needle,
    );
    fails(
        parse_quote! { fn k(x: &[u32]) { atomic_add(&mut x[0], 1); } },
        needle,
    );
    fails(
        parse_quote! { fn k(x: &mut [u32]) { atomic_add(&x[0], 1); } },
        needle,
    );
    fails(
        parse_quote! { fn k(x: &mut [u32]) { let mut a = 0u32; atomic_add(&mut a, 1); } },
        needle,
    );
    fails(
        parse_quote! { fn k(x: &mut [u32], c: &mut [u32]) { x[atomic_add(&mut c[0], 1) as usize] += 1; } },
        "the place of a compound assignment cannot call an atomic",
    );
}

#[test]
fn f64_in_wgsl_names_the_type() {
    let f: syn::ItemFn = parse_quote! {
        fn k(x: &mut [f32]) {
            let y = x[0] as f64;
        }
    };
    assert!(transpile_global_kernel(&f).is_ok());
    let e = transpile_global_kernel_wgsl(&f).unwrap_err().to_string();
    assert!(e.starts_with("type `f64` is not available in WGSL"), "{e}");
    let g: syn::ItemFn = parse_quote! {
        fn k(x: &mut [f32]) {
            let y = 1.0f64;
        }
    };
    let e = transpile_global_kernel_wgsl(&g).unwrap_err().to_string();
    assert!(e.contains("`f64` is not available in WGSL"), "{e}");
}

#[test]
fn stencil_errors() {
    let cfg = StencilConfig::new(1);
    let no_pos: syn::ItemFn = parse_quote! { fn k(x: &mut [f32]) {} };
    let e = transpile_stencil_kernel(&no_pos, &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs a `GridPos` (2-D) or `GridPos3` (3-D) parameter"),
        "{e}"
    );
    let idx: syn::ItemFn = parse_quote! {
        fn k(p: GridPos, x: &mut [f32]) { x[p.idx()] = thread_idx_x() as f32; }
    };
    let e = transpile_stencil_kernel(&idx, &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("thread and block indices are not available in stencil kernels"),
        "{e}"
    );
    let up: syn::ItemFn = parse_quote! {
        fn k(p: GridPos, x: &mut [f32]) { x[p.idx()] = p.up(x); }
    };
    let e = transpile_stencil_kernel(&up, &cfg).unwrap_err().to_string();
    assert!(
        e.contains("unsupported `GridPos` method `up`; supported: x, y, nx"),
        "{e}"
    );
    let mut big = cfg;
    big.halo = 0;
    let ok: syn::ItemFn = parse_quote! { fn k(p: GridPos, x: &mut [f32]) {} };
    let e = transpile_stencil_kernel(&ok, &big).unwrap_err().to_string();
    assert!(e.contains("the stencil halo must be 1 to 16 cells"), "{e}");
}

#[test]
fn shared_memory_and_barriers() {
    fails(
        parse_quote! { fn k(x: &mut [f32]) { if true { let mut s = shared_array::<f32, 8>(); } } },
        "shared arrays are declared at the top level of the kernel body",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let s = shared_array::<f32, 8>(); } },
        "a shared array must be declared `let mut`",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let mut s = shared_array::<f32>(); } },
        "shared arrays are declared as `let mut name = shared_array::<T, N>();`",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let mut s = shared_array::<f32, 0>(); } },
        "shared arrays need 1 to 4096 elements",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let mut s = shared_array::<f32, 4097>(); } },
        "shared arrays need 1 to 4096 elements",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let mut s = shared_array::<usize, 4>(); } },
        "`usize` has no fixed size on the GPU",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let v = 1.0 + shared_array::<f32, 4>(); } },
        "is the initializer of a top-level",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { let a = sync_threads(); } },
        "`sync_threads()` is a statement",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { sync_threads(1); } },
        "`sync_threads()` takes no arguments",
    );
    let stencil: syn::ItemFn = parse_quote! {
        fn k(pos: GridPos, x: &mut [f32]) { sync_threads(); x[pos.idx()] = 1.0; }
    };
    let e = transpile_stencil_kernel(&stencil, &StencilConfig::new(1)).unwrap_err();
    assert!(
        e.to_string().contains("not available in stencil kernels"),
        "{e}"
    );
}

#[test]
fn helper_functions() {
    fails(
        parse_quote! { fn k(x: &mut [f32]) { fn f(v: f32) -> f32 { f(v) } x[0] = f(1.0); } },
        "helper `f` calls itself (directly or through other helpers)",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { fn f(v: &[f32]) -> f32 { v[0] } } },
        "helper functions take scalar parameters",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { fn f(v: f32) { } } },
        "a helper function returns a value",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { fn f() -> i32 { thread_idx_x() } x[0] = f() as f32; } },
        "thread and block indices are not available in helper functions",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { fn f(v: f32) -> f32 { v } x[0] = f(1.0, 2.0); } },
        "this helper takes 1 argument",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { fn f(v: f32) -> f32 { v } x[0] = f(1); } },
        "mismatched types: expected `f32`, found `i32`",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { fn f(v: f32) -> f32 { return; } } },
        "a helper function returns a value: `return value;`",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { if true { fn f(v: f32) -> f32 { v } } } },
        "helper functions are defined at the top level of the kernel body",
    );
    fails(
        parse_quote! { fn k(x: &mut [f32]) { x[0] = g(1.0); } },
        "helper functions defined at the top level of the kernel's",
    );
}

/// i64/u64: CUDA `long long`/`unsigned long long`; in WGSL an error naming the type.
#[test]
fn wide_integers_are_cuda_only() {
    let f: syn::ItemFn = parse_quote! {
        fn k(x: &mut [i64], y: &[u64], s: i64, n: i32) {
            let i = thread_idx_x();
            if i < n {
                let big: u64 = y[i as usize] * 3 + u64::MAX / 7;
                x[i as usize] = s * (big >> 2u32) as i64 - 9223372036854775807 + i64::MIN / 2;
            }
        }
    };
    let cuda = transpile_global_kernel(&f).unwrap();
    common::check_cuda_syntax(&cuda);
    assert!(
        cuda.contains("void k(long long* x, const unsigned long long* y, long long s, int n)"),
        "{cuda}"
    );
    assert!(cuda.contains("(-9223372036854775807ll - 1ll)"), "{cuda}");
    let e = transpile_global_kernel_wgsl(&f).unwrap_err().to_string();
    assert!(e.starts_with("type `i64` is not available in WGSL"), "{e}");
    let g: syn::ItemFn = parse_quote! {
        fn k(x: &mut [u32]) {
            let y = x[0] as u64;
        }
    };
    assert!(transpile_global_kernel(&g).is_ok());
    let e = transpile_global_kernel_wgsl(&g).unwrap_err().to_string();
    assert!(e.contains("type `u64` is not available in WGSL"), "{e}");
    // Out of range literals and atomics on 64-bit elements are refused.
    let h: syn::ItemFn = parse_quote! { fn k(x: &mut [i64]) { x[0] = 18446744073709551615; } };
    let e = transpile_global_kernel(&h).unwrap_err().to_string();
    assert!(e.contains("does not fit in `i64`"), "{e}");
    let a: syn::ItemFn = parse_quote! { fn k(x: &mut [u64]) { atomic_add(&mut x[0], 1); } };
    let e = transpile_global_kernel(&a).unwrap_err().to_string();
    assert!(
        e.contains("atomics take an element of a `&mut [u32]` or `&mut [i32]`"),
        "{e}"
    );
}
