//! Behavioural tests every backend's runtime must pass, written once against
//! [`RingKernelRuntime`] so the CPU, WebGPU, Metal and CUDA backends run the *same*
//! checks.
//!
//! Each test is an `async fn(&dyn RingKernelRuntime) -> Result<()>` that launches the
//! [built-in kernels](crate::builtin) (`rk.echo`, `rk.stage`, `rk.counter`; the runtime
//! must provide them), drives them through the public API only, terminates what it
//! launched, and returns an [`Error::Device`] naming the test and what went wrong on
//! failure. They are executor-agnostic (no task spawning; waiting uses the runtime's
//! own async API), so any executor can drive them.
//!
//! Only built with the `testkit` feature (enable it in a backend's `[dev-dependencies]`).
//!
//! A backend's test file runs each of them on a fresh runtime, one `#[test]` per check
//! so failures are named, with [`conformance_tests!`](crate::conformance_tests):
//!
//! ```ignore
//! ringkernel_core::conformance_tests! {
//!     runtime: MyRuntime::with_registry(KernelRegistry::new()).await.unwrap(),
//!     scale: ringkernel_core::conformance::Scale::quick(),
//! }
//! ```
//!
//! or all of them at once on one runtime with [`run_all`].

use crate::builtin::{Token, COUNTER, ECHO, STAGE};
use crate::error::{Error, Result};
use crate::lifecycle::LifecycleState;
use crate::message::{Envelope, RingMessage, HEADER_SIZE};
use crate::options::LaunchOptions;
use crate::priority;
use crate::runtime::{KernelHandle, KernelId, RingKernelRuntime, RuntimeExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

/// How long a test waits for a message that must arrive (generous: software GPU
/// adapters and loaded CI machines are slow; a passing run never waits this long).
pub const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(20);

/// How many messages the volume tests push through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    /// Messages in [`echo_many`].
    pub echo_messages: usize,
    /// Tokens through the 3-stage pipeline in [`k2k_pipeline`].
    pub pipeline_messages: usize,
    /// Concurrent callers in [`call_correlation`].
    pub callers: usize,
    /// Calls per caller in [`call_correlation`].
    pub calls_per_caller: usize,
}

impl Scale {
    /// The full CPU run: one million echoed messages.
    pub const fn full() -> Self {
        Scale {
            echo_messages: 1_000_000,
            pipeline_messages: 100_000,
            callers: 8,
            calls_per_caller: 500,
        }
    }
    /// A quick run (debug builds, slow adapters).
    pub const fn quick() -> Self {
        Scale {
            echo_messages: 20_000,
            pipeline_messages: 5_000,
            callers: 4,
            calls_per_caller: 100,
        }
    }
    /// A smoke run: every path once or a few times, for tools that slow a device down
    /// by orders of magnitude (compute-sanitizer's racecheck runs a persistent kernel's
    /// round in milliseconds).
    pub const fn smoke() -> Self {
        Scale {
            echo_messages: 300,
            pipeline_messages: 100,
            callers: 2,
            calls_per_caller: 10,
        }
    }

    /// The scale named by the environment variable `RINGKERNEL_CONFORMANCE_SCALE`
    /// (`full`, `quick` or `smoke`), else `default`; an unknown name is an error naming
    /// the accepted ones.
    ///
    /// ```
    /// use ringkernel_core::conformance::Scale;
    /// // Unset here: the default stands.
    /// assert_eq!(Scale::from_env(Scale::quick()).unwrap(), Scale::quick());
    /// ```
    pub fn from_env(default: Scale) -> Result<Scale> {
        match std::env::var(SCALE_ENV) {
            Err(_) => Ok(default),
            Ok(name) => Scale::named(&name),
        }
    }

    /// The scale called `name` (`full`, `quick` or `smoke`).
    pub fn named(name: &str) -> Result<Scale> {
        match name {
            "full" => Ok(Scale::full()),
            "quick" => Ok(Scale::quick()),
            "smoke" => Ok(Scale::smoke()),
            other => Err(Error::invalid(format!(
                "{SCALE_ENV}={other:?}: expected full, quick or smoke"
            ))),
        }
    }
}

/// The environment variable [`Scale::from_env`] reads.
pub const SCALE_ENV: &str = "RINGKERNEL_CONFORMANCE_SCALE";

impl Default for Scale {
    fn default() -> Self {
        Scale::quick()
    }
}

/// Returns `Err(Error::Device("conformance <test>: <message>"))` unless `cond` holds.
macro_rules! ensure {
    ($test:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(fail($test, format!($($fmt)+)));
        }
    };
}

fn fail(test: &str, msg: impl std::fmt::Display) -> Error {
    Error::Device(format!("conformance {test}: {msg}"))
}

/// Adds the test name to an error from the runtime.
fn ctx(test: &'static str, what: &'static str) -> impl FnOnce(Error) -> Error {
    move |e| fail(test, format!("{what}: unexpected error: {e}"))
}

/// A fresh instance name (tests may share a runtime).
fn unique(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("conf.{test}.{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Launches a built-in kernel under a fresh instance name.
async fn launch(
    rt: &dyn RingKernelRuntime,
    test: &'static str,
    handler: &str,
    opts: LaunchOptions,
) -> Result<KernelHandle> {
    rt.launch(handler, opts.with_name(unique(test)))
        .await
        .map_err(|e| fail(test, format!("launching {handler}: {e}")))
}

/// Terminates what a test launched (ignoring kernels already terminated).
async fn cleanup(kernels: &[KernelHandle]) {
    for k in kernels {
        if k.state() != LifecycleState::Terminated {
            let _ = k.terminate().await;
        }
    }
}

/// Runs `body`, then terminates `kernels` whatever the outcome.
async fn with_cleanup<F: Future<Output = Result<()>>>(
    kernels: &[KernelHandle],
    body: F,
) -> Result<()> {
    let r = body.await;
    cleanup(kernels).await;
    r
}

/// Polls every future to completion, concurrently (no executor needed).
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(out.iter_mut().filter_map(Option::take).collect())
        }
    })
    .await
}

/// Checks that `r` is the error `pred` accepts.
fn expect_err<T: std::fmt::Debug>(
    test: &str,
    what: &str,
    r: Result<T>,
    pred: impl Fn(&Error) -> bool,
) -> Result<Error> {
    match r {
        Err(e) if pred(&e) => Ok(e),
        Err(e) => Err(fail(test, format!("{what}: wrong error {e:?}"))),
        Ok(v) => Err(fail(
            test,
            format!("{what}: expected an error, got Ok({v:?})"),
        )),
    }
}

