//! The bridge's frames on the wire: little-endian, fixed fields first, then the
//! variable parts. Decoding checks every length against the buffer: a short or
//! malformed frame is an error (counted by the bridge), never a panic.
//!
//! ```text
//! K2K   magic u32 | kind u8 = 1 | 0 u8 ×3 | epoch u64 | seq u64 | src_kernel u32 |
//!       dest_id u32 | src_name_len u16 | dest_name_len u16 | 0 u32 |
//!       MessageHeader (64 B) | src_name | dest_name | payload
//! ACK   magic u32 | kind u8 = 2 | 0 u8 ×3 | epoch u64 | first_seq u64 | count u32 |
//!       0 u32 | one receipt code (u8) per message, seq first_seq.. in order
//! TOPIC magic u32 | kind u8 = 3 | 0 u8 ×3 | epoch u64 | seq u64 | src_kernel u32 |
//!       topic_len u32 | src_name_len u16 | node_len u16 | 0 u32 |
//!       MessageHeader (64 B) | topic | src_name | node | payload
//! ```
//!
//! `epoch` is the sending bridge's incarnation (random per start): a receiver resets
//! its view of a sender whose epoch changed, and an ACK carries the epoch of the
//! frames it answers so that a restarted sender ignores answers meant for its
//! predecessor.

use ringkernel_core::message::{MessageHeader, HEADER_SIZE};
use ringkernel_core::{Error, Result};

/// `"RKZ1"` little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RKZ1");

const KIND_K2K: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_TOPIC: u8 = 3;

/// Fixed part of a K2K frame before the message header.
const K2K_FIXED: usize = 40;
/// Fixed part of an ACK frame.
const ACK_FIXED: usize = 32;
/// Fixed part of a TOPIC frame before the message header.
const TOPIC_FIXED: usize = 40;

/// What became of one K2K message at its destination, as an ACK reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RemoteReceipt {
    /// In the destination kernel's input queue (or, for a reply to a host, in the
    /// reply queue of the sender's stand-in).
    Delivered = 0,
    /// The destination kernel's input queue was full: not delivered.
    QueueFull = 1,
    /// No live kernel of that name or id at the destination: not delivered.
    NotFound = 2,
    /// Refused by the destination runtime (payload too large for its slots, an
    /// encoding its handler cannot read, a timestamp too far ahead of its clock, K2K
    /// switched off): not delivered.
    Rejected = 3,
    /// No receipt came: the peer disappeared, or the ack timeout passed, first. The
    /// message may or may not be in the destination queue. Never sent on the wire.
    Lost = 4,
}

impl RemoteReceipt {
    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => RemoteReceipt::Delivered,
            1 => RemoteReceipt::QueueFull,
            2 => RemoteReceipt::NotFound,
            3 => RemoteReceipt::Rejected,
            _ => return None,
        })
    }
}

/// A decoded frame, borrowing from the received bytes.
#[derive(Debug, PartialEq)]
pub enum Frame<'a> {
    /// A kernel-to-kernel message.
    K2k(K2kFrame<'a>),
    /// Receipts for a run of K2K messages.
    Ack(AckFrame),
    /// A publication.
    Topic(TopicFrame<'a>),
}

/// A kernel-to-kernel message between runtimes.
#[derive(Debug, Clone, PartialEq)]
pub struct K2kFrame<'a> {
    /// The sender bridge's incarnation.
    pub epoch: u64,
    /// Per (sender, receiver) sequence number, from 0.
    pub seq: u64,
    /// Sending kernel's id in its runtime (0: the host).
    pub src_kernel: u32,
    /// Sending kernel's name.
    pub src_name: &'a str,
    /// Destination kernel by id (used when `dest_name` is empty; 0: the host).
    pub dest_id: u32,
    /// Destination kernel by name (empty: by id).
    pub dest_name: &'a str,
    /// The message header as the sender stamped it.
    pub header: MessageHeader,
    /// The payload.
    pub payload: &'a [u8],
}

/// Receipts for K2K messages `first_seq..first_seq + receipts.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct AckFrame {
    /// Epoch of the frames answered.
    pub epoch: u64,
    /// Sequence number of the first receipt.
    pub first_seq: u64,
    /// One receipt per message, in sequence order.
    pub receipts: Vec<RemoteReceipt>,
}

/// A publication to a topic.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicFrame<'a> {
    /// The sender bridge's incarnation.
    pub epoch: u64,
    /// Per-sender publication sequence number, from 0.
    pub seq: u64,
    /// Publishing kernel's id in its runtime (0: the host).
    pub src_kernel: u32,
    /// Publishing kernel's name ("" for the host).
    pub src_name: &'a str,
    /// The publishing bridge's node name.
    pub node: &'a str,
    /// The topic name.
    pub topic: &'a str,
    /// The message header as the sender stamped it.
    pub header: MessageHeader,
    /// The payload.
    pub payload: &'a [u8],
}

