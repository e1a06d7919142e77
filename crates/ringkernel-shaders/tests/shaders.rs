//! Every kernel validates with naga and translates to MSL with the documented buffer
//! indices; the WGSL mirrors of the shared structs have the Rust layouts.

use naga::proc::Layouter;
use ringkernel_core::control::{CONTROL_BLOCK_FIELDS, MESSAGE_HEADER_FIELDS};
use ringkernel_core::queue::QUEUE_HEADER_FIELDS;
use ringkernel_shaders::{drain, params, Family, Kernel, Specialization};

#[test]
fn every_family_validates() {
    for f in Family::ALL {
        let v = ringkernel_shaders::validate(f).unwrap_or_else(|e| panic!("{}: {e}", f.name()));
        assert!(
            !v.module.entry_points.is_empty(),
            "{} has no entry points",
            f.name()
        );
    }
}

#[test]
fn every_kernel_has_its_entry_point_and_workgroup_size() {
    for k in Kernel::ALL {
        let v = ringkernel_shaders::validate(k.family()).unwrap();
        let ep = v
            .module
            .entry_points
            .iter()
            .find(|e| e.name == k.entry_point())
            .unwrap_or_else(|| panic!("{k:?}: no entry point {}", k.entry_point()));
        assert_eq!(ep.workgroup_size, k.workgroup_size(), "{k:?}");
        assert_eq!(ep.stage, naga::ShaderStage::Compute);
    }
}

/// Every resource an entry point uses is in its binding table, with the right access.
#[test]
fn binding_tables_cover_what_entry_points_use() {
    for k in Kernel::ALL {
        let v = ringkernel_shaders::validate(k.family()).unwrap();
        let idx = v
            .module
            .entry_points
            .iter()
            .position(|e| e.name == k.entry_point())
            .unwrap();
        let fi = v.info.get_entry_point(idx);
        for (h, var) in v.module.global_variables.iter() {
            if fi[h].is_empty() {
                continue;
            }
            let Some(rb) = &var.binding else { continue };
            let entry = k
                .bindings()
                .iter()
                .find(|b| b.group == rb.group && b.binding == rb.binding)
                .unwrap_or_else(|| {
                    panic!("{k:?} uses @binding({}) but its table lacks it", rb.binding)
                });
            let access = match var.space {
                naga::AddressSpace::Uniform => ringkernel_shaders::Access::Uniform,
                naga::AddressSpace::Storage { access }
                    if access.contains(naga::StorageAccess::STORE) =>
                {
                    ringkernel_shaders::Access::ReadWrite
                }
                _ => ringkernel_shaders::Access::Read,
            };
            assert_eq!(entry.access, access, "{k:?} binding {}", rb.binding);
        }
    }
}

#[test]
fn every_kernel_translates_to_msl_with_the_table_indices() {
    for k in Kernel::ALL {
        let spec = if k.overrides().contains(&"OP") {
            Specialization::op(1)
        } else {
            Specialization::none()
        };
        let out = ringkernel_shaders::to_msl(k, &spec).unwrap_or_else(|e| panic!("{k:?}: {e}"));
        assert!(
            out.source.contains("kernel void"),
            "{k:?}: no kernel function"
        );
        assert!(out.source.contains(&out.entry_point), "{k:?}");
        for b in k.bindings() {
            assert!(
                out.buffer_bindings
                    .contains(&(0, b.binding, b.binding as u8)),
                "{k:?}: {b:?}"
            );
            // The argument with that buffer index exists in the MSL signature (the drain
            // stub handler does not touch rk_state).
            let attr = format!("[[buffer({})]]", b.binding);
            if !(k.family() == Family::Drain && b.binding == 4) {
                assert!(
                    out.source.contains(&attr),
                    "{k:?}: {attr} missing in\n{}",
                    out.source
                );
            }
        }
        assert_only_table_indices(&out, k.bindings());
        // Overrides were resolved: no function constants left in the source.
        assert!(!out.source.contains("function_constant"), "{k:?}");
    }
}

#[test]
fn builtin_handlers_compose_validate_and_translate() {
    for (name, src, state) in drain::builtin_handlers() {
        let v = ringkernel_shaders::validate_source(name, &drain::compose(&src))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            drain::is_serial(&v.module),
            name == ringkernel_core::builtin::COUNTER,
            "{name}"
        );
        assert_eq!(state > 0, name == ringkernel_core::builtin::COUNTER);
        for serial in [false, true] {
            let out = ringkernel_shaders::drain_to_msl(&src, serial)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            for i in 0..4 {
                assert!(
                    out.source.contains(&format!("[[buffer({i})]]")),
                    "{name}: buffer {i}"
                );
            }
            // Only the counter keeps state.
            assert_eq!(out.source.contains("[[buffer(4)]]"), state > 0, "{name}");
            assert_only_table_indices(&out, drain::BINDINGS);
        }
    }
}

#[test]
fn a_broken_handler_is_a_compile_error_not_a_panic() {
    let e =
        ringkernel_shaders::validate_source("bad", &drain::compose("fn handle() {}")).unwrap_err();
    assert!(matches!(e, ringkernel_core::Error::Compile { .. }), "{e}");
    let e = ringkernel_shaders::drain_to_msl("this is not wgsl", false).unwrap_err();
    assert!(e.to_string().contains("drain+handler"), "{e}");
}

