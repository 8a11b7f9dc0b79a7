"""Random bits and integer noise samplers for dprun's mechanisms.

All randomness comes from the operating system's CSPRNG (``os.urandom``) through
`RandomSource.system()`. The only other source is `RandomSource.from_seed`, a
deterministic stream for tests, marked ``is_test_seed = True`` so callers
can tell a reproducible test run from a release. Samplers are vectorised over
numpy arrays.

Floating point: these are float64 implementations, not the exact
rational-arithmetic samplers of [CKS20]. Outputs are integers, so the attack
of [Mir12] on floating-point Laplace outputs does not apply, but the
probability of each outcome is realised only up to rounding. floor(t * E)
with E = -log(U) gives each integer a window of width 1/t in E, cut from a
float64 grid of spacing about E * 2**-52; the relative error per outcome is
therefore about t * E * 2**-52. Scales above 2**20 are split into a coarse
and a fine part (see `geometric`) so that this error stays below about 2**-20
for every accepted scale.

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

MAX_SCALE = 2.0**45
"""Largest accepted t or sigma: every intermediate stays an exact float64 integer below 2**53."""

# A word at or above 2**52 converts to a float64 with full 53-bit relative
# precision; below it, the uniform needs a second word to keep that precision.
_FULL_PRECISION_WORD = 2**52
_LARGEST_BELOW_ONE = 1.0 - 2.0**-53

# Above this scale float64 resolves t * -log(U) too coarsely (see the module
# docstring), so geometric samples are split into blocks of this size.
_SPLIT_SCALE = 2.0**20
_SPLIT_BLOCK = 2**20

# System reads of at least this many bytes are split over two threads (`_system_bytes`).
PARALLEL_READ_BYTES = 1 << 20

_SEED_DOMAIN = b"dprun.mechanisms.sampling.test-seed.v1\x00"
_SEED_BLOCK_BYTES = 1 << 16


class _SeededStream:
    """Deterministic bytes: block i of the stream is SHAKE-256(domain || seed || i).

    The stream depends on the seed only, not on how reads are split: reading
    10 then 20 bytes gives the same 30 bytes as one read of 30.
    """

    def __init__(self, seed: int) -> None:
        # Minimal two's-complement bytes are injective over all ints, and the
        # block counter has a fixed width, so distinct seeds never share input.
        self._key = _SEED_DOMAIN + seed.to_bytes(seed.bit_length() // 8 + 1, "big", signed=True)
        self._next_block = 0
        self._buffer = bytearray()

    def read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            counter = self._next_block.to_bytes(8, "big")
            self._buffer += hashlib.shake_256(self._key + counter).digest(_SEED_BLOCK_BYTES)
            self._next_block += 1
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out


def _system_bytes(n: int) -> bytes:
    """os.urandom(n), a large read in two halves on two threads.

    The kernel's generator runs at ~350 MB/s per core on the benchmark machine and
    os.urandom releases the GIL: selecting among 10^6 partitions reads ~56 MB, 0.17 s on
    one core, 0.09 s on two. Both halves come from the same CSPRNG, so their join is as
    uniform as one read.
    """
    if n < PARALLEL_READ_BYTES:
        return os.urandom(n)
    half = n // 2
    with ThreadPoolExecutor(max_workers=2) as pool:
        first, second = pool.map(os.urandom, (half, n - half))
    return first + second


class RandomSource:
    """Uniform random bits. Production: os.urandom. Test: deterministic from a seed.

    Every sampler takes its randomness from a RandomSource and from nothing
    else, so the source alone decides whether a run is reproducible.
    """

    __slots__ = ("_read", "is_test_seed")

    is_test_seed: bool

    def __init__(self, read_bytes: Callable[[int], bytes], *, is_test_seed: bool) -> None:
        """Wrap `read_bytes(n)`, which must return n uniform random bytes."""
        self._read = read_bytes
        self.is_test_seed = is_test_seed

    @classmethod
    def system(cls) -> RandomSource:
        """The operating system's CSPRNG (os.urandom); the only source fit for a release."""
        return cls(_system_bytes, is_test_seed=False)

    @classmethod
    def from_seed(cls, seed: int) -> RandomSource:
        """A deterministic stream for tests: the same seed always gives the same bytes.

        The bytes are SHAKE-256 output keyed by the seed; they are predictable
        to anyone who knows the seed, so `is_test_seed` is True.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, not {type(seed).__name__}")
        return cls(_SeededStream(seed).read, is_test_seed=True)

    def random_bytes(self, n: int) -> bytes:
        """n uniform random bytes."""
        return self._read(_check_count(n))

    def uint64(self, n: int) -> np.ndarray:
        """n independent uniform integers in [0, 2**64), dtype uint64."""
        n = _check_count(n)
        return np.frombuffer(self.random_bytes(8 * n), dtype="<u8").astype(np.uint64)

    def uniform(self, n: int) -> np.ndarray:
        """n independent uniform float64 values in the open interval (0, 1).

        Each value is (w + 0.5) * 2**-64 for a uniform 64-bit word w, rounded
        to float64. Words below 2**52 (probability 2**-12) are refined with a
        second word, (w + (w2 + 0.5) * 2**-64) * 2**-64, so every value keeps
        about 52 bits of relative precision down to the smallest one,
        2**-129. Hence -log(U) reaches 89.4, and the probability mass the
        sampler cannot produce, P(U < 2**-129), is 2**-129 < 2**-120.
        Never returns 0 or 1: the rare word that rounds to 1.0 is returned as
        the largest float64 below 1.
        """
        words = self.uint64(n)
        values = (words.astype(np.float64) + 0.5) * 2.0**-64
        short = np.flatnonzero(words < _FULL_PRECISION_WORD)
        if short.size:
            fraction = (self.uint64(short.size).astype(np.float64) + 0.5) * 2.0**-64
            values[short] = (words[short].astype(np.float64) + fraction) * 2.0**-64
        return np.minimum(values, _LARGEST_BELOW_ONE)

    def hash_seeds(self) -> tuple[int, int, int, int]:
        """Four independent uniform ints in [0, 2**64), used as keys for a row hash."""
        a, b, c, d = (int(word) for word in self.uint64(4))
        return a, b, c, d


def geometric(source: RandomSource, t: float, n: int) -> np.ndarray:
    """n independent geometric samples (int64) with P(G >= k) = exp(-k/t), k = 0, 1, 2, ...

    G = floor(t * E) with E = -log(U) exponential(1), since
    P(floor(tE) >= k) = P(E >= k/t) = exp(-k/t); this is the noise of the
    geometric mechanism [GRS09]. For t above 2**20, G = m*A + B with
    m = 2**20, A = floor((t/m) * E) and B an independent geometric of scale t
    conditioned on B < m: by memorylessness this is the same law, and each
    part is computed at a scale float64 resolves. Requires 0 < t <= MAX_SCALE;
    since E <= 89.4 every result is below 2**53 and exact before the cast.
    """
    return _geometric(source, _check_scale("t", t), _check_count(n))


def discrete_laplace(source: RandomSource, t: float, n: int) -> np.ndarray:
    """n independent discrete Laplace samples (int64): P(k) ∝ exp(-|k|/t) on all integers.

    The difference of two independent geometrics with the same t has exactly
    this law [IK06]; its variance is 2e^{-1/t} / (1 - e^{-1/t})**2.
    Requires 0 < t <= MAX_SCALE.
    """
    return _discrete_laplace(source, _check_scale("t", t), _check_count(n))


def discrete_gaussian(source: RandomSource, sigma: float, n: int) -> np.ndarray:
    """n independent discrete Gaussian samples (int64): P(k) ∝ exp(-k²/(2σ²)) on all integers.

    [CKS20] Algorithm 3: propose Y from a discrete Laplace with
    t = floor(σ) + 1 and accept with probability exp(-(|Y| - σ²/t)² / (2σ²)).
    Accepted proposals have exactly the discrete Gaussian law (up to the
    rounding described in the module docstring); rejected
    positions are redrawn, independently, until all n are filled. The
    acceptance rate is bounded below by a constant for every σ, so the
    number of rounds grows like log(n). Requires 0 < σ <= MAX_SCALE.
    """
    sigma = _check_scale("sigma", sigma)
    n = _check_count(n)
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
    """A bool array shaped like p, independently True with probability p[i].

    True when U < p[i] for a fresh uniform U in (0, 1): p = 0 is never True
    and p = 1 always is. Every p[i] must lie in [0, 1].
    """
    p = np.asarray(p, dtype=np.float64)
    if not np.all((p >= 0.0) & (p <= 1.0)):
        raise ValueError("bernoulli probabilities must lie in [0, 1]")
    return _bernoulli(source, p)


def _geometric(source: RandomSource, t: float, n: int) -> np.ndarray:
    if t <= _SPLIT_SCALE:
        return _floor_exponential(source, t, n)
    blocks = _floor_exponential(source, t / _SPLIT_BLOCK, n)
    return blocks * _SPLIT_BLOCK + _truncated_geometric(source, t, _SPLIT_BLOCK, n)


def _floor_exponential(source: RandomSource, t: float, n: int) -> np.ndarray:
    return np.floor(t * -np.log(source.uniform(n))).astype(np.int64)


def _truncated_geometric(source: RandomSource, t: float, m: int, n: int) -> np.ndarray:
    """Geometric of scale t conditioned on being below m, by inverting its CDF."""
    mass_below_m = -math.expm1(-m / t)
    fine = np.floor(t * -np.log1p(-source.uniform(n) * mass_below_m)).astype(np.int64)
    # Exact arithmetic stays below m; rounding can reach m when U is within
    # an ulp of 1, and m would belong to the next block.
    return np.minimum(fine, m - 1)


def _discrete_laplace(source: RandomSource, t: float, n: int) -> np.ndarray:
    return _geometric(source, t, n) - _geometric(source, t, n)


def _bernoulli(source: RandomSource, p: np.ndarray) -> np.ndarray:
    return source.uniform(p.size).reshape(p.shape) < p


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
