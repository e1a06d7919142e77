//! Actor handlers translated for the GPU templates (`transpile_handler`): the WGSL is
//! composed with the drain template, validated by naga and translated to MSL for both drain
//! entry points; the CUDA C type-checks against a stand-in of the persistent template's
//! ABI; the constructs outside the handler subset are errors at their span. Execution on
//! every runtime is in the facade's `portable_handler` test.

mod common;

use common::check_cuda_syntax;
use ringkernel_codegen::{handler_prelude, transpile_handler, HandlerSource, Target};
use ringkernel_shaders::drain;
use syn::parse_quote;

/// The parts of `ringkernel.cuh` a handler uses, for a host C++ syntax check (NVRTC
/// compiles the real thing in the CUDA tests).
const ABI_SHIM: &str = r#"
typedef unsigned int rk_u32;
typedef unsigned long long rk_u64;
#define RK_ERR_HANDLER 3u
#define RK_K2K_DELIVERED 0
#define RK_K2K_QUEUE_FULL 1
#define RK_K2K_NOT_FOUND 2
struct RkMessageHeader { rk_u32 magic, version, type_id, payload_len; };
struct RkContext { rk_u32 kernel_id; rk_u32 max_payload; };
static inline int rk_send_to(RkContext*, rk_u32, rk_u32, const void*, rk_u32) { return 0; }
static inline void __nanosleep(unsigned int) {}
"#;

/// Translates `f`, checks both targets, returns the translation.
fn check(f: &syn::ItemFn) -> HandlerSource {
    let h = transpile_handler(f).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<(&str, u32)> = h
        .type_ids
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), 0x100 + i as u32))
        .collect();
    check_cuda_syntax(&format!(
        "{ABI_SHIM}{}{}",
        handler_prelude(Target::Cuda, &ids),
        h.cuda
    ));
    let wgsl = format!(
        "{}{}",
        handler_prelude(Target::Wgsl, &ids),
        h.wgsl.as_ref().unwrap_or_else(|e| panic!("{e}"))
    );
    let v = ringkernel_shaders::validate_source(&h.name, &drain::compose(&wgsl))
        .unwrap_or_else(|e| panic!("{e}\n{wgsl}"));
    assert_eq!(drain::is_serial(&v.module), h.serial, "{wgsl}");
    for serial in [false, true] {
        let msl = ringkernel_shaders::drain_to_msl(&wgsl, serial).unwrap_or_else(|e| panic!("{e}"));
        assert!(msl.source.contains("kernel void"), "{}", msl.source);
    }
    h
}

#[test]
fn handlers_translate_for_both_templates() {
    // State in a struct, a reply built from it, `if`/`match` tails, a helper.
    let h = check(&parse_quote! {
        fn stats(_ctx: &mut KernelContext<'_>, s: &mut Stats, m: Reading) -> Option<Summary> {
            struct Reading { id: u64, values: [f32; 4], kind: u32, pad: u32 }
            struct Stats { total: i64, seen: u32, peak: f32, by_kind: [u32; 3], pad: u32 }
            struct Summary { id: u64, peak: f32, seen: u32 }
            fn biggest(a: f32, b: f32) -> f32 { if a > b { a } else { b } }
            s.seen += 1;
            for k in 0..4usize {
                s.peak = biggest(s.peak, m.values[k]);
            }
            s.by_kind[(m.kind % 3) as usize] += 1;
            if m.kind == 99 {
                return None;
            }
            match m.kind {
                0 => Some(Summary { id: m.id, peak: s.peak, seen: s.seen }),
                1 | 2 => {
                    let p = s.peak * 2.0;
                    Some(Summary { id: m.id, peak: p, seen: s.seen })
                }
                _ => None,
            }
        }
    });
    assert!(h.serial);
    assert_eq!(h.state, Some(("Stats".into(), 32)));
    assert_eq!(h.type_ids, ["Reading", "Summary"]);
    assert!(
        h.cuda.contains("Stats& state = *(Stats*)rk_state;"),
        "{}",
        h.cuda
    );
    let w = h.wgsl.unwrap();
    assert!(w.contains("rk_st_state_Stats(0u, state);"), "{w}");
    assert!(
        w.contains("bitcast<vec2<i32>>"),
        "the i64 field is loaded as two words: {w}"
    );

    // Stateless: parallel; a scalar state: serial.
    let h = check(&parse_quote! {
        fn square(_ctx: &mut KernelContext<'_>, m: Reading) -> Option<Reading> {
            struct Reading { id: u64, v: f32, n: u32 }
            Some(Reading { v: m.v * m.v, ..m })
        }
    });
    assert!(!h.serial);
    assert!(h.cuda.contains("(void)rk_state;"));
    let h = check(&parse_quote! {
        fn count(_ctx: &mut KernelContext<'_>, n: &mut u32, m: Reading) {
            struct Reading { v: f32 }
            if m.v > 0.0 {
                *n += 1;
            }
        }
    });
    assert!(h.serial);
    assert_eq!(h.state, Some(("u32".into(), 4)));
    assert!(h.wgsl.unwrap().contains("rk_state[0u] = state;"));

    // K2K sends: serial; the three statement forms; a second output is refused on WGSL.
    let h = check(&parse_quote! {
        fn route(ctx: &mut KernelContext<'_>, m: Job) -> Option<Job> {
            struct Job { id: u64, hops: u32, to: u32 }
            if m.hops > 2 {
                ctx.send_to(KernelId(m.to), &m).ok();
                return None;
            }
            if m.to == 0 {
                let _ = ctx.send_to(ctx.kernel_id(), &Job { hops: m.hops + 1, ..m });
            } else {
                ctx.send_to(KernelId(m.to + ctx.kernel_id().0), &m);
            }
            Some(m)
        }
    });
    assert!(h.serial);
    assert!(
        h.cuda
            .contains("while (rk_send_to(ctx, rk_dest, RK_TID_Job, &rk_msg"),
        "{}",
        h.cuda
    );
    let w = h.wgsl.unwrap();
    assert!(
        w.contains("rk_send(ctx, (*ctx).kernel_id, RK_TID_Job, 16u);"),
        "{w}"
    );
    assert!(w.contains("return RK_ERR_SECOND_OUTPUT;"), "{w}");
}

