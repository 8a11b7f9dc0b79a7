"""The discrete Laplace and Gaussian samplers as one loop over the draws, compiled by numba.

`sampling.discrete_laplace` and `sampling.discrete_gaussian` make draws of COMPILED_FROM_DRAWS
or more here: the same algorithms as their numpy passes ([CKS20] Algorithms 1 to 3), exact in
integer arithmetic, one draw after another. Written by hand because numpy needs some forty passes
over shrinking arrays per block of draws (~0.3 µs of a core a draw beside the random bytes), a
loop one (~0.1 µs); numba has no sampler that is exact or reads a given source.

Randomness is an array of uniform 16-bit words, read in order. A loop that runs out of words
stops before the draw it was making and says where that draw began; `draws` appends fresh words
and goes on from there. So every draw is a function of the stream's words, in order, however the
stream is cut into reads: a test seed gives the same numbers on every machine.

Exactness:
- a uniform integer below s: of a 32-bit word by Lemire's multiply-and-shift where s < 2**16
  ([Lem19]: the products whose low half is below (2**32 - s) mod s are redrawn), of a 63-bit word
  modulo s else (the words past the last whole multiple of s are redrawn);
- a Bernoulli(a/b): a uniform real Ω against a/b by Ω's first 16 bits, unless they are within 1
  of a/b's as float64 places them (to within 2**-34), then 16 bits at a time against a/b's from
  exact long division;
- a Bernoulli(exp(-1)): Ω against the first 1,408 bits of exp(-1) (`exp_minus_one_digits`, from
  an exact rational within 2**-1,600 of it), 16 at a time;
- a Bernoulli(p) for a float p: Ω against p's binary digits, 16 at a time (scaling by 2**16 and
  taking the whole part are exact in float64).
Three events are cut and the whole draw redrawn, each of probability below 2**-1,400: Ω's bits
tying exp(-1)'s all 1,408 of them; Algorithm 1's counter K reaching MAX_STEPS (255 coins in a row,
each succeeding with probability at most 1/K); and Algorithm 2's V passing `largest_v` (as in
`sampling`), so the draws' law is within total variation 2**-1,390 of the exact one.
The discrete Gaussian's acceptance probability is computed in float64 as `sampling` computes it;
numba's exp is the C library's (within 1 ulp on glibc), inside the 4 ulp that
`sampling.GAUSSIAN_SAMPLER_EPSILON` allows.

Helpers return (result, next word): a next word of OUT_OF_WORDS means the words ran out, a
result of CUT that the draw is to be redrawn. Run compiled (`compiled`); as Python in tests.

References:
    [Lem19] D. Lemire. "Fast Random Integer Generation in an Interval." ACM TOMACS 29(1), 2019.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from fractions import Fraction

import numpy as np

# Draws of one call from which the compiled loops make them. They save 0.1–0.4 s of wall per 10^6
# draws on two cores (benchmarks/bench_sampling.py). A release with that many noise values or
# candidates mostly has an input of 2^23 rows or more, whose compiled passes have loaded numba:
# the loops then load from numba's cache in ~0.02 s. Where numba is not loaded (a million public
# partitions of a small input), its import costs ~0.5 s of a core, what a few million draws save.
COMPILED_FROM_DRAWS = 2**19

OUT_OF_WORDS = -1
CUT = -1
# Algorithm 1's counter K stops here (the draw is redrawn). Keeps b = s·K below 2**62 for
# s < 2**54, so the long division's remainder, doubled, fits an int64.
MAX_STEPS = 256
# 16-bit words of exp(-1)'s binary digits the coins compare with: 1,408 bits.
EXP_MINUS_ONE_WORDS = 88
_WORD = 1 << 16
_SMALL = 1 << 16
_INT64_MAX = 0x7FFFFFFFFFFFFFFF
_UINT32_MASK = 0xFFFFFFFF

# Words a draw takes, to size the first read of a call (later reads go by what was used).
LAPLACE_WORDS = 8
GAUSSIAN_WORDS = 12

Loop = Callable[[np.ndarray, np.ndarray, int, int, float, np.ndarray, int], tuple[int, int]]


def draw_loop(words: np.ndarray, digits: np.ndarray, s: int, shift: int, sigma: float, out: np.ndarray,
              start: int) -> tuple[int, int]:
    """Fills out[start:] from `words`, `digits` being `exp_minus_one_digits()`: where sigma is 0,
    with discrete Laplace draws for t = s / 2**shift ([CKS20] Algorithm 2); else with discrete
    Gaussian draws of scale sigma, proposing from the discrete Laplace with t = s = floor(σ) + 1
    ([CKS20] Algorithm 3). Returns how far it filled and the first word it did not use."""
    uniform = uniform_limit(s)
    position = 0
    index = start
    while index < out.size:
        if sigma > 0:
            value, after = gaussian_draw(words, position, digits, sigma, s, uniform)
        else:
            value, after = laplace_draw(words, position, digits, s, shift, uniform)
        if after == OUT_OF_WORDS:
            break
        out[index] = value
        position = after
        index += 1
    return index, position


def laplace_arguments(t: float) -> tuple[int, int, float]:
    """`draw_loop`'s s, shift and sigma for the discrete Laplace of scale t = s / 2**shift (the exact
    ratio of the float t, whose denominator is a power of two). U + s·V < 2**63, so a shift of 63
    leaves 0 as any larger one would."""
    s, r = t.as_integer_ratio()
    return s, min(r.bit_length() - 1, 63), 0.0


def gaussian_arguments(sigma: float) -> tuple[int, int, float]:
    """`draw_loop`'s s, shift and sigma for the discrete Gaussian of scale sigma: proposals from the
    discrete Laplace with t = s = floor(σ) + 1."""
    return math.floor(sigma) + 1, 0, sigma


def gaussian_draw(words: np.ndarray, position: int, digits: np.ndarray, sigma: float, t: int,
                  uniform: int) -> tuple[int, int]:
    """One discrete Gaussian draw: a discrete Laplace proposal Y, kept with probability
    exp(-(|Y|/σ - σ/t)²/2) (the exponent as `sampling._discrete_gaussian` forms it)."""
    while True:
        proposal, position = laplace_draw(words, position, digits, t, 0, uniform)
        if position == OUT_OF_WORDS:
            return 0, OUT_OF_WORDS
        exponent = (abs(proposal) / sigma - sigma / t) ** 2 / 2
        kept, position = bernoulli_float(words, position, math.exp(-exponent))
        if position == OUT_OF_WORDS:
            return 0, OUT_OF_WORDS
        if kept:
            return proposal, position


def laplace_draw(words: np.ndarray, position: int, digits: np.ndarray, s: int, shift: int,
                 uniform: int) -> tuple[int, int]:
    """One discrete Laplace draw for t = s / 2**shift: U below s kept with probability exp(-U/s),
    V the successes of Bernoulli(exp(-1)) before a failure, Y = (U + s·V) >> shift and a random
    sign, -0 redrawn. U + s·V < 2**63, so a shift of 63 or more leaves Y = 0."""
    largest_v = _INT64_MAX // s - 1
    while True:
        u, position = uniform_below(words, position, s, uniform)
        if position == OUT_OF_WORDS:
            return 0, OUT_OF_WORDS
        kept, position = bernoulli_exp_minus(words, position, u, s)
        if position == OUT_OF_WORDS:
            return 0, OUT_OF_WORDS
        if kept != 1:
            continue
        v, position = exp_minus_one_successes(words, position, digits, largest_v)
        if position == OUT_OF_WORDS:
            return 0, OUT_OF_WORDS
        if v == CUT:
            continue
        y = (u + s * v) >> min(shift, 63)
        if position >= words.size:
            return 0, OUT_OF_WORDS
        negative = words[position] & 1
        position += 1
        if negative and y == 0:
            continue
        return (-y if negative else y), position


def exp_minus_one_successes(words: np.ndarray, position: int, digits: np.ndarray, largest_v: int) -> tuple[int, int]:
    """The successes of Bernoulli(exp(-1)) before its first failure; CUT past `largest_v` or where
    a coin is cut."""
    count = 0
    while True:
        success, position = below_digits(words, position, digits)
        if position == OUT_OF_WORDS:
            return 0, OUT_OF_WORDS
        if success == 0:
            return count, position
        count += 1
        if success == CUT or count > largest_v:
            return CUT, position


def below_digits(words: np.ndarray, position: int, digits: np.ndarray) -> tuple[int, int]:
    """1 if Ω < d, 0 if Ω > d, for the real d whose first binary digits are `digits` (16 a word)
    and whose later ones are not all 0; CUT where Ω's bits tie with all of them."""
    for index in range(digits.size):
        if position >= words.size:
            return 0, OUT_OF_WORDS
        word = words[position]
        position += 1
        if word != digits[index]:
            return (1 if word < digits[index] else 0), position
    return CUT, position


