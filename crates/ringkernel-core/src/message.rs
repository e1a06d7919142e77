//! Message model: a 64-byte [`MessageHeader`] followed by the payload, written straight
//! into a queue slot.
//!
//! A slot is `slot_size` bytes (a multiple of 16 in 128..=65536, default 256): the
//! header, then up to `slot_size - 64` payload bytes. The layout is shared bit for bit
//! with the CUDA header (`ringkernel.cuh`) and the WGSL struct in `ringkernel-shaders`.
//!
//! A payload has one of two [`Encoding`]s, told apart by [`flags::RKYV`]:
//!
//! * **plain data**: the bytes of a `#[repr(C)]` `bytemuck::Pod` value, fixed size,
//!   copied into the slot without serialisation (what GPU handlers read);
//! * **rkyv**: an [rkyv](https://docs.rs/rkyv/0.8) 0.8 archive of a struct with `Vec`,
//!   `String`, `Option` or nested fields, variable size. The archive format is
//!   little-endian and needs no alignment, so it is read in place from any slot
//!   offset. Reading validates it first (bytecheck): a truncated or corrupted archive
//!   is [`Error::Decode`], never undefined behaviour. [`Envelope::archived`] gives the
//!   archived view without deserialising; [`Envelope::decode`] the owned value.
//!
//! Decoding checks the type id ([`Error::TypeMismatch`]) and the encoding flag
//! ([`Error::EncodingMismatch`]) before anything else. A payload larger than the slot
//! is [`Error::MessageTooLarge`] on send, whichever the encoding.

use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// `"RKMG"` in little-endian: marks a slot that holds a message.
pub const MESSAGE_MAGIC: u32 = u32::from_le_bytes(*b"RKMG");
/// Version of the header layout.
pub const MESSAGE_VERSION: u32 = 1;
/// Size of [`MessageHeader`] in bytes.
pub const HEADER_SIZE: usize = 64;
/// Default slot size in bytes (header + payload).
pub const DEFAULT_SLOT_SIZE: usize = 256;

/// Header flag bits.
pub mod flags {
    /// `checksum` holds the FNV-1a hash of the payload and receivers verify it.
    pub const CHECKSUM: u32 = 1 << 0;
    /// The message is a reply to a request with the same `correlation_id`.
    pub const REPLY: u32 = 1 << 1;
    /// The message was sent by another kernel (K2K).
    pub const K2K: u32 = 1 << 2;
    /// The message was delivered through a pub/sub topic.
    pub const PUBSUB: u32 = 1 << 3;
    /// The payload is an rkyv archive (a variable-size message), not plain data.
    pub const RKYV: u32 = 1 << 4;
    /// Bits 8..16 of `flags` hold the message's priority
    /// ([`crate::priority`]); see [`MessageHeader::priority`](super::MessageHeader::priority).
    pub const PRIORITY_SHIFT: u32 = 8;
    /// Mask of the priority byte within `flags`.
    pub const PRIORITY_MASK: u32 = 0xFF << PRIORITY_SHIFT;
}

/// The 64-byte header at the start of every message slot.
///
/// All fields are 4 or 8 bytes wide so the same struct can be written in WGSL (64-bit
/// values are `vec2<u32>` there, low word first) and CUDA C.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct MessageHeader {
    /// [`MESSAGE_MAGIC`].
    pub magic: u32,
    /// [`MESSAGE_VERSION`].
    pub version: u32,
    /// [`RingMessage::TYPE_ID`] of the payload.
    pub type_id: u32,
    /// Payload length in bytes.
    pub payload_len: u32,
    /// Unique id of this message (per runtime).
    pub message_id: u64,
    /// Id that ties a reply to its request (0: none).
    pub correlation_id: u64,
    /// Kernel id of the sender (0: the host).
    pub source_kernel: u32,
    /// Kernel id of the destination (0: the host).
    pub dest_kernel: u32,
    /// Packed HLC time of the send event (physical ms and logical counter, see
    /// [`HlcTimestamp`](crate::hlc::HlcTimestamp)).
    pub timestamp: u64,
    /// FNV-1a of the payload when `flags & CHECKSUM`, else 0.
    pub checksum: u32,
    /// [`flags`] bits in the low byte, the priority in the second byte
    /// ([`flags::PRIORITY_SHIFT`]), the rest zero.
    pub flags: u32,
    /// Node id of the clock that stamped `timestamp`: with it, `(timestamp, node_id)` is
    /// the full [`HlcTimestamp`](crate::hlc::HlcTimestamp), unique across nodes.
    pub node_id: u64,
}

