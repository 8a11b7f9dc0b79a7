"""Tests for dprun.mechanisms.sampling: exact-law checks and the randomness contract.

Every statistical assertion is calibrated so that a correct sampler fails it
with probability at most about ALPHA = 1e-8 (exact binomial tails, chi-square
tails with at least MIN_EXPECTED per cell, or Z = 6 standard errors on a
mean). The file makes about 55 such assertions, so a correct implementation
fails a run spuriously less than once in a million runs.

Each run is fresh: the `seeded` fixture draws a seed from os.urandom and
samples from RandomSource.from_seed(seed). The seed is in every assertion
message; DPRUN_TEST_SEED=<seed> replays a failing test on the same draws.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from dprun.mechanisms import sampling
from dprun.mechanisms.sampling import (
    MAX_SCALE,
    RandomSource,
    bernoulli,
    discrete_gaussian,
    discrete_laplace,
    geometric,
)

ALPHA = 1e-8
Z = 6.0  # two-sided normal tail 2e-9
MIN_EXPECTED = 500  # keeps the chi-square approximation sound out to ALPHA
N = 10**6

LAPLACE_SCALES = [0.3, 1.0, 7.5, 1e3, 2.0**40]
GAUSSIAN_SIGMAS = [0.5, 2.0, 30.0, 1e4, 2.0**40]
# 2**20 + 1 is the first scale geometric() splits into blocks.
GEOMETRIC_SCALES = [0.3, 1.0, 7.5, 1e3, 2.0**20 + 1, 2.0**40]
# Below this sigma the exact pmf is summed; above it the continuous limit
# differs from the lattice law by O(1/sigma**2), invisible at N samples.
SUMMED_SIGMA_LIMIT = 1e4


@dataclass(frozen=True)
class Seeded:
    seed: int
    source: RandomSource
    test_id: str

    def why(self, finding: str) -> str:
        return f"{finding} [reproduce: DPRUN_TEST_SEED={self.seed} pytest '{self.test_id}']"


@pytest.fixture
def seeded(request: pytest.FixtureRequest, record_property: Callable[[str, object], None]) -> Seeded:
    seed = int(os.environ.get("DPRUN_TEST_SEED") or int.from_bytes(os.urandom(16), "big"))
    record_property("dprun_test_seed", seed)
    print(f"DPRUN_TEST_SEED={seed}")
    return Seeded(seed, RandomSource.from_seed(seed), request.node.nodeid)


@dataclass(frozen=True)
class Law:
    """An integer law through the exact quantities the tests compare against."""

    scale: float
    cdf: Callable[[np.ndarray], np.ndarray]  # P(X <= k) for integer k
    var: float  # E[(X/scale)**2], X symmetric
    fourth: float  # E[(X/scale)**4]

    def two_sided_tail(self, k: int) -> float:
        """P(|X| >= k) for k >= 1, from the left tail so small values stay precise."""
        return 2.0 * float(self.cdf(np.array([-k]))[0])


def laplace_law(t: float) -> Law:
    q = math.exp(-1.0 / t)
    one_minus_q = -math.expm1(-1.0 / t)

    def cdf(k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        # P(X >= j) = q**j / (1 + q) for j >= 1.
        upper = 1.0 - np.exp(-(np.maximum(k, 0.0) + 1.0) / t) / (1.0 + q)
        lower = np.exp(np.minimum(k, 0.0) / t) / (1.0 + q)
        return np.where(k >= 0, upper, lower)

    var = 2.0 * q / (one_minus_q * t) ** 2
    fourth = 2.0 * q * (1 + 11 * q + 11 * q**2 + q**3) / ((1 + q) * (one_minus_q * t) ** 4)
    return Law(t, cdf, var, fourth)


def gaussian_law(sigma: float) -> Law:
    if sigma > SUMMED_SIGMA_LIMIT:
        return Law(sigma, lambda k: stats.norm.cdf((np.asarray(k) + 0.5) / sigma), 1.0, 3.0)
    half_width = math.ceil(12 * sigma) + 2  # mass beyond 12 sigma is below e**-72
    ks = np.arange(-half_width, half_width + 1)
    pmf = np.exp(-(ks.astype(np.float64) ** 2) / (2 * sigma**2))
    pmf /= pmf.sum()
    cumulative = np.cumsum(pmf)

    def cdf(k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.int64)
        inside = cumulative[np.clip(k + half_width, 0, 2 * half_width)]
        return np.where(k < -half_width, 0.0, np.where(k >= half_width, 1.0, inside))

    scaled = ks / sigma
    return Law(sigma, cdf, float(np.sum(scaled**2 * pmf)), float(np.sum(scaled**4 * pmf)))


def geometric_cdf(t: float) -> Callable[[np.ndarray], np.ndarray]:
    def cdf(k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        return np.where(k < 0, 0.0, -np.expm1(-(np.maximum(k, -1.0) + 1.0) / t))

    return cdf


def binomial_pvalue(successes: int, trials: int, p: float) -> float:
    """Exact two-sided binomial p-value (twice the smaller tail)."""
    below = stats.binom.cdf(successes, trials, p)
    above = stats.binom.sf(successes - 1, trials, p)
    return float(min(1.0, 2.0 * min(below, above)))


def chi_square_pvalue(
    x: np.ndarray, cdf: Callable[[np.ndarray], np.ndarray], edges: np.ndarray
) -> float:
    """Chi-square fit of integer samples to `cdf` on cells split at integer `edges`.

    Cells are (-inf, e0), [e0, e1), ..., [e_last, inf); adjacent cells are
    merged until each expects at least MIN_EXPECTED samples.
    """
    edges = np.unique(np.round(edges)).astype(np.int64)
    below_edge = np.concatenate([[0.0], cdf(edges - 1), [1.0]])
    expected = np.diff(below_edge) * x.size
    observed = np.bincount(np.searchsorted(edges, x, side="right"), minlength=edges.size + 1)
    merged_expected: list[float] = []
    merged_observed: list[int] = []
    run_expected, run_observed = 0.0, 0
    for e, o in zip(expected, observed):
        run_expected += e
        run_observed += int(o)
        if run_expected >= MIN_EXPECTED:
            merged_expected.append(run_expected)
            merged_observed.append(run_observed)
            run_expected, run_observed = 0.0, 0
    merged_expected[-1] += run_expected
    merged_observed[-1] += run_observed
    e_arr, o_arr = np.array(merged_expected), np.array(merged_observed)
    statistic = float(np.sum((o_arr - e_arr) ** 2 / e_arr))
    return float(stats.chi2.sf(statistic, df=e_arr.size - 1))


SYMMETRIC_CASES = [("discrete_laplace", t) for t in LAPLACE_SCALES] + [
    ("discrete_gaussian", s) for s in GAUSSIAN_SIGMAS
]
SAMPLERS = {"discrete_laplace": discrete_laplace, "discrete_gaussian": discrete_gaussian}
LAWS = {"discrete_laplace": laplace_law, "discrete_gaussian": gaussian_law}
# Chi-square cells span this many scales either side of 0.
CELL_SPAN = {"discrete_laplace": 10.0, "discrete_gaussian": 5.5}


def draw(name: str, scale: float, seeded: Seeded) -> np.ndarray:
    x = SAMPLERS[name](seeded.source, scale, N)
    assert x.dtype == np.int64 and x.shape == (N,)
    return x


@pytest.mark.parametrize(("name", "scale"), SYMMETRIC_CASES)
def test_symmetric_sampler_fits_exact_pmf(name: str, scale: float, seeded: Seeded) -> None:
    x = draw(name, scale, seeded)
    span = CELL_SPAN[name]
    edges = scale * np.linspace(-span, span, 121)
    p = chi_square_pvalue(x, LAWS[name](scale).cdf, edges)
    assert p >= ALPHA, seeded.why(f"{name}({scale:g}) chi-square p = {p:.3g}")


@pytest.mark.parametrize(("name", "scale"), SYMMETRIC_CASES)
def test_symmetric_sampler_mean_and_variance(name: str, scale: float, seeded: Seeded) -> None:
    law = LAWS[name](scale)
    y = draw(name, scale, seeded) / scale
    mean, second = float(y.mean()), float(np.mean(y**2))
    mean_bound = Z * math.sqrt(law.var / N)
    second_bound = Z * math.sqrt((law.fourth - law.var**2) / N)
    assert abs(mean) <= mean_bound, seeded.why(f"{name}({scale:g}) mean/scale = {mean:.4g}")
    assert abs(second - law.var) <= second_bound, seeded.why(
        f"{name}({scale:g}) E[(X/scale)^2] = {second:.6g}, exact {law.var:.6g}"
    )


@pytest.mark.parametrize(("name", "scale"), SYMMETRIC_CASES)
def test_symmetric_sampler_tail_mass(name: str, scale: float, seeded: Seeded) -> None:
    k = math.ceil(3.5 * scale)
    exact = LAWS[name](scale).two_sided_tail(k)
    hits = int(np.count_nonzero(np.abs(draw(name, scale, seeded)) >= k))
    p = binomial_pvalue(hits, N, exact)
    assert p >= ALPHA, seeded.why(
        f"{name}({scale:g}) P(|X| >= {k}) = {hits / N:.4g}, exact {exact:.4g}, p = {p:.3g}"
    )


@pytest.mark.parametrize("t", GEOMETRIC_SCALES)
def test_geometric_fits_exact_pmf(t: float, seeded: Seeded) -> None:
    g = geometric(seeded.source, t, N)
    assert g.dtype == np.int64 and g.shape == (N,)
    assert g.min() >= 0, seeded.why(f"geometric({t:g}) returned a negative value")
    p = chi_square_pvalue(g, geometric_cdf(t), t * np.linspace(0.0, 12.0, 121))
    assert p >= ALPHA, seeded.why(f"geometric({t:g}) chi-square p = {p:.3g}")


@pytest.mark.parametrize("t", GEOMETRIC_SCALES)
def test_geometric_survival_is_exp_minus_k_over_t(t: float, seeded: Seeded) -> None:
    g = geometric(seeded.source, t, N)
    for k in sorted({1, 2, math.ceil(t), math.ceil(3 * t), math.ceil(6 * t)}):
        exact = math.exp(-k / t)
        hits = int(np.count_nonzero(g >= k))
        p = binomial_pvalue(hits, N, exact)
        assert p >= ALPHA / 5, seeded.why(
            f"geometric({t:g}) P(G >= {k}) = {hits / N:.5g}, exact {exact:.5g}, p = {p:.3g}"
        )


def test_geometric_split_blocks_have_exact_laws(seeded: Seeded) -> None:
    """Above 2**20, G // 2**20 and G % 2**20 must follow the laws memorylessness predicts."""
    block = 2**20
    t = 1.5 * block
    g = geometric(seeded.source, t, N)
    blocks_p = chi_square_pvalue(
        g // block, geometric_cdf(t / block), np.arange(0, 40)
    )
    mass_below_block = -math.expm1(-block / t)

    def within_block_cdf(k: np.ndarray) -> np.ndarray:
        k = np.clip(np.asarray(k, dtype=np.float64), -1.0, block - 1.0)
        return -np.expm1(-(k + 1.0) / t) / mass_below_block

    offsets_p = chi_square_pvalue(g % block, within_block_cdf, np.linspace(0, block, 101))
    assert blocks_p >= ALPHA / 2, seeded.why(f"G // 2**20 chi-square p = {blocks_p:.3g}")
    assert offsets_p >= ALPHA / 2, seeded.why(f"G % 2**20 chi-square p = {offsets_p:.3g}")


