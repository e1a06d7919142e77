//! Queues keep working after their indices pass the capacity many times over, with the
//! host sending in windows while receiving (the demo's pattern).

use ringkernel::prelude::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn try_send_never_reports_full_on_an_empty_queue() {
    let rt = RingKernel::builder()
        .backend(Backend::Cpu)
        .build()
        .await
        .unwrap();
    let cap = 16u64;
    let k = rt
        .launch(
            builtin::ECHO,
            LaunchOptions::default().with_queue_capacity(cap as usize),
        )
        .await
        .unwrap();
    for lap in 0..20u64 {
        for i in 0..cap {
            let id = lap * cap + i;
            if let Err(e) = k.try_send(&Token::new(id, 1.0)) {
                panic!("lap {lap} message {i}: {e} ({:?})", k.metrics());
            }
        }
        for i in 0..cap {
            let t: Token = k.receive_timeout_as(WAIT).await.unwrap();
            assert_eq!(t.id, lap * cap + i);
        }
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test]
async fn windowed_pipeline_passes_many_laps() {
    let rt = RingKernel::builder()
        .backend(Backend::Cpu)
        .build()
        .await
        .unwrap();
    let opts = |n: &str| {
        LaunchOptions::default()
            .with_queue_capacity(64)
            .with_name(n)
    };
    let s1 = rt.launch(builtin::STAGE, opts("w1")).await.unwrap();
    let s2 = rt.launch(builtin::STAGE, opts("w2")).await.unwrap();
    let s3 = rt.launch(builtin::STAGE, opts("w3")).await.unwrap();
    let route = [s1.id(), s2.id(), s3.id()];
    let (n, window) = (5_000u64, 32u64);
    let (mut sent, mut received) = (0u64, 0u64);
    while received < n {
        while sent < n && sent - received < window {
            match s1.try_send(&Token::routed(sent, 0.0, &route).unwrap()) {
                Ok(_) => sent += 1,
                Err(Error::QueueFull { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        if sent == received {
            panic!(
                "nothing in flight but the first stage refused a send: {:?}",
                s1.metrics()
            );
        }
        let t: Token = s3.receive_timeout_as(WAIT).await.unwrap();
        assert_eq!(t.id, received, "one pipeline keeps order");
        received += 1;
    }
    rt.shutdown().await.unwrap();
}