const _: () = {
    assert!(std::mem::size_of::<MessageHeader>() == HEADER_SIZE);
    assert!(std::mem::align_of::<MessageHeader>() == 8);
    assert!(std::mem::offset_of!(MessageHeader, magic) == 0);
    assert!(std::mem::offset_of!(MessageHeader, version) == 4);
    assert!(std::mem::offset_of!(MessageHeader, type_id) == 8);
    assert!(std::mem::offset_of!(MessageHeader, payload_len) == 12);
    assert!(std::mem::offset_of!(MessageHeader, message_id) == 16);
    assert!(std::mem::offset_of!(MessageHeader, correlation_id) == 24);
    assert!(std::mem::offset_of!(MessageHeader, source_kernel) == 32);
    assert!(std::mem::offset_of!(MessageHeader, dest_kernel) == 36);
    assert!(std::mem::offset_of!(MessageHeader, timestamp) == 40);
    assert!(std::mem::offset_of!(MessageHeader, checksum) == 48);
    assert!(std::mem::offset_of!(MessageHeader, flags) == 52);
    assert!(std::mem::offset_of!(MessageHeader, node_id) == 56);
};

impl MessageHeader {
    /// A header for a payload of `type_id` and `payload_len` bytes; ids and timestamp 0.
    pub fn new(type_id: u32, payload_len: usize) -> Self {
        MessageHeader {
            magic: MESSAGE_MAGIC,
            version: MESSAGE_VERSION,
            type_id,
            payload_len: payload_len as u32,
            ..Default::default()
        }
    }

    /// The message's priority (0–255; [`crate::priority`] names the levels).
    #[inline]
    pub fn priority(&self) -> u8 {
        ((self.flags & flags::PRIORITY_MASK) >> flags::PRIORITY_SHIFT) as u8
    }

    /// Sets the message's priority.
    #[inline]
    pub fn set_priority(&mut self, priority: u8) {
        self.flags =
            (self.flags & !flags::PRIORITY_MASK) | (u32::from(priority) << flags::PRIORITY_SHIFT);
    }

    /// The full HLC timestamp of the send event (time and node id).
    #[inline]
    pub fn hlc(&self) -> crate::hlc::HlcTimestamp {
        crate::hlc::HlcTimestamp::from_parts(self.timestamp, self.node_id)
    }

    /// Stores an HLC timestamp (time and node id).
    #[inline]
    pub fn set_hlc(&mut self, ts: crate::hlc::HlcTimestamp) {
        self.timestamp = ts.packed();
        self.node_id = ts.node();
    }

    /// The header of message `i` of a run stamped as one block from this, its first
    /// (as [`KernelHandle::send_batch`](crate::runtime::KernelHandle::send_batch) does):
    /// the same fields, with `message_id`, `correlation_id` and the packed timestamp
    /// each advanced by `i` (so the run's ids and timestamps are consecutive, distinct
    /// and increasing) and `payload_len` set. Used by engines that take a whole run
    /// ([`KernelEngine::try_enqueue_run`](crate::runtime::KernelEngine::try_enqueue_run)).
    ///
    /// ```
    /// use ringkernel_core::message::MessageHeader;
    /// let mut first = MessageHeader::new(7, 8);
    /// (first.message_id, first.correlation_id, first.timestamp) = (100, 100, 5000);
    /// let h = first.nth_of_run(3, 16);
    /// assert_eq!((h.message_id, h.correlation_id, h.timestamp, h.payload_len), (103, 103, 5003, 16));
    /// assert_eq!((h.type_id, h.node_id), (first.type_id, first.node_id));
    /// ```
    #[inline]
    pub fn nth_of_run(&self, i: u64, payload_len: usize) -> MessageHeader {
        MessageHeader {
            payload_len: payload_len as u32,
            message_id: self.message_id.wrapping_add(i),
            correlation_id: self.correlation_id.wrapping_add(i),
            timestamp: self.timestamp.wrapping_add(i),
            ..*self
        }
    }

    /// Writes [`nth_of_run`](Self::nth_of_run)`(i, payload_len)` to `dst` without
    /// building it first: this header's bytes, then the four fields that differ. (A
    /// header built in a local and copied out at once is read back in 16-byte pieces
    /// right after it was written field by field, and the CPU cannot forward those
    /// reads from the narrower stores: each waits for them to reach the cache, once per
    /// message.)
    ///
    /// ```
    /// use ringkernel_core::message::{MessageHeader, HEADER_SIZE};
    /// let mut first = MessageHeader::new(7, 8);
    /// (first.message_id, first.correlation_id, first.timestamp) = (100, 100, 5000);
    /// let mut out = [0u8; HEADER_SIZE];
    /// // SAFETY: `out` holds HEADER_SIZE writable bytes.
    /// unsafe { first.write_nth_of_run(out.as_mut_ptr(), 3, 16) };
    /// assert_eq!(out, bytemuck::bytes_of(&first.nth_of_run(3, 16)));
    /// assert_eq!(first.nth_hlc(3), first.nth_of_run(3, 16).hlc());
    /// ```
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of [`HEADER_SIZE`] bytes (any alignment) and does not
    /// overlap `self`.
    #[inline(always)]
    pub unsafe fn write_nth_of_run(&self, dst: *mut u8, i: u64, payload_len: usize) {
        use std::mem::offset_of;
        // SAFETY: the caller's promise: HEADER_SIZE writable bytes at `dst`, apart from
        // `self` (HEADER_SIZE readable bytes); every field offset plus its size lies
        // within the header (the layout asserts above); unaligned writes make no
        // alignment claim.
        unsafe {
            std::ptr::copy_nonoverlapping((self as *const Self).cast::<u8>(), dst, HEADER_SIZE);
            let at = |off: usize| dst.add(off);
            std::ptr::write_unaligned(at(offset_of!(Self, payload_len)).cast(), payload_len as u32);
            std::ptr::write_unaligned(
                at(offset_of!(Self, message_id)).cast(),
                self.message_id.wrapping_add(i),
            );
            std::ptr::write_unaligned(
                at(offset_of!(Self, correlation_id)).cast(),
                self.correlation_id.wrapping_add(i),
            );
            std::ptr::write_unaligned(
                at(offset_of!(Self, timestamp)).cast(),
                self.timestamp.wrapping_add(i),
            );
        }
    }

