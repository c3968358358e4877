//! `forebay.RemoteSpillTarget`'s Rust half: spill rounds to an object store URI
//! (`s3://bucket/prefix`, `gs://…`, `file:///…`, `memory://…`) through forebay-spill's
//! remote target. Like `SpillArea`, Python hands buffers over as bytes-like objects (copied
//! once into Rust at this boundary); the upload itself sends slices of them.

use std::collections::HashMap;
use std::time::Duration;

use forebay_spill::{RemoteSpillConfig, RemoteSpillLocation, RemoteSpillTarget};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::args::string_map;
use crate::errors::{detached_py, spill_err, SpillError};
use crate::spill::{spill_objects, FreeableLocation};

#[pyclass(module = "forebay._forebay", frozen)]
struct RsRemoteSpillTarget {
    target: RemoteSpillTarget,
}

/// Where one remotely spilled object lives; `free()` (or garbage collection) releases it.
#[pyclass(module = "forebay._forebay", frozen)]
struct RsRemoteSpillLocation {
    location: FreeableLocation<RemoteSpillLocation>,
}

impl RsRemoteSpillLocation {
    fn get(&self) -> PyResult<RemoteSpillLocation> {
        self.location.get()
    }
}

#[pymethods]
impl RsRemoteSpillLocation {
    fn uri(&self) -> PyResult<String> {
        Ok(self.get()?.uri())
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
impl RsRemoteSpillTarget {
    #[new]
    #[pyo3(signature = (uri, storage_options, part_size, parts_in_flight, rounds_in_flight))]
    fn new(
        py: Python<'_>,
        uri: String,
        #[pyo3(from_py_with = string_map)] storage_options: HashMap<String, String>,
        part_size: usize,
        parts_in_flight: usize,
        rounds_in_flight: usize,
    ) -> PyResult<Self> {
        let target = detached_py(py, move || {
            let (store, path, shown) =
                forebay_parquet::source::open_location(&uri, &storage_options)
                    .map_err(|e| SpillError::new_err(format!("remote spill target: {e}")))?;
            let display_prefix = shown
                .strip_suffix(path.as_ref())
                .unwrap_or(shown.as_str())
                .to_string();
            let config = RemoteSpillConfig::default()
                .with_part_size(part_size)
                .with_parts_in_flight(parts_in_flight)
                .with_rounds_in_flight(rounds_in_flight);
            RemoteSpillTarget::open(store, path.as_ref(), &display_prefix, config)
                .map_err(spill_err)
        })?;
        Ok(RsRemoteSpillTarget { target })
    }

    /// Upload one round: `objects` is a list of `(id, [bytes-like, ...])`.
    fn spill(
        &self,
        py: Python<'_>,
        objects: Vec<(u64, Vec<Vec<u8>>)>,
    ) -> PyResult<Vec<RsRemoteSpillLocation>> {
        let objects = spill_objects(objects);
        let locations = detached_py(py, || self.target.spill(objects).map_err(spill_err))?;
        Ok(locations
            .into_iter()
            .map(|l| RsRemoteSpillLocation {
                location: FreeableLocation::new(l),
            })
            .collect())
    }

    /// Ranged GET, checksum verified; returns a list of `bytes`.
    fn restore<'py>(
        &self,
        py: Python<'py>,
        location: &RsRemoteSpillLocation,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let loc = location.get()?;
        let buffers = detached_py(py, || self.target.restore(&loc).map_err(spill_err))?;
        Ok(buffers.iter().map(|b| PyBytes::new(py, b)).collect())
    }

    fn root_uri(&self) -> String {
        self.target.root_uri()
    }

    /// Wait (up to `timeout` seconds) until freed rounds' remote objects are deleted.
    fn wait_for_deletes(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let timeout = Duration::try_from_secs_f64(timeout.max(0.0))
            .map_err(|e| SpillError::new_err(format!("bad timeout: {e}")))?;
        detached_py(py, || Ok(self.target.wait_for_deletes(timeout)))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.target.stats();
        let d = PyDict::new(py);
        for (name, value) in [
            ("rounds", s.rounds),
            ("failed_rounds", s.failed_rounds),
            ("objects_spilled", s.objects_spilled),
            ("bytes_spilled", s.bytes_spilled),
            ("single_puts", s.single_puts),
            ("multipart_uploads", s.multipart_uploads),
            ("parts_uploaded", s.parts_uploaded),
            ("aborted_uploads", s.aborted_uploads),
            ("remote_objects_deleted", s.remote_objects_deleted),
            ("stale_objects_removed", s.stale_objects_removed),
            ("objects_restored", s.objects_restored),
            ("bytes_restored", s.bytes_restored),
            ("get_requests", s.get_requests),
        ] {
            d.set_item(name, value)?;
        }
        Ok(d)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RsRemoteSpillTarget>()?;
    m.add_class::<RsRemoteSpillLocation>()?;
    Ok(())
}
