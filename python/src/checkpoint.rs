//! `forebay.CheckpointFilter`'s Rust half: a shared checkpoint index (read lock for probes,
//! write lock for inserts and writes, always taken with the GIL released), and the parallel
//! filter of a dataset's scan as a Python iterator.

use std::collections::HashMap;

use arrow_array::{make_array, Array, RecordBatch};
use arrow_data::ArrayData;
use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use arrow_schema::DataType;
use forebay_checkpoint::{
    filter_in_parallel, CheckpointIndex, FilteredBatches, SharedCheckpointIndex,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::string_map;
use crate::dataset::RsDataset;
use crate::errors::{checkpoint_err, detached_py, CheckpointError};

/// A checkpoint index (the Rust half of `forebay.CheckpointFilter`). Probes share a read
/// lock, so many Python threads can filter at once; inserts and writes take the write lock.
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsCheckpointIndex {
    index: SharedCheckpointIndex,
}

fn array_from_py(obj: &Bound<'_, PyAny>) -> PyResult<arrow_array::ArrayRef> {
    Ok(make_array(ArrayData::from_pyarrow_bound(obj)?))
}

impl RsCheckpointIndex {
    /// The index itself, shared with the engine's checkpoint filter stage.
    pub(crate) fn shared(&self) -> SharedCheckpointIndex {
        self.index.clone()
    }

    fn read(&self) -> PyResult<std::sync::RwLockReadGuard<'_, CheckpointIndex>> {
        self.index
            .read()
            .map_err(|_| CheckpointError::new_err("checkpoint index poisoned by an earlier panic"))
    }
    fn write_lock(&self) -> PyResult<std::sync::RwLockWriteGuard<'_, CheckpointIndex>> {
        self.index
            .write()
            .map_err(|_| CheckpointError::new_err("checkpoint index poisoned by an earlier panic"))
    }
}

#[pymethods]
impl RsCheckpointIndex {
    #[new]
    #[pyo3(signature = (id_type, num_shards, id_column, num_threads=None))]
    fn new(
        id_type: &Bound<'_, PyAny>,
        num_shards: usize,
        id_column: String,
        num_threads: Option<usize>,
    ) -> PyResult<Self> {
        let id_type = DataType::from_pyarrow_bound(id_type)?;
        let mut index =
            CheckpointIndex::new(id_type, id_column, num_shards).map_err(checkpoint_err)?;
        if let Some(n) = num_threads {
            index = index.with_threads(n);
        }
        Ok(RsCheckpointIndex {
            index: std::sync::Arc::new(std::sync::RwLock::new(index)),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (path, id_column, num_shards=None, shards=None, storage_options=HashMap::new(), num_threads=None))]
    fn load(
        py: Python<'_>,
        path: String,
        id_column: String,
        num_shards: Option<usize>,
        shards: Option<Vec<usize>>,
        #[pyo3(from_py_with = string_map)] storage_options: HashMap<String, String>,
        num_threads: Option<usize>,
    ) -> PyResult<Self> {
        let mut loader =
            CheckpointIndex::loader(path, id_column).with_storage_options(storage_options);
        if let Some(n) = num_shards {
            loader = loader.with_num_shards(n);
        }
        if let Some(s) = shards {
            loader = loader.with_shards(s);
        }
        if let Some(n) = num_threads {
            loader = loader.with_threads(n);
        }
        let index = detached_py(py, move || loader.load().map_err(checkpoint_err))?;
        Ok(RsCheckpointIndex {
            index: std::sync::Arc::new(std::sync::RwLock::new(index)),
        })
    }

    fn insert(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let ids = array_from_py(ids)?;
        // Locks are taken with the GIL released, so a thread waiting for the lock never
        // holds the GIL that the lock's holder needs to return.
        detached_py(py, || {
            self.write_lock()?
                .insert(ids.as_ref())
                .map_err(checkpoint_err)
        })
    }

    fn contains<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = array_from_py(ids)?;
        let hits = detached_py(py, || {
            self.read()?.contains(ids.as_ref()).map_err(checkpoint_err)
        })?;
        hits.to_data().to_pyarrow(py)
    }

