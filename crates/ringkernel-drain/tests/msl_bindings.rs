//! Every kernel the Metal backend loads is translated to MSL here (naga, as at run
//! time on a Mac), and the `[[buffer(N)]]` attributes of its entry point are compared
//! with what the Metal host binds: the dispatch plans of every op, and the drain
//! passes of the built-in actor kernels.

use ringkernel_core::compute::{
    checks, AttentionDims, BinaryOp, DType, EmbeddingDims, KvDims, MatmulDims, QMatmulDims,
    ReduceDims, ReduceOp, RopeDims, UnaryOp, WeightFormat,
};
use ringkernel_drain::engine::DRAIN_SLOTS;
use ringkernel_drain::msl::{check_host_bindings, parse_entry_points, HostSlot, MslEntryPoint};
use ringkernel_drain::plan::{self, Plan};
use ringkernel_shaders::{drain, Access, Kernel};
use std::collections::BTreeSet;

fn every_plan() -> Vec<(String, Plan)> {
    let mut v: Vec<(String, Plan)> = Vec::new();
    // 1000 elements run the vec4 kernels, 1001 the scalar ones.
    for len in [1000, 1001] {
        for op in UnaryOp::ALL {
            v.push((format!("unary {op:?} {len}"), plan::unary(op, len).unwrap()));
        }
        for op in BinaryOp::ALL {
            v.push((
                format!("binary {op:?} {len}"),
                plan::binary(op, len).unwrap(),
            ));
            v.push((
                format!("binary_scalar {op:?} {len}"),
                plan::binary_scalar(op, 2.0, len).unwrap(),
            ));
        }
        v.push((format!("swiglu {len}"), plan::swiglu(len).unwrap()));
    }
    v.push((
        "matmul".into(),
        plan::matmul(MatmulDims {
            batch: 2,
            m: 70,
            k: 9,
            n: 65,
            b_batched: true,
        })
        .unwrap(),
    ));
    for tile in ringkernel_shaders::MatmulTile::CANDIDATES {
        for (k, n) in [(9, 65), (12, 64)] {
            let d = MatmulDims {
                batch: 2,
                m: 70,
                k,
                n,
                b_batched: true,
            };
            v.push((
                format!("matmul_tiled {tile} k={k} n={n}"),
                plan::matmul_tiled(d, tile, true, true).unwrap(),
            ));
        }
    }
    v.push(("matvec".into(), plan::matvec(70, 9).unwrap()));
    for op in ReduceOp::ALL {
        v.push((
            format!("reduce short {op:?}"),
            plan::reduce(
                op,
                ReduceDims {
                    outer: 3,
                    axis: 100,
                    inner: 1,
                },
            )
            .unwrap(),
        ));
        v.push((
            format!("reduce long {op:?}"),
            plan::reduce(
                op,
                ReduceDims {
                    outer: 2,
                    axis: 100_000,
                    inner: 1,
                },
            )
            .unwrap(),
        ));
        v.push((
            format!("reduce strided {op:?}"),
            plan::reduce(
                op,
                ReduceDims {
                    outer: 3,
                    axis: 5000,
                    inner: 7,
                },
            )
            .unwrap(),
        ));
    }
    v.push(("dot short".into(), plan::dot(100).unwrap()));
    v.push(("dot long".into(), plan::dot(1_000_000).unwrap()));
    v.push(("argmax".into(), plan::argmax(49_152).unwrap()));
    for cols in [33, 32] {
        v.push((format!("softmax {cols}"), plan::softmax(4, cols).unwrap()));
        v.push((
            format!("rms_norm {cols}"),
            plan::rms_norm(4, cols, 1e-5).unwrap(),
        ));
    }
    v.push(("layer_norm".into(), plan::layer_norm(4, 33, 1e-5).unwrap()));
    v.push((
        "rope".into(),
        plan::rope(RopeDims {
            seq: 5,
            heads: 2,
            head_dim: 8,
            base: 1e4,
        })
        .unwrap(),
    ));
    let d = AttentionDims {
        batch_heads: 2,
        q_len: 3,
        kv_len: 5,
        kv_stride: 6,
        head_dim: 16,
        scale: 0.25,
        causal: true,
        q_offset: 2,
    };
    v.push((
        "attention_scores".into(),
        plan::attention_scores(d).unwrap(),
    ));
    v.push((
        "attention_weighted_sum".into(),
        plan::attention_weighted_sum(d).unwrap(),
    ));
    v.push(("attention fused".into(), plan::attention(d).unwrap()));
    v.push((
        "attention wide".into(),
        plan::attention(AttentionDims { head_dim: 600, ..d }).unwrap(),
    ));
    for (from, to) in [(DType::F32, DType::F16), (DType::Bf16, DType::F32)] {
        v.push((
            format!("convert {from}->{to}"),
            plan::convert(from, to, 37).unwrap(),
        ));
    }
    let (_, bd) = checks::broadcast(&[4, 1, 5], &[3, 1]).unwrap();
    v.push((
        "broadcast".into(),
        plan::broadcast_binary(BinaryOp::Div, &bd).unwrap(),
    ));
    for format in WeightFormat::ALL {
        let qd = QMatmulDims {
            batch: 5,
            rows: 70,
            cols: 64,
            accumulate: true,
        };
        for gated in [false, true] {
            v.push((
                format!("qmatmul {format} gated={gated}"),
                plan::qmatmul(format, qd, gated).unwrap(),
            ));
        }
        let ed = EmbeddingDims {
            rows: 9,
            cols: 64,
            count: 3,
        };
        v.push((
            format!("embedding {format}"),
            plan::embedding(format, ed).unwrap(),
        ));
    }
    let kd = KvDims {
        tokens: 3,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        capacity: 10,
        rope_base: 10000.0,
        scale: 0.25,
    };
    v.push(("rope_kv".into(), plan::rope_kv(kd).unwrap()));
    v.push(("attention_kv".into(), plan::attention_kv(kd).unwrap()));
    v
}

