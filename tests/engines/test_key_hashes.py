"""Keys found by their hashes in each shard (dprun/engines/key_hashes.py): the open-addressing
table, compiled and as Python, finds every key's code and no other; a table is refused where
a hash could not tell its keys apart exactly. Seeds come from os.urandom and are part of
every assertion message."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from dprun_testing import fresh_seed

from dprun.engines import compiled, distinct_codes, key_hashes
from dprun.engines.codes import KEY
from dprun.engines.key_hashes import KeyHashes

PYTHON = compiled.UnitPasses(key_hashes.fill_slots, key_hashes.find_codes, distinct_codes.dense_codes)


def compiled_passes() -> compiled.UnitPasses:
    return compiled.compiled_unit_passes().result()


@pytest.mark.parametrize(("passes", "size"), [pytest.param(lambda: PYTHON, 300, id="python"),
                                              pytest.param(compiled_passes, 100_000, id="compiled")])
def test_found_codes_are_the_keys_codes_and_unknown_hashes_are_missing(passes: object, size: int) -> None:
    """Every hash of the table finds its own code, in any order and repeated; a hash no key has
    finds none and is counted, whatever slot its top bits name (negative hashes included)."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    hashes = np.unique(rng.integers(-2**63, 2**63 - 1, 2 * size, dtype=np.int64, endpoint=True))
    rng.shuffle(hashes)
    known, unknown = hashes[:size], hashes[size:]
    slot_bits = (2 * size - 1).bit_length()
    slots = np.zeros((1 << slot_bits, 2), np.int64)
    found_passes = passes()  # type: ignore[operator]
    found_passes.fill_key_slots(known, slots, 64 - slot_bits)
    rows = rng.integers(0, size, 5 * size)
    codes = np.empty(rows.size, np.int64)
    assert found_passes.find_key_codes(slots, known[rows], codes, 64 - slot_bits) == 0, f"seed={seed}"
    assert np.array_equal(codes, rows), f"seed={seed}"
    mixed = np.concatenate([known[:10], unknown])
    codes = np.empty(mixed.size, np.int64)
    assert found_passes.find_key_codes(slots, mixed, codes, 64 - slot_bits) == unknown.size, f"seed={seed}"
    assert np.array_equal(codes, np.r_[np.arange(10), np.full(unknown.size, -1)]), f"seed={seed}"


def test_a_shards_hashes_give_the_tables_codes_and_null_for_a_key_it_lacks() -> None:
    """A shard's key hashes, as the rows carry them, find the table's row of each key; a key the
    table lacks (the input changed between the passes) gets a null code, which fails the run."""
    seed = fresh_seed()
    table = pl.DataFrame({"city": ["Lyon", None, "Oslo"], "day": [1, 2, 2]})
    hashed = KeyHashes.of(table, dict(table.schema), seed)
    assert hashed is not None, f"seed={seed}"
    rows = pl.DataFrame({"city": ["Oslo", "Lyon", None, "Rome", "Oslo"], "day": [2, 1, 2, 2, 1]})
    codes = hashed.codes(rows.select(hashed.expr()).to_series(), PYTHON)
    assert codes.name == KEY, f"seed={seed}"
    assert codes.to_list() == [2, 0, 1, None, None], f"seed={seed}"


@pytest.mark.parametrize(("table", "rows_schema"), [
    # A float key: 0.0 and −0.0 are one key to a join, two to a hash.
    (pl.DataFrame({"k": [0.5, 1.5]}), {"k": pl.Float64}),
    # The rows' type is not the table's (a public list read as other integers): hashes would differ.
    (pl.DataFrame({"k": [1, 2]}, schema={"k": pl.Int32}), {"k": pl.Int64}),
    # Two rows with one hash, as two keys whose hashes collide would have.
    (pl.DataFrame({"k": ["a", "b", "a"]}), {"k": pl.String}),
])
def test_keys_a_hash_cannot_tell_apart_exactly_are_joined_instead(table: pl.DataFrame,
                                                                     rows_schema: dict[str, pl.DataType]) -> None:
    assert KeyHashes.of(table, rows_schema, fresh_seed()) is None
