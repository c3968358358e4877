//! Concatenating batches for re-chunking, cheaply for string and binary views.
//!
//! Arrow's `concat` rebuilds every view of a `Utf8View`/`BinaryView` column one by one
//! (`append_array`); it was most of the cost of exact-size `iter_batches` over TPC-H
//! lineitem (six view columns). A view array is a list of 16-byte views plus data buffers:
//! concatenating two of them only needs the views copied, with the buffer index of each
//! long view (more than 12 bytes) shifted by the number of buffers before it, and the data
//! buffers shared (no string bytes are copied).
//!
//! ```text
//!  a: views [v0 v1]   buffers [A0 A1]        out: views [v0 v1 w0 w1']   buffers [A0 A1 B0]
//!  b: views [w0 w1]   buffers [B0]                 w1' = w1 with buffer index 0 + 2
//! ```
//!
//! Every other type goes through Arrow's `concat`.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::ByteViewType;
use arrow_array::{
    Array, ArrayRef, BinaryViewArray, GenericByteViewArray, RecordBatch, RecordBatchOptions,
    StringViewArray,
};
use arrow_buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, SchemaRef};

/// Concatenate batches of one schema into one batch.
pub(crate) fn concat_batches(
    schema: &SchemaRef,
    parts: &[RecordBatch],
) -> Result<RecordBatch, ArrowError> {
    if parts.len() == 1 {
        return Ok(parts[0].clone());
    }
    for p in parts {
        if p.schema().fields() != schema.fields() {
            return Err(ArrowError::SchemaError(format!(
                "batch schema {:?} differs from {:?}",
                p.schema(),
                schema
            )));
        }
    }
    let rows = parts.iter().map(|p| p.num_rows()).sum();
    let columns = (0..schema.fields().len())
        .map(|i| {
            let arrays: Vec<&dyn Array> = parts.iter().map(|p| p.column(i).as_ref()).collect();
            concat_arrays(&arrays)
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )
}

fn concat_arrays(arrays: &[&dyn Array]) -> Result<ArrayRef, ArrowError> {
    match arrays[0].data_type() {
        DataType::Utf8View => {
            let typed: Vec<&StringViewArray> = arrays.iter().map(|a| a.as_string_view()).collect();
            Ok(Arc::new(concat_views(&typed)))
        }
        DataType::BinaryView => {
            let typed: Vec<&BinaryViewArray> = arrays.iter().map(|a| a.as_binary_view()).collect();
            Ok(Arc::new(concat_views(&typed)))
        }
        _ => arrow_select::concat::concat(arrays),
    }
}

fn concat_views<T: ByteViewType + ?Sized>(
    arrays: &[&GenericByteViewArray<T>],
) -> GenericByteViewArray<T> {
    let len: usize = arrays.iter().map(|a| a.len()).sum();
    let mut views: Vec<u128> = Vec::with_capacity(len);
    let mut buffers: Vec<Buffer> = Vec::new();
    for array in arrays {
        let shift = buffers.len() as u128;
        if shift == 0 {
            views.extend_from_slice(array.views());
        } else {
            views.extend(array.views().iter().map(|&v| {
                // Bits 0..32: length; long views (> 12 bytes) keep the buffer index in bits
                // 64..96. Shifting cannot overflow: the total buffer count fits in u32.
                if (v as u32) > 12 {
                    v + (shift << 64)
                } else {
                    v
                }
            }));
        }
        buffers.extend(array.data_buffers().iter().cloned());
    }
    let nulls = if arrays.iter().any(|a| a.null_count() > 0) {
        let mut bits = arrow_buffer::BooleanBufferBuilder::new(len);
        for array in arrays {
            match array.nulls() {
                Some(n) => bits.append_buffer(n.inner()),
                None => bits.append_n(array.len(), true),
            }
        }
        Some(NullBuffer::new(bits.finish()))
    } else {
        None
    };
    // SAFETY: every view comes from a valid array of the same type: its length and bytes
    // are unchanged, and a long view's buffer index now points at the same buffer in the
    // combined list (its own array's buffers follow those of the arrays before it). The
    // null buffer has one bit per view.
    unsafe {
        GenericByteViewArray::new_unchecked(ScalarBuffer::from(views), Arc::from(buffers), nulls)
    }
}

/// The concatenation as Arrow's own `concat` builds it (for tests).
/// A copy of `batch` that shares no buffer with it: only its rows' values, the bytes of its
/// strings included (a string view array's data buffers are compacted). For rows kept while
/// waiting for more input, which would otherwise pin the whole input batch they were sliced
/// from. Dictionary columns keep their dictionary.
pub(crate) fn compact_batch(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let rows = u32::try_from(batch.num_rows())
        .map_err(|_| ArrowError::ComputeError("too many rows to compact".into()))?;
    take_compact(batch, &arrow_array::UInt32Array::from_iter_values(0..rows))
}

/// `batch`'s rows at `indices`, in buffers of their own (as [`compact_batch`]).
pub(crate) fn take_compact(
    batch: &RecordBatch,
    indices: &arrow_array::UInt32Array,
) -> Result<RecordBatch, ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .map(|column| {
            let taken = arrow_select::take::take(column.as_ref(), indices, None)?;
            Ok(match taken.data_type() {
                DataType::Utf8View => Arc::new(taken.as_string_view().gc()) as ArrayRef,
                DataType::BinaryView => Arc::new(taken.as_binary_view().gc()) as ArrayRef,
                _ => taken,
            })
        })
        .collect::<Result<Vec<_>, ArrowError>>()?;
    let rows = RecordBatchOptions::new().with_row_count(Some(indices.len()));
    RecordBatch::try_new_with_options(batch.schema(), columns, &rows)
}

