"""The release card drawn by a helper process that starts with `dprun run`.

Importing matplotlib and drawing a first chart take about 0.4 s, a third of a small
release's whole run (docs/ci.md, "Start-up time"). The helper does both while the run
reads its spec and plans; it is sent the plan as soon as there is one and draws the
charts that depend on the plan alone while the run executes; then it draws the card from
the plan and the released tables it is sent: the same `card.release_card`, imported from
the same dprun, so the same bytes as drawing it in the run. Only the plan and DP outputs
cross the pipe, as go into the card itself. The helper ignores SIGINT (the run reports an
interruption for both) and ends when its input closes, so it never outlives the run.
Where it cannot start, fails or sends nothing back, the run draws the card itself.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import polars as pl

    from dprun.plan import Plan

# The helper imports as this process does, from its sys.path: the same dprun, the same libraries.
BOOTSTRAP = "import sys; sys.path[:] = sys.argv[1:]; from dprun.card_helper import serve; serve()"

# Each message on the helper's input: its length in this many bytes, then its pickle.
FRAME_HEADER = 8

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

    def draw_ahead(self, plan: Plan) -> bool:
        """Send the plan, whose charts the helper draws while the run executes; False if the helper is gone."""
        if self._process.stdin is None:
            return False
        try:
            self._process.stdin.write(_frame(("plan", plan)))
            self._process.stdin.flush()
        except OSError:  # the helper is gone: its pipe is broken
            return False
        return True

    def draw(self, plan: Plan, tables: dict[str, pl.DataFrame], release: dict[str, Any]) -> str | None:
        """The card's HTML, or None if the helper failed."""
        try:
            output, _ = self._process.communicate(_frame(("card", plan, tables, release)))
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
                # Closing flushes what a helper that is gone never read: the error is that,
                # and the pipe is closed all the same.
                with contextlib.suppress(OSError):
                    pipe.close()


def _frame(message: tuple[Any, ...]) -> bytes:
    """`message` framed for the helper's input."""
    data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(FRAME_HEADER, "big") + data


def start_for_this_run() -> None:
    """Start the helper that `release_card` takes (once); the launcher calls this for `dprun run`."""
    global _started
    _started = CardHelper.start()


def draw_ahead(plan: Plan) -> None:
    """Send the run's plan to the started helper, if any, to draw its charts while the run executes."""
    global _started
    if _started is not None and not _started.draw_ahead(plan):
        stop()


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
    """The helper's side: warm up, draw the plan's charts ahead, then draw the card it is sent
    (`BOOTSTRAP` calls this)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    messages: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    # The run's writes never wait for this process to finish importing: a thread takes them in.
    threading.Thread(target=_read_frames, args=(sys.stdin.buffer, messages), daemon=True).start()
    # What unpickling the plan and the tables imports, and what drawing them does.
    import matplotlib.figure  # noqa: F401
    import polars  # noqa: F401

    import dprun.plan  # noqa: F401
    import dprun.report  # noqa: F401
    from dprun import card

    if messages.empty():
        card.warm_up()
    charts = card.Charts()
    while (frame := messages.get()) is not None:
        message = pickle.loads(frame)
        if message[0] == "plan":
            charts.draw_ahead(message[1])
        else:
            _, plan, tables, release = message
            sys.stdout.buffer.write(card.release_card(plan, tables, release, charts).encode("utf-8"))
            break
    sys.stdout.flush()
    # The run waits for this process to end: the interpreter's own clean-up (~0.1 s with
    # matplotlib loaded) would only delay it.
    os._exit(0)


def _read_frames(stream: BinaryIO, messages: queue.SimpleQueue[bytes | None]) -> None:
    """Put each whole frame's message on `messages`, then None once the input ends."""
    while len(header := stream.read(FRAME_HEADER)) == FRAME_HEADER:
        size = int.from_bytes(header, "big")
        data = stream.read(size)
        if len(data) != size:  # the run ended while writing it
            break
        messages.put(data)
    messages.put(None)
