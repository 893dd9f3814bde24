//! `codemode._engine.SemanticModel`: the search model the host loads once and ships as a pack.

use std::sync::Arc;

use codemode_engine::semantic::Model;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A static token-embedding model (tokenizer + int8 token table), shared by the catalogs built with it.
#[pyclass(frozen, module = "codemode._engine")]
pub struct SemanticModel {
    pub inner: Arc<Model>,
}

#[pymethods]
impl SemanticModel {
    /// Loads a pack written by `pack()` (what a worker receives); a corrupt pack is a ValueError.
    #[new]
    fn new(py: Python<'_>, pack: &[u8]) -> PyResult<Self> {
        let model = py.detach(|| Model::from_pack(pack));
        model.map(|m| SemanticModel { inner: Arc::new(m) }).map_err(|e| PyValueError::new_err(e.0))
    }

    /// Builds the model from WordLlama's tokenizer JSON and safetensors weights (~0.1 s, GIL released).
    #[staticmethod]
    fn from_wordllama(py: Python<'_>, tokenizer_json: &str, weights: &[u8], name: &str) -> PyResult<Self> {
        let model = py.detach(|| Model::from_wordllama(tokenizer_json, weights, name));
        model.map(|m| SemanticModel { inner: Arc::new(m) }).map_err(|e| PyValueError::new_err(e.0))
    }

    /// The bytes a worker loads with `SemanticModel(pack)`.
    fn pack<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let bytes = py.detach(|| self.inner.to_pack());
        PyBytes::new(py, &bytes)
    }

    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// Token ids of `text`, as the search tokenises it (no `<s>`).
    fn token_ids(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        self.inner.tokenizer().encode(text, &mut ids);
        ids
    }

    /// The unit embedding of `text` the search compares, or None when it has no tokens.
    fn embed(&self, text: &str) -> Option<Vec<f32>> {
        self.inner.embed(text)
    }
}
