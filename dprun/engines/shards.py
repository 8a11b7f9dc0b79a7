"""Shards of whole privacy units: how a query's rows are split so that each unit's rows are
sorted together in memory (`dprun.engines.sorted_bounding`), and the worker threads that
bound the shards.

Rows go to shards by a keyed hash of their unit (or a secret bijection of its range code,
`UnitMix`) through Polars' partitioned sink into scratch Arrow files; rows of packed codes
alone are gathered in memory as they stream past instead (`scattered_shards`). Where a Parquet
input's footers show its row groups in order of an integer unit, shards are runs of row
groups instead, each read by its worker: nothing is written, and reading overlaps bounding
(`unit_ordered_shards`). Shards only gather a unit's rows; they never decide what counts,
so no released number depends on them.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import pairwise
from functools import partial
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from dprun.engines.codes import (KEY, PACKED, PACKED_BITS, UNIT, UNIT_HASH, Codes, Digit, RangeCodes, ShardUnits,
                                  TableKeys, footer_range, shard_unit_codes)
from dprun.engines import compiled, shard_scatter
from dprun.engines.key_hashes import KEY_HASH, KeyHashes
from dprun.engines.polars_steps import batches, collect, scratch_failure, sink, statistics_mismatch

if TYPE_CHECKING:
    from dprun.engines.compiled import UnitPasses

SHARD = "__dprun_shard__"
MIXED = "__dprun_mixed__"
R = TypeVar("R")
A = TypeVar("A")
# Rows sorted in memory at once: ~8 bytes per row and per value column. A shard's arrays
# (16 MB per column) stay below glibc's mmap threshold (`keep_freed_memory`), so they are
# reused from the heap: at 2^22 rows half the shards' arrays were mapped afresh, page by
# page, and the bounding spent twice the kernel time.
SHARD_ROWS = 2**21
# Shards bounded at once (`in_parallel_into`): one per Polars thread, as many as the cores the
# process may use (each holds about 100 MB at SHARD_ROWS: memory grows with the cores, as
# Polars' own buffers do), at least 2 so that one shard is bounded while another is read.
WORKERS = max(2, pl.thread_pool_size())
# Rows a batch of the streaming engine brings to `scattered_shards`: 2^18 took 1.29 s for the
# benchmark's 10^8 shuffled rows, its default (10^5) 1.50, 2^20 1.47.
SCATTER_BATCH_ROWS = 2**18
# Rows of a shard at the least where the rows are split anyway, so that each worker gets one (`shard_count`).
MIN_SHARD_ROWS = 2**18


def packed_rows(loaded: Shard, codes: Codes, seed: int, unit_passes: Future[UnitPasses] | None
                ) -> tuple[pl.DataFrame, Callable[[np.ndarray], pl.DataFrame]]:
    """The shard's rows with their packed codes, and how to find the values of a unit from its
    code there. `unit_passes`: the compiled passes of units coded per shard, where the
    bounding loads them (waited for only by shards that code their units)."""
    units = codes.units
    shard = loaded.load()
    mix = loaded.mix
    if isinstance(units, RangeCodes):
        if mix is None:
            first = loaded.first_unit
            return shard, units.values if first == 0 else lambda within: units.values(within + first)
        shard = shard.with_columns(pl.col(PACKED) - mix.first(loaded.index) * (1 << codes.key_bits))
        return shard, lambda within: units.values(mix.unit_codes(loaded.index, within))
    passes = unit_passes.result() if unit_passes is not None else None
    unit_codes = shard_unit_codes(shard, units, PACKED_BITS - codes.key_bits, seed, passes)
    if loaded.key_hashes is None:
        key_codes = shard[KEY]
    else:
        assert passes is not None, "keys are found by hash where the compiled passes are loaded"
        key_codes = loaded.key_hashes.codes(shard[KEY_HASH], passes)
    # Packed beside the shard's other columns, not among them: a shard with text columns costs
    # twice as much per step that adds a column (2^21 rows: 17.8 → 8.7 ms).
    packed = pl.DataFrame([unit_codes, key_codes]).select(codes.packed(pl.col(UNIT))).to_series()
    shard = shard.with_columns(unit_codes, packed)
    return shard, partial(_unit_values, shard[[UNIT, *units.columns]])


def _unit_values(shard_units: pl.DataFrame, codes: np.ndarray) -> pl.DataFrame:
    """The values of the units with these codes (of a shard's (UNIT, unit columns)), in the order given.

    From a row of each unit, whichever (a unit's rows all hold its values): where the shard's
    codes are in order (a span of units that come together), found by a binary search and
    checked to hold the codes asked for; else, where its codes are dense (`shard_unit_codes`
    numbers its units 0, 1, … where the compiled passes are loaded), by one scatter of the
    rows' places; else by a search of the shard's codes (a filter, unique and join: 25 ms of a
    text span's 2^21 rows, the binary search a fraction of 1)."""
    unit_codes = shard_units[UNIT].to_numpy()
    if unit_codes.size == 0:
        return shard_units.drop(UNIT).clear(codes.size)
    rows = np.minimum(np.searchsorted(unit_codes, codes), unit_codes.size - 1)
    if not np.array_equal(unit_codes[rows], codes):
        if int(unit_codes.max()) >= 2 * unit_codes.size:
            found = shard_units.filter(pl.col(UNIT).is_in(pl.Series(_distinct(codes)).implode())).unique(UNIT)
            return pl.DataFrame({UNIT: codes}).join(found, on=UNIT, how="left", maintain_order="left").drop(UNIT)
        row_of_unit = np.empty(int(unit_codes.max()) + 1, np.int64)
        row_of_unit[unit_codes] = np.arange(unit_codes.size)
        rows = row_of_unit[codes]
    return shard_units.drop(UNIT)[rows]


def _packed_frame(rows: pl.LazyFrame, codes: Codes, mix: UnitMix | None, extra: Sequence[str | pl.Expr],
                  key_hashes: KeyHashes | None) -> pl.LazyFrame:
    """The rows as they go to the shards: packed codes (or the unit columns and the key code,
    or the key hash where `key_hashes` finds the codes, packed per shard), with their shard
    where `mix` says it, then `extra` columns."""
    keyed = codes.keys.attach(rows) if key_hashes is None else rows.with_columns(key_hashes.expr())
    if isinstance(codes.units, RangeCodes):
        if mix is None:
            return keyed.select(codes.packed(codes.units.code()), *extra)
        return keyed.with_columns(mix.mixed(codes.units.code())).select(
            codes.packed(pl.col(MIXED)), mix.shard(pl.col(MIXED)), *extra)
    key = KEY if key_hashes is None else KEY_HASH
    return keyed.select(*dict.fromkeys([*codes.units.columns, key, *(c for c in extra if isinstance(c, str))]),
                        *(c for c in extra if not isinstance(c, str)))


@dataclass(frozen=True)
class Shard:
    """A shard: how to load its rows, its number, and the mix its range-coded units went through
    (if any) or, for a run of row groups, the unit code its own codes start from and whether
    the footers put its rows in unit order (the bounding checks the rows); the key hashes its
    rows' key codes are found by, where they carry hashes instead of codes."""

    load: Callable[[], pl.DataFrame]
    index: int = 0
    mix: UnitMix | None = None
    first_unit: int = 0
    in_unit_order: bool = False
    key_hashes: KeyHashes | None = None


@dataclass(frozen=True)
class InputSlices:
    """A query whose every row comes from one row of its Parquet `paths` on its own (it joins
    nothing and cuts no unit's rows), so that `rows_of(files, offset, length)` is the query's
    rows from that slice of the rows of some of its files; `in_order`: in the files' order
    (not where they are matched against public partitions, a join that may reorder them)."""

    paths: tuple[Path, ...]
    rows_of: Callable[[tuple[Path, ...], int, int], pl.LazyFrame]
    in_order: bool = True


@dataclass(frozen=True)
class UnitMix:
    """Range-coded units spread over `count` shards by a secret bijection of their codes.

    A unit code u below 2^bits is mixed into m, below 2^bits too (multiplied by an odd number,
    its top half xored into its bottom half, multiplied again, all mod 2^bits: each step a
    bijection, as in the finalizers of MurmurHash); its shard is m's top part ⌊m · count /
    2^bits⌋, and within its shard it is coded m less the shard's first m: log2(count) bits
    fewer than u, so that a shard's codes and row places fit one Int64 for numpy to sort
    (`_sorted_with_places`). The multipliers come from the run's secret; the mix spreads ids
    with a common stride (all even, all multiples of 1,000) over every shard. Shards only
    gather a unit's rows, they never decide what counts.
    """

    bits: int
    multipliers: tuple[int, int]
    count: int

    @classmethod
    def of(cls, units: RangeCodes, count: int, seed: int) -> UnitMix | None:
        """The mix of these units over `count` shards; None where u · multiplier could pass Int64."""
        bits = max(1, units.bits)
        if bits > 31:
            return None
        # Odd, with the top bit set: the product wraps for every unit code but 0 and 1.
        first, second = (part % (1 << bits) | 1 | 1 << (bits - 1) for part in (seed, seed >> 32))
        return cls(bits, (first, second), count)

    def mixed(self, unit_code: pl.Expr) -> pl.Expr:
        """m, the mixed code of each row's unit (`MIXED`)."""
        mask = (1 << self.bits) - 1
        mixed = unit_code * self.multipliers[0] & mask
        return ((mixed ^ mixed // self._half) * self.multipliers[1] & mask).alias(MIXED)

    def shard(self, mixed: pl.Expr) -> pl.Expr:
        """Each row's shard; a row outside the ranges (a null code) goes to the first, whose sort then fails the run."""
        return (mixed * self.count // (1 << self.bits)).fill_null(0).alias(SHARD)

    def first(self, shard: int) -> int:
        """The first mixed code of a shard: ⌈shard · 2^bits / count⌉."""
        return (shard * (1 << self.bits) + self.count - 1) // self.count

    def unit_codes(self, shard: int, within: np.ndarray) -> np.ndarray:
        """The query's unit codes of codes within a shard."""
        below = 1 << self.bits
        first, second = (pow(m, -1, below) for m in self.multipliers)
        mixed = (within + self.first(shard)) * second % below
        # x ^ (x >> h) is its own inverse when 2h ≥ bits: the bits shifted in come from the half it leaves alone.
        return (mixed ^ mixed // self._half) * first % below

    @property
    def _half(self) -> int:
        return 1 << (self.bits + 1) // 2


def split_into_shards(rows: pl.LazyFrame, codes: Codes, seed: int, workdir: Path, extra: Sequence[str | pl.Expr],
                      slices: InputSlices | None = None, compiled: bool = False) -> list[Shard]:
    """The packed rows, with `extra` columns, in shards of whole units, each small enough to sort
    in memory: runs of row groups where `slices` reads an input whose footers show them in
    order of its unit, or, for units coded per shard, whose row groups each hold their units'
    rows whole (`clustered_shards`: bounding them raises `UnitsNotClustered` where one does
    not), else by a hash of the unit. `compiled`: the shards are bounded by the compiled
    passes, so where units are coded per shard, a table's keys are found there too, by their
    hashes (`KeyHashes`), and rows of range-coded units without `extra` columns are gathered
    into shards by a compiled pass too (`scattered_shards`)."""
    count = shard_count(codes.rows)
    if count > 1 and slices is not None and (ordered := unit_ordered_shards(slices, codes, extra)) is not None:
        return ordered
    # A shard of codes alone is sorted as it is (`_pair_sums`): mixing units would only cost time.
    mix = UnitMix.of(codes.units, count, seed) if isinstance(codes.units, RangeCodes) and extra and count > 1 else None
    key_hashes = (KeyHashes.of(codes.keys.table, dict(rows.collect_schema()), seed)
                  if compiled and isinstance(codes.units, ShardUnits) and isinstance(codes.keys, TableKeys) else None)
    if count > 1 and compiled and slices is not None and (
            clustered := clustered_shards(slices, codes, seed, extra, key_hashes)) is not None:
        return clustered
    frame = _packed_frame(rows, codes, mix, extra, key_hashes)
    if count == 1:
        return [Shard(lambda: collect(frame), key_hashes=key_hashes)]
    if compiled and isinstance(codes.units, RangeCodes) and not extra:
        return scattered_shards(frame, codes.key_bits, count, seed, workdir)
    files = _ShardFiles(workdir / "packed")
    if mix is None:
        unit = pl.col(PACKED) // (1 << codes.key_bits) if isinstance(codes.units, RangeCodes) else pl.struct(
            list(codes.units.columns))
        frame = frame.with_columns((unit.hash(seed) % count).alias(SHARD))
    try:
        sink(frame, pl.PartitionBy(str(files.folder), key=SHARD, include_key=False, file_path_provider=files.create),
             workdir, arrow=True)
    finally:
        files.close()
    return [Shard(partial(_load, paths), shard, mix, key_hashes=key_hashes) for shard, paths in files.paths()]


def scattered_shards(frame: pl.LazyFrame, key_bits: int, count: int, seed: int, workdir: Path) -> list[Shard]:
    """Packed codes alone gathered into `count` shards of whole units in memory as the rows
    stream past (`shard_scatter`), each batch by one of WORKERS threads, so that reading
    never waits for them. Batches read before the compiled pass is loaded wait for it, and
    while those in wait and the rows held pass HELD_BYTES, reading waits for the oldest."""
    group = compiled.compiled_scatter()
    first, second = shard_scatter.multipliers(seed)
    try:
        held = shard_scatter.HeldShards(count, workdir / "held")
        _gather_into(held, frame, group, key_bits, first, second)
    except OSError as exc:
        # Reading failures come as DataError (`batches`): this is a write of the held rows.
        raise scratch_failure(exc.strerror or type(exc).__name__, workdir) from None
    return [Shard(partial(_held_shard, held, shard), shard) for shard in held.with_rows()]


def _gather_into(held: shard_scatter.HeldShards, frame: pl.LazyFrame, group: Future[compiled.GroupByShard],
                 key_bits: int, first: int, second: int) -> None:
    """`scattered_shards`' loop: each batch gathered into `held` by a pool of WORKERS threads."""
    count = len(held.parts)

    def gather(codes: np.ndarray) -> None:
        grouped = np.empty_like(codes)
        bounds = np.empty(count + 1, np.int64)
        group.result()(codes, key_bits, first, second, count, grouped, bounds)
        held.add(grouped, bounds)

    pool = ThreadPoolExecutor(max_workers=WORKERS)
    waiting: deque[tuple[Future[None], int]] = deque()
    in_wait = 0
    try:
        for batch in batches(frame, SCATTER_BATCH_ROWS):
            column = batch.to_series()
            if column.null_count():
                raise statistics_mismatch()
            codes = column.to_numpy()
            waiting.append((pool.submit(gather, codes), codes.nbytes))
            in_wait += codes.nbytes
            while waiting and (waiting[0][0].done() or held.held + in_wait > shard_scatter.HELD_BYTES):
                gathered, size = waiting.popleft()
                gathered.result()
                in_wait -= size
        for gathered, _ in waiting:
            gathered.result()
    finally:
        pool.shutdown(cancel_futures=True)


def _held_shard(held: shard_scatter.HeldShards, shard: int) -> pl.DataFrame:
    return pl.DataFrame({PACKED: held.load(shard)})


def shard_count(rows: int) -> int:
    """Shards of at most SHARD_ROWS rows; where that makes several, at least one per worker while
    they keep MIN_SHARD_ROWS rows (10^7 rows in 5 shards would leave 11 of 16 cores idle).

    Rows that fit one shard stay one: it is collected in memory, without the partitioned sink."""
    count = max(1, math.ceil(rows / SHARD_ROWS))
    if count == 1:
        return 1
    return max(count, min(WORKERS, rows // MIN_SHARD_ROWS))


@dataclass(frozen=True)
class _Span:
    """Consecutive rows of the input, from row `offset` of file `first` on, `rows` of them up to
    file `last` (the input's files by index), whose units the footers put in `low` .. `high`."""

    first: int
    last: int
    offset: int
    rows: int
    low: int
    high: int


def unit_ordered_shards(slices: InputSlices, codes: Codes, extra: Sequence[str | pl.Expr]) -> list[Shard] | None:
    """Shards of consecutive row groups, each read by the worker that bounds it, where the
    footers give every row group the range of an integer unit and each group's largest unit is
    at most the next one's smallest; None otherwise.

    Files written by user (exports, a sort before the write) have their row groups in that
    order. The footers only choose the shards: each row's unit is checked to lie in its
    shard's range (a row outside fails the run), so each unit is in one shard whatever the
    footers say. A unit that is the last of one shard and the first of the next has its rows
    taken out of both and bounded in one more shard (`_SplitUnits`).
    """
    units = codes.units
    if not isinstance(units, RangeCodes) or len(units.digits) != 1:
        return None
    digit = units.digits[0]
    groups = _row_groups_in_unit_order(slices.paths, digit.column)
    if groups is None:
        return None
    spans = _spans(groups)
    # Row groups too large for as many shards as the hash gives (a writer's 128 MB row groups
    # of a few narrow columns, one row group in all) would leave workers idle and fill memory.
    if len(spans) < shard_count(sum(span.rows for span in spans)) or any(
            (span.high - span.low).bit_length() + codes.key_bits > PACKED_BITS for span in spans):
        return None
    splits = [left.high == right.low for left, right in pairwise(spans)]
    split_units = _SplitUnits(len(spans)) if any(splits) else None
    edges = zip([False, *splits], [*splits, False], strict=True)
    shards = [Shard(partial(_load_span, slices, codes, extra, span, edge, split_units), index,
                    first_unit=span.low - digit.minimum, in_unit_order=True)
              for index, (span, edge) in enumerate(zip(spans, edges, strict=True))]
    return shards if split_units is None else [*shards, Shard(split_units.load, len(shards))]


class UnitsNotClustered(Exception):
    """A unit's rows were found in two of the row-group spans `clustered_shards` made: the
    shards' totals must be thrown away and the rows shard by hash instead."""


def clustered_shards(slices: InputSlices, codes: Codes, seed: int, extra: Sequence[str | pl.Expr],
                     key_hashes: KeyHashes | None) -> list[Shard] | None:
    """Shards of consecutive row groups, each read by the worker that bounds it, for units
    coded per shard (text ids, …), where the input holds each unit's rows together (a file
    exported unit by unit); None where it cannot be one (too few row groups), a sample of its
    row groups shares a unit, or the rows may not come in the files' order (public partitions
    joined, or keys coded by joining their table: `TableKeys.attach`).

    No footer says that rows are clustered (text ids sorted as numbers overlap as text), so
    the bounding checks it (also where the sample suggests more units than MAX_KEPT_UNITS / 2,
    the rows go by hash): each span's first and last units (those that may go on in the
    next or the previous span) are taken out, with every row of theirs in the span, and
    bounded together in one more shard, the last; every other unit's keyed 64-bit hash is
    kept, and that shard's load checks that no hash is kept by two spans or is also one of
    its own units' (`_SplitUnits`). A unit in two places has the same hash in both, so the
    check misses none; two units sharing a hash only cost a fallback. Where it fails,
    bounding raises `UnitsNotClustered` and the caller shards the rows by hash. Dense unit
    codes come in the order the units first come (`distinct_codes`), so a span's rows are
    in unit order and the bounding checks them as such (`Shard.in_unit_order`).
    """
    units = codes.units
    # A span's first and last units are its first and last rows': the rows must come in order.
    in_order = slices.in_order and (key_hashes is not None or isinstance(codes.keys, RangeCodes))
    groups = _row_groups(slices.paths, None) if isinstance(units, ShardUnits) and in_order else None
    if groups is None:
        return None
    assert isinstance(units, ShardUnits)
    spans = _spans(groups)
    # Each row's keyed 64-bit hash of its unit's values.
    unit_hash = units.value().hash(seed)
    rows = sum(span.rows for span in spans)
    if len(spans) < shard_count(rows):
        return None
    density = _sampled_unit_density(slices, groups, unit_hash)
    # The check keeps 8 bytes a unit: far fewer than MAX_KEPT_UNITS expected, or the rows go by hash.
    if density is None or density * rows > MAX_KEPT_UNITS // 2:
        return None
    split_units = _SplitUnits(len(spans), checks=True)
    shards = [Shard(partial(_load_clustered_span, slices, codes, extra, key_hashes, span, unit_hash, split_units),
                    index, in_unit_order=True, key_hashes=key_hashes) for index, span in enumerate(spans)]
    return [*shards, Shard(split_units.load, len(shards), key_hashes=key_hashes)]


# Row groups `_sampled_unit_density` reads, spread over the input.
SAMPLED_GROUPS = 4
# Units whose hashes `clustered_shards`' check keeps at most (8 bytes each, and as much again
# while it sorts them); past them, bounding raises `UnitsNotClustered` and the rows go by hash.
MAX_KEPT_UNITS = 2**25


def _sampled_unit_density(slices: InputSlices, groups: list[_Span], unit_hash: pl.Expr) -> float | None:
    """Inner units (all but a group's first and last) per row in SAMPLED_GROUPS row groups spread
    over the input; None where two of them share one: an input in any other order (shuffled,
    or listed day by day) shares thousands, and is sharded by hash at once instead of bounded twice."""
    picked = sorted({round(i * (len(groups) - 1) / (SAMPLED_GROUPS - 1)) for i in range(SAMPLED_GROUPS)})
    inner = []
    for group in (groups[i] for i in picked):
        rows = slices.rows_of(slices.paths[group.first:group.last + 1], group.offset, group.rows)
        inner.append(_inner_hashes(collect(rows.select(unit_hash)).to_series().to_numpy()))
    if not _all_distinct(inner):
        return None
    return sum(part.size for part in inner) / max(1, sum(groups[i].rows for i in picked))


def _inner_hashes(hashes: np.ndarray) -> np.ndarray:
    """The distinct hashes of a run of rows other than its first and last rows' (the units that
    may go on beyond it)."""
    return _distinct(hashes[~_at_ends(hashes)])


def _at_ends(hashes: np.ndarray) -> np.ndarray:
    """The rows whose hash is the first or the last row's."""
    return (hashes == hashes[0]) | (hashes == hashes[-1]) if hashes.size else np.zeros(0, bool)


# Hashes `_all_distinct` sorts at a time, about: a range of them that stays in the caches.
DISTINCT_CHECK_BATCH = 2**15


def _all_distinct(parts: list[np.ndarray]) -> bool:
    """Whether no hash is in two of these sorted arrays of distinct hashes (uint64).

    Range by range of values (each part's share of a range found by a binary search, without a
    copy): the check of a text input's 10^7 units sorts ranges of ~40,000 hashes, which stay
    in the caches, instead of all of them at once (279 → 109 ms)."""
    total = sum(part.size for part in parts)
    bits = min(8, max(0, (total // DISTINCT_CHECK_BATCH).bit_length() - 1))
    edges = np.arange(1, 1 << bits, dtype=np.uint64) << np.uint64(64 - bits) if bits else np.zeros(0, np.uint64)
    cuts = [np.concatenate([[0], np.searchsorted(part, edges), [part.size]]) for part in parts]
    for bucket in range(1 << bits):
        in_range = [part[cut[bucket]:cut[bucket + 1]] for part, cut in zip(parts, cuts, strict=True)]
        joined = np.sort(np.concatenate(in_range or [np.zeros(0, np.uint64)]))
        if np.any(joined[1:] == joined[:-1]):
            return False
    return True


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted, by numpy's sort: np.unique takes a hash table since numpy
    2.3, 60 ms for 200,000 codes and 1.6–2 s for 2^21 hashes on the benchmark machine,
    against 3 and 23 ms. Repeats in a row are dropped first: where units come together, so
    do their hashes, and a text span's 2^21 hashes leave a tenth as many to sort (33 → 8 ms)."""
    ordered = np.sort(values[_run_starts(values)])
    return ordered[_run_starts(ordered)]


def _run_starts(values: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts."""
    starts = np.empty(values.size, bool)
    if values.size:
        starts[0] = True
        np.not_equal(values[1:], values[:-1], out=starts[1:])
    return starts


def _load_clustered_span(slices: InputSlices, codes: Codes, extra: Sequence[str | pl.Expr],
                         key_hashes: KeyHashes | None, span: _Span, unit_hash: pl.Expr, split_units: _SplitUnits
                         ) -> pl.DataFrame:
    """A span's rows as they go to a shard of units coded per shard, but for its first and last
    units' rows (every row with the hash of either), which go to `split_units` with the
    hashes of the others."""
    taken: pl.DataFrame | None = None
    inner: np.ndarray | None = None
    try:
        rows = slices.rows_of(slices.paths[span.first:span.last + 1], span.offset, span.rows)
        # In one chunk per column: Polars' eager steps on a frame of the streaming engine's
        # chunks copy it into one each time (the steps to the unit codes: 39 → 31 ms a text span).
        loaded = collect(_packed_frame(rows, codes, None, extra, key_hashes)).rechunk()
        hashes = loaded.select(unit_hash).to_series().to_numpy()
        # Kept for the unit codes (`shard_unit_codes`), which would hash the units again.
        loaded = loaded.with_columns(pl.Series(UNIT_HASH, hashes))
        at_ends = _at_ends(hashes)
        taken = loaded.filter(at_ends)
        inner = _distinct(hashes[~at_ends])
        return loaded.filter(~at_ends)
    finally:
        split_units.add(taken, inner)


def _row_groups_in_unit_order(paths: tuple[Path, ...], column: str) -> list[_Span] | None:
    """Each non-empty row group of the files, in order, with its range of `column`, where
    every footer has an integer range for it and each group's range ends at or before the next begins."""
    groups = _row_groups(paths, column)
    return groups if groups is not None and all(left.high <= right.low for left, right in pairwise(groups)) else None


def _row_groups(paths: tuple[Path, ...], column: str | None) -> list[_Span] | None:
    """Each non-empty row group of the files, in order, with its footer's range of `column`
    (0 .. 0 without one); None where a footer cannot be read, or has no integer range for `column`."""
    groups: list[_Span] = []
    try:
        for file, path in enumerate(paths):
            offset = 0
            metadata = pq.ParquetFile(path).metadata
            names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
            if column is not None and column not in names:
                return None
            for group in (metadata.row_group(i) for i in range(metadata.num_row_groups)):
                if group.num_rows:
                    group_range = (0, 0) if column is None else _integer_range(group.column(names.index(column)))
                    if group_range is None:
                        return None
                    groups.append(_Span(file, file, offset, group.num_rows, *group_range))
                offset += group.num_rows
    except (OSError, pa.ArrowException):
        return None  # the hash path reads the files and names the problem
    return groups or None


def _integer_range(chunk: pq.ColumnChunkMetaData) -> tuple[int, int] | None:
    """A row group's footer range of an integer column; None for another type or no range."""
    stats = chunk.statistics
    found = footer_range(stats)
    return found if found is not None and stats.physical_type in ("INT32", "INT64") else None


def _spans(groups: list[_Span]) -> list[_Span]:
    """Runs of consecutive row groups of at most SHARD_ROWS rows, or fewer where that leaves a
    worker without a shard, as in `shard_count`; a row group larger than that is a shard of its own."""
    total = sum(group.rows for group in groups)
    target = min(SHARD_ROWS, max(MIN_SHARD_ROWS, math.ceil(total / WORKERS)))
    spans = [groups[0]]
    for group in groups[1:]:
        last = spans[-1]
        if last.rows + group.rows <= target:
            spans[-1] = _Span(last.first, group.last, last.offset, last.rows + group.rows, last.low, group.high)
        else:
            spans.append(group)
    return spans


def _load_span(slices: InputSlices, codes: Codes, extra: Sequence[str | pl.Expr], span: _Span,
               split: tuple[bool, bool], split_units: _SplitUnits | None) -> pl.DataFrame:
    """A span's rows with their packed codes, the unit coded from the span's smallest unit;
    where its first or last unit is split with a neighbour, that unit's rows go to `split_units`
    (coded as the query codes it) instead. A unit outside the span gets a null code."""
    assert isinstance(codes.units, RangeCodes)
    digit = codes.units.digits[0]
    local = RangeCodes((replace(digit, minimum=span.low, span=span.high - span.low + 1),))
    # Only the span's own files: Polars reads the footers of every file before a slice's first row.
    rows = slices.rows_of(slices.paths[span.first:span.last + 1], span.offset, span.rows)
    frame = codes.keys.attach(rows).select(codes.packed(local.code()), *extra)
    if split_units is None:
        return collect(frame)
    taken: pl.DataFrame | None = None
    try:
        loaded = collect(frame)
        first, last = split
        if not (first or last):
            taken = loaded.clear()
            return loaded
        # Unit 0 and the span's last unit, by comparing packed codes (a division per row cost three times as much).
        is_split = (pl.lit(first) & (pl.col(PACKED) < 1 << codes.key_bits)
                    | pl.lit(last) & (pl.col(PACKED) >= (span.high - span.low) << codes.key_bits)).fill_null(False)
        mask = loaded.select(is_split).to_series()
        taken = loaded.filter(mask).with_columns(pl.col(PACKED) + (span.low - digit.minimum) * (1 << codes.key_bits))
        return loaded.filter(~mask)
    finally:
        split_units.add(taken)


class _SplitUnits:
    """The rows of units split between two shards' row groups, taken out of those shards as they
    load (`add`), then bounded as one more shard, the last. Where it `checks` (`clustered_shards`),
    each shard also gives the hashes of the units it kept, and the load checks that no unit is
    in two places (the rows' own hashes are their UNIT_HASH).

    Its load waits until every other shard has loaded or failed: `in_parallel_into` starts
    tasks in order, so when the last one starts every other one has started on another worker.
    """

    def __init__(self, shards: int, checks: bool = False) -> None:
        self._parts: list[pl.DataFrame] = []
        self._kept: list[np.ndarray] = []
        self._kept_units = 0
        self._checks = checks
        self._waiting = shards
        self._failed = False
        self._lock = threading.Lock()
        self._loaded = threading.Event()

    def add(self, part: pl.DataFrame | None, kept: np.ndarray | None = None) -> None:
        """A shard's split units' rows, and the distinct hashes of the units it kept where the
        check needs them; None where the shard failed to load."""
        with self._lock:
            if part is None:
                self._failed = True
            else:
                self._parts.append(part)
                if kept is not None:
                    self._keep(kept)
            self._waiting -= 1
            if self._waiting == 0:
                self._loaded.set()

    def _keep(self, kept: np.ndarray) -> None:
        """Keep a shard's units' hashes for the check, up to MAX_KEPT_UNITS in all: past them,
        none (the load then fails the check), so that memory stays bounded."""
        self._kept_units += kept.size
        if self._kept_units <= MAX_KEPT_UNITS:
            self._kept.append(kept)
        else:
            self._kept.clear()

    def load(self) -> pl.DataFrame:
        self._loaded.wait()
        # A failed shard's own error ends the run: `in_parallel_into` reports results in order.
        assert not self._failed, "a shard failed before the split units were gathered"
        gathered = pl.concat(self._parts)
        if self._checks:
            own = _distinct(gathered[UNIT_HASH].to_numpy())
            distinct = self._kept_units <= MAX_KEPT_UNITS and _all_distinct([own, *self._kept])
            self._kept.clear()
            if not distinct:
                raise UnitsNotClustered
        return gathered


class _ShardFiles:
    """The files Polars' partitioned sink writes, opened here rather than by Polars.

    Polars opens a file it is given by path twice, with O_TRUNC, so the second open
    truncates the empty file the first created. ext4 takes a truncated file for one being
    rewritten and, when it is closed, starts writing all its pages to disk (auto_da_alloc):
    a third of a second at the end of the sink on the benchmark machine, for scratch files
    that are read back at once. A file opened once, exclusively, stays in the page cache.
    Unbuffered, so that closing a file after a failed sink has nothing left to write.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir()
        self.by_shard: dict[int, list[BinaryIO]] = {}

    def create(self, args: pl.FileProviderArgs) -> BinaryIO:
        shard = int(args.partition_keys[SHARD][0])
        file = (self.folder / f"{shard}-{args.index_in_partition}.arrow").open("xb", buffering=0)
        self.by_shard.setdefault(shard, []).append(file)
        return file

    def paths(self) -> list[tuple[int, list[Path]]]:
        """Each shard with rows, and its files, in shard order."""
        return [(shard, [Path(file.name) for file in files]) for shard, files in sorted(self.by_shard.items())]

    def close(self) -> None:
        for files in self.by_shard.values():
            for file in files:
                file.close()


def _load(files: list[Path]) -> pl.DataFrame:
    """A shard's rows, memory-mapped (pyarrow reads Arrow files without a copy, unlike Polars);
    the files are removed as soon as they are read (deleting hundreds of MB at the end takes a while)."""
    # Not rechunked: the sort writes its own contiguous copy anyway.
    shard = pl.from_arrow(pa.concat_tables(pa.ipc.open_file(pa.memory_map(str(file))).read_all() for file in files),
                          rechunk=False)
    assert isinstance(shard, pl.DataFrame)
    for file in files:
        file.unlink()
    return shard


def in_parallel_into(tasks: Sequence[Callable[[A], R]], new_accumulator: Callable[[], A]) -> tuple[list[R], list[A]]:
    """Each task's result, in order, WORKERS tasks running at once, and the accumulators (at
    least one) the tasks were given: a running task holds one that no other running task holds.

    Sorting and numpy release the GIL, so shards keep the cores busy. A task loads its shard
    when it starts, so only WORKERS shards are held in memory at a time; a worker takes the
    next task as soon as its own is done, whichever shard is still running (waiting for the
    shards in order left cores idle behind a slow one). One accumulator per worker, not per
    task: the sorted path's totals are 8 bytes per key code and quantity, written in full
    when they are zeroed and when they are merged.
    """
    accumulators = [new_accumulator() for _ in range(max(1, min(WORKERS, len(tasks))))]
    idle: SimpleQueue[A] = SimpleQueue()
    for accumulator in accumulators:
        idle.put(accumulator)

    def run(task: Callable[[A], R]) -> R:
        accumulator = idle.get()
        try:
            return task(accumulator)
        finally:
            idle.put(accumulator)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = [pool.submit(run, task) for task in tasks]
        try:
            return [future.result() for future in futures], accumulators
        except BaseException:
            # The first failure ends the run: the shards not started yet are not bounded.
            pool.shutdown(cancel_futures=True)
            raise