    /// The HLC timestamp of [`nth_of_run`](Self::nth_of_run)`(i, _)`.
    #[inline]
    pub fn nth_hlc(&self, i: u64) -> crate::hlc::HlcTimestamp {
        crate::hlc::HlcTimestamp::from_parts(self.timestamp.wrapping_add(i), self.node_id)
    }

    /// Whether magic and version are the ones this build writes.
    pub fn is_valid(&self) -> bool {
        self.magic == MESSAGE_MAGIC && self.version == MESSAGE_VERSION
    }
}

/// FNV-1a (32-bit) of `bytes`: the payload checksum (cheap to compute on any device).
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in bytes {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Largest payload a slot of `slot_size` bytes can carry.
pub fn max_payload(slot_size: usize) -> usize {
    slot_size.saturating_sub(HEADER_SIZE)
}

/// The id of one message: a `u64` unique within a runtime, the same number as
/// [`MessageHeader::message_id`].
///
/// A message struct may carry it in a field marked `#[message(id)]` (see
/// [`RingMessage`]): on receive, that field holds the id the message travelled with.
///
/// ```
/// use ringkernel_core::message::MessageId;
/// let id = MessageId::new(42);
/// assert_eq!(id.get(), 42);
/// assert_eq!(id.to_string(), "42");
/// ```
#[repr(transparent)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Pod,
    Zeroable,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub struct MessageId(pub u64);

impl MessageId {
    /// A message id from its number.
    pub const fn new(id: u64) -> Self {
        MessageId(id)
    }
    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl ArchivedMessageId {
    /// The number (the archived form is a little-endian `u64`).
    pub fn get(&self) -> u64 {
        self.0.to_native()
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<u64> for MessageId {
    fn from(id: u64) -> Self {
        MessageId(id)
    }
}

impl From<MessageId> for u64 {
    fn from(id: MessageId) -> Self {
        id.0
    }
}

/// How a message's payload is laid out in its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The value's own bytes (`bytemuck::Pod`): fixed size, readable by GPU handlers.
    Plain,
    /// An rkyv archive ([`flags::RKYV`] set in the header): variable size (`Vec`,
    /// `String`, nested structs), validated on read, read in place through
    /// [`Envelope::archived`].
    Rkyv,
}

impl Encoding {
    /// The header flag bits that mark this encoding.
    pub const fn flags(self) -> u32 {
        match self {
            Encoding::Plain => 0,
            Encoding::Rkyv => flags::RKYV,
        }
    }

    /// The encoding a header says its payload has.
    pub const fn of(header: &MessageHeader) -> Encoding {
        if header.flags & flags::RKYV != 0 {
            Encoding::Rkyv
        } else {
            Encoding::Plain
        }
    }

    /// `"plain data"` or `"rkyv"`.
    pub const fn name(self) -> &'static str {
        match self {
            Encoding::Plain => "plain data",
            Encoding::Rkyv => "rkyv",
        }
    }
}

/// A message's encoded payload: borrowed straight from the value for plain data (no
/// copy), an rkyv archive otherwise.
pub enum Payload<'a> {
    /// The bytes of a plain-data value.
    Borrowed(&'a [u8]),
    /// An rkyv archive.
    Owned(rkyv::util::AlignedVec),
}

impl std::ops::Deref for Payload<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Payload::Borrowed(b) => b,
            Payload::Owned(v) => v.as_slice(),
        }
    }
}

impl std::fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payload").field("len", &self.len()).finish()
    }
}

