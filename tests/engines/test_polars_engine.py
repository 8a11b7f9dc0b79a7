"""End-to-end tests of the Polars engine on generated data, run through the real CLI.

Each test generates its data with numpy into tmp_path, writes a spec there, runs
`dprun run SPEC --seed N` in-process through the console-script entry point
(`dprun.cli.main`) and reads the published files back with Polars. The plan the
assertions compare with is rebuilt from the same spec (`api.plan`), which reads no data.

Statistics: sample sizes are fixed; every statistical assertion fails for a correct
implementation with probability about 1e-7 or less (5.5 standard errors for sums of many
draws, exact tails for binomials and single noise draws), so a test fails less than once
in a million runs. The seed comes from os.urandom and is part of every assertion message:
`--seed` and the data generator both use it, so a failure can be replayed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dprun_testing import fresh_seed
from engine_specs import output, query, run_ok, write_spec
from scipy import stats

from dprun import api
from dprun.mechanisms.noise import NoisePlan
from dprun.mechanisms.selection import keep_probability
from dprun.plan import QueryPlan

P_FAIL = 1e-7  # per statistical assertion
Z = 5.5  # two-sided normal tail ≈ 3.8e-8
# Upper z for the mean of squared Laplace draws, which is right-skewed (skewness ≈ 6.6/√n).
# Its exact distribution (the n-fold convolution of the law of X², computed by FFT for discrete
# Laplace t = 2, 3 and 20) puts less than 2e-9 above 1 + 7.5 standard errors and less than
# 1e-10 below 1 − 5.5 standard errors, for n = 1,000 and 2,000.
Z_UPPER_LAPLACE = 7.5


# --- helpers -------------------------------------------------------------------------------


def plan_of(spec: Path) -> api.Plan:
    return api.plan(api.validate(spec))


def metric_noise(plan: QueryPlan, metric: str) -> NoisePlan:
    (quantity_id,) = next(m.quantity_ids for m in plan.metrics if m.name == metric)
    return plan.quantity(quantity_id).noise


def noise_bound(noise: NoisePlan, p: float) -> float:
    """|noise| stays below this (real units) with probability at least 1 − p.

    Discrete Laplace: P(|X| >= k) = 2 e^{-k/t} / (1 + e^{-1/t}) <= 2 e^{-k/t}.
    Discrete Gaussian on a lattice 2^40 finer than σ: the normal tail, with 1% to spare.
    One extra grid unit covers the rounding of the aggregate to the noise grid.
    """
    if noise.kind == "laplace":
        k = noise.parameter * math.log(2.0 / p)
    else:
        k = 1.01 * noise.parameter * float(stats.norm.isf(p / 2.0))
    return math.ldexp(math.ceil(k) + 1, noise.grid_exponent)


def square_ratio_bounds(noise: NoisePlan, n: int) -> tuple[float, float]:
    """Bounds on mean(e²)/std² for n independent noise draws e; outside w.p. ≲ 1e-7."""
    if noise.kind == "gaussian":
        assert noise.parameter > 1e6, "a lattice this fine makes the discrete Gaussian a normal"
        return (float(stats.chi2.ppf(P_FAIL / 2, n)) / n, float(stats.chi2.isf(P_FAIL / 2, n)) / n)
    # The discrete Laplace is the difference of two geometrics: excess kurtosis (1 + 4q + q²)/(2q),
    # q = e^{-1/t}; Var(e²)/std⁴ = 2 + excess kurtosis.
    q = math.exp(-1.0 / noise.parameter)
    excess = (1.0 + 4.0 * q + q * q) / (2.0 * q)
    se = math.sqrt((2.0 + excess) / n)
    return 1.0 - Z * se, 1.0 + Z_UPPER_LAPLACE * se


def check_noise_distribution(errors: np.ndarray, noise: NoisePlan, what: str, seed: int, spread: bool = True) -> None:
    """The released-minus-true errors are centred on 0 and (`spread`) spread like the plan's noise."""
    n = errors.size
    std = noise.std
    assert abs(errors.mean()) <= Z * std / math.sqrt(n), (
        f"seed={seed}: {what}: mean error {errors.mean():.4g} over {n} partitions is not 0 "
        f"(noise std {std:.4g}, tolerance {Z * std / math.sqrt(n):.4g})"
    )
    if not spread:
        return
    lower, upper = square_ratio_bounds(noise, n)
    # The check must be able to tell noise 30% too small or too large from the plan's.
    assert lower > 0.7**2 and upper < 1.3**2, f"{what}: bounds [{lower:.3f}, {upper:.3f}] too loose for n={n}"
    ratio = float(np.mean(errors.astype(np.float64) ** 2)) / std**2
    assert lower <= ratio <= upper, (
        f"seed={seed}: {what}: mean squared error / plan std² = {ratio:.4f} over {n} partitions, "
        f"expected within [{lower:.4f}, {upper:.4f}] (plan std {std:.4g}, {noise.kind})"
    )


