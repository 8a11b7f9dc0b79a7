"""Which files an input's `path` names: a file, a folder, a glob, or a `file://` URL of any of these.

Spark jobs write a folder of part files with marker files beside them (`_SUCCESS`,
`_committed_…`, `.part-0.crc`); a folder or a glob over one reads the part files only, as Spark's
own file sources do (names beginning with `_` or `.` below the folder, or the glob's fixed folder,
are skipped). Files in Hive partition folders (`day=3/part-0.parquet`) carry those folders' values
as columns (`partition_values`), as Spark's partition discovery reads them. URLs of other schemes
(`s3a://`, `hdfs://`, …) are not files on this machine: `url_problem` says so in the spec's words,
before anything is read; the Spark engine lists and reads them through Spark instead
(`spark_engine.SparkInputReader`).
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path, PurePath
from urllib.parse import unquote

# A URL's scheme: two or more characters before ":/" (one letter would be a Windows drive).
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")
_LOCAL_HOSTS = ("", "localhost")
# The folder name Hive and Spark write for a null partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def url_scheme(path: str) -> str | None:
    """The scheme of a path written as a URL, lower case, or None for a plain path."""
    found = _URL.match(path)
    return found.group(1).lower() if found else None


def url_problem(path: str) -> str | None:
    """Why a path written as a URL cannot be read here, or None (a plain path, or a `file://` URL of
    this machine)."""
    scheme = url_scheme(path)
    if scheme is None:
        return None
    if scheme != "file":
        return (f"'{path}' is a URL ({scheme}:): the Polars engine reads files on this machine (a path, a glob or a "
                "file:// URL); the Spark engine reads it through Spark (`--engine spark`, for `validate` and "
                "`explain-budget` too), or copy or mount the files here and name them by their local path")
    if url_parts(path)[0] not in _LOCAL_HOSTS:
        return f"'{path}' names a file on another host; a file:// URL must be of this machine (file:///…)"
    return None


def local_pattern(path: str, base_dir: Path) -> str:
    """The path or glob as a local one: a `file://` URL's path (percent-decoded), else the path
    relative to the spec's folder `base_dir` (absolute paths as written)."""
    if url_scheme(path) == "file":
        return unquote(url_parts(path)[1])
    return path if Path(path).is_absolute() else str(base_dir / path)


def local_path(path: str, base_dir: Path) -> Path:
    """`local_pattern` of a single file's path (a public key file)."""
    return Path(local_pattern(path, base_dir))


def url_parts(url: str) -> tuple[str, str]:
    """A URL's host and path, as written (not decoded). Split by hand: urllib would read a glob's `?` or
    a file name's `?` or `#` as the start of a query or a fragment."""
    rest = url[url.index(":") + 1:]
    if rest.startswith("//"):
        host, _, tail = rest[2:].partition("/")
        return host, "/" + tail
    return "", rest


def resolve_paths(path: str, base_dir: Path) -> tuple[Path, ...]:
    """The files an input's `path` names, sorted: the file itself, or every file below the folder or
    matched by the glob except marker files (a name beginning with `_` or `.` below the folder, or
    the glob's fixed folder)."""
    full = local_pattern(path, base_dir)
    if glob.has_magic(full) or Path(full).is_dir():
        pattern = full if glob.has_magic(full) else os.path.join(glob.escape(full), "**", "*")
        root = str(partition_root(path, base_dir))
        return tuple(sorted(Path(p) for p in glob.glob(pattern, recursive=True)
                            if Path(p).is_file() and not _is_marker(p, root)))
    return (Path(full),) if Path(full).is_file() else ()


def partition_root(path: str, base_dir: Path) -> Path:
    """The folder whose subfolders may be Hive partition folders: the folder `path` names, a glob's
    fixed folder, or a single file's own folder (Spark's `basePath`)."""
    full = local_pattern(path, base_dir)
    if glob.has_magic(full):
        return Path(_fixed_folder(full))
    return Path(full) if Path(full).is_dir() else Path(full).parent


def partition_values(file: PurePath, root: PurePath) -> list[tuple[str, str | None]] | None:
    """The (column, value) of each Hive partition folder between `root` and `file`, outermost first,
    as Spark reads them: split at the first `=`, percent-decoded, Hive's null folder as None. [] where
    no folder between them is one; None where some are and some are not (Spark would take a part
    of them only)."""
    folders = file.relative_to(root).parts[:-1]
    found = [(unquote(name), None if value == HIVE_NULL else unquote(value))
             for name, equals, value in (folder.partition("=") for folder in folders) if equals and name]
    return found if len(found) in (0, len(folders)) else None


def _fixed_folder(pattern: str) -> str:
    """The folder a glob starts in: its path up to the first component with a wildcard."""
    parts = Path(pattern).parts
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    return str(Path(*parts[:fixed])) if fixed else "."


def _is_marker(match: str, root: str) -> bool:
    """Whether a glob's match is, or lies in, a file or folder that Spark and Hadoop skip as metadata."""
    return any(part.startswith(("_", ".")) for part in Path(os.path.relpath(match, root)).parts)
