// RingKernel actor drain template (see ringkernel_shaders::drain for the ABI).
//
// Shared binary layouts: mirrors of ringkernel_core's #[repr(C)] structs. 64-bit fields
// are vec2<u32>, low word first. Checked against the Rust field tables by tests.

// message::MessageHeader (64 bytes)
struct RkMessageHeader {
    magic: u32,
    version: u32,
    type_id: u32,
    payload_len: u32,
    message_id: vec2<u32>,
    correlation_id: vec2<u32>,
    source_kernel: u32,
    dest_kernel: u32,
    timestamp: vec2<u32>,
    checksum: u32,
    flags: u32,
    node_id: vec2<u32>,
}

// control::ControlBlock (128 bytes; host line, then device line)
struct RkControlBlock {
    command: u32,
    command_seq: u32,
    kernel_id: u32,
    slot_size: u32,
    input_tail: vec2<u32>,
    output_head: vec2<u32>,
    input_capacity: u32,
    output_capacity: u32,
    max_drift_ms: vec2<u32>,
    host_reserved: array<u32, 4>,
    state: u32,
    command_ack: u32,
    input_head: vec2<u32>,
    output_tail: vec2<u32>,
    processed: vec2<u32>,
    dropped: vec2<u32>,
    hlc: vec2<u32>,
    last_error: u32,
    heartbeat: u32,
    device_reserved: array<u32, 2>,
}

// queue::QueueHeader (128 bytes; producer line, then consumer line)
struct RkQueueHeader {
    tail: vec2<u32>,
    capacity: u32,
    slot_size: u32,
    mask: u32,
    producer_reserved: array<u32, 11>,
    head: vec2<u32>,
    consumer_reserved: array<u32, 14>,
}

// params::Drain
struct RkDrainParams {
    kernel_id: u32,
    count: u32,
    first: vec2<u32>,
    hlc: vec2<u32>,
    slot_words: u32,
    mask: u32,
    state_words: u32,
    node_lo: u32,
    node_hi: u32,
    _pad: u32,
}

// What a handler sees (see the ABI in ringkernel_shaders::drain).
struct RkContext {
    kernel_id: u32,
    batch_index: u32,
    batch_len: u32,
    index: vec2<u32>,
    hlc: vec2<u32>,
    node_id: vec2<u32>,
    request: RkMessageHeader,
    out_used: u32,
    out_type_id: u32,
    out_len: u32,
    out_flags: u32,
    out_dest: u32,
}

const RK_MESSAGE_MAGIC: u32 = 0x474D4B52u; // "RKMG", little-endian
const RK_MESSAGE_VERSION: u32 = 1u;
const RK_FLAG_REPLY: u32 = 2u;
const RK_FLAG_K2K: u32 = 4u;
const RK_HEADER_WORDS: u32 = 16u;
const RK_QUEUE_HEADER_WORDS: u32 = 32u;
const RK_ERR_TYPE_MISMATCH: u32 = 1u;
const RK_ERR_INVALID_REQUEST: u32 = 2u;
const RK_ERR_SECOND_OUTPUT: u32 = 3u;
const RK_ERR_OUTPUT_TOO_LARGE: u32 = 4u;

@group(0) @binding(0) var<uniform> rk_params: RkDrainParams;
@group(0) @binding(1) var<storage, read_write> rk_control: RkControlBlock;
@group(0) @binding(2) var<storage, read> rk_input: array<u32>;
@group(0) @binding(3) var<storage, read_write> rk_output: array<u32>;
@group(0) @binding(4) var<storage, read_write> rk_state: array<u32>;

// 64-bit helpers on vec2<u32> (low, high).
fn rk_u64_add32(a: vec2<u32>, b: u32) -> vec2<u32> {
    let lo = a.x + b;
    return vec2<u32>(lo, a.y + select(0u, 1u, lo < a.x));
}

fn rk_u64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn rk_in_u64(word: u32) -> vec2<u32> {
    return vec2<u32>(rk_input[word], rk_input[word + 1u]);
}

fn rk_out_set_u64(word: u32, v: vec2<u32>) {
    rk_output[word] = v.x;
    rk_output[word + 1u] = v.y;
}

