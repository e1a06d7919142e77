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
