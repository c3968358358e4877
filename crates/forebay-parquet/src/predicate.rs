//! Filters: what a user writes, how it binds to a file's columns, how it is evaluated on rows
//! and how it prunes row groups and pages from statistics.
//!
//! A [`Predicate`] is a tree of comparisons (`=`, `!=`, `<`, `<=`, `>`, `>=`), set membership
//! (`in`, `not in`), null tests and `and`/`or`. [`Predicate::bind`] checks it against the
//! dataset's Arrow schema, casting each literal once to the type it is compared in, and yields
//! a [`BoundPredicate`] that:
//!
//! * evaluates exactly on a `RecordBatch` ([`BoundPredicate::evaluate`]) with the semantics of
//!   `pyarrow.compute` / `pyarrow.dataset` filters: a comparison involving null is null and the
//!   row is dropped; NaN compares unequal to everything (IEEE), so `x != 1.0` keeps NaN rows;
//!   `x in [...]` is false for a null `x` and `x not in [...]` is therefore true;
//! * decides from min/max/null-count statistics whether a row group or page *may* hold a
//!   matching row ([`BoundPredicate::may_match`]). Unknown statistics always mean "may match",
//!   so pruning never changes a result: it only saves I/O and decoding.

use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, BooleanArray, BooleanBufferBuilder, Date32Array, Float64Array,
    Int64Array, Scalar, StringArray, TimestampMicrosecondArray, UInt64Array,
};
use arrow::array::{AsArray, BinaryArray};
use arrow::compute::kernels::{boolean, cmp};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Float16Type, Float32Type, Float64Type, Schema};
use arrow::record_batch::RecordBatch;

use crate::error::{ParquetError, Result};
use crate::scan::column_not_found;

/// A literal value in a filter, as a user would write it.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    /// Days since 1970-01-01 (a calendar date).
    Date(i32),
    /// Microseconds since the epoch; `tz` as in Arrow (`None` = naive).
    Timestamp {
        micros: i64,
        tz: Option<String>,
    },
    /// A decimal number written out in base 10, e.g. `"12.50"`.
    Decimal(String),
    /// Null: not comparable; use [`Predicate::is_null`] instead.
    Null,
}

impl std::fmt::Display for Literal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Literal::Bool(v) => write!(f, "{v}"),
            Literal::Int(v) => write!(f, "{v}"),
            Literal::UInt(v) => write!(f, "{v}"),
            Literal::Float(v) => write!(f, "{v}"),
            Literal::Str(v) => write!(f, "{v:?}"),
            Literal::Bytes(v) => write!(f, "<{} bytes>", v.len()),
            Literal::Date(v) => write!(f, "date({v} days)"),
            Literal::Timestamp { micros, .. } => write!(f, "timestamp({micros} us)"),
            Literal::Decimal(v) => write!(f, "decimal({v})"),
            Literal::Null => write!(f, "null"),
        }
    }
}

impl Literal {
    fn kind(&self) -> &'static str {
        match self {
            Literal::Bool(_) => "bool",
            Literal::Int(_) | Literal::UInt(_) => "int",
            Literal::Float(_) => "float",
            Literal::Str(_) => "str",
            Literal::Bytes(_) => "bytes",
            Literal::Date(_) => "date",
            Literal::Timestamp { .. } => "datetime",
            Literal::Decimal(_) => "decimal",
            Literal::Null => "None",
        }
    }

    /// The literal as a one-element array of its natural Arrow type.
    fn to_array(&self) -> ArrayRef {
        match self {
            Literal::Bool(v) => Arc::new(BooleanArray::from(vec![*v])),
            Literal::Int(v) => Arc::new(Int64Array::from(vec![*v])),
            Literal::UInt(v) => Arc::new(UInt64Array::from(vec![*v])),
            Literal::Float(v) => Arc::new(Float64Array::from(vec![*v])),
            Literal::Str(v) | Literal::Decimal(v) => Arc::new(StringArray::from(vec![v.as_str()])),
            Literal::Bytes(v) => Arc::new(BinaryArray::from(vec![v.as_slice()])),
            Literal::Date(v) => Arc::new(Date32Array::from(vec![*v])),
            Literal::Timestamp { micros, tz } => Arc::new(
                TimestampMicrosecondArray::from(vec![*micros]).with_timezone_opt(tz.clone()),
            ),
            Literal::Null => new_null_array(&DataType::Null, 1),
        }
    }
}

