"""The light units' passes (dprun/engines/light_units.py): compiled, as Python, and numpy's passes
(`sorted_bounding._Totals`) against a brute-force reference, from pairs, from sorted rows and
from rows in unit order; exact sums past int64; small inputs never import numba. Seeds come
from os.urandom and are part of every assertion message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dprun_testing import REPOSITORY, every_sum, example_copy, fresh_seed, no_ambient_ledger

from dprun.engines import compiled as compiled_passes
from dprun.engines import light_units, pair_units, sorted_bounding
from dprun.engines.polars_steps import SELECTION_WEIGHTS

Reference = tuple[list[int], list[list[int]], list[int]]
assert no_ambient_ledger  # the fixture is used by name below


# Four quantities over two value columns: rows, rows with a value, a sum, a sum of squares
# (`light_units.add_light_rows`' kinds and params).
QUANTITY_KINDS = np.array([[-1, light_units.ROWS_KIND], [0, light_units.ROWS_KIND], [0, light_units.VALUE_KIND],
                           [1, light_units.VALUE_KIND]], np.int64)
QUANTITY_PARAMS = np.array([[0.0] * 7, [0.0] * 7, [-5.0, 12.0, 1.0, 4.0, -2.0**20, 2.0**20, 0.0],
                            [-np.inf, 8.0, 0.5, 2.0, 0.0, 2.0**20, 1.0]])


def random_pairs(rng: np.random.Generator, max_partitions: int, key_bits: int) -> np.ndarray:
    """Sorted distinct (unit, key) codes: units with 1 to L0 + 3 pairs, some units skipped."""
    units = np.flatnonzero(rng.random(300) < 0.7)
    codes = [unit << key_bits | key for unit in units.tolist()
             for key in sorted(rng.choice(1 << key_bits, min(1 << key_bits, int(rng.integers(1, max_partitions + 4))),
                                          replace=False).tolist())]
    return np.array(codes, dtype=np.int64)


def reference(pair_codes: np.ndarray, key_bits: int, max_partitions: int, weights: np.ndarray,
              partials: np.ndarray) -> Reference:
    """Units per key, each sums row per key (the weights' last), the heavy pairs: Python integers."""
    size = 1 << key_bits
    rows = partials.shape[0] + (1 if weights.size else 0)
    units, sums, heavy = [0] * size, [[0] * size for _ in range(rows)], []
    by_unit: dict[int, list[int]] = {}
    for pair, code in enumerate(pair_codes.tolist()):
        by_unit.setdefault(code >> key_bits, []).append(pair)
    for pairs in by_unit.values():
        if len(pairs) > max_partitions:
            heavy.extend(pairs)
            continue
        for pair in pairs:
            key = int(pair_codes[pair]) & (size - 1)
            units[key] += 1
            for row in range(partials.shape[0]):
                sums[row][key] += int(partials[row, pair])
            if weights.size:
                sums[-1][key] += int(weights[len(pairs) - 1])
    return units, sums, heavy


@pytest.mark.parametrize("weighted", [False, True])
def test_the_loop_compiled_as_python_and_numpys_passes_agree_with_a_reference(weighted: bool) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    compiled = compiled_passes.compiled_passes().result().add_light_units
    for case in range(40):
        max_partitions, key_bits = int(rng.integers(1, 6)), int(rng.integers(3, 12))
        pair_codes = random_pairs(rng, max_partitions, key_bits)
        partials = rng.integers(-2**40, 2**40, (int(rng.integers(0, 3)), pair_codes.size))
        weights = (rng.integers(1, 2**20, min(max_partitions, pair_codes.size)) if weighted
                   else np.zeros(0, np.int64))
        units, sums, heavy = reference(pair_codes, key_bits, max_partitions, weights, partials)
        assert heavy and len(heavy) < pair_codes.size, f"seed={seed} case={case}: light and heavy units both"
        for name, loop in (("compiled", compiled), ("python", light_units.add_light_units)):
            table = np.zeros((1 << key_bits, 1 + len(sums)), np.int64)
            got_heavy = np.empty(pair_codes.size, np.int64)
            found = loop(pair_codes, key_bits, max_partitions, weights, partials, table, got_heavy)
            assert got_heavy[:found].tolist() == heavy, f"seed={seed} case={case}: {name} heavy pairs"
            assert table[:, 0].tolist() == units, f"seed={seed} case={case}: {name} units"
            assert table[:, 1:].T.tolist() == sums, f"seed={seed} case={case}: {name} sums"
        ids = [f"q{row}" for row in range(partials.shape[0])] + ([SELECTION_WEIGHTS] if weighted else [])
        totals = sorted_bounding._Totals.zeros(1 << key_bits, ids)
        found_heavy = totals.add_light_units(pair_codes, key_bits, max_partitions,
                                             {f"q{row}": values for row, values in enumerate(partials)}, weights, None)
        assert found_heavy.tolist() == heavy, f"seed={seed} case={case}: numpy heavy pairs"
        assert totals.units.tolist() == units, f"seed={seed} case={case}: numpy units"
        assert [every_sum(totals.sums[qid]).to_list() for qid in ids] == sums, f"seed={seed} case={case}: numpy sums"


@pytest.mark.parametrize("weighted", [False, True])
def test_the_rows_pass_of_counts_compiled_and_as_python_agrees_with_the_pairs_reference(weighted: bool) -> None:
    """`add_light_rows` from sorted rows without values: each pair's partials are its rows, at
    most m; heavy units' pairs come out as their codes, rows and partials, in order."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    compiled = compiled_passes.compiled_passes().result().add_light_rows
    for case in range(40):
        max_partitions, key_bits = int(rng.integers(1, 6)), int(rng.integers(3, 12))
        max_rows, quantities = int(rng.integers(1, 4)), int(rng.integers(0, 3))
        pair_codes = random_pairs(rng, max_partitions, key_bits)
        rows_per_pair = rng.integers(1, 6, pair_codes.size)
        codes = np.repeat(pair_codes, rows_per_pair)
        partials = np.tile(np.minimum(rows_per_pair, max_rows), (quantities, 1))
        weights = (rng.integers(1, 2**20, max_partitions + 1) if weighted else np.zeros(0, np.int64))
        units, sums, heavy = reference(pair_codes, key_bits, max_partitions, weights, partials)
        assert heavy and len(heavy) < pair_codes.size, f"seed={seed} case={case}: light and heavy units both"
        assert rows_per_pair.max() > max_rows, f"seed={seed} case={case}: some pairs over m rows"
        kinds = np.tile(np.array([-1, light_units.ROWS_KIND], np.int64), (quantities, 1))
        for name, loop in (("compiled", compiled), ("python", light_units.add_light_rows)):
            table = np.zeros((1 << key_bits, 1 + len(sums)), np.int64)
            heavy_codes, heavy_rows = np.empty(codes.size, np.int64), np.empty(codes.size, np.int64)
            heavy_partials = np.empty((quantities, codes.size), np.int64)
            found = loop(codes, codes, key_bits, max_partitions, max_rows, np.zeros((0, codes.size)), kinds,
                         np.zeros((quantities, 7)), weights, table, heavy_codes, heavy_rows, heavy_partials)
            assert heavy_codes[:found].tolist() == pair_codes[heavy].tolist(), f"seed={seed} case={case}: {name} heavy"
            assert heavy_rows[:found].tolist() == rows_per_pair[heavy].tolist(), f"seed={seed} case={case}: {name} rows"
            assert heavy_partials[:, :found].tolist() == partials[:, heavy].tolist(), \
                f"seed={seed} case={case}: {name} heavy partials"
            assert table[:, 0].tolist() == units, f"seed={seed} case={case}: {name} units"
            assert table[:, 1:].T.tolist() == sums, f"seed={seed} case={case}: {name} sums"


@pytest.mark.parametrize("weighted", [False, True])
def test_the_rows_pass_of_values_compiled_and_as_python_agrees_with_the_pairs_passes(weighted: bool) -> None:
    """`add_light_rows` from sorted rows against `pair_units.pair_unit_sums` per pair, the
    partials scaled to m rows' worth (`sorted_bounding._partial`) and the pairs' reference: counts
    of rows and of present values, sums and sums of squares, missing values among them."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    compiled = compiled_passes.compiled_passes().result().add_light_rows
    kinds, params = QUANTITY_KINDS, QUANTITY_PARAMS
    for case in range(40):
        max_partitions, key_bits, max_rows = int(rng.integers(1, 6)), int(rng.integers(3, 12)), int(rng.integers(1, 4))
        pair_codes = random_pairs(rng, max_partitions, key_bits)
        rows_per_pair = rng.integers(1, 7, pair_codes.size)
        codes = np.repeat(pair_codes, rows_per_pair)
        order = rng.permutation(codes.size)
        values = np.round(rng.normal(3, 10, (2, codes.size)), 2)
        values[rng.random(values.shape) < 0.2] = np.nan
        starts = np.concatenate([[0], np.cumsum(rows_per_pair)[:-1]])
        partials = []
        for quantity, (column, kind) in enumerate(kinds.tolist()):
            counted = rows_per_pair if column < 0 else np.add.reduceat(~np.isnan(values[column][order]), starts)
            if kind == light_units.ROWS_KIND:
                partials.append(np.minimum(counted, max_rows))
                continue
            *unit_params, squared = params[quantity].tolist()
            sums = pair_units.pair_unit_sums(values[column], order, starts, *unit_params, bool(squared))
            partials.append(np.where(counted > max_rows, sums * max_rows // np.maximum(counted, 1), sums))
        weights = rng.integers(1, 2**20, max_partitions + 1) if weighted else np.zeros(0, np.int64)
        units, sums_per_key, heavy = reference(pair_codes, key_bits, max_partitions, weights, np.array(partials))
        assert heavy and len(heavy) < pair_codes.size, f"seed={seed} case={case}: light and heavy units both"
        for name, loop in (("compiled", compiled), ("python", light_units.add_light_rows)):
            table = np.zeros((1 << key_bits, 1 + len(sums_per_key)), np.int64)
            heavy_codes, heavy_rows = np.empty(codes.size, np.int64), np.empty(codes.size, np.int64)
            heavy_partials = np.empty((len(kinds), codes.size), np.int64)
            found = loop(codes, order, key_bits, max_partitions, max_rows, values, kinds, params, weights, table,
                         heavy_codes, heavy_rows, heavy_partials)
            assert heavy_codes[:found].tolist() == pair_codes[heavy].tolist(), f"seed={seed} case={case}: {name} heavy"
            assert heavy_rows[:found].tolist() == rows_per_pair[heavy].tolist(), f"seed={seed} case={case}: {name} rows"
            assert heavy_partials[:, :found].tolist() == np.array(partials)[:, heavy].tolist(), \
                f"seed={seed} case={case}: {name} heavy partials"
            assert table[:, 0].tolist() == units, f"seed={seed} case={case}: {name} units"
            assert table[:, 1:].T.tolist() == sums_per_key, f"seed={seed} case={case}: {name} sums"


def shuffled_within_units(rng: np.random.Generator, codes: np.ndarray, key_bits: int) -> np.ndarray:
    """Sorted rows' codes with each unit's rows in a random order: in unit order, not sorted."""
    units = codes >> key_bits
    return codes[np.lexsort((rng.random(codes.size), units))]


@pytest.mark.parametrize("weighted", [False, True])
def test_the_runs_pass_compiled_and_as_python_agrees_with_the_sorted_rows_pass(weighted: bool) -> None:
    """`add_light_runs` on rows in unit order, each unit's rows shuffled, against `add_light_rows`
    on the same rows sorted: the same totals; the heavy units' rows' places, which sorted give
    the same heavy pairs; rows out of unit order are refused, the table untouched."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    passes = compiled_passes.compiled_passes().result()
    kinds, params = QUANTITY_KINDS, QUANTITY_PARAMS
    for case in range(40):
        max_partitions, key_bits, max_rows = int(rng.integers(1, 6)), int(rng.integers(3, 12)), int(rng.integers(1, 4))
        quantities = int(rng.integers(0, kinds.shape[0] + 1))
        pair_codes = random_pairs(rng, max_partitions, key_bits)
        codes = shuffled_within_units(rng, np.repeat(pair_codes, rng.integers(1, 7, pair_codes.size)), key_bits)
        values = np.round(rng.normal(3, 10, (2, codes.size)), 2)
        values[rng.random(values.shape) < 0.2] = np.nan
        weights = rng.integers(1, 2**20, max_partitions + 1) if weighted else np.zeros(0, np.int64)
        columns = 1 + quantities + (1 if weighted else 0)

        def rows_pass(rows: np.ndarray, table: np.ndarray) -> tuple[list[int], list[int], list[list[int]]]:
            order = rows[np.argsort(codes[rows], kind="stable")]
            heavy_codes, heavy_rows = np.empty(rows.size, np.int64), np.empty(rows.size, np.int64)
            heavy_partials = np.empty((quantities, rows.size), np.int64)
            found = passes.add_light_rows(codes[order], order, key_bits, max_partitions, max_rows, values,
                                          kinds[:quantities], params[:quantities], weights, table, heavy_codes,
                                          heavy_rows, heavy_partials)
            return heavy_codes[:found].tolist(), heavy_rows[:found].tolist(), heavy_partials[:, :found].tolist()

        expected_table = np.zeros((1 << key_bits, columns), np.int64)
        expected_heavy = rows_pass(np.arange(codes.size), expected_table)
        per_unit = {int(unit): len(np.unique(codes[codes >> key_bits == unit])) for unit in np.unique(codes >> key_bits)}
        heavy_places = [place for place, code in enumerate(codes.tolist()) if per_unit[code >> key_bits] > max_partitions]
        assert heavy_places and len(heavy_places) < codes.size, f"seed={seed} case={case}: light and heavy units both"
        for name, loop in (("compiled", passes.add_light_runs), ("python", light_units.add_light_runs)):
            table = np.zeros_like(expected_table)
            places = np.empty(codes.size, np.int64)
            found = loop(codes, key_bits, max_partitions, max_rows, values, kinds[:quantities], params[:quantities],
                         weights, table, places)
            assert places[:found].tolist() == heavy_places, f"seed={seed} case={case}: {name} heavy rows"
            assert rows_pass(places[:found], table) == expected_heavy, f"seed={seed} case={case}: {name} heavy pairs"
            assert table.tolist() == expected_table.tolist(), f"seed={seed} case={case}: {name} totals"
            swapped = codes.copy()
            last = np.flatnonzero(codes >> key_bits != codes[-1] >> key_bits)[-1]
            swapped[[last, -1]] = swapped[[-1, last]]
            untouched = np.zeros_like(expected_table)
            assert loop(swapped, key_bits, max_partitions, max_rows, values, kinds[:quantities], params[:quantities],
                        weights, untouched, places) == -1, f"seed={seed} case={case}: {name} took rows out of order"
            assert not untouched.any(), f"seed={seed} case={case}: {name} added rows out of order"


@pytest.mark.parametrize("compiled", [False, True])
def test_light_sums_stay_exact_past_int64(compiled: bool) -> None:
    """Partials whose sums pass 2^63 (carried into Int128 before the loop adds) and one
    quantity whose single shard could pass it (added exactly apart), with heavy units among them."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    loop = compiled_passes.compiled_passes().result().add_light_units if compiled else None
    key_bits, max_partitions = 2, 2
    totals = sorted_bounding._Totals.zeros(1 << key_bits, ["big", "huge"])
    expected: list[list[int]] = [[0] * 4, [0] * 4]
    for step in range(40):
        pair_codes = random_pairs(rng, max_partitions, key_bits)
        partials = {"big": rng.integers(2**55, 2**56, pair_codes.size),
                    "huge": rng.integers(-2**62, 2**62, pair_codes.size)}
        _, sums, heavy = reference(pair_codes, key_bits, max_partitions, np.zeros(0, np.int64),
                                   np.stack(list(partials.values())))
        for row in range(2):
            expected[row] = [a + b for a, b in zip(expected[row], sums[row], strict=True)]
        found = totals.add_light_units(pair_codes, key_bits, max_partitions, partials, np.zeros(0, np.int64), loop)
        assert found.tolist() == heavy, f"seed={seed} step={step}: heavy pairs"
    assert min(expected[0]) > 2**64, f"seed={seed}: the sums must pass int64 for the test to mean anything"
    assert every_sum(totals.sums["big"]).to_list() == expected[0], f"seed={seed}: sums carried into Int128"
    assert every_sum(totals.sums["huge"]).to_list() == expected[1], f"seed={seed}: sums added apart"


PROBE = """
import sys
from dprun.cli import main
try:
    main(sys.argv[1:])
except SystemExit as stop:
    print(stop.code, 'numba' in sys.modules, file=sys.__stdout__)
"""


@pytest.mark.usefixtures("no_ambient_ledger")
def test_a_small_input_never_imports_numba(tmp_path: Path) -> None:
    """Its import and code generator cost 0.4 s, more than numpy's passes over a small input."""
    folder = example_copy(tmp_path)
    done = subprocess.run([sys.executable, "-c", PROBE, "run", "specs/restaurants_private.yaml"], capture_output=True,
                          text=True, cwd=folder, timeout=300, env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert done.stdout.splitlines()[-1].split() == ["0", "False"], done.stdout + done.stderr
