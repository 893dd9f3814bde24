//! What a worker holds between frames, and what each host frame does to it.
//!
//! Its resident runs' engines (parked and suspended runs stay here), the configuration and
//! catalog the next engines are built from, and the pool (pool.rs) that hands each new run a
//! pristine engine and, while idle, resets the heaps of finished runs so that neither a build
//! nor a teardown is on the reply path.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use blake2::digest::consts::U16;
use blake2::{Blake2b, Digest};
use codemode_engine::semantic::Model;
use codemode_engine::{Catalog, Engine, Language, Limits, Outcome, Settlement, Status as EngineStatus, ToolCall};

use crate::pool::{HeapPool, Sandbox};
use crate::protocol::{
    Call, ClockRun, Configure, EngineLimits, FailureCode, Fault, HostFrame, Method, OutputKind, Replay, Report,
    Result3, Settle, Start, Status, Text, WorkerFrame,
};

/// What the next engines are built with (from the last `Configure`).
struct Config {
    limits: EngineLimits,
    fingerprint: String,
}

pub struct Worker {
    config: Option<Config>,
    catalog: Option<Arc<Catalog>>,
    /// The semantic search model and the pack it came from (a new catalog reuses it). While
    /// `config` is set, the pack is the one the last `Configure` sent.
    semantic: (Vec<u8>, Option<Arc<Model>>),
    pool: HeapPool,
    resident: HashMap<u64, Sandbox>,
}