fn fails(f: syn::ItemFn, want: &str) {
    match transpile_handler(&f) {
        Ok(h) => panic!("expected an error containing {want:?}, got\n{}", h.cuda),
        Err(e) => assert!(e.to_string().contains(want), "{e}\nlacks: {want}"),
    }
}

#[test]
fn handler_errors_say_what_is_supported() {
    fails(
        parse_quote! { fn h(m: M) { struct M { v: f32 } } },
        "a GPU handler is `fn name(ctx: &mut KernelContext<'_>, msg: M) -> R`",
    );
    fails(
        parse_quote! { fn h(ctx: &KernelContext<'_>, m: M) { struct M { v: f32 } } },
        "a GPU handler is",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: f32) {} },
        "a GPU handler's message is a `#[repr(C)]` struct that derives GpuType, not `f32`",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, s: &mut [f32; 4], m: M) { struct M { v: f32 } } },
        "the state is a GpuType struct or a u32, i32 or f32",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) -> M { struct M { v: f32 } m } },
        "GPU handlers return `()` or `Option<Reply>`",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) -> Option<M> { struct M { v: f32 } m } },
        "an `Option<Reply>` handler ends in `Some(reply)` or `None`",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) { struct M { v: f32 } let i = thread_idx_x(); } },
        "thread and block indices are not available in actor handlers",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) { struct M { v: f32 } ctx.publish("t", &m); } },
        "a handler's context offers `ctx.send_to(KernelId(dest), &msg)` and `ctx.kernel_id().0`",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) { struct M { v: f32 } let r = ctx.send_to(KernelId(1), &m); } },
        "`ctx.send_to(..)` is a statement",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) { struct M { v: f32 } ctx.send_to(1u32, &m); } },
        "K2K sends are `ctx.send_to(KernelId(dest), &message)`",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) { struct M { v: f32 } ctx.send_to(KernelId(1), &m.v); } },
        "K2K sends are",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, s: &mut S, m: M) { struct M { v: f32 } struct S { v: f32 } let t = s; } },
        "`s` is a reference: use `*s` or its fields",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) -> Option<M> { struct M { v: f32 } return; } },
        "this handler returns `Option<Reply>`",
    );
    fails(
        parse_quote! { fn h(ctx: &mut KernelContext<'_>, m: M) { struct M { v: f32 } let c = ctx; } },
        "a handler uses its context as",
    );
}

#[test]
fn f64_handlers_are_cuda_only() {
    let h = transpile_handler(&parse_quote! {
        fn h(_ctx: &mut KernelContext<'_>, m: M) -> Option<M> {
            struct M { v: f32 }
            let x = m.v as f64 * 2.0;
            Some(M { v: x as f32 })
        }
    })
    .unwrap();
    assert!(h
        .wgsl
        .unwrap_err()
        .contains("type `f64` is not available in WGSL"));
    check_cuda_syntax(&format!(
        "{ABI_SHIM}{}{}",
        handler_prelude(Target::Cuda, &[("M", 1)]),
        h.cuda
    ));
}