/// How a message type turns into payload bytes and back, without the header checks
/// (those are [`RingMessage::encode_payload`]'s and [`RingMessage::decode`]'s).
///
/// Every `bytemuck::Pod` type has it (plain data, [`Encoding::Plain`]);
/// `#[derive(RingMessage)]` on a struct without `#[repr(C)]` implements it with rkyv.
/// Not meant to be implemented by hand.
pub trait MessageCodec: Sized {
    /// The payload encoding.
    const ENCODING: Encoding;
    /// The payload bytes of `self`.
    fn to_payload(&self) -> Result<Payload<'_>>;
    /// Reads a value out of payload bytes whose encoding was checked; `name` is for
    /// errors.
    fn from_payload(payload: &[u8], name: &'static str) -> Result<Self>;
    /// The payloads of `msgs` as one slice, each `size_of::<Self>()` bytes, back to
    /// back, when they are exactly that (plain data of a non-zero size); `None`
    /// otherwise (each has a payload of its own, [`to_payload`](Self::to_payload)).
    #[inline]
    fn run_bytes(msgs: &[Self]) -> Option<&[u8]> {
        let _ = msgs;
        None
    }
    /// Appends the `count` values of a run whose payloads lie back to back in
    /// `payloads`, `len` bytes each at a stride of `len` rounded up to 8 (as
    /// [`run_payload`](crate::runtime::run_payload) reads them), with one copy, when
    /// they are plain data of exactly `size_of::<Self>()` bytes at that stride (the
    /// receiving side of [`run_bytes`](Self::run_bytes)). Returns whether it did;
    /// `false` appends nothing (decode each with [`from_payload`](Self::from_payload)).
    #[inline]
    fn extend_from_run(out: &mut Vec<Self>, payloads: &[u8], len: usize, count: usize) -> bool {
        let _ = (out, payloads, len, count);
        false
    }
}

impl<T: Pod> MessageCodec for T {
    const ENCODING: Encoding = Encoding::Plain;
    #[inline]
    fn to_payload(&self) -> Result<Payload<'_>> {
        Ok(Payload::Borrowed(bytemuck::bytes_of(self)))
    }
    #[inline]
    fn from_payload(payload: &[u8], name: &'static str) -> Result<Self> {
        if payload.len() != std::mem::size_of::<T>() {
            return Err(Error::invalid(format!(
                "payload of {} bytes cannot be a {} ({} bytes)",
                payload.len(),
                name,
                std::mem::size_of::<T>()
            )));
        }
        Ok(bytemuck::pod_read_unaligned(payload))
    }
    #[inline]
    fn run_bytes(msgs: &[Self]) -> Option<&[u8]> {
        (std::mem::size_of::<T>() > 0).then(|| bytemuck::cast_slice(msgs))
    }
    #[inline]
    fn extend_from_run(out: &mut Vec<Self>, payloads: &[u8], len: usize, count: usize) -> bool {
        let size = std::mem::size_of::<T>();
        // The stride is `len` itself only when `len` is a multiple of 8.
        let Some(bytes) = count.checked_mul(size) else {
            return false;
        };
        if size == 0 || len != size || !len.is_multiple_of(8) || payloads.len() < bytes {
            return false;
        }
        out.reserve(count);
        // SAFETY: `reserve` made room for `count` more values after `out.len()`;
        // `payloads` has `bytes = count · size_of::<T>()` readable bytes and cannot
        // overlap `out`'s buffer (a shared borrow beside a unique one); `T: Pod`, so
        // any bytes are a valid `T` (and a byte copy has no alignment needs), and the
        // first `count` values after the old length are then initialised.
        unsafe {
            std::ptr::copy_nonoverlapping(
                payloads.as_ptr(),
                out.as_mut_ptr().add(out.len()).cast::<u8>(),
                bytes,
            );
            out.set_len(out.len() + count);
        }
        true
    }
}

/// The rkyv serialiser every message archive is written with.
pub type RkyvSerializer<'a> = rkyv::api::high::HighSerializer<
    rkyv::util::AlignedVec,
    rkyv::ser::allocator::ArenaHandle<'a>,
    rkyv::rancor::Error,
>;
/// The rkyv validator every message archive is checked with.
pub type RkyvValidator<'a> = rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>;
/// The rkyv deserialiser owned decodes use.
pub type RkyvDeserializer = rkyv::api::high::HighDeserializer<rkyv::rancor::Error>;

