"""The heavy units' kept pairs added in one pass (dprun/engines/ranked_pairs.py), compiled and
as Python, against the boundings' definition: each unit keeps its first L0 pairs among those
whose key is chosen. Seeds come from os.urandom and are part of every assertion message."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from dprun_testing import fresh_seed

from dprun.engines import compiled, ranked_pairs

KEYS = 40


def kept_by_definition(units: np.ndarray, keys: np.ndarray, partials: np.ndarray, chosen: np.ndarray | None,
                       max_partitions: int) -> np.ndarray:
    table = np.zeros((KEYS, 1 + partials.shape[0]), np.int64)
    taken: dict[int, int] = {}
    for pair, (unit, key) in enumerate(zip(units.tolist(), keys.tolist(), strict=True)):
        if chosen is not None and not chosen[key]:
            continue
        taken[unit] = taken.get(unit, 0) + 1
        if taken[unit] <= max_partitions:
            table[key, 0] += 1
            table[key, 1:] += partials[:, pair]
    return table


@pytest.mark.parametrize("run", ["python", "compiled"])
@pytest.mark.parametrize("choice", ["every key", "some keys"])
def test_each_unit_keeps_its_first_pairs_among_the_chosen_keys(run: str, choice: str) -> None:
    add: Callable[..., None] = (ranked_pairs.add_ranked_pairs if run == "python"
                                else compiled.compiled_passes().result().add_ranked_pairs)
    for _ in range(20):
        seed = fresh_seed()
        rng = np.random.default_rng(seed)
        per_unit = rng.integers(1, 30, 40)
        # Units in any order of codes (0 included), each unit's pairs together.
        units = np.repeat(rng.permutation(200)[:per_unit.size], per_unit)
        keys = rng.integers(0, KEYS, units.size)
        partials = rng.integers(-1000, 1000, (int(rng.integers(0, 3)), units.size))
        chosen = rng.random(KEYS) < 0.6 if choice == "some keys" else None
        max_partitions = int(rng.integers(1, 12))
        table = np.zeros((KEYS, 1 + partials.shape[0]), np.int64)
        add(units, keys, partials, np.zeros(0, bool) if chosen is None else chosen, max_partitions, table)
        expected = kept_by_definition(units, keys, partials, chosen, max_partitions)
        assert np.array_equal(table, expected), f"seed={seed}"
