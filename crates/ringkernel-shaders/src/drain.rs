//! The actor drain template and the WGSL handler ABI.
//!
//! WebGPU and Metal have no persistent kernels, so an actor there is *event-driven*: the
//! host dispatches a **drain pass** whenever messages are waiting in a kernel's input
//! queue, with all of them in one dispatch. The pass runs a message handler written in
//! WGSL once per message and writes at most one output message per input message.
//!
//! ## Buffers of a drain pass (group 0)
//!
//! | binding | WGSL global | type | contents |
//! |---|---|---|---|
//! | 0 | `rk_params` | `uniform RkDrainParams` | [`params::Drain`](crate::params::Drain): batch `first`, `count`, HLC, sizes |
//! | 1 | `rk_control` | `storage, read_write RkControlBlock` | the kernel's [`ControlBlock`](ringkernel_core::control::ControlBlock) |
//! | 2 | `rk_input` | `storage, read array<vec4<u32>>` | input ring: [`QueueHeader`](ringkernel_core::queue::QueueHeader) (32 words) + `capacity` slots |
//! | 3 | `rk_output` | `storage, read_write array<vec4<u32>>` | output ring, same layout and capacity as the input |
//! | 4 | `rk_state` | `storage, read_write array<u32>` | the handler's state (`state_bytes`, at least 16 bytes) |
//!
//! Message `i` of the batch is at queue index `first + i`, slot `(first + i) & mask`, in
//! both rings: its output goes to the same slot of the output ring. A slot is the 64-byte
//! [`MessageHeader`](ringkernel_core::message::MessageHeader) (16 words, `RkMessageHeader`
//! in WGSL; 64-bit fields are `vec2<u32>`, low word first) followed by the payload.
//!
//! ## Compact passes
//!
//! A target that stages each pass in a buffer of its own may ask for a *compact* pass
//! (`in_stride != 0` in the parameters), which moves about half the bytes of a ring
//! pass for small messages sent in batches. Binding 2 then holds that pass alone:
//!
//! | words | contents |
//! |---|---|
//! | `j · in_stride ..` | request `j`'s payload (`in_stride` = the slot's payload words) |
//! | `runs_at + 16 · r ..` | run `r`'s first header |
//! | `starts_at + r` | the batch index of run `r`'s first request (rising, the first 0) |
//!
//! Request `j` belongs to the last run whose first index is at most `j`; as its `i`-th
//! message, its header is the run's first with `message_id`, `correlation_id` and
//! `timestamp` advanced by `i` (the host's
//! [`MessageHeader::nth_of_run`](ringkernel_core::message::MessageHeader::nth_of_run)).
//! A request the host refuses is a run of its own with magic 0. Outputs go to the
//! output ring as in any pass; only `in_slot` differs from `out_slot`.
//!
//! The template also declares the WGSL mirrors of the other shared layouts it touches,
//! `RkControlBlock` and `RkQueueHeader`, checked against `ringkernel-core`'s field
//! tables by this crate's tests. K2K sends leave a pass as ordinary output slots with
//! the K2K flag; the host routes them (there is no device-side inbox).
//!
//! ## The handler ABI
//!
//! A handler is WGSL source that defines
//!
//! ```wgsl
//! fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32
//! ```
//!
//! * `in_slot` / `out_slot`: word index of the payload of the request in the input
//!   binding (the ring, or a compact pass's buffer) and of the output slot's payload in
//!   the output ring, both multiples of 4 (the rings
//!   are bound as 16-byte units, `array<vec4<u32>>`, so that whole units move in one
//!   access). Payload word `w` is `rk_in(in_slot + w)`; `rk_in4(in_slot + 4 * i)` reads
//!   four words at once. Write with `rk_out_set(out_slot + w, v)` or
//!   `rk_out_set4(out_slot + 4 * i, v)` (words past the payload, up to the end of the
//!   slot, may be written), read back with `rk_out(out_slot + w)`; `rk_in_u64` and
//!   `rk_out_set_u64` move 64-bit values as `vec2<u32>`.
//! * `(*ctx).request`: the request's header; `(*ctx).kernel_id`, `(*ctx).hlc` (the
//!   kernel's packed HLC for this pass, merged with every request of the batch — what a
//!   CPU handler's `ctx.clock().peek()` returns), `(*ctx).node_id` (the node id of the
//!   kernel's clock, `vec2<u32>`: with `hlc`, the full
//!   [`HlcTimestamp`](ringkernel_core::hlc::HlcTimestamp) `(time, node)`),
//!   `(*ctx).batch_index`/`batch_len`.
//! * State: the global `rk_state` (words), `state_bytes` long, zeroed at launch, kept
//!   across passes.
//! * Output: write the payload from `out_slot` on, then call
//!   `rk_reply(ctx, type_id, payload_len)` (to the host's output queue, correlated with
//!   the request) or `rk_send(ctx, dest_kernel_id, type_id, payload_len)` (K2K, routed by
//!   the host after the pass). No call: no output. At most one output per request.
//! * Return `0` on success, or a non-zero error code: the message is counted as dropped
//!   and its output discarded ([`ERR_TYPE_MISMATCH`] for a wrong type).
//! * Order: by default the messages of a batch run in parallel, one invocation each
//!   ([`Kernel::Drain`](crate::Kernel::Drain)). A handler that must see its messages in
//!   order (because it updates state per message) declares `const RK_SERIAL: bool = true;`
//!   and the host runs [`Kernel::DrainSerial`](crate::Kernel::DrainSerial): one invocation
//!   handling the batch in queue order ([`is_serial`]).
//!
//! ## Outputs
//!
//! Of an output slot's header the device writes only the first 16 bytes, four words
//! that say what it decided ([`Output`]): `flags` (`REPLY` or `K2K`; 0: no output),
//! `type_id`, `payload_len` and `dest_kernel` of the output, or, with flags 0, the
//! handler's status in the second word (0: the handler chose not to answer). The host
//! writes the whole header after the pass: magic and version, the runtime-unique
//! `message_id`, the HLC `timestamp`, the request's `correlation_id` (it wrote the
//! request), `source_kernel` (the kernel) and the priority. That is three 16-byte
//! stores a message fewer on the device, which matters most on lavapipe, where each
//! store of an invocation is a loop over the SIMD lanes (BENCHMARKS.md, "output
//! units").
//!
//! The template checks each request's magic and version first: an invalid request never
//! reaches the handler and gets status [`ERR_INVALID_REQUEST`]. The device also advances
//! its half of the control block (`input_head`, `output_tail`, `processed`, `hlc`,
//! `heartbeat`).
//!
//! ## f64 without f64
//!
//! WGSL (and Metal) have no `f64`. The template includes `rk_f64_*` functions that work on
//! the IEEE-754 bits of a double as `vec2<u32>` with integer arithmetic and exact
//! round-to-nearest-even: `rk_f64_add`, `rk_f64_mul2`, `rk_f64_from_u64`. The built-in
//! `Token` handlers use them, so their results equal the CPU's bit for bit.

