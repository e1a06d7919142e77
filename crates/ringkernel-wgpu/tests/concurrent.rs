//! Several wgpu runtimes in one process, and one runtime used from many tasks.
//!
//! On an NVIDIA H200 through Vulkan the runtime tests used to hang when several ran at
//! once (`--test-threads 4`). Every test here runs under a watchdog, so a hang fails
//! with a message instead of stalling the suite. Runs on lavapipe in CI; set
//! RINGKERNEL_WGPU_TEST_ADAPTER=hardware to run on a GPU.

use ringkernel_core::builtin::{Token, COUNTER, ECHO, STAGE};
use ringkernel_core::compute::{BinaryOp, ComputeBackend};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelHandle, RingKernelRuntime};
use ringkernel_core::{Error, Result};
use ringkernel_wgpu::{AdapterSelection, GpuContext, WgpuCompute, WgpuRuntime};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn adapter() -> AdapterSelection {
    match std::env::var("RINGKERNEL_WGPU_TEST_ADAPTER") {
        Ok(s) => AdapterSelection::parse(&s),
        Err(_) if std::env::var("RINGKERNEL_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            AdapterSelection::Hardware
        }
        Err(_) => AdapterSelection::Software,
    }
}

/// Runs `f` on its own thread and fails the test if it does not finish in `limit`.
fn watchdog(what: &str, limit: Duration, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => worker.join().unwrap(),
        // The worker panicked: re-raise its panic.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = worker.join() {
                std::panic::resume_unwind(p)
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: no progress for {limit:?} (hang)")
        }
    }
}

