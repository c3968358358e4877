use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int32Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{Field, Schema};

use super::*;
use crate::error::ParquetError;

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
    // An integer the column's type cannot hold is no error: it decides the comparison, as
    // in pyarrow (no int32 is greater than 2**40; every one is less).
    let above = Predicate::gt("i", 1i64 << 40).bind(&b.schema(), "f.parquet");
    assert_eq!(above.unwrap().evaluate(&b).unwrap().true_count(), 0);
    let below = Predicate::lt("i", 1i64 << 40).bind(&b.schema(), "f.parquet");
    let valid = b.column_by_name("i").unwrap().len() - b.column_by_name("i").unwrap().null_count();
    assert_eq!(below.unwrap().evaluate(&b).unwrap().true_count(), valid);
    let err = Predicate::gt("nope", 1)
        .bind(&b.schema(), "f.parquet")
        .unwrap_err();
    assert!(matches!(err, ParquetError::ColumnNotFound { .. }));
}

/// Statistics of Int32 containers of 10 rows each: `Some((min, max))` with no nulls, or
/// `None` for a container whose statistics are unknown.
fn int_stats(containers: &[Option<(i32, i32)>]) -> ContainerStats {
    ContainerStats {
        mins: Arc::new(Int32Array::from_iter(
            containers.iter().map(|c| c.map(|b| b.0)),
        )) as ArrayRef,
        maxes: Arc::new(Int32Array::from_iter(
            containers.iter().map(|c| c.map(|b| b.1)),
        )) as ArrayRef,
        null_counts: UInt64Array::from_iter(containers.iter().map(|c| c.map(|_| 0))),
        row_counts: Some(UInt64Array::from(vec![10; containers.len()])),
        min_exact: None,
        max_exact: None,
        slots_per_container: None,
    }
}

#[test]
fn pruning_uses_bounds_and_null_counts() {
    let b = batch();
    let stats = |_: &str| Some(int_stats(&[Some((0, 5)), Some((10, 20)), None]));
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

/// NOT is three-valued, as pyarrow's `~`: a null inner result stays null (dropped), a NaN
/// that the inner comparison rejected is kept; statistics prune nothing under it.
#[test]
fn not_keeps_what_the_inner_predicate_rejects_and_nulls_stay_dropped() {
    assert_eq!(
        eval(!Predicate::gt("i", 2)),
        vec![true, false, false, false]
    );
    assert_eq!(
        eval(!Predicate::gt("f", 0.5)),
        vec![false, true, false, false]
    );
    assert_eq!(
        eval(!(Predicate::gt("i", 2).and(Predicate::eq("s", "b")))),
        vec![true, false, false, true]
    );
    assert_eq!(eval(!!Predicate::gt("i", 2)), eval(Predicate::gt("i", 2)));
    assert_eq!(
        (!Predicate::gt("x", 5)).to_string(),
        r#"not ("x" > Int(5))"#
    );
    assert_eq!(
        (!Predicate::gt("x", 5).and(Predicate::gt("y", 1))).columns(),
        ["x", "y"]
    );
    let b = batch();
    let stats = |_: &str| Some(int_stats(&[Some((0, 5)), Some((10, 20))]));
    let bound = (!Predicate::gt("i", 7)).bind(&b.schema(), "t").unwrap();
    assert_eq!(bound.may_match(2, &mut { stats }), vec![true, true]);
}

/// Two columns of a row compared: nulls drop, NaN on either side compares as IEEE says,
/// columns of different types are refused naming both, statistics prune nothing.
#[test]
fn columns_compared_with_each_other_follow_the_rules_of_values() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int32, true),
        Field::new("x", DataType::Float64, true),
        Field::new("y", DataType::Float64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int32Array::from(vec![Some(1), Some(5), None, Some(3)])),
            Arc::new(Int32Array::from(vec![Some(2), Some(5), Some(1), Some(1)])),
            Arc::new(Float64Array::from(vec![
                Some(1.0),
                Some(f64::NAN),
                Some(f64::NAN),
                None,
            ])),
            Arc::new(Float64Array::from(vec![
                Some(2.0),
                Some(f64::NAN),
                Some(1.0),
                Some(1.0),
            ])),
        ],
    )
    .unwrap();
    let eval = |p: Predicate| -> Vec<bool> {
        let bound = p.bind(&schema, "t").unwrap();
        bound
            .evaluate(&batch)
            .unwrap()
            .iter()
            .map(|v| v.unwrap())
            .collect()
    };
    let cols = |l: &str, op, r: &str| Predicate::compare_columns(l, op, r);
    assert_eq!(
        eval(cols("a", CompareOp::Lt, "b")),
        [true, false, false, false]
    );
    assert_eq!(
        eval(cols("a", CompareOp::GtEq, "b")),
        [false, true, false, true]
    );
    assert_eq!(
        eval(cols("x", CompareOp::Lt, "y")),
        [true, false, false, false]
    );
    assert_eq!(
        eval(cols("x", CompareOp::Eq, "y")),
        [false, false, false, false]
    );
    assert_eq!(
        eval(cols("x", CompareOp::NotEq, "y")),
        [true, true, true, false]
    );
    assert_eq!(
        cols("a", CompareOp::Lt, "b").to_string(),
        r#""a" < column "b""#
    );
    let err = cols("a", CompareOp::Lt, "x")
        .bind(&schema, "f.parquet")
        .unwrap_err();
    assert!(
        err.to_string().contains("'a'") && err.to_string().contains("'x'"),
        "{err}"
    );
    let err = cols("a", CompareOp::Lt, "nope")
        .bind(&schema, "f.parquet")
        .unwrap_err();
    assert!(matches!(err, ParquetError::ColumnNotFound { .. }));
    let stats = |_: &str| Some(int_stats(&[Some((0, 5))]));
    let bound = cols("a", CompareOp::Lt, "b").bind(&schema, "t").unwrap();
    assert_eq!(bound.may_match(1, &mut { stats }), vec![true]);
}
