//! Message model: a 64-byte [`MessageHeader`] followed by a fixed-size payload, written
//! straight into a queue slot.
//!
//! A slot is `slot_size` bytes (a power of two, default 256): the header, then up to
//! `slot_size - 64` payload bytes. The layout is shared bit for bit with the CUDA header
//! (`ringkernel.cuh`) and the WGSL struct in `ringkernel-shaders`.

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

/// A plain-data message type with a stable id.
///
/// Implement it with `#[derive(RingMessage)]` from `ringkernel-derive` (re-exported by
/// the `ringkernel` facade) on a `#[repr(C)]` struct of plain-data fields:
///
/// ```ignore
/// #[derive(Clone, Copy, Debug, RingMessage)]
/// #[message(type_id = 1)]
/// #[repr(C)]
/// struct Scale { id: u64, factor: f32, value: f32 }
/// ```
pub trait RingMessage: Pod + Send + Sync + 'static {
    /// Stable identifier written into [`MessageHeader::type_id`].
    const TYPE_ID: u32;
    /// Type name, for error messages and telemetry.
    const NAME: &'static str;
}

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
    /// priority [`NORMAL`](crate::priority::NORMAL).
    pub fn new<M: RingMessage>(msg: &M) -> Self {
        Self::from_bytes(M::TYPE_ID, bytemuck::bytes_of(msg))
    }

    /// Wraps raw payload bytes with a `type_id`, with priority
    /// [`NORMAL`](crate::priority::NORMAL).
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

    /// Decodes the payload as `M`, checking the type id and the size.
    pub fn decode<M: RingMessage>(&self) -> Result<M> {
        if self.header.type_id != M::TYPE_ID {
            return Err(Error::TypeMismatch {
                expected: M::TYPE_ID,
                found: self.header.type_id,
            });
        }
        if self.payload.len() != std::mem::size_of::<M>() {
            return Err(Error::invalid(format!(
                "payload of {} bytes cannot be a {} ({} bytes)",
                self.payload.len(),
                M::NAME,
                std::mem::size_of::<M>()
            )));
        }
        Ok(bytemuck::pod_read_unaligned(&self.payload))
    }

    /// Whether this message is of type `M`.
    pub fn is<M: RingMessage>(&self) -> bool {
        self.header.type_id == M::TYPE_ID
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
    check_payload_fits(payload.len(), slot.len())?;
    let mut h = *header;
    h.payload_len = payload.len() as u32;
    if h.flags & flags::CHECKSUM != 0 {
        h.checksum = fnv1a32(payload);
    }
    slot[..HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&h));
    slot[HEADER_SIZE..HEADER_SIZE + payload.len()].copy_from_slice(payload);
    Ok(())
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
    fn fnv_known_values() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(fnv1a32(b""), 0x811c9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9cf968);
    }
}