/// Checks an echo reply of token `id` sent with value `value`.
fn check_echo(test: &str, t: &Token, id: u64, value: f64) -> Result<()> {
    ensure!(
        test,
        t.id == id,
        "reply for token {} arrived where {id} was expected (order or correlation broken)",
        t.id
    );
    ensure!(
        test,
        t.value == value * 2.0,
        "token {id}: value {} is not 2 × {value}",
        t.value
    );
    ensure!(test, t.hops == 1, "token {id}: {} hops, expected 1", t.hops);
    Ok(())
}

/// Lifecycle through the handle: `Launched → Active ⇄ Deactivated → Terminated`;
/// activating an active kernel and deactivating a deactivated one are no-ops; every
/// other transition the state machine forbids is [`Error::InvalidState`] with the
/// right `from`/`to`, leaving the state unchanged.
pub async fn lifecycle(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "lifecycle";
    use LifecycleState::*;
    let k = launch(
        rt,
        T,
        ECHO,
        LaunchOptions::default().with_auto_activate(false),
    )
    .await?;
    let never = launch(
        rt,
        T,
        ECHO,
        LaunchOptions::default().with_auto_activate(false),
    )
    .await?;
    let kernels = [k.clone(), never.clone()];
    with_cleanup(&kernels, async {
        ensure!(T, k.state() == Launched, "a kernel launched without auto-activate is {:?}", k.state());

        async fn invalid(k: &KernelHandle, op: &str, from: LifecycleState, to: LifecycleState) -> Result<()> {
            let r = match op {
                "activate" => k.activate().await,
                "deactivate" => k.deactivate().await,
                _ => k.terminate().await.map(|_| ()),
            };
            match r {
                Err(Error::InvalidState { from: f, to: t }) if f == from && t == to => {}
                other => return Err(fail(T, format!("{op} in {from:?}: expected InvalidState {{ {from:?} -> {to:?} }}, got {other:?}"))),
            }
            ensure!(T, k.state() == from, "a refused {op} changed the state from {from:?} to {:?}", k.state());
            Ok(())
        }

        invalid(&k, "deactivate", Launched, Deactivated).await?;
        k.activate().await.map_err(ctx(T, "activate from Launched"))?;
        ensure!(T, k.state() == Active, "after activate: {:?}", k.state());
        // Asking for the state the kernel is in is a no-op, not an error.
        k.activate().await.map_err(ctx(T, "activate while active"))?;
        ensure!(T, k.state() == Active, "after a second activate: {:?}", k.state());
        let r: Token = k.call(Token::new(1, 1.5), ARRIVAL_TIMEOUT).await.map_err(ctx(T, "call while active"))?;
        check_echo(T, &r, 1, 1.5)?;
        k.deactivate().await.map_err(ctx(T, "deactivate"))?;
        ensure!(T, k.state() == Deactivated, "after deactivate: {:?}", k.state());
        k.deactivate().await.map_err(ctx(T, "deactivate while deactivated"))?;
        ensure!(T, k.state() == Deactivated, "after a second deactivate: {:?}", k.state());
        k.activate().await.map_err(ctx(T, "activate from Deactivated"))?;
        ensure!(T, k.state() == Active, "after re-activate: {:?}", k.state());
        let r: Token = k.call(Token::new(2, 3.0), ARRIVAL_TIMEOUT).await.map_err(ctx(T, "call after re-activate"))?;
        check_echo(T, &r, 2, 3.0)?;
        k.terminate().await.map_err(ctx(T, "terminate"))?;
        ensure!(T, k.state() == Terminated, "after terminate: {:?}", k.state());
        invalid(&k, "activate", Terminated, Active).await?;
        invalid(&k, "deactivate", Terminated, Deactivated).await?;
        invalid(&k, "terminate", Terminated, Terminating).await?;

        // A kernel that was never activated can be terminated straight from Launched.
        invalid(&never, "deactivate", Launched, Deactivated).await?;
        never.terminate().await.map_err(ctx(T, "terminate from Launched"))?;
        ensure!(T, never.state() == Terminated, "terminated from Launched: {:?}", never.state());
        Ok(())
    })
    .await
}

/// Several concurrent callers share one kernel; every `call` gets the reply to its
/// own request (correlation ids), none is lost or delivered twice.
pub async fn call_correlation(
    rt: &dyn RingKernelRuntime,
    callers: usize,
    calls_per_caller: usize,
) -> Result<()> {
    const T: &str = "call_correlation";
    let k = launch(rt, T, ECHO, LaunchOptions::default()).await?;
    let kernels = [k.clone()];
    with_cleanup(&kernels, async {
        let futs: Vec<_> = (0..callers as u64)
            .map(|c| {
                let k = k.clone();
                async move {
                    for j in 0..calls_per_caller as u64 {
                        let id = (c << 32) | j;
                        let value = (c * 1000 + j) as f64 + 0.25;
                        let r: Token = k
                            .call(Token::new(id, value), ARRIVAL_TIMEOUT)
                            .await
                            .map_err(|e| fail(T, format!("caller {c}, call {j}: {e}")))?;
                        check_echo(T, &r, id, value)?;
                    }
                    Ok::<(), Error>(())
                }
            })
            .collect();
        for r in join_all(futs).await {
            r?;
        }
        // Nothing left over: every reply was taken by its caller.
        let extra = k.try_receive::<Token>().map_err(ctx(T, "try_receive"))?;
        ensure!(
            T,
            extra.is_none(),
            "a reply was left over after all calls returned: {extra:?}"
        );
        Ok(())
    })
    .await
}

/// Pushes `n` messages through an echo kernel, keeping the queues busy (sending while
/// receiving): every reply arrives, in order, with the right value.
pub async fn echo_many(rt: &dyn RingKernelRuntime, n: usize) -> Result<()> {
    const T: &str = "echo_many";
    let k = launch(
        rt,
        T,
        ECHO,
        LaunchOptions::default().with_queue_capacity(1024),
    )
    .await?;
    echo_through(T, &k, n, 1024).await
}

