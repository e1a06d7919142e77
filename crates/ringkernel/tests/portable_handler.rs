//! Actor handlers written once in Rust (`#[ring_kernel(gpu)]`) run on every runtime: the
//! CPU runs the function, CUDA its translation inside the persistent kernel, wgpu (lavapipe
//! in CI) its translation inside the drain template. Conformance-like checks on each:
//! N messages give N replies in order, state persists across messages, a K2K send
//! arrives, a message of another type is dropped without touching the state, a stateless
//! handler (parallel on GPUs) keeps its replies in order.
//!
//! `cargo test -p ringkernel --features wgpu --test portable_handler`; CUDA:
//! `cargo test -p ringkernel --features cuda --test portable_handler -- --ignored`.

#![cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]

use ringkernel::core::util::SplitMix64;
use ringkernel::prelude::*;
use ringkernel::{gpu_fn, ring_kernel, Backend, GpuType, RingKernel, RingMessage};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// A reading: `next` is a kernel id for the pipeline stage (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, RingMessage, GpuType)]
#[message(type_id = 0x5248_0101)]
#[repr(C)]
struct Sample {
    id: u64,
    value: f32,
    next: u32,
}

/// What the accumulator answers: the totals so far and who sent the sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, RingMessage, GpuType)]
#[message(type_id = 0x5248_0102)]
#[repr(C)]
struct Total {
    id: u64,
    count: u32,
    sum: f32,
    from: u32,
    steps: [u32; 3],
}

/// The accumulator's state (zero by default, as a GPU starts it).
#[derive(Clone, Copy, Debug, Default, GpuType)]
#[repr(C)]
struct Stats {
    count: u32,
    sum: f32,
}

/// Counts and sums the samples it sees, replying with the totals so far.
#[ring_kernel(name = "test.accumulate", gpu)]
fn accumulate(_ctx: &mut KernelContext<'_>, stats: &mut Stats, m: Sample) -> Option<Total> {
    stats.count += 1;
    stats.sum += m.value;
    Some(Total {
        id: m.id,
        count: stats.count,
        sum: stats.sum,
        from: m.next,
        steps: [0; 3],
    })
}

/// One step of the recurrence (a `#[gpu_fn]` helper, translated with the handler).
#[gpu_fn]
fn recur_step(acc: f32, v: f32) -> f32 {
    acc.mul_add(v, 1.0)
}

/// Stateless (the GPUs run a batch in parallel): no reply for negative values, else a
/// few steps of a recurrence.
#[ring_kernel(name = "test.recur", gpu)]
fn recur(_ctx: &mut KernelContext<'_>, m: Sample) -> Option<Total> {
    if m.value < 0.0 {
        return None;
    }
    let mut acc = 0.0f32;
    let mut steps = [0u32; 3];
    let n = m.next % 9;
    for k in 0..n {
        acc = recur_step(acc, m.value);
        steps[(k % 3) as usize] += k;
    }
    let t = Total {
        id: m.id,
        count: n,
        sum: acc,
        from: 0,
        steps: [0; 3],
    };
    Some(Total { steps, ..t })
}

/// A pipeline stage: doubles the value and sends it on to kernel `next` (K2K), stamped
/// with this kernel's id; counts what it forwarded.
#[ring_kernel(name = "test.forward", gpu)]
fn forward(ctx: &mut KernelContext<'_>, forwarded: &mut u32, m: Sample) {
    *forwarded += 1;
    let _ = ctx.send_to(
        KernelId(m.next),
        &Sample {
            value: m.value * 2.0,
            next: ctx.kernel_id().0,
            ..m
        },
    );
}

/// A reply after a K2K send: two outputs for one message. CPU and CUDA deliver both; the
/// drain template of wgpu and Metal carries one output per message, so there the message
/// is dropped (counted, status `ERR_SECOND_OUTPUT`) and neither goes out.
#[ring_kernel(name = "test.tee", gpu)]
fn tee(ctx: &mut KernelContext<'_>, m: Sample) -> Option<Total> {
    let _ = ctx.send_to(KernelId(m.next), &m);
    Some(Total {
        id: m.id,
        count: 1,
        sum: m.value,
        from: 0,
        steps: [0; 3],
    })
}

