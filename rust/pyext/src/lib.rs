//! Thin PyO3 wrapper: `codemode._engine.Engine` for the worker process.
//!
//! Only argument conversion lives here. An outcome crosses as an `Outcome` of named fields (the
//! engine's `Outcome`, flattened as the worker's `Report` frame carries it). The engine is not
//! `Send`, and its users here (the host's probe of the guest's globals) are single-threaded, so
//! there is no `detach` around it. The host uses three helpers from here: `spin_readable` and the
//! `FrameReader` of a worker's pipe (`frames`), which detach, and `current_cpu`.

mod errors;
mod frames;
mod semantic;

use std::sync::Arc;
use std::time::Duration;

use codemode_engine::{
    CallMethod, Catalog as InnerCatalog, Engine as Inner, Language, Limits as InnerLimits, Outcome as InnerOutcome,
    Settlement, Status,
};
use codemode_spin::{readable_soon, Spin};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// (code, name, message, stack)
type PyFailure = (Option<&'static str>, String, String, String);

/// What a run's step ended in (the engine's `Outcome`; the fields of protocol.py's `Report`).
#[pyclass(frozen, get_all, module = "codemode._engine")]
struct Outcome {
    status: &'static str,
    value: Option<String>,
    failure: Option<PyFailure>,
    outputs: Vec<(u8, String)>,
    /// (id, tool, input, method)
    calls: Vec<(u32, String, String, &'static str)>,
    clock_reads: Vec<(f64, u32)>,
    in_flight: usize,
    memory_bytes: usize,
    searches: u32,
    describes: u32,
    store_writes: Option<String>,
}

impl From<InnerOutcome> for Outcome {
    fn from(outcome: InnerOutcome) -> Outcome {
        let (status, value, failure) = match outcome.status {
            Status::Completed(json) => ("completed", Some(json), None),
            Status::Pending => ("pending", None, None),
            Status::Failed(f) => ("failed", None, Some((f.code.map(|c| c.as_str()), f.name, f.message, f.stack))),
        };
        Outcome {
            status,
            value,
            failure,
            outputs: outcome.outputs.into_iter().map(|o| (o.kind as u8, o.text)).collect(),
            calls: outcome.calls.into_iter().map(|c| (c.id, c.tool, c.input_json, c.method.as_str())).collect(),
            clock_reads: outcome.clock_reads,
            in_flight: outcome.in_flight,
            memory_bytes: outcome.memory_bytes,
            searches: outcome.searches,
            describes: outcome.describes,
            store_writes: outcome.store_writes,
        }
    }
}

/// A run's limits (the engine's `Limits`): `DEFAULT_LIMITS` is the one copy of their defaults,
/// which `codemode.config` reads.
#[pyclass(frozen, get_all, module = "codemode._engine")]
struct Limits {
    memory_bytes: usize,
    stack_bytes: usize,
    max_output_bytes: usize,
    max_pending_calls: usize,
    max_bridge_bytes: usize,
    search_default_limit: usize,
    max_search_limit: usize,
    max_report_bytes: usize,
}

impl From<InnerLimits> for Limits {
    fn from(limits: InnerLimits) -> Limits {
        Limits {
            memory_bytes: limits.memory_bytes,
            stack_bytes: limits.stack_bytes,
            max_output_bytes: limits.max_output_bytes,
            max_pending_calls: limits.max_pending_calls,
            max_bridge_bytes: limits.max_bridge_bytes,
            search_default_limit: limits.search_default_limit,
            max_search_limit: limits.max_search_limit,
            max_report_bytes: limits.max_report_bytes,
        }
    }
}

/// A parsed catalog with its search index, shared by every engine built from it.
#[pyclass(frozen, module = "codemode._engine")]
struct Catalog {
    inner: Arc<InnerCatalog>,
}

#[pymethods]
impl Catalog {
    /// With `semantic`, search is hybrid and the tools are embedded here (GIL released).
    #[new]
    #[pyo3(signature = (entries_json, include_mcp = false, semantic = None))]
    fn new(
        py: Python<'_>,
        entries_json: &str,
        include_mcp: bool,
        semantic: Option<&semantic::SemanticModel>,
    ) -> PyResult<Self> {
        let model = semantic.map(|s| s.inner.clone());
        py.detach(|| InnerCatalog::from_json_with(entries_json, include_mcp, model))
            .map(|c| Catalog { inner: Arc::new(c) })
            .map_err(PyValueError::new_err)
    }

    /// `"hybrid"` (BM25 fused with embeddings) or `"bm25"`.
    #[getter]
    fn search_mode(&self) -> &'static str {
        self.inner.search_mode()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Search results as JSON text (the same search the guest's `tools.search` runs).
    fn search(&self, query: &str, limit: usize) -> String {
        self.inner.search_json(query, limit)
    }

    /// The full entry of a tool id or name as JSON text, if the catalog has it.
    fn describe(&self, id_or_name: &str) -> Option<String> {
        self.inner.describe_json(id_or_name).map(str::to_owned)
    }
}

/// One sandboxed run. Build it before the cell arrives; `start` once; `settle` as results come.
#[pyclass(unsendable, module = "codemode._engine")]
struct Engine {
    inner: Inner,
}

#[pymethods]
impl Engine {
    /// Limits left out are the engine's defaults (`DEFAULT_LIMITS`).
    #[new]
    #[pyo3(signature = (*, catalog, memory_limit_bytes = None, max_output_bytes = None, max_pending_calls = None, stack_bytes = None, max_bridge_bytes = None, search_default_limit = None, max_search_limit = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        catalog: &Catalog,
        memory_limit_bytes: Option<usize>,
        max_output_bytes: Option<usize>,
        max_pending_calls: Option<usize>,
        stack_bytes: Option<usize>,
        max_bridge_bytes: Option<usize>,
        search_default_limit: Option<usize>,
        max_search_limit: Option<usize>,
    ) -> PyResult<Self> {
        let d = InnerLimits::default();
        let limits = InnerLimits {
            memory_bytes: memory_limit_bytes.unwrap_or(d.memory_bytes),
            stack_bytes: stack_bytes.unwrap_or(d.stack_bytes),
            max_output_bytes: max_output_bytes.unwrap_or(d.max_output_bytes),
            max_pending_calls: max_pending_calls.unwrap_or(d.max_pending_calls),
            max_bridge_bytes: max_bridge_bytes.unwrap_or(d.max_bridge_bytes),
            search_default_limit: search_default_limit.unwrap_or(d.search_default_limit),
            max_search_limit: max_search_limit.unwrap_or(d.max_search_limit),
            ..d
        };
        Inner::new(limits, catalog.inner.clone()).map(|inner| Engine { inner }).map_err(errors::init_error)
    }

    /// Runs the cell until it completes, fails, or waits on tool calls.
    #[pyo3(signature = (source, language, timeout_ms, seed, run_json = "{}"))]
    fn start(&mut self, source: &str, language: &str, timeout_ms: f64, seed: u64, run_json: &str) -> PyResult<Outcome> {
        let language = match language {
            "javascript" => Language::JavaScript,
            "typescript" => Language::TypeScript,
            other => return Err(PyValueError::new_err(format!("unknown language: {other:?}"))),
        };
        Ok(self.inner.start(source, language, timeout_ms, seed, run_json).into())
    }

    /// Delivers `(call_id, ok, payload)` results (payload: JSON value, or an error message).
    fn settle(&mut self, results: Vec<(u32, bool, String)>, timeout_ms: f64) -> Outcome {
        let settlements = results.into_iter().map(|(id, ok, payload)| Settlement { id, ok, payload }).collect();
        self.inner.settle(settlements, timeout_ms).into()
    }

    /// Serves these clock readings before the real clock (journal replay).
    fn replay_clock(&mut self, readings: Vec<(f64, u32)>) {
        self.inner.replay_clock(&readings);
    }

    /// Bytes the QuickJS heap holds now.
    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }
}

/// Polls `fd` without sleeping, for up to `seconds`, with the GIL released; true once it is
/// readable (or in error: the caller's own read or select reports that). `hotloop` polls its
/// selector's fd so, where it would otherwise sleep for a reply due within microseconds;
/// `workers.FrameSource` polls a worker's pipe so, `yielding` (see `codemode_spin`).
#[pyfunction]
#[pyo3(signature = (fd, seconds, yielding=false))]
fn spin_readable(py: Python<'_>, fd: i32, seconds: f64, yielding: bool) -> bool {
    let window = crate::seconds(seconds).min(Duration::from_secs(1));
    let spin = if yielding { Spin::Yielding } else { Spin::Busy };
    py.detach(|| readable_soon(fd, window, spin))
}

/// `seconds` from Python as a duration: none if it is not positive (or NaN), the longest there
/// is if it is too long for one (no panic on a hostile or careless bound).
pub(crate) fn seconds(seconds: f64) -> Duration {
    if seconds > 0.0 {
        Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)
    } else {
        Duration::ZERO
    }
}

