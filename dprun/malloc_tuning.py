"""Allocator options for dprun's work: freed memory kept for reuse, in glibc's malloc
(numpy's arrays) and in Polars' jemalloc.

glibc's are set through `mallopt` by hand because Python has no other way to reach them;
where the C library is not glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import os

# Polars' jemalloc (prefixed `_rjem_`) reads its options from this variable when Polars is
# first imported. Polars builds it to give freed pages back to the system after 0.5 s, and
# the sorted path's shards then fault the same memory in again. Kept 5 s, it is reused: a
# third fewer page faults at 10^8 rows (140,000 instead of 200,000), +0.1 GB peak RSS.
POLARS_ALLOCATOR_VARIABLE = "_RJEM_MALLOC_CONF"
POLARS_ALLOCATOR_OPTIONS = "dirty_decay_ms:5000,muzzy_decay_ms:5000"
# glibc's mallopt options (malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for reuse: one arena, freed memory kept up to
    256 MiB, arrays below 32 MiB from the heap.

    The sorted path's shards each allocate and free arrays of about 16 MB. By default glibc
    gives them back to the system at once and the next shard faults them in again: about a
    second of kernel time at 10^8 rows, a quarter of the bounding's wall time.

    One arena keeps every thread on the main heap, where freed memory is reused, instead of
    per-thread arenas whose 64 MiB heaps are mapped and unmapped again and again and
    reserve address space of their own (gigabytes under `ulimit -v`). glibc fixes a
    thread's arena at its first allocation, so the limit only holds for threads that had
    allocated nothing before: `dprun` (the command) calls this at start, before Polars and
    numpy start their threads; the sorted path calls it again for programs that use the API.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    for option, value in ((M_ARENA_MAX, 1), (M_TRIM_THRESHOLD, 2**28), (M_TOP_PAD, 2**26), (M_MMAP_THRESHOLD, 2**25)):
        mallopt(option, value)


def keep_polars_freed_memory() -> None:
    """Have Polars' allocator keep freed memory for 5 s, unless the user set its options.

    Takes effect only before Polars is imported.
    """
    os.environ.setdefault(POLARS_ALLOCATOR_VARIABLE, POLARS_ALLOCATOR_OPTIONS)
