//! A predicate over a file whose values of some columns are constant (hive partition columns,
//! known from its directories): decided where those columns decide it, else what is left to
//! the file's rows.
//!
//! ```text
//!  (year == 2024 and x > 5) or year == 2023      with year = 2024 in this file
//!        true   and x > 5  or  false          ──► Rows(x > 5)
//!                                 year = 2022 ──► False: the file is not read
//! ```
//!
//! Terms on the constant columns are evaluated exactly (the literal cast, null and NaN rules
//! of [`BoundPredicate`](super::BoundPredicate)); a comparison of a constant column with a
//! file column becomes a comparison of the file column with the constant. A term that is
//! null (a null partition value compared) is replaced by `false` where an even number of
//! `not`s enclose it and by `true` under an odd number: `and`, `or` and `not` follow
//! three-valued (Kleene) logic, in which a row is kept exactly when the result is true, and
//! with those replacements the result is true for the same rows.

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Float64Type, Int64Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;

use super::{CompareOp, Literal, Predicate};
use crate::error::Result;

/// What a predicate leaves to the rows of a file once its constant columns are known.
#[derive(Debug, Clone, PartialEq)]
pub enum Simplified {
    /// Every row matches: the file is read unfiltered.
    True,
    /// No row matches: the file is not read.
    False,
    /// The rows matching this predicate (over the file's own columns only).
    Rows(Predicate),
}

impl Predicate {
    /// This predicate over a file whose columns in `constants` (a one-row batch) hold that
    /// row's values throughout; `path` names the file in errors.
    pub fn with_constants(&self, constants: &RecordBatch, path: &str) -> Result<Simplified> {
        Ok(match partial(self, constants, true, path)? {
            Partial::Known(true) => Simplified::True,
            Partial::Known(false) => Simplified::False,
            Partial::Rows(rows) => Simplified::Rows(rows),
        })
    }
}

enum Partial {
    Known(bool),
    Rows(Predicate),
}

/// `predicate` with the constants substituted; `positive` when an even number of `not`s
/// enclose it (see the module docs for why that decides what a null becomes).
fn partial(
    predicate: &Predicate,
    constants: &RecordBatch,
    positive: bool,
    path: &str,
) -> Result<Partial> {
    let is_constant = |column: &str| constants.schema().index_of(column).is_ok();
    let evaluated = |term: &Predicate| -> Result<Partial> {
        let bound = term.bind(&constants.schema(), path)?;
        let value = bound
            .evaluate_nullable(constants)
            .map_err(|e| crate::error::corrupt_from(path, None, e))?;
        Ok(Partial::Known(if value.is_null(0) {
            !positive
        } else {
            value.value(0)
        }))
    };
    match predicate {
        Predicate::Compare { column, .. }
        | Predicate::In { column, .. }
        | Predicate::IsNull { column, .. } => {
            if is_constant(column) {
                evaluated(predicate)
            } else {
                Ok(Partial::Rows(predicate.clone()))
            }
        }
        Predicate::CompareColumns { left, op, right } => {
            match (is_constant(left), is_constant(right)) {
                (true, true) => evaluated(predicate),
                (false, false) => Ok(Partial::Rows(predicate.clone())),
                (true, false) => against_constant(right, flipped(*op), left, constants, positive),
                (false, true) => against_constant(left, *op, right, constants, positive),
            }
        }
        Predicate::And(terms) => junction(terms, false, Predicate::And, constants, positive, path),
        Predicate::Or(terms) => junction(terms, true, Predicate::Or, constants, positive, path),
        Predicate::Not(inner) => Ok(match partial(inner, constants, !positive, path)? {
            Partial::Known(value) => Partial::Known(!value),
            Partial::Rows(rows) => Partial::Rows(Predicate::Not(Box::new(rows))),
        }),
    }
}

