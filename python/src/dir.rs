//! `forebay._forebay.RsDir`: a directory or object-store prefix, for the few file
//! operations the Python package makes itself (a retry of dead letters keeps a manifest and
//! deletes what it retried), through the same storage layer and options as the engine.

use std::collections::HashMap;

use forebay_io::{Dir, DirError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args::string_map;
use crate::errors::StorageError;

/// A directory (local path or URI) and the files under it.
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsDir {
    dir: Dir,
}

fn dir_err(e: DirError) -> PyErr {
    StorageError::new_err(e.to_string())
}

#[pymethods]
impl RsDir {
    #[new]
    #[pyo3(signature = (location, storage_options))]
    fn new(
        location: &str,
        #[pyo3(from_py_with = string_map)] storage_options: HashMap<String, String>,
    ) -> PyResult<Self> {
        Ok(RsDir {
            dir: Dir::open(location, &storage_options).map_err(dir_err)?,
        })
    }

    /// How messages and readers name `relative` (a path or URI).
    fn shown(&self, relative: &str) -> String {
        self.dir.shown(relative)
    }

    /// Every file under `relative`, at any depth, relative to this directory.
    fn files_under(&self, py: Python<'_>, relative: &str) -> PyResult<Vec<String>> {
        py.detach(|| self.dir.files_under(relative))
            .map_err(dir_err)
    }

    fn exists(&self, py: Python<'_>, relative: &str) -> PyResult<bool> {
        py.detach(|| self.dir.exists(relative)).map_err(dir_err)
    }

    /// The bytes of `relative`, or None when it is not there.
    fn get<'py>(&self, py: Python<'py>, relative: &str) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let bytes = py.detach(|| self.dir.get(relative)).map_err(dir_err)?;
        Ok(bytes.map(|b| PyBytes::new(py, &b)))
    }

    /// Write `relative` whole or not at all (a temp file renamed; one PUT).
    fn put_atomic(&self, py: Python<'_>, relative: &str, data: Vec<u8>) -> PyResult<()> {
        py.detach(|| self.dir.put_atomic(relative, data))
            .map_err(dir_err)
    }

    /// Delete the file `relative` (nothing when it is not there).
    fn delete(&self, py: Python<'_>, relative: &str) -> PyResult<()> {
        py.detach(|| self.dir.delete(relative)).map_err(dir_err)
    }

    /// Delete `relative` and everything under it ("": the directory itself).
    fn delete_tree(&self, py: Python<'_>, relative: &str) -> PyResult<()> {
        py.detach(|| self.dir.delete_tree(relative))
            .map_err(dir_err)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RsDir>()
}
