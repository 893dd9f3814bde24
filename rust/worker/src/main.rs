//! `codemode-worker`: frames in on stdin, engine calls, frames out on stdout.
//!
//! ```text
//!   supervisor ──Configure|Start|Settle|Replay|Drop──> stdin ─┐
//!                                                            ├─ Worker ── Engine (QuickJS), one per run
//!   supervisor <──────────Ready|Report|Fault─────────── stdout ┘
//! ```
//!
//! Started by the supervisor (python/codemode/workers.py) as `codemode-worker MEMORY_BYTES
//! CPU_SECONDS SHED_AFTER_MS`, with an empty environment, in its own process group; it sets
//! RLIMIT_DATA and RLIMIT_CPU from the first two before anything else. The third is how long it
//! waits with no frame before it gives back the memory of the heaps it kept ready past a burst
//! of runs (`Worker::shed`): bursts closer than that (a busy host's turns) each start on reset
//! heaps, not built ones. RLIMIT_DATA, not RLIMIT_AS: each engine
//! lives in a fixed-address arena (codemode_engine::arena; the global allocator below) carved
//! from one reservation of several TiB of `PROT_NONE` address space, which RLIMIT_AS would
//! refuse; RLIMIT_DATA counts what the worker can actually write (committed private memory:
//! the arenas' committed pages, the system heap, images), so the number keeps its meaning,
//! the bytes the worker may use. It holds the engines of its resident runs and, while idle,
//! resets the heaps of finished runs so a new cell starts on a pristine one at once. It exits
//! at end of file (0), and on a frame it cannot read (1, the reason on stderr): the host
//! discards a worker that does either. It never touches a file or opens a socket.
//!
//! `codemode-worker echo` decodes each frame (of either direction) and writes it back
//! re-encoded, or `["error", reason]`: how tests pin the Rust codec to protocol.py.

mod pipe;
mod pool;
mod protocol;
mod worker;

use std::io;
use std::os::fd::RawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use codemode_engine::YIELD_TOOL;
use codemode_spin::{readable_soon, Spin};
use pipe::{readable_within, write_all, FrameReader};
use protocol::{AnyFrame, HostFrame, Ready, Status, WorkerFrame};
use worker::Worker;

/// Every allocation made while an engine's arena is entered lands in that arena; the rest goes
/// to the system allocator.
#[global_allocator]
static ALLOCATOR: codemode_engine::arena::ArenaAllocator = codemode_engine::arena::ArenaAllocator;

/// How long a worker whose run just parked on tool calls gives the host to answer before it
/// does its idle work (resetting the finished run's heap, building an engine when none is ready).
const PARKED_GRACE: Duration = Duration::from_micros(2000);
/// The same for a run that ended after it had parked: the host is finishing the `exec`. Short,
/// so that the next engine is still built before a cell that follows within a few ms.
const ENDED_GRACE: Duration = Duration::from_micros(500);
/// How long a worker whose run ended polls for the next frame before it sleeps: a host that
/// pauses between cells for less (a `time.sleep(0)` there sleeps ~60 µs) finds it awake, and
/// pays no wake-up of a halted CPU (~35 µs of a trivial cell's ~90 at 100 µs).
const SPIN: Duration = Duration::from_micros(300);

/// A parked run's answers that came this soon after its report are a host's own tools (~30-60
/// µs here), not an MCP server's (~250-400 µs): only for those does a worker woken on the
/// host's CPU move off it to poll (an MCP call's poll took the CPU the server and the host's
/// loop need: 10 calls through a cell 4.4 -> 5.0-6.2 ms).
const PROMPT: Duration = Duration::from_micros(150);

/// How long a worker kept off its host's CPU (`Spin::Moving`) sleeps there before it comes
/// back. Measured side by side (10 tool calls, paced): kept off, 0.6 ms after 2 ms idle but 1.6
/// ms after 5 ms, 1.8 after 10, 2.4 after 50; back, 1.0, 1.0, 1.1, 1.5.
const STAY_AWAY: Duration = Duration::from_millis(5);

/// How long a worker kept off its host's CPU waits before it comes back there after a yield
/// (a reply it did not poll after): the host is still making the cell a suspended run and its
/// result on that CPU (~0.1-0.3 ms of Python after a burst), and a thread moved onto it then
/// (the migration thread's turn, then its own) preempted the host, ~20 µs in phases. A frame
/// that comes meanwhile is read where the worker is (kept off, as while the traffic is quick).
const HOST_FINISHES: Duration = Duration::from_micros(500);

const STDIN: RawFd = 0;
const STDOUT: RawFd = 1;