/// A reply of 80 bytes: more than a 128-byte slot carries (64 bytes of payload).
#[derive(Clone, Copy, Debug, Default, PartialEq, RingMessage, GpuType)]
#[message(type_id = 0x5248_0103)]
#[repr(C)]
struct Big {
    words: [u32; 20],
}

/// Replies with a message too large for small slots.
#[ring_kernel(name = "test.big", gpu)]
fn big(_ctx: &mut KernelContext<'_>, m: Sample) -> Option<Big> {
    let mut b = Big { words: [0; 20] };
    b.words[0] = m.next;
    Some(b)
}

async fn runtime(backend: Backend) -> RingKernel {
    RingKernel::builder()
        .backend(backend)
        .build()
        .await
        .unwrap()
}

fn opts() -> LaunchOptions {
    LaunchOptions::default().with_queue_capacity(1024)
}

async fn total(k: &KernelHandle) -> Total {
    k.receive_timeout(WAIT).await.unwrap().decode().unwrap()
}

async fn conformance(backend: Backend) {
    let rt = runtime(backend).await;
    let tag = format!("{}", rt.backend());
    let seed = SplitMix64::from_entropy().next_u64();
    let mut r = SplitMix64::new(seed);
    let ctx = format!("{tag}, seed {seed:#x}");

    // State persists; N messages, N replies in order.
    let acc = rt.launch("test.accumulate", opts()).await.unwrap();
    let n = 300u64;
    let mut sum = 0.0f32;
    for batch in 0..3 {
        let ids = batch * 100..(batch + 1) * 100;
        let values: Vec<f32> = ids.clone().map(|_| r.uniform(-5.0, 5.0)).collect();
        for (id, v) in ids.clone().zip(&values) {
            acc.send(Sample {
                id,
                value: *v,
                next: 0,
            })
            .await
            .unwrap();
        }
        for (id, v) in ids.zip(&values) {
            sum += v;
            let t = total(&acc).await;
            assert_eq!((t.id, t.count, t.from), (id, id as u32 + 1, 0), "{ctx}");
            assert_eq!(t.sum.to_bits(), sum.to_bits(), "running sum at {id}: {ctx}");
        }
    }
    // A message of another type is dropped and leaves the state alone.
    let before = acc.metrics().dropped;
    acc.send(Token::new(7, 1.0)).await.unwrap();
    acc.send(Sample {
        id: n,
        value: 1.0,
        next: 0,
    })
    .await
    .unwrap();
    let t = total(&acc).await;
    assert_eq!((t.id, t.count), (n, n as u32 + 1), "{ctx}");
    let deadline = std::time::Instant::now() + WAIT;
    while acc.metrics().dropped == before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(acc.metrics().dropped, before + 1, "{ctx}");

    // Stateless, in parallel on GPUs: replies in order, none for negative values.
    let rec = rt.launch("test.recur", opts()).await.unwrap();
    let samples: Vec<Sample> = (0..257)
        .map(|id| Sample {
            id,
            value: r.uniform(-0.5, 1.5),
            next: r.below(40) as u32,
        })
        .collect();
    for s in &samples {
        rec.send(*s).await.unwrap();
    }
    for s in samples.iter().filter(|s| s.value >= 0.0) {
        let t = total(&rec).await;
        let want = recur_reference(s);
        assert_eq!(
            (t.id, t.count, t.steps),
            (want.id, want.count, want.steps),
            "{ctx}"
        );
        assert!(
            (t.sum - want.sum).abs() <= 1e-5 * want.sum.abs().max(1.0),
            "recur {}: {} vs {}: {ctx}",
            s.id,
            t.sum,
            want.sum
        );
    }

    // K2K: forward -> sink, the sink's replies carry the forwarder's id.
    let sink = rt
        .launch("test.accumulate", opts().with_name("sink"))
        .await
        .unwrap();
    let fwd = rt.launch("test.forward", opts()).await.unwrap();
    let mut sum = 0.0f32;
    for id in 0..64u64 {
        let v = r.uniform(0.0, 3.0);
        fwd.send(Sample {
            id,
            value: v,
            next: sink.id().0,
        })
        .await
        .unwrap();
        sum += v * 2.0;
        let t = total(&sink).await;
        assert_eq!(
            (t.id, t.count, t.from),
            (id, id as u32 + 1, fwd.id().0),
            "{ctx}"
        );
        assert_eq!(t.sum.to_bits(), sum.to_bits(), "{ctx}");
    }
    // A reply that does not fit the slots: dropped (counted), nothing goes out; one
    // that fits, with bigger slots.
    let small = rt
        .launch("test.big", opts().with_slot_size(128))
        .await
        .unwrap();
    small
        .send(Sample {
            id: 1,
            value: 0.0,
            next: 9,
        })
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while small.metrics().dropped == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(small.metrics().dropped, 1, "{ctx}");
    assert!(
        small
            .receive_timeout(Duration::from_millis(200))
            .await
            .is_err(),
        "{ctx}"
    );
    let roomy = rt
        .launch("test.big", opts().with_slot_size(256).with_name("big256"))
        .await
        .unwrap();
    roomy
        .send(Sample {
            id: 1,
            value: 0.0,
            next: 9,
        })
        .await
        .unwrap();
    let b: Big = roomy.receive_timeout(WAIT).await.unwrap().decode().unwrap();
    assert_eq!(b.words[0], 9, "{ctx}");

    // Two outputs for one message.
    let tee = rt.launch("test.tee", opts()).await.unwrap();
    let sink2 = rt
        .launch("test.accumulate", opts().with_name("sink2"))
        .await
        .unwrap();
    tee.send(Sample {
        id: 5,
        value: 1.5,
        next: sink2.id().0,
    })
    .await
    .unwrap();
    if backend == Backend::Wgpu {
        let deadline = std::time::Instant::now() + WAIT;
        while tee.metrics().dropped == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(tee.metrics().dropped, 1, "{ctx}");
        assert!(tee
            .receive_timeout(Duration::from_millis(200))
            .await
            .is_err());
        assert!(sink2
            .receive_timeout(Duration::from_millis(200))
            .await
            .is_err());
    } else {
        assert_eq!(
            (total(&tee).await.id, total(&sink2).await.id),
            (5, 5),
            "{ctx}"
        );
    }
    rt.shutdown().await.unwrap();
}