#[cfg(test)]
fn reference(arrays: &[&dyn Array]) -> ArrayRef {
    arrow_select::concat::concat(arrays).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryViewArray, Int64Array, StringViewArray};
    use arrow_schema::{Field, Schema};

    fn strings(offset: usize, n: usize, nulls: bool) -> StringViewArray {
        StringViewArray::from_iter((0..n).map(|i| {
            let i = i + offset;
            if nulls && i.is_multiple_of(7) {
                None
            } else if i.is_multiple_of(3) {
                Some(format!("s{i}"))
            } else {
                Some(format!("a longer string than twelve bytes number {i}"))
            }
        }))
    }

    #[test]
    fn view_concat_matches_arrow_and_shares_the_string_bytes() {
        for nulls in [false, true] {
            let a = strings(0, 1000, nulls);
            let b = strings(1000, 700, !nulls).slice(50, 600);
            let c = strings(5000, 10, nulls);
            let arrays: Vec<&dyn Array> = vec![&a, &b, &c];
            let ours = concat_arrays(&arrays).unwrap();
            assert_eq!(ours.as_ref(), reference(&arrays).as_ref());
            let ours = ours.as_string_view();
            assert_eq!(
                ours.data_buffers()[0].as_ptr(),
                a.data_buffers()[0].as_ptr(),
                "no string byte copied"
            );
        }
        let x = BinaryViewArray::from_iter_values([b"ab".as_slice(), &[7u8; 40]]);
        let arrays: Vec<&dyn Array> = vec![&x, &x, &x];
        assert_eq!(
            concat_arrays(&arrays).unwrap().as_ref(),
            reference(&arrays).as_ref()
        );
    }

    #[test]
    fn batches_of_mixed_columns() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, true),
        ]));
        let batch = |off: usize, n: usize| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(
                        (off..off + n).map(|v| v as i64),
                    )),
                    Arc::new(strings(off, n, true)),
                ],
            )
            .unwrap()
        };
        let parts = [batch(0, 100), batch(100, 50).slice(10, 30), batch(500, 1)];
        let ours = concat_batches(&schema, &parts).unwrap();
        let arrow = arrow_select::concat::concat_batches(&schema, &parts).unwrap();
        assert_eq!(ours, arrow);
    }
}