def bernoulli_exp_minus(words: np.ndarray, position: int, numerator: int, denominator: int) -> tuple[int, int]:
    """Bernoulli(exp(-γ)) for γ = numerator/denominator in [0, 1] ([CKS20] Algorithm 1), as 1 or
    0, or CUT: K counts up from 1 while Bernoulli(γ/K) succeeds; the coin is K's parity when it
    stops."""
    step = 1
    while step < MAX_STEPS:
        success, position = bernoulli_ratio(words, position, numerator, denominator * step)
        if position == OUT_OF_WORDS:
            return 0, OUT_OF_WORDS
        if not success:
            return step % 2, position
        step += 1
    return CUT, position


def bernoulli_ratio(words: np.ndarray, position: int, a: int, b: int) -> tuple[bool, int]:
    """Is Ω < a/b (0 <= a <= b < 2**62)? Ω's first 16 bits decide it unless they are within 1
    of a/b's, estimated in float64; those are decided by exact long division, 16 bits at a time."""
    if a == 0 or a == b:
        return a == b, position
    word, position = next_word(words, position)
    if position == OUT_OF_WORDS:
        return False, OUT_OF_WORDS
    estimate = int(a / b * _WORD)
    if word < estimate - 1:
        return True, position
    if word > estimate + 1:
        return False, position
    remainder = a
    while True:
        digit = 0
        for _ in range(16):
            remainder *= 2
            digit *= 2
            if remainder >= b:
                remainder -= b
                digit += 1
        if word != digit:
            return word < digit, position
        if remainder == 0:
            return False, position
        word, position = next_word(words, position)
        if position == OUT_OF_WORDS:
            return False, OUT_OF_WORDS