/// Archives `value` with rkyv ([`Encoding::Rkyv`]'s payload). Used by the code
/// `#[derive(RingMessage)]` generates.
pub fn rkyv_encode<T>(value: &T, name: &'static str) -> Result<Payload<'static>>
where
    T: for<'a> rkyv::Serialize<RkyvSerializer<'a>>,
{
    rkyv::to_bytes::<rkyv::rancor::Error>(value)
        .map(Payload::Owned)
        .map_err(|e| Error::Decode {
            type_name: name,
            reason: format!("rkyv serialisation failed: {e}"),
        })
}

/// Validated access to the archived `T` in `payload` (no deserialisation, no copy).
/// A truncated or corrupted archive is [`Error::Decode`].
pub fn rkyv_access<'p, T>(payload: &'p [u8], name: &'static str) -> Result<&'p T::Archived>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<RkyvValidator<'a>>,
{
    rkyv::access::<T::Archived, rkyv::rancor::Error>(payload).map_err(|e| Error::Decode {
        type_name: name,
        reason: format!("invalid rkyv archive ({} bytes): {e}", payload.len()),
    })
}

/// Validates and deserialises the archived `T` in `payload`. A truncated or corrupted
/// archive is [`Error::Decode`].
pub fn rkyv_decode<T>(payload: &[u8], name: &'static str) -> Result<T>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<RkyvValidator<'a>>
        + rkyv::Deserialize<T, RkyvDeserializer>,
{
    let archived = rkyv_access::<T>(payload, name)?;
    rkyv::deserialize::<T, rkyv::rancor::Error>(archived).map_err(|e| Error::Decode {
        type_name: name,
        reason: format!("rkyv deserialisation failed: {e}"),
    })
}

/// [`Error::TypeMismatch`] unless `header` carries `type_id`, then
/// [`Error::EncodingMismatch`] unless its [`flags::RKYV`] bit says `encoding`.
#[inline]
pub fn check_header(
    header: &MessageHeader,
    type_id: u32,
    name: &'static str,
    encoding: Encoding,
) -> Result<()> {
    if header.type_id != type_id || Encoding::of(header) != encoding {
        return Err(header_mismatch(header, type_id, name, encoding));
    }
    Ok(())
}

/// The error of [`check_header`] for a header it refuses.
#[cold]
fn header_mismatch(
    header: &MessageHeader,
    type_id: u32,
    name: &'static str,
    encoding: Encoding,
) -> Error {
    if header.type_id != type_id {
        return Error::TypeMismatch {
            expected: type_id,
            found: header.type_id,
        };
    }
    let found = Encoding::of(header);
    Error::EncodingMismatch {
        type_id,
        reason: format!(
            "{name} is a {} message but the payload is {}",
            encoding.name(),
            found.name()
        ),
    }
}

/// A message type with a stable id: plain data (`#[repr(C)]`, `bytemuck::Pod`, copied
/// straight into the slot) or a variable-size struct archived with rkyv.
///
/// Implement it with `#[derive(RingMessage)]` from `ringkernel-derive` (re-exported by
/// the `ringkernel` facade):
///
/// ```ignore
/// // Plain data: fixed size, readable by GPU handlers.
/// #[derive(Clone, Copy, Debug, RingMessage)]
/// #[message(type_id = 1)]
/// #[repr(C)]
/// struct Scale { id: u64, factor: f32, value: f32 }
///
/// // Without #[repr(C)]: archived with rkyv (Vec, String, Option, nested structs).
/// #[derive(RingMessage)]
/// #[message(type_id = 2)]
/// struct Batch { #[message(id)] id: MessageId, label: String, data: Vec<f32> }
/// ```
///
/// A hand-written `impl RingMessage for T` (only `TYPE_ID` and `NAME`) works for any
/// `bytemuck::Pod` type `T`.
///
/// # The `#[message(id)]` field
///
/// One field of type [`MessageId`] may be marked `#[message(id)]`. Its value is
/// **ignored on send** (the runtime gives every message a fresh id, which is what
/// replies are correlated with) and **set on receive** from
/// [`MessageHeader::message_id`], so a handler or receiver sees the id the message
/// travelled with. (The archived form read through [`Envelope::archived`] holds the
/// sender's value; use `envelope.header.message_id` there.)
pub trait RingMessage: MessageCodec + Send + Sync + 'static {
    /// Stable identifier written into [`MessageHeader::type_id`].
    const TYPE_ID: u32;
    /// Type name, for error messages and telemetry.
    const NAME: &'static str;

    /// Sets the `#[message(id)]` field, if the type has one (the derive overrides
    /// this; the default does nothing).
    #[inline]
    fn set_message_id(&mut self, _id: MessageId) {}

    /// The payload encoding ([`MessageCodec::ENCODING`]).
    #[inline]
    fn encoding() -> Encoding {
        <Self as MessageCodec>::ENCODING
    }

    /// The payload bytes: the value's own bytes for plain data (borrowed, no copy), an
    /// rkyv archive otherwise. Headers for it carry [`Self::header_flags`].
    #[inline]
    fn encode_payload(&self) -> Result<Payload<'_>> {
        self.to_payload()
    }

    /// The flag bits a header of this type carries ([`flags::RKYV`] for rkyv).
    #[inline]
    fn header_flags() -> u32 {
        <Self as MessageCodec>::ENCODING.flags()
    }

    /// Decodes a payload: checks the type id ([`Error::TypeMismatch`]) and the
    /// encoding flag ([`Error::EncodingMismatch`]), then the size (plain data,
    /// [`Error::InvalidArgument`]) or the archive (rkyv, [`Error::Decode`]), and sets
    /// the `#[message(id)]` field from the header.
    #[inline]
    fn decode(header: &MessageHeader, payload: &[u8]) -> Result<Self> {
        check_header(
            header,
            Self::TYPE_ID,
            Self::NAME,
            <Self as MessageCodec>::ENCODING,
        )?;
        let mut m = Self::from_payload(payload, Self::NAME)?;
        m.set_message_id(MessageId(header.message_id));
        Ok(m)
    }
}

