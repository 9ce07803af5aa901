"""The private kernel cache (issue 18 item 1): a planted or tampered library is never returned,
unsafe directories and files are refused by name, writes are atomic. A fake compiler stands in
for nvcc, so all of it runs on CPU."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from zipccl import _kernel_cache as kc
from zipccl import switch
from zipccl.collectives import _profile as profiles
from zipccl.collectives import _transport

AS_ROOT = os.geteuid() == 0
NOBODY = 65534


class FakeCompiler:
    """Writes ``b"lib:" + payload`` where asked, counting its calls."""

    def __init__(self, payload: bytes = b"v1") -> None:
        self.payload, self.calls = payload, 0

    def __call__(self, out: Path) -> None:
        self.calls += 1
        out.write_bytes(b"lib:" + self.payload)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache directory (not yet created) and a process that has built nothing."""
    root = tmp_path / "cache"
    monkeypatch.setenv(kc.ENV, str(root))
    return root


def _where(path: str) -> Path:
    """A stand-in loader: the cache file behind the descriptor ``cached_build`` passes."""
    return Path(os.readlink(path))


def built(name: str, key: bytes, compile) -> Path:
    return kc.cached_build(name, key, compile, _where)


def _record(cache: Path) -> Path:
    (record,) = cache.glob("*.json")
    return record


def test_the_cache_directory_is_created_private_whatever_the_umask(cache: Path) -> None:
    old = os.umask(0)
    try:
        assert kc.cache_dir() == cache
    finally:
        os.umask(old)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def test_a_build_is_compiled_once_and_then_verified(cache: Path, monkeypatch) -> None:
    cc = FakeCompiler()
    lib = built("codec_sm90", b"source", cc)
    assert lib.parent == cache and lib.read_bytes() == b"lib:v1" and cc.calls == 1
    assert stat.S_IMODE(lib.stat().st_mode) == 0o500
    assert built("codec_sm90", b"source", cc) == lib and cc.calls == 1
    assert built("codec_sm90", b"source", cc) == lib and cc.calls == 1
    assert built("codec_sm90", b"other source", cc) != lib and cc.calls == 2
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == []


def test_a_tampered_library_is_rebuilt_not_loaded(cache: Path, monkeypatch) -> None:
    lib = built("codec", b"k", FakeCompiler())
    os.chmod(lib, 0o700)
    lib.write_bytes(b"lib:evil")
    cc = FakeCompiler(b"v2")
    again = built("codec", b"k", cc)
    assert cc.calls == 1 and again.read_bytes() == b"lib:v2"


@pytest.mark.parametrize(
    "record",
    [
        b"",
        b"{",
        b"[]",
        b'{"sha256": 5}',
        b'{"sha256": "../x"}',
        b'{"sha256": "' + b"0" * 64 + b'"}',
        b" " * 5000,
    ],
)
def test_a_malformed_or_planted_record_means_a_rebuild(
    cache: Path, monkeypatch, record: bytes
) -> None:
    """Whatever the record says, only a library whose bytes hash to it is ever returned."""
    built("codec", b"k", FakeCompiler())
    path = _record(cache)
    if len(record) > kc.RECORD_BYTES:
        path.write_bytes(record)
        with pytest.raises(kc.UnsafeCacheError, match="over"):
            built("codec", b"k", FakeCompiler())
        return
    path.write_bytes(record)
    cc = FakeCompiler(b"v3")
    assert built("codec", b"k", cc).read_bytes() == b"lib:v3" and cc.calls == 1


def test_a_library_planted_under_the_recorded_name_is_not_loaded(cache: Path, monkeypatch) -> None:
    """The only way in is a file whose SHA-256 is the one the verified build recorded."""
    lib = built("codec", b"k", FakeCompiler())
    record = json.loads(_record(cache).read_bytes())
    lib.unlink()
    lib.write_bytes(b"lib:planted")
    cc = FakeCompiler()
    assert built("codec", b"k", cc).read_bytes() == b"lib:v1" and cc.calls == 1
    assert json.loads(_record(cache).read_bytes()) == record


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o720, 0o702])
def test_a_group_or_other_writable_directory_is_refused_by_name(cache: Path, mode: int) -> None:
    cache.mkdir()
    os.chmod(cache, mode)
    with pytest.raises(kc.UnsafeCacheError, match=f"{cache}.*writable by group or others"):
        built("codec", b"k", FakeCompiler())


