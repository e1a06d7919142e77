//! Messages held on the host as packed records (a 64-byte header, then the payload,
//! padded to 8 bytes) in reused byte chunks: the drain engine's waiting lanes and its
//! reply queue.
//!
//! A batch of messages of one type and size stamped as one block (a `send_batch`) is
//! kept as a *run*: one header, then the payloads ([`Records::push_run`]); each message's
//! header is rebuilt from the run's first when it is taken
//! ([`MessageHeader::nth_of_run`]), so the batch costs its payload bytes only.
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

use ringkernel_core::message::{MessageHeader, HEADER_SIZE, MESSAGE_MAGIC, MESSAGE_VERSION};
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

/// Marks a record holding a run (its header's `magic`; `version` holds the run's
/// length): never the magic of a message.
const RUN_MAGIC: u32 = u32::from_le_bytes(*b"RKRN");

/// Records in one byte buffer, read from the front.
#[derive(Debug, Default)]
struct Chunk {
    buf: Vec<u8>,
    read: usize,
    /// Messages in the chunk (a run counts each of its messages).
    count: usize,
    /// Messages of the run at `read` already taken.
    run_taken: usize,
    /// When the last record is a run that may grow: its offset and the header the
    /// next message must have to join it (see [`Records::push`]).
    open: Option<(usize, MessageHeader)>,
}

impl Chunk {
    /// An empty chunk reusing `buf`'s allocation.
    fn from_buffer(mut buf: Vec<u8>) -> Self {
        buf.clear();
        Chunk {
            buf,
            read: 0,
            count: 0,
            run_taken: 0,
            open: None,
        }
    }

    /// Appends `payload` to the open run when `header` is the one its next message
    /// has and the buffer has room; returns whether it did.
    #[inline]
    fn extend(&mut self, header: &MessageHeader, payload: &[u8]) -> bool {
        matches!(&self.open, Some((_, next)) if next == header) && self.extend_next(payload)
    }