def test_geometric_reaches_far_tail() -> None:
    """An all-zero word stream is the smallest uniform, 2**-129: -log(U) is about 89.4."""
    zeros = RandomSource(lambda n: bytes(n), is_test_seed=True)
    assert geometric(zeros, 1.0, 1)[0] == math.floor(129 * math.log(2))
    largest = int(geometric(zeros, MAX_SCALE, 1)[0])
    assert 89 * MAX_SCALE <= largest < 2**53


def test_geometric_fine_part_never_spills_into_next_block() -> None:
    """At t = 1.5 * 2**20 the largest uniform rounds the within-block offset up to 2**20."""
    ones = RandomSource(lambda n: b"\xff" * n, is_test_seed=True)
    assert geometric(ones, 1.5 * 2**20, 1)[0] == 2**20 - 1


@pytest.mark.parametrize("p", [0.0, 1e-3, 0.5, 1.0])
def test_bernoulli_frequency(p: float, seeded: Seeded) -> None:
    hits = bernoulli(seeded.source, np.full(N, p))
    assert hits.dtype == np.bool_ and hits.shape == (N,)
    count = int(np.count_nonzero(hits))
    if p in (0.0, 1.0):
        assert count == p * N, seeded.why(f"bernoulli({p}) gave {count} of {N}")
    else:
        pvalue = binomial_pvalue(count, N, p)
        assert pvalue >= ALPHA, seeded.why(f"bernoulli({p}) gave {count} of {N}, p = {pvalue:.3g}")


