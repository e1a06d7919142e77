//! The cross-backend behavioural suite (`ringkernel_core::conformance`) on persistent
//! CUDA kernels, plus CUDA-specific checks. Tests run one at a time (a shared lock):
//! persistent kernels hold hardware queues, so many test runtimes at once would measure
//! contention, not behaviour.

use ringkernel_core::builtin::{Token, ECHO, STAGE};
use ringkernel_core::conformance;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::{GpuHandler, KernelRegistry};
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_cuda::CudaRuntime;
use std::sync::Mutex;
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

fn with_runtime<F, Fut>(f: F)
where
    F: FnOnce(CudaRuntime) -> Fut,
    Fut: std::future::Future<Output = ringkernel_core::Result<()>>,
{
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let exec = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(async {
        let rt = runtime().await;
        f(rt).await.unwrap();
    });
}

/// A CUDA runtime with the built-in kernels.
async fn runtime() -> CudaRuntime {
    let reg = KernelRegistry::new();
    ringkernel_cuda::register_cuda_builtins(&reg);
    CudaRuntime::with_registry(reg).await.expect("CUDA runtime")
}

ringkernel_core::conformance_tests! {
    runtime: runtime().await,
    scale: conformance::Scale::full(),
    serial: SERIAL,
    ignore: "needs CUDA GPU",
}

/// Terminate really ends the GPU kernel: its stream goes idle and the kernel id is
/// gone from the runtime; shutdown with kernels still running terminates them.
#[test]
#[ignore = "needs CUDA GPU"]
fn terminate_exits_and_shutdown_drains() {
    with_runtime(|rt| async move {
        let a = rt
            .launch(ECHO, LaunchOptions::default().with_name("a"))
            .await?;
        let b = rt
            .launch(ECHO, LaunchOptions::default().with_name("b"))
            .await?;
        for i in 0..100 {
            a.send(Token::new(i, 1.0)).await?;
        }
        let rep = a.terminate().await?;
        assert!(rep.undelivered.is_empty());
        assert_eq!(
            rep.replies_waiting, 100,
            "every drained reply is still receivable"
        );
        assert!(rt.kernel(&"a".into()).is_none());
        b.deactivate().await?;
        for i in 0..7 {
            b.send(Token::new(i, 1.0)).await?;
        }
        let rep = rt.shutdown().await?;
        assert_eq!(rep.kernels, 1);
        assert_eq!(rep.undelivered, 7);
        Ok(())
    });
}

/// A K2K message to a kernel that is gone is dropped and counted (the handler sees
/// NOT_FOUND), never written into freed memory.
#[test]
#[ignore = "needs CUDA GPU"]
fn k2k_to_a_terminated_kernel_is_counted_as_dropped() {
    with_runtime(|rt| async move {
        let s1 = rt
            .launch(STAGE, LaunchOptions::default().with_name("s1"))
            .await?;
        let s2 = rt
            .launch(STAGE, LaunchOptions::default().with_name("s2"))
            .await?;
        let route = [s1.id(), s2.id()];
        let t: Token = {
            s1.send(Token::routed(1, 1.0, &route)?).await?;
            s2.receive_timeout(Duration::from_secs(10)).await?
        };
        assert_eq!((t.hops, t.value), (2, 3.0));
        s2.terminate().await?;
        s1.send(Token::routed(2, 1.0, &route)?).await?;
        let start = std::time::Instant::now();
        while s1.metrics().dropped == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the send to a terminated kernel was not counted"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(s1.try_receive::<Token>()?.is_none());
        Ok(())
    });
}

/// A user handler with its own state and a parallel (non-serial) body: a running sum
/// kept with atomics, replies in input order.
#[test]
#[ignore = "needs CUDA GPU"]
fn user_handler_with_state() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let reg = KernelRegistry::new();
    reg.register_gpu(
        GpuHandler::new("sum")
            .with_cuda(
                r#"
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    if (in_hdr->payload_len != 8) return -3;
    unsigned long long v = *(const unsigned long long*)in_payload;
    unsigned long long before = atomicAdd((unsigned long long*)state, v);
    *(unsigned long long*)out_payload = v * 3ull;
    (void)before; (void)ctx; (void)out_hdr;
    return 1;
}
"#,
            )
            .with_state_bytes(8),
    );
    let exec = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(async {
        let rt = CudaRuntime::with_registry(reg).await.unwrap();
        let k = rt
            .launch("sum", LaunchOptions::default().with_block_size(256))
            .await
            .unwrap();
        let n = 5000u64;
        let mut got = 0u64;
        let mut sent = 0u64;
        while got < n {
            while sent < n && sent - got < 512 {
                let env = ringkernel_core::message::Envelope::from_bytes(77, &sent.to_le_bytes());
                match k.send_envelope(&env).await {
                    Ok(_) => sent += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            let r = k
                .receive_envelope(Some(Duration::from_secs(10)))
                .await
                .unwrap();
            let v = u64::from_le_bytes(r.payload[..8].try_into().unwrap());
            assert_eq!(v, got * 3, "reply {got} out of order");
            got += 1;
        }
        let m = k.metrics();
        assert_eq!((m.processed, m.dropped), (n, 0));
        // A bad payload is dropped and counted, and the kernel goes on.
        k.send_envelope(&ringkernel_core::message::Envelope::from_bytes(
            77,
            &[1, 2, 3],
        ))
        .await
        .unwrap();
        let env = ringkernel_core::message::Envelope::from_bytes(77, &9u64.to_le_bytes());
        k.send_envelope(&env).await.unwrap();
        let r = k
            .receive_envelope(Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(u64::from_le_bytes(r.payload[..8].try_into().unwrap()), 27);
        assert_eq!(k.metrics().dropped, 1);
        rt.shutdown().await.unwrap();
    });
}
