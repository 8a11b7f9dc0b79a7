"""Tests for dprun.mechanisms.sampling_loops: the compiled loops do what their Python source says,
however the random words are cut into reads, and decide every coin exactly on words chance
almost never shows. The laws of their draws are checked in test_sampling.py (its `path`)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, getcontext

import numpy as np
import pytest

from dprun.mechanisms import sampling_loops as loops
from dprun.mechanisms.sampling import RandomSource, _words

LAPLACE_CASES = [  # (t, why)
    (10.0, "small s"),
    (0.3, "s near 2**53, shift 54"),
    (2.0**40, "s = 2**40, the 63-bit words"),
    (2.0**-70, "shift past 63"),
]
GAUSSIAN_SIGMAS = [0.5, 10.0, 1e4]


def reader(seed: int) -> Callable[[int], np.ndarray]:
    source = RandomSource.from_seed(seed)
    return lambda count: _words(source, count)


def words(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint16)


CASES = ([loops.laplace_arguments(t) for t, _ in LAPLACE_CASES]
         + [loops.gaussian_arguments(sigma) for sigma in GAUSSIAN_SIGMAS])
CASE_IDS = [f"laplace {why}" for _, why in LAPLACE_CASES] + [f"gaussian {sigma:g}" for sigma in GAUSSIAN_SIGMAS]


@pytest.mark.parametrize("arguments", CASES, ids=CASE_IDS)
def test_the_compiled_loop_draws_what_its_python_source_draws(arguments: tuple[int, int, float]) -> None:
    stream = reader(1)(20_000)
    digits = loops.exp_minus_one_digits()
    python_out, compiled_out = np.zeros(1000, dtype=np.int64), np.zeros(1000, dtype=np.int64)
    assert loops.draw_loop(stream, digits, *arguments, python_out, 0) == loops.compiled()(
        stream, digits, *arguments, compiled_out, 0)
    assert np.array_equal(python_out, compiled_out)


def test_a_loop_out_of_words_stops_where_its_unfinished_draw_began() -> None:
    loop = loops.compiled()
    stream = reader(3)(5_000)
    arguments = (loops.exp_minus_one_digits(), *loops.laplace_arguments(10.0))
    whole = np.zeros(300, dtype=np.int64)
    loop(stream, *arguments, whole, 0)
    cut = np.zeros(300, dtype=np.int64)
    filled, used = loop(stream[:1000], *arguments, cut, 0)
    assert 0 < filled < 300 and used <= 1000
    # Given the rest of the stream from where it stopped, it goes on as if never stopped.
    assert loop(stream[used:], *arguments, cut, filled)[0] == 300
    assert np.array_equal(cut, whole)


@pytest.mark.parametrize("arguments", [loops.laplace_arguments(7.5), loops.gaussian_arguments(7.5)],
                         ids=["laplace", "gaussian"])
def test_draws_are_the_same_however_the_stream_is_cut_into_reads(arguments: tuple[int, int, float]) -> None:
    one_read = loops.draws(loops.compiled(), reader(4), *arguments, 20_000, 100)
    many_reads = loops.draws(loops.compiled(), reader(4), *arguments, 20_000, 1)
    assert np.array_equal(one_read, many_reads)
    assert np.unique(one_read).size > 20


def test_exp_minus_one_digits_are_those_of_a_correctly_rounded_decimal() -> None:
    getcontext().prec = 600  # Decimal's exp is correctly rounded: within 10**-600 of exp(-1)
    bits = 16 * loops.EXP_MINUS_ONE_WORDS
    expected = int((Decimal(-1).exp() * 2**bits).to_integral_value(rounding="ROUND_FLOOR"))
    digits = loops.exp_minus_one_digits()
    assert int("".join(f"{word:04x}" for word in digits), 16) == expected
    assert digits[0] == 0x5E2D  # exp(-1) = 0.367879... = 0x0.5E2D58D8...


def test_a_coin_against_exp_minus_one_reads_as_many_words_as_tie_and_is_cut_past_them() -> None:
    digits = loops.exp_minus_one_digits()
    assert loops.below_digits(words([0x5E2C]), 0, digits) == (1, 1)
    assert loops.below_digits(words([0x5E2E]), 0, digits) == (0, 1)
    assert loops.below_digits(words([0x5E2D, int(digits[1]) - 1]), 0, digits) == (1, 2)
    assert loops.below_digits(words([0x5E2D, int(digits[1]) + 1]), 0, digits) == (0, 2)
    assert loops.below_digits(digits, 0, digits) == (loops.CUT, loops.EXP_MINUS_ONE_WORDS)
    assert loops.below_digits(digits[:3], 0, digits) == (0, loops.OUT_OF_WORDS)


@pytest.mark.parametrize(("stream", "expected"), [
    ([21843], (True, 1)),  # far below 1/3's first 16 bits, 0x5555 = 21845: no division
    ([21847], (False, 1)),
    ([21845, 0x5554], (True, 2)),  # 1/3 = 0.0101...: a tie, then below its next 16 bits
    ([21845, 0x5556], (False, 2)),
    ([21845, 0x5555, 0x5555, 0x5554], (True, 4)),
    ([21844], (True, 1)),  # within 1 of the estimate: decided by the long division
    ([21845], (False, loops.OUT_OF_WORDS)),
])
def test_a_ratio_coin_near_its_threshold_is_decided_by_exact_long_division(stream: list[int],
                                                                          expected: tuple[bool, int]) -> None:
    assert loops.bernoulli_ratio(words(stream), 0, 1, 3) == expected


def test_a_ratio_coin_whose_digits_end_compares_the_rest_of_omega_with_zeros() -> None:
    # 3/4 = 0xC000 exactly: Ω with those 16 bits is at least 3/4, however it goes on.
    assert loops.bernoulli_ratio(words([0xC000]), 0, 3, 4) == (False, 1)
    assert loops.bernoulli_ratio(words([0xBFFF]), 0, 3, 4) == (True, 1)
    assert loops.bernoulli_ratio(words([]), 0, 0, 4) == (False, 0)
    assert loops.bernoulli_ratio(words([]), 0, 4, 4) == (True, 0)


@pytest.mark.parametrize(("p", "stream", "expected"), [
    (0.5, [0x7FFF], (True, 1)),
    (0.5, [0x8000], (False, 1)),  # Ω >= 1/2 once its first bits are p's and p's end
    (1.0, [0xFFFF], (True, 1)),
    (0.0, [0x0000], (False, 1)),
    (2.0**-20 * 3, [0x0000, 0x2FFF], (True, 2)),  # 3·2**-20 = 0x0.0000_3000
    (2.0**-20 * 3, [0x0000, 0x3000], (False, 2)),
    (2.0**-20 * 3, [0x0000], (False, loops.OUT_OF_WORDS)),
])
def test_a_float_coin_compares_omega_with_the_float_s_binary_digits(p: float, stream: list[int],
                                                                   expected: tuple[bool, int]) -> None:
    assert loops.bernoulli_float(words(stream), 0, p) == expected


def test_algorithm_one_is_cut_when_its_counter_reaches_max_steps() -> None:
    # γ = 1: the first coin, Bernoulli(1), takes no word; a word of 0 is below every γ/K after it.
    zeros = np.zeros(loops.MAX_STEPS, dtype=np.uint16)
    assert loops.bernoulli_exp_minus(zeros, 0, 5, 5) == (loops.CUT, loops.MAX_STEPS - 2)
    # Bernoulli(1/2) fails on the first word at or above 2**15: K = 2 is even, so the coin is 0.
    assert loops.bernoulli_exp_minus(words([0x8000]), 0, 5, 5) == (0, 1)
    assert loops.bernoulli_exp_minus(words([0x0000, 0xFFFF]), 0, 5, 5) == (1, 2)


def test_small_bounds_redraw_the_products_whose_low_half_is_below_the_limit() -> None:
    # s = 3: 2**32 mod 3 = 1. The word 0 gives the product 0, low half 0 < 1: redrawn. The word
    # 2**32 - 1 gives 3·2**32 - 3: high half 2, low half 2**32 - 3.
    assert loops.uniform_limit(3) == 1
    assert loops.uniform_below(words([0, 0, 0xFFFF, 0xFFFF]), 0, 3, 1) == (2, 4)
    assert loops.uniform_below(words([0, 0]), 0, 3, 1) == (0, loops.OUT_OF_WORDS)


def test_large_bounds_redraw_the_words_past_the_last_whole_multiple() -> None:
    s = 2**53 - 1
    limit = loops.uniform_limit(s)
    assert limit == 2**63 - 2**63 % s - 1
    top = [0xFFFF, 0xFFFF, 0xFFFF, 0x7FFF]  # 2**63 - 1, past the last multiple of s
    assert loops.uniform_below(words(top + [5, 0, 0, 0]), 0, s, limit) == (5, 8)
    # The bit above 63 is dropped: 2**63 + 7 reads as 7.
    assert loops.uniform_below(words([7, 0, 0, 0x8000]), 0, s, limit) == (7, 4)
