//! The facade: backend selection, built-in registration, the runtime wrapper, bad input.

use ringkernel::prelude::*;
use ringkernel::{probe_backend, probe_backends, Availability};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn cpu() -> RingKernelBuilder {
    RingKernel::builder().backend(Backend::Cpu)
}

#[tokio::test]
async fn auto_prefers_gpus_and_falls_back_to_cpu_with_reasons() {
    let rt = RingKernel::builder()
        .backend(Backend::Auto)
        .use_env(false)
        .build()
        .await
        .unwrap();
    let sel = rt.selection().clone();
    assert_eq!(sel.requested, Backend::Auto);
    assert_eq!(sel.env_override, None);
    assert_eq!(sel.chosen, rt.backend());
    // Skipped backends come in Auto's order, each with a reason, up to the chosen one.
    let order = [BackendKind::Metal, BackendKind::Cuda, BackendKind::Wgpu];
    let tried = order
        .iter()
        .position(|b| *b == sel.chosen)
        .unwrap_or(order.len());
    assert_eq!(
        sel.skipped.iter().map(|s| s.backend).collect::<Vec<_>>(),
        order[..tried].to_vec()
    );
    for s in &sel.skipped {
        assert!(
            !s.reason.trim().is_empty(),
            "{} skipped without a reason",
            s.backend
        );
    }
    if sel.chosen == BackendKind::Cpu {
        assert_eq!(
            sel.skipped.len(),
            3,
            "a CPU fallback explains all three GPU backends"
        );
    }
    // The reasons show up in the one-line description too.
    let text = sel.to_string();
    for s in &sel.skipped {
        assert!(text.contains(&s.reason), "{text}");
    }
    // Metal never runs off Apple.
    if !cfg!(target_vendor = "apple") {
        assert_ne!(sel.chosen, BackendKind::Metal);
        assert!(sel.skipped.iter().any(|s| s.backend == BackendKind::Metal));
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test]
async fn explicit_cuda_is_unavailable_without_a_driver() {
    let probe = probe_backend(BackendKind::Cuda);
    let r = RingKernel::builder().backend(Backend::Cuda).build().await;
    match (&probe.availability, r) {
        (Availability::Unavailable { .. }, Err(Error::BackendUnavailable { backend, reason })) => {
            assert_eq!(backend, BackendKind::Cuda);
            assert!(!reason.is_empty());
        }
        (
            Availability::NotCompiledIn { feature },
            Err(Error::BackendUnavailable { backend, reason }),
        ) => {
            assert_eq!((backend, *feature), (BackendKind::Cuda, "cuda"));
            assert!(
                reason.starts_with("not compiled in: enable feature `cuda`"),
                "{reason}"
            );
        }
        (Availability::Available { .. }, Ok(rt)) => {
            // A machine with an NVIDIA driver and GPU.
            assert_eq!(rt.backend(), BackendKind::Cuda);
            assert!(rt.selection().skipped.is_empty());
            rt.shutdown().await.unwrap();
        }
        (a, r) => panic!(
            "probe said {a:?} but build gave {:?}",
            r.map(|rt| rt.backend())
        ),
    }
}

#[cfg(not(target_vendor = "apple"))]
#[tokio::test]
async fn explicit_metal_is_unavailable_off_apple() {
    match RingKernel::builder().backend(Backend::Metal).build().await {
        Err(Error::BackendUnavailable { backend, reason }) => {
            assert_eq!(backend, BackendKind::Metal);
            assert!(!reason.is_empty());
        }
        other => panic!(
            "expected BackendUnavailable, got {:?}",
            other.map(|rt| rt.backend())
        ),
    }
    assert!(!probe_backend(BackendKind::Metal).is_available());
}

#[test]
fn probes_cover_every_backend_and_the_cpu_is_there() {
    let probes = probe_backends();
    assert_eq!(
        probes.iter().map(|p| p.backend).collect::<Vec<_>>(),
        BackendKind::ALL.to_vec()
    );
    for p in &probes {
        match &p.availability {
            Availability::Available { device } => assert!(!device.is_empty()),
            Availability::Unavailable { reason } => assert!(!reason.is_empty()),
            Availability::NotCompiledIn { feature } => {
                assert_eq!(Some(*feature), ringkernel::backend_feature(p.backend));
                assert!(!ringkernel::backend_compiled_in(p.backend));
            }
        }
        assert!(p.to_string().starts_with(p.backend.as_str()));
    }
    assert!(probes
        .iter()
        .any(|p| p.backend == BackendKind::Cpu && p.is_available()));
}

#[test]
fn backend_names_parse_and_print() {
    for (s, b) in [
        ("auto", Backend::Auto),
        ("CPU", Backend::Cpu),
        ("cuda", Backend::Cuda),
        ("webgpu", Backend::Wgpu),
        ("wgpu", Backend::Wgpu),
        ("metal", Backend::Metal),
    ] {
        assert_eq!(s.parse::<Backend>().unwrap(), b);
    }
    assert!(matches!(
        "vulkan".parse::<Backend>(),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(Backend::Wgpu.to_string(), "wgpu");
    assert_eq!(Backend::Auto.kind(), None);
    assert_eq!(Backend::from(BackendKind::Cuda), Backend::Cuda);
}

#[tokio::test]
async fn builtins_are_registered_on_every_runtime() {
    let rt = cpu().build().await.unwrap();
    assert_eq!(rt.backend(), BackendKind::Cpu);
    assert!(!rt.device_info().is_empty());
    let echo = rt
        .launch(builtin::ECHO, LaunchOptions::default())
        .await
        .unwrap();
    let r: Token = echo.call(Token::new(1, 4.0), WAIT).await.unwrap();
    assert_eq!((r.value, r.hops), (8.0, 1));
    let counter = rt
        .launch(builtin::COUNTER, LaunchOptions::default())
        .await
        .unwrap();
    for n in 1..=3 {
        let r: Token = counter.call(Token::new(n, 0.0), WAIT).await.unwrap();
        assert_eq!(r.value, n as f64);
    }
    let stage = rt
        .launch(builtin::STAGE, LaunchOptions::default())
        .await
        .unwrap();
    let r: Token = stage
        .call(Token::routed(5, 1.0, &[stage.id()]).unwrap(), WAIT)
        .await
        .unwrap();
    assert_eq!((r.value, r.hops), (2.0, 1));
    let report = rt.shutdown().await.unwrap();
    assert_eq!(report.kernels, 3);
    // A second shutdown has nothing left to do.
    assert_eq!(rt.shutdown().await.unwrap().kernels, 0);
}

#[tokio::test]
async fn user_handlers_are_never_replaced_by_builtins() {
    let reg = KernelRegistry::new();
    reg.register_fn(
        builtin::ECHO,
        |_ctx: &mut KernelContext<'_>, mut t: Token| {
            t.value *= 3.0;
            Some(t)
        },
    );
    let rt = cpu().registry(reg.clone()).build().await.unwrap();
    let echo = rt
        .launch(builtin::ECHO, LaunchOptions::default())
        .await
        .unwrap();
    let r: Token = echo.call(Token::new(1, 2.0), WAIT).await.unwrap();
    assert_eq!(r.value, 6.0, "the user's rk.echo stays");

    // The registry is shared: a handler registered after build can be launched.
    reg.register_fn("late", |_ctx: &mut KernelContext<'_>, t: Token| Some(t));
    assert!(rt.registry().cpu_names().iter().any(|n| n == "late"));
    let late = rt.launch("late", LaunchOptions::default()).await.unwrap();
    let r: Token = late.call(Token::new(9, 1.0), WAIT).await.unwrap();
    assert_eq!(r.id, 9);
    rt.shutdown().await.unwrap();
}

#[tokio::test]
async fn builder_registrations_land_in_the_given_registry_whatever_the_order() {
    let reg = KernelRegistry::new();
    let rt = cpu()
        .register_fn("before", |_ctx: &mut KernelContext<'_>, t: Token| Some(t))
        .registry(reg.clone())
        .register_cpu("after", || {
            Box::new(ringkernel::core::registry::handler_fn(
                |_ctx: &mut KernelContext<'_>, t: Token| Some(t),
            ))
        })
        .register_gpu(GpuHandler::new("gpu.only").with_wgsl("fn handle() {}"))
        .build()
        .await
        .unwrap();
    let names = reg.cpu_names();
    for n in [
        "before",
        "after",
        builtin::ECHO,
        builtin::STAGE,
        builtin::COUNTER,
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    assert!(reg.gpu("gpu.only").is_ok());
    rt.shutdown().await.unwrap();
}

#[tokio::test]
async fn lookups_subscriptions_and_publish_go_through_the_facade() {
    let rt = cpu().build().await.unwrap();
    let k = rt
        .launch(builtin::COUNTER, LaunchOptions::default().with_name("c"))
        .await
        .unwrap();
    assert_eq!(rt.kernel("c").unwrap().id(), k.id());
    assert_eq!(rt.kernel(k.id()).unwrap().name(), "c");
    assert!(rt.kernel("nope").is_none());

    let sub = rt.subscribe(k.id(), "a/+").unwrap();
    let r = rt.publish("a/b", &Token::new(1, 0.0)).unwrap();
    assert_eq!(r.delivered, 1);
    let t: Token = k.receive_timeout_as(WAIT).await.unwrap();
    assert_eq!((t.id, t.value), (1, 1.0));
    let env = Envelope::new(&Token::new(2, 0.0));
    assert_eq!(rt.publish_envelope("a/c", &env).unwrap().delivered, 1);
    let t: Token = k.receive_timeout_as(WAIT).await.unwrap();
    assert_eq!(t.id, 2);
    rt.unsubscribe(sub).unwrap();
    assert_eq!(rt.publish("a/b", &Token::new(3, 0.0)).unwrap().delivered, 0);

    // Counters are updated just after the handler returns: wait for the second one.
    let deadline = std::time::Instant::now() + WAIT;
    while rt.metrics().total_processed < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let m = rt.metrics();
    assert_eq!(m.backend, BackendKind::Cpu);
    assert_eq!(m.kernels.len(), 1);
    assert_eq!(m.total_processed, 2);

    // The host clock moves forward with every send and reply.
    let before = rt.clock().peek();
    let _: Token = k.call(Token::new(4, 0.0), WAIT).await.unwrap();
    assert!(rt.clock().peek() > before);
    rt.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_is_a_typed_error() {
    let rt = cpu().build().await.unwrap();
    assert!(matches!(
        rt.launch("missing", LaunchOptions::default()).await,
        Err(Error::KernelNotFound(_))
    ));
    assert!(matches!(
        rt.launch(
            builtin::ECHO,
            LaunchOptions::default().with_queue_capacity(1000)
        )
        .await,
        Err(Error::InvalidArgument(_))
    ));
    let k = rt
        .launch(builtin::ECHO, LaunchOptions::default().with_name("one"))
        .await
        .unwrap();
    assert!(matches!(
        rt.launch(builtin::ECHO, LaunchOptions::default().with_name("one"))
            .await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        rt.subscribe(KernelId(9999), "x"),
        Err(Error::KernelNotFound(_))
    ));
    assert!(matches!(
        rt.subscribe(k.id(), "a/#/b"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        rt.publish("a/+", &Token::new(0, 0.0)),
        Err(Error::InvalidArgument(_))
    ));
    // The kernel is unharmed.
    let r: Token = k.call(Token::new(1, 1.0), WAIT).await.unwrap();
    assert_eq!(r.value, 2.0);
    rt.shutdown().await.unwrap();
}

#[tokio::test]
async fn handle_futures_can_be_spawned() {
    fn assert_send<T: Send>(t: T) -> T {
        t
    }
    let rt = cpu().build().await.unwrap();
    let k = rt
        .launch(builtin::ECHO, LaunchOptions::default())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..8u64)
        .map(|i| {
            let k = k.clone();
            tokio::spawn(assert_send(async move {
                k.call::<Token, Token>(Token::new(i, i as f64), WAIT).await
            }))
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap().unwrap();
        assert_eq!((r.id, r.value), (i as u64, 2.0 * i as f64));
    }
    let rt2 = rt.clone();
    let launched = tokio::spawn(assert_send(async move {
        rt2.launch(builtin::COUNTER, LaunchOptions::default()).await
    }));
    assert!(launched.await.unwrap().is_ok());
    rt.shutdown().await.unwrap();
}
