//! Wake-ups skipped for messages pushed behind unread ones (the CPU runtime's
//! `try_push_wake` path) never strand a message. A binary of its own: it keeps both
//! pool workers busy for seconds, and `scheduler.rs` checks that idle workers of the
//! whole process sleep.

use ringkernel_core::builtin::{Token, ECHO, STAGE};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_cpu::CpuRuntime;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);
/// A message pushed behind one still unread skips the kernel's wake-up (the turn that
/// reads the first one reads it too, or sees its slot claimed before going idle). Here
/// four threads stream into one pooled kernel's lane at once, in bursts with pauses that
/// let its worker finish turns and park, and into a 3-stage chain (K2K pushes behind
/// unread messages), with small queues so turns end on empty lanes often: a message
/// stranded by a skipped wake-up would time a receive out. Every message arrives, each
/// sender's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_pushed_behind_unread_ones_are_never_stranded() {
    const THREADS: u64 = 4;
    const N: u64 = 20_000;
    let rt = CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap()
        .with_workers(2)
        .unwrap();
    let echo = rt
        .launch(
            ECHO,
            LaunchOptions::default()
                .with_name("stream.echo")
                .with_queue_capacity(64)
                .with_output_capacity(4096),
        )
        .await
        .unwrap();
    let mut stages = Vec::new();
    for i in 0..3 {
        let o = LaunchOptions::default()
            .with_name(format!("stream.{i}"))
            .with_queue_capacity(16)
            .with_output_capacity(4096);
        stages.push(rt.launch(STAGE, o).await.unwrap());
    }
    let route: Vec<_> = stages.iter().map(|k| k.id()).collect();
    let mut joins = Vec::new();
    for th in 0..THREADS {
        let (echo, first, route) = (echo.clone(), stages[0].clone(), route.clone());
        joins.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async {
                for i in 0..N {
                    let id = th << 32 | i;
                    echo.send(Token::new(id, 1.0)).await.unwrap();
                    first
                        .send(Token::routed(id, 0.0, &route).unwrap())
                        .await
                        .unwrap();
                    if i % (97 + th) == 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
            });
        }));
    }
    // Both outputs are read at once (the senders wait whenever either fills up).
    let readers: Vec<_> = [echo.clone(), stages[2].clone()]
        .into_iter()
        .map(|out| {
            tokio::spawn(async move {
                let mut next = [0u64; THREADS as usize];
                let mut got: Vec<Token> = Vec::new();
                let mut seen = 0;
                while seen < THREADS * N {
                    got.clear();
                    out.receive_batch_into(&mut got, 256, Some(T))
                        .await
                        .expect("a message was stranded: lost wake-up?");
                    for t in &got {
                        let (th, i) = ((t.id >> 32) as usize, t.id & 0xFFFF_FFFF);
                        assert_eq!(i, next[th], "each sender's messages keep their order");
                        next[th] += 1;
                    }
                    seen += got.len() as u64;
                }
            })
        })
        .collect();
    for r in readers {
        r.await.unwrap();
    }
    for j in joins {
        j.join().unwrap();
    }
    rt.shutdown().await.unwrap();
}
