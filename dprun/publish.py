"""All-or-nothing, crash-safe publication of a release's files.

A release's files are written into a fresh folder of a store beside the report, and one
symbolic link, `current`, names the release that is published; every output path (and
the report's) is a symbolic link through `current`:

    out/report.json                      -> .dprun/report.json/current/<slot>
    out/q.parquet                        -> .dprun/report.json/current/<slot>
    out/.dprun/report.json/current       -> releases/<release id>
    out/.dprun/report.json/releases/<release id>/<slot>   the files themselves

Publishing writes and syncs the new release's folder, makes every output path such a link
(an existing regular file there is first taken into the current release, so that the path
keeps showing it), and then renames a new `current` link over the old one: one atomic
rename switches every path at once. So at every instant, also after a SIGKILL or a power
loss, the files at the output paths are the whole previous release or the whole new one
(`dprun verify` checks it). Any failure or signal before the switch leaves the previous
release in place and removes what this run wrote; old releases are removed after it.

Writing into a store folder next to the report, rather than next to each output, is what
lets one rename switch outputs that live in several folders.

One release at a time per store: a run holds a lock (`flock` on the report's folder, which
leaves no file behind) from writing its folder to removing the old ones, so that two runs
on one report path (two workflows, a re-run while the first still publishes) publish one
after the other and `current` never names a removed folder; the kernel drops the lock of
a killed run.
A release keeps the files of the one before it that it does not produce itself (a second
spec with the same report path, a query dropped from the spec): their paths are links
through `current` too, and must never dangle.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from dprun.errors import OutputError
from dprun.small_files import path_problem

Writer = Callable[[Path], None]
STORE = ".dprun"
RELEASES = "releases"
CURRENT = "current"
# Tests only: seconds to pause between the steps of `commit`, so that a test can kill the
# process at a chosen step (tests/test_publish.py). It changes nothing else.
PAUSE_VARIABLE = "DPRUN_TEST_PUBLISH_PAUSE"


def store_of(report: Path) -> Path:
    """The store of the releases a report describes: one per report path, so that specs that
    publish into the same folder keep their releases apart."""
    return report.parent / STORE / report.name


def slot(target: Path) -> str:
    """The name a target's file has in every release: stable per path, so links need making once.

    The hash of the whole path keeps targets of the same name in different folders apart;
    the name, where it fits, tells a person looking into the store which file is which.
    """
    digest = hashlib.sha256(str(target).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    named = f"{digest}-{target.name}"
    return named if len(named.encode("utf-8", "surrogateescape")) <= 255 else digest + target.suffix


class Staging:
    """A release written into its own folder of the store, published by `commit`."""

    def __init__(self, store: Path, release_id: str) -> None:
        self.store = store
        self.release = store / RELEASES / release_id
        self._targets: list[Path] = []
        self._undo: list[Callable[[], None]] = []
        self._committed = False

    def write(self, target: Path, writer: Writer) -> None:
        self._targets.append(target)
        try:
            # The target's folder is made now, so that a path that cannot be one fails before publication.
            target.parent.mkdir(parents=True, exist_ok=True)
            self.release.mkdir(parents=True, exist_ok=True)
            path = self.release / slot(target)
            writer(path)
            _sync(path)
        except (OSError, pl.exceptions.PolarsError) as exc:
            # Polars reports a full disk as a ComputeError or a bare OSError: say what it likely is.
            reason = getattr(exc, "strerror", None) or _first_line(exc)
            raise OutputError(f"cannot write {target}: {reason}") from None

    def commit(self) -> None:
        """Link every target through `current`, then switch `current` to this release."""
        target = self.release
        try:
            _sync_folder(self.release)
            for target in self._targets:
                self._link(target)
                _pause()
            self._carry_over()
            target = self.store / CURRENT
            self._switch()
        except OSError as exc:
            self._roll_back()
            raise OutputError(f"cannot move outputs into place ({target}): {exc.strerror or type(exc).__name__}; "
                              "the previous release is still the one published") from None
        self._committed = True
        _pause()
        self._remove_leftovers()

    def discard(self) -> None:
        if not self._committed:
            self._roll_back()
            shutil.rmtree(self.release, ignore_errors=True)
            _remove_if_empty(self.store / RELEASES, self.store, self.store.parent)

    def _link(self, target: Path) -> None:
        """Make `target` the link to its slot through `current`, showing what it showed before."""
        link = os.path.relpath(self.store / CURRENT / slot(target), target.parent)
        if target.is_symlink() and os.readlink(target) == link:
            return
        if target.is_file():  # an earlier release's regular file (or a link to one): keep it visible
            kept = self._current_release() / slot(target)
            kept.unlink(missing_ok=True)  # shadowed by the file at the path, which is what readers see
            _copy(target, kept)
            self._undo.append(lambda: kept.unlink(missing_ok=True))
            _replace_with_link(target, link)
            self._undo.append(lambda: _replace_with_copy(kept, target))
        else:
            _replace_with_link(target, link)
            self._undo.append(lambda: target.unlink(missing_ok=True))

    def _carry_over(self) -> None:
        """Give this release the current one's files that it does not write itself (hard links)."""
        current = self.store / CURRENT
        if not current.is_dir():
            return
        for kept in current.resolve().iterdir():
            carried = self.release / kept.name
            if kept.is_file() and not carried.exists():
                _copy(kept, carried)

    def _current_release(self) -> Path:
        """The release `current` names; the first time, a release made of the regular files found."""
        current = self.store / CURRENT
        if current.is_dir():
            return current.resolve()
        adopted = self.store / RELEASES / f"adopted-{secrets.token_hex(6)}"
        adopted.mkdir(parents=True)
        self._undo.append(lambda: shutil.rmtree(adopted, ignore_errors=True))
        self._undo.append(lambda: current.unlink(missing_ok=True))
        _replace_with_link(current, os.path.relpath(adopted, self.store))
        return adopted

    def _switch(self) -> None:
        _pause()
        _replace_with_link(self.store / CURRENT, os.path.relpath(self.release, self.store))

    def _roll_back(self) -> None:
        while self._undo:
            try:
                self._undo.pop()()
            except OSError:
                # Best effort: the paths still show the previous release through `current`.
                pass

    def _remove_leftovers(self) -> None:
        """Older releases, and what a run killed while publishing left behind."""
        for folder in (self.store / RELEASES).iterdir():
            if folder != self.release:
                shutil.rmtree(folder, ignore_errors=True)
        for path in [self.store / CURRENT, *self._targets]:
            for temporary in path.parent.glob(f".{glob.escape(path.name)}.dprun-*.tmp"):
                temporary.unlink(missing_ok=True)


