//! Frames on the worker's pipes: length-prefixed reads of stdin (`codemode_frames`, the framing
//! the host's extension reads with too), whole writes.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use codemode_frames::{read_into, FrameBuffer, TooLarge};

use crate::protocol::MAX_FRAME_BYTES;

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

impl From<TooLarge> for ReadError {
    fn from(TooLarge(size): TooLarge) -> Self {
        ReadError::TooLarge(size)
    }
}

/// Frames read from one descriptor (up to `MAX_FRAME_BYTES` each), the buffer reused from frame
/// to frame: a frame's body is read in place and consumed after it is decoded.
pub struct FrameReader {
    fd: RawFd,
    frames: FrameBuffer,
}

impl FrameReader {
    pub fn new(fd: RawFd) -> FrameReader {
        FrameReader { fd, frames: FrameBuffer::new(MAX_FRAME_BYTES) }
    }

    /// The length (header included) of a whole frame at the head of the buffer, if one is there.
    pub fn poll(&self) -> Result<Option<usize>, ReadError> {
        Ok(self.frames.poll()?)
    }

    /// The body of the frame of length `len` that `poll` found.
    pub fn body(&self, len: usize) -> &[u8] {
        self.frames.body(len)
    }

    /// Drops the frame of length `len` from the head of the buffer.
    pub fn consume(&mut self, len: usize) {
        self.frames.consume(len);
    }

    /// One `read` (retried when a signal interrupts it); false at end of file.
    fn fill(&mut self) -> Result<bool, ReadError> {
        let fd = self.fd;
        self.frames
            .fill(|to, want| loop {
                // SAFETY: `fill` hands `want` writable bytes at `to`.
                match unsafe { read_into(fd, to, want) } {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    read => return read,
                }
            })
            .map_err(ReadError::Io)
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

/// Whether `fd` becomes readable (or reaches its end) within `timeout` (a signal that
/// interrupts the wait leaves it waiting for what is left).
pub fn readable_within(fd: RawFd, timeout: Duration) -> bool {
    let end = Instant::now().checked_add(timeout);
    loop {
        match codemode_spin::readable_by(fd, end) {
            Ok(readable) => return readable,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // The blocking read that follows reports what is wrong with the descriptor.
            Err(_) => return true,
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
