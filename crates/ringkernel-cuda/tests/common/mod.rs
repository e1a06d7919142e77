//! Checks shared by the CUDA test files (one GPU: runtime.rs; several: several_gpus.rs).

use ringkernel_core::builtin::Token;
use ringkernel_core::runtime::KernelHandle;
use std::time::{Duration, Instant};

/// `s1` and `s2` run `rk.stage`: a token routed s1 -> s2 arrives; once `s2` has
/// terminated, a K2K send to it finds no route, so `s1` drops the message and counts it
/// (the handler sees NOT_FOUND): never written into freed memory, never a reply.
pub async fn k2k_to_a_terminated_kernel_is_dropped(
    s1: &KernelHandle,
    s2: &KernelHandle,
) -> ringkernel_core::Result<()> {
    let route = [s1.id(), s2.id()];
    s1.send(Token::routed(1, 1.0, &route)?).await?;
    let t: Token = s2.receive_timeout_as(Duration::from_secs(10)).await?;
    assert_eq!((t.hops, t.value), (2, 3.0));
    s2.terminate().await?;
    s1.send(Token::routed(2, 1.0, &route)?).await?;
    let start = Instant::now();
    while s1.metrics().dropped == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the send to the terminated kernel {} was not counted",
            s2.name()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(s1.try_receive::<Token>()?.is_none());
    Ok(())
}
