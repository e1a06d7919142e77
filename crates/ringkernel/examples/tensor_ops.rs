//! Tensor ops on a device, checked against the f64 reference.
//!
//! Starts with the two seed examples (a 2×2 matmul and a 4-element add), printed and
//! checked exactly, then runs larger ops on fresh random inputs and compares each with
//! the f64 reference by relative error. Exits non-zero on any failure.
//!
//! ```text
//! cargo run -p ringkernel --example tensor_ops                              # CPU
//! cargo run -p ringkernel --features wgpu --example tensor_ops -- --device wgpu
//! cargo run -p ringkernel --features full --example tensor_ops -- --device auto
//! ```
//!
//! `--device` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".

mod common;

use ringkernel::compute::{reference, MatmulDims, ReduceDims, ReduceOp, Tensor, UnaryOp};
use ringkernel::core::util::{rel_error, SplitMix64};
use ringkernel::Result;
use std::process::ExitCode;

fn run() -> Result<bool> {
    let dev = common::device_arg()?;
    println!("device: {dev}");
    for s in dev.skipped() {
        println!("  (skipped {}: {})", s.backend, s.reason);
    }
    let mut ok = true;

    // The seeds: exact small results.
    let a = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
    let b = Tensor::from_slice(&dev, &[5.0, 6.0, 7.0, 8.0], &[2, 2])?;
    let c = a.matmul(&b)?.to_vec()?;
    println!(
        "[[1, 2], [3, 4]] × [[5, 6], [7, 8]] = [[{}, {}], [{}, {}]]",
        c[0], c[1], c[2], c[3]
    );
    ok &= check_exact("2×2 matmul", &c, &[19.0, 22.0, 43.0, 50.0]);
    let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[4])?;
    let y = Tensor::from_slice(&dev, &[10.0, 20.0, 30.0, 40.0], &[4])?;
    let s = x.add(&y)?.to_vec()?;
    println!("[1, 2, 3, 4] + [10, 20, 30, 40] = {s:?}");
    ok &= check_exact("4-element add", &s, &[11.0, 22.0, 33.0, 44.0]);

    // Larger ops on fresh random inputs of awkward sizes.
    let mut rng = SplitMix64::from_entropy();
    let (m, k, n) = (129, 257, 65);
    let av = rng.vec(m * k, -1.0, 1.0);
    let bv = rng.vec(k * n, -1.0, 1.0);
    let at = Tensor::from_slice(&dev, &av, &[m, k])?;
    let bt = Tensor::from_slice(&dev, &bv, &[k, n])?;
    let got = at.matmul(&bt)?;
    let want = reference::matmul(
        &av,
        &bv,
        MatmulDims {
            batch: 1,
            m,
            k,
            n,
            b_batched: false,
        },
    );
    ok &= check("matmul 129×257 · 257×65", &got.to_vec()?, &want, 1e-5);

    // softmax(gelu(A·B)) row by row, the whole chain on the device
    let chain = got.gelu()?.softmax()?;
    let want_chain = reference::softmax(&reference::unary(UnaryOp::Gelu, &want), m, n);
    ok &= check("softmax(gelu(A·B))", &chain.to_vec()?, &want_chain, 1e-5);

    let xv = rng.vec(33 * 1023, -4.0, 4.0);
    let xt = Tensor::from_slice(&dev, &xv, &[33, 1023])?;
    let w = rng.vec(1023, 0.5, 1.5);
    let wt = Tensor::from_slice(&dev, &w, &[1023])?;
    ok &= check(
        "rms_norm 33×1023",
        &xt.rms_norm(&wt, 1e-6)?.to_vec()?,
        &reference::rms_norm(&xv, &w, 33, 1023, 1e-6),
        1e-5,
    );
    ok &= check(
        "sum over axis 0 of 33×1023",
        &xt.sum_axis(0)?.to_vec()?,
        &reference::reduce(
            ReduceOp::Sum,
            &xv,
            ReduceDims {
                outer: 1,
                axis: 33,
                inner: 1023,
            },
        ),
        1e-5,
    );
    ok &= check(
        "max over axis 1 of 33×1023",
        &xt.max_axis(1)?.to_vec()?,
        &reference::reduce(
            ReduceOp::Max,
            &xv,
            ReduceDims {
                outer: 33,
                axis: 1023,
                inner: 1,
            },
        ),
        0.0,
    );
    let v4097 = rng.vec(4097, -1.0, 1.0);
    let t4097 = Tensor::from_slice(&dev, &v4097, &[4097])?;
    ok &= check(
        "dot of 4097",
        &t4097.dot(&t4097)?.to_vec()?,
        &reference::dot(&v4097, &v4097),
        1e-5,
    );
    ok &= check(
        "exp of 4097",
        &t4097.exp()?.to_vec()?,
        &reference::unary(UnaryOp::Exp, &v4097),
        1e-6,
    );

    // Shape mismatches are errors, not panics.
    match at.matmul(&at) {
        Err(e) => println!("129×257 · 129×257 refused as expected: {e}"),
        Ok(_) => {
            println!("FAIL: a mismatched matmul was accepted");
            ok = false;
        }
    }
    Ok(ok)
}

fn check_exact(what: &str, got: &[f32], want: &[f32]) -> bool {
    let ok = got == want;
    println!("  {} {what}", if ok { "ok  " } else { "FAIL" });
    ok
}

fn check(what: &str, got: &[f32], want: &[f64], tol: f64) -> bool {
    let e = rel_error(got, want);
    let ok = e <= tol;
    println!(
        "  {} {what:<32} rel error {e:.2e} (≤ {tol:.0e})",
        if ok { "ok  " } else { "FAIL" }
    );
    ok
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => {
            println!("all checks passed");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("some checks FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
