"""Spends as exact numbers: (ε, δ) stored as decimal strings and added as fractions.

A spend is stored as the exact decimal string of the shortest repr of the float the plan
guarantees, and summed as `fractions.Fraction`, so no float drift accumulates over many
releases: ten releases of ε = 0.1 spend exactly 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

# At most 400 digits and a three-digit exponent: a ledger row of garbage such as 1e999999999 would
# otherwise make an exact Fraction of a billion digits (no real spend comes near).
DECIMAL = re.compile(r"^(?=.{1,400}$)(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?$")


def exact(value: float | str) -> Fraction:
    """The exact value of a float's shortest decimal repr, or of a decimal string."""
    text = repr(float(value)) if isinstance(value, (int, float)) else value
    if not isinstance(text, str) or not DECIMAL.match(text):
        raise ValueError(f"not a non-negative decimal number: {text!r}")
    return Fraction(text)


def decimal_text(value: Fraction) -> str:
    """The exact decimal string of a fraction whose denominator is 2^a·5^b (all our sums are)."""
    numerator, denominator = value.numerator, value.denominator
    twos = fives = 0
    while denominator % 2 == 0:
        denominator //= 2
        twos += 1
    while denominator % 5 == 0:
        denominator //= 5
        fives += 1
    if denominator != 1:  # not reachable from decimal inputs; keep a faithful, if long, answer
        return str(value)
    places = max(twos, fives)
    scaled = numerator * 10**places // value.denominator
    sign = 1 if scaled < 0 else 0
    digits = str(abs(scaled))
    while places > 0 and len(digits) > 1 and digits.endswith("0"):
        digits, places = digits[:-1], places - 1
    return str(Decimal((sign, tuple(int(d) for d in digits), -places)))


@dataclass(frozen=True)
class Spend:
    """(ε, δ) as exact fractions."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)

    @classmethod
    def of(cls, epsilon: float | str, delta: float | str) -> Spend:
        return cls(exact(epsilon), exact(delta))

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.epsilon + other.epsilon, self.delta + other.delta)

    def __sub__(self, other: Spend) -> Spend:
        return Spend(max(self.epsilon - other.epsilon, Fraction(0)), max(self.delta - other.delta, Fraction(0)))

    def within(self, limit: Spend) -> bool:
        return self.epsilon <= limit.epsilon and self.delta <= limit.delta

    def as_dict(self) -> dict[str, str]:
        return {"epsilon": decimal_text(self.epsilon), "delta": decimal_text(self.delta)}

    def __str__(self) -> str:
        return f"ε={decimal_text(self.epsilon)}, δ={decimal_text(self.delta)}"
