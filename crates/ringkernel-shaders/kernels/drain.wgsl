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
    in_stride: u32,
    runs: u32,
    runs_at: u32,
    starts_at: u32,
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
// The rings as 16-byte units: a slot starts on a 16-byte boundary (the queue header is
// 128 bytes, slots a multiple of 16 bytes), so a header is 4 units and a payload
// word `w` of the slot at word `s` is component (s + w) % 4 of unit (s + w) / 4. Whole
// units move in one access (a fourth of the accesses of word by word; on a GPU a
// 16-byte transaction instead of four, on a CPU adapter one per lane instead of four).
@group(0) @binding(2) var<storage, read> rk_input: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> rk_output: array<vec4<u32>>;
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

// Word `word` of the input ring.
fn rk_in(word: u32) -> u32 {
    return rk_input[word >> 2u][word & 3u];
}

// Words `word..word + 4` of the input ring (`word` a multiple of 4).
fn rk_in4(word: u32) -> vec4<u32> {
    return rk_input[word >> 2u];
}

// Word `word` of the output ring (as written so far by this invocation).
fn rk_out(word: u32) -> u32 {
    return rk_output[word >> 2u][word & 3u];
}

// Writes word `word` of the output ring.
fn rk_out_set(word: u32, v: u32) {
    rk_output[word >> 2u][word & 3u] = v;
}

// Writes words `word..word + 4` of the output ring (`word` a multiple of 4).
fn rk_out_set4(word: u32, v: vec4<u32>) {
    rk_output[word >> 2u] = v;
}

fn rk_in_u64(word: u32) -> vec2<u32> {
    return vec2<u32>(rk_in(word), rk_in(word + 1u));
}

fn rk_out_set_u64(word: u32, v: vec2<u32>) {
    rk_out_set(word, v.x);
    rk_out_set(word + 1u, v.y);
}

fn rk_read_header(base: u32) -> RkMessageHeader {
    let w0 = rk_in4(base);
    let w1 = rk_in4(base + 4u);
    let w2 = rk_in4(base + 8u);
    let w3 = rk_in4(base + 12u);
    var h: RkMessageHeader;
    h.magic = w0.x;
    h.version = w0.y;
    h.type_id = w0.z;
    h.payload_len = w0.w;
    h.message_id = w1.xy;
    h.correlation_id = w1.zw;
    h.source_kernel = w2.x;
    h.dest_kernel = w2.y;
    h.timestamp = w2.zw;
    h.checksum = w3.x;
    h.flags = w3.y;
    h.node_id = w3.zw;
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

// The header of request `j` of a compact pass (`in_stride != 0`): the `i`-th message
// of the run it belongs to, whose entry holds the run's first header (the last run whose
// first batch index is at most `j`).
fn rk_compact_header(j: u32) -> RkMessageHeader {
    var lo = 0u;
    var hi = rk_params.runs - 1u;
    while (lo < hi) {
        let mid = (lo + hi + 1u) >> 1u;
        if (rk_in(rk_params.starts_at + mid) <= j) {
            lo = mid;
        } else {
            hi = mid - 1u;
        }
    }
    let i = j - rk_in(rk_params.starts_at + lo);
    var h = rk_read_header(rk_params.runs_at + lo * RK_HEADER_WORDS);
    h.message_id = rk_u64_add32(h.message_id, i);
    h.correlation_id = rk_u64_add32(h.correlation_id, i);
    h.timestamp = rk_u64_add32(h.timestamp, i);
    return h;
}

fn rk_process(j: u32) {
    let index = rk_u64_add32(rk_params.first, j);
    let slot = index.x & rk_params.mask;
    let base = RK_QUEUE_HEADER_WORDS + slot * rk_params.slot_words;
    // Where the request's payload is: after its header in the ring, or at its stride
    // in a compact pass.
    var in_slot = base + RK_HEADER_WORDS;
    var ctx: RkContext;
    ctx.kernel_id = rk_params.kernel_id;
    ctx.batch_index = j;
    ctx.batch_len = rk_params.count;
    ctx.index = index;
    // The host reserved `count` consecutive timestamps: message j gets the j-th.
    ctx.hlc = rk_u64_add32(rk_params.hlc, j);
    ctx.node_id = vec2<u32>(rk_params.node_lo, rk_params.node_hi);
    if (rk_params.in_stride != 0u) {
        ctx.request = rk_compact_header(j);
        in_slot = j * rk_params.in_stride;
    } else {
        ctx.request = rk_read_header(base);
    }
    ctx.out_used = 0u;
    // A slot whose header is not a message of this version (the host invalidates one it
    // refuses, e.g. for clock drift) never reaches the handler.
    var status = RK_ERR_INVALID_REQUEST;
    if (ctx.request.magic == RK_MESSAGE_MAGIC && ctx.request.version == RK_MESSAGE_VERSION) {
        status = handle(&ctx, in_slot, base + RK_HEADER_WORDS);
    }
    // The output's first unit says what the device decided: the host writes the rest
    // of the header after the pass (see "Outputs" in ringkernel_shaders::drain).
    if (status == 0u && ctx.out_used != 0u) {
        rk_out_set4(base, vec4<u32>(ctx.out_flags, ctx.out_type_id, ctx.out_len, ctx.out_dest));
    } else {
        // No output (flags 0), and the handler's status.
        rk_out_set4(base, vec4<u32>(0u, status, 0u, 0u));
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