def write_whole(path: Path, data: bytes, force: bool = True) -> None:
    """Write one file whole or not at all, the way a user who names `path` means it: a regular file
    is replaced by a temporary file beside it, synced, then renamed over it (through a symbolic
    link, at the file the link names, which stays a link), and only with `force` if it exists; a
    device or FIFO (`/dev/stdout`) is written through, never replaced by a regular file."""
    problem = path_problem(str(path))
    if problem is not None:
        raise OutputError(f"cannot write {path!s:.300}: {problem}")
    try:
        info: os.stat_result | None = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:  # a symbolic link loop, a part of the path that is a file
        raise OutputError(f"cannot write {path}: {exc.strerror or type(exc).__name__}") from None
    system = path.is_absolute() and path.parts[1:2] in (("dev",), ("proc",))  # /dev/stdout: whatever fd 1 is
    if info is not None and (system or stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
        _write_through(path, data)  # as named: /dev/stdout names the pipe or file it is linked to
        return
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a special file (block device or socket)"
        raise OutputError(f"cannot write {path}: it is {kind}")
    if info is not None and not force:
        raise OutputError(f"{path} exists already (use --force to replace it)")
    target = path.resolve()  # a link stays a link: the file it names is replaced
    temporary = target.with_name(f".{target.name}.dprun-{secrets.token_hex(6)}.tmp")
    try:
        with temporary.open("xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or type(exc).__name__}") from None


def _write_through(device: Path, data: bytes) -> None:
    """Write to a character device or a FIFO as it is; a FIFO without a reader is an error, not a hang."""
    try:
        # O_APPEND: a regular file reached through /dev or /proc (stdout sent to a file) is added to, never cut.
        descriptor = os.open(device, os.O_WRONLY | os.O_NONBLOCK | os.O_APPEND)
    except OSError as exc:
        reason = "a FIFO nobody reads" if exc.errno == errno.ENXIO else exc.strerror or type(exc).__name__
        raise OutputError(f"cannot write {device}: {reason}") from None
    try:
        os.set_blocking(descriptor, True)
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view):]
    except OSError as exc:
        raise OutputError(f"cannot write {device}: {exc.strerror or type(exc).__name__}") from None
    finally:
        os.close(descriptor)


