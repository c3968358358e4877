//! Whether a container (a row group, a page) may hold a matching row, from its min/max and
//! null-count statistics. Unknown statistics always mean "may match".

use arrow_arith::boolean;
use arrow_array::{Array, ArrayRef, BooleanArray, Scalar, UInt64Array};
use arrow_ord::cmp;
use arrow_schema::DataType;

use super::bind::is_float;
use super::bind::{BoundPredicate, Node, Operand};
use super::evaluate::{compare_with_value, nan_mask, null_as_false, to_compare_type};
use super::CompareOp;

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

/// Prepared min/max of one column in the comparison type, NaN bounds turned unknown.
struct Bounds {
    mins: ArrayRef,
    maxes: ArrayRef,
}

fn prepare_bounds(stats: &ContainerStats, compare_type: &DataType) -> Option<Bounds> {
    let prep = |a: &ArrayRef| -> Option<ArrayRef> {
        let a = to_compare_type(a, compare_type).ok()?;
        let a = match a.data_type() {
            DataType::Dictionary(_, v) => arrow_cast::cast(&a, v).ok()?,
            _ => a,
        };
        // A NaN bound says nothing usable under IEEE comparison: make it unknown.
        match nan_mask(&a) {
            Some(nan) if nan.true_count() > 0 => {
                let keep = boolean::not(&null_as_false(&nan)).ok()?;
                arrow_select::nullif::nullif(&a, &boolean::not(&keep).ok()?).ok()
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
    // (floats returned above: this order is total, which is exact for the rest)
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
    // Bounds compare as the rows do (IEEE for floats: a max of -0.0 may hide 0.0 rows and
    // is equal to it), so a container is kept whenever one of its rows may match.
    let v = &operand.value;
    let bound = |bounds: &ArrayRef, op| compare_with_value(bounds, op, v).ok();
    let out = match op {
        CompareOp::Gt => unknown_as_true(&bound(&bounds.maxes, CompareOp::Gt)?),
        CompareOp::GtEq => unknown_as_true(&bound(&bounds.maxes, CompareOp::GtEq)?),
        CompareOp::Lt => unknown_as_true(&bound(&bounds.mins, CompareOp::Lt)?),
        CompareOp::LtEq => unknown_as_true(&bound(&bounds.mins, CompareOp::LtEq)?),
        CompareOp::Eq => {
            let lo = unknown_as_true(&bound(&bounds.mins, CompareOp::LtEq)?);
            let hi = unknown_as_true(&bound(&bounds.maxes, CompareOp::GtEq)?);
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

/// A container with only nulls matches no comparison: `keep` false for those.
fn all_null_match_nothing(s: &ContainerStats, keep: &mut [bool]) {
    if let Some(rows) = &s.row_counts {
        for (i, keep) in keep.iter_mut().enumerate() {
            if s.null_counts.is_valid(i)
                && rows.is_valid(i)
                && s.null_counts.value(i) == rows.value(i)
            {
                *keep = false;
            }
        }
    }
}

pub(super) fn prune_node(
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
                all_null_match_nothing(&s, &mut out);
                s.expand(out, n)
            }
            None => keep_all(),
        },
        Node::Decided { column, value } => match stats(column) {
            Some(s) => {
                let mut out = vec![*value; s.len()];
                all_null_match_nothing(&s, &mut out);
                s.expand(out, n)
            }
            None => vec![*value; n],
        },
        Node::In {
            column,
            operands,
            matches_null,
            negated,
        } => match stats(column) {
            Some(s) if !*negated => {
                let m = s.len();
                let mut out = vec![false; m];
                for operand in operands {
                    // Statistics do not count NaNs: a container may hold one.
                    let hit = match operand.value_is_nan {
                        true => None,
                        false => prune_compare(m, &s, CompareOp::Eq, operand),
                    };
                    let hit = hit.unwrap_or_else(|| vec![true; m]);
                    out.iter_mut().zip(hit).for_each(|(o, h)| *o |= h);
                }
                if *matches_null {
                    for (i, keep) in out.iter_mut().enumerate() {
                        *keep |= !no_nulls(&s, i);
                    }
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
        // "The inner predicate may match" says nothing of the rows it rejects.
        Node::Not(_) => keep_all(),
        // Bounds of two columns say little of their rows' pairs.
        Node::CompareColumns { .. } => keep_all(),
    }
}