def test_a_group_writable_cache_file_is_refused_by_name(cache: Path) -> None:
    built("codec", b"k", FakeCompiler())
    os.chmod(_record(cache), 0o662)
    with pytest.raises(kc.UnsafeCacheError, match=f"{_record(cache)}.*writable"):
        built("codec", b"k", FakeCompiler())


def test_a_symbolic_link_in_the_cache_is_refused(cache: Path, tmp_path: Path) -> None:
    built("codec", b"k", FakeCompiler())
    record = _record(cache)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(record.read_bytes())
    record.unlink()
    record.symlink_to(elsewhere)
    with pytest.raises(kc.UnsafeCacheError, match=str(record)):
        built("codec", b"k", FakeCompiler())


@pytest.mark.skipif(not AS_ROOT, reason="needs root to give a file to another user")
def test_a_directory_or_file_of_another_user_is_refused(cache: Path) -> None:
    built("codec", b"k", FakeCompiler())
    os.chown(_record(cache), NOBODY, NOBODY)
    with pytest.raises(kc.UnsafeCacheError, match=f"{_record(cache)} is owned by uid {NOBODY}"):
        built("codec", b"k", FakeCompiler())
    os.chown(cache, NOBODY, NOBODY)
    with pytest.raises(kc.UnsafeCacheError, match=f"{cache} is owned by uid {NOBODY}"):
        kc.cache_dir()


def test_a_failed_build_leaves_nothing_behind(cache: Path) -> None:
    def broken(out: Path) -> None:
        out.write_bytes(b"half a lib")
        raise RuntimeError("nvcc failed")

    with pytest.raises(RuntimeError, match="nvcc failed"):
        built("codec", b"k", broken)
    assert list(cache.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="wrote no library"):
        built("codec", b"k", lambda out: None)
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize("name", ["", "../codec", "a/b", "x" * 65, "codec\0"])
def test_entry_names_cannot_leave_the_directory(cache: Path, name: str) -> None:
    with pytest.raises(ValueError, match="cache entry names"):
        built(name, b"k", FakeCompiler())


def test_read_private_refuses_what_is_not_a_regular_file(cache: Path) -> None:
    root = kc.cache_dir()
    assert kc.read_private(root / "missing", 10) is None
    (root / "dir").mkdir()
    with pytest.raises(kc.UnsafeCacheError, match="not a regular file"):
        kc.read_private(root / "dir", 10)
    os.mkfifo(root / "fifo", 0o600)
    with pytest.raises(kc.UnsafeCacheError, match="not a regular file"):
        kc.read_private(root / "fifo", 10)


# ---------------------------------------------------------------------- the switch's profile
GLOO_PAIR = _transport.Group(None, 0, 2, torch.device("cpu"), "gloo")


def _profile(scale: float = 1.0) -> switch.Profile:
    line = switch.Line(1e-5 * scale, 1e9)
    return switch.Profile(
        dict.fromkeys(switch.OPS, line),
        line,
        line,
        line,
        line,
        ratio={switch.dtype_name(d): 0.7 for d in switch.PRIOR_DTYPES},
    )


def test_a_profile_is_cached_privately_and_read_back(cache: Path) -> None:
    profiles.save_profile(GLOO_PAIR, _profile(2.0))
    (path,) = cache.glob("profile-*.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert profiles.load_profile(GLOO_PAIR) == _profile(2.0)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda path: path.write_text(json.dumps({"vector": [0.0] * len(_profile().vector())})),
        lambda path: path.write_bytes(b"\0" * 100),
        lambda path: path.write_text("[]"),
        lambda path: path.write_text('{"vector": 5}'),
        lambda path: path.write_text('{"vector": [1, 2]}'),
        lambda path: path.write_text("[" * 50_000),
        lambda path: path.write_text(_profile().to_json().replace("1e-05", "NaN", 1)),
        lambda path: path.write_text(_profile().to_json().replace("1e-05", "-1.0", 1)),
        lambda path: path.write_text(_profile().to_json().replace("1e-05", "true", 1)),
        lambda path: path.write_text(_profile().to_json().replace("1000000000.0", "0", 1)),
        lambda path: path.write_text(_profile().to_json().replace("0.7", "Infinity", 1)),
        lambda path: path.write_text(_profile().to_json().replace("0.7", "9" * 400, 1)),
        lambda path: path.write_text(_profile().to_json().replace("0.7", "9" * 5000, 1)),
        lambda path: path.write_text(_profile().to_json().replace("0.7", "1e400", 1)),
        lambda path: path.write_text(_profile().to_json().replace("0.7", '"0.7"', 1)),
        lambda path: path.write_bytes(_profile().to_json().encode().replace(b"0.7", b"\xff", 1)),
        lambda path: (path.unlink(), path.mkdir()),
        lambda path: os.chmod(path, 0o666),
    ],
)
def test_a_corrupt_or_unsafe_profile_is_measured_again(cache: Path, corrupt) -> None:
    """Before: all zeros raised ZeroDivisionError in every later run, a directory raised on rank
    0 only (the other ranks hung in the broadcast); now rank 0 warns and the group re-measures,
    and the fresh profile replaces a corrupt file."""
    profiles.save_profile(GLOO_PAIR, _profile())
    (path,) = cache.glob("profile-*.json")
    corrupt(path)
    with pytest.warns(UserWarning, match="measuring again"):
        assert profiles.load_profile(GLOO_PAIR) is None
    if path.is_file() and not stat.S_IMODE(path.stat().st_mode) & 0o022:
        profiles.save_profile(GLOO_PAIR, _profile(3.0))
        assert profiles.load_profile(GLOO_PAIR) == _profile(3.0)


