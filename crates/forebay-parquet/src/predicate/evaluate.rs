//! Evaluating a bound predicate on a batch, with the null and NaN semantics of
//! `pyarrow.compute`.

use arrow_arith::boolean;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float16Type, Float32Type, Float64Type};
use arrow_array::{Array, ArrayRef, BooleanArray, Datum, RecordBatch, Scalar};
use arrow_buffer::BooleanBufferBuilder;
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
    if operand.value_is_nan {
        // Under IEEE rules nothing equals or orders against NaN; only != holds.
        let all = op == CompareOp::NotEq;
        return Ok(BooleanArray::new(
            arrow_buffer::BooleanBuffer::collect_bool(values.len(), |_| all),
            values.nulls().cloned(),
        ));
    }
    let result = ordered(&values, op, &Scalar::new(operand.value.clone()))?;
    match nan_mask(&values) {
        Some(nan) => with_ieee_nan(result, op, &nan),
        None => Ok(result),
    }
}

/// `left op right` with arrow's kernels.
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

/// arrow-rs orders floats totally (NaN greatest, NaN == NaN); pyarrow follows IEEE: where
/// `nan` is set (a NaN took part), only `!=` holds.
fn with_ieee_nan(
    result: BooleanArray,
    op: CompareOp,
    nan: &BooleanArray,
) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
    if nan.true_count() == 0 {
        Ok(result)
    } else if op == CompareOp::NotEq {
        boolean::or(&result, nan)
    } else {
        boolean::and(&result, &boolean::not(nan)?)
    }
}

/// `left op right` row by row: nulls stay null, NaN on either side compares as IEEE says
/// (only `!=` holds), as a comparison with a value does.
fn compare_columns(
    left: &ArrayRef,
    op: CompareOp,
    right: &ArrayRef,
    compare_type: &DataType,
) -> std::result::Result<BooleanArray, arrow_schema::ArrowError> {
    let left = to_compare_type(left, compare_type)?;
    let right = to_compare_type(right, compare_type)?;
    let result = ordered(&left, op, &right)?;
    match (nan_mask(&left), nan_mask(&right)) {
        (Some(l), Some(r)) => {
            let nan = boolean::or(&null_as_false(&l), &null_as_false(&r))?;
            with_ieee_nan(result, op, &nan)
        }
        _ => Ok(result),
    }
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
            negated,
        } => {
            let values = column(batch, name)?;
            let mut acc = BooleanArray::from(vec![false; values.len()]);
            for operand in operands {
                let hit = null_as_false(&compare(values, CompareOp::Eq, operand)?);
                acc = boolean::or(&acc, &hit)?;
            }
            if *negated {
                boolean::not(&acc)
            } else {
                Ok(acc)
            }
        }
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