/// The terms of an `and` (`absorbing` false) or an `or` (`absorbing` true): a term known to
/// be `absorbing` decides it, one known to be the other drops out.
fn junction(
    terms: &[Predicate],
    absorbing: bool,
    join: fn(Vec<Predicate>) -> Predicate,
    constants: &RecordBatch,
    positive: bool,
    path: &str,
) -> Result<Partial> {
    let mut rows = Vec::new();
    for term in terms {
        match partial(term, constants, positive, path)? {
            Partial::Known(value) if value == absorbing => return Ok(Partial::Known(absorbing)),
            Partial::Known(_) => {}
            Partial::Rows(r) => rows.push(r),
        }
    }
    Ok(combined(rows, !absorbing, join))
}

/// The terms left of an `and`/`or`: none is its identity (`empty`), one is itself.
fn combined(
    mut rows: Vec<Predicate>,
    empty: bool,
    join: fn(Vec<Predicate>) -> Predicate,
) -> Partial {
    match rows.len() {
        0 => Partial::Known(empty),
        1 => Partial::Rows(rows.pop().expect("one term")),
        _ => Partial::Rows(join(rows)),
    }
}

/// `column op constant`, the constant being the value of column `constant` in this file.
fn against_constant(
    column: &str,
    op: CompareOp,
    constant: &str,
    constants: &RecordBatch,
    positive: bool,
) -> Result<Partial> {
    let array = constants
        .column_by_name(constant)
        .expect("the caller checked the column is constant");
    if array.is_null(0) {
        // A comparison with null is null.
        return Ok(Partial::Known(!positive));
    }
    let as_int64 = arrow_cast::cast(array, &DataType::Int64).ok();
    let value = match array.data_type() {
        DataType::Utf8 => Literal::Str(array.as_string::<i32>().value(0).to_string()),
        DataType::LargeUtf8 => Literal::Str(array.as_string::<i64>().value(0).to_string()),
        DataType::Boolean => Literal::Bool(array.as_boolean().value(0)),
        DataType::Float32 | DataType::Float64 => {
            let floats = arrow_cast::cast(array, &DataType::Float64).expect("a float widens");
            Literal::Float(floats.as_primitive::<Float64Type>().value(0))
        }
        DataType::Date32 => Literal::Date(array.as_primitive::<Date32Type>().value(0)),
        DataType::UInt64 => Literal::UInt(array.as_primitive::<UInt64Type>().value(0)),
        t if t.is_integer() && as_int64.is_some() => Literal::Int(
            as_int64
                .expect("checked")
                .as_primitive::<Int64Type>()
                .value(0),
        ),
        other => {
            return Err(crate::error::ParquetError::InvalidFilter {
                column: constant.to_string(),
                reason: format!(
                    "comparing column '{column}' with the partition column '{constant}' of type \
                     {other} is not supported; compare '{column}' with a value instead"
                ),
            })
        }
    };
    Ok(Partial::Rows(Predicate::compare(column, op, value)))
}

