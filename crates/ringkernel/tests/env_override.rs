//! `RINGKERNEL_BACKEND` overrides `Backend::Auto` (and only Auto). One test in its own
//! process, since it changes the environment.

use ringkernel::prelude::*;
use ringkernel::BACKEND_ENV;

#[tokio::test]
async fn env_overrides_auto_only() {
    std::env::set_var(BACKEND_ENV, "cpu");
    let rt = RingKernel::builder()
        .backend(Backend::Auto)
        .build()
        .await
        .unwrap();
    assert_eq!(rt.backend(), BackendKind::Cpu);
    assert_eq!(rt.selection().env_override.as_deref(), Some("cpu"));
    assert!(
        rt.selection().skipped.is_empty(),
        "an override tries nothing else"
    );
    rt.shutdown().await.unwrap();

    // Ignored when asked to, and by explicit choices.
    std::env::set_var(BACKEND_ENV, "metal");
    let rt = RingKernel::builder()
        .backend(Backend::Auto)
        .use_env(false)
        .build()
        .await
        .unwrap();
    assert_eq!(rt.selection().env_override, None);
    rt.shutdown().await.unwrap();
    let rt = RingKernel::builder()
        .backend(Backend::Cpu)
        .build()
        .await
        .unwrap();
    assert_eq!(rt.backend(), BackendKind::Cpu);
    rt.shutdown().await.unwrap();

    // An explicit (overridden) backend that cannot start is an error, not a fallback.
    if !cfg!(target_vendor = "apple") {
        let r = RingKernel::builder().backend(Backend::Auto).build().await;
        assert!(matches!(
            r,
            Err(Error::BackendUnavailable {
                backend: BackendKind::Metal,
                ..
            })
        ));
    }

    // A backend left out of the build: the override names it, so it is an error that
    // says which feature to enable (for the runtime and for `Device::auto`).
    for kind in [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Metal] {
        if ringkernel::backend_compiled_in(kind) {
            continue;
        }
        std::env::set_var(BACKEND_ENV, kind.as_str());
        let want = format!("not compiled in: enable feature `{}`", kind.as_str());
        match RingKernel::builder().backend(Backend::Auto).build().await {
            Err(Error::BackendUnavailable { backend, reason }) => {
                assert_eq!(backend, kind);
                assert!(reason.starts_with(&want), "{reason}");
            }
            other => panic!(
                "{kind}: expected BackendUnavailable, got {:?}",
                other.map(|rt| rt.backend())
            ),
        }
        match ringkernel::compute::Device::auto() {
            Err(Error::BackendUnavailable { backend, reason }) => {
                assert_eq!(backend, kind);
                assert!(reason.starts_with(&want), "{reason}");
            }
            other => panic!("{kind}: expected BackendUnavailable, got {other:?}"),
        }
    }

    // A value that names no backend.
    std::env::set_var(BACKEND_ENV, "tpu");
    let r = RingKernel::builder().backend(Backend::Auto).build().await;
    match r {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains(BACKEND_ENV), "{msg}"),
        other => panic!(
            "expected InvalidArgument, got {:?}",
            other.map(|rt| rt.backend())
        ),
    }
    std::env::remove_var(BACKEND_ENV);
}
