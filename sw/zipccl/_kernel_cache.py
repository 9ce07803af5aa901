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
  record ``NAME-KEY.json``, written after the build, holds that hash. A library is loaded only
  from a descriptor whose bytes were hashed to the record's SHA-256 just before (the loader opens
  ``/proc/self/fd/N``, the very file hashed, whatever a rename does to the name meanwhile), on
  every load, a fresh build included -- a file planted under a predictable name, or a swapped or
  truncated one, is rebuilt, never loaded. Concurrent builds (ranks) each load their own
  immutable file; the last record written wins.
* The cache root must not be another user's symbolic link, nor sit in a directory that other
  users can write to without the sticky bit (they could replace the root); a malformed record
  (bad JSON, nesting past the parser's depth) means a rebuild, never an exception of the
  parser's.
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
from typing import TypeVar

ENV = "ZIPCCL_CACHE_DIR"
RECORD_BYTES = 1 << 12  # a build record is ~80 bytes; anything larger is not one
MAX_LIBRARY_BYTES = 1 << 30
NUL = b"\0"  # separates the name from the key in the key hash
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_LOADED: list[int] = []  # descriptors of loaded libraries: open for the process's life, so that
# no later library reuses a /proc/self/fd/N name the loader already knows (it would return the
# library loaded first under that name)
T = TypeVar("T")


class UnsafeCacheError(PermissionError):
    """A cache directory or file that another user could have written."""


def cache_dir() -> Path:
    """The cache directory, created 0700 if missing; refused unless it (and the symbolic link
    naming it, if one does) is private to this user, in a parent that other users cannot replace
    it in."""
    root = Path(os.environ.get(ENV) or Path.home() / ".cache" / "zipccl")
    root.parent.mkdir(parents=True, exist_ok=True)
    _check_parent(root.parent)
    try:
        root.mkdir(mode=0o700)
        os.chmod(root, 0o700)  # mkdir's mode is masked by the umask
    except FileExistsError:
        pass
    link = os.lstat(root)
    if stat.S_ISLNK(link.st_mode) and link.st_uid != os.geteuid():  # (a link's mode is 777)
        raise UnsafeCacheError(
            f"zipccl cache directory {root} is a symbolic link of uid {link.st_uid}, who can "
            f"point it elsewhere at any time; set {ENV} to a directory you own"
        )
    st = os.stat(root)
    _check_private(root, st, "cache directory")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(f"zipccl cache directory {root} is not a directory; set {ENV}")
    return root


def _check_parent(parent: Path) -> None:
    """Another user may write to the root's parent only where the sticky bit stops them from
    renaming or removing entries they do not own (as in /tmp)."""
    st = os.stat(parent)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafeCacheError(
            f"zipccl cache directory's parent {parent} is writable by others without the sticky "
            f"bit, so another user could replace the cache; set {ENV} elsewhere"
        )


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


def _open_private(path: Path, limit: int) -> tuple[int, os.stat_result] | None:
    """A read-only descriptor of the private regular file ``path`` of at most ``limit`` bytes
    (None if there is none), opened without following a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a symbolic link (ELOOP), a directory, ...
        raise UnsafeCacheError(f"zipccl cache file {path} cannot be read safely: {exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeCacheError(f"zipccl cache file {path} is not a regular file")
        _check_private(path, st, "cache file")
        if st.st_size > limit:
            raise UnsafeCacheError(f"zipccl cache file {path} is over {limit} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_private(path: Path, limit: int) -> bytes | None:
    """A private regular file's bytes (None if there is none); refused if it is not a regular
    file of this user writable by no one else, or larger than ``limit``."""
    opened = _open_private(path, limit)
    if opened is None:
        return None
    with os.fdopen(opened[0], "rb") as f:
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


def cached_build(
    name: str, key: bytes, compile: Callable[[Path], None], load: Callable[[str], T]
) -> T:
    """``load(path)`` (e.g. ``ctypes.CDLL``) of the library ``name`` built from ``key`` (source,
    flags, architecture: all that determines it), compiled by ``compile(out)`` -- which writes
    the library to ``out``, a fresh name in a private temporary directory -- unless a verified
    earlier build exists. ``path`` is ``/proc/self/fd/N``: a descriptor whose bytes were just
    hashed to the build record's SHA-256, kept open while the process lives (Linux)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"cache entry names are 1-64 of [A-Za-z0-9_.-], got {name!r}")
    root = cache_dir()
    stem = f"{name}-{hashlib.sha256(name.encode() + NUL + key).hexdigest()[:32]}"
    record = root / f"{stem}.json"
    fd = _verified(root, stem, record)
    if fd is None:
        lib, digest = _build(root, stem, name, compile)
        write_private(record, json.dumps({"sha256": digest}).encode())
        fd = _open_hashed(lib, digest)
        if fd is None:
            raise UnsafeCacheError(f"zipccl cache file {lib} changed right after it was written")
    try:
        loaded = load(f"/proc/self/fd/{fd}")
    except BaseException:
        os.close(fd)
        raise
    _LOADED.append(fd)
    return loaded


def _build(root: Path, stem: str, name: str, compile: Callable[[Path], None]) -> tuple[Path, str]:
    """Compile into a private temporary directory, then store the library under its hash."""
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{stem}.") as tmp:
        out = Path(tmp) / f"{stem}.so"
        compile(out)
        data = read_private(out, MAX_LIBRARY_BYTES)
        if data is None:
            raise FileNotFoundError(f"zipccl: building {name} wrote no library at {out}")
    digest = hashlib.sha256(data).hexdigest()
    lib = _library(root, stem, digest)
    write_private(lib, data, 0o500)
    return lib, digest


def _library(root: Path, stem: str, digest: str) -> Path:
    return root / f"{stem}-{digest[:32]}.so"


def _open_hashed(lib: Path, digest: str) -> int | None:
    """A descriptor of ``lib`` if its bytes, read through that descriptor, hash to ``digest``;
    None (closed) otherwise."""
    opened = _open_private(lib, MAX_LIBRARY_BYTES)
    if opened is None:
        return None
    fd = opened[0]
    with os.fdopen(fd, "rb", closefd=False) as f:
        ok = hashlib.file_digest(f, "sha256").hexdigest() == digest
    if not ok:
        os.close(fd)
        return None
    return fd


def _verified(root: Path, stem: str, record: Path) -> int | None:
    """A descriptor of the library a build record names, if its bytes hash to the record's
    SHA-256; None (so the caller rebuilds) for a missing, malformed or mismatching record or
    library."""
    raw = read_private(record, RECORD_BYTES)
    if raw is None:
        return None
    try:
        digest = json.loads(raw)["sha256"]
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):  # bad JSON, bad UTF-8
        return None
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        return None
    return _open_hashed(_library(root, stem, digest), digest)
