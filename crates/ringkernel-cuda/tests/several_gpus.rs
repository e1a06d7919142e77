//! Several GPUs of one host: NCCL collectives ([`NcclGroup`]) against a host reference,
//! and K2K between persistent kernels on different GPUs ([`CudaRuntimeGroup`]).
//!
//! The GPU tests are ignored ("needs 2 CUDA GPUs"); run with `--include-ignored`, they
//! pass with a printed `SKIPPED` where fewer than two GPUs (or no libnccl, for the NCCL
//! ones) are usable, unless `RINGKERNEL_REQUIRE_GPUS=2` is set (scripts/multigpu.sh
//! sets it), which turns a skip into a failure. They run one at a time: NCCL may wait
//! for running persistent kernels (see the `nccl` module docs).

use ringkernel_core::builtin::{Token, STAGE};
use ringkernel_core::compute::{BufferRef, ComputeBackend, DeviceBuffer};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelHandle, RingKernelRuntime};
use ringkernel_core::util::{rel_error, SplitMix64};
use ringkernel_core::{BackendKind, Error};
use ringkernel_cuda::{CudaRuntime, CudaRuntimeGroup, NcclGroup, Transfer};
use std::sync::Mutex;
use std::time::Duration;

mod common;

static SERIAL: Mutex<()> = Mutex::new(());

/// Whether `n` GPUs are usable; prints `SKIPPED` (or fails, with
/// `RINGKERNEL_REQUIRE_GPUS` at least `n`) when not.
fn have_gpus(n: usize) -> bool {
    let required = std::env::var("RINGKERNEL_REQUIRE_GPUS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let why = match ringkernel_cuda::device_count() {
        Ok(have) if have >= n => return true,
        Ok(have) => format!("{have} CUDA GPU(s), the test needs {n}"),
        Err(e) => e.to_string(),
    };
    assert!(required < n, "RINGKERNEL_REQUIRE_GPUS={required}: {why}");
    println!("SKIPPED: {why}");
    false
}

/// Whether NCCL loads; as [`have_gpus`] otherwise.
fn have_nccl() -> bool {
    match ringkernel_cuda::ensure_nccl() {
        Ok(()) => true,
        Err(e) => {
            let required = std::env::var_os("RINGKERNEL_REQUIRE_GPUS").is_some();
            assert!(!required, "NCCL is required here: {e}");
            println!("SKIPPED: {e}");
            false
        }
    }
}

fn read(c: &ringkernel_cuda::CudaCompute, b: &BufferRef, n: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    c.read(&**b, 0, &mut v).expect("read back");
    v
}

fn assert_close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    assert!(
        got.iter().all(|x| x.is_finite()),
        "{what}: a poisoned (NaN) element was never written"
    );
    let e = rel_error(got, want);
    assert!(e <= 1e-6, "{what}: relative error {e:.3e}");
}