impl From<i64> for Literal {
    fn from(v: i64) -> Self {
        Literal::Int(v)
    }
}
impl From<i32> for Literal {
    fn from(v: i32) -> Self {
        Literal::Int(v as i64)
    }
}
impl From<f64> for Literal {
    fn from(v: f64) -> Self {
        Literal::Float(v)
    }
}
impl From<&str> for Literal {
    fn from(v: &str) -> Self {
        Literal::Str(v.to_string())
    }
}
impl From<bool> for Literal {
    fn from(v: bool) -> Self {
        Literal::Bool(v)
    }
}

/// Comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

impl CompareOp {
    /// Parse the pyarrow-style spelling: `=`, `==`, `!=`, `<`, `<=`, `>`, `>=`.
    pub fn parse(op: &str) -> Option<Self> {
        Some(match op {
            "=" | "==" => CompareOp::Eq,
            "!=" | "<>" => CompareOp::NotEq,
            "<" => CompareOp::Lt,
            "<=" => CompareOp::LtEq,
            ">" => CompareOp::Gt,
            ">=" => CompareOp::GtEq,
            _ => return None,
        })
    }
}

/// A filter over top-level columns.
#[derive(Debug, Clone, PartialEq)]
pub enum Predicate {
    Compare {
        column: String,
        op: CompareOp,
        value: Literal,
    },
    In {
        column: String,
        values: Vec<Literal>,
        negated: bool,
    },
    IsNull {
        column: String,
        negated: bool,
    },
    And(Vec<Predicate>),
    Or(Vec<Predicate>),
}

/// The predicate as text: columns quoted, literals exact (`"x" > Int(5)`), terms in the
/// order given. Two predicates print alike exactly when they are the same predicate, so the
/// text also serves as a record of it (a checkpoint remembers the filter its work was done
/// under).
impl std::fmt::Display for Predicate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let join = |f: &mut std::fmt::Formatter<'_>, terms: &[Predicate], word: &str| {
            f.write_str("(")?;
            for (i, term) in terms.iter().enumerate() {
                if i > 0 {
                    write!(f, " {word} ")?;
                }
                write!(f, "{term}")?;
            }
            f.write_str(")")
        };
        match self {
            Predicate::Compare { column, op, value } => {
                let op = match op {
                    CompareOp::Eq => "==",
                    CompareOp::NotEq => "!=",
                    CompareOp::Lt => "<",
                    CompareOp::LtEq => "<=",
                    CompareOp::Gt => ">",
                    CompareOp::GtEq => ">=",
                };
                write!(f, "{column:?} {op} {value:?}")
            }
            Predicate::In {
                column,
                values,
                negated,
            } => {
                let not = if *negated { "not " } else { "" };
                write!(f, "{column:?} {not}in {values:?}")
            }
            Predicate::IsNull { column, negated } => {
                let not = if *negated { "not " } else { "" };
                write!(f, "{column:?} is {not}null")
            }
            Predicate::And(terms) => join(f, terms, "and"),
            Predicate::Or(terms) => join(f, terms, "or"),
        }
    }
}

impl Predicate {
    pub fn compare(column: impl Into<String>, op: CompareOp, value: impl Into<Literal>) -> Self {
        Predicate::Compare {
            column: column.into(),
            op,
            value: value.into(),
        }
    }
    pub fn eq(column: impl Into<String>, value: impl Into<Literal>) -> Self {
        Self::compare(column, CompareOp::Eq, value)
    }
    pub fn gt(column: impl Into<String>, value: impl Into<Literal>) -> Self {
        Self::compare(column, CompareOp::Gt, value)
    }
    pub fn lt(column: impl Into<String>, value: impl Into<Literal>) -> Self {
        Self::compare(column, CompareOp::Lt, value)
    }
    pub fn is_in(column: impl Into<String>, values: Vec<Literal>) -> Self {
        Predicate::In {
            column: column.into(),
            values,
            negated: false,
        }
    }
    pub fn is_null(column: impl Into<String>) -> Self {
        Predicate::IsNull {
            column: column.into(),
            negated: false,
        }
    }
    pub fn is_not_null(column: impl Into<String>) -> Self {
        Predicate::IsNull {
            column: column.into(),
            negated: true,
        }
    }
    pub fn and(self, other: Predicate) -> Self {
        Predicate::And(vec![self, other])
    }
    pub fn or(self, other: Predicate) -> Self {
        Predicate::Or(vec![self, other])
    }

