"""The release card drawn by a helper process that starts with `dprun run`.

Importing matplotlib and drawing a first chart take about 0.4 s, a third of a small
release's whole run (docs/ci.md, "Start-up time"). The helper does both while
the run reads its spec, plans and executes, then draws the card from the plan and the
released tables it is sent: the same `card.release_card`, imported from the same dprun,
so the same bytes as drawing it in the run. Only the plan and DP outputs cross the pipe,
as go into the card itself. The helper ignores SIGINT (the run reports an interruption
for both) and ends when its input closes, so it never outlives the run. Where it cannot
start, fails or sends nothing back, the run draws the card itself.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from dprun.plan import Plan

# The helper imports as this process does, from its sys.path: the same dprun, the same libraries.
BOOTSTRAP = "import sys; sys.path[:] = sys.argv[1:]; from dprun.card_helper import serve; serve()"

_started: CardHelper | None = None


class CardHelper:
    """A helper process, warm and waiting for one card to draw."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @classmethod
    def start(cls) -> CardHelper | None:
        """The helper started (it warms up at once), or None if no process can be started."""
        if not sys.executable:
            return None
        try:
            process = subprocess.Popen([sys.executable, "-c", BOOTSTRAP, *sys.path], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return None
        return cls(process)

    def draw(self, plan: Plan, tables: dict[str, pl.DataFrame], release: dict[str, Any]) -> str | None:
        """The card's HTML, or None if the helper failed."""
        try:
            output, _ = self._process.communicate(pickle.dumps((plan, tables, release), pickle.HIGHEST_PROTOCOL))
        except OSError:  # the helper is gone: its pipe is broken
            self.stop()
            return None
        return output.decode("utf-8") if self._process.returncode == 0 and output else None

    def stop(self) -> None:
        """End the helper (at once if it still waits) and reap it."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                pipe.close()


def start_for_this_run() -> None:
    """Start the helper that `release_card` takes (once); the launcher calls this for `dprun run`."""
    global _started
    _started = CardHelper.start()


def stop() -> None:
    """Stop a helper no card was asked of (the run failed before publishing)."""
    global _started
    if _started is not None:
        _started.stop()
        _started = None


def release_card(plan: Plan, tables: dict[str, pl.DataFrame], release: dict[str, Any]) -> str:
    """`card.release_card` of a release, drawn by the started helper where there is one."""
    global _started
    helper, _started = _started, None
    if helper is not None:
        try:
            drawn = helper.draw(plan, tables, release)
        finally:
            helper.stop()
        if drawn is not None:
            return drawn
    from dprun import card

    return card.release_card(plan, tables, release)


def serve() -> None:
    """The helper's side: warm up, then draw the card it is sent (`BOOTSTRAP` calls this)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # What unpickling the plan and the tables imports, and what drawing them does.
    import polars  # noqa: F401

    import dprun.plan  # noqa: F401
    import dprun.report  # noqa: F401
    from dprun import card

    card.warm_up()
    payload = sys.stdin.buffer.read()
    if payload:
        plan, tables, release = pickle.loads(payload)
        sys.stdout.buffer.write(card.release_card(plan, tables, release).encode("utf-8"))
    sys.stdout.flush()
    # The run waits for this process to end: the interpreter's own clean-up (~0.1 s with
    # matplotlib loaded) would only delay it.
    os._exit(0)
