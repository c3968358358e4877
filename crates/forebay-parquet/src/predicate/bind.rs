//! Binding a [`Predicate`] to a file's schema: each column found, each literal cast once to
//! the type it is compared in; the result, a [`BoundPredicate`], evaluates rows and prunes.

use arrow_array::{Array, ArrayRef};
use arrow_cast::{cast_with_options, CastOptions};
use arrow_schema::{DataType, Schema};

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
    pub(super) root: Node,
}

#[derive(Debug, Clone)]
pub(super) enum Node {
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