def bernoulli_float(words: np.ndarray, position: int, p: float) -> tuple[bool, int]:
    """Is Ω < p, for a float p in [0, 1]? Ω's bits against p's binary digits, 16 at a time."""
    scaled = p * _WORD
    digit = int(scaled)
    word, position = next_word(words, position)
    while position != OUT_OF_WORDS and word == digit:
        fraction = scaled - digit
        if fraction == 0.0:
            return False, position
        scaled = fraction * _WORD
        digit = int(scaled)
        word, position = next_word(words, position)
    return position != OUT_OF_WORDS and word < digit, position


def next_word(words: np.ndarray, position: int) -> tuple[int, int]:
    """The word at `position` and the position after it, or (0, OUT_OF_WORDS) past the last."""
    if position >= words.size:
        return 0, OUT_OF_WORDS
    return int(words[position]), position + 1


def uniform_limit(s: int) -> int:
    """What `uniform_below` redraws by, for this s: the products' low halves below it where
    s < 2**16 ((2**32 - s) mod s), else the 63-bit words above it (past the last multiple of s)."""
    if s < _SMALL:
        return (_UINT32_MASK + 1 - s) % s
    return _INT64_MAX - (_INT64_MAX % s + 1) % s


def uniform_below(words: np.ndarray, position: int, s: int, limit: int) -> tuple[int, int]:
    """A uniform integer below s (1 <= s < 2**54), `limit` being `uniform_limit(s)`."""
    while True:
        if s < _SMALL:
            if position + 2 > words.size:
                return 0, OUT_OF_WORDS
            product = (int(words[position + 1]) * _WORD + int(words[position])) * s
            position += 2
            if product & _UINT32_MASK >= limit:
                return product >> 32, position
        else:
            if position + 4 > words.size:
                return 0, OUT_OF_WORDS
            word = int(words[position + 3]) & 0x7FFF
            for index in range(2, -1, -1):
                word = word * _WORD + int(words[position + index])
            position += 4
            if word <= limit:
                return word % s, position