    /// Every column the predicate reads, in first-mention order, without duplicates.
    pub fn columns(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_columns(&mut out);
        out
    }

    fn collect_columns(&self, out: &mut Vec<String>) {
        match self {
            Predicate::Compare { column, .. }
            | Predicate::In { column, .. }
            | Predicate::IsNull { column, .. } => {
                if !out.contains(column) {
                    out.push(column.clone());
                }
            }
            Predicate::And(children) | Predicate::Or(children) => {
                children.iter().for_each(|c| c.collect_columns(out))
            }
        }
    }

    /// Check the predicate against `schema` (the columns as they will be decoded) and cast
    /// every literal to the type it is compared in. `path` names the file in errors.
    pub fn bind(&self, schema: &Schema, path: &str) -> Result<BoundPredicate> {
        let node = match self {
            Predicate::Compare { column, op, value } => {
                let (data_type, _) = column_type(schema, column, path)?;
                let operand = bind_literal(column, &data_type, value)?;
                Node::Compare {
                    column: column.clone(),
                    op: *op,
                    operand,
                }
            }
            Predicate::In {
                column,
                values,
                negated,
            } => {
                let (data_type, _) = column_type(schema, column, path)?;
                let operands = values
                    .iter()
                    .map(|v| bind_literal(column, &data_type, v))
                    .collect::<Result<Vec<_>>>()?;
                Node::In {
                    column: column.clone(),
                    operands,
                    negated: *negated,
                }
            }
            Predicate::IsNull { column, negated } => {
                column_type(schema, column, path)?;
                Node::IsNull {
                    column: column.clone(),
                    negated: *negated,
                }
            }
            Predicate::And(children) | Predicate::Or(children) => {
                if children.is_empty() {
                    return Err(ParquetError::InvalidFilter {
                        column: String::new(),
                        reason: "an empty and/or group".into(),
                    });
                }
                let bound = children
                    .iter()
                    .map(|c| c.bind(schema, path).map(|b| b.root))
                    .collect::<Result<Vec<_>>>()?;
                if matches!(self, Predicate::And(_)) {
                    Node::And(bound)
                } else {
                    Node::Or(bound)
                }
            }
        };
        Ok(BoundPredicate { root: node })
    }
}

fn column_type(schema: &Schema, column: &str, path: &str) -> Result<(DataType, usize)> {
    let (idx, field) = schema
        .column_with_name(column)
        .ok_or_else(|| column_not_found(schema, column, path))?;
    let data_type = field.data_type().clone();
    if value_type(&data_type).is_nested() {
        return Err(ParquetError::InvalidFilter {
            column: column.to_string(),
            reason: format!("filters on nested columns ({data_type}) are not supported"),
        });
    }
    Ok((data_type, idx))
}