def test_bernoulli_takes_each_probability_elementwise(seeded: Seeded) -> None:
    p = np.array([[0.0, 1.0], [1.0, 0.0]] * 1000)
    hits = bernoulli(seeded.source, p)
    assert hits.shape == p.shape
    assert np.array_equal(hits, p == 1.0), seeded.why("bernoulli mixed up positions")


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan")])
def test_bernoulli_rejects_invalid_probability(bad: float) -> None:
    with pytest.raises(ValueError):
        bernoulli(RandomSource.system(), np.array([0.5, bad]))


def scripted(words: list[int]) -> RandomSource:
    """A source replaying fixed 64-bit words, to reach values chance never shows."""
    stream = bytearray(b"".join(w.to_bytes(8, "little") for w in words))

    def read(n: int) -> bytes:
        out = bytes(stream[:n])
        del stream[:n]
        return out

    return RandomSource(read, is_test_seed=True)


def test_uniform_is_in_open_unit_interval(seeded: Seeded) -> None:
    u = seeded.source.uniform(N)
    assert u.dtype == np.float64 and u.shape == (N,)
    assert 0.0 < u.min() and u.max() < 1.0, seeded.why("uniform left (0, 1)")
    p = stats.kstest(u, "uniform").pvalue
    assert p >= ALPHA, seeded.why(f"uniform KS p = {p:.3g}")


