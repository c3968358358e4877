"""How well a stream of batches is shuffled, measured on a dataset whose rows carry where
they came from (``pos``: the row's place in file order, ``file``, ``row_group``, ``label``:
a label sorted with the input, so that file order is the worst order).

Metrics of one epoch's batches, each against what a uniform random permutation gives:
- chi-square of the contingency tables batch x file and batch x label (all full batches of
  the epoch; scipy's test of independence): its p-value, and Cramér's V, the effect size
  (0 for a uniform shuffle whatever the number of batches, 1 for file order).
- displacement: |position out - position in| / rows; a uniform permutation has density
  2(1 - d), mean 1/3. Reported: mean, and the Kolmogorov-Smirnov distance to that law.
- same-row-group pairs: the fraction of pairs of samples within a batch that come from the
  same row group, and what a uniform shuffle gives (the sum of squared row-group shares).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
from scipy import stats


def collect(batches: Iterable[pa.RecordBatch], batch_size: int) -> dict[str, np.ndarray]:
    """The columns of the full batches (a short last batch is left out), stacked, with each
    sample's batch number."""
    parts: dict[str, list[np.ndarray]] = {"pos": [], "file": [], "row_group": [], "label": []}
    for batch in batches:
        if batch.num_rows != batch_size:
            continue
        for name, values in parts.items():
            values.append(batch.column(name).to_numpy(zero_copy_only=False))
    columns = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
    columns["batch"] = np.arange(len(columns["pos"])) // batch_size
    return columns


def _chi_square(batch: np.ndarray, category: np.ndarray) -> tuple[float, float]:
    """(p-value, Cramér's V) of batch x category."""
    _, category = np.unique(category, return_inverse=True)
    table = np.zeros((batch.max() + 1, category.max() + 1), np.int64)
    np.add.at(table, (batch, category), 1)
    table = table[:, table.sum(axis=0) > 0]
    if min(table.shape) < 2:
        return float("nan"), float("nan")
    result = stats.chi2_contingency(table, correction=False)
    v = math.sqrt(result.statistic / (table.sum() * (min(table.shape) - 1)))
    return float(result.pvalue), v


def quality(columns: dict[str, np.ndarray], rows: int, row_group_rows: np.ndarray) -> dict:
    """The metrics of the module docstring. ``rows``: the dataset's rows; ``row_group_rows``:
    rows of each row group (numbered as in the ``row_group`` column)."""
    batch = columns["batch"]
    n = len(batch)
    out: dict[str, float] = {"samples": n}
    out["file_p"], out["file_v"] = _chi_square(batch, columns["file"])
    out["label_p"], out["label_v"] = _chi_square(batch, columns["label"])
    d = np.abs(np.arange(n) - columns["pos"]) / rows
    out["displacement_mean"] = float(d.mean())
    d.sort()
    uniform_cdf = 1 - (1 - d) ** 2
    empirical = np.arange(1, n + 1) / n
    out["displacement_ks"] = float(np.max(np.abs(empirical - uniform_cdf)))
    # Same-row-group pairs within each batch.
    key = batch.astype(np.int64) * (int(columns["row_group"].max()) + 1) + columns["row_group"]
    _, counts = np.unique(key, return_counts=True)
    same = float((counts * (counts - 1) // 2).sum())
    batch_size = n // (batch.max() + 1) if n else 1
    pairs = (batch.max() + 1) * batch_size * (batch_size - 1) / 2
    out["same_row_group_pairs"] = same / pairs if pairs else float("nan")
    shares = row_group_rows / row_group_rows.sum()
    out["same_row_group_pairs_uniform"] = float((shares**2).sum())
    return out
