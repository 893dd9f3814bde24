//! Length-prefixed frames read from a pipe: the one framing of the worker protocol (protocol.py's
//! `frame_reader`, `write_all`), shared by the worker (rust/worker: its stdin) and the host's
//! extension (rust/pyext: a worker's stdout).
//!
//! A frame is a 4-byte big-endian length, then the body. A length above the reader's cap is
//! refused before anything is allocated for the body. Reads ask for at least 64 KiB (more when the
//! frame being read says so, never past the cap) into one buffer kept for the pipe's life; a body
//! is read in place and consumed once its caller has used it.

use std::io;
use std::os::fd::RawFd;

/// Bytes one read asks for, at least.
const READ_BYTES: usize = 1 << 16;
/// A buffer that grew past this for a large frame is given back once that frame is consumed.
const KEPT_BYTES: usize = 1 << 20;

/// The frames buffered from one pipe.
pub struct FrameBuffer {
    buf: Vec<u8>,
    /// Where the bytes not yet consumed start in `buf`.
    start: usize,
    /// The largest body accepted.
    max: usize,
}

/// A length prefix above the cap (the size it announced): the writer is not speaking the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge(pub usize);

/// The header's length of the bytes at `buf`, if there are four of them.
fn header(buf: &[u8]) -> Option<usize> {
    buf.first_chunk::<4>().map(|head| u32::from_be_bytes(*head) as usize)
}

impl FrameBuffer {
    pub fn new(max: usize) -> FrameBuffer {
        FrameBuffer { buf: Vec::with_capacity(READ_BYTES), start: 0, max }
    }

    fn unread(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// The length (header included) of a whole frame at the head of the buffer, if one is there.
    pub fn poll(&self) -> Result<Option<usize>, TooLarge> {
        let unread = self.unread();
        let Some(size) = header(unread) else { return Ok(None) };
        if size > self.max {
            return Err(TooLarge(size));
        }
        Ok((unread.len() >= 4 + size).then_some(4 + size))
    }

    /// The body of the frame of length `len` that `poll` found.
    pub fn body(&self, len: usize) -> &[u8] {
        self.unread().get(4..len).unwrap_or_default()
    }

    /// Drops the frame of length `len` from the head of the buffer.
    pub fn consume(&mut self, len: usize) {
        self.start = self.start.saturating_add(len).min(self.buf.len());
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > KEPT_BYTES {
                self.buf = Vec::with_capacity(READ_BYTES);
            }
        }
    }

    /// One read into the buffer: `read(to, want)` writes at most `want` bytes at `to` and says how
    /// many (it owns the descriptor, and what an interrupted read does). False at end of file.
    pub fn fill<E>(&mut self, read: impl FnOnce(*mut u8, usize) -> Result<usize, E>) -> Result<bool, E> {
        let mut want = READ_BYTES;
        if let Some(size) = header(self.unread()) {
            want = want.max((4 + size).saturating_sub(self.unread().len()).min(self.max));
        }
        if self.start > 0 {
            // Keep the partial frame at the front: the buffer never grows past one frame and a read.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.reserve(want);
        let spare = self.buf.spare_capacity_mut();
        let got = read(spare.as_mut_ptr().cast(), want.min(spare.len()))?;
        // SAFETY: `read` wrote (initialised) `got` bytes, at most `want`, of the spare capacity.
        unsafe { self.buf.set_len(self.buf.len() + got.min(want)) };
        Ok(got > 0)
    }
}

/// One `read(2)` of `fd` into the `want` bytes at `to`.
///
/// # Safety
/// `to` must be valid for writes of `want` bytes.
pub unsafe fn read_into(fd: RawFd, to: *mut u8, want: usize) -> io::Result<usize> {
    // SAFETY: the caller's promise.
    let n = unsafe { libc::read(fd, to.cast(), want) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
#[allow(clippy::expect_used)] // (a frame under the cap that does not read is the failure)
mod tests {
    use super::*;

    /// Fills from `data`, `chunk` bytes a read.
    fn feed(frames: &mut FrameBuffer, data: &mut &[u8], chunk: usize) -> bool {
        frames
            .fill(|to, want| {
                let n = want.min(chunk).min(data.len());
                // SAFETY: `to` has room for `want` bytes, and n <= want.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, n) };
                *data = &data[n..];
                Ok::<usize, ()>(n)
            })
            .unwrap_or(false)
    }

    #[test]
    fn frames_cut_anywhere_read_back_whole_and_in_order() {
        let bodies: [&[u8]; 3] = [b"a", b"", &[7u8; 70_000]];
        let mut stream = Vec::new();
        for body in bodies {
            stream.extend_from_slice(&(body.len() as u32).to_be_bytes());
            stream.extend_from_slice(body);
        }
        for chunk in [1, 3, 4096, 1 << 20] {
            let (mut frames, mut data, mut got) = (FrameBuffer::new(1 << 20), &stream[..], Vec::new());
            loop {
                while let Some(len) = frames.poll().expect("under the cap") {
                    got.push(frames.body(len).to_vec());
                    frames.consume(len);
                }
                if !feed(&mut frames, &mut data, chunk) {
                    break;
                }
            }
            assert_eq!(got, bodies.map(<[u8]>::to_vec), "chunk {chunk}");
        }
    }

    #[test]
    fn a_length_over_the_cap_is_refused_from_its_header() {
        let mut frames = FrameBuffer::new(10);
        let mut data: &[u8] = &[0, 0, 0, 11];
        assert!(feed(&mut frames, &mut data, 4));
        assert_eq!(frames.poll(), Err(TooLarge(11)));
    }
}
