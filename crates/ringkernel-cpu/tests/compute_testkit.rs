//! The backend-agnostic conformance kit on the CPU backend, on the global pool and on
//! dedicated pools of one and three threads.

use ringkernel_core::compute::testkit;
use ringkernel_cpu::CpuCompute;

#[test]
fn check_all_on_the_global_pool() {
    let report = testkit::check_all(&CpuCompute::new()).unwrap_or_else(|e| panic!("{e}"));
    println!("{report}");
    assert!(report.passed());
    // every op family ran
    for op in [
        "upload/read",
        "unary exp",
        "binary div",
        "binary_scalar max",
        "swiglu",
        "matmul",
        "matvec",
        "dot",
        "reduce mean",
        "softmax",
        "rms_norm",
        "layer_norm",
        "rope",
        "attention_scores",
        "attention_weighted_sum",
        "attention",
        "greedy_feed",
    ] {
        assert!(report.checks.iter().any(|c| c.op == op), "no check of {op}");
    }
    // the CPU is held to tighter bounds than the defaults
    assert!(report.worst("unary exp").unwrap() < 1e-6, "{report}");
    assert!(report.worst("matmul").unwrap() < 1e-6, "{report}");
    assert!(report.worst("softmax").unwrap() < 1e-6, "{report}");
    assert!(report.worst("attention").unwrap() < 2e-6, "{report}");
}

#[test]
fn check_all_single_thread() {
    let cpu = CpuCompute::with_threads(1).unwrap();
    testkit::check_all(&cpu).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn check_all_three_threads() {
    let cpu = CpuCompute::with_threads(3).unwrap();
    testkit::check_all(&cpu).unwrap_or_else(|e| panic!("{e}"));
}