/// all_reduce (out of place and in place), all_gather, broadcast and send/recv on two
/// GPUs, on awkward sizes, against an f64 host reference; outputs are poisoned (NaN)
/// first.
#[test]
#[ignore = "needs 2 CUDA GPUs"]
fn nccl_collectives_match_the_host_reference() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_gpus(2) || !have_nccl() {
        return;
    }
    let group = NcclGroup::on_devices(&[0, 1]).expect("NCCL group on GPUs 0 and 1");
    println!(
        "NCCL {} on {:?}",
        ringkernel_cuda::nccl::nccl_version().unwrap(),
        group
    );
    let c = group.computes();
    let n = group.len();
    let mut rng = SplitMix64::new(0x1616);
    for len in [1usize, 3, 1000, 65_537, (1 << 20) + 7] {
        let inputs: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(len, -4.0, 4.0)).collect();
        let up = |r: usize, d: &[f32]| c[r].upload(d).unwrap();
        let poison = |r: usize, m: usize| up(r, &vec![f32::NAN; m]);
        let send: Vec<BufferRef> = (0..n).map(|r| up(r, &inputs[r])).collect();
        let send_refs: Vec<&dyn DeviceBuffer> = send.iter().map(|b| &**b).collect();

        // all_reduce, out of place.
        let sum: Vec<f64> = (0..len)
            .map(|i| inputs.iter().map(|v| f64::from(v[i])).sum())
            .collect();
        let recv: Vec<BufferRef> = (0..n).map(|r| poison(r, len)).collect();
        let recv_refs: Vec<&dyn DeviceBuffer> = recv.iter().map(|b| &**b).collect();
        group.all_reduce_sum(&send_refs, &recv_refs, len).unwrap();
        for r in 0..n {
            assert_close(
                &format!("all_reduce len {len} rank {r}"),
                &read(&c[r], &recv[r], len),
                &sum,
            );
        }

        // all_reduce in place (the inputs are consumed).
        let inplace: Vec<BufferRef> = (0..n).map(|r| up(r, &inputs[r])).collect();
        let inplace_refs: Vec<&dyn DeviceBuffer> = inplace.iter().map(|b| &**b).collect();
        group.all_reduce_sum_in_place(&inplace_refs, len).unwrap();
        for r in 0..n {
            assert_close(
                &format!("in-place all_reduce len {len} rank {r}"),
                &read(&c[r], &inplace[r], len),
                &sum,
            );
        }

        // all_gather: rank i's block at i * len.
        let gathered: Vec<f64> = inputs
            .iter()
            .flat_map(|v| v.iter().map(|&x| f64::from(x)))
            .collect();
        let out: Vec<BufferRef> = (0..n).map(|r| poison(r, len * n)).collect();
        let out_refs: Vec<&dyn DeviceBuffer> = out.iter().map(|b| &**b).collect();
        group.all_gather(&send_refs, &out_refs, len).unwrap();
        for r in 0..n {
            assert_close(
                &format!("all_gather len {len} rank {r}"),
                &read(&c[r], &out[r], len * n),
                &gathered,
            );
        }

        // broadcast from the last rank: the others' buffers are poisoned.
        let root = n - 1;
        let bc: Vec<BufferRef> = (0..n)
            .map(|r| {
                if r == root {
                    up(r, &inputs[r])
                } else {
                    poison(r, len)
                }
            })
            .collect();
        let bc_refs: Vec<&dyn DeviceBuffer> = bc.iter().map(|b| &**b).collect();
        group.broadcast(root, &bc_refs, len).unwrap();
        let want: Vec<f64> = inputs[root].iter().map(|&x| f64::from(x)).collect();
        for r in 0..n {
            assert_close(
                &format!("broadcast len {len} rank {r}"),
                &read(&c[r], &bc[r], len),
                &want,
            );
        }

        // send/recv both ways at once: 0 -> 1 and 1 -> 0.
        let dst: Vec<BufferRef> = (0..n).map(|r| poison(r, len)).collect();
        group
            .p2p(&[
                Transfer {
                    from: 0,
                    src: &*send[0],
                    to: 1,
                    dst: &*dst[1],
                    len,
                },
                Transfer {
                    from: 1,
                    src: &*send[1],
                    to: 0,
                    dst: &*dst[0],
                    len,
                },
            ])
            .unwrap();
        for (to, from) in [(1usize, 0usize), (0, 1)] {
            let want: Vec<f64> = inputs[from].iter().map(|&x| f64::from(x)).collect();
            assert_close(
                &format!("send len {len} {from} -> {to}"),
                &read(&c[to], &dst[to], len),
                &want,
            );
        }
    }
}