/// [`echo_many`] through a kernel whose slots are fitted to a [`Token`] (144 bytes:
/// not a power of two) in a ring of 64, so the ring wraps many times at that stride:
/// every reply arrives in order with the right value, and a payload one byte over the
/// fitted slot is [`Error::MessageTooLarge`] with the slot's own maximum.
pub async fn fitted_slot(rt: &dyn RingKernelRuntime, n: usize) -> Result<()> {
    const T: &str = "fitted_slot";
    let slot = (HEADER_SIZE + std::mem::size_of::<Token>()).next_multiple_of(16);
    let opts = LaunchOptions::default()
        .with_queue_capacity(64)
        .with_slot_size(slot);
    let k = launch(rt, T, ECHO, opts).await?;
    let max = slot - HEADER_SIZE;
    let big = Envelope::from_bytes(Token::TYPE_ID, &vec![0x5Au8; max + 1]);
    if let Err(e) = expect_err(
        T,
        "send of a payload one byte over the slot",
        k.send_envelope(&big).await,
        |e| *e == Error::MessageTooLarge { size: max + 1, max },
    ) {
        cleanup(std::slice::from_ref(&k)).await;
        return Err(e);
    }
    echo_through(T, &k, n, 64).await
}

/// Sends `n` tokens to the echo kernel `k` (at most `window` ahead of the replies) and
/// checks every reply, in order; terminates `k`.
async fn echo_through(test: &'static str, k: &KernelHandle, n: usize, window: usize) -> Result<()> {
    let window = window as u64;
    with_cleanup(std::slice::from_ref(k), async {
        let n = n as u64;
        let (mut sent, mut received) = (0u64, 0u64);
        while received < n {
            // Send what fits without waiting, at most a window ahead of the replies.
            while sent < n && sent - received < window {
                match k.try_send(&Token::new(sent, sent as f64)) {
                    Ok(_) => sent += 1,
                    Err(Error::QueueFull { .. }) => break,
                    Err(e) => return Err(fail(test, format!("try_send of message {sent}: {e}"))),
                }
            }
            // Every reply so far is in, so the kernel has taken every message out of
            // its input queue: a full queue now would be a queue bug (never wait on it).
            ensure!(test, sent > received, "input queue refuses message {sent} although all {received} sent messages were answered");
            let t: Token = k
                .receive_timeout_as(ARRIVAL_TIMEOUT)
                .await
                .map_err(|e| fail(test, format!("waiting for reply {received} of {n} ({sent} sent): {e}")))?;
            check_echo(test, &t, received, received as f64)?;
            received += 1;
            while let Some(t) = k.try_receive::<Token>().map_err(ctx(test, "try_receive"))? {
                ensure!(test, received < sent, "more replies than messages sent");
                check_echo(test, &t, received, received as f64)?;
                received += 1;
            }
        }
        let extra = k.try_receive::<Token>().map_err(ctx(test, "try_receive"))?;
        ensure!(test, extra.is_none(), "a reply beyond the {n} messages sent: {extra:?}");
        Ok(())
    })
    .await
}

/// Messages sent to a deactivated kernel are kept, not processed, and are processed in
/// order after `activate`.
pub async fn deactivate_keeps_messages(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "deactivate_keeps_messages";
    let k = launch(rt, T, ECHO, LaunchOptions::default()).await?;
    let kernels = [k.clone()];
    with_cleanup(&kernels, async {
        let r: Token = k
            .call(Token::new(100, 1.0), ARRIVAL_TIMEOUT)
            .await
            .map_err(ctx(T, "call"))?;
        check_echo(T, &r, 100, 1.0)?;
        k.deactivate().await.map_err(ctx(T, "deactivate"))?;
        for i in 0..10u64 {
            k.send(Token::new(i, i as f64))
                .await
                .map_err(ctx(T, "send while deactivated"))?;
        }
        // Give a (wrongly) running kernel ample time to process them.
        crate::util::sleep(Duration::from_millis(100)).await;
        let early = k.try_receive::<Token>().map_err(ctx(T, "try_receive"))?;
        ensure!(
            T,
            early.is_none(),
            "a deactivated kernel processed a message: {early:?}"
        );
        k.activate().await.map_err(ctx(T, "activate"))?;
        for i in 0..10u64 {
            let t: Token = k.receive_timeout_as(ARRIVAL_TIMEOUT).await.map_err(|e| {
                fail(
                    T,
                    format!("message {i} queued while deactivated never came back: {e}"),
                )
            })?;
            check_echo(T, &t, i, i as f64)?;
        }
        Ok(())
    })
    .await
}

/// Terminate with messages in flight: an active kernel drains its queue (every reply can
/// still be received after termination); a deactivated kernel returns its queued
/// messages, in order, in [`TerminateReport::undelivered`](crate::runtime::TerminateReport::undelivered).
pub async fn terminate_in_flight(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "terminate_in_flight";
    let active = launch(
        rt,
        T,
        ECHO,
        LaunchOptions::default().with_queue_capacity(256),
    )
    .await?;
    let paused = launch(
        rt,
        T,
        ECHO,
        LaunchOptions::default().with_queue_capacity(256),
    )
    .await?;
    let kernels = [active.clone(), paused.clone()];
    with_cleanup(&kernels, async {
        const N: u64 = 200;
        for i in 0..N {
            active
                .send(Token::new(i, i as f64))
                .await
                .map_err(ctx(T, "send to the active kernel"))?;
        }
        let report = active
            .terminate()
            .await
            .map_err(ctx(T, "terminate the active kernel"))?;
        ensure!(
            T,
            active.state() == LifecycleState::Terminated,
            "after terminate: {:?}",
            active.state()
        );
        ensure!(
            T,
            report.undelivered.is_empty(),
            "an active kernel must drain, but {} messages came back undelivered",
            report.undelivered.len()
        );
        ensure!(
            T,
            report.drained <= N,
            "drained {} of only {N} messages",
            report.drained
        );
        for i in 0..N {
            let t: Token = active
                .receive_timeout_as(ARRIVAL_TIMEOUT)
                .await
                .map_err(|e| {
                    fail(
                        T,
                        format!("reply {i} of {N} missing after a draining terminate: {e}"),
                    )
                })?;
            check_echo(T, &t, i, i as f64)?;
        }
        let m = active.metrics();
        ensure!(
            T,
            m.dropped == 0,
            "{} messages dropped during the drain",
            m.dropped
        );

        paused.deactivate().await.map_err(ctx(T, "deactivate"))?;
        const M: u64 = 20;
        for i in 0..M {
            paused
                .send(Token::new(i, i as f64))
                .await
                .map_err(ctx(T, "send to the deactivated kernel"))?;
        }
        let report = paused
            .terminate()
            .await
            .map_err(ctx(T, "terminate the deactivated kernel"))?;
        ensure!(
            T,
            report.drained == 0,
            "a deactivated kernel processed {} messages while terminating",
            report.drained
        );
        ensure!(
            T,
            report.undelivered.len() as u64 == M,
            "{} of {M} queued messages came back",
            report.undelivered.len()
        );
        for (i, env) in report.undelivered.iter().enumerate() {
            let t: Token = env
                .decode()
                .map_err(ctx(T, "decode an undelivered message"))?;
            ensure!(
                T,
                t.id == i as u64 && t.hops == 0,
                "undelivered message {i} is {t:?}"
            );
        }

        // A terminated kernel refuses new messages.
        for k in [&active, &paused] {
            expect_err(
                T,
                "try_send to a terminated kernel",
                k.try_send(&Token::new(9, 9.0)),
                |e| matches!(e, Error::KernelTerminated(_)),
            )?;
            expect_err(
                T,
                "send to a terminated kernel",
                k.send(Token::new(9, 9.0)).await,
                |e| matches!(e, Error::KernelTerminated(_)),
            )?;
        }
        Ok(())
    })
    .await
}

