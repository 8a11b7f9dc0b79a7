"""Hints for the compiled passes: ask the processor to start loading a row of a large table
into its caches before a loop reads or writes it, so that many loads are in flight at once
instead of one cache miss after another.

Written against numba's extension API (`intrinsic`, `overload`): numba has no prefetch of its
own, and LLVM's `llvm.prefetch` is a no-op on processors without one. As Python (tests) they
do nothing. A hint changes no result, only when memory is read: so the passes' cached machine
code may compile in an older version of this file without ever computing other numbers
(numba redoes a pass's cache only when the pass's own source file changes).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

# LLVM's prefetch arguments: read or write, and locality (3: keep it in every cache level).
_READ, _WRITE, _KEEP = 0, 1, 3
_registering = threading.Lock()


def prefetch_row(table: Any, row: int) -> None:
    """Nothing, as Python. Compiled (`register_hints`): row `row` of a 2-D `table` that this thread
    is about to write (a worker's own totals)."""


def prefetch_row_to_read(table: Any, row: int) -> None:
    """Nothing, as Python. Compiled (`register_hints`): row `row` of a 2-D `table` that this thread
    is about to read. For tables several workers share: fetched for a write, a line would be
    taken from the other cores' caches each time (two workers finding key codes: 8 ns a row
    with this hint, 14 with the write's)."""


def register_hints() -> None:
    """Give both hints their compiled form, once in the process, before the passes that call
    them are compiled (the two loaders of `dprun.engines.compiled` may both ask at once)."""
    with _registering:
        _register()


@functools.cache
def _register() -> None:
    from llvmlite import ir  # type: ignore[import-untyped]
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic, overload

    def hint(read_or_write: int) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            array_type = signature.args[0]
            array = context.make_array(array_type)(context, builder, args[0])
            address = cgutils.get_item_pointer(context, builder, array_type, array,
                                               [args[1], context.get_constant(types.intp, 0)])
            byte_pointer = ir.IntType(8).as_pointer()
            word = ir.IntType(32)
            prefetch = builder.module.declare_intrinsic(
                "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [byte_pointer, word, word, word]))
            # The last argument: data, not instructions.
            builder.call(prefetch, [builder.bitcast(address, byte_pointer), ir.Constant(word, read_or_write),
                                    ir.Constant(word, _KEEP), ir.Constant(word, 1)])
            return context.get_dummy_value()

        def typing(typing_context: Any, table: Any, row: Any) -> Any:
            return types.void(table, row), codegen

        compiled_hint: Any = intrinsic(typing)

        def implementation(table: Any, row: Any) -> Any:
            def prefetch(table: Any, row: Any) -> None:
                compiled_hint(table, row)
            return prefetch

        return implementation

    overload(prefetch_row)(hint(_WRITE))
    overload(prefetch_row_to_read)(hint(_READ))