fn rk_read_header(base: u32) -> RkMessageHeader {
    var h: RkMessageHeader;
    h.magic = rk_input[base];
    h.version = rk_input[base + 1u];
    h.type_id = rk_input[base + 2u];
    h.payload_len = rk_input[base + 3u];
    h.message_id = rk_in_u64(base + 4u);
    h.correlation_id = rk_in_u64(base + 6u);
    h.source_kernel = rk_input[base + 8u];
    h.dest_kernel = rk_input[base + 9u];
    h.timestamp = rk_in_u64(base + 10u);
    h.checksum = rk_input[base + 12u];
    h.flags = rk_input[base + 13u];
    h.node_id = rk_in_u64(base + 14u);
    return h;
}

// Output: a reply to the request's sender, correlated with the request.
fn rk_reply(ctx: ptr<function, RkContext>, type_id: u32, payload_len: u32) {
    (*ctx).out_used = 1u;
    (*ctx).out_type_id = type_id;
    (*ctx).out_len = payload_len;
    (*ctx).out_flags = RK_FLAG_REPLY;
    (*ctx).out_dest = (*ctx).request.source_kernel;
}

// Output: a K2K message to kernel `dest`, routed by the host after the pass.
fn rk_send(ctx: ptr<function, RkContext>, dest: u32, type_id: u32, payload_len: u32) {
    (*ctx).out_used = 1u;
    (*ctx).out_type_id = type_id;
    (*ctx).out_len = payload_len;
    (*ctx).out_flags = RK_FLAG_K2K;
    (*ctx).out_dest = dest;
}

fn rk_process(j: u32) {
    let index = rk_u64_add32(rk_params.first, j);
    let slot = index.x & rk_params.mask;
    let base = RK_QUEUE_HEADER_WORDS + slot * rk_params.slot_words;
    var ctx: RkContext;
    ctx.kernel_id = rk_params.kernel_id;
    ctx.batch_index = j;
    ctx.batch_len = rk_params.count;
    ctx.index = index;
    // The host reserved `count` consecutive timestamps: message j gets the j-th.
    ctx.hlc = rk_u64_add32(rk_params.hlc, j);
    ctx.node_id = vec2<u32>(rk_params.node_lo, rk_params.node_hi);
    ctx.request = rk_read_header(base);
    ctx.out_used = 0u;
    // A slot whose header is not a message of this version (the host invalidates one it
    // refuses, e.g. for clock drift) never reaches the handler.
    var status = RK_ERR_INVALID_REQUEST;
    if (ctx.request.magic == RK_MESSAGE_MAGIC && ctx.request.version == RK_MESSAGE_VERSION) {
        status = handle(&ctx, base + RK_HEADER_WORDS, base + RK_HEADER_WORDS);
    }
    if (status == 0u && ctx.out_used != 0u) {
        rk_output[base] = RK_MESSAGE_MAGIC;
        rk_output[base + 1u] = RK_MESSAGE_VERSION;
        rk_output[base + 2u] = ctx.out_type_id;
        rk_output[base + 3u] = ctx.out_len;
        rk_out_set_u64(base + 4u, vec2<u32>(0u, 0u));
        rk_out_set_u64(base + 6u, ctx.request.correlation_id);
        rk_output[base + 8u] = ctx.kernel_id;
        rk_output[base + 9u] = ctx.out_dest;
        rk_out_set_u64(base + 10u, vec2<u32>(0u, 0u));
        rk_output[base + 12u] = 0u;
        rk_output[base + 13u] = ctx.out_flags;
        rk_output[base + 14u] = 0u;
        rk_output[base + 15u] = 0u;
    } else {
        rk_output[base] = 0u;
        rk_output[base + 14u] = status;
    }
}

// The device half of the control block, written once per pass.
fn rk_finish() {
    let end = rk_u64_add32(rk_params.first, rk_params.count);
    rk_control.input_head = end;
    rk_control.output_tail = end;
    rk_control.processed = rk_u64_add32(rk_control.processed, rk_params.count);
    rk_control.hlc = rk_u64_add32(rk_params.hlc, rk_params.count - 1u);
    rk_control.heartbeat = rk_control.heartbeat + 1u;
}

// One invocation per message.
@compute @workgroup_size(64)
fn rk_drain(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = gid.x + gid.y * nwg.x * 64u;
    if (j < rk_params.count) {
        rk_process(j);
    }
    if (j == 0u) {
        rk_finish();
    }
}

// One invocation, messages in queue order (handlers with `const RK_SERIAL: bool = true;`).
@compute @workgroup_size(1)
fn rk_drain_serial() {
    for (var j = 0u; j < rk_params.count; j++) {
        rk_process(j);
    }
    rk_finish();
}