fn bad(reason: impl Into<String>) -> Error {
    Error::Decode {
        type_name: "ringkernel-zenoh frame",
        reason: reason.into(),
    }
}

fn put_prelude(out: &mut Vec<u8>, kind: u8, epoch: u64) {
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&[kind, 0, 0, 0]);
    out.extend_from_slice(&epoch.to_le_bytes());
}

fn len16(what: &str, s: &str) -> Result<u16> {
    u16::try_from(s.len()).map_err(|_| Error::invalid(format!("{what} longer than 65535 bytes")))
}

/// Encodes a K2K frame into `out` (cleared first).
pub fn encode_k2k(out: &mut Vec<u8>, f: &K2kFrame<'_>) -> Result<()> {
    out.clear();
    out.reserve(K2K_FIXED + HEADER_SIZE + f.src_name.len() + f.dest_name.len() + f.payload.len());
    put_prelude(out, KIND_K2K, f.epoch);
    out.extend_from_slice(&f.seq.to_le_bytes());
    out.extend_from_slice(&f.src_kernel.to_le_bytes());
    out.extend_from_slice(&f.dest_id.to_le_bytes());
    out.extend_from_slice(&len16("kernel name", f.src_name)?.to_le_bytes());
    out.extend_from_slice(&len16("kernel name", f.dest_name)?.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(bytemuck::bytes_of(&f.header));
    out.extend_from_slice(f.src_name.as_bytes());
    out.extend_from_slice(f.dest_name.as_bytes());
    out.extend_from_slice(f.payload);
    Ok(())
}

/// Encodes an ACK frame.
pub fn encode_ack(f: &AckFrame) -> Vec<u8> {
    let mut out = Vec::with_capacity(ACK_FIXED + f.receipts.len());
    put_prelude(&mut out, KIND_ACK, f.epoch);
    out.extend_from_slice(&f.first_seq.to_le_bytes());
    out.extend_from_slice(&(f.receipts.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend(f.receipts.iter().map(|r| *r as u8));
    out
}

/// Encodes a TOPIC frame into `out` (cleared first).
pub fn encode_topic(out: &mut Vec<u8>, f: &TopicFrame<'_>) -> Result<()> {
    out.clear();
    out.reserve(
        TOPIC_FIXED
            + HEADER_SIZE
            + f.topic.len()
            + f.src_name.len()
            + f.node.len()
            + f.payload.len(),
    );
    put_prelude(out, KIND_TOPIC, f.epoch);
    out.extend_from_slice(&f.seq.to_le_bytes());
    out.extend_from_slice(&f.src_kernel.to_le_bytes());
    let tl = u32::try_from(f.topic.len()).map_err(|_| Error::invalid("topic too long"))?;
    out.extend_from_slice(&tl.to_le_bytes());
    out.extend_from_slice(&len16("kernel name", f.src_name)?.to_le_bytes());
    out.extend_from_slice(&len16("node name", f.node)?.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(bytemuck::bytes_of(&f.header));
    out.extend_from_slice(f.topic.as_bytes());
    out.extend_from_slice(f.src_name.as_bytes());
    out.extend_from_slice(f.node.as_bytes());
    out.extend_from_slice(f.payload);
    Ok(())
}

/// A bounds-checked reader over a frame.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| bad(format!("frame of {} bytes is truncated", self.buf.len())))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self, n: usize) -> Result<&'a str> {
        std::str::from_utf8(self.take(n)?).map_err(|_| bad("a name is not UTF-8"))
    }
    fn header(&mut self) -> Result<MessageHeader> {
        let h: MessageHeader = bytemuck::pod_read_unaligned(self.take(HEADER_SIZE)?);
        if !h.is_valid() {
            return Err(bad("message header with a wrong magic or version"));
        }
        Ok(h)
    }
    fn payload(&mut self, header: &MessageHeader) -> Result<&'a [u8]> {
        let rest = &self.buf[self.at..];
        if rest.len() != header.payload_len as usize {
            return Err(bad(format!(
                "payload of {} bytes where the header says {}",
                rest.len(),
                header.payload_len
            )));
        }
        self.at = self.buf.len();
        Ok(rest)
    }
}

/// Decodes one frame.
pub fn decode(buf: &[u8]) -> Result<Frame<'_>> {
    let mut r = Reader { buf, at: 0 };
    if r.u32()? != MAGIC {
        return Err(bad("not a ringkernel-zenoh frame (wrong magic)"));
    }
    let kind = r.take(4)?[0];
    let epoch = r.u64()?;
    match kind {
        KIND_K2K => {
            let seq = r.u64()?;
            let src_kernel = r.u32()?;
            let dest_id = r.u32()?;
            let src_len = r.u16()? as usize;
            let dest_len = r.u16()? as usize;
            r.u32()?;
            let header = r.header()?;
            let src_name = r.str(src_len)?;
            let dest_name = r.str(dest_len)?;
            let payload = r.payload(&header)?;
            Ok(Frame::K2k(K2kFrame {
                epoch,
                seq,
                src_kernel,
                src_name,
                dest_id,
                dest_name,
                header,
                payload,
            }))
        }
        KIND_ACK => {
            let first_seq = r.u64()?;
            let count = r.u32()? as usize;
            r.u32()?;
            let codes = r.take(count)?;
            if r.at != buf.len() {
                return Err(bad("trailing bytes after the receipts"));
            }
            let receipts = codes
                .iter()
                .map(|&c| {
                    RemoteReceipt::from_code(c).ok_or_else(|| bad(format!("receipt code {c}")))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Frame::Ack(AckFrame {
                epoch,
                first_seq,
                receipts,
            }))
        }
        KIND_TOPIC => {
            let seq = r.u64()?;
            let src_kernel = r.u32()?;
            let topic_len = r.u32()? as usize;
            let src_len = r.u16()? as usize;
            let node_len = r.u16()? as usize;
            r.u32()?;
            let header = r.header()?;
            let topic = r.str(topic_len)?;
            let src_name = r.str(src_len)?;
            let node = r.str(node_len)?;
            let payload = r.payload(&header)?;
            Ok(Frame::Topic(TopicFrame {
                epoch,
                seq,
                src_kernel,
                src_name,
                node,
                topic,
                header,
                payload,
            }))
        }
        k => Err(bad(format!("unknown frame kind {k}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringkernel_core::hlc::HlcTimestamp;

    fn header(len: usize) -> MessageHeader {
        let mut h = MessageHeader::new(77, len);
        h.message_id = 5;
        h.correlation_id = 4;
        h.set_hlc(HlcTimestamp::new(1_700_000_000_123, 9).with_node(3 << 32));
        h
    }

    #[test]
    fn frames_round_trip() {
        let payload = [1u8, 2, 3, 4, 5];
        let k = K2kFrame {
            epoch: 0xDEAD_BEEF,
            seq: 41,
            src_kernel: 3,
            src_name: "source",
            dest_id: 0,
            dest_name: "worker",
            header: header(payload.len()),
            payload: &payload,
        };
        let mut buf = Vec::new();
        encode_k2k(&mut buf, &k).unwrap();
        assert_eq!(decode(&buf).unwrap(), Frame::K2k(k.clone()));

        let a = AckFrame {
            epoch: 7,
            first_seq: 100,
            receipts: vec![
                RemoteReceipt::Delivered,
                RemoteReceipt::QueueFull,
                RemoteReceipt::NotFound,
                RemoteReceipt::Rejected,
            ],
        };
        assert_eq!(decode(&encode_ack(&a)).unwrap(), Frame::Ack(a));

        let t = TopicFrame {
            epoch: 1,
            seq: 2,
            src_kernel: 0,
            src_name: "",
            node: "n1",
            topic: "a//b/température",
            header: header(0),
            payload: &[],
        };
        encode_topic(&mut buf, &t).unwrap();
        assert_eq!(decode(&buf).unwrap(), Frame::Topic(t));
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error() {
        let payload = [9u8; 17];
        let k = K2kFrame {
            epoch: 1,
            seq: 2,
            src_kernel: 3,
            src_name: "s",
            dest_id: 4,
            dest_name: "",
            header: header(payload.len()),
            payload: &payload,
        };
        let mut buf = Vec::new();
        encode_k2k(&mut buf, &k).unwrap();
        for n in 0..buf.len() {
            assert!(decode(&buf[..n]).is_err(), "truncated to {n}");
        }
        let mut longer = buf.clone();
        longer.push(0);
        assert!(decode(&longer).is_err(), "a trailing byte");
        let mut wrong_magic = buf.clone();
        wrong_magic[0] ^= 1;
        assert!(decode(&wrong_magic).is_err());
        let mut wrong_kind = buf.clone();
        wrong_kind[4] = 9;
        assert!(decode(&wrong_kind).is_err());
        let mut bad_header = buf.clone();
        bad_header[K2K_FIXED] ^= 0xFF; // the message header's magic
        assert!(decode(&bad_header).is_err());
        let mut huge_name = buf.clone();
        huge_name[32..34].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(decode(&huge_name).is_err());

        let mut ack = encode_ack(&AckFrame {
            epoch: 1,
            first_seq: 0,
            receipts: vec![RemoteReceipt::Delivered],
        });
        for n in 0..ack.len() {
            assert!(decode(&ack[..n]).is_err(), "ack truncated to {n}");
        }
        *ack.last_mut().unwrap() = 200;
        assert!(decode(&ack).is_err(), "unknown receipt code");
        let mut not_utf8 = Vec::new();
        encode_topic(
            &mut not_utf8,
            &TopicFrame {
                epoch: 1,
                seq: 0,
                src_kernel: 0,
                src_name: "k",
                node: "n",
                topic: "ab",
                header: header(0),
                payload: &[],
            },
        )
        .unwrap();
        let at = TOPIC_FIXED + HEADER_SIZE;
        not_utf8[at] = 0xFF;
        assert!(decode(&not_utf8).is_err());
    }
}
