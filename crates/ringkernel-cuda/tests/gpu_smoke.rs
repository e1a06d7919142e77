//! First things to check on a GPU machine: the probe, NVRTC compiling for the
//! device's architecture, the shared binary layouts as the device sees them, one op,
//! and one message through a persistent kernel.

use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::compute::{BinaryOp, ComputeBackend};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_core::util::SplitMix64;
use std::sync::Mutex;
use std::time::Duration;

/// The tests of this file run one at a time: a module load (layout kernel, compute,
/// handler compile) is refused while another test's persistent kernels run.
static GPU: Mutex<()> = Mutex::new(());

fn gpu() -> std::sync::MutexGuard<'static, ()> {
    GPU.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
#[ignore = "needs CUDA GPU"]
fn probe_describes_the_gpu() {
    let _gpu = gpu();
    let desc = ringkernel_cuda::probe().expect("probe");
    println!("{desc}");
    let info = ringkernel_cuda::device_info(0).unwrap();
    assert!(
        info.cc.0 >= 7,
        "persistent kernels need sm_70+ (acquire/release PTX, __nanosleep)"
    );
    assert!(info.total_mem > 0 && info.sm_count > 0);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn layout_matches_rust() {
    let _gpu = gpu();
    let got = ringkernel_cuda::layout::device_layout(0).expect("layout kernel");
    println!("device layout words: {}", got.len());
    ringkernel_cuda::layout::check_device_layout(0).expect("layouts agree");
}

#[test]
#[ignore = "needs CUDA GPU"]
fn compile_error_is_reported_with_the_log() {
    let _gpu = gpu();
    let reg = KernelRegistry::new();
    reg.register_gpu(
        ringkernel_core::registry::GpuHandler::new("broken")
            .with_cuda("__device__ int handle(RkContext* ctx) { return this_is_not_defined; }"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = ringkernel_cuda::CudaRuntime::with_registry(reg)
            .await
            .unwrap();
        match r.launch("broken", LaunchOptions::default()).await {
            Err(ringkernel_core::Error::Compile { log, .. }) => {
                assert!(
                    log.contains("this_is_not_defined"),
                    "log does not name the error: {log}"
                )
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
        // The name is free again and the runtime still works.
        assert!(r.kernel(&"broken".into()).is_none());
    });
}

#[test]
#[ignore = "needs CUDA GPU"]
fn add_matches_reference() {
    let _gpu = gpu();
    let gpu = ringkernel_cuda::CudaCompute::new(0).expect("compute");
    let mut rng = SplitMix64::from_entropy();
    for n in [1usize, 7, 1023, 4097, 1 << 20] {
        let a = rng.vec(n, -4.0, 4.0);
        let b = rng.vec(n, -4.0, 4.0);
        let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
        let out = gpu.upload(&vec![f32::NAN; n]).unwrap();
        gpu.binary(BinaryOp::Add, &*da, &*db, &*out, n).unwrap();
        let mut host = vec![0.0f32; n];
        gpu.read(&*out, 0, &mut host).unwrap();
        for i in 0..n {
            assert_eq!(host[i], a[i] + b[i], "n={n} i={i}");
        }
    }
}

#[test]
#[ignore = "needs CUDA GPU"]
fn one_echo_through_a_persistent_kernel() {
    let _gpu = gpu();
    let reg = KernelRegistry::new();
    // No explicit registration: the runtime registers the CUDA built-ins itself.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = ringkernel_cuda::CudaRuntime::with_registry(reg)
            .await
            .expect("runtime");
        println!("{}", r.device_info());
        let k = r
            .launch(ECHO, LaunchOptions::default())
            .await
            .expect("launch");
        let t: Token = k
            .call(Token::new(7, 21.0), Duration::from_secs(10))
            .await
            .expect("call");
        assert_eq!((t.id, t.value, t.hops), (7, 42.0, 1));
        assert_ne!(t.stamps[0], 0, "the device stamped its HLC");
        let host_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let dev_ms = t.stamps[0] >> 20;
        assert!(
            dev_ms.abs_diff(host_ms) < 5_000,
            "device HLC {dev_ms} ms vs host {host_ms} ms"
        );
        // The reply's header: the kernel's clock node id next to the timestamp, the
        // kernel's priority (NORMAL by default) in the priority byte.
        k.send(Token::new(8, 1.0)).await.expect("send");
        let env = k
            .receive_envelope(Some(Duration::from_secs(10)))
            .await
            .expect("reply");
        assert_eq!(env.header.node_id, r.core().kernel_node_id(k.id()));
        assert_eq!(env.header.priority(), ringkernel_core::priority::NORMAL);
        assert_eq!(env.header.hlc().node(), env.header.node_id);
        let rep = k.terminate().await.expect("terminate");
        assert!(rep.undelivered.is_empty());
        let m = k.metrics();
        assert_eq!((m.received, m.processed, m.dropped), (2, 2, 0));
        r.shutdown().await.unwrap();
    });
}

/// Loading a CUDA module while a persistent kernel runs waits for that kernel in the
/// driver (seen on the H200 with driver 580: a 20 s timeout fired). So: a handler
/// preloaded before any kernel runs launches fine beside a running kernel, and a module
/// load while kernels run is refused with an error instead of hanging.
#[test]
#[ignore = "needs CUDA GPU"]
fn modules_load_before_kernels_run_and_never_hang() {
    let _gpu = gpu();
    use ringkernel_core::builtin::STAGE;
    let reg = KernelRegistry::new();
    ringkernel_cuda::register_cuda_builtins(&reg);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = ringkernel_cuda::CudaRuntime::with_registry(reg)
            .await
            .expect("runtime");
        r.preload(STAGE).expect("preload");
        let k = r
            .launch(ECHO, LaunchOptions::default())
            .await
            .expect("launch");
        let s = r
            .launch(STAGE, LaunchOptions::default())
            .await
            .expect("a preloaded handler launches beside a running kernel");
        let t: Token = s
            .call(
                Token::routed(3, 1.0, &[s.id()]).unwrap(),
                Duration::from_secs(10),
            )
            .await
            .expect("stage");
        assert_eq!((t.hops, t.value), (1, 2.0));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(ringkernel_cuda::layout::device_layout(0).map(|_| ()));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Err(ringkernel_core::Error::InvalidArgument(msg))) => {
                assert!(msg.contains("persistent"), "{msg}")
            }
            Ok(other) => {
                panic!("a module load beside running kernels must be refused, got {other:?}")
            }
            Err(_) => panic!("a module load beside running kernels blocked for 20 s"),
        }
        k.terminate().await.unwrap();
        s.terminate().await.unwrap();
        ringkernel_cuda::layout::check_device_layout(0)
            .expect("module loads work again once no kernel runs");
    });
}