/// The operator with its operands swapped (`a < b` is `b > a`).
fn flipped(op: CompareOp) -> CompareOp {
    match op {
        CompareOp::Lt => CompareOp::Gt,
        CompareOp::LtEq => CompareOp::GtEq,
        CompareOp::Gt => CompareOp::Lt,
        CompareOp::GtEq => CompareOp::LtEq,
        same => same,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, StringArray};

    use super::*;

    fn constants(year: Option<i64>, region: Option<&str>) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("year", Arc::new(Int64Array::from(vec![year])) as ArrayRef),
            (
                "region",
                Arc::new(StringArray::from(vec![region])) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    fn simplify(p: &Predicate, c: &RecordBatch) -> Simplified {
        p.with_constants(c, "f.parquet").unwrap()
    }

    #[test]
    fn terms_on_constants_decide_and_the_rest_is_left_to_the_rows() {
        let c = constants(Some(2024), Some("eu"));
        let x = Predicate::gt("x", 5);
        assert_eq!(simplify(&Predicate::eq("year", 2024), &c), Simplified::True);
        assert_eq!(
            simplify(&Predicate::eq("year", 2023), &c),
            Simplified::False
        );
        assert_eq!(
            simplify(&Predicate::eq("year", 2024).and(x.clone()), &c),
            Simplified::Rows(x.clone())
        );
        assert_eq!(
            simplify(&Predicate::eq("year", 2023).and(x.clone()), &c),
            Simplified::False
        );
        assert_eq!(
            simplify(&Predicate::eq("year", 2023).or(x.clone()), &c),
            Simplified::Rows(x.clone())
        );
        assert_eq!(
            simplify(&Predicate::eq("region", "eu").or(x.clone()), &c),
            Simplified::True
        );
        assert_eq!(
            simplify(&!(Predicate::eq("region", "eu").and(x.clone())), &c),
            Simplified::Rows(!x.clone())
        );
        assert_eq!(simplify(&x, &c), Simplified::Rows(x.clone()));
        // A string literal against the int64 column is an error, as for any column.
        assert!(Predicate::eq("year", "2024")
            .with_constants(&c, "f.parquet")
            .is_err());
        assert_eq!(
            simplify(
                &Predicate::is_in("region", vec!["us".into(), "eu".into()]),
                &c
            ),
            Simplified::True
        );
    }

    #[test]
    fn a_comparison_of_a_file_column_with_a_constant_one_takes_its_value() {
        let c = constants(Some(2024), None);
        assert_eq!(
            simplify(&Predicate::compare_columns("year", CompareOp::Lt, "y"), &c),
            Simplified::Rows(Predicate::compare("y", CompareOp::Gt, 2024))
        );
        assert_eq!(
            simplify(
                &Predicate::compare_columns("y", CompareOp::LtEq, "year"),
                &c
            ),
            Simplified::Rows(Predicate::compare("y", CompareOp::LtEq, 2024))
        );
        // With the null region: null, so no row.
        assert_eq!(
            simplify(
                &Predicate::compare_columns("y", CompareOp::Eq, "region"),
                &c
            ),
            Simplified::False
        );
    }

    #[test]
    fn a_null_constant_keeps_the_rows_three_valued_logic_keeps() {
        let c = constants(None, None);
        let x = Predicate::gt("x", 5);
        // null == 2024 is null: no row.
        assert_eq!(
            simplify(&Predicate::eq("year", 2024), &c),
            Simplified::False
        );
        // not (null == 2024) is null too: still no row.
        assert_eq!(
            simplify(&!Predicate::eq("year", 2024), &c),
            Simplified::False
        );
        assert_eq!(simplify(&Predicate::is_null("year"), &c), Simplified::True);
        // null or x: the rows where x is true.
        assert_eq!(
            simplify(&Predicate::eq("year", 2024).or(x.clone()), &c),
            Simplified::Rows(x.clone())
        );
        // not (null and x): true where x is false, null elsewhere: the rows where not x.
        assert_eq!(
            simplify(&!(Predicate::eq("year", 2024).and(x.clone())), &c),
            Simplified::Rows(!x.clone())
        );
        // not (null or x): false where x is true, null elsewhere: no row.
        assert_eq!(
            simplify(&!(Predicate::eq("year", 2024).or(x.clone())), &c),
            Simplified::False
        );
        // not not (null and x): null or false: no row.
        assert_eq!(
            simplify(&!!(Predicate::eq("year", 2024).and(x.clone())), &c),
            Simplified::False
        );
    }

    #[test]
    fn a_bad_term_on_a_constant_column_is_an_error() {
        let c = constants(Some(2024), Some("eu"));
        let err = Predicate::gt("year", "not a number")
            .with_constants(&c, "f.parquet")
            .unwrap_err();
        assert!(err.to_string().contains("year"), "{err}");
    }
}
