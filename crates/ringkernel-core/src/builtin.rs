//! Built-in kernels every backend provides under the same names, used by the CLI demo,
//! the examples and the cross-backend behavioural tests.
//!
//! All of them speak [`Token`]:
//!
//! * `rk.echo`: replies with `value * 2`, `hops + 1`, and its HLC stamp in
//!   `stamps[min(hops, 3)]`.
//! * `rk.stage`: a pipeline stage. Stamps `stamps[min(hops, 3)]`, adds 1 to `value`,
//!   increments `hops`; then, if `hops < route_len`, sends the token on to kernel
//!   `route[hops]` (K2K, by id), else replies to the host.
//! * `rk.counter`: a pub/sub subscriber. Keeps a count of tokens seen; replies with the
//!   token whose `value` is replaced by the count so far and `hops + 1`.
//!
//! The CPU versions are here ([`register_cpu_builtins`]); GPU backends register their
//! own versions (WGSL, CUDA C) of the same names.

use crate::context::KernelContext;
use crate::error::{Error, Result};
use crate::ids::KernelId;
use crate::k2k::K2kReceipt;
use crate::message::RingMessage;
use crate::registry::{handler_fn, stateful_fn, KernelRegistry};
use bytemuck::{Pod, Zeroable};

/// Name of the echo kernel.
pub const ECHO: &str = "rk.echo";
/// Name of the pipeline-stage kernel.
pub const STAGE: &str = "rk.stage";
/// Name of the counting subscriber kernel.
pub const COUNTER: &str = "rk.counter";

/// Most pipeline stages a [`Token`] can carry (the length of [`Token::route`]).
pub const MAX_ROUTE: usize = 4;

/// The message of the built-in kernels (72 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Token {
    /// Caller's id for the token.
    pub id: u64,
    /// Payload value the kernels transform.
    pub value: f64,
    /// HLC timestamps (packed) written by up to four hops.
    pub stamps: [u64; 4],
    /// Kernel ids of a pipeline, in order (`route[0]` is the first stage).
    pub route: [u32; MAX_ROUTE],
    /// Number of valid entries in `route`.
    pub route_len: u32,
    /// Hops taken so far.
    pub hops: u32,
}

impl RingMessage for Token {
    const TYPE_ID: u32 = 0x524B_0001;
    const NAME: &'static str = "Token";
}

const _: () = assert!(std::mem::size_of::<Token>() == 72);

impl Token {
    /// A token with `id` and `value`, no route.
    pub fn new(id: u64, value: f64) -> Self {
        Token {
            id,
            value,
            ..Default::default()
        }
    }
    /// A token that will travel through `stages`, in order. A token carries at most
    /// [`MAX_ROUTE`] kernel ids: more is [`Error::InvalidArgument`].
    ///
    /// ```
    /// use ringkernel_core::builtin::Token;
    /// use ringkernel_core::runtime::KernelId;
    /// let t = Token::routed(1, 0.5, &[KernelId(3), KernelId(4)])?;
    /// assert_eq!((t.route_len, t.route[1]), (2, 4));
    /// assert!(Token::routed(1, 0.5, &[KernelId(3); 5]).is_err());
    /// # Ok::<(), ringkernel_core::Error>(())
    /// ```
    pub fn routed(id: u64, value: f64, stages: &[KernelId]) -> Result<Self> {
        if stages.len() > MAX_ROUTE {
            return Err(Error::invalid(format!(
                "a token carries at most {MAX_ROUTE} pipeline stages, {} were given",
                stages.len()
            )));
        }
        let mut t = Token::new(id, value);
        for (slot, s) in t.route.iter_mut().zip(stages) {
            *slot = s.0;
        }
        t.route_len = stages.len() as u32;
        Ok(t)
    }
}

fn stamp(ctx: &KernelContext<'_>, t: &mut Token) {
    t.stamps[(t.hops as usize).min(3)] = ctx.clock().peek().packed();
}

fn stage(ctx: &mut KernelContext<'_>, mut t: Token) -> Result<()> {
    stamp(ctx, &mut t);
    t.value += 1.0;
    t.hops += 1;
    if t.hops < t.route_len.min(4) {
        let next = KernelId(t.route[t.hops as usize]);
        // Backpressure: a full downstream queue is retried, never dropped. A short spin,
        // then yields, then short sleeps: a sleeping thread is what tells the CPU
        // runtime's worker pool that this turn is blocked (a yielding one looks busy),
        // so it runs the downstream kernel on another thread.
        let mut spins = 0u32;
        loop {
            match ctx.send_to(next, &t)? {
                K2kReceipt::Delivered => return Ok(()),
                K2kReceipt::QueueFull => {
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else if spins < 128 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(20));
                    }
                }
                K2kReceipt::NotFound => {
                    return Err(Error::KernelNotFound(format!(
                        "pipeline stage {next} (from {})",
                        ctx.name()
                    )))
                }
            }
        }
    }
    // The reply straight from `t`, not `Ok(Some(t))`: returning it copied the token
    // (wide loads) right after the few fields above were written (narrow stores), a
    // store-forwarding stall on every token leaving the pipeline (perf annotate).
    ctx.reply(&t)
}

/// Registers the CPU versions of the built-in kernels.
pub fn register_cpu_builtins(reg: &KernelRegistry) {
    reg.register_cpu(ECHO, || {
        Box::new(handler_fn(|ctx: &mut KernelContext<'_>, mut t: Token| {
            stamp(ctx, &mut t);
            t.value *= 2.0;
            t.hops += 1;
            Some(t)
        }))
    });
    reg.register_cpu(STAGE, || Box::new(handler_fn(stage)));
    reg.register_cpu(COUNTER, || {
        Box::new(stateful_fn(
            0u64,
            |ctx: &mut KernelContext<'_>, n: &mut u64, mut t: Token| {
                *n += 1;
                stamp(ctx, &mut t);
                t.value = *n as f64;
                t.hops += 1;
                Some(t)
            },
        ))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routed_keeps_the_stages_in_order() {
        let t = Token::routed(9, 1.5, &[KernelId(5), KernelId(2), KernelId(8)]).unwrap();
        assert_eq!((t.id, t.value, t.hops), (9, 1.5, 0));
        assert_eq!((t.route, t.route_len), ([5, 2, 8, 0], 3));
        let full: Vec<KernelId> = (1..=MAX_ROUTE as u32).map(KernelId).collect();
        assert_eq!(Token::routed(0, 0.0, &full).unwrap().route, [1, 2, 3, 4]);
        assert_eq!(Token::routed(0, 0.0, &[]).unwrap().route_len, 0);
    }

    #[test]
    fn routed_with_too_many_stages_is_an_error() {
        let stages: Vec<KernelId> = (1..=5).map(KernelId).collect();
        match Token::routed(1, 0.0, &stages) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("5"), "{msg}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
