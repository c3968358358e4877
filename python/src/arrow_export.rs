//! Handing a map function's batches to Python: one C Data Interface export a batch, the
//! `pyarrow.Schema` made once.
//!
//! arrow-pyarrow's `RecordBatch::to_pyarrow` wraps each batch in a one-batch C stream (its
//! workaround for apache/arrow#37669: pyarrow ignored the offset of an imported struct
//! array), so every batch paid a schema import, a stream reader and a read (~25 µs of CPU
//! of the ~50 µs the engine spent per call on 1,000-row batches). A batch here is exported
//! as a struct array whose own offset is always 0 (its columns carry their offsets, which
//! pyarrow honours) and imported with `pyarrow.RecordBatch._import_from_c(array, schema)`,
//! the schema being a `pyarrow.Schema` kept from the batch before.
//!
//! ```text
//!  RecordBatch ──StructArray (offset 0)──► FFI_ArrowArray ──┐
//!  SchemaRef ──(once, while it does not change)──► pyarrow.Schema ──┴─► RecordBatch._import_from_c
//! ```

use arrow_array::ffi::FFI_ArrowArray;
use arrow_array::{Array, RecordBatch, StructArray};
use arrow_pyarrow::ToPyArrow;
use arrow_schema::SchemaRef;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Exports batches to `pyarrow.RecordBatch`, keeping the last schema it converted.
#[derive(Default)]
pub(crate) struct BatchExporter {
    schema: Option<(SchemaRef, Py<PyAny>)>,
}

impl BatchExporter {
    /// `batch` as a `pyarrow.RecordBatch` over the same buffers (no copy).
    pub(crate) fn export<'py>(
        &mut self,
        py: Python<'py>,
        batch: &RecordBatch,
    ) -> PyResult<Bound<'py, PyAny>> {
        if batch.num_columns() == 0 {
            // A struct array without children cannot say how many rows it has.
            return batch.to_pyarrow(py);
        }
        let schema = self.pyarrow_schema(py, batch.schema())?;
        let array = StructArray::from(batch.clone());
        debug_assert_eq!(
            array.offset(),
            0,
            "a batch's struct array starts at its first row"
        );
        let exported = FFI_ArrowArray::new(&array.to_data());
        // `_import_from_c` moves the array out of `exported` (it marks it released), so
        // dropping `exported` afterwards frees nothing twice; on an error before the move,
        // dropping it releases the array.
        record_batch_class(py)?.call_method1(
            pyo3::intern!(py, "_import_from_c"),
            (&raw const exported as usize, schema),
        )
    }

    fn pyarrow_schema<'py>(
        &mut self,
        py: Python<'py>,
        schema: SchemaRef,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some((kept, converted)) = &self.schema {
            if *kept == schema {
                return Ok(converted.bind(py).clone());
            }
        }
        let converted = schema.as_ref().to_pyarrow(py)?;
        self.schema = Some((schema, converted.clone().unbind()));
        Ok(converted)
    }
}

fn record_batch_class(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    CLASS.import(py, "pyarrow", "RecordBatch")
}
