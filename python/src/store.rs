//! Glue for `forebay.ObjectStore`: buffers in and out through the Python buffer protocol
//! (one copy on put, none on get), Arrow through the C data interface, errors mapped to
//! `forebay.StoreError` and its subclasses. The Python-level typing (bytes, ndarray, Arrow
//! flavours) lives in `forebay/_store.py`.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use arrow_array::RecordBatch;
use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use arrow_schema::Schema;
use forebay_store::{Format, ObjectId, ObjectStore, ObjectWriter, PinnedObject, StoreConfig};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::errors::{detached_py, store_err, StoreError};

/// A contiguous byte view of any object exporting the buffer protocol, held for the
/// duration of one call.
struct ContiguousBytes {
    view: ffi::Py_buffer,
}

impl ContiguousBytes {
    fn get(obj: &Bound<'_, PyAny>) -> PyResult<ContiguousBytes> {
        // SAFETY: a zeroed Py_buffer is the documented initial state; PyObject_GetBuffer
        // fills it or fails (returning -1 with an exception set).
        let mut view: ffi::Py_buffer = unsafe { std::mem::zeroed() };
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut view, ffi::PyBUF_SIMPLE) };
        if rc != 0 {
            return Err(PyErr::take(obj.py()).unwrap_or_else(|| {
                PyBufferError::new_err("object does not export a contiguous buffer")
            }));
        }
        Ok(ContiguousBytes { view })
    }

    /// The bytes. Valid while `self` lives: the exporter may not resize or free a buffer
    /// while a view of it is held.
    fn as_slice(&self) -> &[u8] {
        if self.view.len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: PyBUF_SIMPLE gives `len` contiguous bytes at `buf`, kept alive and in
        // place until PyBuffer_Release.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.view.len as usize) }
    }
}

// SAFETY: the view is plain memory held by the exporter until release; reading it from
// another thread while the GIL is released is what the buffer protocol allows (the
// exporter cannot change the buffer's size or address while exported).
unsafe impl Send for ContiguousBytes {}
unsafe impl Sync for ContiguousBytes {}

impl Drop for ContiguousBytes {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer; releasing needs
        // the GIL, which every drop site holds (values are dropped after `detach` returns).
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut self.view) });
    }
}

/// Fill a `Py_buffer` describing `len` bytes at `buf` as a 1-d array of unsigned bytes,
/// owned by `owner` (a new reference the view keeps until it is released).
///
/// # Safety
/// `view` must be the non-null Py_buffer CPython passed to `__getbuffer__`, and the bytes
/// must stay valid (and, if writable, exclusively ours) while `owner` is alive.
unsafe fn fill_byte_view(
    view: *mut ffi::Py_buffer,
    owner: *mut ffi::PyObject,
    buf: *mut u8,
    len: usize,
    readonly: bool,
    flags: c_int,
) {
    // SAFETY: the caller's contract: `view` is valid for writes.
    unsafe {
        (*view).obj = owner;
        (*view).buf = buf as *mut c_void;
        (*view).len = len as isize;
        (*view).readonly = readonly as c_int;
        (*view).itemsize = 1;
        (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
            c"B".as_ptr() as *mut _
        } else {
            ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
            &mut (*view).len
        } else {
            ptr::null_mut()
        };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
            &mut (*view).itemsize
        } else {
            ptr::null_mut()
        };
        (*view).suboffsets = ptr::null_mut();
        (*view).internal = ptr::null_mut();
    }
}

/// A pinned object's data, exported read-only through the buffer protocol; the pin lives
/// as long as this object (and so as long as any memoryview or ndarray over it).
#[pyclass(module = "forebay._forebay", frozen)]
pub struct PinnedBuffer {
    object: PinnedObject,
}

#[pymethods]
impl PinnedBuffer {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("null view"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("objects in the store are read-only"));
        }
        let data = slf.get().object.data();
        let (buf, len) = (data.as_ptr(), data.len());
        // SAFETY: `view` is CPython's (checked non-null); the data stays pinned and
        // immutable while the view holds its new reference to `slf`.
        unsafe {
            fill_byte_view(
                view,
                slf.into_any().into_ptr(),
                buf as *mut u8,
                len,
                true,
                flags,
            )
        };
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.object.data().len()
    }
}

