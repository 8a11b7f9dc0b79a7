"""The `dprun` command's entry point sets malloc options before anything starts a thread."""

from __future__ import annotations

import os
import subprocess
import sys

from dprun import malloc_tuning


def test_the_launcher_imports_no_threaded_library_before_tuning_malloc() -> None:
    # glibc fixes a thread's malloc arena at its first allocation: had importing the launcher
    # (and the package) imported Polars or numpy, their threads would already have arenas.
    code = ("import sys, dprun.launcher; "
            "print(sorted(m for m in ('polars', 'numpy', 'pyarrow', 'scipy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def run_prepared(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("_RJEM_MALLOC_CONF", "OPENBLAS_NUM_THREADS")}
    result = subprocess.run([sys.executable, "-c", f"import dprun.launcher as launcher; launcher.prepare_process(); {code}"],
                            capture_output=True, text=True, check=True, env={**environment, **env})
    return result.stdout.strip()


def test_the_launcher_sets_polars_and_openblas_options_unless_the_user_did() -> None:
    code = "import os; print(os.environ['_RJEM_MALLOC_CONF'], os.environ['OPENBLAS_NUM_THREADS'])"
    assert run_prepared(code) == f"{malloc_tuning.POLARS_ALLOCATOR_OPTIONS} 1"
    assert run_prepared(code, _RJEM_MALLOC_CONF="dirty_decay_ms:0", OPENBLAS_NUM_THREADS="4") == "dirty_decay_ms:0 4"


def test_polars_allocator_takes_the_options_set_before_it_is_imported() -> None:
    # jemalloc prints its options at exit with stats_print; what the launcher sets must be read.
    environment = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    code = ("import os; os.environ['_RJEM_MALLOC_CONF'] = 'dirty_decay_ms:4321,stats_print:true'; "
            "import polars as pl; pl.DataFrame({'a': [1]})")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment)
    assert "opt.dirty_decay_ms: 4321" in result.stderr + result.stdout


# A stream on the real stderr whose every write first takes a signal, as a burst of signals
# lands inside the handler's own writing (CI saw "reentrant call inside BufferedWriter").
SIGNAL_INSIDE_WRITES = """
import os, signal, sys
import dprun.launcher

class SignalledStream:
    def __init__(self, stream):
        self.stream = stream
    def write(self, text):
        signal.raise_signal(signal.SIGINT)
        return self.stream.write(text)
    def flush(self):
        self.stream.flush()
    def fileno(self):
        return self.stream.fileno()

sys.stderr = SignalledStream(sys.stderr)
sys.stdout = SignalledStream(sys.stdout)
os.kill(os.getpid(), signal.SIG)
"""


def test_signals_inside_the_starting_handler_end_the_process_with_one_message() -> None:
    for signum, arguments, expected_out, expected_err in (
            ("SIGINT", [], "", "error: interrupted while starting; nothing was published\n"),
            ("SIGTERM", ["--format", "json"],
             '{"ok": false, "exit_code": 130, "problems": [{"file": "", "line": null, "column": null, '
             '"field": "", "message": "interrupted while starting; nothing was published"}]}\n', "")):
        code = SIGNAL_INSIDE_WRITES.replace("signal.SIG)", f"signal.{signum})")
        result = subprocess.run([sys.executable, "-c", code, "run", *arguments], capture_output=True,
                                text=True, timeout=60)
        assert (result.returncode, result.stdout, result.stderr) == (130, expected_out, expected_err), result
