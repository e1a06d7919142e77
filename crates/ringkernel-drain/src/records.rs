//! Messages held on the host as packed records (a 64-byte header, then the payload,
//! padded to 8 bytes) in reused byte chunks: the drain engine's waiting lanes and its
//! reply queue.
//!
//! A message costs one copy in and one copy out and no allocation of its own: chunks
//! are kept for reuse (up to [`SPARE_CHUNKS`]), so a steady stream allocates nothing
//! and faults in no fresh pages. Messages can be queued away from the queue (a pass's
//! replies, built without its lock, in [`Records::builder`]) and appended at once.
//!
//! ```
//! use ringkernel_core::message::MessageHeader;
//! use ringkernel_drain::records::Records;
//!
//! let mut q = Records::default();
//! q.push(&MessageHeader::new(7, 3), b"abc");
//! q.push(&MessageHeader::new(8, 1), b"z");
//! assert_eq!(q.len(), 2);
//! let mut seen = Vec::new();
//! q.pop_with(usize::MAX, |h, p| {
//!     seen.push((h.type_id, p.to_vec()));
//!     true
//! });
//! assert_eq!(seen, vec![(7, b"abc".to_vec()), (8, b"z".to_vec())]);
//! assert!(q.is_empty());
//! ```

use ringkernel_core::message::{MessageHeader, HEADER_SIZE};
use std::collections::VecDeque;

/// Bytes a chunk is allocated with (a larger record gets a chunk of its own size).
pub const CHUNK_BYTES: usize = 256 << 10;

/// Empty chunks kept for reuse by one queue (at most 16 MiB with [`CHUNK_BYTES`]: a
/// 65,536-slot kernel's full lane of `Token`s, about 9 MiB, is refilled from spares).
pub const SPARE_CHUNKS: usize = 64;

/// Bytes of one record: header, payload, padding to 8.
pub fn record_bytes(payload_len: usize) -> usize {
    HEADER_SIZE + payload_len.next_multiple_of(8)
}

/// Records in one byte buffer, read from the front.
#[derive(Debug, Default)]
struct Chunk {
    buf: Vec<u8>,
    read: usize,
    count: usize,
}

impl Chunk {
    /// An empty chunk reusing `buf`'s allocation.
    fn from_buffer(mut buf: Vec<u8>) -> Self {
        buf.clear();
        Chunk {
            buf,
            read: 0,
            count: 0,
        }
    }

    /// Whether a record of `payload_len` bytes fits without growing the buffer.
    fn fits(&self, payload_len: usize) -> bool {
        self.buf.capacity() - self.buf.len() >= record_bytes(payload_len)
    }

    /// Appends a record (growing the buffer if it must).
    #[inline]
    fn push(&mut self, header: &MessageHeader, payload: &[u8]) {
        let len = payload.len();
        let rec = record_bytes(len);
        self.buf.reserve(rec);
        let start = self.buf.len();
        // SAFETY: `reserve` made room for `rec` more bytes after `start`. The header
        // initialises the first 64; when there is a payload, a zero word initialises the
        // last 8 (the padding, under 8 bytes, lies in them) and the payload, copied
        // after it, the `len` bytes after the header: together every byte `set_len`
        // then covers. Unaligned writes make no alignment claim.
        unsafe {
            let dst = self.buf.as_mut_ptr().add(start);
            std::ptr::write_unaligned(dst.cast::<MessageHeader>(), *header);
            if rec > HEADER_SIZE {
                std::ptr::write_unaligned(dst.add(rec - 8).cast::<u64>(), 0);
            }
            std::ptr::copy_nonoverlapping(payload.as_ptr(), dst.add(HEADER_SIZE), len);
            self.buf.set_len(start + rec);
        }
        self.count += 1;
    }

    /// Hands the front record (header and payload, without the padding) to `take` and
    /// drops it; `None` when the chunk is empty.
    #[inline]
    fn pop(&mut self, take: impl FnOnce(&[u8]) -> bool) -> Option<bool> {
        if self.count == 0 {
            return None;
        }
        let at = self.read;
        let len = payload_len_of(&self.buf[at..at + HEADER_SIZE]);
        let go_on = take(&self.buf[at..at + HEADER_SIZE + len]);
        self.read += record_bytes(len);
        self.count -= 1;
        Some(go_on)
    }
}

/// The payload length a record's header (its first [`HEADER_SIZE`] bytes) gives.
#[inline]
fn payload_len_of(header: &[u8]) -> usize {
    let at = std::mem::offset_of!(MessageHeader, payload_len);
    u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]) as usize
}

/// A FIFO of message records in reused chunks.
#[derive(Debug, Default)]
pub struct Records {
    chunks: VecDeque<Chunk>,
    len: usize,
    spare: Vec<Vec<u8>>,
}

impl Records {
    /// Messages queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no message is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An empty queue with up to `bytes` worth of this one's spare chunks: fill it away
    /// from this queue (e.g. without its lock), then [`append`](Self::append) it here.
    pub fn builder(&mut self, bytes: usize) -> Records {
        let n = bytes.div_ceil(CHUNK_BYTES).min(self.spare.len());
        Records {
            chunks: VecDeque::new(),
            len: 0,
            spare: self.spare.split_off(self.spare.len() - n),
        }
    }

