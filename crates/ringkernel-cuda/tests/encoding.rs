//! Message encodings on persistent CUDA kernels: the built-in handlers declare `Token`
//! (plain data), so an rkyv message is refused on the host with a typed error before it
//! enters the kernel's queue, by sends and by K2K delivery; plain data still flows.
//! The same check runs for the drain backends (`ringkernel-drain/tests/encoding.rs`).

use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::k2k::KernelTarget;
use ringkernel_core::message::{flags, Envelope, MessageHeader};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::{KernelRegistry, MessageInput};
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_core::Error;
use ringkernel_cuda::CudaRuntime;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn cuda_builtins_declare_token() {
    let reg = KernelRegistry::new();
    ringkernel_cuda::register_cuda_builtins(&reg);
    assert_eq!(
        reg.gpu(ECHO).unwrap().inputs,
        vec![MessageInput::of::<Token>()]
    );
}

#[test]
#[ignore = "needs CUDA GPU"]
fn rkyv_message_to_a_plain_data_cuda_kernel_is_refused_on_the_host() {
    let exec = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(async {
        let reg = KernelRegistry::new();
        ringkernel_cuda::register_cuda_builtins(&reg);
        let rt = CudaRuntime::with_registry(reg).await.expect("CUDA runtime");
        let k = rt.launch(ECHO, LaunchOptions::default()).await.unwrap();

        let mut env = Envelope::from_bytes(0x77, &[0u8; 24]);
        env.header.flags |= flags::RKYV;
        let err = k.send_envelope(&env).await.unwrap_err();
        assert!(matches!(err, Error::EncodingMismatch { .. }), "{err}");
        let mut h = MessageHeader::new(0x77, 24);
        h.flags |= flags::RKYV;
        let err = rt
            .core()
            .deliver(&KernelTarget::Id(k.id()), h, &[0u8; 24])
            .unwrap_err();
        assert!(matches!(err, Error::EncodingMismatch { .. }), "{err}");
        assert_eq!(k.metrics().received, 0, "nothing entered the queue");

        let t: Token = k.call(Token::new(1, 2.0), WAIT).await.unwrap();
        assert_eq!(t.value, 4.0);
        rt.shutdown().await.unwrap();
    });
}
