//! The seed README's "Kernel-to-Kernel Messaging" example, compiled as written after
//! `use ringkernel::prelude::*;` and run on `CpuRuntime::new()`.
//!
//! The fragment presumes `source_id`, `dest_id` and `envelope`: this file launches two
//! kernels on the fragment's runtime right after it takes the broker, and the
//! destination runs a `#[ring_kernel]` handler that reports the header it received, so
//! the test can check what the broker stamped (source, K2K flag, timestamp). Then the
//! broker's bad inputs and the K2K switch.

use ringkernel::core::message::flags;
use ringkernel::prelude::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

/// What the destination saw of a message's header.
#[derive(Clone, Copy, RingMessage)]
#[message(type_id = 0x5EED_0201)]
#[repr(C)]
struct Seen {
    source: u32,
    flags: u32,
    time: u64,
    node: u64,
    value: f64,
}

/// Replies with the header fields of each token it receives.
#[ring_kernel(name = "seed.k2k.inspect")]
fn inspect(ctx: &mut KernelContext<'_>, t: Token) -> Option<Seen> {
    let h = ctx.request();
    let ts = h.hlc();
    Some(Seen {
        source: h.source_kernel,
        flags: h.flags,
        time: ts.packed(),
        node: ts.node(),
        value: t.value,
    })
}

/// The fragment (its lines unchanged), with the kernels it presumes launched between
/// taking the broker and sending. Returns the receipt and the two kernels.
async fn k2k_example() -> Result<Outcome, Box<dyn std::error::Error>> {
    // K2K is on unless a runtime switches it off.
    let runtime = CpuRuntime::new().await?;
    let broker = runtime.k2k_broker().unwrap();

    // What the fragment presumes: a sender, a receiver and a message.
    let source = runtime
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_name("seed.k2k.source"),
        )
        .await?;
    let dest = runtime
        .launch(
            "seed.k2k.inspect",
            LaunchOptions::default().with_name("seed.k2k.dest"),
        )
        .await?;
    let (source_id, dest_id) = (source.id(), dest.id());
    let envelope = Envelope::new(&Token::new(7, 2.5));
    let before = runtime.core().hlc().peek();

    let receipt = broker.send(source_id, dest_id, envelope).await?;
    Ok(Outcome {
        runtime,
        receipt,
        source,
        dest,
        before,
    })
}

/// What the example left behind.
struct Outcome {
    runtime: CpuRuntime,
    receipt: K2kReceipt,
    source: KernelHandle,
    dest: KernelHandle,
    /// The runtime's clock right before the send.
    before: HlcTimestamp,
}

