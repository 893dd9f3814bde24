//! Frames on the worker's pipes: length-prefixed reads that survive short reads, whole writes.
//!
//! The same framing as `FrameReader` and `write_all` in protocol.py: a 4-byte big-endian length,
//! refused above [`MAX_FRAME_BYTES`] before anything is allocated for the body; reads of at
//! least 64 KiB (more when the frame being read says so, never past the cap).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::protocol::MAX_FRAME_BYTES;

/// Bytes one `read` asks for, at least.
const READ_BYTES: usize = 1 << 16;

/// Why reading frames stopped for good (end of file is not an error: `Ok(None)`).
#[derive(Debug)]
pub enum ReadError {
    /// A length prefix above the cap: the host is not speaking the protocol.
    TooLarge(usize),
    Io(io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::TooLarge(size) => write!(f, "frame of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte cap"),
            ReadError::Io(e) => write!(f, "read failed: {e}"),
        }
    }
}

/// Buffers reads from one descriptor and cuts them into frames. The buffer is reused from
/// frame to frame: a frame's body is read in place and consumed after it is decoded.
pub struct FrameReader {
    fd: RawFd,
    buf: Vec<u8>,
    /// Where the unread bytes start in `buf`.
    start: usize,
}

/// The header's length of the bytes buffered at `buf`, if there are four of them.
fn header(buf: &[u8]) -> Option<usize> {
    let head: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(head) as usize)
}

impl FrameReader {
    pub fn new(fd: RawFd) -> FrameReader {
        FrameReader { fd, buf: Vec::with_capacity(READ_BYTES), start: 0 }
    }

    fn unread(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// The length (header included) of a whole frame at the head of the buffer, if one is there.
    pub fn poll(&self) -> Result<Option<usize>, ReadError> {
        let unread = self.unread();
        let Some(size) = header(unread) else { return Ok(None) };
        if size > MAX_FRAME_BYTES {
            return Err(ReadError::TooLarge(size));
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
        }
    }

    /// One `read`; false at end of file.
    fn fill(&mut self) -> Result<bool, ReadError> {
        let unread = self.unread().len();
        let mut want = READ_BYTES;
        if let Some(size) = header(self.unread()) {
            want = want.max((4 + size).saturating_sub(unread).min(MAX_FRAME_BYTES));
        }
        if self.start > 0 {
            // Keep the partial frame at the front: the buffer never grows past one frame and a read.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.reserve(want);
        let spare = self.buf.spare_capacity_mut();
        loop {
            // SAFETY: `spare` is writable, uninitialised memory of at least `want` bytes owned
            // by `buf`; `read` writes at most `want` bytes into it, and only the `n` bytes it
            // reports written are then counted as initialised.
            let n = unsafe { libc::read(self.fd, spare.as_mut_ptr().cast(), want.min(spare.len())) };
            if n >= 0 {
                let n = n as usize;
                // SAFETY: `read` initialised these `n` bytes of the spare capacity.
                unsafe { self.buf.set_len(self.buf.len() + n) };
                return Ok(n > 0);
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(ReadError::Io(error));
            }
        }
    }

    /// The length of the next whole frame, blocking until it is buffered; None at end of file.
    pub fn read_blocking(&mut self) -> Result<Option<usize>, ReadError> {
        loop {
            if let Some(len) = self.poll()? {
                return Ok(Some(len));
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }
}

/// Writes every byte (pipes accept partial writes of large frames).
pub fn write_all(fd: RawFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a live, initialised slice; `write` reads at most its length.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        data = data.get(n as usize..).unwrap_or_default();
    }
    Ok(())
}

/// Whether `fd` becomes readable (or reaches its end) within `timeout`.
pub fn readable_within(fd: RawFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    loop {
        // SAFETY: one valid pollfd and a valid timespec; no signal mask is passed.
        let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if n >= 0 {
            return n > 0;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            // The blocking read that follows reports what is wrong with the descriptor.
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn frames_cut_into_short_writes_read_back_whole() {
        let (r, w) = std::io::pipe().expect("a pipe");
        let frames: Vec<Vec<u8>> = vec![b"abc".to_vec(), vec![7u8; 200_000], Vec::new()];
        let stream: Vec<u8> =
            frames.iter().flat_map(|f| (f.len() as u32).to_be_bytes().into_iter().chain(f.iter().copied())).collect();
        let writer = std::thread::spawn(move || {
            for chunk in stream.chunks(333) {
                write_all(w.as_raw_fd(), chunk).expect("writes");
            }
            drop(w);
        });
        let mut reader = FrameReader::new(r.as_raw_fd());
        for frame in &frames {
            let len = reader.read_blocking().expect("reads").expect("a frame");
            assert_eq!(reader.body(len), &frame[..]);
            reader.consume(len);
        }
        assert!(reader.read_blocking().expect("reads").is_none());
        writer.join().expect("joins");
    }

    #[test]
    fn a_length_over_the_cap_is_refused_before_the_body() {
        let (r, w) = std::io::pipe().expect("a pipe");
        write_all(w.as_raw_fd(), &((MAX_FRAME_BYTES + 1) as u32).to_be_bytes()).expect("writes");
        let mut reader = FrameReader::new(r.as_raw_fd());
        assert!(matches!(reader.read_blocking(), Err(ReadError::TooLarge(n)) if n == MAX_FRAME_BYTES + 1));
    }
}
