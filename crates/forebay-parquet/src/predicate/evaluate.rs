//! Evaluating a bound predicate on a batch, with the null, NaN and signed-zero semantics of
//! `pyarrow.compute`: comparisons of floats by IEEE rules (NaN unequal to everything, -0.0
//! equal to 0.0), `in` lists by `is_in`'s equality of bits (NaN in NaN, -0.0 not in 0.0).

use arrow_arith::boolean;
use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowPrimitiveType, Float16Type, Float32Type, Float64Type};
use arrow_array::{Array, ArrayRef, BooleanArray, Datum, RecordBatch, Scalar};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder, NullBuffer};
use arrow_ord::cmp;
use arrow_schema::DataType;

use super::bind::value_type;
use super::bind::{BoundPredicate, Node, Operand};
use super::CompareOp;

impl BoundPredicate {
    /// Evaluate on a batch that contains (at least) the referenced columns. The result has no
    /// nulls: rows whose predicate is null are `false`, as in a filter.
    pub fn evaluate(
        &self,
        batch: &RecordBatch,
    ) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
        let result = eval_node(&self.root, batch)?;
        Ok(null_as_false(&result))
    }

    /// [`evaluate`](Self::evaluate) with its nulls kept (three-valued: a row whose
    /// predicate is null is null, not `false`).
    pub(super) fn evaluate_nullable(
        &self,
        batch: &RecordBatch,
    ) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
        eval_node(&self.root, batch)
    }
}

pub(super) fn null_as_false(array: &BooleanArray) -> BooleanArray {
    match array.nulls() {
        None => array.clone(),
        Some(nulls) => {
            let values = array.values() & nulls.inner();
            BooleanArray::new(values, None)
        }
    }
}

fn column<'a>(
    batch: &'a RecordBatch,
    name: &str,
) -> std::result::Result<&'a ArrayRef, arrow_schema::ArrowError> {
    batch.column_by_name(name).ok_or_else(|| {
        arrow_schema::ArrowError::SchemaError(format!("filter column '{name}' missing from batch"))
    })
}

/// Cast `array` to the comparison type unless it already is (dictionaries of it included).
pub(super) fn to_compare_type(
    array: &ArrayRef,
    compare_type: &DataType,
) -> std::result::Result<ArrayRef, arrow_schema::ArrowError> {
    if value_type(array.data_type()) == compare_type {
        Ok(array.clone())
    } else {
        arrow_cast::cast(array, compare_type)
    }
}

/// IEEE "is NaN" per slot for float arrays (nulls stay null); `None` for other types.
pub(super) fn nan_mask(array: &ArrayRef) -> Option<BooleanArray> {
    let array = match array.data_type() {
        DataType::Dictionary(_, _) => {
            arrow_cast::cast(array, value_type(array.data_type())).ok()?
        }
        _ => array.clone(),
    };
    Some(match array.data_type() {
        DataType::Float16 => array
            .as_primitive::<Float16Type>()
            .map_to_bool(|v| v.is_nan()),
        DataType::Float32 => array
            .as_primitive::<Float32Type>()
            .map_to_bool(|v| v.is_nan()),
        DataType::Float64 => array
            .as_primitive::<Float64Type>()
            .map_to_bool(|v| v.is_nan()),
        _ => return None,
    })
}

/// Per-slot boolean of a primitive array, keeping its nulls.
trait MapToBool {
    type Native;
    fn map_to_bool(&self, f: impl Fn(Self::Native) -> bool) -> BooleanArray;
}

impl<T: arrow_array::types::ArrowPrimitiveType> MapToBool for arrow_array::PrimitiveArray<T> {
    type Native = T::Native;
    fn map_to_bool(&self, f: impl Fn(T::Native) -> bool) -> BooleanArray {
        let mut builder = BooleanBufferBuilder::new(self.len());
        for v in self.values().iter() {
            builder.append(f(*v));
        }
        BooleanArray::new(builder.finish(), self.nulls().cloned())
    }
}

fn compare(
    values: &ArrayRef,
    op: CompareOp,
    operand: &Operand,
) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
    let values = to_compare_type(values, &operand.compare_type)?;
    compare_with_value(&values, op, &operand.value)
}

/// `values op value` (`value` a one-element array of `values`' type) as pyarrow compares:
/// floats by IEEE rules (NaN unequal to everything, -0.0 equal to 0.0), all else in order.
pub(super) fn compare_with_value(
    values: &ArrayRef,
    op: CompareOp,
    value: &ArrayRef,
) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
    let values = plain(values)?;
    match values.data_type() {
        DataType::Float16 => Ok(ieee_with_value::<Float16Type>(&values, op, value)),
        DataType::Float32 => Ok(ieee_with_value::<Float32Type>(&values, op, value)),
        DataType::Float64 => Ok(ieee_with_value::<Float64Type>(&values, op, value)),
        _ => ordered(&values, op, &Scalar::new(value.clone())),
    }
}

/// `left op right` with arrow's kernels (floats in their total order).
fn ordered(
    left: &dyn Datum,
    op: CompareOp,
    right: &dyn Datum,
) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
    match op {
        CompareOp::Eq => cmp::eq(left, right),
        CompareOp::NotEq => cmp::neq(left, right),
        CompareOp::Lt => cmp::lt(left, right),
        CompareOp::LtEq => cmp::lt_eq(left, right),
        CompareOp::Gt => cmp::gt(left, right),
        CompareOp::GtEq => cmp::gt_eq(left, right),
    }
}

