//! Reading a worker's frames (`codemode_frames`, the framing the worker reads its stdin with):
//! `protocol.frame_reader` makes one for `workers.FrameSource`; a wait for the pipe and one
//! `read(2)` hand back every whole body they complete, so a report costs the host one call and
//! one release of the GIL.

use std::io;
use std::time::{Duration, Instant};

use codemode_frames::{read_into, FrameBuffer, TooLarge};
use codemode_spin::{readable_by, readable_soon, Spin};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::seconds;

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

    /// Waits up to `timeout` seconds for the pipe, polling it first for up to `spin` seconds
    /// (yielding: `codemode_spin`), then reads once, the GIL released once for all of it:
    /// `(False, None)` if nothing came; else `(True, bodies)` as `read` gives them (None at end
    /// of file). A signal that interrupts the wait or the read runs its Python handler (which
    /// may raise) before it waits again for what is left of `timeout`, as `select.poll` does.
    fn read_within<'py>(
        &mut self,
        py: Python<'py>,
        timeout: f64,
        spin: f64,
    ) -> PyResult<(bool, Option<Vec<Bound<'py, PyBytes>>>)> {
        let fd = self.fd;
        let end = Instant::now().checked_add(seconds(timeout));
        let mut spin = seconds(spin).min(seconds(timeout)).min(Duration::from_secs(1));
        let filled = self.frames.fill(|to, want| {
            let to = to as usize; // (as in `fill`)
            loop {
                let waited = py.detach(|| {
                    let soon = !spin.is_zero() && readable_soon(fd, spin, Spin::Yielding);
                    if !soon && !readable_by(fd, end)? {
                        return Ok(None);
                    }
                    // SAFETY: as in `fill`.
                    unsafe { read_into(fd, to as *mut u8, want) }.map(Some)
                });
                spin = Duration::ZERO;
                match waited {
                    Ok(Some(got)) => return Ok(got),
                    Ok(None) => return Err(None),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => py.check_signals().map_err(Some)?,
                    Err(e) => return Err(Some(PyErr::from(e))),
                }
            }
        });
        match filled {
            Ok(true) => {
                let mut bodies = Vec::new();
                while let Some(body) = self.next(py)? {
                    bodies.push(body);
                }
                Ok((true, Some(bodies)))
            }
            Ok(false) => Ok((true, None)),
            Err(None) => Ok((false, None)),
            Err(Some(e)) => Err(e),
        }
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