/// An object being written in place: a writable buffer, then `seal()`.
#[pyclass(module = "forebay._forebay", frozen)]
pub struct RsObjectWriter {
    writer: Mutex<Option<ObjectWriter>>,
    /// Live exported views; sealing waits for none (a view must not outlive writability).
    exports: AtomicUsize,
}

impl RsObjectWriter {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ObjectWriter>> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl RsObjectWriter {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("null view"));
        }
        let (buf, len) = {
            let mut guard = slf.get().lock();
            let Some(w) = guard.as_mut() else {
                return Err(PyBufferError::new_err("object already sealed or aborted"));
            };
            let data = w.data_mut();
            (data.as_mut_ptr(), data.len())
        };
        slf.get().exports.fetch_add(1, Ordering::SeqCst);
        // SAFETY: as in PinnedBuffer::__getbuffer__; the region belongs to this writer
        // until seal/abort, which refuse while views are exported.
        unsafe { fill_byte_view(view, slf.into_any().into_ptr(), buf, len, false, flags) };
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::SeqCst);
    }

    /// Seal: the object becomes immutable and visible. Returns its id.
    fn seal(&self, py: Python<'_>) -> PyResult<u128> {
        if self.exports.load(Ordering::SeqCst) > 0 {
            return Err(PyBufferError::new_err(
                "release every memoryview of the object (e.g. `with memoryview(w) as m:`) before sealing",
            ));
        }
        let w = self
            .lock()
            .take()
            .ok_or_else(|| StoreError::new_err("object already sealed or aborted"))?;
        detached_py(py, || w.seal().map(|id| id.0).map_err(store_err))
    }

    /// Give the memory back without sealing.
    fn abort(&self) -> PyResult<()> {
        if self.exports.load(Ordering::SeqCst) > 0 {
            return Err(PyBufferError::new_err(
                "release every memoryview of the object before aborting",
            ));
        }
        self.lock().take();
        Ok(())
    }

    #[getter]
    fn id(&self) -> Option<u128> {
        self.lock().as_ref().map(|w| w.id().0)
    }

    #[getter]
    fn size(&self) -> Option<usize> {
        self.lock().as_ref().map(|w| w.header().data_len)
    }
}

#[pyclass(module = "forebay._forebay", frozen)]
pub struct RsObjectStore {
    store: ObjectStore,
}

fn id_of(id: u128) -> ObjectId {
    ObjectId(id)
}

#[pymethods]
impl RsObjectStore {
    #[new]
    #[pyo3(signature = (path, capacity, spill_dirs, spill, put_timeout, prefault))]
    fn new(
        py: Python<'_>,
        path: Option<String>,
        capacity: usize,
        spill_dirs: Option<Vec<String>>,
        spill: bool,
        put_timeout: f64,
        prefault: bool,
    ) -> PyResult<Self> {
        if !(put_timeout >= 0.0 && put_timeout.is_finite()) {
            return Err(PyValueError::new_err(
                "put_timeout must be a finite number of seconds >= 0",
            ));
        }
        let mut config = StoreConfig::new(capacity)
            .with_put_timeout(std::time::Duration::from_secs_f64(put_timeout))
            .with_prefault(prefault);
        if let Some(p) = path {
            config = config.with_dir(p);
        }
        if let Some(dirs) = spill_dirs {
            config = config.with_spill_dirs(dirs);
        }
        if !spill {
            config = config.without_spill();
        }
        let store = detached_py(py, || ObjectStore::new(config).map_err(store_err))?;
        Ok(RsObjectStore { store })
    }

    #[staticmethod]
    fn attach(py: Python<'_>, path: String) -> PyResult<Self> {
        let store = detached_py(py, || ObjectStore::attach(&path).map_err(store_err))?;
        Ok(RsObjectStore { store })
    }

    #[getter]
    fn path(&self) -> String {
        self.store.path().display().to_string()
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.store.capacity()
    }