use crate::{Access, Binding};

/// The template: layouts, bindings, helpers and the two drain entry points.
pub const TEMPLATE: &str = include_str!("../kernels/drain.wgsl");
/// The integer-bits f64 library (appended to every composed drain module).
pub const F64_LIB: &str = include_str!("../kernels/f64.wgsl");
/// Shared helpers for the built-in `Token` handlers (word offsets, type id, `TokenWords`
/// with `token_read`/`token_store`: a token in registers, each word read and written
/// once; `token_begin` copies the request into the output slot).
pub const TOKEN_LIB: &str = include_str!("../kernels/handlers/token.wgsl");
/// WGSL of `rk.echo` (needs [`TOKEN_LIB`]).
pub const ECHO: &str = include_str!("../kernels/handlers/echo.wgsl");
/// WGSL of `rk.stage` (needs [`TOKEN_LIB`]).
pub const STAGE: &str = include_str!("../kernels/handlers/stage.wgsl");
/// WGSL of `rk.counter` (needs [`TOKEN_LIB`]; serial, 8 bytes of state).
pub const COUNTER: &str = include_str!("../kernels/handlers/counter.wgsl");

/// A handler that replies with a copy of the request (used to validate the template).
pub const STUB_HANDLER: &str = "
fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {
    let words = ((*ctx).request.payload_len + 3u) / 4u;
    for (var w = 0u; w < words; w += 4u) { rk_out_set4(out_slot + w, rk_in4(in_slot + w)); }
    rk_reply(ctx, (*ctx).request.type_id, (*ctx).request.payload_len);
    return 0u;
}
";

