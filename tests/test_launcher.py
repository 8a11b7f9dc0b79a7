"""The `dprun` command's entry point sets malloc options before anything starts a thread."""

from __future__ import annotations

import subprocess
import sys


def test_the_launcher_imports_no_threaded_library_before_tuning_malloc() -> None:
    # glibc fixes a thread's malloc arena at its first allocation: had importing the launcher
    # (and the package) imported Polars or numpy, their threads would already have arenas.
    code = ("import sys, dprun.launcher; "
            "print(sorted(m for m in ('polars', 'numpy', 'pyarrow', 'scipy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout

