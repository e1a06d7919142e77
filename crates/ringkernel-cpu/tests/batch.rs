//! Batched host traffic on the CPU runtime: `send_batch` / `receive_batch` through the
//! engine's batch overrides (one lane claim, one wake-up, one output lock per batch),
//! mixed-priority batches, and what a worker's turn batches (message ids from reserved
//! blocks, sampled handler latency) as the metrics show it.

use ringkernel_core::builtin::{Token, ECHO, STAGE};
use ringkernel_core::context::KernelContext;
use ringkernel_core::message::{Envelope, MessageHeader, RingMessage};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::priority::{self, HIGH, LOW, NORMAL};
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelHandle, KernelId, RingKernelRuntime};
use ringkernel_core::Error;
use ringkernel_cpu::CpuRuntime;
use std::collections::HashSet;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

async fn runtime() -> CpuRuntime {
    CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap()
}

/// A batch larger than the input queue waits for room and goes on; every reply comes
/// back once, in order, and the counters add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_batch_larger_than_the_queue_arrives_in_order() {
    let rt = runtime().await;
    let k = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_queue_capacity(64)
                .with_output_capacity(4096),
        )
        .await
        .unwrap();
    const N: u64 = 3_001;
    let batch: Vec<Token> = (0..N).map(|i| Token::new(i, i as f64)).collect();
    let ids = k.send_batch(&batch).await.unwrap();
    assert_eq!(ids.end - ids.start, N);
    let mut next = 0;
    while next < N {
        let got = k.receive_batch(700, Some(T)).await.unwrap();
        assert!(!got.is_empty() && got.len() <= 700);
        for env in got {
            let t: Token = env.decode().unwrap();
            assert_eq!((t.id, t.value), (next, 2.0 * next as f64), "order kept");
            assert_eq!(env.header.correlation_id, ids.start + next);
            next += 1;
        }
    }
    let m = k.metrics();
    assert_eq!((m.received, m.output_depth), (N, 0));
    rt.shutdown().await.unwrap();
}

/// `try_enqueue_batch` with messages of several priorities, into a kernel that is not
/// active yet: each run goes into its lane, and the kernel then handles them highest
/// lane first, in order within a lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_priority_batch_fills_each_lane() {
    let rt = runtime().await;
    let k = rt
        .launch(ECHO, LaunchOptions::default().without_auto_activate())
        .await
        .unwrap();
    let plan = [(LOW, 3), (HIGH, 2), (NORMAL, 4), (HIGH, 1)];
    let mut msgs = Vec::new();
    let mut i = 0u64;
    for (p, n) in plan {
        for _ in 0..n {
            let t = Token::new(i, p as f64);
            let mut h = MessageHeader::new(Token::TYPE_ID, std::mem::size_of::<Token>());
            h.set_priority(p);
            h.message_id = 1_000 + i;
            h.correlation_id = 1_000 + i;
            msgs.push((h, t));
            i += 1;
        }
    }
    let batch: Vec<(MessageHeader, &[u8])> = msgs
        .iter()
        .map(|(h, t)| (*h, bytemuck::bytes_of(t)))
        .collect();
    assert_eq!(k.engine().try_enqueue_batch(&batch).unwrap(), batch.len());
    assert_eq!(k.metrics().queue_depth, batch.len());
    k.activate().await.unwrap();
    let mut got = Vec::new();
    while got.len() < batch.len() {
        got.extend(k.receive_batch(batch.len(), Some(T)).await.unwrap());
    }
    let order: Vec<(u8, u64)> = got
        .iter()
        .map(|e: &Envelope| {
            let t: Token = e.decode().unwrap();
            ((t.value / 2.0) as u8, t.id)
        })
        .collect();
    let lane_order = |p: u8| std::cmp::Reverse(priority::lane(p));
    let mut want: Vec<(u8, u64)> = msgs.iter().map(|(h, t)| (h.priority(), t.id)).collect();
    want.sort_by_key(|&(p, id)| (lane_order(p), id));
    assert_eq!(order, want, "highest lane first, FIFO within a lane");
    rt.shutdown().await.unwrap();
}

/// A batch into a full lane takes what fits, then reports `QueueFull` when nothing
/// fits; into a terminated kernel it is `KernelTerminated`; an oversized first message
/// is `MessageTooLarge` and nothing is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_enqueue_errors() {
    let rt = runtime().await;
    let k = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_queue_capacity(4)
                .without_auto_activate(),
        )
        .await
        .unwrap();
    let t = Token::new(1, 1.0);
    let h = MessageHeader::new(Token::TYPE_ID, std::mem::size_of::<Token>());
    let one = (h, bytemuck::bytes_of(&t));
    assert_eq!(k.engine().try_enqueue_batch(&[one; 6]).unwrap(), 4);
    assert!(matches!(
        k.engine().try_enqueue_batch(&[one; 2]),
        Err(Error::QueueFull { capacity: 4 })
    ));
    let big = vec![0u8; 4096];
    let mut k2h = h;
    k2h.payload_len = big.len() as u32;
    let rt2 = runtime().await;
    let k2 = rt2.launch(ECHO, LaunchOptions::default()).await.unwrap();
    assert!(matches!(
        k2.engine().try_enqueue_batch(&[(k2h, &big[..]), one]),
        Err(Error::MessageTooLarge { .. })
    ));
    assert_eq!(k2.metrics().received, 0);
    let report = k.terminate().await.unwrap();
    assert_eq!(report.undelivered.len(), 4, "handed back, not lost");
    assert!(matches!(
        k.engine().try_enqueue_batch(&[one]),
        Err(Error::KernelTerminated(_))
    ));
    rt.shutdown().await.unwrap();
    rt2.shutdown().await.unwrap();
}

/// What a pooled kernel's turn batches still adds up: message ids of K2K sends (handed
/// out from blocks each worker reserves) are unique across kernels, and every handled
/// message is in the latency histogram (timed 1 in `LATENCY_SAMPLE_EVERY`, counted
/// all), with `emitted` and `processed` exact once the turn ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_bookkeeping_is_exact() {
    let rt = runtime().await;
    let opts = |n: &str| {
        LaunchOptions::default()
            .with_queue_capacity(1024)
            .with_output_capacity(8192)
            .with_name(n)
    };
    let mut chains = Vec::new();
    for c in 0..2 {
        let mut stages = Vec::new();
        for s in 0..3 {
            stages.push(rt.launch(STAGE, opts(&format!("c{c}s{s}"))).await.unwrap());
        }
        chains.push(stages);
    }
    const N: u64 = 2_000;
    for stages in &chains {
        let route: Vec<KernelId> = stages.iter().map(|k| k.id()).collect();
        let batch: Vec<Token> = (0..N)
            .map(|i| Token::routed(i, 0.0, &route).unwrap())
            .collect();
        stages[0].send_batch(&batch).await.unwrap();
    }
    let mut ids = HashSet::new();
    for stages in &chains {
        let mut next = 0;
        while next < N {
            for env in stages[2].receive_batch(N as usize, Some(T)).await.unwrap() {
                let t: Token = env.decode().unwrap();
                assert_eq!((t.id, t.value, t.hops), (next, 3.0, 3));
                assert!(ids.insert(env.header.message_id), "message id reused");
                next += 1;
            }
        }
    }
    for stages in &chains {
        for k in stages {
            // A reply can be read before the turn that sent it has ended and added
            // its counts: wait for them (briefly).
            let t0 = std::time::Instant::now();
            let mut m = k.metrics();
            while m.processed < N && t0.elapsed() < T {
                tokio::time::sleep(Duration::from_millis(1)).await;
                m = k.metrics();
            }
            assert_eq!((m.received, m.processed, m.dropped), (N, N, 0), "{m:?}");
            assert_eq!(m.emitted, N);
            assert_eq!(m.latency.count, N, "every handled message counted");
            assert!(m.latency.p50_ns > 0 && m.latency.p50_ns <= m.latency.max_ns);
        }
    }
    rt.shutdown().await.unwrap();
}

