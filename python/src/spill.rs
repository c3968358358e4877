//! `forebay.SpillArea`'s Rust half, and the pieces both spill bindings share (a location
//! Python can free, a round as Python hands it over).

use arrow_array::Array;
use arrow_pyarrow::ToPyArrow;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{detached_py, spill_err, SpillError};

/// Spill directories and their I/O threads (the Rust half of `forebay.SpillArea`).
/// Python hands buffers over as bytes-like objects, copied once into Rust at this boundary;
/// the spill path itself copies nothing (see forebay-spill's tests).
#[pyclass(module = "forebay._forebay", frozen)]
struct RsSpillArea {
    area: forebay_spill::SpillArea,
}

/// A spill location held for Python until `free()` (or garbage collection) releases it.
pub(crate) struct FreeableLocation<T: Clone>(std::sync::Mutex<Option<T>>);

impl<T: Clone> FreeableLocation<T> {
    pub(crate) fn new(location: T) -> Self {
        FreeableLocation(std::sync::Mutex::new(Some(location)))
    }
    pub(crate) fn get(&self) -> PyResult<T> {
        self.0
            .lock()
            .map_err(|_| SpillError::new_err("location poisoned"))?
            .clone()
            .ok_or_else(|| SpillError::new_err("spilled object was already freed"))
    }
    pub(crate) fn free(&self) {
        if let Ok(mut guard) = self.0.lock() {
            *guard = None;
        }
    }
}

/// A spill round as Python hands it over: `(id, [bytes-like, ...])` per object.
pub(crate) fn spill_objects(objects: Vec<(u64, Vec<Vec<u8>>)>) -> Vec<forebay_spill::SpillObject> {
    objects
        .into_iter()
        .map(|(id, buffers)| forebay_spill::SpillObject {
            id,
            buffers: buffers.into_iter().map(bytes::Bytes::from).collect(),
        })
        .collect()
}

/// Where one spilled object lives; `free()` (or garbage collection) releases it.
#[pyclass(module = "forebay._forebay", frozen)]
struct RsSpillLocation {
    location: FreeableLocation<forebay_spill::SpillLocation>,
}

impl RsSpillLocation {
    fn get(&self) -> PyResult<forebay_spill::SpillLocation> {
        self.location.get()
    }
}

#[pymethods]
impl RsSpillLocation {
    fn path(&self) -> PyResult<String> {
        Ok(self.get()?.path().display().to_string())
    }
    fn offset(&self) -> PyResult<u64> {
        Ok(self.get()?.offset())
    }
    fn object_id(&self) -> PyResult<u64> {
        Ok(self.get()?.object_id())
    }
    fn buffer_lens(&self) -> PyResult<Vec<u64>> {
        Ok(self.get()?.buffer_lens().to_vec())
    }
    fn free(&self) {
        self.location.free()
    }
}

#[pymethods]
impl RsSpillArea {
    #[new]
    #[pyo3(signature = (directories, sync, io_threads, queue_depth, most_free_space))]
    fn new(
        directories: Vec<String>,
        sync: &str,
        io_threads: usize,
        queue_depth: usize,
        most_free_space: bool,
    ) -> PyResult<Self> {
        use forebay_spill::{DirectoryChoice, SpillConfig, SyncPolicy};
        let sync = match sync {
            "none" => SyncPolicy::None,
            "file" => SyncPolicy::PerFile,
            "object" => SyncPolicy::PerObject,
            other => {
                return Err(SpillError::new_err(format!(
                    "sync must be 'none', 'file' or 'object', not {other:?}"
                )))
            }
        };
        let config = SpillConfig::new(directories)
            .with_sync(sync)
            .with_io_threads(io_threads)
            .with_queue_depth(queue_depth)
            .with_directory_choice(if most_free_space {
                DirectoryChoice::MostFreeSpace
            } else {
                DirectoryChoice::RoundRobin
            });
        Ok(RsSpillArea {
            area: forebay_spill::SpillArea::open(config).map_err(spill_err)?,
        })
    }

    /// Spill one round: `objects` is a list of `(id, [bytes-like, ...])`.
    fn spill(
        &self,
        py: Python<'_>,
        objects: Vec<(u64, Vec<Vec<u8>>)>,
    ) -> PyResult<Vec<RsSpillLocation>> {
        let objects = spill_objects(objects);
        let locations = detached_py(py, || self.area.spill(objects).map_err(spill_err))?;
        Ok(locations
            .into_iter()
            .map(|l| RsSpillLocation {
                location: FreeableLocation::new(l),
            })
            .collect())
    }

    /// Restore with preadv into fresh buffers; returns a list of `bytes`.
    fn restore<'py>(
        &self,
        py: Python<'py>,
        location: &RsSpillLocation,
    ) -> PyResult<Vec<Bound<'py, pyo3::types::PyBytes>>> {
        let loc = location.get()?;
        let buffers = detached_py(py, || self.area.restore(&loc).map_err(spill_err))?;
        Ok(buffers
            .iter()
            .map(|b| pyo3::types::PyBytes::new(py, b))
            .collect())
    }

    /// Map read-only and verify; returns each buffer as a pyarrow UInt8Array over the mapping.
    fn restore_mapped<'py>(
        &self,
        py: Python<'py>,
        location: &RsSpillLocation,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let loc = location.get()?;
        let mapped = detached_py(py, || self.area.map(&loc).map_err(spill_err))?;
        mapped
            .buffers()
            .into_iter()
            .map(|b| {
                let len = b.len();
                let buffer = arrow_buffer::Buffer::from(b);
                let array = arrow_array::UInt8Array::new(
                    arrow_buffer::ScalarBuffer::new(buffer, 0, len),
                    None,
                );
                array.to_data().to_pyarrow(py)
            })
            .collect()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.area.stats();
        let d = PyDict::new(py);
        d.set_item("rounds", s.rounds)?;
        d.set_item("failed_rounds", s.failed_rounds)?;
        d.set_item("objects_spilled", s.objects_spilled)?;
        d.set_item("bytes_spilled", s.bytes_spilled)?;
        d.set_item("files_created", s.files_created)?;
        d.set_item("files_deleted", s.files_deleted)?;
        d.set_item("stale_files_removed", s.stale_files_removed)?;
        d.set_item("objects_restored", s.objects_restored)?;
        d.set_item("bytes_restored", s.bytes_restored)?;
        Ok(d)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RsSpillArea>()?;
    m.add_class::<RsSpillLocation>()?;
    Ok(())
}