/// A plain-data message: what GPU-side typed helpers need (the bytes are the value).
/// Every `RingMessage` that is `bytemuck::Pod` is one.
pub trait PodMessage: RingMessage + Pod {}

impl<T: RingMessage + Pod> PodMessage for T {}

/// An owned message: header plus payload bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The header as it was in the slot.
    pub header: MessageHeader,
    /// `header.payload_len` bytes.
    pub payload: Vec<u8>,
}

impl Envelope {
    /// Wraps a typed message (ids and timestamp are filled in when it is sent), with
    /// priority [`NORMAL`](crate::priority::NORMAL). An rkyv message whose serialisation
    /// fails is [`Error::Decode`]; plain data never fails (see [`Envelope::try_new`] to
    /// handle that case instead of panicking).
    ///
    /// # Panics
    ///
    /// If rkyv cannot serialise the message (only possible for types whose
    /// serialisation can fail, e.g. a hand-written `Serialize` returning an error).
    pub fn new<M: RingMessage>(msg: &M) -> Self {
        match Self::try_new(msg) {
            Ok(e) => e,
            Err(e) => panic!("Envelope::new: {e}"),
        }
    }

    /// Wraps a typed message (priority [`NORMAL`](crate::priority::NORMAL));
    /// [`Error::Decode`] when rkyv cannot serialise it.
    pub fn try_new<M: RingMessage>(msg: &M) -> Result<Self> {
        let payload = msg.encode_payload()?.to_vec();
        let mut header = MessageHeader::new(M::TYPE_ID, payload.len());
        header.flags |= M::header_flags();
        header.set_priority(crate::priority::NORMAL);
        Ok(Envelope { header, payload })
    }

    /// Wraps raw payload bytes with a `type_id` (plain data: no [`flags::RKYV`]), with
    /// priority [`NORMAL`](crate::priority::NORMAL).
    pub fn from_bytes(type_id: u32, payload: &[u8]) -> Self {
        let mut header = MessageHeader::new(type_id, payload.len());
        header.set_priority(crate::priority::NORMAL);
        Envelope {
            header,
            payload: payload.to_vec(),
        }
    }

    /// The same message with priority `priority` (honoured by
    /// [`KernelHandle::send_envelope`](crate::runtime::KernelHandle::send_envelope)).
    ///
    /// ```
    /// use ringkernel_core::message::Envelope;
    /// use ringkernel_core::priority;
    /// let env = Envelope::from_bytes(7, &[1, 2, 3]);
    /// assert_eq!(env.header.priority(), priority::NORMAL);
    /// assert_eq!(env.with_priority(priority::HIGH).header.priority(), priority::HIGH);
    /// ```
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.header.set_priority(priority);
        self
    }

    /// Decodes the payload as `M` (see [`RingMessage::decode`]: type id, encoding,
    /// size or archive validity are checked).
    pub fn decode<M: RingMessage>(&self) -> Result<M> {
        M::decode(&self.header, &self.payload)
    }

    /// Validated, zero-copy access to the archived form of an rkyv message: no
    /// deserialisation, no allocation. Type id and encoding are checked as in
    /// [`Envelope::decode`]; a truncated or corrupted archive is [`Error::Decode`].
    ///
    /// ```
    /// use ringkernel_core::message::{Envelope, RingMessage};
    /// use ringkernel_derive::RingMessage;
    ///
    /// #[derive(Debug, PartialEq, RingMessage)]
    /// #[message(type_id = 20)]
    /// struct Samples { label: String, data: Vec<f32> }
    ///
    /// let env = Envelope::new(&Samples { label: "a".into(), data: vec![1.0, 2.0] });
    /// let archived = env.archived::<Samples>().unwrap();
    /// assert_eq!(archived.label, "a");
    /// assert_eq!(archived.data.iter().map(|x| x.to_native()).sum::<f32>(), 3.0);
    /// ```
    pub fn archived<M>(&self) -> Result<&rkyv::Archived<M>>
    where
        M: RingMessage + rkyv::Archive,
        M::Archived: for<'a> rkyv::bytecheck::CheckBytes<RkyvValidator<'a>>,
    {
        check_header(&self.header, M::TYPE_ID, M::NAME, Encoding::Rkyv)?;
        rkyv_access::<M>(&self.payload, M::NAME)
    }

    /// Whether this message is of type `M`.
    pub fn is<M: RingMessage>(&self) -> bool {
        self.header.type_id == M::TYPE_ID
    }

    /// The payload encoding the header declares.
    pub fn encoding(&self) -> Encoding {
        Encoding::of(&self.header)
    }

    /// Checks that the payload fits a slot of `slot_size` bytes.
    pub fn check_fits(&self, slot_size: usize) -> Result<()> {
        check_payload_fits(self.payload.len(), slot_size)
    }
}

