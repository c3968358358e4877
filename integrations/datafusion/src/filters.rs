//! DataFusion filter expressions that forebay's reader evaluates ([`Predicate`]): a column
//! compared with a literal or with a column of its type, IN lists, BETWEEN, IS (NOT) NULL, and AND / OR / NOT of those
//! (NOT of no IN list: forebay's IN, pyarrow's, is false for a null value where SQL's is
//! null, so their negations differ on nulls). Anything else stays with DataFusion.

use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator};
use datafusion::scalar::ScalarValue;
use forebay_parquet::{CompareOp, Literal, Predicate};

/// `expr` as a forebay predicate, when every part of it has one.
pub fn to_predicate(expr: &Expr) -> Option<Predicate> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => Some(to_predicate(left)?.and(to_predicate(right)?)),
            Operator::Or => Some(to_predicate(left)?.or(to_predicate(right)?)),
            _ => comparison(left, *op, right),
        },
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) => {
            let column = column_name(expr)?;
            Some(
                Predicate::compare(column.clone(), CompareOp::GtEq, literal(low)?)
                    .and(Predicate::compare(column, CompareOp::LtEq, literal(high)?)),
            )
        }
        Expr::IsNull(inner) => Some(Predicate::is_null(column_name(inner)?)),
        Expr::IsNotNull(inner) => Some(Predicate::is_not_null(column_name(inner)?)),
        Expr::InList(list) if !list.negated => {
            let values = list.list.iter().map(literal).collect::<Option<Vec<_>>>()?;
            Some(Predicate::is_in(column_name(&list.expr)?, values))
        }
        Expr::Not(inner) if !holds_in_list(inner) => Some(!to_predicate(inner)?),
        _ => None,
    }
}

/// Whether an IN list is part of `expr`.
fn holds_in_list(expr: &Expr) -> bool {
    match expr {
        Expr::InList(_) => true,
        Expr::BinaryExpr(BinaryExpr { left, right, .. }) => {
            holds_in_list(left) || holds_in_list(right)
        }
        Expr::Not(inner) => holds_in_list(inner),
        _ => false,
    }
}

/// Whether forebay's answer for `expr` (one [`to_predicate`] converts) is SQL's exactly: each
/// column compared is of a type whose comparisons agree (integers, decimals, dates,
/// strings, booleans; not floats, whose NaN the two order differently) and each literal
/// is of its column's very type (DataFusion's coercions already applied).
pub fn exact_for(expr: &Expr, schema: &arrow_schema::Schema) -> bool {
    use arrow_schema::DataType::*;
    let column_type = |e: &Expr| {
        column_name(e).and_then(|c| {
            schema
                .field_with_name(&c)
                .ok()
                .map(|f| f.data_type().clone())
        })
    };
    let literal_type = |e: &Expr| match e {
        Expr::Literal(v, _) if !v.is_null() => Some(v.data_type()),
        _ => None,
    };
    let comparable = |t: &arrow_schema::DataType| {
        matches!(
            t,
            Int8 | Int16
                | Int32
                | Int64
                | UInt8
                | UInt16
                | UInt32
                | UInt64
                | Decimal128(_, _)
                | Date32
                | Utf8
                | LargeUtf8
                | Utf8View
                | Boolean
        )
    };
    let same = |column: &Expr, value: &Expr| match (column_type(column), literal_type(value)) {
        (Some(c), Some(l)) => comparable(&c) && c == l,
        _ => match (column_type(column), column_type(value)) {
            // Two columns of one type.
            (Some(l), Some(r)) => comparable(&l) && l == r,
            _ => false,
        },
    };
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And | Operator::Or => exact_for(left, schema) && exact_for(right, schema),
            _ => same(left, right) || same(right, left),
        },
        Expr::Between(Between {
            expr, low, high, ..
        }) => same(expr, low) && same(expr, high),
        Expr::IsNull(inner) | Expr::IsNotNull(inner) => column_type(inner).is_some(),
        Expr::InList(list) => list.list.iter().all(|v| same(&list.expr, v)),
        Expr::Not(inner) => !holds_in_list(inner) && exact_for(inner, schema),
        _ => false,
    }
}