def _replace_with_link(path: Path, link: str) -> None:
    temporary = path.with_name(f".{path.name}.dprun-{secrets.token_hex(6)}.tmp")
    os.symlink(link, temporary)
    try:
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _replace_with_copy(source: Path, target: Path) -> None:
    """Put a file back at `target` (a link of ours), where `rename` replaces the link atomically."""
    temporary = target.with_name(f".{target.name}.dprun-{secrets.token_hex(6)}.tmp")
    _copy(source, temporary)
    try:
        os.replace(temporary, target)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def _copy(source: Path, destination: Path) -> None:
    """A hard link where the file system allows it (no bytes copied), else a synced copy."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination, follow_symlinks=True)
    except OSError:
        shutil.copyfile(source, destination)
        _sync(destination)


def _sync(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove_if_empty(*folders: Path) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _pause() -> None:
    pause = os.environ.get(PAUSE_VARIABLE)
    if pause:
        time.sleep(float(pause))


def _first_line(exc: Exception) -> str:
    # Write errors name the target and the OS error, never data values.
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def staged(store: Path, release_id: str) -> Iterator[Staging]:
    """A release that is discarded unless the block commits it, written and published under the
    store's lock (another run publishing to the same store waits)."""
    with _store_lock(store):
        staging = Staging(store, release_id)
        try:
            yield staging
        finally:
            staging.discard()


@contextmanager
def _store_lock(store: Path) -> Iterator[None]:
    """The lock of the folder that holds the report (and the store's `.dprun` folder)."""
    folder = store.parent.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        raise OutputError(f"cannot publish into {folder}: {exc.strerror or type(exc).__name__}") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def refuse_existing(targets: list[tuple[Path, bool]]) -> None:
    """Fail before any work if a target exists and may not be overwritten, or is not a regular file.

    Publication replaces a target by renaming a regular file onto it: a folder, a device
    or a FIFO at a target is refused whatever `--overwrite` says.
    """
    for path, _ in targets:
        kind = _not_a_regular_file(path)
        if kind is not None:
            raise OutputError(f"cannot publish to {path}: it is {kind}, not a regular file")
    existing = [str(path) for path, overwrite in targets if path.exists() and not overwrite]
    if existing:
        raise OutputError(
            "output exists already (use --overwrite or `output.overwrite: true`): " + ", ".join(existing)
        )
    for path, _ in targets:
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not os.access(parent, os.W_OK):
            raise OutputError(f"cannot write {path}: folder {parent} is not writable")


def _not_a_regular_file(path: Path) -> str | None:
    """What stands at `path` if it is neither absent nor a regular file (targets are resolved paths)."""
    if not path.exists() or path.is_file():
        return None
    return "a folder" if path.is_dir() else "a special file (device, FIFO or socket)"