def test_uniform_extremes_stay_inside_open_interval() -> None:
    assert RandomSource(lambda n: bytes(n), is_test_seed=True).uniform(1)[0] == 2.0**-129
    assert RandomSource(lambda n: b"\xff" * n, is_test_seed=True).uniform(1)[0] == 1.0 - 2.0**-53


def test_uniform_refines_short_words_with_a_second_word() -> None:
    u = scripted([0, 2**60, 3, 2**63, 2**62]).uniform(3)
    assert u[0] == 2.0**-65  # (0 + (2**63 + 0.5) * 2**-64) * 2**-64, far below 2**-53
    assert u[1] == pytest.approx(2.0**-4, rel=1e-15)
    assert u[2] == pytest.approx(3.25 * 2.0**-64, rel=1e-15)


def test_uniform_small_values_have_exact_frequency(seeded: Seeded) -> None:
    u = seeded.source.uniform(4 * N)
    for threshold in (2.0**-12, 2.0**-14):
        hits = int(np.count_nonzero(u < threshold))
        p = binomial_pvalue(hits, u.size, threshold)
        assert p >= ALPHA / 2, seeded.why(f"P(U < {threshold:g}) = {hits / u.size:.4g}, p = {p:.3g}")


def test_seeded_source_is_deterministic() -> None:
    def everything(source: RandomSource) -> list[object]:
        return [
            source.random_bytes(33),
            source.uint64(7),
            source.uniform(100),
            source.hash_seeds(),
            geometric(source, 3.0, 100),
            discrete_laplace(source, 2.0**30, 100),
            discrete_gaussian(source, 30.0, 100),
            bernoulli(source, np.full(100, 0.5)),
        ]

    first, again = everything(RandomSource.from_seed(7)), everything(RandomSource.from_seed(7))
    other = everything(RandomSource.from_seed(8))
    for a, b, c in zip(first, again, other):
        assert np.array_equal(np.asarray(a), np.asarray(b))
        assert not np.array_equal(np.asarray(a), np.asarray(c))


