//! The seed README's "Launch Options" example, compiled as written after
//! `use ringkernel::prelude::*;`, then used for a launch on the CPU backend.

use ringkernel::prelude::*;
use std::time::Duration;

/// The fragment, unchanged, returning the options it built (hence the binding that
/// clippy would fold into the return).
#[allow(clippy::let_and_return)]
fn seed_options() -> LaunchOptions {
    let options = LaunchOptions::default()
        .with_queue_capacity(4096)
        .with_block_size(256)
        .with_priority(priority::HIGH)
        .without_auto_activate();
    options
}

#[test]
fn every_setter_sets_its_field() {
    let options = seed_options();
    assert_eq!(options.queue_capacity, 4096);
    assert_eq!(options.block_size, 256);
    assert_eq!(options.priority, priority::HIGH);
    assert!(!options.auto_activate);
    // Everything else keeps its default.
    let d = LaunchOptions::default();
    assert_eq!(options.slot_size, d.slot_size);
    assert_eq!(options.grid_size, d.grid_size);
    assert_eq!(d.priority, priority::NORMAL);
    assert!(d.auto_activate);
    assert!(options.validate().is_ok());
}

#[test]
fn the_priority_levels_are_ordered() {
    let levels = [
        priority::LOW,
        priority::NORMAL,
        priority::HIGH,
        priority::CRITICAL,
    ];
    assert!(levels.windows(2).all(|w| w[0] < w[1]), "{levels:?}");
    // Each level has its own input lane, the higher the level the higher the lane.
    let lanes: Vec<usize> = levels.iter().map(|p| priority::lane(*p)).collect();
    assert_eq!(lanes, [0, 1, 2, 3]);
    for p in levels {
        assert_eq!(LaunchOptions::default().with_priority(p).priority, p);
    }
}

#[tokio::test]
async fn a_kernel_launched_with_them_waits_for_activation() {
    let runtime = RingKernel::builder()
        .backend(Backend::Cpu)
        .build()
        .await
        .unwrap();
    let kernel = runtime.launch(builtin::ECHO, seed_options()).await.unwrap();
    assert_eq!(kernel.state(), LifecycleState::Launched);
    kernel.send(Token::new(1, 4.0)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(kernel.metrics().processed, 0);
    kernel.activate().await.unwrap();
    let r: Token = kernel
        .receive_envelope(Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!(r.value, 8.0);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn capacities_that_are_not_powers_of_two_are_refused() {
    let runtime = RingKernel::builder()
        .backend(Backend::Cpu)
        .build()
        .await
        .unwrap();
    let bad = seed_options().with_queue_capacity(4000);
    let err = runtime.launch(builtin::ECHO, bad).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("queue_capacity"), "{err}");
    let err = runtime
        .launch(builtin::ECHO, seed_options().with_block_size(0))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("block_size"), "{err}");
    runtime.shutdown().await.unwrap();
}