/// An unknown kernel name is [`Error::KernelNotFound`]; the name stays free.
pub async fn unknown_kernel(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "unknown_kernel";
    let name = unique(T);
    expect_err(
        T,
        "launch of an unregistered handler",
        rt.launch(
            "rk.no-such-kernel",
            LaunchOptions::default().with_name(name.clone()),
        )
        .await,
        |e| matches!(e, Error::KernelNotFound(_)),
    )?;
    // The failed launch must not keep the instance name reserved.
    let k = rt
        .launch(ECHO, LaunchOptions::default().with_name(name))
        .await
        .map_err(ctx(T, "launch under the name of a failed launch"))?;
    with_cleanup(std::slice::from_ref(&k), async {
        let r: Token = k
            .call(Token::new(5, 5.0), ARRIVAL_TIMEOUT)
            .await
            .map_err(ctx(T, "call"))?;
        check_echo(T, &r, 5, 5.0)
    })
    .await
}

/// A queue capacity that is not a power of two is [`Error::InvalidArgument`]; so is a
/// bad slot size; the instance name stays free.
pub async fn bad_capacity(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "bad_capacity";
    let name = unique(T);
    for (what, opts) in [
        (
            "queue capacity 1000",
            LaunchOptions::default().with_queue_capacity(1000),
        ),
        (
            "queue capacity 0",
            LaunchOptions::default().with_queue_capacity(0),
        ),
        (
            "output capacity 3",
            LaunchOptions::default().with_output_capacity(3),
        ),
        (
            "slot size 100",
            LaunchOptions::default().with_slot_size(100),
        ),
    ] {
        expect_err(
            T,
            what,
            rt.launch(ECHO, opts.with_name(name.clone())).await,
            |e| matches!(e, Error::InvalidArgument(_)),
        )?;
    }
    ensure!(
        T,
        rt.kernel(&name.as_str().into()).is_none(),
        "a failed launch left a kernel behind"
    );
    let k = rt
        .launch(ECHO, LaunchOptions::default().with_name(name))
        .await
        .map_err(ctx(T, "launch under the name of failed launches"))?;
    with_cleanup(std::slice::from_ref(&k), async {
        let r: Token = k
            .call(Token::new(6, 6.0), ARRIVAL_TIMEOUT)
            .await
            .map_err(ctx(T, "call"))?;
        check_echo(T, &r, 6, 6.0)
    })
    .await
}

/// A payload larger than a slot is [`Error::MessageTooLarge`] and corrupts nothing: the
/// messages sent before and after it arrive; a payload of exactly the maximum fits.
pub async fn oversized_payload(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "oversized_payload";
    let slot = 256;
    let k = launch(rt, T, ECHO, LaunchOptions::default().with_slot_size(slot)).await?;
    with_cleanup(std::slice::from_ref(&k), async {
        let max = slot - HEADER_SIZE;
        k.send(Token::new(1, 1.0))
            .await
            .map_err(ctx(T, "send before"))?;
        let big = Envelope::from_bytes(Token::TYPE_ID, &vec![0xA5u8; max + 1]);
        let e = expect_err(
            T,
            "send of an oversized payload",
            k.send_envelope(&big).await,
            |e| matches!(e, Error::MessageTooLarge { .. }),
        )?;
        ensure!(
            T,
            e == Error::MessageTooLarge { size: max + 1, max },
            "wrong sizes in {e:?}"
        );
        let far = Envelope::from_bytes(Token::TYPE_ID, &vec![0u8; 64 * 1024]);
        expect_err(
            T,
            "send of a 64 KiB payload",
            k.send_envelope(&far).await,
            |e| matches!(e, Error::MessageTooLarge { .. }),
        )?;
        k.send(Token::new(2, 2.0))
            .await
            .map_err(ctx(T, "send after"))?;
        for (id, v) in [(1, 1.0), (2, 2.0)] {
            let t: Token = k.receive_timeout_as(ARRIVAL_TIMEOUT).await.map_err(|e| {
                fail(
                    T,
                    format!("message {id} lost around the oversized one: {e}"),
                )
            })?;
            check_echo(T, &t, id, v)?;
        }
        let extra = k.try_receive::<Token>().map_err(ctx(T, "try_receive"))?;
        ensure!(T, extra.is_none(), "an extra message appeared: {extra:?}");
        Ok(())
    })
    .await
}

/// `receive_timeout` with nothing to receive is [`Error::Timeout`] after (not before)
/// the timeout; a reply that arrives later is still received.
pub async fn receive_timeout(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "receive_timeout";
    let k = launch(rt, T, ECHO, LaunchOptions::default()).await?;
    with_cleanup(std::slice::from_ref(&k), async {
        let timeout = Duration::from_millis(60);
        let start = Instant::now();
        let r = k.receive_timeout_as::<Token>(timeout).await;
        let waited = start.elapsed();
        let e = expect_err(T, "receive with nothing sent", r, |e| {
            matches!(e, Error::Timeout(_))
        })?;
        ensure!(
            T,
            e == Error::Timeout(timeout),
            "timeout error carries the wrong duration: {e:?}"
        );
        ensure!(
            T,
            waited >= timeout.mul_f64(0.9),
            "gave up after {waited:?}, before the {timeout:?} timeout"
        );
        k.send(Token::new(3, 3.0)).await.map_err(ctx(T, "send"))?;
        let t: Token = k
            .receive_timeout_as(ARRIVAL_TIMEOUT)
            .await
            .map_err(ctx(T, "receive after a timeout"))?;
        check_echo(T, &t, 3, 3.0)
    })
    .await
}