    /// Appends `payload` to the open run as its next message (whose header the caller
    /// knows to be the run's next: not compared here) when it is of the run's size and
    /// the buffer has room; returns whether it did.
    #[inline]
    fn extend_next(&mut self, payload: &[u8]) -> bool {
        let Some((at, next)) = &mut self.open else {
            return false;
        };
        let stride = payload.len().next_multiple_of(8);
        if next.payload_len as usize != payload.len()
            || self.buf.capacity() - self.buf.len() < stride
        {
            return false;
        }
        let count_at = *at + std::mem::offset_of!(MessageHeader, version);
        let start = self.buf.len();
        // SAFETY: the buffer has room for `stride` more bytes after `start` (checked
        // above): a zero word at the end of the stride (the padding, under 8 bytes,
        // lies in it) and the payload's `len` bytes initialise every byte `set_len`
        // covers. The run's count lies in its header, inside the initialised part.
        unsafe {
            let dst = self.buf.as_mut_ptr().add(start);
            if stride > 0 {
                std::ptr::write_unaligned(dst.add(stride - 8).cast::<u64>(), 0);
            }
            std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, payload.len());
            self.buf.set_len(start + stride);
            let n = self.buf.as_mut_ptr().add(count_at).cast::<u32>();
            std::ptr::write_unaligned(n, std::ptr::read_unaligned(n) + 1);
        }
        *next = next.nth_of_run(1, payload.len());
        self.count += 1;
        true
    }

    /// How many payloads of `len` bytes a run appended now can hold without growing
    /// the buffer.
    fn run_room(&self, len: usize) -> usize {
        let free = self.buf.capacity() - self.buf.len();
        match free.checked_sub(HEADER_SIZE) {
            None => 0,
            Some(_) if len == 0 => usize::MAX,
            Some(rest) => rest / len.next_multiple_of(8),
        }
    }

    /// Appends a run of `payloads` (each `len` bytes, at least one) stamped from
    /// `first`; the buffer must have room (`run_room`).
    fn push_run<P: std::ops::Deref<Target = [u8]>>(
        &mut self,
        first: &MessageHeader,
        payloads: &[P],
        len: usize,
    ) {
        let stride = len.next_multiple_of(8);
        // SAFETY: `push_run_with` hands over room for `payloads.len()` strides; each
        // stride is initialised by a zero word at its end (the padding, under 8 bytes,
        // lies in it) and the payload's `len` bytes. Unaligned writes make no
        // alignment claim.
        unsafe {
            self.push_run_with(first, payloads.len(), len, |mut at| {
                for p in payloads {
                    debug_assert_eq!(p.len(), len);
                    if stride > 0 {
                        std::ptr::write_unaligned(at.add(stride - 8).cast::<u64>(), 0);
                    }
                    std::ptr::copy_nonoverlapping(p.as_ptr(), at, len);
                    at = at.add(stride);
                }
            });
        }
    }

    /// [`push_run`](Self::push_run) of the payloads of `len` bytes (not 0) back to back
    /// in `bytes`: one copy when `len` is a multiple of 8 (then they lie as the chunk
    /// keeps them).
    fn push_fixed(&mut self, first: &MessageHeader, bytes: &[u8], len: usize) {
        let n = bytes.len() / len;
        if !len.is_multiple_of(8) {
            self.push_run(first, &bytes.chunks_exact(len).collect::<Vec<_>>(), len);
            return;
        }
        // SAFETY: `push_run_with` hands over room for `n` strides of `len` bytes
        // (a multiple of 8): `bytes` initialises all of them.
        unsafe {
            self.push_run_with(first, n, len, |at| {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len());
            });
        }
    }

    /// Appends the header of a run of `n` payloads of `len` bytes stamped from `first`
    /// and calls `fill` with where the payloads go (`n` strides of `len` rounded up to
    /// 8 bytes). The buffer must have room (`run_room`).
    ///
    /// # Safety
    ///
    /// `fill` initialises every byte of the `n` strides (and writes nothing else).
    unsafe fn push_run_with(
        &mut self,
        first: &MessageHeader,
        n: usize,
        len: usize,
        fill: impl FnOnce(*mut u8),
    ) {
        let stride = len.next_multiple_of(8);
        let bytes = HEADER_SIZE + n * stride;
        debug_assert!(self.buf.capacity() - self.buf.len() >= bytes);
        let mut h = first.nth_of_run(0, len);
        h.magic = RUN_MAGIC;
        h.version = n as u32;
        let start = self.buf.len();
        // SAFETY: the buffer has room for `bytes` more bytes after `start` (checked by
        // the caller through `run_room`, asserted above in debug builds). The header
        // initialises the first 64 and `fill` the strides (the caller's promise):
        // together every byte `set_len` then covers. Unaligned writes make no
        // alignment claim.
        unsafe {
            let dst = self.buf.as_mut_ptr().add(start);
            std::ptr::write_unaligned(dst.cast::<MessageHeader>(), h);
            fill(dst.add(HEADER_SIZE));
            self.buf.set_len(start + bytes);
        }
        self.count += n;
        self.open = Some((start, first.nth_of_run(n as u64, len)));
    }

    /// Whether a record of `payload_len` bytes fits without growing the buffer.
    fn fits(&self, payload_len: usize) -> bool {
        self.buf.capacity() - self.buf.len() >= record_bytes(payload_len)
    }

    /// Appends a record (growing the buffer if it must).
    #[inline]
    fn push(&mut self, header: &MessageHeader, payload: &[u8]) {
        if header.is_valid() && payload.len() <= u32::MAX as usize {
            // A run of one, which the next message may join (`extend`).
            self.buf.reserve(record_bytes(payload.len()));
            self.push_run(header, &[payload], payload.len());
            return;
        }
        self.open = None;
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

    /// Hands the front message (its header, rebuilt when it is part of a run, and its
    /// payload) to `take` and drops it; `None` when the chunk is empty.
    #[inline]
    fn pop(&mut self, take: impl FnOnce(&MessageHeader, &[u8]) -> bool) -> Option<bool> {
        if self.count == 0 {
            return None;
        }
        let at = self.read;
        let header: MessageHeader = bytemuck::pod_read_unaligned(&self.buf[at..at + HEADER_SIZE]);
        let len = header.payload_len as usize;
        let go_on = if header.magic == RUN_MAGIC {
            let (n, k) = (header.version as usize, self.run_taken);
            let p = at + HEADER_SIZE + k * len.next_multiple_of(8);
            let mut h = header.nth_of_run(k as u64, len);
            (h.magic, h.version) = (MESSAGE_MAGIC, MESSAGE_VERSION);
            let go_on = take(&h, &self.buf[p..p + len]);
            if k + 1 == n {
                self.read += HEADER_SIZE + n * len.next_multiple_of(8);
                self.run_taken = 0;
                if self.open.is_some_and(|(o, _)| o == at) {
                    // Taken whole: nothing may join it any more.
                    self.open = None;
                }
            } else {
                self.run_taken = k + 1;
            }
            go_on
        } else {
            let go_on = take(&header, &self.buf[at + HEADER_SIZE..at + HEADER_SIZE + len]);
            self.read += record_bytes(len);
            go_on
        };
        self.count -= 1;
        Some(go_on)
    }
}