# --- public partitions ------------------------------------------------------------------


def test_public_partitions_come_out_exactly_as_listed_with_independent_noise(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    present = [f"p{i:04d}" for i in range(500)]
    absent = [f"a{i:04d}" for i in range(1000)]
    unlisted = [f"z{i:03d}" for i in range(100)]
    # Every unit has one row in a listed key and four rows in unlisted keys. With L0 = 1 the
    # unlisted rows must be dropped before cross-partition bounding, or they would use up the
    # unit's one partition most of the time and the listed counts would come out ~5x too small.
    units = 10_000
    uid = np.arange(units)
    listed_key = rng.choice(present, size=units)
    frame = pl.concat([
        pl.DataFrame({"uid": uid, "key": listed_key, "v": rng.uniform(0, 10, units)}),
        pl.DataFrame({"uid": np.repeat(uid, 4), "key": rng.choice(unlisted, size=4 * units),
                      "v": rng.uniform(0, 10, 4 * units)}),
    ])
    frame.sample(fraction=1.0, shuffle=True, seed=seed % 2**32).write_parquet(tmp_path / "data.parquet")
    public = present + absent
    rng.shuffle(public)
    metrics = [{"name": "visits", "kind": "count", "noise": "laplace"},
               {"name": "total", "kind": "sum", "column": "v", "bounds": [0, 10], "noise": "laplace"}]
    spec = write_spec(tmp_path, [query("q", ["key"], metrics, partitions={"public": public})], epsilon=1.0)
    run_ok(spec, seed)
    out = output(spec, "q")
    plan = plan_of(spec).queries[0]

    assert out["key"].to_list() == sorted(public), f"seed={seed}: released keys differ from the sorted public list"
    assert out.null_count().sum_horizontal().item() == 0, f"seed={seed}: nulls in the output"

    true_counts = pl.DataFrame({"key": listed_key}).group_by("key").len()
    on_present = out.join(true_counts, on="key", how="inner")
    assert on_present.height == len(set(listed_key.tolist()))
    check_noise_distribution((on_present["visits"] - on_present["len"]).to_numpy(),
                             metric_noise(plan, "visits"), "count on listed keys with data", seed, spread=False)

    empty = out.filter(pl.col("key").is_in(absent))
    assert empty.height == len(absent), f"seed={seed}"
    counts, sums = empty["visits"].to_numpy(), empty["total"].to_numpy()
    assert counts.min() != counts.max(), f"seed={seed}: all absent keys got the same count {counts[0]}"
    # Sums carry noise on a grid 2^40 finer than its scale: independent draws never coincide
    # (P(any pair equal) < 1e-6), so at most one repeat is tolerated.
    assert np.unique(sums).size >= len(absent) - 1, f"seed={seed}: absent keys share noise draws for the sum"
    check_noise_distribution(counts, metric_noise(plan, "visits"), "count on absent keys", seed)
    check_noise_distribution(sums, metric_noise(plan, "total"), "sum on absent keys", seed)


def test_public_partitions_from_a_file_keep_their_type_and_numeric_order(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    keys = [3, 20, 100, 7, 1000, 55]  # numeric order differs from text order
    in_data = [20, 7, 9999]  # 9999 is not listed
    frame = pl.DataFrame({"uid": np.arange(3000), "shop": rng.choice(in_data, size=3000)})
    frame.write_parquet(tmp_path / "data.parquet")
    pl.DataFrame({"shop": [str(k) for k in keys]}).write_csv(tmp_path / "shops.csv")
    spec = write_spec(tmp_path, [query("q", ["shop"], [{"name": "n", "kind": "count"}],
                                       partitions={"public_file": "shops.csv"})], epsilon=1.0)
    run_ok(spec, seed)
    out = output(spec, "q")
    assert out.schema["shop"] == pl.Int64, f"seed={seed}: key type {out.schema['shop']}"
    assert out["shop"].to_list() == sorted(keys), f"seed={seed}: {out['shop'].to_list()}"


# --- unbiasedness and noise spread ----------------------------------------------------------


def test_outputs_are_unbiased_and_noise_spread_matches_the_plan(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    partitions = 2000
    # One row per unit, one partition per unit: contribution bounding (L0 = 1, m = 1) changes
    # nothing, so the true values are known exactly. About 1 in 12 partitions is empty.
    sizes = rng.integers(0, 12, partitions)
    key = np.repeat(np.arange(partitions), sizes)
    rows = key.size
    frame = pl.DataFrame({"uid": rng.permutation(rows), "key": key, "v": rng.uniform(-5.0, 10.0, rows)})
    frame.write_parquet(tmp_path / "data.parquet")
    truth = (pl.DataFrame({"key": np.arange(partitions)})
             .join(frame.group_by("key").agg(pl.len().alias("n"), pl.col("v").sum().alias("s")), on="key", how="left")
             .fill_null(0))
    metrics = [
        {"name": "visits", "kind": "count", "noise": "laplace"},
        {"name": "spend", "kind": "sum", "column": "v", "bounds": [-5, 10], "noise": "gaussian"},
        {"name": "people", "kind": "privacy_id_count", "noise": "laplace"},
    ]
    spec = write_spec(tmp_path, [query("q", ["key"], metrics, partitions={"public": list(range(partitions))})],
                      epsilon=1.0, delta=1e-5)
    run_ok(spec, seed)
    plan = plan_of(spec).queries[0]
    assert [metric_noise(plan, m).kind for m in ("visits", "spend", "people")] == ["laplace", "gaussian", "laplace"]
    out = output(spec, "q").join(truth, on="key", how="inner")
    assert out.height == partitions, f"seed={seed}"
    check_noise_distribution((out["visits"] - out["n"]).to_numpy(), metric_noise(plan, "visits"), "count", seed)
    check_noise_distribution((out["spend"] - out["s"]).to_numpy(), metric_noise(plan, "spend"), "sum", seed)
    check_noise_distribution((out["people"] - out["n"]).to_numpy(), metric_noise(plan, "people"),
                             "privacy_id_count", seed)


# --- contribution bounding ----------------------------------------------------------------


def test_a_heavy_unit_moves_each_partition_by_at_most_its_bounds(tmp_path: Path) -> None:
    """Same seed, same public keys: the noise draws coincide, so the outputs with and without
    the heavy unit differ exactly by what bounding let that unit contribute."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    l0, m, lower, upper = 3, 2, -5.0, 10.0
    light_units = 3000
    per_unit = rng.integers(1, 6, light_units)  # 1–5 rows; some units exceed L0 partitions
    light = pl.DataFrame({
        "uid": np.repeat(np.arange(light_units), per_unit),
        "key": rng.integers(0, 400, per_unit.sum()),
        "v": rng.uniform(lower, upper, per_unit.sum()),
    })
    heavy_rows = 5000  # over 300 partitions: 16–17 rows each, all far above the upper bound
    heavy = pl.DataFrame({"uid": np.full(heavy_rows, 10**9), "key": np.arange(heavy_rows) % 300,
                          "v": np.full(heavy_rows, 1e6)})
    metrics = [{"name": "visits", "kind": "count"},
               {"name": "spend", "kind": "sum", "column": "v", "bounds": [lower, upper]},
               {"name": "people", "kind": "privacy_id_count"}]
    outputs = {}
    for name, frame in (("with", pl.concat([light, heavy])), ("without", light)):
        folder = tmp_path / name
        folder.mkdir()
        frame.sample(fraction=1.0, shuffle=True, seed=seed % 2**32).write_parquet(folder / "data.parquet")
        spec = write_spec(folder, [query("q", ["key"], metrics, l0=l0, m=m,
                                         partitions={"public": list(range(400))})], epsilon=1.0)
        run_ok(spec, seed)
        outputs[name] = output(spec, "q")
    with_heavy, without = outputs["with"], outputs["without"]
    assert with_heavy["key"].to_list() == without["key"].to_list() == list(range(400))
    plan = plan_of(tmp_path / "with" / "spec.yaml").queries[0]
    grid = math.ldexp(1.0, metric_noise(plan, "spend").grid_exponent)

    count_diff = (with_heavy["visits"] - without["visits"]).to_numpy()
    sum_diff = (with_heavy["spend"] - without["spend"]).to_numpy()
    people_diff = (with_heavy["people"] - without["people"]).to_numpy()
    assert np.all(np.abs(count_diff) <= m), f"seed={seed}: count moved by {np.abs(count_diff).max()} > m={m}"
    assert np.all(np.abs(sum_diff) <= m * max(abs(lower), abs(upper)) + 2 * grid), (
        f"seed={seed}: sum moved by {np.abs(sum_diff).max()} > m·max|bound| = {m * max(abs(lower), abs(upper))}"
    )
    assert np.all(np.abs(people_diff) <= 1), f"seed={seed}: privacy_id_count moved by {np.abs(people_diff).max()}"
    touched = (count_diff != 0) | (np.abs(sum_diff) > 2 * grid) | (people_diff != 0)
    assert touched.sum() <= l0, f"seed={seed}: the heavy unit changed {touched.sum()} partitions > L0={l0}"
    # Not vacuous: the heavy unit has >= m rows in each of its partitions, so it adds exactly m
    # rows (at the clamped upper bound) to exactly L0 of them.
    assert touched.sum() == l0 and set(count_diff[touched].tolist()) == {m}, f"seed={seed}: {count_diff[touched]}"
    np.testing.assert_allclose(sum_diff[touched], m * upper, atol=2 * grid, err_msg=f"seed={seed}")


# --- private partition selection ----------------------------------------------------------


@pytest.mark.parametrize(
    ("mechanism", "min_units"),
    [("truncated_geometric", 1), ("laplace_threshold", 1), ("gaussian_threshold", 1), ("released_count", 1),
     ("truncated_geometric", 3), ("released_count", 3)],
)
def test_barely_eligible_partitions_are_released_no_more_often_than_delta_allows(
    tmp_path: Path, mechanism: str, min_units: int
) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    small, big, big_units = 20_000, 5, 1000
    # keys 0–4: 1,000 units each; 10,000…: exactly min_units units (the fewest that can be released);
    # 100,000…: min_units − 1 units (never released).
    sizes = [(k, big_units) for k in range(big)]
    sizes += [(10_000 + k, min_units) for k in range(small)]
    sizes += [(100_000 + k, min_units - 1) for k in range(2000 if min_units > 1 else 0)]
    key = np.concatenate([np.full(n, k) for k, n in sizes])
    pl.DataFrame({"uid": rng.permutation(key.size), "key": key}).write_parquet(tmp_path / "data.parquet")
    spec = write_spec(
        tmp_path,
        [query("q", ["key"], [{"name": "people", "kind": "privacy_id_count"}],
               partitions={"selection": mechanism, "min_privacy_units": min_units})],
        epsilon=1.0, delta=0.05,
    )
    plan = plan_of(spec).queries[0]
    assert plan.selection.mechanism == mechanism
    detail = plan.selection.detail
    p_small = float(keep_probability(detail, np.array([min_units]))[0])
    # The plan itself: a partition one unit makes eligible is kept with probability at most δ/L0.
    assert 0 < p_small <= plan.selection.delta / plan.max_partitions * (1 + 1e-9), (mechanism, p_small)
    assert float(keep_probability(detail, np.array([big_units]))[0]) >= 1 - 1e-9

    run_ok(spec, seed)
    released = output(spec, "q")["key"].to_numpy()
    n_small = int(((released >= 10_000) & (released < 100_000)).sum())
    upper = int(stats.binom.isf(P_FAIL, small, p_small))
    lower = int(stats.binom.ppf(P_FAIL, small, p_small))
    assert n_small <= upper, (
        f"seed={seed}: {mechanism}: {n_small} of {small} partitions with {min_units} unit(s) released; "
        f"the plan's keep probability {p_small:.4g} allows at most {upper}"
    )
    assert n_small >= lower, (
        f"seed={seed}: {mechanism}: only {n_small} of {small} released, plan says {p_small:.4g} (>= {lower} expected)"
    )
    assert not np.any(released >= 100_000), f"seed={seed}: a partition below min_privacy_units was released"
    assert set(range(big)) <= set(released.tolist()), f"seed={seed}: a partition with {big_units} units was dropped"


# --- mean, variance, stddev ---------------------------------------------------------------


def released_intervals(c: float, s: float, ss: float, bounds: tuple[float, float, float],
                       lower: float, upper: float) -> dict[str, tuple[float, float]]:
    """Where mean, variance and stddev can land when each noisy sum (count C, centred sum S,
    centred sum of squares SS) is within ± its bound of the truth (postprocess's formulas)."""
    b_c, b_s, b_ss = bounds
    center, half = (lower + upper) / 2, (upper - lower) / 2
    denominators = (max(1.0, c - b_c), max(1.0, c + b_c))
    means = [x / d for x in (s - b_s, s + b_s) for d in denominators]
    m_lo, m_hi = min(means), max(means)
    squares = [x / d for x in (ss - b_ss, ss + b_ss) for d in denominators]
    sq_lo = 0.0 if m_lo <= 0 <= m_hi else min(m_lo**2, m_hi**2)
    sq_hi = max(m_lo**2, m_hi**2)
    var_lo = min(max(min(squares) - sq_hi, 0.0), half * half)
    var_hi = min(max(max(squares) - sq_lo, 0.0), half * half)
    return {
        "mean": (min(max(center + m_lo, lower), upper), min(max(center + m_hi, lower), upper)),
        "variance": (var_lo, var_hi),
        "stddev": (math.sqrt(var_lo), math.sqrt(var_hi)),
    }


def sum_bounds(plan: QueryPlan, rows: int, p: float) -> tuple[float, float, float]:
    """Noise bounds of the count, centred sum and centred sum of squares, plus their rounding."""
    ids = next(m.quantity_ids for m in plan.metrics if m.kind in ("variance", "stddev"))
    result = []
    for qid in ids:
        noisy = plan.quantity(qid)
        # Values are summed in fixed point: each may be off by one unit of 2^unit_exponent.
        rounding = 0.0 if noisy.quantity.is_integer_count else rows * noisy.quantity.unit
        result.append(noise_bound(noisy.noise, p) + rounding)
    return result[0], result[1], result[2]


def test_mean_variance_and_stddev_agree_with_the_truth_on_large_partitions(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    lower, upper, units = 0.0, 10.0, 10_000
    distributions = {"uniform": stats.uniform(0, 10), "beta": stats.beta(2, 5, scale=10),
                     "narrow": stats.uniform(6, 1)}
    frame = pl.concat([
        pl.DataFrame({"key": [name] * units, "v": dist.rvs(size=units, random_state=rng)})
        for name, dist in distributions.items()
    ]).with_columns(uid=pl.Series(rng.permutation(units * len(distributions))))
    frame.write_parquet(tmp_path / "data.parquet")
    metrics = [{"name": "avg", "kind": "mean", "column": "v", "bounds": [lower, upper]},
               {"name": "var", "kind": "variance", "column": "v", "bounds": [lower, upper]},
               {"name": "sd", "kind": "stddev", "column": "v", "bounds": [lower, upper]}]
    spec = write_spec(tmp_path, [query("q", ["key"], metrics, partitions={"public": list(distributions)})],
                      epsilon=2.0)
    run_ok(spec, seed)
    out = output(spec, "q")
    assert out["key"].to_list() == sorted(distributions)
    plan = plan_of(spec).queries[0]
    checks = 3 * len(distributions)
    bounds = sum_bounds(plan, units, P_FAIL / (3 * checks))
    center = (lower + upper) / 2
    for name, dist in distributions.items():
        values = frame.filter(pl.col("key") == name)["v"].to_numpy() - center
        row = out.filter(pl.col("key") == name).row(0, named=True)
        intervals = released_intervals(values.size, values.sum(), (values**2).sum(), bounds, lower, upper)
        # Meaningful: the noise can move a mean by under 0.5% of the range at 10^4 rows.
        assert intervals["mean"][1] - intervals["mean"][0] < 0.05, intervals
        truth = {"mean": float(values.mean() + center), "variance": float(values.var())}
        truth["stddev"] = math.sqrt(truth["variance"])
        population = {"mean": float(dist.mean()), "variance": float(dist.var()), "stddev": float(dist.std())}
        # Sampling error of the data's own mean and variance around the population's.
        mu4 = float(dist.expect(lambda x: (x - dist.mean()) ** 4))  # noqa: B023
        sampling = {"mean": Z * math.sqrt(dist.var() / units),
                    "variance": Z * math.sqrt((mu4 - dist.var() ** 2) / units)}
        sampling["stddev"] = sampling["variance"] / (2 * dist.std()) * 1.1
        for metric, column in (("mean", "avg"), ("variance", "var"), ("stddev", "sd")):
            lo, hi = intervals[metric]
            released = row[column]
            assert lo - 1e-9 <= released <= hi + 1e-9, (
                f"seed={seed}: {metric} of '{name}' released {released:.6g}, truth {truth[metric]:.6g}; "
                f"the plan's noise allows [{lo:.6g}, {hi:.6g}]"
            )
            slack = max(hi - truth[metric], truth[metric] - lo) + sampling[metric]
            assert abs(released - population[metric]) <= slack, (
                f"seed={seed}: {metric} of '{name}' released {released:.6g}, population {population[metric]:.6g}"
            )


# --- missing and infinite values, null privacy units ----------------------------------------


@pytest.mark.parametrize("key_type", ["text", "integer"])
def test_keys_only_rows_without_a_unit_have_are_never_released(tmp_path: Path, key_type: str) -> None:
    """Rows whose privacy unit is null never count, though the pass that finds the keys reads
    them (it skips the unit column): a key only they have, released by no one, is not released,
    and the release is byte for byte the one of the data without them."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    units = rng.integers(0, 600, 6000)
    counted = pl.DataFrame({"uid": pl.Series([f"u{u}" for u in units]), "key": rng.integers(0, 5, units.size)})
    # Keys 0–4 and, without a unit, 7 and 10^6 (far out of the others' range).
    unitless = pl.DataFrame({"uid": pl.Series([None] * 900, dtype=pl.String),
                             "key": rng.choice(np.array([0, 3, 7, 10**6]), 900)})
    key = pl.col("key").cast(pl.String) if key_type == "text" else pl.col("key")
    tables = {}
    for name, data in {"counted": counted, "unitless": pl.concat([counted, unitless])}.items():
        folder = tmp_path / name
        folder.mkdir()
        data.with_columns(key).sample(fraction=1.0, shuffle=True, seed=seed % 2**32).write_parquet(
            folder / "data.parquet")
        metrics = [{"name": "rows", "kind": "count"}, {"name": "people", "kind": "privacy_id_count"}]
        spec = write_spec(folder, [query("q", ["key"], metrics, l0=2, m=3,
                                         partitions={"selection": "gaussian_threshold"})], epsilon=30.0, delta=1e-6)
        run_ok(spec, seed)
        tables[name] = output(spec, "q")
    released = set(tables["unitless"]["key"].cast(pl.String).to_list())
    assert released == {"0", "1", "2", "3", "4"}, f"seed={seed}: released {sorted(released)}"
    assert tables["unitless"].equals(tables["counted"]), f"seed={seed}: rows without a unit changed the release"


def test_nan_null_and_infinite_values_and_null_units(tmp_path: Path) -> None:
    """NaN is a missing value like null, ±inf is clamped to the bounds, rows without a privacy
    unit are dropped: with the same seed, data that differs only in those ways gives the same
    output byte for byte."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    lower, upper, per = -2.0, 8.0, 4000
    parts = {
        "nan": np.where(np.arange(per) % 2 == 0, 3.0, np.nan),  # half NaN: mean 3, not 1.5
        "null": np.where(np.arange(per) % 2 == 0, 3.0, np.nan),  # written as nulls below
        "posinf": np.full(per, np.inf),
        "neginf": np.full(per, -np.inf),
        "allnan": np.full(50, np.nan),
        "mixed": rng.uniform(lower, upper, per),
    }
    frame = pl.concat([pl.DataFrame({"key": [k] * v.size, "v": v}) for k, v in parts.items()])
    frame = frame.with_columns(
        uid=pl.Series(rng.permutation(frame.height), dtype=pl.Int64),
        v=pl.when(pl.col("key") == "null").then(pl.col("v").fill_nan(None)).otherwise(pl.col("v")),
    )
    nan_as_null = frame.with_columns(pl.col("v").fill_nan(None))
    inf_as_bounds = frame.with_columns(pl.col("v").replace({math.inf: upper, -math.inf: lower}))
    huge_as_inf = frame.with_columns(pl.col("v").replace({math.inf: 1e300, -math.inf: -1e300}))
    no_unit = pl.DataFrame({"key": rng.choice(list(parts), 3000), "v": rng.choice([np.nan, np.inf, 5.0, 1e9], 3000),
                            "uid": pl.Series([None] * 3000, dtype=pl.Int64)})
    with_null_units = pl.concat([frame, no_unit.select(frame.columns)]).sample(fraction=1.0, shuffle=True,
                                                                              seed=seed % 2**32)
    metrics = [{"name": "rows", "kind": "count"},
               {"name": "total", "kind": "sum", "column": "v", "bounds": [lower, upper]},
               {"name": "avg", "kind": "mean", "column": "v", "bounds": [lower, upper]},
               {"name": "people", "kind": "privacy_id_count"}]
    variants = {"base": frame, "nan_as_null": nan_as_null, "inf_as_bounds": inf_as_bounds,
                "huge": huge_as_inf, "null_units": with_null_units}
    tables = {}
    for name, data in variants.items():
        folder = tmp_path / name
        folder.mkdir()
        data.write_parquet(folder / "data.parquet")
        spec = write_spec(folder, [query("q", ["key"], metrics, partitions={"public": list(parts)})], epsilon=2.0)
        run_ok(spec, seed)
        tables[name] = output(spec, "q")
    base = tables["base"]
    for name, table in tables.items():
        assert table.equals(base), f"seed={seed}: variant '{name}' released something else than the base data"
    for column in ("total", "avg"):
        assert base[column].is_finite().all(), f"seed={seed}: non-finite {column}: {base[column].to_list()}"

    plan = plan_of(tmp_path / "base" / "spec.yaml").queries[0]
    avg = next(m for m in plan.metrics if m.name == "avg")
    b_c, b_s = (noise_bound(plan.quantity(q).noise, P_FAIL / 6) + 1e-6 for q in avg.quantity_ids)
    center = (lower + upper) / 2
    for key, expected in (("nan", 3.0), ("null", 3.0), ("posinf", upper), ("neginf", lower)):
        present = int(np.sum(~np.isnan(parts[key])))
        c, s = present, present * (expected - center)
        intervals = released_intervals(c, s, 0.0, (b_c, b_s, 0.0), lower, upper)
        lo, hi = intervals["mean"]
        released = base.filter(pl.col("key") == key)["avg"].item()
        assert lo - 1e-9 <= released <= hi + 1e-9, (
            f"seed={seed}: mean of '{key}' is {released:.5g}, expected {expected} (allowed [{lo:.5g}, {hi:.5g}])"
        )