/// The CPU the calling thread runs on now, or None: `workers.WorkerProcess` starts a new worker
/// away from it.
#[pyfunction]
fn current_cpu() -> Option<usize> {
    codemode_spin::current_cpu()
}

#[pymodule]
fn _engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Outcome>()?;
    m.add_class::<Limits>()?;
    m.add_class::<Catalog>()?;
    m.add_class::<semantic::SemanticModel>()?;
    m.add_class::<frames::FrameReader>()?;
    m.add_function(wrap_pyfunction!(spin_readable, m)?)?;
    m.add_function(wrap_pyfunction!(current_cpu, m)?)?;
    m.add("EngineInitError", m.py().get_type::<errors::EngineInitError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PRELUDE_HASH", format!("{:016x}", codemode_engine::prelude_hash()))?;
    m.add("YIELD_TOOL", codemode_engine::YIELD_TOOL)?;
    m.add("MCP_TOOL", codemode_engine::MCP_TOOL)?;
    m.add("NAMESPACE_TOOL", codemode_engine::NAMESPACE_TOOL)?;
    m.add("OUTPUT_TOOL", codemode_engine::OUTPUT_TOOL)?;
    m.add("MODELS_TOOL", codemode_engine::MODELS_TOOL)?;
    m.add("AGENTS_TOOL", codemode_engine::AGENTS_TOOL)?;
    m.add("DEFAULT_LIMITS", Limits::from(InnerLimits::default()))?;
    m.add("CALL_METHODS", pyo3::types::PyTuple::new(m.py(), CallMethod::ALL.map(CallMethod::as_str))?)?;
    m.add("MAX_NESTING", codemode_engine::nesting::MAX_NESTING)?;
    m.add("MAX_VALUE_DEPTH", codemode_engine::limits::MAX_VALUE_DEPTH)?;
    m.add("MAX_REPORT_BYTES", codemode_engine::limits::MAX_REPORT_BYTES)?;
    m.add("MAX_BRIDGE_BYTES", InnerLimits::default().max_bridge_bytes)?;
    m.add(
        "__all__",
        [
            "AGENTS_TOOL",
            "CALL_METHODS",
            "DEFAULT_LIMITS",
            "MAX_BRIDGE_BYTES",
            "MAX_NESTING",
            "MAX_REPORT_BYTES",
            "MAX_VALUE_DEPTH",
            "MCP_TOOL",
            "MODELS_TOOL",
            "NAMESPACE_TOOL",
            "OUTPUT_TOOL",
            "PRELUDE_HASH",
            "YIELD_TOOL",
            "Catalog",
            "Engine",
            "EngineInitError",
            "FrameReader",
            "Limits",
            "Outcome",
            "SemanticModel",
            "__version__",
            "current_cpu",
            "spin_readable",
        ],
    )?;
    Ok(())
}
