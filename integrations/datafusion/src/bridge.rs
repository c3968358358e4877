//! Batches and schemas from forebay's arrow (60) to DataFusion's (59), through the Arrow C
//! data interface: the buffers are handed over, not copied.

use std::sync::Arc;

use arrow_array::{Array, RecordBatch as DfBatch, StructArray};
use arrow_schema::{Schema as DfSchema, SchemaRef as DfSchemaRef};
use datafusion::error::{DataFusionError, Result};
use forebay_parquet::arrow_array as fb_array;
use forebay_parquet::arrow_schema as fb_schema;

fn ffi_error(what: &str, e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::External(format!("forebay -> DataFusion ({what}): {e}").into())
}

/// forebay's schema as DataFusion's.
pub fn schema(schema: &fb_schema::Schema) -> Result<DfSchemaRef> {
    let exported = fb_schema::ffi::FFI_ArrowSchema::try_from(schema)
        .map_err(|e| ffi_error("schema export", e))?;
    // SAFETY: FFI_ArrowSchema is the C data interface's `struct ArrowSchema` (#[repr(C)]) in
    // both arrow versions, and transmute checks the sizes agree. The value moves: its release
    // callback runs once, from the arrow-59 side's Drop.
    let imported = unsafe {
        std::mem::transmute::<fb_schema::ffi::FFI_ArrowSchema, arrow_schema::ffi::FFI_ArrowSchema>(
            exported,
        )
    };
    let schema = DfSchema::try_from(&imported).map_err(|e| ffi_error("schema import", e))?;
    Ok(Arc::new(schema))
}

/// An array of forebay's as an array of DataFusion's (a statistics value).
pub fn array(array: &fb_array::ArrayRef) -> Result<arrow_array::ArrayRef> {
    let (exported, exported_schema) =
        fb_array::ffi::to_ffi(&array.to_data()).map_err(|e| ffi_error("array export", e))?;
    // SAFETY: `struct ArrowArray` and `struct ArrowSchema` of the C data interface
    // (#[repr(C)]) on both sides, sizes checked by transmute; ownership of the buffers moves
    // with the structs and is released once, by the importing side.
    let (imported, imported_schema) = unsafe {
        (
            std::mem::transmute::<fb_array::ffi::FFI_ArrowArray, arrow_array::ffi::FFI_ArrowArray>(
                exported,
            ),
            std::mem::transmute::<
                fb_schema::ffi::FFI_ArrowSchema,
                arrow_schema::ffi::FFI_ArrowSchema,
            >(exported_schema),
        )
    };
    // SAFETY: produced by `to_ffi` just above, describing each other.
    let data = unsafe { arrow_array::ffi::from_ffi(imported, &imported_schema) }
        .map_err(|e| ffi_error("array import", e))?;
    Ok(arrow_array::make_array(data))
}

/// A batch of forebay's as a batch of DataFusion's `schema` (the same columns).
pub fn batch(batch: fb_array::RecordBatch, schema: &DfSchemaRef) -> Result<DfBatch> {
    let rows = batch.num_rows();
    let columns: fb_array::ArrayRef = Arc::new(fb_array::StructArray::from(batch));
    let columns = array(&columns)?;
    let columns = columns
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or_else(|| ffi_error("batch import", "not a struct array"))?;
    if columns.len() != rows {
        return Err(ffi_error("batch import", "row count changed"));
    }
    DfBatch::try_new(schema.clone(), columns.columns().to_vec())
        .map_err(|e| ffi_error("batch import", e))
}
