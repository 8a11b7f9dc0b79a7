"""Private selection's draws in key order, a chunk at a time, however the candidates arrive."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dprun.engines import release_steps
from dprun.engines.polars_steps import UNITS
from dprun.mechanisms import selection
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan

SEED = 20261127


def threshold_plan() -> QueryPlan:
    """A stand-in plan: the steps read only its group-by and its selection mechanism."""
    mechanism = selection.laplace_threshold(1.0, 1e-6, 1)

    class Selection:
        detail = mechanism

    class Plan:
        group_by = ("k",)
        selection = Selection()

    return Plan()  # type: ignore[return-value]


def candidates(rows: int) -> pl.DataFrame:
    rng = np.random.default_rng(SEED)
    keys = [None, *(f"k{i:05d}" for i in range(rows - 1))]
    return pl.DataFrame({"k": keys, UNITS: rng.integers(0, 40, rows)}, schema={"k": pl.String, UNITS: pl.Int64})


@pytest.mark.parametrize("cuts", [[], [1, 2, 3], [250, 251, 400, 999], list(range(0, 1000, 37))])
def test_the_keys_kept_do_not_depend_on_how_the_sorted_candidates_arrive(
    monkeypatch: pytest.MonkeyPatch, cuts: list[int]
) -> None:
    plan = threshold_plan()
    monkeypatch.setattr(release_steps, "DRAW_CHUNK", 64)
    whole = candidates(1000)
    expected = release_steps.chosen_partitions(plan, whole.sample(fraction=1.0, shuffle=True, seed=1),
                                               RandomSource.from_seed(SEED))
    ordered = whole.sort("k", nulls_last=True)
    bounds = [0, *cuts, ordered.height]
    pieces = [ordered.clear(), *(ordered.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False))]
    actual = release_steps.chosen_in_key_order(plan, pieces, RandomSource.from_seed(SEED))
    assert 0 < expected.height < whole.height, "some candidates kept, some not"
    assert actual.equals(expected), f"seed {SEED}"
    assert actual["k"].is_sorted(nulls_last=True)


def test_the_draws_are_made_a_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = threshold_plan()
    sizes: list[int] = []
    draw = selection.select_partitions
    monkeypatch.setattr(selection, "select_partitions",
                        lambda m, units, source, weights: sizes.append(units.size) or draw(m, units, source, weights))
    monkeypatch.setattr(release_steps, "DRAW_CHUNK", 300)
    release_steps.chosen_partitions(plan, candidates(1000), RandomSource.from_seed(SEED))
    release_steps.chosen_partitions(plan, candidates(1000).clear(), RandomSource.from_seed(SEED))
    assert sizes == [300, 300, 300, 100, 0]
