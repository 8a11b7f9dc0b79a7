"""numba's compiler as dprun uses it: no Python objects, the GIL released, machine code cached."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def njit_cached(signatures: list[Any], function: Callable[..., object]) -> Any:
    """`function` compiled by numba for `signatures`, releasing the GIL, its machine code kept in
    numba's on-disk cache so that a machine compiles it once. Compiled code checks no index and
    wraps on overflow: the callers make sure neither can happen."""
    import numba  # here: only the callers that need compiled code pay its import

    try:
        return numba.njit(signatures, nogil=True, cache=True)(function)
    except RuntimeError:
        # No writable folder for numba's cache (a read-only installation and home): compile for this run.
        return numba.njit(signatures, nogil=True)(function)
