//! The one place engine errors become Python exceptions.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::PyErr;

create_exception!(
    _engine,
    EngineInitError,
    PyRuntimeError,
    "A QuickJS runtime could not be built (the host reports runtime_unavailable)."
);

pub fn init_error(e: codemode_engine::EngineError) -> PyErr {
    EngineInitError::new_err(e.0)
}