/// Wrong buffer counts, short buffers, buffers of the wrong GPU and bad ranks are
/// clear errors, before anything is issued.
#[test]
#[ignore = "needs 2 CUDA GPUs"]
fn nccl_rejects_bad_arguments() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_gpus(2) || !have_nccl() {
        return;
    }
    assert!(matches!(
        NcclGroup::on_devices(&[0, 0]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        NcclGroup::on_devices(&[]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        NcclGroup::on_devices(&[0, 1 << 20]),
        Err(Error::InvalidArgument(_))
    ));
    let group = NcclGroup::on_devices(&[0, 1]).unwrap();
    let c = group.computes();
    let a = c[0].upload(&[1.0; 10]).unwrap();
    let b = c[1].upload(&[2.0; 10]).unwrap();
    let short = c[1].upload(&[2.0; 9]).unwrap();
    let (a, b, short): (&dyn DeviceBuffer, &dyn DeviceBuffer, &dyn DeviceBuffer) =
        (&*a, &*b, &*short);
    let err = |r: ringkernel_core::Result<()>| r.expect_err("must be refused");
    assert!(matches!(
        err(group.all_reduce_sum_in_place(&[a], 10)),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(
        err(group.all_reduce_sum_in_place(&[a, short], 10)),
        Error::ShapeMismatch(_)
    ));
    // Rank 0's buffer on rank 1's GPU.
    assert!(matches!(
        err(group.all_reduce_sum_in_place(&[b, a], 10)),
        Error::Device(_)
    ));
    // all_gather needs len × ranks at every receiver, and distinct buffers.
    assert!(matches!(
        err(group.all_gather(&[a, b], &[a, b], 5)),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(
        err(group.all_gather(&[a, short], &[a, b], 6)),
        Error::ShapeMismatch(_) | Error::InvalidArgument(_)
    ));
    assert!(matches!(
        err(group.broadcast(2, &[a, b], 10)),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(
        err(group.send(0, a, 0, a, 10)),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(
        err(group.send(0, a, 1, short, 10)),
        Error::ShapeMismatch(_)
    ));
    assert!(matches!(
        err(group.send(0, a, 2, b, 10)),
        Error::InvalidArgument(_)
    ));
    // Nothing was issued: the buffers are unchanged.
    let mut v = [0.0f32; 10];
    c[1].read(b, 0, &mut v).unwrap();
    assert_eq!(v, [2.0; 10]);
}

fn on_group<F, Fut>(f: F)
where
    F: FnOnce(CudaRuntimeGroup) -> Fut,
    Fut: std::future::Future<Output = ringkernel_core::Result<()>>,
{
    let exec = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(async {
        let group = CudaRuntimeGroup::new(KernelRegistry::new(), &[0, 1])
            .await
            .expect("runtime group on GPUs 0 and 1");
        f(group).await.unwrap();
    });
}

/// Sends `count` tokens routed through `route` into its first stage, in chunks, and
/// checks the replies of the last stage: every token, in order, each stage's +1.
async fn pipeline(
    first: &KernelHandle,
    last: &KernelHandle,
    route: &[ringkernel_core::runtime::KernelId],
    count: u64,
) -> ringkernel_core::Result<()> {
    let chunk = 111u64;
    let mut next = 0u64;
    while next < count {
        let end = (next + chunk).min(count);
        for i in next..end {
            first.send(Token::routed(i, i as f64 * 0.5, route)?).await?;
        }
        for i in next..end {
            let t: Token = last.receive_timeout_as(Duration::from_secs(10)).await?;
            assert_eq!(t.id, i, "tokens arrive in order");
            assert_eq!(t.hops as usize, route.len());
            assert_eq!(t.value, i as f64 * 0.5 + route.len() as f64);
        }
        next = end;
    }
    Ok(())
}

/// rk.stage pipelines across the GPUs, K2K on the GPU only: 0 -> 1, 1 -> 0 and
/// 0 -> 1 -> 0; the kernels share one id space, and the metrics count every hop.
#[test]
#[ignore = "needs 2 CUDA GPUs"]
fn stage_pipelines_cross_gpus_both_ways() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_gpus(2) {
        return;
    }
    on_group(|group| async move {
        println!("peer link 0 -> 1: {:?}", ringkernel_cuda::peer_link(0, 1)?);
        let (g0, g1) = (group.runtime(0)?, group.runtime(1)?);
        let a = g0
            .launch(STAGE, LaunchOptions::default().with_name("a"))
            .await?;
        let b = g1
            .launch(STAGE, LaunchOptions::default().with_name("b"))
            .await?;
        let c = g0
            .launch(STAGE, LaunchOptions::default().with_name("c"))
            .await?;
        // One id and name space over both GPUs.
        assert!(a.id() != b.id() && b.id() != c.id() && a.id() != c.id());
        assert!(
            g1.kernel(&"a".into()).is_some(),
            "a is known to GPU 1's runtime"
        );
        assert!(g0.device_info().contains("device 0"));
        assert!(g1.device_info().contains("device 1"));
        pipeline(&a, &b, &[a.id(), b.id()], 777).await?;
        pipeline(&b, &a, &[b.id(), a.id()], 777).await?;
        pipeline(&a, &c, &[a.id(), b.id(), c.id()], 500).await?;
        // Stage a handled 777 + 777 + 500 tokens (first, last and first stage), b
        // 777 + 777 + 500, c 500: none was dropped.
        let (ma, mb, mc) = (a.metrics(), b.metrics(), c.metrics());
        assert_eq!((ma.processed, ma.dropped), (2054, 0), "{ma:?}");
        assert_eq!((mb.processed, mb.dropped), (2054, 0), "{mb:?}");
        assert_eq!((mc.processed, mc.dropped), (500, 0), "{mc:?}");
        let report = group.shutdown().await?;
        assert_eq!(report.kernels, 3);
        Ok(())
    });
}

/// A K2K send to a kernel on the other GPU that has terminated finds no route (it was
/// withdrawn on every GPU): the sender drops the message and counts it.
#[test]
#[ignore = "needs 2 CUDA GPUs"]
fn k2k_to_a_terminated_kernel_on_another_gpu_is_dropped() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_gpus(2) {
        return;
    }
    on_group(|group| async move {
        let s1 = group
            .runtime(0)?
            .launch(STAGE, LaunchOptions::default().with_name("s1"))
            .await?;
        let s2 = group
            .runtime(1)?
            .launch(STAGE, LaunchOptions::default().with_name("s2"))
            .await?;
        common::k2k_to_a_terminated_kernel_is_dropped(&s1, &s2).await
    });
}

/// Bad groups and missing devices are clear errors.
#[test]
#[ignore = "needs 2 CUDA GPUs"]
fn group_arguments_are_checked() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_gpus(2) {
        return;
    }
    let exec = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(async {
        for bad in [&[][..], &[0, 0], &[0, 1 << 20]] {
            match CudaRuntimeGroup::new(KernelRegistry::new(), bad).await {
                Err(Error::InvalidArgument(m)) => println!("{bad:?}: {m}"),
                other => panic!("group {bad:?}: expected InvalidArgument, got {other:?}"),
            }
        }
        assert!(matches!(
            ringkernel_cuda::peer_link(1, 1),
            Err(Error::InvalidArgument(_))
        ));
        let group = CudaRuntimeGroup::new(KernelRegistry::new(), &[1, 0])
            .await
            .unwrap();
        assert_eq!(group.ordinals(), &[1, 0]);
        assert!(group.runtime(0).unwrap().device_info().contains("device 1"));
        assert!(matches!(group.runtime(2), Err(Error::InvalidArgument(_))));
    });
}

/// A runtime on any GPU; a missing one is `InvalidArgument` naming the count.
#[test]
#[ignore = "needs CUDA GPU"]
fn runtimes_open_on_every_gpu_and_refuse_missing_ones() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_gpus(1) {
        return;
    }
    let n = ringkernel_cuda::device_count().unwrap();
    let exec = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(async {
        for o in 0..n {
            let rt = CudaRuntime::on_device(KernelRegistry::new(), o)
                .await
                .unwrap();
            assert!(rt.device_info().contains(&format!("device {o}")));
        }
        match CudaRuntime::on_device(KernelRegistry::new(), n).await {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains(&format!("{n} device(s) present")), "{m}")
            }
            other => panic!("device {n} of {n}: {other:?}"),
        }
    });
}

