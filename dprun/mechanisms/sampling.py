"""Random bits and integer noise samplers for dprun's mechanisms.

All randomness comes from the operating system's CSPRNG (``os.urandom``) through
`RandomSource.system()`. The only other source is `RandomSource.from_seed`, a
deterministic stream for tests, marked ``is_test_seed = True`` so callers
can tell a reproducible test run from a release. Samplers are vectorised over
numpy arrays; a large draw is made in blocks on threads, each block from its own
independent source (`RandomSource.split`: fresh system sources, or child streams
of a test seed). A call for `sampling_loops.COMPILED_FROM_DRAWS` discrete Laplace or
Gaussian draws or more makes them with the same algorithms in loops numba compiles
(`dprun.mechanisms.sampling_loops`).

Exactness: the discrete Laplace is sampled exactly, in integer arithmetic
([CKS20] Algorithms 1 and 2: a uniform integer below a bound, Bernoulli(exp(-γ))
for a rational γ, the scale t = s/r as the exact ratio of its float64 value), so
each outcome has exactly its probability (the one cut, a geometric part above
about 1,000, has probability below 2**-1400 and is redrawn). `bernoulli` is exact
for the float probability it is given. The discrete Gaussian proposes from the
exact discrete Laplace and accepts with a probability computed in float64;
`GAUSSIAN_SAMPLER_EPSILON` bounds what that rounding changes, and the planner
takes it out of the budget (docs/mechanisms.md, "Samplers").

References:
    [CKS20] C. Canonne, G. Kamath, T. Steinke. "The Discrete Gaussian for
        Differential Privacy." NeurIPS 2020. arXiv:2004.00010.
    [IK06] S. Inusah, T. J. Kozubowski. "A discrete analogue of the Laplace
        distribution." J. Statistical Planning and Inference 136(3), 2006.
    [GRS09] A. Ghosh, T. Roughgarden, M. Sundararajan. "Universally
        Utility-Maximizing Privacy Mechanisms." STOC 2009.
    [Mir12] I. Mironov. "On Significance of the Least Significant Bits for
        Differential Privacy." CCS 2012.
"""

from __future__ import annotations

import hashlib
import math
import operator
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dprun.mechanisms import sampling_loops

MAX_SCALE = 2.0**45
"""Largest accepted t or sigma: every intermediate stays an exact float64 integer below 2**53."""

# The discrete Gaussian's acceptance probability exp(-γ) is computed in float64 (the
# Bernoulli that uses it is then exact). Where γ <= 700, γ is formed to within
# 2**-51·(γ + √(2γ)) absolute from |Y|/σ and σ/t and numpy's exp is within 4 ulp, so the
# acceptance probability is within a factor 1 ± 2**-40.9 of the exact one; beyond, both
# are below e**-700 < 2**-1009. Normalising by the realised acceptance rate doubles the
# factor: every outcome's probability is within e**(±2**-39) of the exact discrete
# Gaussian's, except for a mass below 2**-1000. So for each released value that one
# privacy unit can change, the sampled mechanism is (ε + 2**-38, δ·(1 + 2**-38))-DP
# where the exact one is (ε, δ)-DP (the 2**-1000 is below what float64 can hold).
# `dprun.mechanisms.noise` calibrates for the budget less this, so the plan's stated
# guarantee covers it (docs/mechanisms.md, "Samplers").
GAUSSIAN_SAMPLER_EPSILON = 2.0**-38

# System reads of at least this many bytes are split over threads, one per core the
# process may use, each reading at least half of it (`read_parts`).
PARALLEL_READ_BYTES = 1 << 20

# Draws of one call beyond this are made in blocks of this many, each from its own source
# (`RandomSource.split`), on threads (`_in_blocks`). numpy releases the GIL for most of a
# block's work: 10^6 Gaussian draws take 0.29 s in blocks on one core, 0.19 s on two, 0.32 s
# as one block. The blocks do not depend on the cores, so a test seed draws the same numbers
# on every machine.
DRAWS_PER_BLOCK = 1 << 18

_SEED_DOMAIN = b"dprun.mechanisms.sampling.test-seed.v1\x00"
_CHILD_DOMAIN = b"dprun.mechanisms.sampling.test-seed.child.v1\x00"
_SEED_BLOCK_BYTES = 1 << 16