/// A 3-stage K2K pipeline of `rk.stage` kernels: `n` tokens enter stage 1 and leave
/// stage 3, none lost, in order, each with three strictly increasing HLC stamps (one
/// per stage), each stamp after the host's send.
pub async fn k2k_pipeline(rt: &dyn RingKernelRuntime, n: usize) -> Result<()> {
    const T: &str = "k2k_pipeline";
    let opts = LaunchOptions::default().with_queue_capacity(512);
    let window = 256u64;
    let s1 = launch(rt, T, STAGE, opts.clone()).await?;
    let s2 = launch(rt, T, STAGE, opts.clone()).await?;
    let s3 = launch(rt, T, STAGE, opts).await?;
    let kernels = [s1.clone(), s2.clone(), s3.clone()];
    with_cleanup(&kernels, async {
        let route: [KernelId; 3] = [s1.id(), s2.id(), s3.id()];
        let start_stamp = rt.core().hlc().tick();
        let n = n as u64;
        let (mut sent, mut received) = (0u64, 0u64);
        let check = |t: &Token, expect: u64| -> Result<()> {
            ensure!(
                T,
                t.id == expect,
                "token {} left the pipeline where {expect} was expected",
                t.id
            );
            ensure!(T, t.hops == 3, "token {}: {} hops", t.id, t.hops);
            ensure!(
                T,
                t.value == expect as f64 + 3.0,
                "token {}: value {} (each stage adds 1)",
                t.id,
                t.value
            );
            let s = &t.stamps;
            ensure!(
                T,
                s[0] > start_stamp.packed() && s[0] < s[1] && s[1] < s[2],
                "token {}: stamps not strictly increasing along the path: {:?} (host at {:?})",
                t.id,
                &s[..3],
                start_stamp
            );
            Ok(())
        };
        while received < n {
            while sent < n && sent - received < window {
                match s1.try_send(&Token::routed(sent, sent as f64, &route)?) {
                    Ok(_) => sent += 1,
                    Err(Error::QueueFull { .. }) => break,
                    Err(e) => return Err(fail(T, format!("send of token {sent}: {e}"))),
                }
            }
            ensure!(
                T,
                sent > received,
                "stage 1 refuses token {sent} although all {received} sent tokens came out"
            );
            let t: Token = s3.receive_timeout_as(ARRIVAL_TIMEOUT).await.map_err(|e| {
                fail(
                    T,
                    format!("waiting for token {received} of {n} ({sent} sent): {e}"),
                )
            })?;
            check(&t, received)?;
            received += 1;
            while let Some(t) = s3.try_receive::<Token>().map_err(ctx(T, "try_receive"))? {
                check(&t, received)?;
                received += 1;
            }
        }
        for (i, s) in [&s1, &s2].iter().enumerate() {
            let stray = s.try_receive::<Token>().map_err(ctx(T, "try_receive"))?;
            ensure!(
                T,
                stray.is_none(),
                "stage {} replied to the host instead of forwarding: {stray:?}",
                i + 1
            );
        }
        Ok(())
    })
    .await
}

/// Pub/sub fan-out: `rk.counter` kernels subscribed with MQTT filters each receive
/// exactly the publishes their filter matches; after `unsubscribe` a kernel receives
/// nothing more.
pub async fn pubsub_fanout(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "pubsub_fanout";
    let a = launch(rt, T, COUNTER, LaunchOptions::default()).await?;
    let b = launch(rt, T, COUNTER, LaunchOptions::default()).await?;
    let c = launch(rt, T, COUNTER, LaunchOptions::default()).await?;
    let kernels = [a.clone(), b.clone(), c.clone()];
    with_cleanup(&kernels, async {
        let root = unique(T).replace('.', "_");
        let sub_a = rt
            .subscribe(a.id(), &format!("{root}/#"))
            .map_err(ctx(T, "subscribe a"))?;
        rt.subscribe(b.id(), &format!("{root}/x"))
            .map_err(ctx(T, "subscribe b"))?;
        rt.subscribe(c.id(), &format!("{root}/+/deep"))
            .map_err(ctx(T, "subscribe c"))?;

        // (topic, kernels expected to receive it)
        let plan: [(String, &[&KernelHandle]); 4] = [
            (format!("{root}/x"), &[&a, &b]),
            (format!("{root}/y/deep"), &[&a, &c]),
            (root.clone(), &[&a]),
            (format!("{root}/y/other"), &[&a]),
        ];
        let mut expected = [0u64; 3];
        for (i, (topic, targets)) in plan.iter().enumerate() {
            let report = rt
                .publish(topic, &Token::new(i as u64, 0.0))
                .map_err(|e| fail(T, format!("publish to {topic}: {e}")))?;
            ensure!(
                T,
                report.delivered == targets.len()
                    && report.queue_full.is_empty()
                    && report.not_found.is_empty(),
                "publish to {topic}: {report:?}, expected {} deliveries",
                targets.len()
            );
            for (slot, k) in [&a, &b, &c].iter().enumerate() {
                if targets.iter().any(|t| t.id() == k.id()) {
                    expected[slot] += 1;
                    let t: Token = k.receive_timeout_as(ARRIVAL_TIMEOUT).await.map_err(|e| {
                        fail(
                            T,
                            format!("subscriber {slot} missed the publish to {topic}: {e}"),
                        )
                    })?;
                    ensure!(
                        T,
                        t.id == i as u64,
                        "subscriber {slot} got token {} for publish {i}",
                        t.id
                    );
                    ensure!(
                        T,
                        t.value == expected[slot] as f64,
                        "subscriber {slot} counted {} messages, expected {}",
                        t.value,
                        expected[slot]
                    );
                }
            }
        }
        for (slot, k) in [&a, &b, &c].iter().enumerate() {
            let stray = k.try_receive::<Token>().map_err(ctx(T, "try_receive"))?;
            ensure!(
                T,
                stray.is_none(),
                "subscriber {slot} received a publish its filter does not match: {stray:?}"
            );
        }

        rt.unsubscribe(sub_a).map_err(ctx(T, "unsubscribe"))?;
        expect_err(T, "unsubscribing twice", rt.unsubscribe(sub_a), |e| {
            matches!(e, Error::InvalidArgument(_))
        })?;
        let report = rt
            .publish(&format!("{root}/x"), &Token::new(99, 0.0))
            .map_err(ctx(T, "publish after unsubscribe"))?;
        ensure!(
            T,
            report.delivered == 1,
            "after unsubscribing a, publish delivered to {} kernels",
            report.delivered
        );
        let t: Token = b
            .receive_timeout_as(ARRIVAL_TIMEOUT)
            .await
            .map_err(ctx(T, "b after unsubscribe of a"))?;
        ensure!(T, t.id == 99 && t.value == 2.0, "b got {t:?}");
        let r = a
            .receive_timeout_as::<Token>(Duration::from_millis(50))
            .await;
        expect_err(T, "a receiving after unsubscribe", r, |e| {
            matches!(e, Error::Timeout(_))
        })?;
        Ok(())
    })
    .await
}