/// What journals record of a call's input, and what a replay's report carries in its place:
/// `input_hash` in protocol.py (BLAKE2b with a 16-byte digest, as hex).
pub fn input_hash(input_json: &str) -> String {
    let digest = Blake2b::<U16>::digest(input_json.as_bytes());
    digest.iter().fold(String::with_capacity(32), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

fn language(name: &str) -> Option<Language> {
    match name {
        "javascript" => Some(Language::JavaScript),
        "typescript" => Some(Language::TypeScript),
        _ => None,
    }
}

fn settlements(results: Vec<Result3>) -> Vec<Settlement> {
    results.into_iter().map(|(id, ok, payload)| Settlement { id, ok, payload: payload.0 }).collect()
}

fn calls(calls: Vec<ToolCall>) -> Vec<Call> {
    calls.into_iter().map(|c| (c.id, c.tool.into(), c.input_json.into(), Method(c.method))).collect()
}

/// A replay's calls as its report carries them: each input by its hash.
fn hashed(calls: &[ToolCall]) -> impl Iterator<Item = Call> + '_ {
    calls.iter().map(|c| (c.id, c.tool.as_str().into(), input_hash(&c.input_json).into(), Method(c.method)))
}

/// Clock runs of a report: a run read zero times says nothing (and the protocol refuses it).
fn clock_runs(reads: &[(f64, u32)]) -> Vec<ClockRun> {
    reads.iter().filter_map(|&(ms, count)| Some((ms, std::num::NonZeroU32::new(count)?))).collect()
}

fn failure_code(code: codemode_engine::ErrorCode) -> FailureCode {
    use codemode_engine::ErrorCode as E;
    match code {
        E::InvalidInput => FailureCode::InvalidInput,
        E::Timeout => FailureCode::Timeout,
        E::OutputLimitExceeded => FailureCode::OutputLimitExceeded,
        E::MemoryLimitExceeded => FailureCode::MemoryLimitExceeded,
        E::InternalError => FailureCode::InternalError,
    }
}

/// One engine outcome as a report of run `run`.
fn report(run: u64, outcome: Outcome) -> Report {
    let (status, value, failure) = match outcome.status {
        EngineStatus::Completed(json) => (Status::Completed, Some(json.into()), None),
        EngineStatus::Pending => (Status::Pending, None, None),
        EngineStatus::Failed(f) => {
            (Status::Failed, None, Some((f.code.map(failure_code), f.name.into(), f.message.into(), f.stack.into())))
        }
    };
    Report {
        run,
        status,
        value,
        failure,
        outputs: outcome.outputs.into_iter().map(|o| (OutputKind(o.kind as u8), o.text.into())).collect(),
        calls: calls(outcome.calls),
        clock_reads: clock_runs(&outcome.clock_reads),
        in_flight: outcome.in_flight as u64,
        memory_bytes: outcome.memory_bytes as u64,
        searches: outcome.searches.into(),
        describes: outcome.describes.into(),
        store_writes: outcome.store_writes.map(Text),
    }
}

fn fault(run: u64, message: impl Into<String>) -> WorkerFrame {
    WorkerFrame::Fault(Fault { run, message: Text(message.into()) })
}

fn pending(outcome: &Outcome) -> bool {
    matches!(outcome.status, EngineStatus::Pending)
}

impl Worker {
    /// A worker whose memory cap (RLIMIT_DATA) is `memory_cap` bytes.
    pub fn new(memory_cap: usize) -> Worker {
        Worker {
            config: None,
            catalog: None,
            semantic: (Vec::new(), None),
            pool: HeapPool::new(memory_cap),
            resident: HashMap::new(),
        }
    }

    /// Builds an engine from the last configuration.
    fn build(config: &Option<Config>, catalog: &Option<Arc<Catalog>>) -> Result<Engine, String> {
        let (Some(config), Some(catalog)) = (config, catalog) else {
            return Err("no configuration received before the first cell".to_owned());
        };
        let limits = &config.limits;
        let limits = Limits {
            memory_bytes: limits.memory_limit_bytes,
            max_output_bytes: limits.max_output_bytes,
            max_pending_calls: limits.max_pending_calls,
            search_default_limit: limits.search_default_limit,
            max_search_limit: limits.max_search_limit,
            ..Limits::default()
        };
        Engine::new(limits, catalog.clone()).map_err(|e| e.0)
    }

    /// A pristine engine for a new run.
    fn engine(&mut self) -> Result<Sandbox, String> {
        let (config, catalog) = (&self.config, &self.catalog);
        self.pool.take(&|| Worker::build(config, catalog))
    }

    /// Keeps a run's engine resident while it waits on tools; retires it once it has ended.
    fn keep(&mut self, run: u64, engine: Sandbox, pending: bool) {
        if pending {
            self.resident.insert(run, engine);
        } else {
            self.pool.retire(engine);
        }
    }

    /// Serves one host frame; the reply to send, if it has one.
    pub fn handle(&mut self, frame: HostFrame) -> Option<WorkerFrame> {
        match frame {
            HostFrame::Start(start) => Some(self.start(start)),
            HostFrame::Settle(settle) => Some(self.settle(settle)),
            HostFrame::Replay(replay) => Some(self.replay(replay)),
            HostFrame::Drop(drop) => {
                if let Some(engine) = self.resident.remove(&drop.run) {
                    self.pool.retire(engine);
                }
                None
            }
            HostFrame::Configure(configure) => self.configure(configure),
        }
    }

    fn start(&mut self, start: Start) -> WorkerFrame {
        // (The Python worker ended on an unknown language; the host never sends one.)
        let Some(language) = language(&start.language) else {
            return fault(start.run, format!("unknown language: {:?}", &*start.language));
        };
        let mut engine = match self.engine() {
            Ok(engine) => engine,
            Err(message) => return fault(start.run, message),
        };
        let outcome = engine.with(|engine| {
            if let Some(clock_start) = start.clock_start {
                engine.fix_clock(clock_start);
            }
            engine.start(&start.source, language, start.timeout_ms, start.seed, &start.run_json)
        });
        self.keep(start.run, engine, pending(&outcome));
        WorkerFrame::Report(report(start.run, outcome))
    }

    fn settle(&mut self, settle: Settle) -> WorkerFrame {
        let Some(engine) = self.resident.get_mut(&settle.run) else {
            return fault(settle.run, "unknown run");
        };
        let outcome = engine.with(|engine| engine.settle(settlements(settle.results), settle.timeout_ms));
        if !pending(&outcome) {
            if let Some(engine) = self.resident.remove(&settle.run) {
                self.pool.retire(engine);
            }
        }
        WorkerFrame::Report(report(settle.run, outcome))
    }

    fn configure(&mut self, frame: Configure) -> Option<WorkerFrame> {
        let changed = match &self.config {
            None => true,
            Some(config) => config.fingerprint != *frame.fingerprint || self.semantic.0 != frame.semantic.0,
        };
        if changed {
            if frame.semantic.0 != self.semantic.0 {
                let model = if frame.semantic.0.is_empty() {
                    None
                } else {
                    match Model::from_pack(&frame.semantic.0) {
                        Ok(model) => Some(Arc::new(model)),
                        Err(e) => {
                            self.config = None;
                            self.catalog = None;
                            return Some(fault(0, format!("bad catalog: {e}")));
                        }
                    }
                };
                self.semantic = (frame.semantic.0, model);
            }
            match Catalog::from_json_with(&frame.catalog_json, false, self.semantic.1.clone()) {
                Ok(catalog) => self.catalog = Some(Arc::new(catalog)),
                Err(e) => {
                    self.config = None;
                    self.catalog = None;
                    return Some(fault(0, format!("bad catalog: {e}")));
                }
            }
        }
        self.config = Some(Config { limits: frame.limits, fingerprint: frame.fingerprint.0 });
        self.pool.configure();
        None
    }

    fn replay(&mut self, frame: Replay) -> WorkerFrame {
        let Replay { start, batches, clock_reads } = frame;
        let Some(language) = language(&start.language) else {
            return fault(start.run, format!("unknown language: {:?}", &*start.language));
        };
        let mut engine = match self.engine() {
            Ok(engine) => engine,
            Err(message) => return fault(start.run, message),
        };
        let (outcome, calls) = engine.with(|engine| {
            let readings: Vec<(f64, u32)> = clock_reads.iter().map(|&(ms, count)| (ms, count.get())).collect();
            engine.replay_clock(&readings);
            if let Some(clock_start) = start.clock_start {
                engine.fix_clock(clock_start);
            }
            let mut outcome = engine.start(&start.source, language, start.timeout_ms, start.seed, &start.run_json);
            let mut calls: Vec<Call> = hashed(&outcome.calls).collect();
            for batch in batches {
                if !pending(&outcome) {
                    break;
                }
                outcome = engine.settle(settlements(batch), start.timeout_ms);
                calls.extend(hashed(&outcome.calls));
            }
            (outcome, calls)
        });
        let is_pending = pending(&outcome);
        self.keep(start.run, engine, is_pending);
        let mut report = report(start.run, outcome);
        report.outputs.clear();
        report.calls = calls;
        report.clock_reads.clear();
        report.searches = 0;
        report.describes = 0;
        WorkerFrame::Report(report)
    }

    /// Before a frame that starts a run (`Start`, `Replay`): a finished heap reset for it if none
    /// is ready (the idle work that would have done it may have been put off by a grace).
    ///
    /// # Safety
    /// The contract of `idle`.
    pub unsafe fn prepare(&mut self, frame: &HostFrame) {
        if matches!(frame, HostFrame::Start(_) | HostFrame::Replay(_)) {
            // SAFETY: the caller's contract is the pool's.
            unsafe { self.pool.reuse_finished() };
        }
    }

    pub fn has_idle_work(&self) -> bool {
        self.pool.has_idle_work(self.config.is_some())
    }

    /// Whether a quiet worker has memory to give back (`shed`).
    pub fn can_shed(&self) -> bool {
        self.pool.can_shed()
    }

    /// The worker has been quiet a while: it gives back what its ready heaps past the few it
    /// always keeps, and its freed engines and heaps, held.
    pub fn shed(&mut self) {
        self.pool.shed();
    }

    /// A turn of work between frames: reset or free the engines of ended runs, have the next
    /// one ready. Whether engines are left for another turn.
    ///
    /// # Safety
    /// No report (or other value) that an ended run's engine made is alive: every reply was
    /// sent and dropped (the arenas of ended runs are reset here).
    pub unsafe fn idle(&mut self) -> bool {
        let (config, catalog) = (&self.config, &self.catalog);
        let build = || Worker::build(config, catalog);
        // SAFETY: the caller's contract is the pool's.
        unsafe { self.pool.idle(config.is_some().then_some(&build as &dyn Fn() -> Result<Engine, String>)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_hash_is_blake2b_128_hex_as_protocol_py_computes_it() {
        // hashlib.blake2b(b"", digest_size=16).hexdigest() and of b'{"a":1}'
        assert_eq!(input_hash(""), "cae66941d9efbd404e4d88758ea67670");
        assert_eq!(input_hash("{\"a\":1}"), "2c6b113b8dd15ffbded9860b43eb0c6c");
    }
}