/// The host slots plus naga's buffer-sizes argument, which the Metal host binds with
/// `setBytes` whenever the translation has one; also checks that every size it
/// carries is for a binding the host binds.
fn with_sizes(
    what: &str,
    msl: &ringkernel_shaders::MslOutput,
    mut slots: Vec<HostSlot>,
) -> Vec<HostSlot> {
    if let Some(index) = msl.sizes_buffer {
        assert_eq!(index, ringkernel_shaders::SIZES_BUFFER_INDEX);
        assert!(
            slots.iter().all(|s| s.index != index as u32),
            "{what}: sizes index collides"
        );
        for (g, b) in msl.sizes_order.iter().flatten() {
            assert_eq!(*g, 0);
            assert!(
                slots.iter().any(|s| s.index == *b),
                "{what}: size of unbound binding {b} requested"
            );
        }
        slots.push(HostSlot {
            index: index as u32,
            name: "_buffer_sizes",
            writes: false,
        });
    }
    slots
}

fn entry(msl: &ringkernel_shaders::MslOutput) -> MslEntryPoint {
    let eps = parse_entry_points(&msl.source).expect("MSL signatures parse");
    eps.into_iter()
        .find(|e| e.name == msl.entry_point)
        .unwrap_or_else(|| panic!("entry point {} not in the MSL", msl.entry_point))
}

#[test]
fn op_plans_bind_what_the_msl_expects() {
    let mut seen = BTreeSet::new();
    for (what, plan) in every_plan() {
        assert!(!plan.dispatches.is_empty(), "{what}");
        for d in &plan.dispatches {
            seen.insert(d.kernel);
            let msl = ringkernel_shaders::to_msl(d.kernel, &d.spec)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let ep = entry(&msl);
            let slots = with_sizes(&what, &msl, d.host_slots());
            check_host_bindings(&ep, &slots)
                .unwrap_or_else(|e| panic!("{what}: {e}\nMSL params: {:#?}", ep.params));
            // Every MSL buffer is bound (no hole a GPU would read garbage from).
            for (index, p) in ep.buffers() {
                assert!(
                    slots.iter().any(|s| s.index == index),
                    "{what}: {} at {index} unbound",
                    p.name
                );
                assert!(index < 31, "Metal has 31 buffer slots");
            }
            // The plan agrees with the shaders crate's binding table.
            for b in &d.binds {
                let t = d.kernel.bindings().iter().find(|t| t.binding == b.binding);
                let t = t.unwrap_or_else(|| {
                    panic!(
                        "{what}: binding {} not in {:?}'s table",
                        b.binding, d.kernel
                    )
                });
                assert_eq!(
                    t.access == Access::ReadWrite,
                    b.writes,
                    "{what}: binding {}",
                    b.binding
                );
            }
            assert_eq!(msl.workgroup_size, d.threads(), "{what}");
            // The MSL translation maps binding b to [[buffer(b)]], as the host assumes.
            for (g, b, slot) in &msl.buffer_bindings {
                assert_eq!((*g, *b as u8), (0, *slot), "{what}");
            }
        }
    }
    // Every compute kernel is reachable from some op plan (the vec4 variants included).
    let all: BTreeSet<Kernel> = Kernel::ALL
        .into_iter()
        .filter(|k| !matches!(k, Kernel::Drain | Kernel::DrainSerial))
        .collect();
    assert_eq!(seen, all, "every compute kernel is used by some op plan");
}

#[test]
fn drain_passes_bind_what_the_msl_expects() {
    for (name, wgsl, _) in drain::builtin_handlers() {
        let module = ringkernel_shaders::validate_source(name, &drain::compose(&wgsl)).unwrap();
        let serial = drain::is_serial(&module.module);
        for s in [false, true] {
            let msl = ringkernel_shaders::drain_to_msl(&wgsl, s)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let ep = entry(&msl);
            let mut slots = with_sizes(name, &msl, DRAIN_SLOTS.to_vec());
            // A stateless handler's MSL drops the unused state buffer; binding it anyway
            // is harmless, so it is only required when the MSL declares it.
            slots.retain(|h| h.name != "rk_state" || ep.buffer(h.index).is_some());
            check_host_bindings(&ep, &slots)
                .unwrap_or_else(|e| panic!("{name} serial={s}: {e}\n{:#?}", ep.params));
            for (index, _) in ep.buffers() {
                assert!(
                    slots.iter().any(|h| h.index == index),
                    "{name}: [[buffer({index})]] unbound"
                );
            }
        }
        if name == ringkernel_core::builtin::COUNTER {
            assert!(
                serial,
                "the counter keeps per-message state and must run serially"
            );
        }
    }
}