/// With `wait_when_full(false)` a full input queue is [`Error::QueueFull`] (from `send`
/// and `try_send`) and nothing queued is lost: once the kernel is activated every queued
/// message is processed.
pub async fn queue_full(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "queue_full";
    const CAP: usize = 4;
    let opts = LaunchOptions::default()
        .with_queue_capacity(CAP)
        .with_output_capacity(64)
        .with_wait_when_full(false)
        .with_auto_activate(false);
    let k = launch(rt, T, ECHO, opts).await?;
    with_cleanup(std::slice::from_ref(&k), async {
        for i in 0..CAP as u64 {
            k.try_send(&Token::new(i, i as f64))
                .map_err(ctx(T, "try_send into a queue with room"))?;
        }
        let e = expect_err(
            T,
            "try_send into a full queue",
            k.try_send(&Token::new(90, 0.0)),
            |e| matches!(e, Error::QueueFull { .. }),
        )?;
        ensure!(
            T,
            e == Error::QueueFull { capacity: CAP },
            "wrong capacity in {e:?}"
        );
        expect_err(
            T,
            "send into a full queue without waiting",
            k.send(Token::new(91, 0.0)).await,
            |e| matches!(e, Error::QueueFull { .. }),
        )?;
        k.activate().await.map_err(ctx(T, "activate"))?;
        for i in 0..CAP as u64 {
            let t: Token = k
                .receive_timeout_as(ARRIVAL_TIMEOUT)
                .await
                .map_err(|e| fail(T, format!("queued message {i} lost after QueueFull: {e}")))?;
            check_echo(T, &t, i, i as f64)?;
        }
        let r: Token = k
            .call(Token::new(7, 7.0), ARRIVAL_TIMEOUT)
            .await
            .map_err(ctx(T, "call once there is room"))?;
        check_echo(T, &r, 7, 7.0)?;
        let extra = k.try_receive::<Token>().map_err(ctx(T, "try_receive"))?;
        ensure!(
            T,
            extra.is_none(),
            "a refused message was processed after all: {extra:?}"
        );
        Ok(())
    })
    .await
}

/// Receives `n` replies and returns their token ids, in arrival order.
async fn receive_ids(test: &'static str, k: &KernelHandle, n: usize) -> Result<Vec<u64>> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let env = k
            .receive_envelope(Some(ARRIVAL_TIMEOUT))
            .await
            .map_err(|e| fail(test, format!("reply {i} of {n} never came: {e}")))?;
        let t: Token = env.decode().map_err(ctx(test, "decode a reply"))?;
        ids.push(t.id);
    }
    Ok(ids)
}

/// Priority overtakes: with the kernel not yet active, LOW messages are queued, then
/// one HIGH ([`KernelHandle::send_with_priority`]) and one CRITICAL (an envelope
/// [`with_priority`](Envelope::with_priority)) and one NORMAL; once activated the
/// kernel handles CRITICAL, HIGH, NORMAL, then the LOW ones in the order sent.
pub async fn priority_order(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "priority_order";
    const LOWS: u64 = 8;
    let opts = LaunchOptions::default()
        .with_queue_capacity(16)
        .with_output_capacity(64)
        .without_auto_activate();
    let k = launch(rt, T, ECHO, opts).await?;
    with_cleanup(std::slice::from_ref(&k), async {
        for i in 0..LOWS {
            k.send_with_priority(Token::new(i, i as f64), priority::LOW)
                .await
                .map_err(ctx(T, "send LOW"))?;
        }
        k.send_with_priority(Token::new(100, 1.0), priority::HIGH)
            .await
            .map_err(ctx(T, "send HIGH"))?;
        k.send(Token::new(50, 1.0))
            .await
            .map_err(ctx(T, "send NORMAL"))?;
        let critical = Envelope::new(&Token::new(200, 1.0)).with_priority(priority::CRITICAL);
        k.send_envelope(&critical)
            .await
            .map_err(ctx(T, "send a CRITICAL envelope"))?;
        k.activate().await.map_err(ctx(T, "activate"))?;
        let ids = receive_ids(T, &k, LOWS as usize + 3).await?;
        let expected: Vec<u64> = [200, 100, 50].into_iter().chain(0..LOWS).collect();
        ensure!(
            T,
            ids == expected,
            "replies in the order {ids:?}, expected {expected:?} (highest priority first, FIFO within one)"
        );
        Ok(())
    })
    .await
}

/// One lane per level: a full LOW lane refuses LOW sends ([`Error::QueueFull`]) but
/// not HIGH ones, and terminating the inactive kernel hands back the messages of every
/// lane, highest first.
pub async fn priority_lanes(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "priority_lanes";
    const CAP: usize = 4;
    let opts = LaunchOptions::default()
        .with_queue_capacity(CAP)
        .with_wait_when_full(false)
        .without_auto_activate();
    let k = launch(rt, T, ECHO, opts).await?;
    with_cleanup(std::slice::from_ref(&k), async {
        for i in 0..CAP as u64 {
            k.send_with_priority(Token::new(i, 1.0), priority::LOW)
                .await
                .map_err(ctx(T, "send LOW into a lane with room"))?;
        }
        expect_err(
            T,
            "LOW send into the full LOW lane",
            k.send_with_priority(Token::new(90, 1.0), priority::LOW)
                .await,
            |e| matches!(e, Error::QueueFull { .. }),
        )?;
        k.send_with_priority(Token::new(100, 1.0), priority::HIGH)
            .await
            .map_err(ctx(T, "HIGH send while the LOW lane is full"))?;
        k.send_with_priority(Token::new(101, 1.0), priority::HIGH + 1)
            .await
            .map_err(ctx(T, "second HIGH send"))?;
        let report = k.terminate().await.map_err(ctx(T, "terminate"))?;
        let ids: Vec<u64> = report
            .undelivered
            .iter()
            .map(|e| e.decode::<Token>().map(|t| t.id))
            .collect::<Result<_>>()
            .map_err(ctx(T, "decode an undelivered message"))?;
        let expected: Vec<u64> = [100, 101].into_iter().chain(0..CAP as u64).collect();
        ensure!(
            T,
            ids == expected,
            "undelivered {ids:?}, expected {expected:?} (every lane, highest first)"
        );
        let prios: Vec<u8> = report
            .undelivered
            .iter()
            .map(|e| e.header.priority())
            .collect();
        ensure!(
            T,
            prios[..2] == [priority::HIGH, priority::HIGH + 1],
            "undelivered messages lost their priority: {prios:?}"
        );
        Ok(())
    })
    .await
}