/// Lowers a resource's limit to `value` (and its hard limit with it, when that was unlimited).
fn limit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `current` is a valid rlimit to write into.
    if unsafe { libc::getrlimit(resource, &mut current) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let hard = current.rlim_max;
    let cap = if hard == libc::RLIM_INFINITY { value } else { value.min(hard) };
    let new = libc::rlimit { rlim_cur: cap, rlim_max: if hard == libc::RLIM_INFINITY { cap } else { hard } };
    // SAFETY: `new` is a valid rlimit.
    if unsafe { libc::setrlimit(resource, &new) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Why the worker stopped before end of file.
struct Fatal(String);

impl<E: std::fmt::Display> From<E> for Fatal {
    fn from(e: E) -> Self {
        Fatal(e.to_string())
    }
}

fn send(frame: &WorkerFrame) -> Result<(), Fatal> {
    write_all(STDOUT, &protocol::encode(frame)?)?;
    Ok(())
}

/// The worker's loop: until end of file (where it exits), read a frame, serve it, reply.
fn serve(memory_cap: u64, shed_after: Duration) -> Result<(), Fatal> {
    let mut reader = FrameReader::new(STDIN);
    let mut worker = Worker::new(usize::try_from(memory_cap).unwrap_or(usize::MAX));
    send(&WorkerFrame::Ready(Ready {
        pid: std::process::id().into(),
        engine_version: env!("CARGO_PKG_VERSION").into(),
    }))?;
    // Before it blocks for the next frame, the worker does its idle work (a heap reset, ~5-30
    // µs; ~0.5 ms when an engine must be built or freed) after giving the host this long to
    // send a frame first.
    let mut grace = Duration::ZERO;
    // After a reply, the host's next frame (its next cell back to back, a quick tool's answer)
    // often comes within tens of µs: the worker polls for it briefly rather than let its CPU
    // halt (`codemode_spin`). After a run ended whose frame came back to back (within the
    // window of the reply before), it polls `Moving`: off a CPU it finds shared with the host,
    // and kept off it while the traffic keeps coming; otherwise `Yielding`. Parked on tools, it
    // polls only while the host's answers have been quick (the last one within the window): a
    // poll that runs out cost each MCP call ~100 µs, by taking a CPU the server and the host's
    // MCP loop need. Where the frame it answered woke it (on the writer's CPU, most likely,
    // where the host runs the tools and a yield does not reliably give the CPU back) it polls
    // `Moving` while the answers are the host's own tools' (within `PROMPT`): off that CPU, its
    // calls then pass between two CPUs that poll, with no wake-up each (10 paced calls: ~0.85x
    // the time); else `Yielding`, where it is. Never on one CPU (`several`).
    //
    // Between a reply and the turn it gives its host, the worker makes no syscall but those it
    // must (each ~0.3-1 µs on the host's path): whether it keeps off a CPU is its own record
    // (`codemode_spin::kept_off`), and whether it may use several CPUs is asked after its idle
    // work, when the host had its turn, or, while it may not, each time it would poll (the host
    // narrows a starting worker's CPUs and widens them once it is up: `workers._start_elsewhere`).
    //
    // A worker kept off the host's CPU comes back to it (`codemode_spin::come_back`) once the
    // traffic pauses: after `STAY_AWAY` of quiet, or at once when its run yielded or a run that
    // came after a pause ended (see below). Kept off, it could be woken only on a CPU of its
    // own, halted meanwhile.
    let mut spin = None;
    let mut several = codemode_spin::several_cpus();
    // When the last reply went, whether it parked the run, whether its answers came quick.
    let (mut replied_at, mut was_parked, mut quick_answers) = (None::<Instant>, false, true);
    // Whether the last frame came within the poll window of the reply before it; whether the
    // host's last answer to a parked run came within `PROMPT`.
    let (mut was_quick, mut prompt_answers) = (false, true);
    // Whether the last reply parked its run on `yield_control` alone: its answer comes with the
    // host's next `wait`, after a model's turn, not in microseconds as a tool's may.
    let mut yielded = false;
    loop {
        // Whether the frame came while the worker polled (on a CPU of its own, most likely) or
        // woke it (onto its host's CPU, most likely: a pipe's wake-up is a sync one).
        let (len, polled) = match reader.poll()? {
            Some(len) => (len, true),
            None => {
                if grace.is_zero() && worker.has_idle_work() {
                    if !codemode_spin::kept_off() {
                        // A reply's wake-up puts the host on this CPU, where it waits for the
                        // worker to give the CPU up: it reads the reply and finishes its exec
                        // first, and the heap reset comes after (idle exec ~140 -> ~125 µs).
                        // SAFETY: no arguments; it only gives this CPU away for a turn.
                        unsafe { libc::sched_yield() };
                    }
                    // SAFETY: the last reply was sent and dropped at the end of the previous
                    // turn of this loop, and frames are decoded outside any arena. (One turn of
                    // idle work: the rest below, while no frame comes.)
                    unsafe { worker.idle() };
                    several = codemode_spin::several_cpus();
                }
                // (On one CPU, asked again each time: a starting worker's may be widened.)
                several = several || (spin.is_some() && codemode_spin::several_cpus());
                let came = spin.filter(|_| several).is_some_and(|spin| readable_soon(STDIN, SPIN, spin));
                if codemode_spin::kept_off()
                    && (yielded || (!was_parked && !was_quick))
                    && (came || spin.is_some() || !readable_within(STDIN, HOST_FINISHES))
                {
                    // A run that yielded is resumed by a `wait`, after a model's turn; a run that
                    // ended in the frame that started it, after a pause, is no burst of back-to-
                    // back cells or tool calls (the host paused, as between a model's turns).
                    // Kept off, the worker could be woken only on a CPU of its own, halted
                    // meanwhile: measured, idle trivial cells ~70 µs with every CPU to wake on,
                    // ~94 kept off. (With cells 2 ms apart after a burst, it never had
                    // `STAY_AWAY` quiet: it kept off for good.) A run whose tool calls came back
                    // quick stays off: those ping-pong better on CPUs of their own.
                    codemode_spin::come_back();
                }
                if !came && worker.has_idle_work() && !readable_within(STDIN, grace) {
                    // SAFETY: as above. (A turn at a time, while no frame has come.)
                    while unsafe { worker.idle() } && !readable_within(STDIN, Duration::ZERO) {}
                    several = codemode_spin::several_cpus();
                }
                if !came && codemode_spin::kept_off() && !readable_within(STDIN, STAY_AWAY) {
                    // (A frame that came meanwhile is read at once, kept off.)
                    codemode_spin::come_back();
                }
                let mut quiet = shed_after;
                while !came && worker.can_shed() && !readable_within(STDIN, quiet) {
                    worker.shed();
                    quiet = Duration::ZERO; // (a turn at a time, while no frame has come)
                }
                match reader.read_blocking()? {
                    Some(len) => (len, came),
                    // Nothing is left to do: the resident engines need no teardown.
                    None => std::process::exit(0),
                }
            }
        };
        // Whether this frame came within the poll window of the last reply: back to back.
        let since_reply = replied_at.map(|at| at.elapsed());
        let quick = since_reply.is_some_and(|since| since <= SPIN);
        was_quick = quick;
        if was_parked {
            quick_answers = quick;
            prompt_answers = since_reply.is_some_and(|since| since <= PROMPT);
        }
        let frame: HostFrame = protocol::decode(reader.body(len))?;
        reader.consume(len);
        let settle = matches!(frame, HostFrame::Settle(_));
        // SAFETY: as for `idle` above: the last reply was sent and dropped, and the frame was
        // decoded outside any arena.
        unsafe { worker.prepare(&frame) };
        let reply = worker.handle(frame);
        if let Some(reply) = &reply {
            send(reply)?;
        }
        let parked = matches!(&reply, Some(WorkerFrame::Report(report)) if report.status == Status::Pending);
        yielded = matches!(&reply, Some(WorkerFrame::Report(report))
            if parked && !report.calls.is_empty() && report.calls.iter().all(|call| *call.1 == *YIELD_TOOL));
        (replied_at, was_parked) = (Some(Instant::now()), parked);
        spin = match parked {
            true if yielded || !quick_answers => None,
            true if polled || codemode_spin::kept_off() => Some(Spin::Yielding),
            true if prompt_answers => Some(Spin::Moving),
            true => None,
            false if quick => Some(Spin::Moving),
            false => Some(Spin::Yielding),
        };
        grace = if parked {
            // Parked on tools, which usually answer within microseconds: the rebuild waits for a
            // slow answer (or for a run the host suspends, which sends nothing).
            PARKED_GRACE
        } else if settle {
            // A run that parked has ended. The host may be finishing it on a thread that a
            // rebuild started now would keep off a CPU for its whole ~0.5 ms.
            ENDED_GRACE
        } else {
            Duration::ZERO
        };
    }
}

/// `echo`: every frame read back re-encoded (or `["error", reason]`), until end of file.
fn echo() -> Result<(), Fatal> {
    let mut reader = FrameReader::new(STDIN);
    while let Some(len) = reader.read_blocking()? {
        let out = match protocol::decode::<AnyFrame>(reader.body(len)) {
            Ok(frame) => protocol::encode(&frame)?,
            Err(e) => protocol::encode(&("error", e.0.as_str()))?,
        };
        reader.consume(len);
        write_all(STDOUT, &out)?;
    }
    Ok(())
}

/// A number argument (`default` when absent).
fn arg(args: &[String], at: usize, default: u64) -> Result<u64, Fatal> {
    match args.get(at) {
        None => Ok(default),
        Some(text) => text.parse().map_err(|_| Fatal(format!("argument {at} is not a number: {text:?}"))),
    }
}

fn run() -> Result<(), Fatal> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("echo") {
        return echo();
    }
    let memory_cap = arg(&args, 1, 4 << 30)?;
    let cpu_seconds = arg(&args, 2, 3600)?;
    let shed_after = Duration::from_millis(arg(&args, 3, 60_000)?);
    limit(libc::RLIMIT_DATA, memory_cap)?;
    limit(libc::RLIMIT_CPU, cpu_seconds)?;
    serve(memory_cap, shed_after)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fatal(message)) => {
            eprintln!("codemode-worker: {message}");
            ExitCode::from(1)
        }
    }
}
