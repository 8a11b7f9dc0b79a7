"""The `auto` bounds' mechanism (`dprun.mechanisms.bound_choice`), audited on neighbouring datasets.

D is a background of ordinary units; D' adds one unit with 10^4 rows over 500 partitions,
private and public, with extreme values. The engine's exact histograms (`contribution_profile`,
the same hash key for both) may differ in one contribution cell by one, in two partition-size
cells by one each, and in the value histogram of the `bounds: auto` column by one unit's weight:
the L1 sensitivity of 3 + 1 the noise is calibrated to. Then `noisy_profile` is run many times on
both exact histograms and ε is estimated from the outputs (`dp_audit.epsilon_lower_bound`): it
must not exceed the planned ε, and the broken variant that draws noise for a sensitivity of 1
(as if only one cell moved) is caught above it.
"""

from __future__ import annotations

import json
from pathlib import Path

import dp_audit
import numpy as np
import polars as pl
import pytest

from dprun.engines import polars_engine
from dprun.mechanisms import bound_choice
from dprun.mechanisms.bound_choice import ContributionProfile, noisy_profile
from dprun.mechanisms.noise import NoisePlan
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan

HEAVY = "SECRET-HEAVY-UNIT"
EPSILON = 1.0
SHARE = 0.5  # the auto step gets ε = 0.5
DRAWS = 6000


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
def test_one_unit_moves_one_cell_and_the_partition_count_by_at_most_one(tmp_path: Path, partitions: object) -> None:
    seed = dp_audit.fresh_seed()
    plan, before, after = profiles(tmp_path, partitions, seed)  # type: ignore[arg-type]
    assert plan.bound_choice is not None and plan.bound_choice.epsilon == pytest.approx(EPSILON * SHARE)
    diff = after.cells - before.cells
    assert diff.sum() == 1 and np.abs(diff).sum() == 1, f"seed={seed}: {np.argwhere(diff)}"
    sizes = after.sizes - before.sizes
    # The heavy unit picked a partition of its own: one more partition picked by one unit.
    assert sizes.tolist() == [1] + [0] * (len(sizes) - 1), f"seed={seed}: {sizes}"
    # Its value weight, one count's worth, split evenly between the cells of 3 and of 10^6.
    values = (after.values - before.values)[0]
    assert np.flatnonzero(values).tolist() == bound_choice.value_cells(np.array([3.0, 1e6])).tolist()
    assert values.sum() == 2**bound_choice.VALUE_WEIGHT_BITS, f"seed={seed}: {values[values != 0]}"
    [(l0_bin, rows_bin)] = np.argwhere(diff).tolist()
    if partitions is None:
        # 500 partitions of 20 rows each: above the largest L0 candidate, in the rows bin (16, 32].
        assert (l0_bin, rows_bin) == (len(plan.bound_choice.l0_candidates), 5)
    else:
        assert (l0_bin, rows_bin) == (1, 5)  # only its rows in the two listed keys h1, h2 count


def flat(profile: ContributionProfile) -> np.ndarray:
    return np.concatenate([profile.cells.ravel(), profile.sizes, profile.values.ravel()])


def coordinates(before: ContributionProfile, after: ContributionProfile, t: float) -> list[dp_audit.Coordinate]:
    """The released numbers that differ between D and D', with the planned discrete Laplace noise:
    scale t for counts, t · 2^16 for the value cells' weights (2^16 per unit)."""
    counts = before.cells.size + before.sizes.size
    scales = np.where(np.arange(flat(before).size) < counts, t, t * 2**bound_choice.VALUE_WEIGHT_BITS)
    return [dp_audit.Coordinate(NoisePlan("laplace", 0, 1, 1, scale, 1 / scale, 0.0), 0, int(a), int(b))
            for a, b, scale in zip(flat(before), flat(after), scales, strict=True) if a != b]


def released(profile: ContributionProfile, plan: QueryPlan, indexes: list[int], source: RandomSource) -> np.ndarray:
    """DRAWS runs of the real `noisy_profile`, the coordinates at `indexes` of each."""
    assert plan.bound_choice is not None
    out = np.empty((len(indexes), DRAWS))
    for draw in range(DRAWS):
        out[:, draw] = flat(noisy_profile(profile, plan.bound_choice, source))[indexes]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True], ids=["as_planned", "no_value_share"])
def test_the_noisy_histogram_stays_within_its_epsilon(tmp_path: Path, broken: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The heavy unit moves 3 of the 4 counts of sensitivity (its cell, one size cell, its value weight);
    the broken variant calibrates as if the value histogram were free and a unit moved one cell only."""
    seed = dp_audit.fresh_seed()
    plan, before, after = profiles(tmp_path, None, seed)
    assert plan.bound_choice is not None
    claimed_t = plan.bound_choice.scale
    indexes = np.flatnonzero(flat(before) != flat(after)).tolist()
    coords = coordinates(before, after, claimed_t)
    assert len(coords) == 4, f"seed={seed}: the heavy unit's cell, one partition size, two value cells"
    if broken:
        monkeypatch.setattr(bound_choice, "L1_SENSITIVITY", 0)
    source = RandomSource.from_seed(seed)
    on_d, on_d_prime = released(before, plan, indexes, source), released(after, plan, indexes, source)
    estimate = dp_audit.epsilon_lower_bound(dp_audit.privacy_loss(coords, on_d), dp_audit.privacy_loss(coords, on_d_prime),
                                            dp_audit.threshold_sets(coords), 0.0)
    claimed = plan.bound_choice.epsilon
    if broken:
        assert estimate.epsilon > claimed, f"seed={seed}: the broken variant was not caught: {estimate}"
    else:
        assert estimate.epsilon <= claimed, f"seed={seed}: {estimate} above the planned ε = {claimed}"