/// A kernel's outputs carry its [`LaunchOptions::priority`]: the replies of a HIGH
/// kernel are HIGH (a default kernel's NORMAL), and its K2K sends are HIGH, so they
/// overtake LOW messages waiting at the destination.
pub async fn kernel_priority(rt: &dyn RingKernelRuntime) -> Result<()> {
    const T: &str = "kernel_priority";
    let high = launch(
        rt,
        T,
        STAGE,
        LaunchOptions::default().with_priority(priority::HIGH),
    )
    .await?;
    let dest = launch(
        rt,
        T,
        STAGE,
        LaunchOptions::default()
            .with_queue_capacity(16)
            .without_auto_activate(),
    )
    .await?;
    let kernels = [high.clone(), dest.clone()];
    with_cleanup(&kernels, async {
        // A reply of the HIGH kernel.
        high.send(Token::routed(1, 1.0, &[high.id()])?)
            .await
            .map_err(ctx(T, "send to the HIGH kernel"))?;
        let env = high
            .receive_envelope(Some(ARRIVAL_TIMEOUT))
            .await
            .map_err(ctx(T, "reply of the HIGH kernel"))?;
        ensure!(
            T,
            env.header.priority() == priority::HIGH,
            "a HIGH kernel's reply has priority {}",
            env.header.priority()
        );
        // LOW messages wait at the inactive destination; the HIGH kernel's K2K send
        // must overtake them.
        for i in 0..4u64 {
            dest.send_with_priority(Token::routed(10 + i, 1.0, &[dest.id()])?, priority::LOW)
                .await
                .map_err(ctx(T, "send LOW to the destination"))?;
        }
        high.send(Token::routed(2, 1.0, &[high.id(), dest.id()])?)
            .await
            .map_err(ctx(T, "send through the HIGH kernel"))?;
        // The HIGH kernel counts its second message as processed once its handler has
        // made the K2K send (device-side K2K on CUDA bypasses the host, so the
        // destination's host-side `received` does not see it).
        let deadline = Instant::now() + ARRIVAL_TIMEOUT;
        while high.metrics().processed < 2 {
            ensure!(
                T,
                Instant::now() < deadline,
                "the HIGH kernel never processed the message it forwards"
            );
            crate::util::sleep(Duration::from_millis(1)).await;
        }
        dest.activate().await.map_err(ctx(T, "activate"))?;
        let mut ids = Vec::new();
        for i in 0..5 {
            let env = dest
                .receive_envelope(Some(ARRIVAL_TIMEOUT))
                .await
                .map_err(|e| fail(T, format!("reply {i} of the destination: {e}")))?;
            ensure!(
                T,
                env.header.priority() == priority::NORMAL,
                "a NORMAL kernel's reply has priority {}",
                env.header.priority()
            );
            ids.push(env.decode::<Token>().map_err(ctx(T, "decode"))?.id);
        }
        ensure!(
            T,
            ids == [2, 10, 11, 12, 13],
            "replies {ids:?}: the HIGH kernel's K2K send did not overtake the LOW queue"
        );
        Ok(())
    })
    .await
}

/// One conformance test, by name (what [`conformance_tests!`](crate::conformance_tests)
/// makes a `#[test]` of).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Case {
    /// [`lifecycle`].
    Lifecycle,
    /// [`call_correlation`] with [`Scale::callers`] × [`Scale::calls_per_caller`].
    CallCorrelation,
    /// [`echo_many`] with [`Scale::echo_messages`].
    EchoMany,
    /// [`deactivate_keeps_messages`].
    DeactivateKeepsMessages,
    /// [`terminate_in_flight`].
    TerminateInFlight,
    /// [`unknown_kernel`].
    UnknownKernel,
    /// [`bad_capacity`].
    BadCapacity,
    /// [`oversized_payload`].
    OversizedPayload,
    /// [`fitted_slot`] with [`Scale::echo_messages`], at most 20,000.
    FittedSlot,
    /// [`receive_timeout`].
    ReceiveTimeout,
    /// [`k2k_pipeline`] with [`Scale::pipeline_messages`].
    K2kPipeline,
    /// [`pubsub_fanout`].
    PubsubFanout,
    /// [`queue_full`].
    QueueFull,
    /// [`priority_order`].
    PriorityOrder,
    /// [`priority_lanes`].
    PriorityLanes,
    /// [`kernel_priority`].
    KernelPriority,
}

impl Case {
    /// Every case, in the order [`run_all`] runs them.
    pub const ALL: [Case; 16] = [
        Case::Lifecycle,
        Case::CallCorrelation,
        Case::EchoMany,
        Case::DeactivateKeepsMessages,
        Case::TerminateInFlight,
        Case::UnknownKernel,
        Case::BadCapacity,
        Case::OversizedPayload,
        Case::FittedSlot,
        Case::ReceiveTimeout,
        Case::K2kPipeline,
        Case::PubsubFanout,
        Case::QueueFull,
        Case::PriorityOrder,
        Case::PriorityLanes,
        Case::KernelPriority,
    ];

    /// Runs this test on `rt` (volume tests sized by `scale`).
    pub async fn run(self, rt: &dyn RingKernelRuntime, scale: Scale) -> Result<()> {
        match self {
            Case::Lifecycle => lifecycle(rt).await,
            Case::CallCorrelation => {
                call_correlation(rt, scale.callers, scale.calls_per_caller).await
            }
            Case::EchoMany => echo_many(rt, scale.echo_messages).await,
            Case::DeactivateKeepsMessages => deactivate_keeps_messages(rt).await,
            Case::TerminateInFlight => terminate_in_flight(rt).await,
            Case::UnknownKernel => unknown_kernel(rt).await,
            Case::BadCapacity => bad_capacity(rt).await,
            Case::OversizedPayload => oversized_payload(rt).await,
            Case::FittedSlot => fitted_slot(rt, scale.echo_messages.min(20_000)).await,
            Case::ReceiveTimeout => receive_timeout(rt).await,
            Case::K2kPipeline => k2k_pipeline(rt, scale.pipeline_messages).await,
            Case::PubsubFanout => pubsub_fanout(rt).await,
            Case::QueueFull => queue_full(rt).await,
            Case::PriorityOrder => priority_order(rt).await,
            Case::PriorityLanes => priority_lanes(rt).await,
            Case::KernelPriority => kernel_priority(rt).await,
        }
    }
}