#[tokio::test]
async fn k2k_broker_delivers_as_written() {
    let Outcome {
        runtime,
        receipt,
        source,
        dest,
        before,
    } = k2k_example().await.expect("the K2K example");
    assert_eq!(receipt, K2kReceipt::Delivered);
    // The destination handled it: its reply describes the header it got.
    let env = dest.receive_envelope(Some(WAIT)).await.unwrap();
    let seen: Seen = env.decode().unwrap();
    assert_eq!(seen.value, 2.5);
    assert_eq!(seen.source, source.id().0, "stamped with the source kernel");
    assert_ne!(seen.flags & flags::K2K, 0, "flagged as a K2K message");
    // Timestamped after `before` by the runtime's clock: the destination's clock
    // merged that stamp, so its receive time (with its own node id) is later still,
    // and the reply later than that.
    let received = HlcTimestamp::from_parts(seen.time, seen.node);
    assert_eq!(seen.node, runtime.core().kernel_node_id(dest.id()));
    assert!(received > before, "{received:?} !> {before:?}");
    assert!(received < env.header.hlc());
    // The reply goes back to the kernel the message came from.
    assert_eq!(env.header.dest_kernel, source.id().0);
    // Nothing went to the source itself.
    assert_eq!(source.metrics().received, 0);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn destinations_by_name_and_missing_ones() {
    let runtime = CpuRuntime::new().await.unwrap();
    let broker = runtime.k2k_broker().unwrap();
    let a = runtime
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_name("seed.k2k.a"),
        )
        .await
        .unwrap();
    let b = runtime
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_name("seed.k2k.b"),
        )
        .await
        .unwrap();
    let env = Envelope::new(&Token::new(1, 3.0));
    // By instance name, and the envelope by reference.
    assert_eq!(
        broker.send(a.id(), "seed.k2k.b", &env).await.unwrap(),
        K2kReceipt::Delivered
    );
    let r: Token = b
        .receive_envelope(Some(WAIT))
        .await
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!(r.value, 6.0);
    // A destination that does not exist: a receipt, nothing delivered.
    assert_eq!(
        broker.send(a.id(), "seed.k2k.nobody", &env).await.unwrap(),
        K2kReceipt::NotFound
    );
    assert_eq!(
        broker.send(a.id(), KernelId(9_999), &env).await.unwrap(),
        K2kReceipt::NotFound
    );
    // A source that does not exist is an error: nobody can send on its behalf.
    let err = broker
        .send(KernelId(9_999), b.id(), &env)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::KernelNotFound(_)), "{err}");
    // Too large for the destination's slots.
    let big = Envelope::from_bytes(Token::TYPE_ID, &[0u8; 4096]);
    assert!(matches!(
        broker.send(a.id(), b.id(), big).await,
        Err(Error::MessageTooLarge { .. })
    ));
    // A terminated destination.
    b.terminate().await.unwrap();
    assert_eq!(
        broker.send(a.id(), b.id(), &env).await.unwrap(),
        K2kReceipt::NotFound
    );
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_full_destination_is_a_receipt_not_a_wait() {
    let runtime = CpuRuntime::new().await.unwrap();
    let broker = runtime.k2k_broker().unwrap();
    let a = runtime
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_name("seed.k2k.full.a"),
        )
        .await
        .unwrap();
    let b = runtime
        .launch(
            builtin::ECHO,
            LaunchOptions::default()
                .with_name("seed.k2k.full.b")
                .with_queue_capacity(2)
                .without_auto_activate(),
        )
        .await
        .unwrap();
    let env = Envelope::new(&Token::new(1, 1.0));
    let mut receipts = Vec::new();
    for _ in 0..64 {
        receipts.push(broker.send(a.id(), b.id(), &env).await.unwrap());
    }
    let delivered = receipts
        .iter()
        .filter(|r| **r == K2kReceipt::Delivered)
        .count();
    assert!(delivered >= 2, "{receipts:?}");
    assert!(receipts.contains(&K2kReceipt::QueueFull), "{receipts:?}");
    // Whatever was delivered is handled once the kernel runs, and only that.
    b.activate().await.unwrap();
    for _ in 0..delivered {
        b.receive_envelope(Some(WAIT)).await.unwrap();
    }
    assert_eq!(b.metrics().received, delivered as u64);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_runtime_with_k2k_disabled_has_no_broker_and_refuses_k2k() {
    let runtime = CpuRuntime::new().await.unwrap();
    let broker = runtime.k2k_broker().expect("enabled by default");
    let s1 = runtime
        .launch(
            builtin::STAGE,
            LaunchOptions::default().with_name("seed.k2k.off.1"),
        )
        .await
        .unwrap();
    let s2 = runtime
        .launch(
            builtin::STAGE,
            LaunchOptions::default().with_name("seed.k2k.off.2"),
        )
        .await
        .unwrap();

    runtime.set_k2k_enabled(false);
    assert!(runtime.k2k_broker().is_none());
    // A broker taken before the switch is refused too, with an error naming it.
    let err = broker
        .send(s1.id(), s2.id(), Envelope::new(&Token::new(1, 1.0)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("disabled"), "{err}");
    // A handler's own K2K send is refused: the first stage drops the token (counted)
    // and the second never sees it.
    s1.send(Token::routed(2, 0.0, &[s1.id(), s2.id()]).unwrap())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while s1.metrics().dropped == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(s1.metrics().dropped, 1);
    assert_eq!(s2.metrics().received, 0);
    // Host sends are not K2K and still work.
    let r: Token = s2.call(Token::new(3, 1.0), WAIT).await.unwrap();
    assert_eq!(r.value, 2.0);

    // Switched back on, the same pipeline runs end to end.
    runtime.set_k2k_enabled(true);
    s1.send(Token::routed(4, 0.0, &[s1.id(), s2.id()]).unwrap())
        .await
        .unwrap();
    let out: Token = s2
        .receive_envelope(Some(WAIT))
        .await
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!((out.id, out.value, out.hops), (4, 2.0, 2));
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_facade_offers_the_same_broker_and_switch() {
    let rt = RingKernel::builder()
        .backend(Backend::Cpu)
        .k2k(false)
        .build()
        .await
        .unwrap();
    assert!(rt.k2k_broker().is_none());
    rt.set_k2k_enabled(true);
    let a = rt
        .launch(builtin::ECHO, LaunchOptions::default().with_name("a"))
        .await
        .unwrap();
    let b = rt
        .launch(builtin::ECHO, LaunchOptions::default().with_name("b"))
        .await
        .unwrap();
    let broker = rt.k2k_broker().unwrap();
    assert_eq!(
        broker
            .send(a.id(), "b", Envelope::new(&Token::new(5, 1.0)))
            .await
            .unwrap(),
        K2kReceipt::Delivered
    );
    let r: Token = b
        .receive_envelope(Some(WAIT))
        .await
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!((r.id, r.value), (5, 2.0));
    rt.shutdown().await.unwrap();
}