    #[getter]
    fn is_owner(&self) -> bool {
        self.store.is_owner()
    }

    #[getter]
    fn owner_pid(&self) -> u32 {
        self.store.owner_pid()
    }

    #[getter]
    fn nonce(&self) -> u64 {
        self.store.nonce()
    }

    /// Copy bytes-like objects into the store as one object, their bytes one after the
    /// other. The GIL is released: a put may wait for room, and the views whose release
    /// would make room may belong to other Python threads.
    fn put_buffers(
        &self,
        py: Python<'_>,
        meta: &[u8],
        parts: &Bound<'_, PyList>,
    ) -> PyResult<u128> {
        let views: Vec<ContiguousBytes> = parts
            .iter()
            .map(|part| ContiguousBytes::get(&part))
            .collect::<PyResult<_>>()?;
        let slices: Vec<&[u8]> = views.iter().map(ContiguousBytes::as_slice).collect();
        detached_py(py, || {
            self.store
                .put_bytes(meta, &slices)
                .map(|id| id.0)
                .map_err(store_err)
        })
    }

    /// Put record batches of one schema as one Arrow object (GIL released, as above).
    fn put_arrow(
        &self,
        py: Python<'_>,
        meta: &[u8],
        schema: &Bound<'_, PyAny>,
        batches: &Bound<'_, PyList>,
    ) -> PyResult<u128> {
        let schema = Schema::from_pyarrow_bound(schema)?;
        let batches: Vec<RecordBatch> = batches
            .iter()
            .map(|b| RecordBatch::from_pyarrow_bound(&b))
            .collect::<PyResult<_>>()?;
        detached_py(py, || {
            self.store
                .put_arrow(&schema, &batches, meta)
                .map(|id| id.0)
                .map_err(store_err)
        })
    }

    /// Allocate an object to be written in place.
    fn create(&self, py: Python<'_>, size: usize, meta: &[u8]) -> PyResult<RsObjectWriter> {
        let writer = detached_py(py, || {
            self.store
                .create_with(Format::Bytes, meta, size)
                .map_err(store_err)
        })?;
        Ok(RsObjectWriter {
            writer: Mutex::new(Some(writer)),
            exports: AtomicUsize::new(0),
        })
    }

    /// `(format, meta, payload)`: payload is a PinnedBuffer for bytes, or
    /// `(schema, [RecordBatch])` for Arrow objects (buffers in the mapping).
    fn get<'py>(
        &self,
        py: Python<'py>,
        id: u128,
    ) -> PyResult<(u8, Bound<'py, PyBytes>, Bound<'py, PyAny>)> {
        // GIL released: the object may have to be restored from disk, or wait for another
        // thread's restore of it.
        let (object, arrow) = detached_py(py, || {
            let object = self.store.get(id_of(id)).map_err(store_err)?;
            let arrow = match object.format() {
                Format::Bytes => None,
                Format::ArrowIpc => Some(object.record_batches().map_err(store_err)?),
            };
            Ok((object, arrow))
        })?;
        let meta = PyBytes::new(py, object.meta());
        match arrow {
            None => Ok((0, meta, Bound::new(py, PinnedBuffer { object })?.into_any())),
            Some((schema, batches)) => {
                let schema = schema.as_ref().to_pyarrow(py)?;
                let list = PyList::empty(py);
                for b in batches {
                    list.append(b.to_pyarrow(py)?)?;
                }
                Ok((1, meta, (schema, list).into_pyobject(py)?.into_any()))
            }
        }
    }

    fn delete(&self, py: Python<'_>, id: u128) -> PyResult<bool> {
        detached_py(py, || self.store.delete(id_of(id)).map_err(store_err))
    }

    fn contains(&self, py: Python<'_>, id: u128) -> PyResult<bool> {
        detached_py(py, || self.store.contains(id_of(id)).map_err(store_err))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = detached_py(py, || self.store.stats().map_err(store_err))?;
        let d = PyDict::new(py);
        for (k, v) in s.fields() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RsObjectStore>()?;
    m.add_class::<RsObjectWriter>()?;
    m.add_class::<PinnedBuffer>()?;
    Ok(())
}