class _SeededStream:
    """Deterministic bytes: block i of the stream is SHAKE-256(domain || seed || i).

    The stream depends on the seed only, not on how reads are split: reading
    10 then 20 bytes gives the same 30 bytes as one read of 30.
    """

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._next_block = 0
        self._buffer = bytearray()
        self._children = 0

    @classmethod
    def of_seed(cls, seed: int) -> _SeededStream:
        # Minimal two's-complement bytes are injective over all ints, and the
        # block counter has a fixed width, so distinct seeds never share input.
        return cls(_SEED_DOMAIN + seed.to_bytes(seed.bit_length() // 8 + 1, "big", signed=True))

    def children(self, count: int) -> list[_SeededStream]:
        """`count` streams, each keyed by a hash of this one's key and the child's number (counted
        over the stream's life, so no two children share a key); their keys begin with their own
        domain, so no child's input is a parent's."""
        first = self._children
        self._children += count
        return [_SeededStream(_CHILD_DOMAIN + hashlib.sha256(self._key + index.to_bytes(8, "big")).digest())
                for index in range(first, first + count)]

    def read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            counter = self._next_block.to_bytes(8, "big")
            self._buffer += hashlib.shake_256(self._key + counter).digest(_SEED_BLOCK_BYTES)
            self._next_block += 1
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out


def _system_bytes(n: int) -> bytes:
    """os.urandom(n), a large read in parts on as many threads (`read_parts`).

    The kernel's generator runs at ~350 MB/s per core on the benchmark machine and
    os.urandom releases the GIL: selecting among 10^6 partitions reads ~56 MB, 0.17 s on
    one core, 0.09 s on two. Every part comes from the same CSPRNG, so their join is as
    uniform as one read.
    """
    parts = read_parts(n, _usable_cores())
    if len(parts) == 1:
        return os.urandom(n)
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        return b"".join(pool.map(os.urandom, parts))


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def read_parts(n: int, cores: int) -> list[int]:
    """The sizes `_system_bytes` reads `n` bytes in: one part per core, none below half of
    PARALLEL_READ_BYTES (where a thread would cost more than it saves)."""
    count = max(1, min(cores, n // (PARALLEL_READ_BYTES // 2)))
    size, extra = divmod(n, count)
    return [size + (index < extra) for index in range(count)]


class RandomSource:
    """Uniform random bits. Production: os.urandom. Test: deterministic from a seed.

    Every sampler takes its randomness from a RandomSource and from nothing
    else, so the source alone decides whether a run is reproducible.
    """

    __slots__ = ("_read", "_split", "is_test_seed")

    is_test_seed: bool

    def __init__(self, read_bytes: Callable[[int], bytes], *, is_test_seed: bool,
                 split: Callable[[int], list[RandomSource]] | None = None) -> None:
        """Wrap `read_bytes(n)`, which must return n uniform random bytes; `split(k)`, where
        given, k sources independent of each other and of this one (`split`)."""
        self._read = read_bytes
        self._split = split
        self.is_test_seed = is_test_seed

    @classmethod
    def system(cls) -> RandomSource:
        """The operating system's CSPRNG (os.urandom); the only source fit for a release."""
        return cls(_system_bytes, is_test_seed=False, split=lambda count: [cls.system() for _ in range(count)])

    @classmethod
    def from_seed(cls, seed: int) -> RandomSource:
        """A deterministic stream for tests: the same seed always gives the same bytes.

        The bytes are SHAKE-256 output keyed by the seed; they are predictable
        to anyone who knows the seed, so `is_test_seed` is True.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, not {type(seed).__name__}")
        return cls._of_stream(_SeededStream.of_seed(seed))

    @classmethod
    def _of_stream(cls, stream: _SeededStream) -> RandomSource:
        return cls(stream.read, is_test_seed=True,
                   split=lambda count: [cls._of_stream(child) for child in stream.children(count)])

    def split(self, count: int) -> list[RandomSource] | None:
        """`count` sources whose bits are independent of each other's and of this one's, to be
        read on other threads; None for a source that cannot split (it is read in order)."""
        return None if self._split is None else self._split(count)

    def random_bytes(self, n: int) -> bytes:
        """n uniform random bytes."""
        return self._read(_check_count(n))

    def uint64(self, n: int) -> np.ndarray:
        """n independent uniform integers in [0, 2**64), dtype uint64."""
        n = _check_count(n)
        return np.frombuffer(self.random_bytes(8 * n), dtype="<u8").astype(np.uint64)

    def hash_seeds(self) -> tuple[int, int, int, int]:
        """Four independent uniform ints in [0, 2**64), used as keys for a row hash."""
        a, b, c, d = (int(word) for word in self.uint64(4))
        return a, b, c, d


def discrete_laplace(source: RandomSource, t: float, n: int) -> np.ndarray:
    """n independent discrete Laplace samples (int64): P(k) ∝ exp(-|k|/t) on all integers.

    Sampled exactly ([CKS20] Algorithm 2, `_discrete_laplace`); the variance is
    2e^{-1/t} / (1 - e^{-1/t})**2. Requires 0 < t <= MAX_SCALE.
    """
    t = _check_scale("t", t)
    n = _check_count(n)
    if n >= sampling_loops.COMPILED_FROM_DRAWS:
        return _compiled_draws(source, n, sampling_loops.laplace_arguments(t), sampling_loops.LAPLACE_WORDS)
    return _in_blocks(source, n, lambda part, size: _discrete_laplace(part, t, size))


def discrete_gaussian(source: RandomSource, sigma: float, n: int) -> np.ndarray:
    """n independent discrete Gaussian samples (int64): P(k) ∝ exp(-k²/(2σ²)) on all integers.

    [CKS20] Algorithm 3: propose Y from the exact discrete Laplace with
    t = floor(σ) + 1 and accept with probability exp(-(|Y| - σ²/t)² / (2σ²)),
    computed in float64. Accepted proposals have the discrete Gaussian law to
    within a factor e**(±2**-39) per outcome (`GAUSSIAN_SAMPLER_EPSILON`); rejected
    positions are redrawn, independently, until all n are filled. The
    acceptance rate is bounded below by a constant for every σ, so the
    number of rounds grows like log(n). Requires 0 < σ <= MAX_SCALE.
    """
    sigma = _check_scale("sigma", sigma)
    n = _check_count(n)
    if n >= sampling_loops.COMPILED_FROM_DRAWS:
        return _compiled_draws(source, n, sampling_loops.gaussian_arguments(sigma), sampling_loops.GAUSSIAN_WORDS)
    return _in_blocks(source, n, lambda part, size: _discrete_gaussian(part, sigma, size))


def _discrete_gaussian(source: RandomSource, sigma: float, n: int) -> np.ndarray:
    t = math.floor(sigma) + 1
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    while pending.size:
        proposal = _discrete_laplace(source, t, pending.size)
        # (|Y|/σ - σ/t)²/2 equals the paper's exponent but cannot overflow or
        # become 0/0 when σ is very small or very large.
        exponent = (np.abs(proposal) / sigma - sigma / t) ** 2 / 2
        accepted = _bernoulli(source, np.exp(-exponent))
        out[pending[accepted]] = proposal[accepted]
        pending = pending[~accepted]
    return out


def bernoulli(source: RandomSource, p: np.ndarray) -> np.ndarray:
    """A bool array shaped like p, independently True with probability exactly p[i].

    Each float p[i] is an exact rational, and the draw compares a uniform real with it
    exactly (`_bernoulli_ratio`): p = 0 is never True and p = 1 always is. Every p[i]
    must lie in [0, 1].
    """
    p = np.asarray(p, dtype=np.float64)
    if not np.all((p >= 0.0) & (p <= 1.0)):
        raise ValueError("bernoulli probabilities must lie in [0, 1]")
    return _bernoulli(source, p)


def uniform_below(source: RandomSource, bound: int, n: int) -> np.ndarray:
    """n exact independent uniform integers in [0, bound), uint64 (1 <= bound < 2**63)."""
    if isinstance(bound, bool) or not isinstance(bound, int) or not 1 <= bound < 2**63:
        raise ValueError(f"bound must be an int in [1, 2**63), got {bound!r}")
    return _uniform_below(source, bound, _check_count(n))


def bernoulli_exp_minus(source: RandomSource, whole: np.ndarray, numerator: np.ndarray, denominator: int) -> np.ndarray:
    """Exact Bernoulli(exp(-γ)) for each γ = whole[i] + numerator[i]/denominator ([CKS20] Algorithm 1).

    exp(-γ) = exp(-1)**whole · exp(-fraction): the coin succeeds when the first `whole`
    Bernoulli(exp(-1)) coins all succeed (a geometric count of successes reaches `whole`)
    and then a Bernoulli(exp(-fraction)) does. `whole` and `numerator` are non-negative
    int64 arrays, numerator[i] <= denominator, and denominator < 2**63.
    """
    whole = np.asarray(whole, dtype=np.int64)
    numerator = np.asarray(numerator, dtype=np.int64)
    if whole.shape != numerator.shape or (whole < 0).any() or (numerator < 0).any() or (numerator > denominator).any():
        raise ValueError("bernoulli_exp_minus needs whole >= 0 and 0 <= numerator <= denominator, alike in shape")
    result = np.zeros(whole.shape, dtype=bool)
    flat_whole, flat_numerator, flat_result = whole.reshape(-1), numerator.reshape(-1), result.reshape(-1)
    alive = np.flatnonzero(flat_whole == 0)
    several = np.flatnonzero(flat_whole > 0)
    if several.size:
        reached = _count_exp_minus_one_successes(source, several.size) >= flat_whole[several]
        alive = np.sort(np.concatenate([alive, several[reached]]))
    if alive.size:
        flat_result[alive] = _bernoulli_exp_minus(source, flat_numerator[alive].astype(np.uint64), denominator)
    return result


def _in_blocks(source: RandomSource, n: int, draw: Callable[[RandomSource, int], np.ndarray]) -> np.ndarray:
    """n draws of `draw(source, count)`: beyond DRAWS_PER_BLOCK, in blocks of that many, each
    from its own split of `source`, on one thread per core the process may use."""
    sizes = [min(DRAWS_PER_BLOCK, n - start) for start in range(0, n, DRAWS_PER_BLOCK)]
    parts = source.split(len(sizes)) if len(sizes) > 1 else None
    if parts is None:
        return draw(source, n)
    with ThreadPoolExecutor(max_workers=min(len(sizes), _usable_cores())) as pool:
        return np.concatenate(list(pool.map(draw, parts, sizes)))


def _compiled_draws(source: RandomSource, n: int, arguments: tuple[int, int, float], words_per_draw: int) -> np.ndarray:
    """n draws of the compiled loop for its (s, shift, sigma) `arguments` (`sampling_loops.draws`), in
    blocks as `_in_blocks` makes them."""
    loop = sampling_loops.compiled()

    def block(part: RandomSource, size: int) -> np.ndarray:
        return sampling_loops.draws(loop, lambda count: _words(part, count), *arguments, size, words_per_draw)
    return _in_blocks(source, n, block)


def _words(source: RandomSource, count: int) -> np.ndarray:
    """`count` uniform 16-bit words, in the machine's byte order, read-only."""
    return np.frombuffer(source.random_bytes(2 * count), dtype="<u2").astype(np.uint16, copy=False)


def _discrete_laplace(source: RandomSource, t: float, n: int) -> np.ndarray:
    """[CKS20] Algorithm 2 for t = s/r (the exact ratio of the float t), vectorised.

    Draw U uniform in {0, ..., s-1} and keep it with probability exp(-U/s); draw V,
    the number of successes of Bernoulli(exp(-1)) before a failure; then X = U + s·V
    is geometric with P(X >= x) = exp(-x/s), Y = floor(X/r) is geometric with
    P(Y >= y) = exp(-y/t), and a random sign (redrawing -0) makes it two-sided.
    Everything is exact integer arithmetic in uint64: s < 2**54 and V is redrawn in
    the event V > _largest_v(s) (probability below e**-1000), which keeps X < 2**63.
    """
    s, r = t.as_integer_ratio()
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    largest_v = _largest_v(s)
    while pending.size:
        # About 0.63 of the proposals are kept: draw enough that one round usually fills all.
        proposals = pending.size + pending.size // 2 + 16
        u = _uniform_below(source, s, proposals)
        u = u[_bernoulli_exp_minus(source, u, s)][:pending.size]
        v = _count_exp_minus_one_successes(source, u.size)
        x = u + np.uint64(s) * np.minimum(v, largest_v).astype(np.uint64)
        # r is a power of two; at or above 2**64 it exceeds every X, so Y is 0.
        y = (x // np.uint64(r) if r < 2**64 else np.zeros_like(x)).astype(np.int64)
        negative = (np.frombuffer(source.random_bytes(u.size), dtype=np.uint8) & 1).astype(bool)
        accepted = np.flatnonzero((v <= largest_v) & ~(negative & (y == 0)))
        out[pending[accepted]] = np.where(negative, -y, y)[accepted]
        pending = np.delete(pending, accepted)
    return out


def _largest_v(s: int) -> int:
    """The largest V with s·(V + 1) <= 2**63 - 1, so that X = U + s·V fits an int64."""
    return (2**63 - 1) // s - 1


def _count_exp_minus_one_successes(source: RandomSource, n: int) -> np.ndarray:
    """n geometric counts: successes of Bernoulli(exp(-1)) before the first failure."""
    counts = np.zeros(n, dtype=np.int64)
    going = np.arange(n)
    while going.size:
        # For γ = 1 Algorithm 1's first step, Bernoulli(γ/1), always succeeds: start at K = 2.
        going = going[_bernoulli_exp_minus(source, np.ones(going.size, dtype=np.uint64), 1, first_k=2)]
        counts[going] += 1
    return counts


def _bernoulli_exp_minus(source: RandomSource, numerator: np.ndarray, denominator: int,
                         first_k: int = 1) -> np.ndarray:
    """Exact Bernoulli(exp(-γ)) for each γ = numerator/denominator in [0, 1] ([CKS20] Algorithm 1).

    K counts up while Bernoulli(γ/K) succeeds; P(K is odd when it stops) = Σ (-γ)^k/k! = e^{-γ}.
    `first_k` skips steps the caller knows succeed.
    """
    gamma = numerator.astype(np.float64) / float(denominator)
    go_on = _bernoulli_ratio(source, gamma / first_k, lambda i: (int(numerator[i]), denominator * first_k))
    result = np.full(numerator.size, first_k % 2 == 1)
    # Only the few that went on are followed by index from here.
    pending = np.flatnonzero(go_on)
    gamma = gamma[go_on]
    k = first_k + 1
    while pending.size:
        go_on = _bernoulli_ratio(source, gamma / k, lambda i: (int(numerator[pending[i]]), denominator * k))
        result[pending[~go_on]] = k % 2 == 1
        pending, gamma = pending[go_on], gamma[go_on]
        k += 1
    return result


def _bernoulli_ratio(source: RandomSource, ratio: np.ndarray,
                     exact_ratio: Callable[[int], tuple[int, int]]) -> np.ndarray:
    """Exact Bernoulli(a/b) for each position i: is Ω < a/b, for Ω a uniform real in [0, 1)?

    `ratio` holds a/b in float64 to within 2**-50 relative, `exact_ratio(i)` the integers
    a <= b. Ω's first 16 bits w decide it unless w is within 1 of ⌊2**16·a/b⌋ (the float
    locates 2**16·a/b to within 2**-34): the positions left (3 in 2**16) are decided
    exactly with Python integers and more random words (`_bernoulli_ratio_exactly`).
    Sixteen bits a decision keep the CSPRNG, the samplers' bottleneck, to two bytes a draw.
    """
    words = np.frombuffer(source.random_bytes(2 * ratio.size), dtype="<u2").astype(np.int32)
    floor = (ratio * float(1 << _RATIO_BITS)).astype(np.int32)
    result = words < floor
    for i in np.flatnonzero(np.abs(words - floor) <= 1):
        result[i] = _bernoulli_ratio_exactly(source, int(words[i]), *exact_ratio(int(i)))
    return result


_RATIO_BITS = 16


def _bernoulli_ratio_exactly(source: RandomSource, first: int, a: int, b: int) -> bool:
    """Is Ω < a/b, where Ω's first 16 bits are `first` and 64-bit words follow as needed?"""
    digit, a = divmod(a << _RATIO_BITS, b)  # the first 16 bits of a/b, and what is left
    word = first
    while word == digit:
        word = int(source.uint64(1)[0])
        digit, a = divmod(a << 64, b)
    return word < digit


def _uniform_below(source: RandomSource, bound: int, n: int) -> np.ndarray:
    """n exact uniform integers in [0, bound) (1 <= bound < 2**63), uint64.

    A 64-bit word w is kept when w < 2**64 - (2**64 mod bound), where w mod bound is
    exactly uniform; otherwise (probability below bound/2**64) it is redrawn.
    """
    out = np.empty(n, dtype=np.uint64)
    limit = np.uint64(2**64 - 2**64 % bound) if 2**64 % bound else None
    pending = np.arange(n)
    while pending.size:
        words = source.uint64(pending.size)
        kept = np.ones(pending.size, dtype=bool) if limit is None else words < limit
        out[pending[kept]] = words[kept] % np.uint64(bound)
        pending = pending[~kept]
    return out


def _bernoulli(source: RandomSource, p: np.ndarray) -> np.ndarray:
    flat = p.reshape(-1)
    return _bernoulli_ratio(source, flat, lambda i: float(flat[i]).as_integer_ratio()).reshape(p.shape)


def _check_count(n: int) -> int:
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"sample count must be >= 0, got {n}")
    return n


def _check_scale(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 < value <= MAX_SCALE:
        raise ValueError(f"{name} must be in (0, {MAX_SCALE:g}], got {value!r}")
    return value