/// Runs everywhere: without a driver every multi-GPU entry point is
/// `BackendUnavailable`, and NCCL never panics (present or not).
#[test]
fn multi_gpu_entry_points_never_panic() {
    let exec = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if !ringkernel_cuda::driver_library_present() {
        let unavailable = |what: &str, r: ringkernel_core::Result<()>| match r {
            Err(Error::BackendUnavailable {
                backend: BackendKind::Cuda,
                reason,
            }) => assert!(!reason.is_empty(), "{what}"),
            other => panic!("{what} without a driver: {other:?}"),
        };
        unavailable("ensure_nccl", ringkernel_cuda::ensure_nccl());
        unavailable(
            "NcclGroup::on_devices",
            NcclGroup::on_devices(&[0, 1]).map(|_| ()),
        );
        unavailable(
            "CudaRuntimeGroup::new",
            exec.block_on(CudaRuntimeGroup::new(KernelRegistry::new(), &[0, 1]))
                .map(|_| ()),
        );
        unavailable("peer_link", ringkernel_cuda::peer_link(0, 1).map(|_| ()));
    } else {
        match ringkernel_cuda::ensure_nccl() {
            Ok(()) => println!("NCCL {}", ringkernel_cuda::nccl::nccl_version().unwrap()),
            Err(Error::BackendUnavailable { reason, .. }) => println!("no NCCL: {reason}"),
            Err(e) => panic!("ensure_nccl: {e}"),
        }
    }
}