/// Finds a named struct and returns (member name, offset) pairs and its size.
fn struct_layout(module: &naga::Module, name: &str) -> (Vec<(String, usize)>, usize) {
    let mut layouter = Layouter::default();
    layouter.update(module.to_ctx()).unwrap();
    for (h, ty) in module.types.iter() {
        if ty.name.as_deref() == Some(name) {
            if let naga::TypeInner::Struct { members, span } = &ty.inner {
                assert_eq!(layouter[h].size, *span);
                let fields = members
                    .iter()
                    .map(|m| (m.name.clone().unwrap(), m.offset as usize))
                    .collect();
                return (fields, *span as usize);
            }
        }
    }
    panic!("no struct {name}");
}

fn assert_layout(module: &naga::Module, wgsl_name: &str, rust: &[(&str, usize)], size: usize) {
    let (fields, span) = struct_layout(module, wgsl_name);
    assert_eq!(span, size, "{wgsl_name} size");
    let want: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(fields, want, "{wgsl_name} fields");
}

#[test]
fn shared_struct_layouts_match_rust() {
    let v = ringkernel_shaders::validate(Family::Drain).unwrap();
    assert_layout(
        &v.module,
        "RkMessageHeader",
        MESSAGE_HEADER_FIELDS,
        std::mem::size_of::<ringkernel_core::message::MessageHeader>(),
    );
    assert_layout(
        &v.module,
        "RkControlBlock",
        CONTROL_BLOCK_FIELDS,
        std::mem::size_of::<ringkernel_core::control::ControlBlock>(),
    );
    assert_layout(
        &v.module,
        "RkQueueHeader",
        QUEUE_HEADER_FIELDS,
        std::mem::size_of::<ringkernel_core::queue::QueueHeader>(),
    );
}

#[test]
fn param_block_layouts_match_rust() {
    let modules: Vec<_> = Family::ALL
        .iter()
        .map(|f| ringkernel_shaders::validate(*f).unwrap())
        .collect();
    for (name, size, fields) in params::LAYOUTS {
        let m = modules
            .iter()
            .find(|v| {
                v.module
                    .types
                    .iter()
                    .any(|(_, t)| t.name.as_deref() == Some(*name))
            })
            .unwrap_or_else(|| panic!("no module defines {name}"));
        assert_layout(&m.module, name, fields, *size);
        assert_eq!(
            size % 16,
            0,
            "{name}: uniform blocks are multiples of 16 bytes"
        );
    }
}

#[test]
fn grid_splits_large_ranges() {
    assert_eq!(ringkernel_shaders::grid_for(0), [1, 1, 1]);
    assert_eq!(ringkernel_shaders::grid_for(65535), [65535, 1, 1]);
    assert_eq!(ringkernel_shaders::grid_for(65536), [65535, 2, 1]);
    let g = ringkernel_shaders::grid_for(262_144);
    assert!(g[0] as u64 * g[1] as u64 >= 262_144 && g[0] <= 65535 && g[1] <= 65535);
}

/// Every `[[buffer(N)]]` in the MSL is a binding of the table or the sizes buffer, and
/// the sizes order names only bindings of the table.
fn assert_only_table_indices(
    out: &ringkernel_shaders::MslOutput,
    table: &[ringkernel_shaders::Binding],
) {
    for part in out.source.split("[[buffer(").skip(1) {
        let n: u8 = part[..part.find(')').unwrap()].parse().unwrap();
        let known = table.iter().any(|b| b.binding as u8 == n) || Some(n) == out.sizes_buffer;
        assert!(known, "[[buffer({n})]] is not in the binding table");
    }
    assert_eq!(
        out.sizes_buffer,
        Some(ringkernel_shaders::SIZES_BUFFER_INDEX)
    );
    for (g, b) in out.sizes_order.iter().flatten() {
        assert!(
            table.iter().any(|t| t.group == *g && t.binding == *b) || *b <= 4,
            "sizes entry ({g}, {b})"
        );
    }
}

/// The template's message constants are the host's: the output unit's flags
/// (`drain::Output`) and the request checks use them.
#[test]
fn template_message_constants_match_rust() {
    use ringkernel_core::message::{flags, MESSAGE_MAGIC, MESSAGE_VERSION};
    let v =
        ringkernel_shaders::validate_source("drain", &drain::compose(drain::STUB_HANDLER)).unwrap();
    let constant = |name: &str| -> u32 {
        let (_, c) = v
            .module
            .constants
            .iter()
            .find(|(_, c)| c.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no constant {name}"));
        match v.module.global_expressions[c.init] {
            naga::Expression::Literal(naga::Literal::U32(x)) => x,
            ref e => panic!("{name}: {e:?}"),
        }
    };
    assert_eq!(constant("RK_FLAG_REPLY"), flags::REPLY);
    assert_eq!(constant("RK_FLAG_K2K"), flags::K2K);
    assert_eq!(constant("RK_MESSAGE_MAGIC"), MESSAGE_MAGIC);
    assert_eq!(constant("RK_MESSAGE_VERSION"), MESSAGE_VERSION);
    assert_eq!(
        constant("RK_ERR_INVALID_REQUEST"),
        drain::ERR_INVALID_REQUEST
    );
}

/// An output unit reads back as written, from the little-endian bytes of an output slot.
#[test]
fn output_units_round_trip() {
    use drain::Output;
    let reply = Output::Message {
        flags: ringkernel_core::message::flags::REPLY,
        type_id: 0x524B_0001,
        payload_len: 72,
        dest_kernel: 9,
    };
    for out in [
        reply,
        Output::None { status: 0 },
        Output::None { status: 7 },
    ] {
        let mut slot = vec![0xA5u8; 64];
        for (i, w) in out.words().into_iter().enumerate() {
            slot[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(Output::read(&slot), out);
        assert_eq!(Output::from_words(out.words()), out);
    }
}
