//! Odd and hostile input: the translator answers every one with `Ok` or a `syn::Error`,
//! never a panic, on both targets and as a stencil.

use ringkernel_codegen::{
    transpile_global_kernel, transpile_global_kernel_wgsl, transpile_stencil_kernel,
    transpile_stencil_kernel_wgsl, StencilConfig,
};

const BODIES: &[&str] = &[
    "",
    "return;",
    "let f = || 1; let g = async { 1 };",
    "let s = S { a: 1 }; let t = (1, 2).0;",
    "let r = &data; *r = 1.0;",
    "data.iter().map(|x| x * 2.0).sum::<f32>();",
    "let x = data[0]?;",
    "'a: loop { break 'a; }",
    "let y = loop { break 5; };",
    "match 1 { 1..=3 => {} _ => {} }",
    "if matches!(n, 1 | 2) {}",
    "while let Some(x) = None::<i32> {}",
    "let Some(x) = None::<i32> else { return; };",
    "unsafe { data[0] = 1.0; }",
    "let c = const { 1 };",
    "for (a, b) in 0..4 {}",
    "for i in 0.. {}",
    "for i in ..5 {}",
    "let a = 1u8; let b = 'c'; let s = \"s\"; let bs = b'x';",
    "let big = 1e400; let nan = 0.0 / 0.0;",
    "let huge = 340282366920938463463374607431768211455;",
    "let t = !true; let u = -true;",
    "let a = [1, 2][0];",
    "let z = [0.0; 0]; let w = [0.0; 2000];",
    "data[0] = pos.at(&data, 1, 1);",
    "let q: GridPos = pos;",
    "let data = 5; data[0] = 1.0;",
    "n = 3;",
    "data = data;",
    "data[0][1] = 2.0;",
    "data[data[0]] = 1.0;",
    "let x: [f32; 4] = [1.0, 2.0];",
    "let x: [f32; 2] = [1, 2];",
    "let m = match n { _ => break };",
    "let v = if n > 0 { 1 } else if n < 0 { 2.0 } else { 3 };",
    "let v = if n > 0 { 1 };",
    "let v = { };",
    "let v: f32 = { let a = 1.0; };",
    "continue;",
    "let x = thread_idx_x(1);",
    "let x = dsl::other::thread_idx_x();",
    "let x = f32::sqrt();",
    "let x = 1.0f32.max();",
    "let x = 1.0f32.mul_add(1.0);",
    "let x = (1 as f64) as f32;",
    "let x = 1 << 2.0;",
    "let x = 1.0 & 2.0;",
    "let x = true < false;",
    "let x = data < data;",
    "let x = -data;",
    "let x = data as f32;",
    "let x = 1 as bool;",
    "let x = std::f32::consts::TAU;",
    "let x = i64::MAX;",
    "let x = u32::MIN - 1;",
    "atomic_add(&mut data[0], 1.0);",
    "atomic_add(data, 1);",
    "let x = (1..4).step_by(0);",
    "for i in (1..4).step_by(0) {}",
    "for i in (0..n).step_by(2.0) {}",
    "for i in 0.0..1.0 {}",
    "let x = pos.north(&n);",
    "let x = pos.north(&data, 1);",
    "let x = pos.at(&data, 17, 0);",
    "let x = pos.at(&data, -1 - 1, 0);",
    "let x = pos.up(&data);",
    "let x = pos;",
    "let x = pos.idx(1);",
    "macro_rules! m { () => {} }",
    "struct S;",
    "let x = data.len();",
    "let x = data[0..2];",
    "#[allow(unused)] let x = 1;",
    "let mut x; x = 1.0;",
    "let (mut a) = 1;",
    "let ref a = 1;",
    "let a @ 1 = 1;",
    "return data[0];",
    "break;",
    "loop { let x = match 1 { 1 => { break; } _ => 2 }; }",
];

#[test]
fn every_odd_body_is_an_answer_not_a_panic() {
    let cfg = StencilConfig::new(2);
    let mut errors = 0;
    for body in BODIES {
        let src = format!("fn k(data: &mut [f32], n: i32) {{ {body} }}");
        let Ok(f) = syn::parse_str::<syn::ItemFn>(&src) else {
            continue;
        };
        for r in [
            transpile_global_kernel(&f).map(|_| ()),
            transpile_global_kernel_wgsl(&f).map(|_| ()),
        ] {
            if let Err(e) = r {
                assert!(!e.to_string().is_empty());
                errors += 1;
            }
        }
        let src = format!("fn k(pos: GridPos, data: &mut [f32], n: i32) {{ {body} }}");
        let f: syn::ItemFn = syn::parse_str(&src).unwrap();
        for r in [
            transpile_stencil_kernel(&f, &cfg).map(|_| ()),
            transpile_stencil_kernel_wgsl(&f, &cfg).map(|_| ()),
        ] {
            if let Err(e) = r {
                assert!(!e.to_string().is_empty());
                errors += 1;
            }
        }
    }
    // Most of these are refused; the count guards against the loop silently skipping all.
    assert!(errors > 200, "only {errors} errors");
}
