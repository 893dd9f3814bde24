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
//! the CPU away on each turn (`sched_yield`) and stops polling once two of its yields let
//! another task run (took long, and this thread was switched out meanwhile): another task runs
//! on this CPU, maybe the very one that is to write, and sleeping is then the fastest way to let
//! it. (One such yield may be a kernel thread's brief turn; a long yield in which no task ran is
//! the VM's timer tick, not a shared CPU.)

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// How a poll spends its turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spin {
    /// A CPU hint between looks: for a thread whose peers are known to run elsewhere.
    Busy,
    /// `sched_yield` between looks, giving up on a CPU shared with a runnable task.
    Yielding,
    /// As `Yielding`, but on a CPU found shared it first moves once to another CPU it may use
    /// (if any), keeps off the one it left (`away`) and polls on there: for a worker that a
    /// pipe's wake-up put on its host's CPU, where the two would otherwise take turns on one
    /// CPU, each running cold after the other, while the next idles (back to back after a
    /// pause: ~120 µs a cell instead of ~60; after an idle gap, woken on a CPU of its own: a
    /// trivial cell ~145 -> ~130 µs, 10 tool calls ~1.1 -> ~0.7 ms). A thread that then sleeps
    /// for a while should `come_back` first.
    Moving,
}

/// A yield that took longer than this may have run another task in between: it did if this
/// thread was switched out meanwhile (`switches`). On this kind of VM a yield with no other task
/// also takes this long ~1.3 times per ms of polling (median ~10 µs: the timer tick's exit to
/// the hypervisor), so its length alone would find a lone poller's CPU shared in one window in
/// ~15 (the host's 200 µs, once in ~30; the worker's 300 µs, once in ~15).
const SHARED_AFTER: Duration = Duration::from_micros(5);

/// How many times this thread has been switched out while runnable (`ru_nivcsw`): a yield that
/// let another task run is one, a timer tick or the hypervisor's own turn is not. None where
/// the kernel cannot tell (a long yield then counts as shared, as its length alone said).
fn switches() -> Option<libc::c_long> {
    // SAFETY: a plain struct the kernel fills; RUSAGE_THREAD is this thread.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        (libc::getrusage(libc::RUSAGE_THREAD, &mut usage) == 0).then_some(usage.ru_nivcsw)
    }
}

/// The CPUs this thread keeps off (`move_off_this_cpu`): the set it narrowed itself to, and the
/// CPU it left out.
static AWAY: std::sync::Mutex<Option<(libc::cpu_set_t, usize)>> = std::sync::Mutex::new(None);

const SET_SIZE: usize = std::mem::size_of::<libc::cpu_set_t>();

/// The CPUs this thread may use now, and those it was given (the first without the one it
/// keeps off while its own narrowing stands; a set given since replaces it).
fn cpu_sets() -> Option<(libc::cpu_set_t, libc::cpu_set_t)> {
    // SAFETY: a plain bit set that sched_getaffinity fills; pid 0 is this thread.
    unsafe {
        let mut now: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, SET_SIZE, &mut now) != 0 {
            return None;
        }
        let mut given = now;
        if let Some((ours, left_out)) = *AWAY.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            if libc::CPU_EQUAL(&ours, &now) {
                libc::CPU_SET(left_out, &mut given);
            }
        }
        Some((now, given))
    }
}

/// Whether this process may run on more than one CPU: on one, polling only delays the process
/// it waits for.
pub fn several_cpus() -> bool {
    // SAFETY: `given` is a plain bit set.
    cpu_sets().is_some_and(|(_, given)| unsafe { libc::CPU_COUNT(&given) } > 1)
}

/// Whether this thread keeps off a CPU it found shared (and runs elsewhere).
pub fn away() -> bool {
    // SAFETY: plain bit sets.
    cpu_sets().is_some_and(|(now, given)| unsafe { !libc::CPU_EQUAL(&now, &given) })
}

/// Whether this thread keeps off a CPU by its own record, with no syscall: `away`, unless a set
/// of CPUs was given to it since it moved (which `away`, a move and `come_back` see: a
/// `come_back` then only clears the record). For a worker between a reply and the turn it gives
/// its host, where `away`'s syscall would be on the host's path.
pub fn kept_off() -> bool {
    AWAY.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_some()
}

/// Moves this thread off the CPU it runs on, and keeps it off (the kernel migrates a running
/// thread before the call returns), until it moves again or is given a new set of CPUs. False
/// when it may use no other.
fn move_off_this_cpu() -> bool {
    let Some(here) = current_cpu() else { return false };
    let Some((_, given)) = cpu_sets() else { return false };
    // SAFETY: plain bit sets; `here` is below CPU_SETSIZE (the kernel returned it).
    unsafe {
        if !libc::CPU_ISSET(here, &given) {
            return false;
        }
        let mut elsewhere = given;
        libc::CPU_CLR(here, &mut elsewhere);
        if libc::CPU_COUNT(&elsewhere) == 0 || libc::sched_setaffinity(0, SET_SIZE, &elsewhere) != 0 {
            return false;
        }
        *AWAY.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((elsewhere, here));
    }
    true
}

