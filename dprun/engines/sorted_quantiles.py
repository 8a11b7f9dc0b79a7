"""Quantile trees and candidates on the sorted path: each value's leaf and weight, per shard.

A unit's n values in a partition weigh floor(min(n, m)·2^W / n) each (`unit_weight_expr`,
the same weight the Spark engine gives), and count only where the unit's (unit, partition)
pair survives contribution bounding. A light unit keeps every pair, so its leaves are summed
per (key, leaf) while the shard is in memory; a heavy unit's leaves are kept with its unit and
key codes until the boundings have chosen its pairs (`leaf_table`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from dprun.engines import release_steps
from dprun.engines.polars_steps import collect
from dprun.mechanisms.quantile_tree import unit_weight_expr
from dprun.mechanisms.quantities import Quantity

QUANTITY = "quantity"  # the position of the quantile quantity among the query's quantiles
NO_LEAF = -1


def leaf_column(position: int) -> str:
    return f"__dprun_leaf_{position}__"


def leaf_columns(quantiles: list[Quantity]) -> list[pl.Expr]:
    """Each quantile quantity's leaf (tree) or slot (candidates) per row; NO_LEAF for a missing value."""
    return [release_steps.leaf_expr(q).fill_null(NO_LEAF).alias(leaf_column(i)) for i, q in enumerate(quantiles)]


def shard_leaves(leaves: list[np.ndarray], starts: np.ndarray, rows_per_pair: np.ndarray, pair_keys: np.ndarray,
                 pair_units: np.ndarray, heavy_pairs: np.ndarray, max_rows: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A shard's weighted leaves: col : (quantity, key, leaf, weight) of its light units, summed,
    and col : (quantity, unit, key, leaf, weight) of its heavy units, one row per value.

    `leaves[i]` holds quantity i's leaf of every row in packed order; the pairs' rows start
    at `starts`, `rows_per_pair` of them; `heavy_pairs` marks the pairs of units over L0.
    """
    pair_of_row = np.repeat(np.arange(starts.size), rows_per_pair)
    light_parts, heavy_parts = [], []
    for position, leaf in enumerate(leaves):
        has_leaf = leaf != NO_LEAF
        present = np.add.reduceat(has_leaf.astype(np.int64), starts) if starts.size else np.zeros(0, np.int64)
        weights = pl.select(unit_weight_expr(pl.lit(pl.Series(present)), max_rows)).to_series().to_numpy()
        pair = pair_of_row[has_leaf]
        rows = pl.DataFrame({QUANTITY: np.full(pair.size, position, np.int32), "key": pair_keys[pair],
                             "leaf": leaf[has_leaf], "weight": weights[pair], "unit": pair_units[pair]})
        heavy = heavy_pairs[pair]
        light_parts.append(rows.filter(~pl.Series(heavy)).group_by(QUANTITY, "key", "leaf").agg(
            pl.col("weight").sum()))
        heavy_parts.append(rows.filter(pl.Series(heavy)))
    return pl.concat(light_parts), pl.concat(heavy_parts)


def leaf_table(position: int, light: list[Path], heavy: list[tuple[pl.DataFrame, Path]],
               partition_codes: pl.Series) -> pl.DataFrame:
    """col : (partition, leaf, weight) of quantity `position` over the kept pairs; partition i is
    the key coded `partition_codes[i]` (null: a listed partition without data; other keys are
    not released).

    `heavy` pairs each heavy-leaf file with col : (unit, key) of the pairs its units keep.
    """
    parts = [pl.scan_ipc(path).filter(pl.col(QUANTITY) == position) for path in light]
    parts += [pl.scan_ipc(path).filter(pl.col(QUANTITY) == position).join(kept.lazy(), on=["unit", "key"], how="semi")
              for kept, path in heavy]
    partitions = pl.DataFrame({"key": partition_codes, "partition": np.arange(partition_codes.len())}).drop_nulls()
    schema = pl.Schema({"partition": pl.Int64(), "leaf": pl.Int64(), "weight": pl.Int128()})
    if not parts:
        return pl.DataFrame(schema=schema)
    table = pl.concat([part.select("key", "leaf", "weight") for part in parts]).join(partitions.lazy(), on="key")
    return collect(table.group_by("partition", "leaf").agg(pl.col("weight").cast(pl.Int128).sum())).cast(schema)
