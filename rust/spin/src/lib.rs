//! Waiting for a descriptor without sleeping, for a few microseconds: shared by the host
//! extension (rust/pyext) and the worker (rust/worker).
//!
//! Why: this kind of VM halts an idle virtual CPU at once (its `haltpoll` cpuidle has no polling
//! window), so a process that blocks for a frame due within microseconds pays a wake-up of a
//! halted CPU when it comes (15-50 µs) and then runs cold. Between a host and its worker, back to
//! back, that is two wake-ups per frame. A side that polls for a short window instead is awake
//! when the frame lands.
//!
//! The trap (ENGINE_NOTES.md): a pipe's wake-up often puts the woken process on the waker's CPU,
//! and a spinner there starves the process it waits for. So a [`Spin::Yielding`] poll gives
//! the CPU away on each turn (`sched_yield`) and stops polling as soon as a yield took long:
//! another task ran on this CPU, maybe the very one that is to write, and sleeping is then the
//! fastest way to let it.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// How a poll spends its turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spin {
    /// A CPU hint between looks: for a thread whose peers are known to run elsewhere.
    Busy,
    /// `sched_yield` between looks, giving up on a CPU shared with a runnable task.
    Yielding,
}

/// A yield that took longer than this ran another task in between.
const SHARED_AFTER: Duration = Duration::from_micros(5);

/// Whether this process may run on more than one CPU: on one, polling only delays the process
/// it waits for.
pub fn several_cpus() -> bool {
    // SAFETY: `set` is a plain bit set that sched_getaffinity fills; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return false;
        }
        libc::CPU_COUNT(&set) > 1
    }
}

/// The CPU this thread runs on now (None where the kernel cannot tell).
pub fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments; it returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Polls `fd` for up to `window` without sleeping; true once it is readable (or in error, or at
/// its end: the caller's read reports which), false when the window ran out or, `Yielding`,
/// when this CPU turned out to be shared.
pub fn readable_soon(fd: RawFd, window: Duration, spin: Spin) -> bool {
    let end = Instant::now() + window;
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: one valid pollfd; a zero timeout never blocks.
        if unsafe { libc::poll(&mut pfd, 1, 0) } != 0 {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        match spin {
            Spin::Busy => std::hint::spin_loop(),
            Spin::Yielding => {
                // SAFETY: no arguments; it cannot fail on Linux.
                unsafe { libc::sched_yield() };
                if now.elapsed() > SHARED_AFTER {
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)] // (a test that cannot make a pipe has nothing to test)
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn an_empty_pipe_is_not_readable_and_the_window_bounds_the_poll() {
        let (r, _w) = std::io::pipe().expect("a pipe");
        for spin in [Spin::Busy, Spin::Yielding] {
            let started = Instant::now();
            assert!(!readable_soon(r.as_raw_fd(), Duration::from_micros(300), spin));
            // Never much past its window (a yield may end it sooner, never later).
            assert!(started.elapsed() < Duration::from_millis(50), "{spin:?}");
        }
    }

    #[test]
    fn a_written_byte_or_a_closed_writer_ends_the_poll() {
        let (r, mut w) = std::io::pipe().expect("a pipe");
        w.write_all(b"x").expect("writes");
        assert!(readable_soon(r.as_raw_fd(), Duration::from_secs(1), Spin::Yielding));
        assert!(readable_soon(r.as_raw_fd(), Duration::ZERO, Spin::Busy));
        let (r2, w2) = std::io::pipe().expect("a pipe");
        drop(w2);
        assert!(readable_soon(r2.as_raw_fd(), Duration::from_secs(1), Spin::Busy), "end of file is readable");
    }

    #[test]
    fn a_byte_written_by_another_thread_during_the_poll_is_seen() {
        let (r, mut w) = std::io::pipe().expect("a pipe");
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(200));
            w.write_all(b"x").expect("writes");
            w
        });
        // Busy: a yielding poll may stop early, on a CPU shared with the writer.
        assert!(readable_soon(r.as_raw_fd(), Duration::from_secs(5), Spin::Busy));
        drop(writer.join().expect("joins"));
    }
}
