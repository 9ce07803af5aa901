"""A private on-disk cache for compiled kernels (and the switch's profiles).

A shared library loaded from the cache runs inside the training process, so the cache must not
be a way for another local user to run code there. The rules:

* The cache directory (``$ZIPCCL_CACHE_DIR``, default ``~/.cache/zipccl``) is created 0700; an
  existing one -- and every file read from it -- must be owned by this user and writable by no
  one else, or :class:`UnsafeCacheError` names the path and the fix. Files are read without
  following symbolic links.
* Every file is written to a temporary name in the directory and renamed into place (atomic:
  a reader sees the old file or the new one, never half of one).
* A library is stored under its own SHA-256 (``NAME-KEY-CONTENT.so``, never rewritten); a small
  record ``NAME-KEY.json``, written after the build, holds that hash. A library is returned only
  if this process built it or its bytes hash to the record's SHA-256 -- a file planted under a
  predictable name, or a truncated one, is rebuilt, never loaded. Concurrent builds (ranks) each
  return their own immutable file; the last record written wins.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

ENV = "ZIPCCL_CACHE_DIR"
RECORD_BYTES = 1 << 12  # a build record is ~80 bytes; anything larger is not one
MAX_LIBRARY_BYTES = 1 << 30
NUL = b"\0"  # separates the name from the key in the key hash
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_BUILT: dict[Path, str] = {}  # libraries this process wrote -> their SHA-256


class UnsafeCacheError(PermissionError):
    """A cache directory or file that another user could have written."""


def cache_dir() -> Path:
    """The cache directory, created 0700 if missing; refused unless private to this user."""
    root = Path(os.environ.get(ENV) or Path.home() / ".cache" / "zipccl")
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        root.mkdir(mode=0o700)
        os.chmod(root, 0o700)  # mkdir's mode is masked by the umask
    except FileExistsError:
        pass
    _check_private(root, os.stat(root), "cache directory")
    if not root.is_dir():
        raise UnsafeCacheError(f"zipccl cache directory {root} is not a directory; set {ENV}")
    return root


def _check_private(path: Path, st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise UnsafeCacheError(
            f"zipccl {what} {path} is owned by uid {st.st_uid}, not by this user "
            f"(uid {os.geteuid()}); remove it or set {ENV} to a directory you own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(
            f"zipccl {what} {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}); run `chmod go-w {path}` or set {ENV}"
        )


def read_private(path: Path, limit: int) -> bytes | None:
    """A private regular file's bytes (None if there is none); refused if it is not a regular
    file of this user writable by no one else, or larger than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a symbolic link (ELOOP), a directory, ...
        raise UnsafeCacheError(f"zipccl cache file {path} cannot be read safely: {exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeCacheError(f"zipccl cache file {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        _check_private(path, st, "cache file")
        if st.st_size > limit:
            raise UnsafeCacheError(f"zipccl cache file {path} is over {limit} bytes")
        return f.read(limit + 1)[:limit]


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same directory, renamed)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_build(name: str, key: bytes, compile: Callable[[Path], None]) -> Path:
    """The path of the library ``name`` built from ``key`` (source, flags, architecture: all
    that determines it), compiled by ``compile(path)`` -- which writes the library to ``path``,
    a fresh name in a private temporary directory -- unless a verified earlier build exists."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"cache entry names are 1-64 of [A-Za-z0-9_.-], got {name!r}")
    root = cache_dir()
    stem = f"{name}-{hashlib.sha256(name.encode() + NUL + key).hexdigest()[:32]}"
    record = root / f"{stem}.json"
    found = _verified(root, stem, record)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{stem}.") as tmp:
        out = Path(tmp) / f"{stem}.so"
        compile(out)
        data = read_private(out, MAX_LIBRARY_BYTES)
        if data is None:
            raise FileNotFoundError(f"zipccl: building {name} wrote no library at {out}")
    digest = hashlib.sha256(data).hexdigest()
    lib = _library(root, stem, digest)
    write_private(lib, data, 0o500)
    _BUILT[lib] = digest
    write_private(record, json.dumps({"sha256": digest}).encode())
    return lib


def _library(root: Path, stem: str, digest: str) -> Path:
    return root / f"{stem}-{digest[:32]}.so"


def _verified(root: Path, stem: str, record: Path) -> Path | None:
    """The library a build record names, if its bytes hash to the record's SHA-256; None (so
    the caller rebuilds) for a missing, malformed or mismatching record or library."""
    raw = read_private(record, RECORD_BYTES)
    if raw is None:
        return None
    try:
        digest = json.loads(raw)["sha256"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        return None
    lib = _library(root, stem, digest)
    if _BUILT.get(lib) == digest:
        return lib
    data = read_private(lib, MAX_LIBRARY_BYTES)
    if data is None or hashlib.sha256(data).hexdigest() != digest:
        return None
    return lib
