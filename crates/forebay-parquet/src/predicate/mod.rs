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
//!   row is dropped; floats compare by IEEE rules (NaN unequal to everything, so `x != 1.0`
//!   keeps NaN rows; `-0.0 == 0.0`); a literal is compared in pyarrow's common type (a float
//!   with a float32 column in float64; an integer the column's type cannot hold decides the
//!   comparison for every row: `u8 < 300`); `x in [...]` is `is_in`'s: the list cast to the
//!   column's type, values equal by their bits (NaN in `[NaN]`, -0.0 not in `[0.0]`), a null
//!   `x` in the list exactly when it holds a null (`x not in [1]` keeps nulls);
//! * decides from min/max/null-count statistics whether a row group or page *may* hold a
//!   matching row ([`BoundPredicate::may_match`]). Unknown statistics always mean "may match",
//!   so pruning never changes a result: it only saves I/O and decoding.

//!
//! | module     | what                                                         |
//! |------------|--------------------------------------------------------------|
//! | this one   | what a user writes: [`Predicate`], [`Literal`], [`CompareOp`] |
//! | `bind`     | [`Predicate::bind`] to a schema: a [`BoundPredicate`]         |
//! | `evaluate` | [`BoundPredicate::evaluate`] on a batch                       |
//! | `prune`    | [`BoundPredicate::may_match`] from [`ContainerStats`]         |
//! | `constants`| [`Predicate::with_constants`]: a file's constant columns applied |

mod bind;
mod constants;
mod evaluate;
mod prune;
#[cfg(test)]
mod tests;

pub use bind::BoundPredicate;
pub use constants::Simplified;
pub use prune::ContainerStats;

use std::sync::Arc;

use arrow_array::{
    new_null_array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Float64Array, Int64Array,
    StringArray, TimestampMicrosecondArray, UInt64Array,
};
use arrow_schema::DataType;

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
    /// How the operator is written in a predicate's text.
    pub fn symbol(self) -> &'static str {
        match self {
            CompareOp::Eq => "==",
            CompareOp::NotEq => "!=",
            CompareOp::Lt => "<",
            CompareOp::LtEq => "<=",
            CompareOp::Gt => ">",
            CompareOp::GtEq => ">=",
        }
    }

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
    /// Two columns of a row compared (`left op right`): of the same type (a dictionary's
    /// value type counts), with the null and NaN rules of a comparison with a value. Statistics
    /// prune nothing by it.
    CompareColumns {
        left: String,
        op: CompareOp,
        right: String,
    },
    /// Rows the inner predicate rejects: three-valued, as pyarrow's `~` and SQL's `NOT` (a
    /// row whose inner result is null stays null, and is not kept). Statistics prune nothing
    /// under a `Not`.
    Not(Box<Predicate>),
}

/// `!predicate`: [`Predicate::Not`].
impl std::ops::Not for Predicate {
    type Output = Predicate;
    fn not(self) -> Predicate {
        Predicate::Not(Box::new(self))
    }
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
                write!(f, "{column:?} {} {value:?}", op.symbol())
            }
            Predicate::CompareColumns { left, op, right } => {
                write!(f, "{left:?} {} column {right:?}", op.symbol())
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
            Predicate::Not(inner) => write!(f, "not ({inner})"),
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
    /// `left op right`, two columns of each row compared ([`Predicate::CompareColumns`]).
    pub fn compare_columns(
        left: impl Into<String>,
        op: CompareOp,
        right: impl Into<String>,
    ) -> Self {
        Predicate::CompareColumns {
            left: left.into(),
            op,
            right: right.into(),
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
            Predicate::CompareColumns { left, right, .. } => {
                for column in [left, right] {
                    if !out.contains(column) {
                        out.push(column.clone());
                    }
                }
            }
            Predicate::And(children) | Predicate::Or(children) => {
                children.iter().for_each(|c| c.collect_columns(out))
            }
            Predicate::Not(inner) => inner.collect_columns(out),
        }
    }
}