/// [`Error::MessageTooLarge`] when `len` payload bytes do not fit a `slot_size` slot.
pub fn check_payload_fits(len: usize, slot_size: usize) -> Result<()> {
    let max = max_payload(slot_size);
    if len > max {
        Err(Error::MessageTooLarge { size: len, max })
    } else {
        Ok(())
    }
}

/// Writes `header` and `payload` into `slot` (which must be at least
/// `HEADER_SIZE + payload.len()` bytes; checked).
pub fn write_slot(slot: &mut [u8], header: &MessageHeader, payload: &[u8]) -> Result<()> {
    write_slot_owned(slot, *header, payload)
}

/// [`write_slot`] with the header already copied (the queues stamp magic and version
/// on their copy first: one copy of the header per write).
#[inline(always)]
pub(crate) fn write_slot_owned(slot: &mut [u8], h: MessageHeader, payload: &[u8]) -> Result<()> {
    check_payload_fits(payload.len(), slot.len())?;
    write_slot_fitting(slot, h, payload);
    Ok(())
}

/// [`write_slot_owned`] for a payload the caller has already checked against the
/// slot's size: nothing to return. (A writer that drops the `Ok(())` of each message
/// moves the `Result` through the stack, and reading it back wide right after it was
/// written narrow stalls the store-to-load forwarding, once per message.) Panics if
/// the payload does not fit after all.
#[inline(always)]
pub(crate) fn write_slot_fitting(slot: &mut [u8], mut h: MessageHeader, payload: &[u8]) {
    h.payload_len = payload.len() as u32;
    if h.flags & flags::CHECKSUM != 0 {
        h.checksum = fnv1a32(payload);
    }
    slot[..HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&h));
    slot[HEADER_SIZE..HEADER_SIZE + payload.len()].copy_from_slice(payload);
}