/// The type values are stored as: a dictionary's value type, otherwise the type itself.
fn value_type(data_type: &DataType) -> &DataType {
    match data_type {
        DataType::Dictionary(_, v) => v.as_ref(),
        other => other,
    }
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

/// A literal cast to the type in which it is compared with its column.
#[derive(Debug, Clone)]
struct Operand {
    /// The literal as a one-element array of `compare_type`.
    value: ArrayRef,
    /// The type both sides are compared in.
    compare_type: DataType,
    /// The literal is NaN (compares unequal to everything under IEEE rules).
    value_is_nan: bool,
}

fn bind_literal(column: &str, column_type: &DataType, literal: &Literal) -> Result<Operand> {
    use DataType::*;
    let vt = value_type(column_type);
    let mismatch = || ParquetError::InvalidFilter {
        column: column.to_string(),
        reason: format!(
            "value {literal} ({}) cannot be compared with a column of type {column_type}",
            literal.kind()
        ),
    };
    let is_int = vt.is_integer();
    let is_decimal = matches!(
        vt,
        Decimal32(..) | Decimal64(..) | Decimal128(..) | Decimal256(..)
    );
    let is_string = matches!(vt, Utf8 | LargeUtf8 | Utf8View);
    let is_binary = matches!(vt, Binary | LargeBinary | BinaryView | FixedSizeBinary(_));
    let is_temporal = matches!(vt, Date32 | Date64 | Timestamp(..) | Time32(_) | Time64(_));
    let compare_type = match literal {
        Literal::Null => {
            return Err(ParquetError::InvalidFilter {
                column: column.to_string(),
                reason: "comparing with None/null matches nothing; use 'is null' or 'is not null'"
                    .into(),
            })
        }
        Literal::Bool(_) if matches!(vt, Boolean) => vt.clone(),
        Literal::Int(_) | Literal::UInt(_) if is_int || is_float(vt) || is_decimal => vt.clone(),
        Literal::Float(_) if is_float(vt) || is_decimal => vt.clone(),
        // A fractional value against integers: compare both as float64, as pyarrow does.
        Literal::Float(_) if is_int => Float64,
        Literal::Decimal(_) if is_decimal || is_float(vt) || is_int => vt.clone(),
        Literal::Str(_) if is_string || is_binary || is_temporal || is_decimal => vt.clone(),
        Literal::Bytes(_) if is_binary => vt.clone(),
        Literal::Date(_) if matches!(vt, Date32 | Date64 | Timestamp(..)) => vt.clone(),
        Literal::Timestamp { .. } if matches!(vt, Timestamp(..) | Date64) => vt.clone(),
        _ => return Err(mismatch()),
    };
    let value_is_nan = matches!(literal, Literal::Float(f) if f.is_nan());
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let value = cast_with_options(&literal.to_array(), &compare_type, &options).map_err(|e| {
        ParquetError::InvalidFilter {
            column: column.to_string(),
            reason: format!(
                "value {literal} ({}) does not fit the column's type {column_type}: {e}",
                literal.kind()
            ),
        }
    })?;
    if value.null_count() > 0 {
        return Err(mismatch());
    }
    Ok(Operand {
        value,
        compare_type,
        value_is_nan,
    })
}

/// A [`Predicate`] checked against a schema, ready to evaluate rows or statistics.
#[derive(Debug, Clone)]
pub struct BoundPredicate {
    root: Node,
}

#[derive(Debug, Clone)]
enum Node {
    Compare {
        column: String,
        op: CompareOp,
        operand: Operand,
    },
    In {
        column: String,
        operands: Vec<Operand>,
        negated: bool,
    },
    IsNull {
        column: String,
        negated: bool,
    },
    And(Vec<Node>),
    Or(Vec<Node>),
}

/// Statistics of one column over a sequence of containers (row groups, or pages).
/// Every array has one slot per container; a null slot means "unknown".
pub struct ContainerStats {
    pub mins: ArrayRef,
    pub maxes: ArrayRef,
    pub null_counts: UInt64Array,
    pub row_counts: Option<UInt64Array>,
    /// Whether min/max are the true extremes (not truncated bounds). `None`: unknown.
    pub min_exact: Option<BooleanArray>,
    pub max_exact: Option<BooleanArray>,
    /// How many output slots each container covers, when containers are coarser than the
    /// caller's slots (pages of one column, expanded to the rows of a row group). `None`:
    /// one slot per container.
    pub slots_per_container: Option<Vec<usize>>,
}

impl ContainerStats {
    fn len(&self) -> usize {
        self.mins.len()
    }

    /// Expand a per-container answer to the caller's `n` slots.
    fn expand(&self, per_container: Vec<bool>, n: usize) -> Vec<bool> {
        match &self.slots_per_container {
            None => per_container,
            Some(spans) => {
                let mut out = Vec::with_capacity(n);
                for (keep, span) in per_container.into_iter().zip(spans) {
                    out.extend(std::iter::repeat_n(keep, *span));
                }
                // Statistics that cover fewer slots than asked: the rest is unknown.
                out.resize(n, true);
                out.truncate(n);
                out
            }
        }
    }
}

impl BoundPredicate {
    /// Columns referenced by the predicate.
    pub fn columns(&self) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(n: &Node, out: &mut Vec<String>) {
            match n {
                Node::Compare { column, .. }
                | Node::In { column, .. }
                | Node::IsNull { column, .. } => {
                    if !out.contains(column) {
                        out.push(column.clone())
                    }
                }
                Node::And(c) | Node::Or(c) => c.iter().for_each(|n| walk(n, out)),
            }
        }
        walk(&self.root, &mut out);
        out
    }

    /// Evaluate on a batch that contains (at least) the referenced columns. The result has no
    /// nulls: rows whose predicate is null are `false`, as in a filter.
    pub fn evaluate(
        &self,
        batch: &RecordBatch,
    ) -> std::result::Result<BooleanArray, arrow::error::ArrowError> {
        let result = eval_node(&self.root, batch)?;
        Ok(null_as_false(&result))
    }

    /// For `n` containers, whether each may hold a row matching the predicate. `stats` gives
    /// a column's statistics over those containers, or `None` when they are not known.
    pub fn may_match(
        &self,
        n: usize,
        stats: &mut dyn FnMut(&str) -> Option<ContainerStats>,
    ) -> Vec<bool> {
        prune_node(&self.root, n, stats)
    }
}