impl Chunk {
    /// Hands up to `max` (at least 1) messages from the front of the chunk to `take`
    /// as one piece: the first one's header, a byte slice holding the piece's payloads
    /// one after another at a stride of `payload_len` rounded up to 8, and their
    /// count (several only inside a run, whose headers follow from the first's by
    /// [`MessageHeader::nth_of_run`]). `take` returns how many it consumed (clamped to
    /// `1..=count`) and whether to go on. `None` when the chunk is empty.
    #[inline]
    fn pop_piece(
        &mut self,
        max: usize,
        take: &mut impl FnMut(&MessageHeader, &[u8], usize) -> (usize, bool),
    ) -> Option<(usize, bool)> {
        if self.count == 0 {
            return None;
        }
        let at = self.read;
        let header: MessageHeader = bytemuck::pod_read_unaligned(&self.buf[at..at + HEADER_SIZE]);
        let len = header.payload_len as usize;
        if header.magic != RUN_MAGIC {
            let (_, go_on) = take(
                &header,
                &self.buf[at + HEADER_SIZE..at + HEADER_SIZE + len],
                1,
            );
            self.read += record_bytes(len);
            self.count -= 1;
            return Some((1, go_on));
        }
        let (n, k) = (header.version as usize, self.run_taken);
        let stride = len.next_multiple_of(8);
        let count = (n - k).min(max.max(1));
        let p = at + HEADER_SIZE + k * stride;
        let mut h = header.nth_of_run(k as u64, len);
        (h.magic, h.version) = (MESSAGE_MAGIC, MESSAGE_VERSION);
        let (used, go_on) = take(&h, &self.buf[p..p + (count - 1) * stride + len], count);
        let used = used.clamp(1, count);
        if k + used == n {
            self.read += HEADER_SIZE + n * stride;
            self.run_taken = 0;
            if self.open.is_some_and(|(o, _)| o == at) {
                // Taken whole: nothing may join it any more.
                self.open = None;
            }
        } else {
            self.run_taken = k + used;
        }
        self.count -= used;
        Some((used, go_on && used == count))
    }
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