    /// Appends a message (`header.payload_len` must be `payload.len()`).
    #[inline]
    pub fn push(&mut self, header: &MessageHeader, payload: &[u8]) {
        debug_assert_eq!(header.payload_len as usize, payload.len());
        match self.chunks.back_mut() {
            Some(c) if c.fits(payload.len()) => c.push(header, payload),
            _ => {
                let buf = self
                    .spare
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(CHUNK_BYTES));
                let mut c = Chunk::from_buffer(buf);
                c.push(header, payload);
                self.chunks.push_back(c);
            }
        }
        self.len += 1;
    }

    /// Appends every message of `other`, in order, without copying them; its spare
    /// chunks are kept here.
    pub fn append(&mut self, other: Records) {
        self.len += other.len;
        self.chunks.extend(other.chunks);
        for buf in other.spare {
            self.recycle(buf);
        }
    }

    /// Hands up to `max` messages from the front to `take`, in order, removing each;
    /// stops after a message for which `take` returns `false` (that one is removed
    /// too). Returns how many were handed over.
    pub fn pop_with(
        &mut self,
        max: usize,
        mut take: impl FnMut(&MessageHeader, &[u8]) -> bool,
    ) -> usize {
        self.pop_raw_with(max, |rec| {
            let (header, payload) = rec.split_at(HEADER_SIZE);
            take(&bytemuck::pod_read_unaligned(header), payload)
        })
    }

    /// [`pop_with`](Self::pop_with), handing each message over as its record: the
    /// header's [`HEADER_SIZE`] bytes followed by the payload, in one slice (what a
    /// ring slot holds, so it can be copied there at once).
    pub fn pop_raw_with(&mut self, max: usize, mut take: impl FnMut(&[u8]) -> bool) -> usize {
        let mut n = 0;
        while n < max {
            let Some(c) = self.chunks.front_mut() else {
                break;
            };
            match c.pop(&mut take) {
                None => {
                    if let Some(c) = self.chunks.pop_front() {
                        self.recycle(c.buf);
                    }
                }
                Some(go_on) => {
                    self.len -= 1;
                    n += 1;
                    if !go_on {
                        break;
                    }
                }
            }
        }
        if self.chunks.front().is_some_and(|c| c.count == 0) {
            if let Some(c) = self.chunks.pop_front() {
                self.recycle(c.buf);
            }
        }
        n
    }

    /// Keeps an emptied chunk's buffer for reuse.
    fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < SPARE_CHUNKS && buf.capacity() <= 4 * CHUNK_BYTES {
            self.spare.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(type_id: u32, len: usize) -> MessageHeader {
        MessageHeader::new(type_id, len)
    }

    #[test]
    fn records_come_out_in_order_across_chunks() {
        let mut q = Records::default();
        let big = vec![9u8; 5000];
        let n = 2 * CHUNK_BYTES / record_bytes(big.len()) + 7;
        for i in 0..n {
            q.push(
                &header(i as u32, big.len() - i % 8),
                &big[..big.len() - i % 8],
            );
        }
        assert_eq!(q.len(), n);
        assert!(q.chunks.len() >= 3);
        let mut i = 0;
        let taken = q.pop_with(usize::MAX, |h, p| {
            assert_eq!(h.type_id, i as u32);
            assert_eq!(p.len(), big.len() - i % 8);
            i += 1;
            true
        });
        assert_eq!(taken, n);
        assert!(q.is_empty());
        // Emptied chunks are kept, so the next pushes allocate nothing.
        assert!(!q.spare.is_empty());
    }

    #[test]
    fn pop_stops_after_a_refusal_and_at_max() {
        let mut q = Records::default();
        for i in 0..10 {
            q.push(&header(i, 1), &[i as u8]);
        }
        assert_eq!(q.pop_with(3, |_, _| true), 3);
        assert_eq!(q.pop_with(usize::MAX, |h, _| h.type_id != 5), 3);
        let mut rest = Vec::new();
        q.pop_with(usize::MAX, |h, p| {
            rest.push((h.type_id, p[0]));
            true
        });
        assert_eq!(rest, (6..10).map(|i| (i, i as u8)).collect::<Vec<_>>());
    }

    #[test]
    fn appended_records_keep_their_order_and_count() {
        let mut q = Records::default();
        q.push(&header(1, 0), &[]);
        q.pop_with(1, |_, _| true);
        q.push(&header(1, 0), &[]);
        let mut b = q.builder(CHUNK_BYTES);
        assert!(q.spare.is_empty(), "the builder took the spare chunk");
        b.push(&header(2, 4), &[1, 2, 3, 4]);
        b.push(&header(3, 0), &[]);
        q.append(b);
        q.append(Records::default());
        q.push(&header(4, 2), &[5, 6]);
        assert_eq!(q.len(), 4);
        let mut ids = Vec::new();
        q.pop_with(usize::MAX, |h, _| {
            ids.push(h.type_id);
            true
        });
        assert_eq!(ids, vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_raw_record_is_the_header_then_the_payload() {
        let mut q = Records::default();
        let mut h = header(9, 5);
        h.message_id = 77;
        q.push(&h, b"hello");
        q.push(&header(10, 0), &[]);
        let mut recs = Vec::new();
        assert_eq!(
            q.pop_raw_with(usize::MAX, |r| {
                recs.push(r.to_vec());
                true
            }),
            2
        );
        assert_eq!(recs[0].len(), HEADER_SIZE + 5, "no padding");
        let back: MessageHeader = bytemuck::pod_read_unaligned(&recs[0][..HEADER_SIZE]);
        assert_eq!(back, h);
        assert_eq!(&recs[0][HEADER_SIZE..], b"hello");
        assert_eq!(recs[1].len(), HEADER_SIZE);
        assert!(q.is_empty());
    }

    #[test]
    fn a_record_larger_than_a_chunk_gets_room() {
        let mut q = Records::default();
        let huge = vec![3u8; CHUNK_BYTES + 100];
        q.push(&header(1, huge.len()), &huge);
        q.pop_with(1, |_, p| {
            assert_eq!(p, &huge[..]);
            true
        });
    }
}