/// A reply type other than `Token`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Other {
    x: u64,
}

impl RingMessage for Other {
    const TYPE_ID: u32 = 0x7E57_0001;
    const NAME: &'static str = "Other";
}

/// A kernel that echoes tokens, except token `other_at`, for which it replies
/// `Other { x }`; `n` tokens sent to it as one batch, all replies waiting in its output
/// queue on return (so a receive sees them together).
async fn mixed_replies(other_at: u64, x: u64, n: u64) -> (CpuRuntime, KernelHandle) {
    let reg = KernelRegistry::new();
    reg.register_fn(
        "test.mixed",
        move |ctx: &mut KernelContext<'_>, t: Token| -> ringkernel_core::Result<Option<Token>> {
            if t.id == other_at {
                ctx.reply(&Other { x })?;
                Ok(None)
            } else {
                Ok(Some(t))
            }
        },
    );
    let rt = CpuRuntime::with_registry(reg).await.unwrap();
    let k = rt
        .launch(
            "test.mixed",
            LaunchOptions::default().without_auto_activate(),
        )
        .await
        .unwrap();
    let batch: Vec<Token> = (0..n).map(|i| Token::new(i, 0.0)).collect();
    k.send_batch(&batch).await.unwrap();
    k.activate().await.unwrap();
    let t0 = std::time::Instant::now();
    while (k.metrics().output_depth as u64) < n {
        assert!(t0.elapsed() < T, "{:?}", k.metrics());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (rt, k)
}

/// A reply of another type at the front of the output queue (nothing kept from an
/// earlier receive) is `TypeMismatch` for `receive_batch_into`, and it stays first in
/// line, ahead of the replies behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_batch_into_keeps_a_first_reply_of_another_type() {
    let (rt, k) = mixed_replies(0, 7, 4).await;
    let mut got: Vec<Token> = Vec::new();
    assert!(matches!(
        k.receive_batch_into(&mut got, 64, Some(T)).await,
        Err(Error::TypeMismatch { .. })
    ));
    assert!(got.is_empty(), "nothing appended on the mismatch");
    let o: Other = k.receive_timeout_as(T).await.unwrap();
    assert_eq!(o, Other { x: 7 });
    assert_eq!(
        k.receive_batch_into(&mut got, 64, Some(T)).await.unwrap(),
        3
    );
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), [1, 2, 3]);
    rt.shutdown().await.unwrap();
}

/// `receive_batch_into` decodes replies in place; a reply of another type ends the
/// batch and stays first in line (a typed receive of the first is `TypeMismatch`, and
/// the message is still there for a receive of its own type).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_batch_into_stops_at_another_type() {
    let (rt, k) = mixed_replies(5, 55, 10).await;
    let mut got: Vec<Token> = Vec::new();
    assert_eq!(
        k.receive_batch_into(&mut got, 64, Some(T)).await.unwrap(),
        5
    );
    assert_eq!(
        got.iter().map(|t| t.id).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert!(matches!(
        k.receive_batch_into(&mut got, 64, Some(T)).await,
        Err(Error::TypeMismatch { .. })
    ));
    assert_eq!(got.len(), 5, "nothing appended on the mismatch");
    let o: Other = k.receive_timeout_as(T).await.unwrap();
    assert_eq!(o, Other { x: 55 });
    got.clear();
    assert_eq!(
        k.receive_batch_into(&mut got, 64, Some(T)).await.unwrap(),
        4
    );
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), [6, 7, 8, 9]);
    assert!(matches!(
        k.receive_batch_into(&mut got, 64, Some(Duration::from_millis(10)))
            .await,
        Err(Error::Timeout(_))
    ));
    rt.shutdown().await.unwrap();
}