def test_a_profile_that_cannot_be_cached_is_a_warning(cache: Path) -> None:
    profiles.save_profile(GLOO_PAIR, _profile())
    (path,) = cache.glob("profile-*.json")
    path.unlink()
    path.mkdir()
    with pytest.warns(UserWarning, match="could not cache"):
        profiles.save_profile(GLOO_PAIR, _profile())
    os.chmod(cache, 0o777)
    with pytest.warns(UserWarning, match="writable by group or others"):
        profiles.save_profile(GLOO_PAIR, _profile())


# ---------------------------------------------------------------------- issue 37 item 8
def _swap(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file of ``data`` (a rename, as an attacker racing the load would)."""
    other = path.with_name(".swap")
    other.write_bytes(data)
    os.chmod(other, 0o500)
    os.replace(other, path)


def test_the_loader_gets_the_bytes_that_were_hashed(cache: Path) -> None:
    """Before: the library was hashed, then reopened by path, so a rename in between loaded
    other bytes. Now the loader reads the descriptor that was hashed."""
    lib = built("codec", b"k", FakeCompiler())

    def racing_load(path: str) -> bytes:
        _swap(lib, b"lib:evil")
        return Path(path).read_bytes()

    assert kc.cached_build("codec", b"k", FakeCompiler(), racing_load) == b"lib:v1"
    assert lib.read_bytes() == b"lib:evil"  # (the name was swapped; the load was not)


def test_a_library_swapped_after_this_process_built_it_is_rebuilt(cache: Path) -> None:
    """Before: a library this process had built was returned again without re-hashing."""
    lib = built("codec", b"k", FakeCompiler())
    _swap(lib, b"lib:evil")
    cc = FakeCompiler(b"v2")
    again = kc.cached_build("codec", b"k", cc, lambda p: Path(p).read_bytes())
    assert again == b"lib:v2" and cc.calls == 1


def test_a_deeply_nested_record_means_a_rebuild(cache: Path) -> None:
    """Before: a record of 4,000 ``[`` let RecursionError escape."""
    built("codec", b"k", FakeCompiler())
    _record(cache).write_bytes(b"[" * 4000)
    cc = FakeCompiler(b"v2")
    assert built("codec", b"k", cc).read_bytes() == b"lib:v2" and cc.calls == 1


def test_a_root_in_a_parent_others_can_write_needs_the_sticky_bit(tmp_path, monkeypatch) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    monkeypatch.setenv(kc.ENV, str(parent / "cache"))
    os.chmod(parent, 0o777)
    with pytest.raises(kc.UnsafeCacheError, match="without the sticky bit"):
        kc.cache_dir()
    os.chmod(parent, 0o1777)  # as /tmp: others cannot rename what they do not own
    assert kc.cache_dir() == parent / "cache"


def test_a_root_that_is_a_symbolic_link(tmp_path, monkeypatch) -> None:
    """One's own link to a private directory is followed; another user's link is refused."""
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.setenv(kc.ENV, str(link))
    assert kc.cache_dir() == link
    if not AS_ROOT:
        return  # giving the link to another user needs root
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(kc.UnsafeCacheError, match=f"symbolic link of uid {NOBODY}"):
        kc.cache_dir()