/// Runs `case` on `rt`, then shuts the runtime down and checks that the test left no
/// kernel running. The body of each test [`conformance_tests!`](crate::conformance_tests)
/// writes.
pub async fn run_case(rt: &dyn RingKernelRuntime, case: Case, scale: Scale) -> Result<()> {
    let r = case.run(rt, scale).await;
    let report = rt.shutdown().await;
    r?;
    let report = report.map_err(|e| fail("shutdown", format!("after {case:?}: {e}")))?;
    if report.kernels != 0 {
        return Err(fail(
            "shutdown",
            format!("{case:?} left {} kernel(s) running", report.kernels),
        ));
    }
    Ok(())
}

/// Drives `fut` to completion on the calling thread, parking it while the future waits
/// (the conformance tests spawn no tasks and need no reactor, so this is all the
/// executor they need).
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        // A wake between the poll and here leaves the token set: park returns at once.
        std::thread::park();
    }
}

/// One `#[test]` per conformance [`Case`](crate::conformance::Case), each on a fresh
/// runtime that it shuts down afterwards ([`run_case`](crate::conformance::run_case)).
///
/// Keys, in this order (only `runtime` is required):
///
/// * `runtime:` an expression making the runtime (any [`RingKernelRuntime`]); it is
///   evaluated inside an `async` block, so it may `.await`.
/// * `scale:` the [`Scale`](crate::conformance::Scale) of the volume tests (default
///   [`Scale::quick`](crate::conformance::Scale::quick)).
/// * `serial:` a `static` `Mutex<()>` each test holds while it runs (for devices that
///   must not run several test runtimes at once).
/// * `ignore:` a reason string: every test is `#[ignore = reason]` (e.g. "needs CUDA GPU").
///
/// ```ignore
/// ringkernel_core::conformance_tests! {
///     runtime: CudaRuntime::with_registry(KernelRegistry::new()).await.unwrap(),
///     scale: Scale::full(),
///     serial: SERIAL,
///     ignore: "needs CUDA GPU",
/// }
/// ```
///
/// The tests run on [`block_on`](crate::conformance::block_on); no async test
/// framework is needed.
#[macro_export]
macro_rules! conformance_tests {
    (
        runtime: $rt:expr
        $(, scale: $scale:expr)?
        $(, serial: $lock:path)?
        $(, ignore: $reason:literal)?
        $(,)?
    ) => {
        $crate::conformance_tests!(@cases ($rt) ($($scale)?) ($($lock)?) ($($reason)?)
            lifecycle Lifecycle,
            call_correlation CallCorrelation,
            echo_many EchoMany,
            deactivate_keeps_messages DeactivateKeepsMessages,
            terminate_in_flight TerminateInFlight,
            unknown_kernel UnknownKernel,
            bad_capacity BadCapacity,
            oversized_payload OversizedPayload,
            fitted_slot FittedSlot,
            receive_timeout ReceiveTimeout,
            k2k_pipeline K2kPipeline,
            pubsub_fanout PubsubFanout,
            queue_full QueueFull,
            priority_order PriorityOrder,
            priority_lanes PriorityLanes,
            kernel_priority KernelPriority,
        );
    };
    (@cases $rt:tt $scale:tt $lock:tt $reason:tt $($name:ident $case:ident,)*) => {
        $($crate::conformance_tests!(@case $name $case $rt $scale $lock $reason);)*
    };
    (@case $name:ident $case:ident ($rt:expr) ($($scale:expr)?) ($($lock:path)?) ($($reason:literal)?)) => {
        #[test]
        $(#[ignore = $reason])?
        fn $name() {
            $(let _serial = $crate::util::lock(&$lock);)?
            #[allow(unused_mut, unused_assignments)]
            let mut scale = $crate::conformance::Scale::quick();
            $(scale = $scale;)?
            let r = $crate::conformance::block_on(async {
                let rt = $rt;
                $crate::conformance::run_case(&rt, $crate::conformance::Case::$case, scale).await
            });
            if let Err(e) = r {
                panic!("{e}");
            }
        }
    };
}

/// Runs every conformance test in turn, stopping at the first failure.
pub async fn run_all(rt: &dyn RingKernelRuntime, scale: Scale) -> Result<()> {
    for case in Case::ALL {
        case.run(rt, scale).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_named_and_an_unknown_name_is_an_error() {
        assert_eq!(Scale::named("full").unwrap(), Scale::full());
        assert_eq!(Scale::named("smoke").unwrap(), Scale::smoke());
        let e = Scale::named("tiny").unwrap_err().to_string();
        assert!(e.contains("\"tiny\"") && e.contains("smoke"), "{e}");
        assert!(Scale::smoke().echo_messages < Scale::quick().echo_messages);
    }

    #[test]
    fn join_all_keeps_order() {
        let futs: Vec<_> = (0..5).map(|i| async move { i * 10 }).collect();
        let out = block_on(join_all(futs));
        assert_eq!(out, vec![0, 10, 20, 30, 40]);
    }

    #[test]
    fn block_on_sleeps_until_woken_from_another_thread() {
        let start = Instant::now();
        block_on(crate::util::sleep(Duration::from_millis(30)));
        assert!(start.elapsed() >= Duration::from_millis(30));
        // A value produced on another thread and woken through the waker.
        let (tx, rx) = std::sync::mpsc::channel::<std::task::Waker>();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let t = std::thread::spawn(move || {
            let w = rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(10));
            flag.store(true, Ordering::SeqCst);
            w.wake();
        });
        let mut tx = Some(tx);
        let v = block_on(std::future::poll_fn(|cx| {
            if done.load(Ordering::SeqCst) {
                return Poll::Ready(7);
            }
            if let Some(tx) = tx.take() {
                tx.send(cx.waker().clone()).unwrap();
            }
            Poll::Pending
        }));
        assert_eq!(v, 7);
        t.join().unwrap();
    }

    #[test]
    fn ensure_names_the_test() {
        fn f(x: u32) -> Result<()> {
            ensure!("demo", x == 1, "x was {x}");
            Ok(())
        }
        assert!(f(1).is_ok());
        assert_eq!(f(2), Err(Error::Device("conformance demo: x was 2".into())));
    }
}
