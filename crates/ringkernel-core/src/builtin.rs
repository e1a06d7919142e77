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
use crate::error::Result;
use crate::k2k::K2kReceipt;
use crate::message::RingMessage;
use crate::registry::{handler_fn, stateful_fn, KernelRegistry};
use crate::runtime::KernelId;
use bytemuck::{Pod, Zeroable};

/// Name of the echo kernel.
pub const ECHO: &str = "rk.echo";
/// Name of the pipeline-stage kernel.
pub const STAGE: &str = "rk.stage";
/// Name of the counting subscriber kernel.
pub const COUNTER: &str = "rk.counter";

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
    pub route: [u32; 4],
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
    /// A token that will travel through `stages` (at most 4 kernel ids).
    pub fn routed(id: u64, value: f64, stages: &[KernelId]) -> Self {
        assert!(stages.len() <= 4, "a token carries at most 4 hops");
        let mut t = Token::new(id, value);
        for (i, s) in stages.iter().enumerate() {
            t.route[i] = s.0;
        }
        t.route_len = stages.len() as u32;
        t
    }
}

fn stamp(ctx: &KernelContext<'_>, t: &mut Token) {
    t.stamps[(t.hops as usize).min(3)] = ctx.clock().peek().0;
}

fn stage(ctx: &mut KernelContext<'_>, mut t: Token) -> Result<Option<Token>> {
    stamp(ctx, &mut t);
    t.value += 1.0;
    t.hops += 1;
    if t.hops < t.route_len.min(4) {
        let next = KernelId(t.route[t.hops as usize]);
        // Backpressure: a full downstream queue is retried, never dropped.
        let mut spins = 0u32;
        loop {
            match ctx.send_to(next, &t)? {
                K2kReceipt::Delivered => return Ok(None),
                K2kReceipt::QueueFull => {
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                K2kReceipt::NotFound => {
                    return Err(crate::Error::KernelNotFound(format!(
                        "pipeline stage {next} (from {})",
                        ctx.name()
                    )))
                }
            }
        }
    }
    Ok(Some(t))
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
