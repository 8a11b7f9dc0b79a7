"""Tests for dprun.mechanisms.sampling: exact-law checks and the randomness contract.

Every statistical assertion is calibrated so that a correct sampler fails it
with probability at most about ALPHA = 5e-9 (exact binomial tails, chi-square
tails with at least MIN_EXPECTED per cell, or Z = 6 standard errors on a
mean). The file makes about 100 such assertions, so a correct implementation
fails a run spuriously less than once in a million runs.

Each run is fresh: the `seeded` fixture draws a seed from os.urandom and
samples from RandomSource.from_seed(seed). The seed is in every assertion
message; DPRUN_TEST_SEED=<seed> replays a failing test on the same draws.

The discrete Laplace and Gaussian laws are checked on both paths a draw can take
(`path`): numpy's passes, and the compiled loops of `sampling_loops` that draws of
COMPILED_FROM_DRAWS or more take.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import Seeded
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from dprun.mechanisms import sampling, sampling_loops
from dprun.mechanisms.sampling import (
    MAX_SCALE,
    RandomSource,
    bernoulli,
    discrete_gaussian,
    discrete_laplace,
)

ALPHA = 5e-9
Z = 6.0  # two-sided normal tail 2e-9
MIN_EXPECTED = 500  # keeps the chi-square approximation sound out to ALPHA
N = 10**6

LAPLACE_SCALES = [0.3, 1.0, 7.5, 1e3, 2.0**40]
GAUSSIAN_SIGMAS = [0.5, 2.0, 30.0, 1e4, 2.0**40]
# Below this sigma the exact pmf is summed; above it the continuous limit
# differs from the lattice law by O(1/sigma**2), invisible at N samples.
SUMMED_SIGMA_LIMIT = 1e4




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


@pytest.fixture(params=["numpy", "compiled"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The samplers' numpy passes, or their compiled loops, for draws of every size."""
    threshold = 2**62 if request.param == "numpy" else 0
    monkeypatch.setattr(sampling_loops, "COMPILED_FROM_DRAWS", threshold)
    return str(request.param)


def draw(name: str, scale: float, seeded: Seeded) -> np.ndarray:
    x = SAMPLERS[name](seeded.source, scale, N)
    assert x.dtype == np.int64 and x.shape == (N,)
    return x


@pytest.mark.parametrize(("name", "scale"), SYMMETRIC_CASES)
def test_symmetric_sampler_fits_exact_pmf(name: str, scale: float, seeded: Seeded, path: str) -> None:
    x = draw(name, scale, seeded)
    span = CELL_SPAN[name]
    edges = scale * np.linspace(-span, span, 121)
    p = chi_square_pvalue(x, LAWS[name](scale).cdf, edges)
    assert p >= ALPHA, seeded.why(f"{name}({scale:g}) chi-square p = {p:.3g}")


@pytest.mark.parametrize(("name", "scale"), SYMMETRIC_CASES)
def test_symmetric_sampler_mean_and_variance(name: str, scale: float, seeded: Seeded, path: str) -> None:
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
def test_symmetric_sampler_tail_mass(name: str, scale: float, seeded: Seeded, path: str) -> None:
    k = math.ceil(3.5 * scale)
    exact = LAWS[name](scale).two_sided_tail(k)
    hits = int(np.count_nonzero(np.abs(draw(name, scale, seeded)) >= k))
    p = binomial_pvalue(hits, N, exact)
    assert p >= ALPHA, seeded.why(
        f"{name}({scale:g}) P(|X| >= {k}) = {hits / N:.4g}, exact {exact:.4g}, p = {p:.3g}"
    )


@pytest.mark.parametrize("bound", [1, 3, 1000, 2**53 - 1])
def test_uniform_below_is_uniform(bound: int, seeded: Seeded) -> None:
    u = sampling._uniform_below(seeded.source, bound, N)
    assert u.dtype == np.uint64 and int(u.max()) < bound
    cells = min(bound, 200)
    counts = np.bincount((u.astype(np.float64) * cells / bound).astype(np.int64), minlength=cells)
    expected = np.diff(np.ceil(np.arange(cells + 1) * bound / cells)) / bound * N
    p = float(stats.chisquare(counts, expected).pvalue) if cells > 1 else 1.0
    assert p >= ALPHA, seeded.why(f"uniform below {bound}: chi-square p = {p:.3g}")


def test_uniform_below_redraws_words_past_the_last_whole_multiple() -> None:
    """For bound 3, 2**64 mod 3 = 1: the word 2**64 - 1 would favour 0, so it is redrawn."""
    assert sampling._uniform_below(scripted([2**64 - 1, 5]), 3, 1).tolist() == [2]