/// Ends a `move_off_this_cpu`: this thread goes back to the CPU it left and may use every CPU
/// it was given again. For a thread about to sleep for a while: a pipe's wake-up then finds it
/// where its writer runs, an awake CPU, while a CPU kept to itself halts meanwhile, and waking
/// that after some ms idle costs more than the two ever gained apart (side by side, a trivial
/// cell after 10 ms idle ~300 -> ~160 µs; `wait` answering a `yield_control()` ~280 -> ~140).
/// Only widening its set is not enough: a woken thread goes back to the CPU it slept on when
/// that is idle.
pub fn come_back() {
    let Some((now, given)) = cpu_sets() else { return };
    let left = AWAY.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    // SAFETY: plain bit sets; pid 0 is this thread; `left_out` is below CPU_SETSIZE.
    unsafe {
        if let Some((_, left_out)) = left.filter(|_| !libc::CPU_EQUAL(&now, &given)) {
            let mut there: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(left_out, &mut there);
            libc::sched_setaffinity(0, SET_SIZE, &there);
            libc::sched_setaffinity(0, SET_SIZE, &given);
        }
    }
}

/// The CPU this thread runs on now (None where the kernel cannot tell).
pub fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments; it returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Whether `fd` is readable (or in error, or at its end: the caller's read reports which) by
/// `end` (None: however long it takes), sleeping until then; `Interrupted` if a signal came
/// first (the caller decides: run its handlers, or wait again for what is left).
pub fn readable_by(fd: RawFd, end: Option<Instant>) -> io::Result<bool> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let left = end.map(|end| end.saturating_duration_since(Instant::now()));
    let ts = left.map(|left| libc::timespec {
        tv_sec: left.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: left.subsec_nanos().into(),
    });
    let ts = ts.as_ref().map_or(std::ptr::null(), |ts| ts as *const libc::timespec);
    // SAFETY: one valid pollfd; `ts` is null or points at a valid timespec; no signal mask.
    let n = unsafe { libc::ppoll(&mut pfd, 1, ts, std::ptr::null()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n > 0)
}

/// Polls `fd` for up to `window` without sleeping; true once it is readable (or in error, or at
/// its end: the caller's read reports which), false when the window ran out or, `Yielding`,
/// when this CPU turned out to be shared.
pub fn readable_soon(fd: RawFd, window: Duration, spin: Spin) -> bool {
    let end = Instant::now() + window;
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // (`Moving`: once.)
    let (mut moved, mut just_moved) = (false, false);
    let started_on = if spin == Spin::Moving { current_cpu() } else { None };
    let mut long_yields = 0;
    // This thread's switches before its first yield, read then (a poll that finds its frame at
    // once, or a busy one, asks nothing), and again only after a long yield: a syscall on every
    // turn would slow the poll.
    let mut switched: Option<Option<libc::c_long>> = None;
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
            Spin::Yielding | Spin::Moving => {
                let before = *switched.get_or_insert_with(switches);
                // SAFETY: no arguments; it cannot fail on Linux.
                unsafe { libc::sched_yield() };
                // (The first turn after a move is not judged: the CPU moved to may have been
                // halted, and waking it takes tens of µs.)
                let mut long = now.elapsed() > SHARED_AFTER && !just_moved;
                if long {
                    // (Long only if another task ran: this thread was switched out since the
                    // last look, which was at most a few short yields ago.)
                    let now_switched = switches();
                    long = now_switched.is_none() || now_switched != before;
                    switched = Some(now_switched);
                }
                just_moved = false;
                long_yields += usize::from(long);
                if !long {
                    continue;
                }
                if spin == Spin::Moving && !moved {
                    // (The kernel may have moved it meanwhile, to the CPU that idled.)
                    if current_cpu() != started_on || move_off_this_cpu() {
                        (moved, just_moved, long_yields) = (true, true, 0);
                        switched = Some(switches()); // (the move switched this thread out)
                        continue;
                    }
                }
                // One long yield may be a kernel thread's turn (the migration thread that moves
                // a peer off this CPU preempts whatever runs here): a peer that gave up polling
                // for that would sleep through its frame and be woken onto the writer's CPU,
                // and two pollers would take turns chasing each other (~215 µs a cell instead
                // of ~45, back to back). Two: the CPU is shared. (Not two in a row: a yield
                // does not reliably hand the CPU over, so beside a task that keeps running,
                // long yields come between short ones.)
                if long_yields >= 2 {
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
        for spin in [Spin::Busy, Spin::Yielding, Spin::Moving] {
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

    /// Taken by the tests that time polls on a CPU they pin themselves to: one's busy thread
    /// would make the other's CPU shared.
    static ON_ONE_CPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_cpu_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        ON_ONE_CPU.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn pin(cpus: &[usize]) {
        // SAFETY: a plain bit set; pid 0 is this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in cpus {
                libc::CPU_SET(cpu, &mut set);
            }
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
    }

    fn allowed() -> Vec<usize> {
        // SAFETY: as in `pin`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
            (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect()
        }
    }

    #[test]
    fn moving_off_a_cpu_keeps_off_it_until_given_cpus_again() {
        std::thread::spawn(move || {
            let cpus = allowed();
            let without = |cpu: usize| cpus.iter().copied().filter(|&c| c != cpu).collect::<Vec<_>>();
            for &cpu in &cpus {
                // Given every CPU again (the host's set replaces its own), it runs on `cpu`.
                pin(&[cpu]);
                pin(&cpus);
                assert_eq!(current_cpu(), Some(cpu));
                assert!(!away());
                // With nowhere else to go, it stays (and says so).
                assert_eq!(move_off_this_cpu(), cpus.len() > 1);
                if cpus.len() > 1 {
                    let now_on = current_cpu().expect("a CPU");
                    assert_ne!(now_on, cpu);
                    assert_eq!(allowed(), without(cpu));
                    assert!(away() && kept_off() && several_cpus());
                    // Moving again leaves out only the CPU it leaves then.
                    assert!(move_off_this_cpu());
                    assert_eq!(allowed(), without(now_on));
                    // Coming back puts it on the CPU it left last, with every CPU again.
                    come_back();
                    assert_eq!(current_cpu(), Some(now_on));
                    assert_eq!(allowed(), cpus);
                    assert!(!away() && !kept_off());
                    // Given a set while it keeps off, it is not away, but only its own record
                    // says so until a `come_back`, which leaves the given set as it is.
                    assert!(move_off_this_cpu());
                    pin(&cpus);
                    assert!(!away() && kept_off());
                    come_back();
                    assert!(!kept_off());
                    assert_eq!(allowed(), cpus);
                }
                // With nothing to come back from, it stays where it is.
                come_back();
                assert_eq!(allowed(), cpus);
            }
        })
        .join()
        .expect("joins");
    }

    #[test]
    fn one_long_yield_does_not_end_a_yielding_poll_but_a_task_that_keeps_running_does() {
        // On one CPU with another thread that runs once for 50 µs and then writes (as the
        // migration thread that moves a peer away preempts the poller once), a yielding poll
        // goes on after the long yield and sees the byte; beside a thread that keeps running,
        // it gives up.
        let _turn = one_cpu_at_a_time();
        let cpu = allowed()[0];
        let busy = |for_: Duration| {
            let end = Instant::now() + for_;
            while Instant::now() < end {
                std::hint::spin_loop();
            }
        };
        // (Most times, not every time: a kernel thread may add a turn of its own. Measured:
        // 18-20 of 20; giving up at one long yield, 1-10; counting every long yield as shared,
        // on a VM whose timer tick makes a yield long ~1.3 times a ms, 7-15.)
        let mut seen = 0;
        for _ in 0..20 {
            let (r, mut w) = std::io::pipe().expect("a pipe");
            let pinned = std::sync::Arc::new(std::sync::Barrier::new(2));
            let both = pinned.clone();
            let other = std::thread::spawn(move || {
                pin(&[cpu]);
                both.wait();
                std::thread::sleep(Duration::from_micros(300));
                busy(Duration::from_micros(50));
                w.write_all(b"x").expect("writes");
            });
            pin(&[cpu]);
            pinned.wait();
            // (After `other` went to sleep: its turn to do so would be a long yield too.)
            std::thread::sleep(Duration::from_micros(100));
            seen += usize::from(readable_soon(r.as_raw_fd(), Duration::from_millis(100), Spin::Yielding));
            other.join().expect("joins");
        }
        assert!(seen >= 15, "gave up {} times in 20", 20 - seen);

        let (r, _w) = std::io::pipe().expect("a pipe");
        let hog = std::thread::spawn(move || {
            pin(&[cpu]);
            busy(Duration::from_millis(1500));
        });
        let started = Instant::now();
        assert!(!readable_soon(r.as_raw_fd(), Duration::from_secs(3), Spin::Yielding));
        assert!(started.elapsed() < Duration::from_secs(1), "polled on beside a task that runs");
        hog.join().expect("joins");
    }

    #[test]
    fn a_lone_poller_polls_its_whole_window_however_long_its_ticks_make_a_yield() {
        // A yield with no other task takes more than `SHARED_AFTER` at each timer tick that
        // exits to the hypervisor (~1.3 times a ms here): counted as shared, those ended a lone
        // poll within a few ms. Only a yield in which this thread was switched out counts.
        // (Not every window: the other tests' threads, or a kernel thread, may take turns on
        // this CPU; so windows follow each other until three ran whole, for up to 2 s.)
        let _turn = one_cpu_at_a_time();
        let (r, _w) = std::io::pipe().expect("a pipe");
        pin(&[allowed()[0]]);
        let (mut whole, mut windows) = (0, 0);
        let since = Instant::now();
        while whole < 3 && since.elapsed() < Duration::from_secs(2) {
            let started = Instant::now();
            assert!(!readable_soon(r.as_raw_fd(), Duration::from_millis(50), Spin::Yielding));
            whole += usize::from(started.elapsed() >= Duration::from_millis(45));
            windows += 1;
        }
        assert!(whole >= 3, "{whole} of {windows} windows ran whole in 2 s");
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
