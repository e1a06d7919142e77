//! Message encodings on a drain kernel (the host side of WebGPU and Metal, with the CPU
//! stand-in device of `tests/common`): the built-in handlers declare `Token`, so an rkyv
//! message is refused on the host, before it enters the queue, by every send path and
//! by K2K delivery; plain data goes through.

mod common;

use common::{CpuTarget, Handler};
use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::k2k::{K2kReceipt, KernelTarget};
use ringkernel_core::message::{flags, Encoding, Envelope, MessageHeader, RingMessage};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::{GpuHandler, KernelRegistry, MessageInput};
use ringkernel_core::runtime::{KernelHandle, RuntimeCore};
use ringkernel_core::{BackendKind, Error};
use ringkernel_drain::engine::{launch_engine, register_builtins};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn launch(core: &Arc<RuntimeCore>, handler: &str) -> KernelHandle {
    let opts = LaunchOptions::default();
    launch_engine(core, handler, &opts, false, 16, |_| {
        Ok(CpuTarget::new(
            opts.queue_capacity,
            opts.slot_size,
            Handler::Echo,
        ))
    })
    .unwrap()
}

fn rkyv_envelope(type_id: u32) -> Envelope {
    let mut env = Envelope::from_bytes(type_id, &[0u8; 24]);
    env.header.flags |= flags::RKYV;
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rkyv_message_to_a_plain_data_gpu_handler_is_refused_on_the_host() {
    let reg = KernelRegistry::new();
    register_builtins(&reg);
    assert_eq!(
        reg.gpu(ECHO).unwrap().inputs,
        vec![MessageInput::of::<Token>()]
    );
    let core = RuntimeCore::new(BackendKind::Metal, reg);
    let k = launch(&core, ECHO);

    // Another type, archived: refused by every send path, nothing enqueued.
    let env = rkyv_envelope(0x77);
    let err = k.send_envelope(&env).await.unwrap_err();
    assert!(
        matches!(err, Error::EncodingMismatch { type_id: 0x77, .. }),
        "{err}"
    );
    // The declared type, but flagged as an archive.
    let err = k
        .send_envelope(rkyv_envelope(Token::TYPE_ID))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::EncodingMismatch { .. }), "{err}");
    // K2K delivery checks too.
    let mut h = MessageHeader::new(0x77, 24);
    h.flags |= flags::RKYV;
    let err = core
        .deliver(&KernelTarget::Id(k.id()), h, &[0u8; 24])
        .unwrap_err();
    assert!(matches!(err, Error::EncodingMismatch { .. }), "{err}");
    assert_eq!(k.metrics().received, 0, "nothing entered the queue");

    // Plain data still flows (declared and undeclared types alike).
    let t: Token = k.call(Token::new(1, 2.0), WAIT).await.unwrap();
    assert_eq!(t.value, 4.0);
    let plain = MessageHeader::new(0x77, 24);
    assert_eq!(
        core.deliver(&KernelTarget::Id(k.id()), plain, &[0u8; 24])
            .unwrap(),
        K2kReceipt::Delivered
    );
    k.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_gpu_handler_takes_raw_bytes() {
    let reg = KernelRegistry::new();
    reg.register_gpu(GpuHandler::new("raw").with_wgsl("// stand-in"));
    let core = RuntimeCore::new(BackendKind::Metal, reg);
    let k = launch(&core, "raw");
    // No declared inputs: the archive is accepted (the handler reads raw bytes).
    k.send_envelope(rkyv_envelope(0x77)).await.unwrap();
    k.terminate().await.unwrap();
}

#[test]
fn declared_inputs_check_encoding_per_type() {
    const ARCHIVED: MessageInput = MessageInput {
        type_id: 0x55,
        name: "Archived",
        encoding: Encoding::Rkyv,
    };
    let h = GpuHandler::new("mixed")
        .with_input::<Token>()
        .with_input::<Token>();
    assert_eq!(h.inputs.len(), 1, "declaring twice is one declaration");
    let mut h = h;
    h.inputs.push(ARCHIVED);
    // With an rkyv input declared, undeclared archives are not refused outright...
    assert!(h.accepts("mixed", &rkyv_envelope(0x66).header).is_ok());
    // ...but a declared rkyv type must come archived, and Token plain.
    assert!(h.accepts("mixed", &rkyv_envelope(0x55).header).is_ok());
    assert!(matches!(
        h.accepts("mixed", &MessageHeader::new(0x55, 8)),
        Err(Error::EncodingMismatch { .. })
    ));
    assert!(h
        .accepts("mixed", &Envelope::new(&Token::default()).header)
        .is_ok());
}
