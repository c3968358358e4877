//! Binding a [`Predicate`] to a file's schema: each column found, each literal cast once to
//! the type it is compared in; the result, a [`BoundPredicate`], evaluates rows and prunes.

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Date32Array, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray,
};
use arrow_cast::{cast_with_options, CastOptions};
use arrow_schema::{DataType, Schema, TimeUnit};

use super::{CompareOp, Literal, Predicate};
use crate::error::column_not_found;
use crate::error::{ParquetError, Result};

impl Predicate {
    /// Check the predicate against `schema` (the columns as they will be decoded) and cast
    /// every literal to the type it is compared in. `path` names the file in errors.
    pub fn bind(&self, schema: &Schema, path: &str) -> Result<BoundPredicate> {
        let node = match self {
            Predicate::Compare { column, op, value } => {
                let (data_type, _) = column_type(schema, column, path)?;
                match outside_integer_type(&data_type, value) {
                    Some(side) => Node::Decided {
                        column: column.clone(),
                        value: side.decides(*op),
                    },
                    None => Node::Compare {
                        column: column.clone(),
                        op: *op,
                        operand: bind_literal(column, &data_type, value)?,
                    },
                }
            }
            Predicate::In {
                column,
                values,
                negated,
            } => {
                let (data_type, _) = column_type(schema, column, path)?;
                let mut operands = Vec::with_capacity(values.len());
                let mut matches_null = false;
                // pyarrow casts the whole list to an integer column's type when it can;
                // when a float of it cannot be (1.5, NaN), it compares in float64 instead,
                // where -0.0 is not the integer 0 (is_in tells the zeros apart).
                let integers = value_type(&data_type).is_integer();
                let whole_list = !integers
                    || values.iter().all(|v| match v {
                        Literal::Float(f) => whole_in(value_type(&data_type), *f),
                        _ => true,
                    });
                for value in values {
                    match value {
                        Literal::Null => matches_null = true,
                        Literal::Float(f) if !whole_list && *f == 0.0 && f.is_sign_negative() => {}
                        value => operands.extend(bind_member(column, &data_type, value)?),
                    }
                }
                Node::In {
                    column: column.clone(),
                    operands,
                    matches_null,
                    negated: *negated,
                }
            }
            Predicate::CompareColumns { left, op, right } => {
                let (left_type, _) = column_type(schema, left, path)?;
                let (right_type, _) = column_type(schema, right, path)?;
                let compare_type = value_type(&left_type);
                if compare_type != value_type(&right_type) {
                    return Err(ParquetError::InvalidFilter {
                        column: left.clone(),
                        reason: format!(
                            "compared with column '{right}', whose type {right_type} is not \
                             {left_type}: cast one of them first"
                        ),
                    });
                }
                Node::CompareColumns {
                    left: left.clone(),
                    op: *op,
                    right: right.clone(),
                    compare_type: compare_type.clone(),
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
            Predicate::Not(inner) => Node::Not(Box::new(inner.bind(schema, path)?.root)),
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
pub(super) fn value_type(data_type: &DataType) -> &DataType {
    match data_type {
        DataType::Dictionary(_, v) => v.as_ref(),
        other => other,
    }
}

pub(super) fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

/// A literal cast to the type in which it is compared with its column.
#[derive(Debug, Clone)]
pub(super) struct Operand {
    /// The literal as a one-element array of `compare_type`.
    pub(super) value: ArrayRef,
    /// The type both sides are compared in.
    pub(super) compare_type: DataType,
    /// The literal is NaN (compares unequal to everything under IEEE rules).
    pub(super) value_is_nan: bool,
}

/// Where an integer literal lies against a column of a narrower integer type.
#[derive(Debug, Clone, Copy)]
enum OutsideType {
    Below,
    Above,
}

impl OutsideType {
    /// `column op literal` for every value the column's type holds.
    fn decides(self, op: CompareOp) -> bool {
        match op {
            CompareOp::Eq => false,
            CompareOp::NotEq => true,
            CompareOp::Lt | CompareOp::LtEq => matches!(self, OutsideType::Above),
            CompareOp::Gt | CompareOp::GtEq => matches!(self, OutsideType::Below),
        }
    }
}

/// The range of an integer type, as `i128`.
fn integer_range(data_type: &DataType) -> Option<(i128, i128)> {
    use DataType::*;
    Some(match data_type {
        Int8 => (i8::MIN.into(), i8::MAX.into()),
        Int16 => (i16::MIN.into(), i16::MAX.into()),
        Int32 => (i32::MIN.into(), i32::MAX.into()),
        Int64 => (i64::MIN.into(), i64::MAX.into()),
        UInt8 => (0, u8::MAX.into()),
        UInt16 => (0, u16::MAX.into()),
        UInt32 => (0, u32::MAX.into()),
        UInt64 => (0, u64::MAX.into()),
        _ => return None,
    })
}

fn integer_literal(literal: &Literal) -> Option<i128> {
    match literal {
        Literal::Int(v) => Some((*v).into()),
        Literal::UInt(v) => Some((*v).into()),
        _ => None,
    }
}

/// An integer literal the integer column's type cannot hold: pyarrow compares both in a
/// wider type, where the answer is the same for every row (`u8 < 300` holds for all).
fn outside_integer_type(column_type: &DataType, literal: &Literal) -> Option<OutsideType> {
    let (lo, hi) = integer_range(value_type(column_type))?;
    let v = integer_literal(literal)?;
    if v < lo {
        Some(OutsideType::Below)
    } else if v > hi {
        Some(OutsideType::Above)
    } else {
        None
    }
}

/// Whether `data_type` is a timestamp with a time zone (instants) or without (wall-clock).
fn timestamp_zone(data_type: &DataType) -> Option<Option<&str>> {
    match data_type {
        DataType::Timestamp(_, tz) => Some(tz.as_deref()),
        _ => None,
    }
}

fn units_per_second(unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    }
}

/// A timestamp of `data_type` (its unit and zone) holding `micros`, truncated to its unit.
fn timestamp_scalar(micros: i128, data_type: &DataType) -> Option<ArrayRef> {
    let DataType::Timestamp(unit, tz) = data_type else {
        return None;
    };
    let v = micros * i128::from(units_per_second(*unit)) / 1_000_000;
    let v = i64::try_from(v).ok()?;
    let tz = tz.clone();
    Some(match unit {
        TimeUnit::Second => Arc::new(TimestampSecondArray::from(vec![v]).with_timezone_opt(tz)),
        TimeUnit::Millisecond => {
            Arc::new(TimestampMillisecondArray::from(vec![v]).with_timezone_opt(tz))
        }
        TimeUnit::Microsecond => {
            Arc::new(TimestampMicrosecondArray::from(vec![v]).with_timezone_opt(tz))
        }
        TimeUnit::Nanosecond => {
            Arc::new(TimestampNanosecondArray::from(vec![v]).with_timezone_opt(tz))
        }
    })
}

const MICROS_PER_DAY: i128 = 86_400_000_000;

/// A literal cast to the type in which `column` is compared with it (`==`, `<`, ...): the
/// common type pyarrow's comparison kernels cast both sides to.
fn bind_literal(column: &str, column_type: &DataType, literal: &Literal) -> Result<Operand> {
    use DataType::*;
    let vt = value_type(column_type);
    let mismatch = || mismatch(column, column_type, literal);
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
        // A Python float is a float64: a float32 column is compared in float64, as pyarrow
        // does (`f32 == 0.1` holds for no row: 0.1 has no float32).
        Literal::Float(_) if is_float(vt) => Float64,
        Literal::Float(_) if is_decimal => vt.clone(),
        // A fractional value against integers: compare both as float64, as pyarrow does.
        Literal::Float(_) if is_int => Float64,
        Literal::Decimal(_) if is_decimal || is_float(vt) || is_int => vt.clone(),
        Literal::Str(_) if is_string || is_binary || is_temporal || is_decimal => vt.clone(),
        Literal::Bytes(_) if is_binary => vt.clone(),
        // A date against timestamps is its midnight, UTC for a zoned column (pyarrow's cast
        // of a date32 to a timestamp): built here, no time zone consulted.
        Literal::Date(days) if timestamp_zone(vt).is_some() => {
            let value =
                timestamp_scalar(i128::from(*days) * MICROS_PER_DAY, vt).ok_or_else(mismatch)?;
            return Ok(Operand {
                value,
                compare_type: vt.clone(),
                value_is_nan: false,
            });
        }
        Literal::Date(_) if matches!(vt, Date32 | Date64) => vt.clone(),
        Literal::Timestamp { micros, tz } => match (timestamp_zone(vt), vt) {
            (Some(zone), _) if zone.is_some() != tz.is_some() => {
                return Err(zone_mismatch(column, column_type, tz.is_some()))
            }
            // The finer unit of the two, as pyarrow: a column in seconds is compared with a
            // datetime's microseconds, not the datetime cut to seconds.
            (Some(_), Timestamp(unit, zone)) => {
                let unit = if units_per_second(*unit) < 1_000_000 {
                    TimeUnit::Microsecond
                } else {
                    *unit
                };
                let compare_type = Timestamp(unit, zone.clone());
                let value =
                    timestamp_scalar(i128::from(*micros), &compare_type).ok_or_else(mismatch)?;
                return Ok(Operand {
                    value,
                    compare_type,
                    value_is_nan: false,
                });
            }
            // A date column against a datetime: the date's midnight (UTC for an aware one).
            (None, Date32 | Date64) => {
                let compare_type = Timestamp(TimeUnit::Microsecond, None);
                let value =
                    timestamp_scalar(i128::from(*micros), &compare_type).ok_or_else(mismatch)?;
                return Ok(Operand {
                    value,
                    compare_type,
                    value_is_nan: false,
                });
            }
            _ => return Err(mismatch()),
        },
        _ => return Err(mismatch()),
    };
    let value_is_nan = matches!(literal, Literal::Float(f) if f.is_nan());
    let value = cast_literal(column, column_type, literal, &compare_type)?;
    Ok(Operand {
        value,
        compare_type,
        value_is_nan,
    })
}

/// Whether the integer type `vt` holds `f` exactly (no fraction, in range, not NaN).
fn whole_in(vt: &DataType, f: f64) -> bool {
    f.fract() == 0.0
        && integer_range(vt).is_some_and(|(lo, hi)| (lo as f64) <= f && f <= (hi as f64))
}

/// A value of an `in` list as pyarrow's `is_in` takes it: cast to the column's type. A
/// number the type cannot hold exactly (`300` for a `uint8`, `1.5` for an integer) matches
/// no row and is left out (`None`); a value of no castable kind is an error, as a
/// comparison's.
fn bind_member(column: &str, column_type: &DataType, literal: &Literal) -> Result<Option<Operand>> {
    use DataType::*;
    let vt = value_type(column_type);
    let numeric = vt.is_integer() || is_float(vt);
    let operand = |value: ArrayRef| {
        Ok(Some(Operand {
            value,
            compare_type: vt.clone(),
            value_is_nan: matches!(literal, Literal::Float(f) if f.is_nan()),
        }))
    };
    match literal {
        Literal::Int(_) | Literal::UInt(_) if vt.is_integer() => {
            if outside_integer_type(vt, literal).is_some() {
                return Ok(None);
            }
            operand(cast_literal(column, column_type, literal, vt)?)
        }
        Literal::Float(f) if vt.is_integer() => {
            if !whole_in(vt, *f) {
                return Ok(None);
            }
            operand(cast_literal(column, column_type, &Literal::Float(*f), vt)?)
        }
        // Booleans are 1 and 0 to numbers, and numbers are true when not 0 to booleans.
        Literal::Bool(b) if numeric => operand(cast_literal(
            column,
            column_type,
            &Literal::Int(i64::from(*b)),
            vt,
        )?),
        Literal::Int(_) | Literal::UInt(_) | Literal::Float(_) if matches!(vt, Boolean) => {
            let truth = match literal {
                Literal::Int(v) => *v != 0,
                Literal::UInt(v) => *v != 0,
                Literal::Float(v) => *v != 0.0,
                _ => unreachable!("matched above"),
            };
            operand(cast_literal(
                column,
                column_type,
                &Literal::Bool(truth),
                vt,
            )?)
        }
        // A float list value is cast to the column's float type (`f32 in [0.1]` holds for
        // the float32 nearest 0.1), where a comparison widens the column instead.
        Literal::Float(_) | Literal::Int(_) | Literal::UInt(_) if is_float(vt) => {
            operand(cast_literal(column, column_type, literal, vt)?)
        }
        // A numeric string is parsed into a numeric column (pyarrow casts the list).
        Literal::Str(_) if numeric => operand(cast_literal(column, column_type, literal, vt)?),
        Literal::Bytes(_) if matches!(vt, Utf8 | LargeUtf8 | Utf8View) => {
            operand(cast_literal(column, column_type, literal, vt)?)
        }
        // A datetime listed for a date column is its date (pyarrow's cast truncates).
        Literal::Timestamp { micros, .. } if matches!(vt, Date32) => {
            let days = i32::try_from(i128::from(*micros).div_euclid(MICROS_PER_DAY))
                .map_err(|_| mismatch(column, column_type, literal))?;
            operand(Arc::new(Date32Array::from(vec![days])))
        }
        _ => bind_member_as_compared(column, column_type, literal),
    }
}

/// A list's value bound as a comparison binds it, then cast to the column's type where the
/// comparison's is finer.
fn bind_member_as_compared(
    column: &str,
    column_type: &DataType,
    literal: &Literal,
) -> Result<Option<Operand>> {
    let vt = value_type(column_type);
    let bound = bind_literal(column, column_type, literal)?;
    if &bound.compare_type == vt {
        return Ok(Some(bound));
    }
    // Compared in a finer type than the column's: a value between two of the column's (a
    // datetime with microseconds, a column in seconds) is in no row.
    let back = arrow_cast::cast(&bound.value, vt).ok();
    let exact = back
        .as_ref()
        .and_then(|b| arrow_cast::cast(b, &bound.compare_type).ok());
    Ok(match (back, exact) {
        (Some(back), Some(exact)) if exact.as_ref() == bound.value.as_ref() => Some(Operand {
            value: back,
            compare_type: vt.clone(),
            value_is_nan: false,
        }),
        _ => None,
    })
}

fn mismatch(column: &str, column_type: &DataType, literal: &Literal) -> ParquetError {
    ParquetError::InvalidFilter {
        column: column.to_string(),
        reason: format!(
            "value {literal} ({}) cannot be compared with a column of type {column_type}",
            literal.kind()
        ),
    }
}

fn zone_mismatch(column: &str, column_type: &DataType, literal_is_aware: bool) -> ParquetError {
    let reason = if literal_is_aware {
        format!(
            "a datetime with a time zone cannot be compared with a column of type \
             {column_type}, which has none (as in pyarrow): compare with a naive datetime"
        )
    } else {
        format!(
            "a naive datetime cannot be compared with a column of type {column_type}, which \
             has a time zone (as in pyarrow): give the datetime a tzinfo (e.g. \
             datetime.timezone.utc)"
        )
    };
    ParquetError::InvalidFilter {
        column: column.to_string(),
        reason,
    }
}

/// `literal` as a one-element array of `to`, exactly (no value lost or made null).
fn cast_literal(
    column: &str,
    column_type: &DataType,
    literal: &Literal,
    to: &DataType,
) -> Result<ArrayRef> {
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let value = cast_with_options(&literal.to_array(), to, &options).map_err(|e| {
        ParquetError::InvalidFilter {
            column: column.to_string(),
            reason: format!(
                "value {literal} ({}) does not fit the column's type {column_type}: {e}",
                literal.kind()
            ),
        }
    })?;
    if value.null_count() > 0 {
        return Err(mismatch(column, column_type, literal));
    }
    Ok(value)
}

/// A [`Predicate`] checked against a schema, ready to evaluate rows or statistics.
#[derive(Debug, Clone)]
pub struct BoundPredicate {
    pub(super) root: Node,
}

#[derive(Debug, Clone)]
pub(super) enum Node {
    Compare {
        column: String,
        op: CompareOp,
        operand: Operand,
    },
    /// `column in [...]` (`not in` when `negated`): pyarrow's `is_in`, each listed value
    /// cast to the column's type, values equal when their bits are (NaN is NaN, -0.0 is not
    /// 0.0). A null row is in the list exactly when the list holds a null.
    In {
        column: String,
        operands: Vec<Operand>,
        matches_null: bool,
        negated: bool,
    },
    /// A comparison whose answer the literal alone decides (an integer outside the column's
    /// type, e.g. `u8 < 300`): `value` for every non-null row, null for null rows.
    Decided {
        column: String,
        value: bool,
    },
    IsNull {
        column: String,
        negated: bool,
    },
    CompareColumns {
        left: String,
        op: CompareOp,
        right: String,
        /// Both columns' value type.
        compare_type: DataType,
    },
    And(Vec<Node>),
    Or(Vec<Node>),
    Not(Box<Node>),
}

impl BoundPredicate {
    /// Columns referenced by the predicate.
    pub fn columns(&self) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(n: &Node, out: &mut Vec<String>) {
            match n {
                Node::Compare { column, .. }
                | Node::In { column, .. }
                | Node::Decided { column, .. }
                | Node::IsNull { column, .. } => {
                    if !out.contains(column) {
                        out.push(column.clone())
                    }
                }
                Node::CompareColumns { left, right, .. } => {
                    for column in [left, right] {
                        if !out.contains(column) {
                            out.push(column.clone())
                        }
                    }
                }
                Node::And(c) | Node::Or(c) => c.iter().for_each(|n| walk(n, out)),
                Node::Not(inner) => walk(inner, out),
            }
        }
        walk(&self.root, &mut out);
        out
    }
}