    /// Filter one batch; None when no row was removed (the caller keeps its input).
    fn filter_batch<'py>(
        &self,
        py: Python<'py>,
        batch: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let batch = RecordBatch::from_pyarrow_bound(batch)?;
        let out = detached_py(py, || {
            self.read()?
                .filter_or_unchanged(&batch)
                .map_err(checkpoint_err)
        })?;
        out.map(|b| b.to_pyarrow(py)).transpose()
    }

    /// Filter a dataset's scan on several threads, in scan order.
    #[pyo3(signature = (dataset, num_threads=None))]
    fn filter_scan(
        &self,
        dataset: &RsDataset,
        num_threads: Option<usize>,
    ) -> PyResult<RsFilteredIter> {
        let threads = match num_threads {
            Some(n) => n,
            None => self.read()?.threads(),
        };
        let input = dataset
            .dataset
            .scan()
            .blocking_iter()
            .map(|item| item.map(|b| b.batch));
        Ok(RsFilteredIter {
            batches: std::sync::Mutex::new(Some(filter_in_parallel(
                self.index.clone(),
                input,
                threads,
            ))),
        })
    }

    /// Filter many batches in parallel; None for each batch left unchanged.
    fn filter_batches<'py>(
        &self,
        py: Python<'py>,
        batches: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let batches = batches
            .iter()
            .map(RecordBatch::from_pyarrow_bound)
            .collect::<PyResult<Vec<_>>>()?;
        let out = detached_py(py, || {
            self.read()?.filter_many(&batches).map_err(checkpoint_err)
        })?;
        out.into_iter()
            .map(|b| b.map(|b| b.to_pyarrow(py)).transpose())
            .collect()
    }

    fn merge(&self, py: Python<'_>, other: &RsCheckpointIndex) -> PyResult<()> {
        if std::ptr::eq(self, other) {
            return Ok(()); // merging an index into itself changes nothing
        }
        detached_py(py, || {
            // Lock in address order so `a.merge(b)` and `b.merge(a)` cannot deadlock.
            if (self as *const Self) < (other as *const Self) {
                let mut ours = self.write_lock()?;
                let theirs = other.read()?;
                ours.merge(&theirs).map_err(checkpoint_err)
            } else {
                let theirs = other.read()?;
                let mut ours = self.write_lock()?;
                ours.merge(&theirs).map_err(checkpoint_err)
            }
        })
    }

    #[pyo3(signature = (path, storage_options=HashMap::new()))]
    fn write<'py>(
        &self,
        py: Python<'py>,
        path: String,
        #[pyo3(from_py_with = string_map)] storage_options: HashMap<String, String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let options = storage_options;
        let summary = detached_py(py, || {
            self.write_lock()?
                .write(&path, &options)
                .map_err(checkpoint_err)
        })?;
        let d = PyDict::new(py);
        d.set_item("files", summary.files)?;
        d.set_item("ids", summary.ids)?;
        Ok(d)
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.read()?.len())
    }

    fn memory_bytes(&self) -> PyResult<usize> {
        Ok(self.read()?.memory_bytes())
    }

    fn num_shards(&self) -> PyResult<usize> {
        Ok(self.read()?.num_shards())
    }

    fn loaded_shards(&self) -> PyResult<Vec<usize>> {
        Ok(self.read()?.loaded_shards())
    }

    fn pending_ids(&self) -> PyResult<usize> {
        Ok(self.read()?.pending_ids())
    }

    fn id_column(&self) -> PyResult<String> {
        Ok(self.read()?.id_column().to_string())
    }

    fn id_type<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.read()?.id_type().to_pyarrow(py)
    }

    fn shard_ids<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = array_from_py(ids)?;
        let shards = detached_py(py, || {
            self.read()?.shard_ids(ids.as_ref()).map_err(checkpoint_err)
        })?;
        arrow_array::UInt32Array::from(shards)
            .to_data()
            .to_pyarrow(py)
    }
}

/// Batches of a scan with checkpointed rows removed (the Rust half of
/// `CheckpointFilter.filter(dataset)`).
#[pyclass(module = "forebay._forebay")]
struct RsFilteredIter {
    batches: std::sync::Mutex<Option<FilteredBatches>>,
}

#[pymethods]
impl RsFilteredIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let next = detached_py(py, || {
            let mut guard = self
                .batches
                .lock()
                .map_err(|_| CheckpointError::new_err("filter state poisoned"))?;
            let Some(batches) = guard.as_mut() else {
                return Ok(None);
            };
            match batches.next() {
                None => {
                    *guard = None;
                    Ok(None)
                }
                Some(r) => r.map(Some).map_err(checkpoint_err),
            }
        })?;
        next.map(|b| b.to_pyarrow(py)).transpose()
    }

    fn close(&self) {
        if let Ok(mut guard) = self.batches.lock() {
            *guard = None;
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RsCheckpointIndex>()?;
    m.add_class::<RsFilteredIter>()?;
    Ok(())
}