/// Reads the header and payload out of a slot. A header whose `payload_len` does not
/// fit the slot, or whose checksum (when flagged) does not match, is an error.
pub fn read_slot(slot: &[u8]) -> Result<Envelope> {
    if slot.len() < HEADER_SIZE {
        return Err(Error::invalid("slot smaller than a message header"));
    }
    let header: MessageHeader = bytemuck::pod_read_unaligned(&slot[..HEADER_SIZE]);
    let len = header.payload_len as usize;
    check_payload_fits(len, slot.len())?;
    let payload = slot[HEADER_SIZE..HEADER_SIZE + len].to_vec();
    if header.flags & flags::CHECKSUM != 0 && fnv1a32(&payload) != header.checksum {
        return Err(Error::Device(format!(
            "checksum mismatch on message {} (type {})",
            header.message_id, header.type_id
        )));
    }
    Ok(Envelope { header, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_plain_data_decodes_with_one_copy_as_one_by_one() {
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
        struct Nine([u64; 9]);
        let mut rng = crate::util::SplitMix64::new(0x72_u64 ^ std::process::id() as u64);
        let count = 37;
        // One byte in, so that the payloads are not aligned for `Nine`.
        let bytes: Vec<u8> = (0..count * 72 + 1).map(|_| rng.next_u64() as u8).collect();
        let run = &bytes[1..];
        let mut out = vec![Nine([7; 9])];
        assert!(Nine::extend_from_run(&mut out, run, 72, count));
        assert_eq!(out.len(), count + 1);
        assert_eq!(out[0], Nine([7; 9]));
        for i in 0..count {
            // The stride of 72-byte payloads is 72 (`runtime::run_payload`).
            let one = Nine::from_payload(&run[i * 72..(i + 1) * 72], "Nine").unwrap();
            assert_eq!(out[i + 1], one, "value {i}");
        }
        // Not this type's size, too few bytes, a stride that is not the size: nothing.
        let mut none: Vec<Nine> = Vec::new();
        assert!(!Nine::extend_from_run(&mut none, run, 64, count));
        assert!(!Nine::extend_from_run(
            &mut none,
            &run[..72 * count - 1],
            72,
            count
        ));
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
        struct Twelve([u32; 3]);
        let mut twelve: Vec<Twelve> = Vec::new();
        assert!(!Twelve::extend_from_run(&mut twelve, run, 12, 4));
        assert!(none.is_empty() && twelve.is_empty());
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
    struct Ping {
        a: u64,
        b: f32,
        c: u32,
    }
    impl RingMessage for Ping {
        const TYPE_ID: u32 = 7;
        const NAME: &'static str = "Ping";
    }

    #[test]
    fn slot_round_trip_with_checksum() {
        let msg = Ping {
            a: 1 << 40,
            b: 2.5,
            c: 9,
        };
        let mut env = Envelope::new(&msg);
        env.header.flags |= flags::CHECKSUM;
        env.header.message_id = 42;
        let mut slot = vec![0xAAu8; DEFAULT_SLOT_SIZE];
        write_slot(&mut slot, &env.header, &env.payload).unwrap();
        let back = read_slot(&slot).unwrap();
        assert_eq!(back.header.message_id, 42);
        assert_eq!(back.header.checksum, fnv1a32(&env.payload));
        assert_eq!(back.decode::<Ping>().unwrap(), msg);
        // Corrupt one payload byte: the checksum catches it.
        slot[HEADER_SIZE] ^= 1;
        assert!(read_slot(&slot).is_err());
    }

    #[test]
    fn oversized_payload_is_rejected() {
        let payload = vec![1u8; DEFAULT_SLOT_SIZE - HEADER_SIZE + 1];
        let mut slot = vec![0u8; DEFAULT_SLOT_SIZE];
        let err =
            write_slot(&mut slot, &MessageHeader::new(1, payload.len()), &payload).unwrap_err();
        assert_eq!(
            err,
            Error::MessageTooLarge {
                size: DEFAULT_SLOT_SIZE - HEADER_SIZE + 1,
                max: DEFAULT_SLOT_SIZE - HEADER_SIZE
            }
        );
        assert!(
            slot.iter().all(|&b| b == 0),
            "a refused write leaves the slot untouched"
        );
        // Exactly the maximum fits.
        let payload = vec![1u8; DEFAULT_SLOT_SIZE - HEADER_SIZE];
        write_slot(&mut slot, &MessageHeader::new(1, payload.len()), &payload).unwrap();
    }

    #[test]
    fn decode_checks_type() {
        let env = Envelope::from_bytes(3, &[0u8; 16]);
        assert_eq!(
            env.decode::<Ping>(),
            Err(Error::TypeMismatch {
                expected: 7,
                found: 3
            })
        );
        let env = Envelope::from_bytes(7, &[0u8; 8]);
        assert!(matches!(
            env.decode::<Ping>(),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn plain_payload_borrows_the_value() {
        let msg = Ping { a: 1, b: 2.0, c: 3 };
        let payload = msg.encode_payload().unwrap();
        assert!(matches!(payload, Payload::Borrowed(_)));
        // No copy: the payload is the value's own memory.
        assert_eq!(payload.as_ptr(), (&msg as *const Ping).cast::<u8>());
        assert_eq!(payload.len(), std::mem::size_of::<Ping>());
        assert_eq!(Ping::header_flags(), 0);
        assert_eq!(Ping::encoding(), Encoding::Plain);
    }

    #[test]
    fn plain_decode_refuses_an_rkyv_flag() {
        let mut env = Envelope::new(&Ping { a: 1, b: 2.0, c: 3 });
        env.header.flags |= flags::RKYV;
        assert!(matches!(
            env.decode::<Ping>(),
            Err(Error::EncodingMismatch { type_id: 7, .. })
        ));
        assert_eq!(env.encoding(), Encoding::Rkyv);
    }

    #[test]
    fn rkyv_helpers_round_trip_and_validate() {
        let v: Vec<String> = vec!["a".into(), "bcd".into()];
        let bytes = rkyv_encode(&v, "Strings").unwrap();
        let back: Vec<String> = rkyv_decode::<Vec<String>>(&bytes, "Strings").unwrap();
        assert_eq!(back, v);
        let a = rkyv_access::<Vec<String>>(&bytes, "Strings").unwrap();
        assert_eq!(a[1], "bcd");
        // Unaligned archives are fine (the `unaligned` format): read at offset 1.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        assert_eq!(
            rkyv_access::<Vec<String>>(&shifted[1..], "Strings")
                .unwrap()
                .len(),
            2
        );
        assert!(matches!(
            rkyv_decode::<Vec<String>>(&bytes[..bytes.len() - 2], "Strings"),
            Err(Error::Decode {
                type_name: "Strings",
                ..
            })
        ));
    }

    #[test]
    fn message_id_is_a_u64() {
        let id = MessageId::from(5u64);
        assert_eq!(u64::from(id), 5);
        assert_eq!(id.get(), 5);
        assert_eq!(format!("{id}"), "5");
        assert_eq!(std::mem::size_of::<MessageId>(), 8);
        let bytes = rkyv_encode(&id, "MessageId").unwrap();
        assert_eq!(bytes.len(), 8);
        assert_eq!(
            rkyv_access::<MessageId>(&bytes, "MessageId").unwrap().get(),
            5
        );
    }

    #[test]
    fn fnv_known_values() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(fnv1a32(b""), 0x811c9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9cf968);
    }
}