@functools.cache
def exp_minus_one_digits() -> np.ndarray:
    """The first 16·EXP_MINUS_ONE_WORDS binary digits of exp(-1), 16 a word, most significant first.

    From the partial sum P of Σ (-1)**k / k! to k = 300, an exact rational within 1/301! < 2**-1,600
    of exp(-1) (an alternating series with falling terms): the digits are those of every real in
    P ± 1/301!, checked to be the same at both ends.
    """
    terms = 300
    whole = math.factorial(terms)
    partial = Fraction(sum((-1) ** k * (whole // math.factorial(k)) for k in range(terms + 1)), whole)
    error = Fraction(1, math.factorial(terms + 1))
    bits = 16 * EXP_MINUS_ONE_WORDS
    low, high = math.floor((partial - error) * 2**bits), math.floor((partial + error) * 2**bits)
    if low != high:
        raise ArithmeticError("exp(-1)'s digits are not settled by the partial sum")
    digits = np.array([(low >> (16 * (EXP_MINUS_ONE_WORDS - 1 - index))) & 0xFFFF
                       for index in range(EXP_MINUS_ONE_WORDS)], dtype=np.uint16)
    digits.setflags(write=False)  # shared by every call (cached)
    return digits


_HELPERS = (gaussian_draw, laplace_draw, exp_minus_one_successes, below_digits, bernoulli_exp_minus,
            bernoulli_ratio, bernoulli_float, next_word, uniform_limit, uniform_below)
_loading = threading.Lock()


@functools.cache
def _compile() -> Loop:
    from numba import types
    from numba.extending import register_jitable

    from dprun.jit import njit_cached

    for helper in _HELPERS:
        register_jitable(helper)
    words = types.Array(types.uint16, 1, "C", readonly=True)
    out = types.Array(types.int64, 1, "C")
    result = types.UniTuple(types.int64, 2)
    loop: Loop = njit_cached([result(words, words, types.int64, types.int64, types.float64, out, types.int64)],
                             draw_loop)
    return loop


def compiled() -> Loop:
    """`draw_loop`, compiled (or loaded from numba's cache) by the first call in the process."""
    with _loading:
        return _compile()


def draws(loop: Loop, read_words: Callable[[int], np.ndarray], s: int, shift: int, sigma: float, n: int,
          words_per_draw: int) -> np.ndarray:
    """n draws of `loop(words, exp_minus_one_digits(), s, shift, sigma, out, start)`, its words read by
    `read_words(count)`: n · words_per_draw at first, then, while draws are missing, as many more
    as the last call used per draw, and a little more."""
    out = np.empty(n, dtype=np.int64)
    digits = exp_minus_one_digits()
    words = read_words(n * words_per_draw)
    filled = 0
    rate = float(words_per_draw)
    while True:
        before = filled
        filled, used = loop(words, digits, s, shift, sigma, out, filled)
        if filled == n:
            return out
        if filled > before:
            rate = used / (filled - before)
        words = np.concatenate([words[used:], read_words(int((n - filled) * rate * 1.02) + 64)])