def test_seeded_stream_is_pinned() -> None:
    """Seeds printed by past failures must keep replaying the same draws."""
    assert RandomSource.from_seed(12345).random_bytes(16).hex() == "9ee15282b0b6a12ab83011c9dbab3139"


@given(
    seed=st.integers(min_value=-(2**80), max_value=2**80),
    reads=st.lists(st.integers(min_value=0, max_value=70_000), max_size=5),
)
def test_seeded_stream_ignores_how_reads_are_split(seed: int, reads: list[int]) -> None:
    pieces = RandomSource.from_seed(seed)
    joined = b"".join(pieces.random_bytes(n) for n in reads)
    assert joined == RandomSource.from_seed(seed).random_bytes(sum(reads))


def test_sources_declare_whether_they_are_test_seeds() -> None:
    assert RandomSource.from_seed(0).is_test_seed is True
    assert RandomSource.system().is_test_seed is False


@pytest.mark.parametrize("seed", [1.0, "1", True, None])
def test_from_seed_takes_only_ints(seed: object) -> None:
    with pytest.raises(TypeError):
        RandomSource.from_seed(seed)  # type: ignore[arg-type]


def test_system_source_draws_fresh_uniform_bits() -> None:
    system = RandomSource.system()
    words = system.uint64(10**5)
    assert words.dtype == np.uint64 and words.shape == (10**5,)
    assert np.unique(words).size == words.size  # a repeat has probability 3e-10
    assert system.random_bytes(32) != system.random_bytes(32)
    bits = np.unpackbits(words.view(np.uint8))
    p = binomial_pvalue(int(bits.sum()), bits.size, 0.5)
    assert p >= ALPHA


def test_large_system_reads_are_uniform_in_both_halves() -> None:
    """A read of at least PARALLEL_READ_BYTES is joined from two threads' reads: each half
    must be fresh uniform bytes (a half left empty, zero or repeated fails)."""
    n = 2 * sampling.PARALLEL_READ_BYTES + 1
    data = np.frombuffer(RandomSource.system().random_bytes(n), dtype=np.uint8)
    assert data.size == n
    first, second = data[: n // 2], data[n // 2:]
    assert not np.array_equal(first[:1000], second[:1000])
    for half in (first, second):
        counts = np.bincount(half, minlength=256)
        assert stats.chisquare(counts).pvalue >= ALPHA


def test_hash_seeds_are_four_uint64_ints() -> None:
    seeds = RandomSource.system().hash_seeds()
    assert len(seeds) == 4 and len(set(seeds)) == 4
    assert all(type(s) is int and 0 <= s < 2**64 for s in seeds)


@pytest.mark.parametrize("sampler", [geometric, discrete_laplace, discrete_gaussian])
def test_samplers_return_int64_and_handle_empty(sampler: Callable[..., np.ndarray]) -> None:
    source = RandomSource.system()
    assert sampler(source, 2.0, 0).dtype == np.int64
    assert sampler(source, 2.0, 0).shape == (0,)
    assert sampler(source, MAX_SCALE, 5).dtype == np.int64


@pytest.mark.parametrize("sampler", [geometric, discrete_laplace, discrete_gaussian])
@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), 2.0 * MAX_SCALE])
def test_samplers_reject_invalid_scale(sampler: Callable[..., np.ndarray], scale: float) -> None:
    with pytest.raises(ValueError):
        sampler(RandomSource.system(), scale, 10)


@pytest.mark.parametrize("sampler", [geometric, discrete_laplace, discrete_gaussian])
def test_samplers_reject_invalid_count(sampler: Callable[..., np.ndarray]) -> None:
    with pytest.raises(ValueError):
        sampler(RandomSource.system(), 1.0, -1)
    with pytest.raises(TypeError):
        sampler(RandomSource.system(), 1.0, 2.5)


PACKAGE_ROOT = Path(sampling.__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "module", sorted(PACKAGE_ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE_ROOT))
)
def test_no_module_uses_a_non_cryptographic_generator(module: Path) -> None:
    text = module.read_text(encoding="utf-8")
    for banned in ("np.random", "numpy.random", "import random", "from random"):
        assert banned not in text, f"{module} contains {banned!r}; use RandomSource"
