//! Reading a worker's frames (`codemode_frames`, the framing the worker reads its stdin with):
//! `protocol.frame_reader` makes one for `workers.FrameSource`; a read hands back every whole
//! body it completes, so a report costs the host one call and one `read(2)`.

use codemode_frames::{read_into, FrameBuffer, TooLarge};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

#[pyclass(module = "codemode._engine")]
pub struct FrameReader {
    fd: i32,
    max: usize,
    frames: FrameBuffer,
}

impl FrameReader {
    /// One `read(2)` into the buffer, the GIL released; false at end of file. A signal that
    /// interrupts it runs its Python handler (which may raise) before it reads again, as
    /// `os.read` does.
    fn fill(&mut self, py: Python<'_>) -> PyResult<bool> {
        let fd = self.fd;
        self.frames.fill(|to, want| {
            let to = to as usize; // (a pointer is not `Send`: the buffer is borrowed mutably meanwhile)
            loop {
                // SAFETY: `fill` hands `want` writable bytes at `to`, which nothing else touches
                // while the GIL is released.
                match py.detach(|| unsafe { read_into(fd, to as *mut u8, want) }) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => py.check_signals()?,
                    Err(e) => return Err(e.into()),
                }
            }
        })
    }

    /// The next whole frame's body (consumed), if one is buffered.
    fn next<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        match self.frames.poll() {
            Ok(Some(len)) => {
                let body = PyBytes::new(py, self.frames.body(len));
                self.frames.consume(len);
                Ok(Some(body))
            }
            Ok(None) => Ok(None),
            Err(TooLarge(size)) => Err(oversized(py, size, self.max)),
        }
    }
}

/// `ProtocolError` (codemode.errors) for a frame over the cap.
fn oversized(py: Python<'_>, size: usize, max: usize) -> PyErr {
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
        FrameReader { fd, max: max_bytes, frames: FrameBuffer::new(max_bytes) }
    }

    /// One read (the caller knows the pipe is readable, or accepts blocking), then the body of
    /// every whole frame buffered; None at end of file. A frame over the cap is a
    /// `ProtocolError`; `OSError` if the read fails.
    fn read<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Vec<Bound<'py, PyBytes>>>> {
        if !self.fill(py)? {
            return Ok(None);
        }
        let mut bodies = Vec::new();
        while let Some(body) = self.next(py)? {
            bodies.push(body);
        }
        Ok(Some(bodies))
    }

    /// The next frame's body, blocking; None at end of file.
    fn read_blocking<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        loop {
            if let Some(body) = self.next(py)? {
                return Ok(Some(body));
            }
            if !self.fill(py)? {
                return Ok(None);
            }
        }
    }
}
