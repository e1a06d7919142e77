//! Backends as cargo features: a backend left out of the build is refused everywhere
//! with "not compiled in: enable feature `…`", and `Auto` passes over it to the CPU.
//! CI runs this file in the default build (CPU only) and with `--all-features`.

use ringkernel::compute::Device;
use ringkernel::prelude::*;
use ringkernel::{backend_compiled_in, backend_feature, probe_backend, Availability, Skipped};

const GPUS: [BackendKind; 3] = [BackendKind::Metal, BackendKind::Cuda, BackendKind::Wgpu];

/// The reason a backend left out of the build gives.
fn assert_not_compiled(kind: BackendKind, err: Error) {
    let feature = backend_feature(kind).expect("a GPU backend has a feature");
    match err {
        Error::BackendUnavailable { backend, reason } => {
            assert_eq!(backend, kind);
            let want = format!("not compiled in: enable feature `{feature}`");
            assert!(reason.starts_with(&want), "{kind}: {reason}");
        }
        other => panic!("{kind}: expected BackendUnavailable, got {other:?}"),
    }
}

#[test]
fn features_match_the_build() {
    assert!(backend_compiled_in(BackendKind::Cpu));
    assert_eq!(backend_feature(BackendKind::Cpu), None);
    assert_eq!(
        backend_compiled_in(BackendKind::Cuda),
        cfg!(feature = "cuda")
    );
    assert_eq!(
        backend_compiled_in(BackendKind::Wgpu),
        cfg!(feature = "wgpu")
    );
    assert_eq!(
        backend_compiled_in(BackendKind::Metal),
        cfg!(feature = "metal")
    );
    for kind in GPUS {
        assert_eq!(backend_feature(kind), Some(kind.as_str()));
    }
}

#[cfg(feature = "full")]
#[test]
fn full_compiles_every_backend_in() {
    for kind in BackendKind::ALL {
        assert!(backend_compiled_in(kind), "{kind}");
        let p = probe_backend(kind);
        assert!(
            !matches!(p.availability, Availability::NotCompiledIn { .. }),
            "{p}"
        );
    }
}

#[test]
fn probes_say_not_compiled_in_for_backends_left_out() {
    for kind in GPUS {
        let p = probe_backend(kind);
        if backend_compiled_in(kind) {
            match &p.availability {
                Availability::NotCompiledIn { .. } => panic!("{kind} is compiled in: {p}"),
                Availability::Unavailable { reason } => {
                    assert!(!reason.contains("not compiled in"), "{reason}")
                }
                Availability::Available { .. } => {}
            }
        } else {
            assert_eq!(
                p.availability,
                Availability::NotCompiledIn {
                    feature: kind.as_str()
                }
            );
            assert_eq!(p.availability.state(), "not compiled in");
            let line = p.to_string();
            assert!(
                line.contains(&format!("not compiled in, enable feature `{kind}`")),
                "{line}"
            );
            assert!(p.details.is_empty());
        }
    }
}

#[tokio::test]
async fn explicit_backends_left_out_are_refused_by_the_runtime_builder() {
    for kind in GPUS {
        if backend_compiled_in(kind) {
            continue;
        }
        let r = RingKernel::builder().backend(kind.into()).build().await;
        match r {
            Ok(rt) => panic!(
                "{kind} is not compiled in, yet a runtime on {} started",
                rt.backend()
            ),
            Err(e) => assert_not_compiled(kind, e),
        }
    }
}

#[test]
fn compute_devices_left_out_are_refused() {
    for kind in GPUS {
        if backend_compiled_in(kind) {
            continue;
        }
        for r in [Device::of_kind(kind), Device::from_name(kind.as_str())] {
            match r {
                Ok(d) => panic!("{kind} is not compiled in, yet {d} opened"),
                Err(e) => assert_not_compiled(kind, e),
            }
        }
    }
    if !backend_compiled_in(BackendKind::Cuda) {
        assert_not_compiled(BackendKind::Cuda, Device::cuda(1).unwrap_err());
        assert_not_compiled(BackendKind::Cuda, Device::from_name("cuda:1").unwrap_err());
    }
}

/// NCCL collectives on tensors: not compiled in without `cuda`; with it, only CUDA
/// devices are accepted.
#[test]
fn collectives_need_cuda_devices() {
    use ringkernel::compute::Collectives;
    let r = Collectives::new(&[Device::cpu(), Device::cpu()]);
    if backend_compiled_in(BackendKind::Cuda) {
        match r {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("not a CUDA GPU"), "{m}"),
            other => panic!("collectives over CPU devices: {other:?}"),
        }
    } else {
        assert_not_compiled(BackendKind::Cuda, r.unwrap_err());
    }
}

/// The backends a selection skipped as "not compiled in".
fn skipped_as_left_out(skipped: &[Skipped]) -> Vec<BackendKind> {
    let left_out = skipped
        .iter()
        .filter(|s| s.reason.starts_with("not compiled in"));
    left_out.map(|s| s.backend).collect()
}

/// The backends left out of the build that `Auto` tries before `chosen`: it must skip
/// each of them as "not compiled in", and no other.
fn left_out_before(chosen: BackendKind) -> Vec<BackendKind> {
    let before = GPUS.iter().copied().take_while(|k| *k != chosen);
    before.filter(|k| !backend_compiled_in(*k)).collect()
}

#[tokio::test]
async fn auto_passes_over_backends_left_out() {
    // `Backend::Auto` is the builder's default.
    let rt = RingKernel::builder().use_env(false).build().await.unwrap();
    let sel = rt.selection().clone();
    assert_eq!(sel.requested, Backend::Auto);
    assert_eq!(
        skipped_as_left_out(&sel.skipped),
        left_out_before(sel.chosen),
        "{sel}"
    );
    if !GPUS.iter().any(|k| backend_compiled_in(*k)) {
        // The default build: the CPU, after all three GPU backends.
        assert_eq!(sel.chosen, BackendKind::Cpu);
        assert_eq!(sel.skipped.len(), 3, "{sel}");
    }
    rt.shutdown().await.unwrap();

    if std::env::var(ringkernel::BACKEND_ENV).is_ok() {
        return; // Device::auto() would follow the variable (env_override.rs covers it)
    }
    let dev = Device::auto().unwrap();
    assert_eq!(
        skipped_as_left_out(dev.skipped()),
        left_out_before(dev.kind())
    );
    if !GPUS.iter().any(|k| backend_compiled_in(*k)) {
        assert_eq!(dev.kind(), BackendKind::Cpu);
        assert_eq!(dev.skipped().len(), 3);
    }
}
