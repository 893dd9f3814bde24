//! Reading a worker's frames: length-prefixed bodies (a 4-byte big-endian length, then the
//! body) read from its pipe into one buffer kept for the pipe's life. `protocol.frame_reader`
//! makes one for `workers.FrameSource`; a read hands back every whole body it completes, so a
//! report costs the host one call and one `read(2)`.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Bytes asked of one `read(2)` when no longer frame is pending.
const CHUNK: usize = 1 << 16;
/// A buffer that grew past this for a large frame is given back once it has been read.
const KEPT_BYTES: usize = 1 << 20;

#[pyclass(module = "codemode._engine")]
pub struct FrameReader {
    fd: i32,
    max: usize,
    buf: Vec<u8>,
    /// Where the bytes not yet handed out start in `buf`.
    start: usize,
}

/// Why a frame is refused: its header announces more than the cap.
struct Oversized(usize);

impl FrameReader {
    /// The body of the next whole frame in the buffer (consumed), if there is one.
    fn next_body(&mut self) -> Result<Option<(usize, usize)>, Oversized> {
        let unread = &self.buf[self.start..];
        let Some(header) = unread.first_chunk::<4>() else {
            return Ok(None);
        };
        let size = u32::from_be_bytes(*header) as usize;
        if size > self.max {
            return Err(Oversized(size));
        }
        if unread.len() < 4 + size {
            return Ok(None);
        }
        let body = (self.start + 4, self.start + 4 + size);
        self.start = body.1;
        Ok(Some(body))
    }

    /// One `read(2)` into the buffer (the GIL released): what is left of a pending frame, at
    /// least a chunk. False at end of file.
    fn fill(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.buf.drain(..self.start);
        self.start = 0;
        if self.buf.is_empty() && self.buf.capacity() > KEPT_BYTES {
            self.buf = Vec::new();
        }
        let pending = match self.buf.first_chunk::<4>() {
            Some(header) => (4 + u32::from_be_bytes(*header) as usize).saturating_sub(self.buf.len()).min(self.max),
            None => 0,
        };
        let want = pending.max(CHUNK);
        self.buf.reserve(want);
        let (fd, spare) = (self.fd, self.buf.spare_capacity_mut().as_mut_ptr() as usize);
        let got = loop {
            let read = py.detach(|| {
                // SAFETY: `spare` is the start of `want` bytes of this buffer's spare capacity,
                // which nothing else touches while the GIL is released (the reader is borrowed
                // mutably for this call).
                let n = unsafe { libc::read(fd, spare as *mut libc::c_void, want) };
                usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
            });
            match read {
                Ok(n) => break n,
                // A signal: its Python handler runs (and may raise), as `os.read` does.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => py.check_signals()?,
                Err(e) => return Err(e.into()),
            }
        };
        // SAFETY: `read` initialized `got` bytes of the spare capacity.
        unsafe { self.buf.set_len(self.buf.len() + got) };
        Ok(got > 0)
    }
}

/// `ProtocolError` (codemode.errors) for a frame over the cap.
fn oversized(py: Python<'_>, Oversized(size): Oversized, max: usize) -> PyErr {
    let message = format!("frame of {size} bytes exceeds the {max}-byte cap");
    match py.import("codemode.errors").and_then(|m| m.getattr("ProtocolError")?.call1((message,))) {
        Ok(error) => PyErr::from_value(error),
        Err(e) => e,
    }
}

#[pymethods]
impl FrameReader {
    #[new]
    fn new(fd: i32, max_bytes: usize) -> Self {
        FrameReader { fd, max: max_bytes, buf: Vec::with_capacity(CHUNK), start: 0 }
    }

    /// One read (the caller knows the pipe is readable, or accepts blocking), then the body of
    /// every whole frame buffered; None at end of file. A frame over the cap is a
    /// `ProtocolError`; `OSError` if the read fails.
    fn read<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Vec<Bound<'py, PyBytes>>>> {
        if !self.fill(py)? {
            return Ok(None);
        }
        let mut bodies = Vec::new();
        loop {
            match self.next_body() {
                Ok(Some((from, to))) => bodies.push(PyBytes::new(py, &self.buf[from..to])),
                Ok(None) => return Ok(Some(bodies)),
                Err(e) => return Err(oversized(py, e, self.max)),
            }
        }
    }

    /// The next frame's body, blocking; None at end of file.
    fn read_blocking<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        loop {
            match self.next_body() {
                Ok(Some((from, to))) => return Ok(Some(PyBytes::new(py, &self.buf[from..to]))),
                Ok(None) => {}
                Err(e) => return Err(oversized(py, e, self.max)),
            }
            if !self.fill(py)? {
                return Ok(None);
            }
        }
    }
}