@pytest.mark.parametrize(("numerator", "denominator"), [(0, 1), (1, 1), (1, 3), (2, 7), (999, 1000), (5, 2**53)])
def test_bernoulli_exp_minus_gamma_has_probability_exp_minus_gamma(numerator: int, denominator: int,
                                                                    seeded: Seeded) -> None:
    hits = int(np.count_nonzero(sampling._bernoulli_exp_minus(
        seeded.source, np.full(N, numerator, dtype=np.uint64), denominator)))
    exact = math.exp(-numerator / denominator)
    p = binomial_pvalue(hits, N, exact)
    assert p >= ALPHA, seeded.why(f"Bernoulli(exp(-{numerator}/{denominator})) gave {hits / N:.5f}, "
                                  f"exact {exact:.5f}, p = {p:.3g}")


def test_exp_minus_one_successes_are_geometric(seeded: Seeded) -> None:
    v = sampling._count_exp_minus_one_successes(seeded.source, N)
    cdf = lambda k: np.where(np.asarray(k) < 0, 0.0, 1.0 - np.exp(-(np.asarray(k, dtype=np.float64) + 1.0)))
    p = chi_square_pvalue(v, cdf, np.arange(0, 12))
    assert p >= ALPHA, seeded.why(f"successes of Bernoulli(exp(-1)): chi-square p = {p:.3g}")


def sixteen_bit_then(first: int, words: list[int]) -> RandomSource:
    """A source whose first 16-bit draw is `first`, then 64-bit words."""
    stream = bytearray(first.to_bytes(2, "little") + b"".join(w.to_bytes(8, "little") for w in words))

    def read(n: int) -> bytes:
        out = bytes(stream[:n])
        del stream[:n]
        return out

    return RandomSource(read, is_test_seed=True)


@pytest.mark.parametrize(("first", "words", "a", "b", "expected"), [
    # 1/3 = 0.0101...: its first 16 bits are 0x5555, the next 64 bits 0x5555...5
    (0x5554, [], 1, 3, True), (0x5556, [], 1, 3, False),
    (0x5555, [0x5555555555555554], 1, 3, True), (0x5555, [0x5555555555555556], 1, 3, False),
    (0x5555, [0x5555555555555555, 0], 1, 3, True),
    # 1/2 = 0.1000...: Ω = 0.1000... exactly ties only with probability 0; any later 1 bit makes Ω larger
    (0x8000, [0, 1], 1, 2, False), (0x7FFF, [], 1, 2, True),
    (0, [0, 0, 1], 0, 1, False), (0xFFFF, [2**64 - 1], 1, 1, True),
])
def test_bernoulli_ratio_near_the_threshold_is_decided_exactly(first: int, words: list[int], a: int, b: int,
                                                               expected: bool) -> None:
    """Where the first 16 bits of Ω tie with a/b's, later 64-bit words decide, in exact integers."""
    source = sixteen_bit_then(first, words)
    assert sampling._bernoulli_ratio(source, np.array([a / b]), lambda i: (a, b))[0] == expected


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