/// `column op literal`, or `literal op column` (turned around).
fn comparison(left: &Expr, op: Operator, right: &Expr) -> Option<Predicate> {
    let op_of = |op: Operator| {
        Some(match op {
            Operator::Eq => CompareOp::Eq,
            Operator::NotEq => CompareOp::NotEq,
            Operator::Lt => CompareOp::Lt,
            Operator::LtEq => CompareOp::LtEq,
            Operator::Gt => CompareOp::Gt,
            Operator::GtEq => CompareOp::GtEq,
            _ => return None,
        })
    };
    if let (Some(left), Some(right)) = (column_name(left), column_name(right)) {
        return Some(Predicate::compare_columns(left, op_of(op)?, right));
    }
    if let (Some(column), Some(value)) = (column_name(left), literal(right)) {
        return Some(Predicate::compare(column, op_of(op)?, value));
    }
    let (column, value) = (column_name(right)?, literal(left)?);
    Some(Predicate::compare(column, op_of(op.swap()?)?, value))
}

fn column_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Column(column) => Some(column.name.clone()),
        _ => None,
    }
}

/// A DataFusion literal as forebay's (not null: a comparison with null is left to
/// DataFusion).
fn literal(expr: &Expr) -> Option<Literal> {
    let Expr::Literal(value, _) = expr else {
        return None;
    };
    Some(match value {
        ScalarValue::Boolean(Some(v)) => Literal::Bool(*v),
        ScalarValue::Int8(Some(v)) => Literal::Int(*v as i64),
        ScalarValue::Int16(Some(v)) => Literal::Int(*v as i64),
        ScalarValue::Int32(Some(v)) => Literal::Int(*v as i64),
        ScalarValue::Int64(Some(v)) => Literal::Int(*v),
        ScalarValue::UInt8(Some(v)) => Literal::UInt(*v as u64),
        ScalarValue::UInt16(Some(v)) => Literal::UInt(*v as u64),
        ScalarValue::UInt32(Some(v)) => Literal::UInt(*v as u64),
        ScalarValue::UInt64(Some(v)) => Literal::UInt(*v),
        ScalarValue::Float32(Some(v)) => Literal::Float(*v as f64),
        ScalarValue::Float64(Some(v)) => Literal::Float(*v),
        ScalarValue::Utf8(Some(v))
        | ScalarValue::LargeUtf8(Some(v))
        | ScalarValue::Utf8View(Some(v)) => Literal::Str(v.clone()),
        ScalarValue::Date32(Some(v)) => Literal::Date(*v),
        ScalarValue::Decimal128(Some(v), _, scale) => Literal::Decimal(decimal_text(*v, *scale)),
        _ => return None,
    })
}

/// `unscaled` × 10^-`scale`, written out (`1234`, 2 → `"12.34"`).
fn decimal_text(unscaled: i128, scale: i8) -> String {
    if scale <= 0 {
        return format!("{unscaled}{}", "0".repeat((-scale) as usize));
    }
    let digits = unscaled.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    let sign = if unscaled < 0 { "-" } else { "" };
    format!("{sign}{whole}.{fraction}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    #[test]
    fn supported_filters_become_predicates_and_others_do_not() {
        let q6 = col("l_shipdate")
            .gt_eq(lit(ScalarValue::Date32(Some(8766))))
            .and(col("l_quantity").lt(lit(ScalarValue::Decimal128(Some(2400), 15, 2))))
            .and(col("l_discount").between(
                lit(ScalarValue::Decimal128(Some(5), 15, 2)),
                lit(ScalarValue::Decimal128(Some(7), 15, 2)),
            ));
        let predicate = to_predicate(&q6).unwrap();
        let shown = format!("{predicate:?}");
        assert!(shown.contains("24.00") && shown.contains("0.05"), "{shown}");
        assert!(
            to_predicate(&lit(1).lt(col("x"))).is_some(),
            "literal on the left"
        );
        assert!(to_predicate(&(col("x") + lit(1)).gt(lit(2))).is_none());
        assert!(to_predicate(&col("x").eq(lit(ScalarValue::Int64(None)))).is_none());
        assert_eq!(decimal_text(-5, 2), "-0.05");
        assert_eq!(decimal_text(1234, 0), "1234");
    }
}