/// `recur` on the host, with the same float operations.
fn recur_reference(m: &Sample) -> Total {
    let mut acc = 0.0f32;
    let mut steps = [0u32; 3];
    let n = m.next % 9;
    for k in 0..n {
        acc = acc.mul_add(m.value, 1.0);
        steps[(k % 3) as usize] += k;
    }
    Total {
        id: m.id,
        count: n,
        sum: acc,
        from: 0,
        steps,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_runs_the_rust_handlers() {
    conformance(Backend::Cpu).await;
}

#[cfg(feature = "wgpu")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wgpu_runs_the_generated_wgsl() {
    conformance(Backend::Wgpu).await;
}

#[cfg(feature = "cuda")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs CUDA GPU"]
async fn cuda_runs_the_generated_cuda() {
    conformance(Backend::Cuda).await;
}

#[test]
fn the_gpu_handlers_are_registered() {
    let reg = ringkernel::core::registry::KernelRegistry::new();
    let h = reg.gpu("test.accumulate").unwrap();
    assert_eq!(h.state_bytes, 8);
    let cuda = h.cuda.as_deref().unwrap();
    assert!(cuda.contains("#define RK_TID_Sample 0x52480101u"), "{cuda}");
    assert!(cuda.contains("#define RK_HANDLER_SERIAL 1"), "{cuda}");
    let wgsl = h.wgsl.as_deref().unwrap();
    assert!(
        wgsl.contains("const RK_TID_Total: u32 = 0x52480102u;"),
        "{wgsl}"
    );
    assert_eq!(h.inputs.len(), 1);
    assert_eq!(h.inputs[0].type_id, 0x5248_0101);
    let recur = reg.gpu("test.recur").unwrap();
    assert!(!recur.cuda.unwrap().contains("RK_HANDLER_SERIAL"));
    assert!(reg.cpu("test.forward").is_ok());
}