/// A dictionary array as its values; any other array as it is.
fn plain(array: &ArrayRef) -> std::result::Result<ArrayRef, arrow_schema::ArrowError> {
    match array.data_type() {
        DataType::Dictionary(_, v) => arrow_cast::cast(array, v),
        _ => Ok(array.clone()),
    }
}

/// Rust's float operators are IEEE's: the comparison pyarrow's kernels make.
fn ieee<T: Copy + PartialOrd>(a: T, op: CompareOp, b: T) -> bool {
    match op {
        CompareOp::Eq => a == b,
        CompareOp::NotEq => a != b,
        CompareOp::Lt => a < b,
        CompareOp::LtEq => a <= b,
        CompareOp::Gt => a > b,
        CompareOp::GtEq => a >= b,
    }
}

fn ieee_with_value<T: ArrowPrimitiveType>(
    values: &ArrayRef,
    op: CompareOp,
    value: &ArrayRef,
) -> BooleanArray
where
    T::Native: PartialOrd,
{
    let values = values.as_primitive::<T>();
    let value = value.as_primitive::<T>().value(0);
    let raw = values.values();
    BooleanArray::new(
        BooleanBuffer::collect_bool(values.len(), |i| ieee(raw[i], op, value)),
        values.nulls().cloned(),
    )
}

fn ieee_columns<T: ArrowPrimitiveType>(
    left: &ArrayRef,
    op: CompareOp,
    right: &ArrayRef,
) -> BooleanArray
where
    T::Native: PartialOrd,
{
    let (left, right) = (left.as_primitive::<T>(), right.as_primitive::<T>());
    let (l, r) = (left.values(), right.values());
    BooleanArray::new(
        BooleanBuffer::collect_bool(left.len(), |i| ieee(l[i], op, r[i])),
        NullBuffer::union(left.nulls(), right.nulls()),
    )
}

/// `left op right` row by row: nulls stay null, floats compare by IEEE rules, as a
/// comparison with a value does.
fn compare_columns(
    left: &ArrayRef,
    op: CompareOp,
    right: &ArrayRef,
    compare_type: &DataType,
) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
    let left = plain(&to_compare_type(left, compare_type)?)?;
    let right = plain(&to_compare_type(right, compare_type)?)?;
    match left.data_type() {
        DataType::Float16 => Ok(ieee_columns::<Float16Type>(&left, op, &right)),
        DataType::Float32 => Ok(ieee_columns::<Float32Type>(&left, op, &right)),
        DataType::Float64 => Ok(ieee_columns::<Float64Type>(&left, op, &right)),
        _ => ordered(&left, op, &right),
    }
}

/// Which rows of `values` are in the list: `is_in`'s equality, the bits of a float (NaN
/// matches NaN, -0.0 only -0.0), a null row only where the list holds a null. No nulls.
fn is_in(
    values: &ArrayRef,
    operands: &[Operand],
    matches_null: bool,
) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
    let mut acc = BooleanArray::from(vec![false; values.len()]);
    for operand in operands {
        let values = to_compare_type(values, &operand.compare_type)?;
        let hit = if operand.value_is_nan {
            nan_mask(&values).unwrap_or_else(|| BooleanArray::from(vec![false; values.len()]))
        } else {
            // arrow's order of floats is total: -0.0 and 0.0 differ, as under is_in.
            ordered(&values, CompareOp::Eq, &Scalar::new(operand.value.clone()))?
        };
        acc = boolean::or(&acc, &null_as_false(&hit))?;
    }
    if matches_null {
        acc = boolean::or(&acc, &boolean::is_null(values.as_ref())?)?;
    }
    Ok(acc)
}

/// `value` for every non-null row of `values`, null for its null rows.
fn decided(values: &ArrayRef, value: bool) -> BooleanArray {
    BooleanArray::new(
        BooleanBuffer::collect_bool(values.len(), |_| value),
        values.logical_nulls(),
    )
}

pub(super) fn eval_node(
    node: &Node,
    batch: &RecordBatch,
) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
    match node {
        Node::Compare {
            column: name,
            op,
            operand,
        } => compare(column(batch, name)?, *op, operand),
        Node::In {
            column: name,
            operands,
            matches_null,
            negated,
        } => {
            let acc = is_in(column(batch, name)?, operands, *matches_null)?;
            if *negated {
                boolean::not(&acc)
            } else {
                Ok(acc)
            }
        }
        Node::Decided {
            column: name,
            value,
        } => Ok(decided(column(batch, name)?, *value)),
        Node::IsNull {
            column: name,
            negated,
        } => {
            let values = column(batch, name)?;
            if *negated {
                boolean::is_not_null(values.as_ref())
            } else {
                boolean::is_null(values.as_ref())
            }
        }
        Node::And(children) => {
            let mut acc = eval_node(&children[0], batch)?;
            for child in &children[1..] {
                acc = boolean::and_kleene(&acc, &eval_node(child, batch)?)?;
            }
            Ok(acc)
        }
        Node::Or(children) => {
            let mut acc = eval_node(&children[0], batch)?;
            for child in &children[1..] {
                acc = boolean::or_kleene(&acc, &eval_node(child, batch)?)?;
            }
            Ok(acc)
        }
        Node::CompareColumns {
            left,
            op,
            right,
            compare_type,
        } => compare_columns(
            column(batch, left)?,
            *op,
            column(batch, right)?,
            compare_type,
        ),
        // Null stays null (three-valued), as under pyarrow's `~`.
        Node::Not(inner) => boolean::not(&eval_node(inner, batch)?),
    }
}