def test_seeded_source_is_deterministic() -> None:
    def everything(source: RandomSource) -> list[object]:
        return [
            source.random_bytes(33),
            source.uint64(7),
            source.hash_seeds(),
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


@pytest.mark.parametrize("sampler", [discrete_laplace, discrete_gaussian])
def test_blocks_of_a_large_draw_are_independent_and_the_same_on_any_cores(
        sampler: Callable[..., np.ndarray], seeded: Seeded, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """A draw of four blocks and a bit: no two blocks' draws are correlated (children sharing
    a stream would repeat a block), and a test seed gives the same numbers on 1 and 8 cores."""
    block = sampling.DRAWS_PER_BLOCK
    monkeypatch.setattr(sampling, "_usable_cores", lambda: 8)
    x = sampler(RandomSource.from_seed(seeded.seed), 30.0, 4 * block + 7)
    monkeypatch.setattr(sampling, "_usable_cores", lambda: 1)
    assert np.array_equal(x, sampler(RandomSource.from_seed(seeded.seed), 30.0, 4 * block + 7)), seeded.why("cores")
    blocks = x[:4 * block].reshape(4, block).astype(np.float64)
    correlation = np.corrcoef(blocks)[np.triu_indices(4, 1)]
    # Each correlation of independent blocks is about N(0, 1/block): |r| <= Z/sqrt(block) fails w.p. 2e-9.
    assert np.all(np.abs(correlation) <= Z / math.sqrt(block)), seeded.why(f"block correlations {correlation}")


def test_a_source_that_cannot_split_is_read_in_order() -> None:
    """A source without `split` draws a large sample in one piece, from its own bytes in order."""
    n = sampling.DRAWS_PER_BLOCK + 3
    stream = RandomSource.from_seed(11)
    unsplit = RandomSource(stream.random_bytes, is_test_seed=True)
    assert unsplit.split(2) is None
    assert np.array_equal(discrete_laplace(unsplit, 5.0, n),
                          sampling._discrete_laplace(RandomSource.from_seed(11), 5.0, n))


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


@pytest.mark.parametrize("cores", [2, 5])
def test_large_system_reads_are_uniform_in_every_part(cores: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large read is joined from one read per core: each part must be fresh uniform bytes
    (a part left empty, zero or repeated fails)."""
    monkeypatch.setattr(sampling, "_usable_cores", lambda: cores)
    n = cores * sampling.PARALLEL_READ_BYTES // 2 + 1
    sizes = sampling.read_parts(n, cores)
    assert len(sizes) == cores
    data = np.frombuffer(RandomSource.system().random_bytes(n), dtype=np.uint8)
    assert data.size == n
    parts = np.split(data, np.cumsum(sizes)[:-1])
    assert len({part[:1000].tobytes() for part in parts}) == cores
    for part in parts:
        counts = np.bincount(part, minlength=256)
        assert stats.chisquare(counts).pvalue >= ALPHA / cores


@pytest.mark.parametrize("n", [0, 1, sampling.PARALLEL_READ_BYTES - 1, sampling.PARALLEL_READ_BYTES,
                               10 * sampling.PARALLEL_READ_BYTES + 7])
@pytest.mark.parametrize("cores", [1, 2, 3, 16, 64])
def test_reads_are_split_one_part_per_core_none_below_half_the_threshold(n: int, cores: int) -> None:
    sizes = sampling.read_parts(n, cores)
    assert sum(sizes) == n and 1 <= len(sizes) <= cores
    assert max(sizes) - min(sizes) <= 1
    assert len(sizes) == 1 or min(sizes) >= sampling.PARALLEL_READ_BYTES // 2
    # As many parts as the cores allow: one more would go below half the threshold.
    assert len(sizes) == cores or n // (len(sizes) + 1) < sampling.PARALLEL_READ_BYTES // 2


def test_hash_seeds_are_four_uint64_ints() -> None:
    seeds = RandomSource.system().hash_seeds()
    assert len(seeds) == 4 and len(set(seeds)) == 4
    assert all(type(s) is int and 0 <= s < 2**64 for s in seeds)


@pytest.mark.parametrize("sampler", [discrete_laplace, discrete_gaussian])
def test_samplers_return_int64_and_handle_empty(sampler: Callable[..., np.ndarray], path: str) -> None:
    source = RandomSource.system()
    assert sampler(source, 2.0, 0).dtype == np.int64
    assert sampler(source, 2.0, 0).shape == (0,)
    assert sampler(source, MAX_SCALE, 5).dtype == np.int64


@pytest.mark.parametrize("sampler", [discrete_laplace, discrete_gaussian])
@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), 2.0 * MAX_SCALE])
def test_samplers_reject_invalid_scale(sampler: Callable[..., np.ndarray], scale: float) -> None:
    with pytest.raises(ValueError):
        sampler(RandomSource.system(), scale, 10)


@pytest.mark.parametrize("sampler", [discrete_laplace, discrete_gaussian])
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


@pytest.mark.parametrize(("whole", "numerator"), [(0, 0), (0, 3), (1, 0), (2, 5), (4, 1)])
def test_bernoulli_exp_minus_frequency(whole: int, numerator: int, seeded: Seeded) -> None:
    denominator = 8
    hits = int(sampling.bernoulli_exp_minus(seeded.source, np.full(N, whole), np.full(N, numerator), denominator).sum())
    exact = math.exp(-(whole + numerator / denominator))
    p = binomial_pvalue(hits, N, exact) if 0 < exact < 1 else float(hits == N)
    assert p > ALPHA, seeded.why(f"γ = {whole} + {numerator}/8: {hits} of {N} heads, expected {exact * N:.0f}")


def test_bernoulli_exp_minus_refuses_what_is_not_a_probability() -> None:
    with pytest.raises(ValueError, match="numerator"):
        sampling.bernoulli_exp_minus(sampling.RandomSource.from_seed(0), np.array([0]), np.array([9]), 8)
