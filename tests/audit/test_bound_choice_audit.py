"""The `auto` bounds' mechanism (`dprun.mechanisms.bound_choice`), audited on neighbouring datasets.

D is a background of ordinary units; D' adds one unit with 10^4 rows over 500 partitions,
private and public, with extreme values. The engine's exact figures (`contribution_profile`, the
same hash key for both) may differ in one cell of each unit histogram by one, in two partition-size
cells by one each (the L1 sensitivity of 5 the shape noise is calibrated to), in the value
histogram of the `bounds: auto` column by one unit's weight, and in every candidate's kept shares
by at most one unit's weight (the scores' sensitivity). Then `noisy_shape` and the choice are run
many times on both and ε is estimated from the outputs: it must not exceed the planned ε, and a
broken variant with too little noise is caught above it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_audit
import numpy as np
import polars as pl
import pytest

from dprun.engines import polars_engine
from dprun.mechanisms import bound_choice, score_choice
from dprun.mechanisms.bound_choice import ContributionProfile, NoisyShape, noisy_shape
from dprun.mechanisms.noise import NoisePlan
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan

HEAVY = "SECRET-HEAVY-UNIT"
EPSILON = 8.0  # large enough for the audits to see a broken variant in a few thousand draws
SHARE = 0.5  # the auto step gets ε = 4
SHAPE_DRAWS = 3000
ONE = 1 << bound_choice.UNIT_WEIGHT_BITS


def background(rng: np.random.Generator) -> pl.DataFrame:
    units = 800
    rows = rng.integers(1, 20, units)
    return pl.DataFrame({
        "uid": np.repeat([f"u{i}" for i in range(units)], rows),
        "key": [f"k{k}" for k in rng.integers(0, 40, int(rows.sum()))],
        "v": rng.lognormal(3, 1, int(rows.sum())),
    })


def heavy_unit() -> pl.DataFrame:
    """10^4 rows in 500 partitions; its values half at 10^6, half at 3 (two value cells)."""
    return pl.DataFrame({"uid": [HEAVY] * 10_000, "key": [f"h{i % 500}" for i in range(10_000)],
                         "v": [1e6, 3.0] * 5_000})


def write(folder: Path, frame: pl.DataFrame, partitions: dict[str, object] | None) -> tuple[QueryPlan, object]:
    folder.mkdir(parents=True)
    frame.write_csv(folder / "data.csv")
    query: dict[str, object] = {
        "name": "q", "input": "data", "group_by": ["key"],
        "contribution_bounds": {"max_partitions_contributed": "auto", "max_contributions_per_partition": "auto",
                                "auto_budget_share": SHARE},
        "metrics": [{"name": "n", "kind": "count"}, {"name": "s", "kind": "sum", "column": "v", "bounds": "auto"}],
        "output": {"path": "out/q.parquet"},
    }
    if partitions is not None:
        query["partitions"] = partitions
    spec = {"version": 1, "privacy_unit": "uid", "budget": {"epsilon": EPSILON, "delta": 1e-6},
            "inputs": {"data": {"path": "data.csv"}}, "queries": [query], "report": "out/report.json"}
    (folder / "spec.yaml").write_text(json.dumps(spec))
    return dp_audit.plan_and_inputs(folder / "spec.yaml")


def profiles(tmp_path: Path, partitions: dict[str, object] | None, seed: int
             ) -> tuple[QueryPlan, ContributionProfile, ContributionProfile]:
    rng = np.random.default_rng(seed % 2**63)
    base = background(rng)
    plan, without = write(tmp_path / "without", base, partitions)
    _, with_heavy = write(tmp_path / "with", pl.concat([base, heavy_unit()]), partitions)
    before = polars_engine.contribution_profile(plan, without.query_inputs["q"], RandomSource.from_seed(seed),
                                                tmp_path / "without")
    after = polars_engine.contribution_profile(plan, with_heavy.query_inputs["q"], RandomSource.from_seed(seed),
                                               tmp_path / "with")
    return plan, before, after


@pytest.mark.parametrize("partitions", [None, {"public": ["k1", "h1", "h2"]}], ids=["private", "public"])
def test_one_unit_moves_each_histogram_by_at_most_its_share_of_the_sensitivity(tmp_path: Path, partitions: object
                                                                                ) -> None:
    seed = dp_audit.fresh_seed()
    plan, before, after = profiles(tmp_path, partitions, seed)  # type: ignore[arg-type]
    assert plan.bound_choice is not None and plan.bound_choice.epsilon == pytest.approx(EPSILON * SHARE)
    diff = after.cells - before.cells
    assert diff.sum() == 1 and np.abs(diff).sum() == 1, f"seed={seed}: {np.argwhere(diff)}"
    unit_rows = after.unit_rows - before.unit_rows
    assert unit_rows.sum() == 1 and np.abs(unit_rows).sum() == 1, f"seed={seed}"
    sizes = after.sizes - before.sizes
    # The heavy unit picked a partition of its own: one more partition picked by one unit.
    assert sizes.tolist() == [1] + [0] * (len(sizes) - 1), f"seed={seed}: {sizes}"
    # Its value weight, one count's worth, split evenly between the cells of 3 and of 10^6.
    values = (after.values - before.values)[0]
    assert np.flatnonzero(values).tolist() == bound_choice.value_cells(np.array([3.0, 1e6])).tolist()
    assert values.sum() == ONE, f"seed={seed}: {values[values != 0]}"
    # Every candidate's kept shares move by at most one unit's weight, all upwards as the unit is added: the
    # choice's sensitivity, and the monotone scores its permute-and-flip is calibrated for.
    for moved in (after.kept_rows - before.kept_rows, after.kept_pairs - before.kept_pairs):
        assert (0 <= moved).all() and (moved <= ONE).all(), f"seed={seed}: {moved}"
    [(l0_bin, rows_bin)] = np.argwhere(diff).tolist()
    if partitions is None:
        # 500 partitions of 20 rows each: above the largest L0 candidate, in the rows bin (16, 32].
        assert (l0_bin, rows_bin) == (len(plan.bound_choice.l0_candidates), 5)
        assert after.kept_pairs[-1] - before.kept_pairs[-1] == (128 * ONE) // 500
    else:
        assert (l0_bin, rows_bin) == (1, 5)  # only its rows in the two listed keys h1, h2 count


def shape(noisy: NoisyShape) -> np.ndarray:
    return np.concatenate([noisy.partitions, noisy.rows, noisy.unit_rows,
                           np.zeros(0, np.int64) if noisy.sizes is None else noisy.sizes])


def exact_shape(profile: ContributionProfile) -> np.ndarray:
    return np.concatenate([profile.cells.sum(axis=1), profile.cells.sum(axis=0), profile.unit_rows, profile.sizes])


def released(profile: ContributionProfile, plan: QueryPlan, indexes: list[int], source: RandomSource) -> np.ndarray:
    """SHAPE_DRAWS runs of the real `noisy_shape`, the coordinates at `indexes` of each."""
    assert plan.bound_choice is not None
    out = np.empty((len(indexes), SHAPE_DRAWS))
    for draw in range(SHAPE_DRAWS):
        out[:, draw] = shape(noisy_shape(profile, plan.bound_choice, source))[indexes]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True], ids=["as_planned", "one_cell"])
def test_the_shape_histograms_stay_within_their_epsilon(tmp_path: Path, broken: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The heavy unit moves 4 of the 5 counts of sensitivity (a cell of each unit histogram, and one size
    cell: its partition is new); the broken variant calibrates as if a unit moved one cell only."""
    seed = dp_audit.fresh_seed()
    plan, before, after = profiles(tmp_path, None, seed)
    assert plan.bound_choice is not None
    claimed_t = plan.bound_choice.scale
    indexes = np.flatnonzero(exact_shape(before) != exact_shape(after)).tolist()
    coords = [dp_audit.Coordinate(NoisePlan("laplace", 0, 1, 1, claimed_t, 1 / claimed_t, 0.0), 0, int(a), int(b))
              for a, b in zip(exact_shape(before)[indexes], exact_shape(after)[indexes], strict=True)]
    assert len(coords) == 4, f"seed={seed}: a cell of each unit histogram and one partition size"
    if broken:
        monkeypatch.setattr(bound_choice, "HISTOGRAM_SENSITIVITY", 1)
        monkeypatch.setattr(bound_choice, "SIZE_SENSITIVITY", 0)
    source = RandomSource.from_seed(seed)
    on_d, on_d_prime = released(before, plan, indexes, source), released(after, plan, indexes, source)
    estimate = dp_audit.epsilon_lower_bound(dp_audit.privacy_loss(coords, on_d), dp_audit.privacy_loss(coords, on_d_prime),
                                            dp_audit.threshold_sets(coords), 0.0)
    claimed = plan.bound_choice.histogram_epsilon
    if broken:
        assert estimate.epsilon > claimed, f"seed={seed}: the broken variant was not caught: {estimate}"
    else:
        assert estimate.epsilon <= claimed, f"seed={seed}: {estimate} above the planned ε = {claimed}"


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True], ids=["as_planned", "one_row_sensitivity"])
def test_the_choice_of_bounds_stays_within_its_epsilon(tmp_path: Path, broken: bool) -> None:
    """Permute-and-flip over the 11 candidates of L∞ at L0 = 1, scored on D and on D' (the heavy unit's
    kept shares added): the frequency of each choice on D and D' differs by at most e^ε_c
    (Clopper–Pearson at ALPHA). The broken variant calibrates as if one unit moved a score by one weight step, not one unit."""
    seed = dp_audit.fresh_seed()
    plan, before, after = profiles(tmp_path, None, seed)
    choice = plan.bound_choice
    assert choice is not None and choice.scores_data
    epsilon = choice.contribution_epsilon
    sensitivity = 1 if broken else ONE
    # The scores' public part (the noise at the typical partition) is the same on both; this one ties
    # every candidate on D, so that the heavy unit's kept shares decide on D'.
    penalty = before.kept_rows[0, 0] - before.kept_rows[0, 0, 0]
    scores = {name: [int(v) for v in profile.kept_rows[0, 0] - penalty] for name, profile in (("d", before), ("d'", after))}
    source = RandomSource.from_seed(seed)
    draws = 4000
    counts = {name: np.bincount([score_choice.choose_one(values, sensitivity, epsilon, source, monotone=True) for _ in range(draws)],
                                minlength=len(values)) for name, values in scores.items()}
    worst = 0.0
    for a, b in (("d", "d'"), ("d'", "d")):
        for k, (ka, kb) in enumerate(zip(counts[a], counts[b], strict=True)):
            low, high = dp_audit.cp_lower(int(ka), draws, dp_audit.ALPHA), dp_audit.cp_upper(int(kb), draws, dp_audit.ALPHA)
            if low > 0:
                worst = max(worst, math.log(low / high))
    if broken:
        assert worst > epsilon, f"seed={seed}: the broken variant was not caught: {worst:.3f}"
    else:
        assert worst <= epsilon, f"seed={seed}: ε lower bound {worst:.3f} above the planned {epsilon:.3f}"