fn null_as_false(array: &BooleanArray) -> BooleanArray {
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
) -> std::result::Result<&'a ArrayRef, arrow::error::ArrowError> {
    batch.column_by_name(name).ok_or_else(|| {
        arrow::error::ArrowError::SchemaError(format!("filter column '{name}' missing from batch"))
    })
}

/// Cast `array` to the comparison type unless it already is (dictionaries of it included).
fn to_compare_type(
    array: &ArrayRef,
    compare_type: &DataType,
) -> std::result::Result<ArrayRef, arrow::error::ArrowError> {
    if value_type(array.data_type()) == compare_type {
        Ok(array.clone())
    } else {
        arrow::compute::cast(array, compare_type)
    }
}

/// IEEE "is NaN" per slot for float arrays (nulls stay null); `None` for other types.
fn nan_mask(array: &ArrayRef) -> Option<BooleanArray> {
    let array = match array.data_type() {
        DataType::Dictionary(_, _) => {
            arrow::compute::cast(array, value_type(array.data_type())).ok()?
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

impl<T: arrow::datatypes::ArrowPrimitiveType> MapToBool for arrow::array::PrimitiveArray<T> {
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
) -> std::result::Result<BooleanArray, arrow::error::ArrowError> {
    let values = to_compare_type(values, &operand.compare_type)?;
    if operand.value_is_nan {
        // Under IEEE rules nothing equals or orders against NaN; only != holds.
        let all = op == CompareOp::NotEq;
        return Ok(BooleanArray::new(
            arrow::buffer::BooleanBuffer::collect_bool(values.len(), |_| all),
            values.nulls().cloned(),
        ));
    }
    let scalar = Scalar::new(operand.value.clone());
    let result = match op {
        CompareOp::Eq => cmp::eq(&values, &scalar)?,
        CompareOp::NotEq => cmp::neq(&values, &scalar)?,
        CompareOp::Lt => cmp::lt(&values, &scalar)?,
        CompareOp::LtEq => cmp::lt_eq(&values, &scalar)?,
        CompareOp::Gt => cmp::gt(&values, &scalar)?,
        CompareOp::GtEq => cmp::gt_eq(&values, &scalar)?,
    };
    // arrow-rs orders floats totally (NaN greatest, NaN == NaN); pyarrow follows IEEE.
    match nan_mask(&values) {
        Some(nan) if nan.true_count() > 0 => {
            if op == CompareOp::NotEq {
                boolean::or(&result, &nan)
            } else {
                boolean::and(&result, &boolean::not(&nan)?)
            }
        }
        _ => Ok(result),
    }
}

fn eval_node(
    node: &Node,
    batch: &RecordBatch,
) -> std::result::Result<BooleanArray, arrow::error::ArrowError> {
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
    }
}

/// Prepared min/max of one column in the comparison type, NaN bounds turned unknown.
struct Bounds {
    mins: ArrayRef,
    maxes: ArrayRef,
}

fn prepare_bounds(stats: &ContainerStats, compare_type: &DataType) -> Option<Bounds> {
    let prep = |a: &ArrayRef| -> Option<ArrayRef> {
        let a = to_compare_type(a, compare_type).ok()?;
        let a = match a.data_type() {
            DataType::Dictionary(_, v) => arrow::compute::cast(&a, v).ok()?,
            _ => a,
        };
        // A NaN bound says nothing usable under IEEE comparison: make it unknown.
        match nan_mask(&a) {
            Some(nan) if nan.true_count() > 0 => {
                let keep = boolean::not(&null_as_false(&nan)).ok()?;
                arrow::compute::nullif(&a, &boolean::not(&keep).ok()?).ok()
            }
            _ => Some(a),
        }
    };
    Some(Bounds {
        mins: prep(&stats.mins)?,
        maxes: prep(&stats.maxes)?,
    })
}

/// `unknown` (null) slots of a may-match array become `true`.
fn unknown_as_true(array: &BooleanArray) -> Vec<bool> {
    (0..array.len())
        .map(|i| array.is_null(i) || array.value(i))
        .collect()
}

/// Slots known to be true (nulls are false).
fn known_true(array: &BooleanArray) -> Vec<bool> {
    (0..array.len())
        .map(|i| array.is_valid(i) && array.value(i))
        .collect()
}

fn exact(flags: &Option<BooleanArray>, i: usize) -> bool {
    flags.as_ref().is_some_and(|f| f.is_valid(i) && f.value(i))
}

/// Containers in which every value is known to equal the operand: min == max == v, both exact.
fn all_equal(
    n: usize,
    stats: &ContainerStats,
    bounds: &Bounds,
    operand: &Operand,
) -> Option<Vec<bool>> {
    if is_float(&operand.compare_type) {
        return None; // NaN rows are invisible in statistics
    }
    let scalar = Scalar::new(operand.value.clone());
    let lo = known_true(&cmp::eq(&bounds.mins, &scalar).ok()?);
    let hi = known_true(&cmp::eq(&bounds.maxes, &scalar).ok()?);
    Some(
        (0..n)
            .map(|i| lo[i] && hi[i] && exact(&stats.min_exact, i) && exact(&stats.max_exact, i))
            .collect(),
    )
}

fn no_nulls(stats: &ContainerStats, i: usize) -> bool {
    stats.null_counts.is_valid(i) && stats.null_counts.value(i) == 0
}

fn prune_compare(
    n: usize,
    stats: &ContainerStats,
    op: CompareOp,
    operand: &Operand,
) -> Option<Vec<bool>> {
    if operand.value_is_nan {
        // Only `!=` can match (non-null rows); all other comparisons with NaN are false.
        return Some(match op {
            CompareOp::NotEq => vec![true; n],
            _ => vec![false; n],
        });
    }
    let bounds = prepare_bounds(stats, &operand.compare_type)?;
    let v = Scalar::new(operand.value.clone());
    let out = match op {
        CompareOp::Gt => unknown_as_true(&cmp::gt(&bounds.maxes, &v).ok()?),
        CompareOp::GtEq => unknown_as_true(&cmp::gt_eq(&bounds.maxes, &v).ok()?),
        CompareOp::Lt => unknown_as_true(&cmp::lt(&bounds.mins, &v).ok()?),
        CompareOp::LtEq => unknown_as_true(&cmp::lt_eq(&bounds.mins, &v).ok()?),
        CompareOp::Eq => {
            let lo = unknown_as_true(&cmp::lt_eq(&bounds.mins, &v).ok()?);
            let hi = unknown_as_true(&cmp::gt_eq(&bounds.maxes, &v).ok()?);
            lo.iter().zip(hi).map(|(a, b)| *a && b).collect()
        }
        CompareOp::NotEq => {
            // Prunable only when every non-null value equals v (nulls never satisfy !=).
            let eq = all_equal(n, stats, &bounds, operand)?;
            eq.into_iter().map(|e| !e).collect()
        }
    };
    Some(out)
}

fn prune_node(
    node: &Node,
    n: usize,
    stats: &mut dyn FnMut(&str) -> Option<ContainerStats>,
) -> Vec<bool> {
    let keep_all = || vec![true; n];
    match node {
        Node::Compare {
            column,
            op,
            operand,
        } => match stats(column) {
            Some(s) => {
                let m = s.len();
                let mut out = prune_compare(m, &s, *op, operand).unwrap_or_else(|| vec![true; m]);
                // A container with only nulls matches no comparison.
                if let Some(rows) = &s.row_counts {
                    for (i, keep) in out.iter_mut().enumerate() {
                        if s.null_counts.is_valid(i)
                            && rows.is_valid(i)
                            && s.null_counts.value(i) == rows.value(i)
                        {
                            *keep = false;
                        }
                    }
                }
                s.expand(out, n)
            }
            None => keep_all(),
        },
        Node::In {
            column,
            operands,
            negated,
        } => match stats(column) {
            Some(s) if !*negated => {
                let m = s.len();
                let mut out = vec![false; m];
                for operand in operands {
                    let hit = prune_compare(m, &s, CompareOp::Eq, operand)
                        .unwrap_or_else(|| vec![true; m]);
                    out.iter_mut().zip(hit).for_each(|(o, h)| *o |= h);
                }
                s.expand(out, n)
            }
            Some(s) => {
                // `not in` is true for nulls, so a container is prunable only if it has no
                // nulls and all its values equal one of the listed values.
                let m = s.len();
                let mut prunable = vec![false; m];
                for operand in operands {
                    let Some(bounds) = prepare_bounds(&s, &operand.compare_type) else {
                        return keep_all();
                    };
                    let Some(eq) = all_equal(m, &s, &bounds, operand) else {
                        return keep_all();
                    };
                    prunable.iter_mut().zip(eq).for_each(|(p, e)| *p |= e);
                }
                let out = (0..m).map(|i| !(prunable[i] && no_nulls(&s, i))).collect();
                s.expand(out, n)
            }
            None => keep_all(),
        },
        Node::IsNull { column, negated } => match stats(column) {
            Some(s) if !*negated => {
                let out = (0..s.len())
                    .map(|i| s.null_counts.is_null(i) || s.null_counts.value(i) > 0)
                    .collect();
                s.expand(out, n)
            }
            Some(s) => match &s.row_counts {
                Some(rows) => {
                    let out = (0..s.len())
                        .map(|i| {
                            s.null_counts.is_null(i)
                                || rows.is_null(i)
                                || s.null_counts.value(i) < rows.value(i)
                        })
                        .collect();
                    s.expand(out, n)
                }
                None => keep_all(),
            },
            None => keep_all(),
        },
        Node::And(children) => {
            let mut acc = keep_all();
            for child in children {
                let c = prune_node(child, n, stats);
                acc.iter_mut().zip(c).for_each(|(a, c)| *a &= c);
            }
            acc
        }
        Node::Or(children) => {
            let mut acc = vec![false; n];
            for child in children {
                let c = prune_node(child, n, stats);
                acc.iter_mut().zip(c).for_each(|(a, c)| *a |= c);
            }
            acc
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int32Array, StringArray};
    use arrow::datatypes::Field;

    #[test]
    fn text_is_exact_and_tells_predicates_apart() {
        let p = Predicate::And(vec![
            Predicate::gt("x", 5),
            Predicate::Or(vec![
                Predicate::In {
                    column: "s".into(),
                    values: vec!["a".into(), Literal::Bytes(vec![1, 2])],
                    negated: true,
                },
                Predicate::IsNull {
                    column: "y z".into(),
                    negated: false,
                },
            ]),
        ]);
        assert_eq!(
            p.to_string(),
            r#"("x" > Int(5) and ("s" not in [Str("a"), Bytes([1, 2])] or "y z" is null))"#
        );
        // Literals that print alike as values differ here: 5 vs 5.0, bytes by content.
        assert_ne!(
            Predicate::gt("x", 5).to_string(),
            Predicate::gt("x", 5.0).to_string()
        );
        let bytes = |b: Vec<u8>| Predicate::eq("b", Literal::Bytes(b)).to_string();
        assert_ne!(bytes(vec![1]), bytes(vec![2]));
    }

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int32, true),
            Field::new("f", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![Some(1), Some(5), None, Some(9)])),
                Arc::new(Float64Array::from(vec![
                    Some(1.0),
                    Some(f64::NAN),
                    None,
                    Some(3.0),
                ])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    Some("b"),
                    None,
                    Some("c"),
                ])),
            ],
        )
        .unwrap()
    }

    fn eval(p: Predicate) -> Vec<bool> {
        let b = batch();
        let bound = p.bind(&b.schema(), "test").unwrap();
        bound
            .evaluate(&b)
            .unwrap()
            .iter()
            .map(|v| v.unwrap())
            .collect()
    }

    #[test]
    fn comparisons_drop_nulls_and_follow_ieee_nan() {
        assert_eq!(eval(Predicate::gt("i", 2)), vec![false, true, false, true]);
        assert_eq!(
            eval(Predicate::gt("f", 0.5)),
            vec![true, false, false, true]
        );
        assert_eq!(
            eval(Predicate::compare("f", CompareOp::NotEq, 1.0)),
            vec![false, true, false, true]
        );
        assert_eq!(
            eval(Predicate::gt("i", 2.5)),
            vec![false, true, false, true]
        );
    }

    #[test]
    fn in_and_not_in_treat_null_like_pyarrow() {
        let vals = vec![Literal::from("a"), Literal::from("c")];
        assert_eq!(
            eval(Predicate::is_in("s", vals.clone())),
            vec![true, false, false, true]
        );
        let not_in = Predicate::In {
            column: "s".into(),
            values: vals,
            negated: true,
        };
        assert_eq!(eval(not_in), vec![false, true, true, false]);
    }

    #[test]
    fn wrong_types_are_rejected_with_column_name() {
        let b = batch();
        let err = Predicate::gt("s", 3)
            .bind(&b.schema(), "f.parquet")
            .unwrap_err();
        assert!(err.to_string().contains("'s'"), "{err}");
        let err = Predicate::gt("i", 1i64 << 40)
            .bind(&b.schema(), "f.parquet")
            .unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
        let err = Predicate::gt("nope", 1)
            .bind(&b.schema(), "f.parquet")
            .unwrap_err();
        assert!(matches!(err, ParquetError::ColumnNotFound { .. }));
    }

    #[test]
    fn pruning_uses_bounds_and_null_counts() {
        let b = batch();
        let stats = |_: &str| {
            Some(ContainerStats {
                mins: Arc::new(Int32Array::from(vec![Some(0), Some(10), None])) as ArrayRef,
                maxes: Arc::new(Int32Array::from(vec![Some(5), Some(20), None])) as ArrayRef,
                null_counts: UInt64Array::from(vec![Some(0), Some(0), None]),
                row_counts: Some(UInt64Array::from(vec![10, 10, 10])),
                min_exact: None,
                max_exact: None,
                slots_per_container: None,
            })
        };
        let bound = Predicate::gt("i", 7).bind(&b.schema(), "t").unwrap();
        assert_eq!(bound.may_match(3, &mut { stats }), vec![false, true, true]);
        let bound = Predicate::eq("i", 5).bind(&b.schema(), "t").unwrap();
        assert_eq!(bound.may_match(3, &mut { stats }), vec![true, false, true]);
        let bound = Predicate::is_null("i").bind(&b.schema(), "t").unwrap();
        assert_eq!(bound.may_match(3, &mut { stats }), vec![false, false, true]);
        let bound = Predicate::gt("i", 7)
            .or(Predicate::lt("i", 1))
            .bind(&b.schema(), "t")
            .unwrap();
        assert_eq!(bound.may_match(3, &mut { stats }), vec![true, true, true]);
    }
}