    /// Appends a message (`header.payload_len` must be `payload.len()`). A valid
    /// message whose header is the next of the run before it
    /// ([`MessageHeader::nth_of_run`]: the same fields, ids and timestamp one further,
    /// the same payload size) joins that run: only its payload is stored.
    #[inline]
    pub fn push(&mut self, header: &MessageHeader, payload: &[u8]) {
        debug_assert_eq!(header.payload_len as usize, payload.len());
        if self
            .chunks
            .back_mut()
            .is_some_and(|c| c.extend(header, payload))
        {
            self.len += 1;
            return;
        }
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

    /// Appends the next message of the last one appended
    /// ([`MessageHeader::nth_of_run`]`(1, _)` of its header), of the same payload size,
    /// without building its header or comparing one: for a caller that knows the
    /// message is that one. Returns whether it did; when not (the last one started no
    /// run that can grow here, or the size differs), [`push`](Self::push) it. Debug
    /// builds check the caller's claim against `header()`; release builds never call it.
    #[inline]
    pub fn push_next(&mut self, payload: &[u8], header: impl FnOnce() -> MessageHeader) -> bool {
        let Some(c) = self.chunks.back_mut() else {
            return false;
        };
        #[cfg(debug_assertions)]
        if let Some((_, next)) = &c.open {
            assert_eq!(
                *next,
                header(),
                "push_next: not the next message of the run"
            );
        }
        #[cfg(not(debug_assertions))]
        let _ = header;
        if c.extend_next(payload) {
            self.len += 1;
            return true;
        }
        false
    }

    /// Appends the messages `first.nth_of_run(i, payloads[i].len())` with the payloads
    /// `payloads[i]`, in order ([`MessageHeader::nth_of_run`]): consecutive payloads of
    /// one size are kept as runs, one header each, and taken one message at a time as
    /// from [`push`](Self::push). (A message that needs a header of its own, e.g. a
    /// checksum, goes through `push`.)
    pub fn push_run<P: std::ops::Deref<Target = [u8]>>(
        &mut self,
        first: &MessageHeader,
        payloads: &[P],
    ) {
        let mut done = 0;
        while done < payloads.len() {
            let len = payloads[done].len();
            let same = payloads[done..]
                .iter()
                .take_while(|p| p.len() == len)
                .count();
            let n = same.min(self.run_room(len));
            let at = first.nth_of_run(done as u64, len);
            if let Some(c) = self.chunks.back_mut() {
                c.push_run(&at, &payloads[done..done + n], len);
            }
            self.len += n;
            done += n;
        }
    }

    /// [`push_run`](Self::push_run) for payloads of `len` bytes each (not 0), back to
    /// back in `bytes`: a whole piece is one copy when `len` is a multiple of 8 (the
    /// stride the chunks keep).
    pub fn push_fixed_run(&mut self, first: &MessageHeader, bytes: &[u8], len: usize) {
        let count = bytes.len() / len;
        let mut done = 0;
        while done < count {
            let n = self.run_room(len).min(count - done);
            let at = first.nth_of_run(done as u64, len);
            if let Some(c) = self.chunks.back_mut() {
                c.push_fixed(&at, &bytes[done * len..(done + n) * len], len);
            }
            self.len += n;
            done += n;
        }
    }

    /// Room for payloads of `len` bytes in the last chunk, after adding a chunk
    /// where it has none (so at least 1).
    fn run_room(&mut self, len: usize) -> usize {
        let room = self.chunks.back().map_or(0, |c| c.run_room(len));
        if room > 0 {
            return room;
        }
        let need = HEADER_SIZE + len.next_multiple_of(8);
        let buf = self
            .spare
            .pop()
            .filter(|b| b.capacity() >= need)
            .unwrap_or_else(|| Vec::with_capacity(need.max(CHUNK_BYTES)));
        self.chunks.push_back(Chunk::from_buffer(buf));
        self.chunks.back().map_or(0, |c| c.run_room(len))
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

    /// As [`pop_with`](Self::pop_with), a piece at a time: `take(first, payloads,
    /// count)` gets up to `count` messages at once where they form a run (`first` is
    /// the first one's header, message `i` of the piece has the header
    /// [`first.nth_of_run(i, len)`](MessageHeader::nth_of_run) and the payload
    /// [`run_payload(payloads, len, i)`](ringkernel_core::runtime::run_payload),
    /// `len = first.payload_len`), else one. It returns how many of them it consumed (at least
    /// one: those are removed) and whether to go on; fewer than `count` ends the call.
    /// Returns how many messages were consumed in all (at most `max`).
    pub fn pop_runs_with(
        &mut self,
        max: usize,
        mut take: impl FnMut(&MessageHeader, &[u8], usize) -> (usize, bool),
    ) -> usize {
        let mut n = 0;
        while n < max {
            let Some(c) = self.chunks.front_mut() else {
                break;
            };
            match c.pop_piece(max - n, &mut take) {
                None => {
                    if let Some(c) = self.chunks.pop_front() {
                        self.recycle(c.buf);
                    }
                }
                Some((used, go_on)) => {
                    self.len -= used;
                    n += used;
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

    /// Every message of `q`, header and payload.
    fn take_all(q: &mut Records) -> Vec<(MessageHeader, Vec<u8>)> {
        let mut out = Vec::new();
        q.pop_with(usize::MAX, |h, p| {
            out.push((*h, p.to_vec()));
            true
        });
        out
    }

    /// A queue of one record (type 1), a run of `n` messages stamped from the returned
    /// header (payload `i` of `size(i, n)` bytes, enough of them to span several
    /// chunks) and one more record (type 2); the run's payloads.
    fn run_between_singles(
        size: impl Fn(usize, usize) -> usize,
    ) -> (Records, MessageHeader, Vec<Vec<u8>>) {
        let mut q = Records::default();
        q.push(&header(1, 2), &[1, 2]);
        let mut first = header(5, 0);
        (first.message_id, first.correlation_id, first.timestamp) = (100, 100, 9000);
        let n = 2 * CHUNK_BYTES / 48 + 11;
        let payloads: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; size(i, n)]).collect();
        q.push_run(&first, &payloads);
        q.push(&header(2, 1), &[7]);
        (q, first, payloads)
    }

    #[test]
    fn a_fixed_run_comes_out_as_push_run_puts_it() {
        // Lengths a multiple of 8 (one copy a piece) and not (a stride with padding),
        // runs long enough to span several chunks, behind a waiting record.
        for len in [72usize, 8, 13, 1] {
            let n = 2 * CHUNK_BYTES / len.next_multiple_of(8) + 7;
            let bytes: Vec<u8> = (0..n * len).map(|i| (i * 7 + len) as u8).collect();
            let list: Vec<&[u8]> = bytes.chunks_exact(len).collect();
            let mut first = header(5, len);
            (first.message_id, first.correlation_id, first.timestamp) = (100, 100, 9000);
            let (mut a, mut b) = (Records::default(), Records::default());
            for q in [&mut a, &mut b] {
                q.push(&header(1, 2), &[1, 2]);
            }
            a.push_run(&first, &list);
            b.push_fixed_run(&first, &bytes, len);
            for q in [&mut a, &mut b] {
                q.push(&header(2, 1), &[7]);
            }
            assert_eq!(b.len(), n + 2, "len {len}");
            assert!(b.chunks.len() >= 3, "len {len}: {} chunks", b.chunks.len());
            let (a, b) = (take_all(&mut a), take_all(&mut b));
            assert_eq!(a, b, "len {len}");
            assert_eq!(b[1].0, first.nth_of_run(0, len));
            assert_eq!(b[n].0, first.nth_of_run(n as u64 - 1, len));
            assert_eq!(b[n].1, &bytes[(n - 1) * len..]);
        }
    }

    #[test]
    fn a_run_comes_out_as_its_messages_across_chunks_and_partial_pops() {
        // Payloads of 3 sizes (0, 13 and 40 bytes).
        let (mut q, first, payloads) = run_between_singles(|i, _| [13, 13, 40, 0][i % 4]);
        let n = payloads.len();
        assert_eq!(q.len(), n + 2);
        assert!(q.chunks.len() >= 3);
        // Taken in pieces that end inside runs.
        let mut got = Vec::new();
        while !q.is_empty() {
            let before = got.len();
            q.pop_with(7, |h, p| {
                got.push((*h, p.to_vec()));
                true
            });
            assert!(got.len() - before <= 7);
        }
        assert_eq!(got.len(), n + 2);
        assert_eq!((got[0].0.type_id, &got[0].1[..]), (1, &[1u8, 2][..]));
        for (i, (h, p)) in got[1..=n].iter().enumerate() {
            assert_eq!(
                *h,
                first.nth_of_run(i as u64, payloads[i].len()),
                "header {i}"
            );
            assert!(h.is_valid());
            assert_eq!(&p[..], payloads[i], "payload {i}");
        }
        assert_eq!((got[n + 1].0.type_id, &got[n + 1].1[..]), (2, &[7u8][..]));
    }

    /// `pop_runs_with` hands a run over in pieces (bounded by `max` and by how many
    /// `take` consumes) and every other record alone; together the pieces give the
    /// same messages, in the same order, as `pop_with` would.
    #[test]
    fn runs_come_out_in_pieces_that_match_pop_with() {
        // Sizes 13 (stride 16), then 40.
        let build = || run_between_singles(|i, n| if i < n / 2 { 13 } else { 40 }).0;
        let expected = take_all(&mut build());
        let mut q = build();
        let mut got = Vec::new();
        let mut calls = 0;
        while !q.is_empty() {
            calls += 1;
            let before = got.len();
            let taken = q.pop_runs_with(100, |first, payloads, count| {
                assert!(count >= 1);
                let len = first.payload_len as usize;
                let stride = len.next_multiple_of(8);
                // Every fifth call takes only part of its piece and stops.
                let used = if calls % 5 == 0 {
                    count.div_ceil(2)
                } else {
                    count
                };
                for i in 0..used {
                    let h = first.nth_of_run(i as u64, len);
                    got.push((h, payloads[i * stride..i * stride + len].to_vec()));
                }
                (used, true)
            });
            assert_eq!(taken, got.len() - before);
            assert!((1..=100).contains(&taken));
        }
        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "message {i}");
        }
        // A piece is a run's messages at once: far fewer calls than messages.
        assert!(calls < expected.len() / 50, "{calls} calls");
        // `false` stops after what was consumed.
        let mut q = build();
        assert_eq!(q.pop_runs_with(usize::MAX, |_, _, _| (1, false)), 1);
        let mut piece = 0;
        let taken = q.pop_runs_with(usize::MAX, |_, _, c| {
            piece = c;
            (c, false)
        });
        assert!(
            piece > 1 && taken == piece,
            "one piece of a run: {taken} of {piece}"
        );
        assert_eq!(q.len(), expected.len() - 1 - piece);
        let next = take_all(&mut q);
        assert_eq!(next[0], expected[1 + piece]);
    }

    #[test]
    fn consecutive_pushes_join_one_run_and_others_do_not() {
        let mut q = Records::default();
        let mut first = header(4, 12);
        (first.message_id, first.correlation_id, first.timestamp) = (10, 10, 500);
        for i in 0..100u64 {
            q.push(&first.nth_of_run(i, 12), &[i as u8; 12]);
        }
        // One header, then 100 payloads padded to 16.
        assert_eq!(q.chunks[0].buf.len(), HEADER_SIZE + 100 * 16);
        // Not the next of the run: another id step, another size, an invalid header.
        q.push(&first.nth_of_run(101, 12), &[1; 12]);
        q.push(&first.nth_of_run(102, 4), &[2; 4]);
        let mut bad = first.nth_of_run(103, 4);
        bad.magic = 0;
        q.push(&bad, &[3; 4]);
        q.push(&first.nth_of_run(104, 4), &[4; 4]);
        assert_eq!(q.len(), 104);
        // The run taken in part, the rest comes out in order.
        assert_eq!(q.pop_with(50, |_, _| true), 50);
        let got = take_all(&mut q);
        assert_eq!(got.len(), 54);
        for (j, (h, p)) in got[..50].iter().enumerate() {
            let i = 50 + j as u64;
            assert_eq!(*h, first.nth_of_run(i, 12));
            assert_eq!(p, &vec![i as u8; 12]);
        }
        assert_eq!(got[50].0, first.nth_of_run(101, 12));
        assert_eq!(got[51].0, first.nth_of_run(102, 4));
        assert_eq!(
            (got[52].0, &got[52].1[..]),
            (bad, &[3u8; 4][..]),
            "kept as it was"
        );
        assert_eq!(got[53].0, first.nth_of_run(104, 4));
        q.push(&first.nth_of_run(105, 4), &[5; 4]);
        assert_eq!(
            take_all(&mut q),
            vec![(first.nth_of_run(105, 4), vec![5; 4])]
        );
    }

    #[test]
    fn a_refusal_inside_a_run_keeps_the_rest() {
        let mut q = Records::default();
        let first = header(3, 8);
        let payloads: Vec<[u8; 8]> = (0..10u8).map(|i| [i; 8]).collect();
        let payloads: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
        q.push_run(&first, &payloads);
        assert_eq!(q.pop_with(usize::MAX, |_, p| p[0] != 3), 4);
        let rest = take_all(&mut q);
        assert_eq!(rest.len(), 6);
        assert_eq!(rest[0].1, vec![4u8; 8]);
        assert_eq!(rest[0].0.message_id, first.message_id + 4);
        // An empty run adds nothing.
        q.push_run::<&[u8]>(&first, &[]);
        assert!(q.is_empty() && take_all(&mut q).is_empty());
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