fn tokio_rt(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

/// Echo calls from `tasks` tasks at once, each checking its own replies.
async fn calls(k: &KernelHandle, tasks: u64, per_task: u64) -> Result<()> {
    let mut joins = Vec::new();
    for t in 0..tasks {
        let k = k.clone();
        joins.push(tokio::spawn(async move {
            for i in 0..per_task {
                let id = t * 1_000_000 + i;
                let r: Token = k.call(Token::new(id, id as f64), WAIT).await?;
                if (r.id, r.value, r.hops) != (id, 2.0 * id as f64, 1) {
                    return Err(Error::Device(format!("call {id}: wrong reply {r:?}")));
                }
            }
            Ok::<_, Error>(())
        }));
    }
    for j in joins {
        j.await.map_err(|e| Error::Device(e.to_string()))??;
    }
    Ok(())
}

/// Everything one runtime does in the tests: correlated calls from several tasks, a
/// K2K pipeline, an in-order counter; then checks the metrics and shuts down.
async fn workload(rt: &WgpuRuntime, tag: u64) -> Result<()> {
    let echo = rt
        .launch(ECHO, LaunchOptions::default().with_queue_capacity(64))
        .await?;
    calls(&echo, 4, 25).await?;

    let opts = LaunchOptions::default().with_queue_capacity(32);
    let a = rt
        .launch(STAGE, opts.clone().with_name(format!("a{tag}")))
        .await?;
    let b = rt
        .launch(STAGE, opts.clone().with_name(format!("b{tag}")))
        .await?;
    let route = [a.id().0, b.id().0];
    let n = 200u64;
    let sender = {
        let a = a.clone();
        tokio::spawn(async move {
            for i in 0..n {
                let mut t = Token::new(i, i as f64);
                t.route[..2].copy_from_slice(&route);
                t.route_len = 2;
                a.send(t).await?;
            }
            Ok::<_, Error>(())
        })
    };
    for i in 0..n {
        let t: Token = b.receive_timeout_as(WAIT).await?;
        if (t.id, t.hops, t.value) != (i, 2, i as f64 + 2.0) {
            return Err(Error::Device(format!("pipeline token {i}: got {t:?}")));
        }
    }
    sender.await.map_err(|e| Error::Device(e.to_string()))??;

    let c = rt.launch(COUNTER, LaunchOptions::default()).await?;
    for i in 0..50u64 {
        c.send(Token::new(i, 0.0)).await?;
    }
    for i in 0..50u64 {
        let t: Token = c.receive_timeout_as(WAIT).await?;
        if (t.id, t.value) != (i, (i + 1) as f64) {
            return Err(Error::Device(format!("counter {i}: got {t:?}")));
        }
    }

    let (me, ma, mb, mc) = (echo.metrics(), a.metrics(), b.metrics(), c.metrics());
    let counts = |m: &ringkernel_core::telemetry::KernelMetrics| {
        (m.received, m.processed, m.dropped, m.emitted)
    };
    assert_eq!(counts(&me), (100, 100, 0, 100), "echo of runtime {tag}");
    assert_eq!(counts(&ma), (n, n, 0, n), "stage a of runtime {tag}");
    assert_eq!(counts(&mb), (n, n, 0, n), "stage b of runtime {tag}");
    assert_eq!(counts(&mc), (50, 50, 0, 50), "counter of runtime {tag}");
    assert_eq!(me.latency.count, 100, "one latency sample per message");
    rt.shutdown().await?;
    Ok(())
}

/// Runs [`workload`] on `n` threads at once, each on the runtime `make(tag)` returns.
fn on_threads(n: u64, make: impl Fn(u64) -> WgpuRuntime + Send + Sync + 'static) {
    let make = Arc::new(make);
    let threads: Vec<_> = (0..n)
        .map(|tag| {
            let make = make.clone();
            std::thread::spawn(move || {
                let rt = make(tag);
                tokio_rt(2)
                    .block_on(workload(&rt, tag))
                    .unwrap_or_else(|e| panic!("runtime {tag}: {e}"));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn eight_runtimes_at_once() {
    watchdog("8 runtimes", Duration::from_secs(240), || {
        on_threads(8, |_| {
            WgpuRuntime::with_selection(KernelRegistry::new(), adapter())
                .expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)")
        });
    });
}

#[test]
fn one_runtime_from_many_tasks() {
    watchdog("one runtime, many tasks", Duration::from_secs(240), || {
        tokio_rt(4).block_on(async {
            let rt =
                Arc::new(WgpuRuntime::with_selection(KernelRegistry::new(), adapter()).unwrap());
            // Tasks launch their own kernels and share one, all at once.
            let shared = rt
                .launch(ECHO, LaunchOptions::default().with_name("shared"))
                .await
                .unwrap();
            let mut joins = Vec::new();
            for t in 0..16u64 {
                let (rt, shared) = (rt.clone(), shared.clone());
                joins.push(tokio::spawn(async move {
                    let own = rt
                        .launch(ECHO, LaunchOptions::default().with_name(format!("own{t}")))
                        .await?;
                    calls(&own, 2, 20).await?;
                    calls(&shared, 1, 20).await?;
                    own.terminate().await?;
                    Ok::<_, Error>(())
                }));
            }
            for j in joins {
                j.await.unwrap().unwrap();
            }
            let m = shared.metrics();
            assert_eq!((m.received, m.processed, m.dropped), (320, 320, 0));
            rt.shutdown().await.unwrap();
        });
    });
}

/// Runtimes on devices of their own, one of them sharing its device with a
/// `WgpuCompute` that polls the device from its own thread at the same time (its polls
/// may run the runtime's map callbacks).
#[test]
fn own_devices_and_a_compute_backend_on_the_same_device() {
    watchdog("own devices + compute", Duration::from_secs(240), || {
        let ctx = GpuContext::new(&adapter()).unwrap();
        let compute = WgpuCompute::with_context(ctx.clone());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ops = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let n = 4096;
                let a = compute.upload(&vec![1.5f32; n]).unwrap();
                let out = compute.upload(&vec![0f32; n]).unwrap();
                let mut rounds = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 5 {
                    compute.binary(BinaryOp::Add, &*a, &*a, &*out, n).unwrap();
                    let mut v = vec![0f32; n];
                    compute.read(&*out, 0, &mut v).unwrap();
                    assert!(v.iter().all(|x| *x == 3.0));
                    rounds += 1;
                }
                rounds
            })
        };
        on_threads(4, move |tag| {
            let ctx = if tag == 0 {
                ctx.clone()
            } else {
                GpuContext::new(&adapter()).unwrap()
            };
            WgpuRuntime::with_context(KernelRegistry::new(), ctx)
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(ops.join().unwrap() >= 5);
    });
}

/// A validation error that another user of the device caused outside an error scope
/// (it lands in the context's error list) must neither stop the runtime's passes nor
/// be taken from that user. Before the shared drain engine, the runtime's round
/// returned early on it with its readback buffers still mapped, and its kernels never
/// advanced again (a hang at the next `terminate`).
#[test]
fn an_error_elsewhere_on_the_device_does_not_stop_the_runtime() {
    watchdog("error elsewhere", Duration::from_secs(120), || {
        let ctx = GpuContext::new(&adapter()).unwrap();
        let rt = WgpuRuntime::with_context(KernelRegistry::new(), ctx.clone());
        tokio_rt(2).block_on(async {
            let k = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();
            calls(&k, 1, 5).await.unwrap();
            let buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("misused"),
                size: 16,
                usage: wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            // Offset 2 is not 4-aligned: a validation error, not captured by any scope.
            ctx.queue.write_buffer(&buf, 2, &[0u8; 4]);
            ctx.queue.submit([]);
            calls(&k, 2, 20).await.unwrap();
            rt.shutdown().await.unwrap();
        });
        assert!(
            matches!(ctx.take_error(), Err(Error::Device(_))),
            "the error stays with the context's other users"
        );
    });
}
