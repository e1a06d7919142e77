//! Request/response with correlation ids: `call` finds its own reply even when many
//! requests are in flight, and other messages stay queued for later receives.
//!
//! ```text
//! cargo run -p ringkernel --example request_response                              # CPU
//! cargo run -p ringkernel --features wgpu --example request_response -- --backend wgpu
//! cargo run -p ringkernel --features full --example request_response -- --backend auto
//! ```
//!
//! `--backend` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".

mod common;

use ringkernel::prelude::*;
use std::time::Duration;

/// Request of the `scale` kernel (CPU backend): multiply `value` by `factor`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Scale {
    id: u64,
    factor: f32,
    value: f32,
}

impl RingMessage for Scale {
    const TYPE_ID: u32 = 0x5343_0001;
    const NAME: &'static str = "Scale";
}

/// Its reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Scaled {
    id: u64,
    result: f32,
    _pad: u32,
}

impl RingMessage for Scaled {
    const TYPE_ID: u32 = 0x5343_0002;
    const NAME: &'static str = "Scaled";
}

const WAIT: Duration = Duration::from_secs(5);

common::example_main!(run);

async fn run() -> Result<()> {
    let rt = common::builder()?
        .register_fn("scale", |_ctx: &mut KernelContext<'_>, s: Scale| {
            Some(Scaled {
                id: s.id,
                result: s.factor * s.value,
                _pad: 0,
            })
        })
        .build()
        .await?;
    println!("runtime on {}", rt.backend());
    let echo = rt.launch(builtin::ECHO, LaunchOptions::default()).await?;

    // One call: send, wait for the reply carrying the same correlation id.
    let r: Token = echo.call(Token::new(1, 10.0), WAIT).await?;
    println!("call(10) -> {}", r.value);
    assert_eq!(r.value, 20.0);

    // Many calls at once on one kernel: each gets its own reply.
    let calls = (0..32u64).map(|i| {
        let echo = echo.clone();
        async move {
            echo.call::<Token, Token>(Token::new(i, i as f64), WAIT)
                .await
        }
    });
    let replies = futures_join_all(calls).await?;
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(
            (r.id, r.value),
            (i as u64, 2.0 * i as f64),
            "reply {i} belongs to call {i}"
        );
    }
    println!("32 concurrent calls: every reply matched its request");

    // A plain send whose reply is not collected yet, then a call: the call skips the
    // earlier reply, which is still there for the next receive.
    echo.send(Token::new(100, 1.0)).await?;
    let r: Token = echo.call(Token::new(200, 2.0), WAIT).await?;
    assert_eq!(r.id, 200);
    let earlier: Token = echo.receive_timeout_as(WAIT).await?;
    assert_eq!(earlier.id, 100);
    println!("call skipped an unrelated reply; it was received afterwards");

    // Nothing to receive: a timeout, not a hang.
    match echo
        .receive_timeout_as::<Token>(Duration::from_millis(20))
        .await
    {
        Err(Error::Timeout(d)) => println!("receive with nothing queued: Timeout({d:?})"),
        other => panic!("expected Timeout, got {other:?}"),
    }

    // Different request and reply types (CPU handler written in Rust).
    if rt.backend() == BackendKind::Cpu {
        let scale = rt
            .launch("scale", LaunchOptions::default().with_queue_capacity(4096))
            .await?;
        let s: Scaled = scale
            .call(
                Scale {
                    id: 7,
                    factor: 2.0,
                    value: 21.0,
                },
                WAIT,
            )
            .await?;
        println!("scale(21 x 2) -> {}", s.result);
        assert_eq!((s.id, s.result), (7, 42.0));
        // Asking for the wrong reply type is an error, and the reply is kept.
        scale
            .send(Scale {
                id: 8,
                factor: 3.0,
                value: 1.0,
            })
            .await?;
        match scale.receive_timeout_as::<Token>(WAIT).await {
            Err(Error::TypeMismatch { expected, found }) => {
                assert_eq!((expected, found), (Token::TYPE_ID, Scaled::TYPE_ID))
            }
            other => panic!("expected TypeMismatch, got {other:?}"),
        }
        let kept: Scaled = scale.receive_timeout_as(WAIT).await?;
        assert_eq!((kept.id, kept.result), (8, 3.0));
        println!("wrong reply type: TypeMismatch, and the reply stayed queued");
    }

    // Unknown handler names are errors.
    assert!(matches!(
        rt.launch("no.such.kernel", LaunchOptions::default()).await,
        Err(Error::KernelNotFound(_))
    ));

    rt.shutdown().await?;
    println!("ok");
    Ok(())
}

/// Awaits every future (in order of the results), failing on the first error.
async fn futures_join_all<F, T>(futs: impl IntoIterator<Item = F>) -> Result<Vec<T>>
where
    F: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(
            h.await
                .map_err(|e| Error::Device(format!("task failed: {e}")))??,
        );
    }
    Ok(out)
}
