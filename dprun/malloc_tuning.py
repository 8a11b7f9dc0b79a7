"""glibc malloc options for dprun's numpy work: one arena, freed memory kept for reuse.

Set through `mallopt` by hand because Python has no other way to reach them; where the C
library is not glibc this does nothing.
"""

from __future__ import annotations

import ctypes

# glibc's mallopt options (malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for reuse: one arena, freed memory kept up to
    256 MiB, arrays below 32 MiB from the heap.

    The sorted path's shards each allocate and free arrays of tens of MB. By default glibc
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