/// Threads per workgroup of the parallel drain pass.
pub const DRAIN_WORKGROUP_SIZE: u32 = 64;
/// Handler status: the request was of another type than the handler takes.
pub const ERR_TYPE_MISMATCH: u32 = 1;
/// Status written by the template itself: the request slot's header is not a valid
/// message (wrong magic or version), so the handler was not run.
pub const ERR_INVALID_REQUEST: u32 = 2;
/// Handler status (`RK_ERR_SECOND_OUTPUT`): a handler generated from Rust
/// (`#[ring_kernel(gpu)]`) tried a second output for one request (a reply after a K2K
/// send, or two sends); the template carries one, so the message is dropped with this code.
pub const ERR_SECOND_OUTPUT: u32 = 3;
/// Handler status (`RK_ERR_OUTPUT_TOO_LARGE`): a generated handler's reply or K2K message
/// does not fit the kernel's slots (`LaunchOptions::slot_size`); the message is dropped
/// with this code.
pub const ERR_OUTPUT_TOO_LARGE: u32 = 4;
/// What the drain template wrote for one request: the first 16 bytes of its output
/// slot (see "Outputs" above). The output's payload follows the slot's 64-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// An output message.
    Message {
        /// `REPLY` (to the host) or `K2K` (to `dest_kernel`).
        flags: u32,
        /// The output's type.
        type_id: u32,
        /// Its payload's length in bytes.
        payload_len: u32,
        /// Its destination: the request's sender for a reply.
        dest_kernel: u32,
    },
    /// No output, with the handler's status (0: it chose not to answer; or
    /// [`ERR_INVALID_REQUEST`] from the template).
    None {
        /// The status.
        status: u32,
    },
}

impl Output {
    /// Bytes of an output slot the device writes for it.
    pub const BYTES: usize = 16;

    /// The output the four words `w` (as the template wrote them) describe.
    #[inline]
    pub fn from_words(w: [u32; 4]) -> Output {
        if w[0] == 0 {
            Output::None { status: w[1] }
        } else {
            Output::Message {
                flags: w[0],
                type_id: w[1],
                payload_len: w[2],
                dest_kernel: w[3],
            }
        }
    }

    /// The output at the start of `slot` (at least [`BYTES`](Self::BYTES) long: shorter
    /// panics).
    #[inline]
    pub fn read(slot: &[u8]) -> Output {
        let w: [u32; 4] = bytemuck::pod_read_unaligned(&slot[..Self::BYTES]);
        Output::from_words(w.map(u32::from_le))
    }

    /// The four words the template writes for this output (a message's flags must not
    /// be 0).
    #[inline]
    pub fn words(self) -> [u32; 4] {
        match self {
            Output::Message {
                flags,
                type_id,
                payload_len,
                dest_kernel,
            } => [flags, type_id, payload_len, dest_kernel],
            Output::None { status } => [0, status, 0, 0],
        }
    }
}

/// Words of the queue header in front of the slots.
pub const QUEUE_HEADER_WORDS: u32 = 32;
/// Minimum size of the state buffer in bytes.
pub const MIN_STATE_BYTES: usize = 16;

/// Binding table of both drain entry points.
pub const BINDINGS: &[Binding] = &[
    Binding {
        group: 0,
        binding: 0,
        name: "rk_params",
        access: Access::Uniform,
    },
    Binding {
        group: 0,
        binding: 1,
        name: "rk_control",
        access: Access::ReadWrite,
    },
    Binding {
        group: 0,
        binding: 2,
        name: "rk_input",
        access: Access::Read,
    },
    Binding {
        group: 0,
        binding: 3,
        name: "rk_output",
        access: Access::ReadWrite,
    },
    Binding {
        group: 0,
        binding: 4,
        name: "rk_state",
        access: Access::ReadWrite,
    },
];

/// The complete drain module for `handler_wgsl`: template + f64 library + handler.
pub fn compose(handler_wgsl: &str) -> String {
    let mut s = String::with_capacity(TEMPLATE.len() + F64_LIB.len() + handler_wgsl.len() + 64);
    s.push_str(TEMPLATE);
    s.push_str("\n// ---- f64 library ----\n");
    s.push_str(F64_LIB);
    s.push_str("\n// ---- handler ----\n");
    s.push_str(handler_wgsl);
    s
}

/// Whether a (validated) drain module's handler asks for in-order processing
/// (`const RK_SERIAL: bool = true;`).
pub fn is_serial(module: &naga::Module) -> bool {
    module.constants.iter().any(|(_, c)| {
        c.name.as_deref() == Some("RK_SERIAL")
            && matches!(
                module.global_expressions[c.init],
                naga::Expression::Literal(naga::Literal::Bool(true))
            )
    })
}

/// Name, WGSL source and state bytes of the built-in handlers (`rk.echo`, `rk.stage`,
/// `rk.counter`), the same semantics as the CPU versions in
/// [`ringkernel_core::builtin`].
pub fn builtin_handlers() -> Vec<(&'static str, String, usize)> {
    use ringkernel_core::builtin;
    let with_lib = |h: &str| format!("{TOKEN_LIB}\n{h}");
    vec![
        (builtin::ECHO, with_lib(ECHO), 0),
        (builtin::STAGE, with_lib(STAGE), 0),
        (builtin::COUNTER, with_lib(COUNTER), 8),
    ]
}
