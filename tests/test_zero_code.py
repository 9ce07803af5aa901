"""zipccl with no edit to the training code: registration whatever the import order, the
zipccl-run launcher's wrapping of gloo/NCCL groups, the report of what zipccl did
(zipccl.stats, ZIPCCL_LOG), and a rank failing at group start making every peer raise.

Multi-process cases run in fresh interpreters (world 1 over a FileStore, or 2 ranks); each
waits far less than the process group's timeout, so a hang fails the test.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from zipccl import accounting, run, settings, wrap

TESTS = Path(__file__).parent
WAIT_S = 60  # any subprocess here: a hang fails the test (groups time out after 120 s)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZIPCCL_")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


# a process that leaves its group alive at exit may abort in gloo's threads' teardown
# ("terminate called without an active exception"), whatever zipccl did: end it first
_END = "\nimport torch.distributed as _d\nif _d.is_initialized(): _d.destroy_process_group()"


def _python(code: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    extra.setdefault("ZIPCCL_CACHE_DIR", str(tmp_path / "cache"))
    return subprocess.run(
        [sys.executable, "-c", code + _END],
        cwd=tmp_path,
        env=_env(**extra),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


WORLD_1 = (
    "import torch.distributed as dist;"
    "dist.init_process_group('zipccl', store=dist.FileStore('store', 1), rank=0, world_size=1);"
)


def test_import_zipccl_before_torch_registers_the_backend(tmp_path: Path) -> None:
    """Failed before: 'Device capability of zipccl unknown', then 'Unknown backend type'."""
    done = _python("import zipccl;" + WORLD_1 + "print(dist.get_backend())", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "zipccl"
    assert "capability" not in done.stderr


def test_backend_counts_its_calls(tmp_path: Path) -> None:
    code = (
        "import json, torch, zipccl;" + WORLD_1 + "x = torch.randn(4096).bfloat16();"
        "dist.all_reduce(x); dist.all_reduce(torch.ones(8, dtype=torch.int64));"
        "dist.broadcast(x, 0); print(json.dumps(zipccl.stats(reset=True).as_dict()));"
        "print(json.dumps(zipccl.stats().as_dict()))"
    )
    done = _python(code, tmp_path, ZIPCCL_MODE="always")
    assert done.returncode == 0, done.stderr
    report, after_reset = (json.loads(line) for line in done.stdout.splitlines())
    assert after_reset == {}
    bf16 = report["all_reduce/bfloat16"]
    assert (bf16["calls"], bf16["compressed"], bf16["bytes_in"]) == (1, 1, 8192)
    assert 0 < bf16["bytes_out"] < bf16["bytes_in"]  # random bf16 compresses (exponents)
    assert report["all_reduce/int64"]["not_compressed"] == {"dtype int64": 1}
    assert report["broadcast/bfloat16"]["compressed"] == 1


def test_small_tensors_stay_native_when_compression_is_forced(tmp_path: Path) -> None:
    """A loss scalar under ZIPCCL_MODE=always: a compressed piece's header alone (512 bytes)
    would outweigh it, so it goes native (and says why); the next size up compresses."""
    code = (
        "import json, torch, zipccl;" + WORLD_1 + "dist.all_reduce(torch.ones(1));"
        "dist.all_reduce(torch.randn(128));dist.all_reduce(torch.randn(4096).bfloat16());"
        "print(json.dumps(zipccl.stats().as_dict()))"
    )
    done = _python(code, tmp_path, ZIPCCL_MODE="always")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["all_reduce/float32"]["compressed"] == 0
    assert report["all_reduce/float32"]["not_compressed"] == {"size: at most 512 bytes": 2}
    assert report["all_reduce/float32"]["bytes_out"] == 4 + 512
    assert report["all_reduce/bfloat16"]["compressed"] == 1


def test_no_deprecated_torch_names_in_compressed_calls(tmp_path: Path) -> None:
    """Compressed all-gathers and reduce-scatters call torch's current names: under torch 2.13
    the tensor forms all_gather_into_tensor / reduce_scatter_tensor warn (FutureWarning) at
    every call, which here would be an error."""
    code = (
        "import warnings, torch, zipccl;" + WORLD_1.replace("'zipccl'", "'gloo'") + ""
        "warnings.simplefilter('error', FutureWarning);"
        "x = torch.randn(8192).bfloat16(); out = torch.empty_like(x);"
        "zipccl.all_gather_into_tensor(out, x); zipccl.reduce_scatter_tensor(out, x);"
        "zipccl.all_reduce(x); print(zipccl.collectives.STATS.strategy)"
    )
    done = _python(code, tmp_path, ZIPCCL_MODE="always")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["compressed"]


def test_zipccl_log_calls_and_summary(tmp_path: Path) -> None:
    code = "import torch, zipccl;" + WORLD_1 + "dist.all_reduce(torch.ones(8).bfloat16())"
    done = _python(code, tmp_path, ZIPCCL_MODE="never", ZIPCCL_LOG="calls")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("zipccl[")]
    assert "all_reduce bfloat16 16 B -> 16 B native (ZIPCCL_MODE=never)" in lines[0]
    assert lines[1].endswith("summary:")
    assert "not compressed: ZIPCCL_MODE=never (1)" in done.stderr


def test_record_and_report() -> None:
    accounting.reset_stats()
    accounting.record("all_gather", torch.bfloat16, "compressed", 1000, 700, 0.5)
    accounting.record("all_gather", torch.bfloat16, "native", 10, 10, 0.25, "switch: size/link")
    accounting.record("all_reduce", torch.float8_e4m3fn, "a2a_reduce", 40, 40, 0.0)
    report = accounting.stats(reset=True)
    ag = report.ops["all_gather", "bfloat16"]
    assert (ag.calls, ag.compressed, ag.bytes_in, ag.bytes_out) == (2, 1, 1010, 710)
    assert ag.seconds == 0.75
    assert ag.not_compressed == {"switch: size/link": 1}
    assert report.ops["all_reduce", "float8_e4m3fn"].not_compressed == {"a2a_reduce": 1}
    total = report.total()
    assert (total.calls, total.compressed, total.ratio) == (3, 1, 1050 / 750)
    assert "not compressed: a2a_reduce (1), switch: size/link (1)" in str(report)
    assert accounting.stats().ops == {}


@pytest.mark.parametrize(
    "bad", [("gather", 1, 1), ("all_gather", -1, 0), ("all_gather", 0, -1)], ids=str
)
def test_record_rejects_bad_input(bad: tuple[str, int, int]) -> None:
    op, bytes_in, bytes_out = bad
    with pytest.raises(ValueError, match=r"op must be one of|negative bytes"):
        accounting.record(op, torch.float32, "native", bytes_in, bytes_out, 0.0)


def test_native_bytes() -> None:
    n, w = 4096, 4
    assert accounting.native_bytes("all_gather", n, w) == n
    assert accounting.native_bytes("all_reduce", n, w) == n
    assert accounting.native_bytes("reduce_scatter", n, w) == 3 * n // 4
    assert accounting.native_bytes("all_to_all", n, w) == 3 * n // 4
    assert accounting.native_bytes("broadcast", n, w, is_source=False) == 0
    with pytest.raises(ValueError, match="op must be one of"):
        accounting.native_bytes("scatter", n, w)


def test_zipccl_log_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZIPCCL_LOG", "Summary")
    assert settings.value("ZIPCCL_LOG") == "summary"
    monkeypatch.setenv("ZIPCCL_LOG", "loud")
    with pytest.raises(ValueError, match="ZIPCCL_LOG must be one of"):
        settings.value("ZIPCCL_LOG")


@pytest.mark.parametrize(
    ("asked", "inner"),
    [
        ("gloo", {"cpu": "gloo", "cuda": "gloo"}),
        ("nccl", {"cuda": "nccl"}),
        ("cuda:nccl,cpu:gloo", {"cuda": "nccl", "cpu": "gloo"}),
        ("mpi", None),
        ("zipccl", None),
        ("cpu:gloo,cuda:zipccl", None),
    ],
)
def test_wrapped_backends(asked: str, inner: dict[str, str] | None) -> None:
    assert wrap.inner_backends(asked) == inner


def test_launcher_environment(tmp_path: Path) -> None:
    env = run.worker_env({"PYTHONPATH": f"/a{os.pathsep}{run.BOOT}"})
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert env["ZIPCCL_WRAP"] == "1"
    assert paths[:2] == [str(run.BOOT), "/a"] and paths.count(str(run.BOOT)) == 1
    assert (run.BOOT / "sitecustomize.py").is_file()
    done = subprocess.run(
        [sys.executable, "-m", "zipccl.run", "--env"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=WAIT_S,
    )
    assert done.stdout.startswith("export ZIPCCL_WRAP=1\nexport PYTHONPATH=")


def test_boot_folder_alone_on_the_path(tmp_path: Path) -> None:
    """No other sitecustomize to chain to: the interpreter starts cleanly, zipccl imported."""
    sw = str(Path(run.__file__).parent.parent)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import sys; print('zipccl' in sys.modules)"],
        cwd=tmp_path,
        env=_env(PYTHONPATH=os.pathsep.join([str(run.BOOT), sw])),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.stdout.strip() == "True"
    assert "Error in sitecustomize" not in done.stderr


@pytest.mark.parametrize("backend", ["", "gloo"], ids=["default", "gloo"])
def test_launcher_makes_the_scripts_groups_zipccl_ones(tmp_path: Path, backend: str) -> None:
    """An unmodified script under zipccl-run: its default group and new_group()s are zipccl
    groups reporting the names torch gives them; a sitecustomize it had still runs."""
    chain = tmp_path / "chain"
    chain.mkdir()
    (chain / "sitecustomize.py").write_text("import os; os.environ['PROBE_CHAINED'] = 'yes'\n")
    pythonpath = os.pathsep.join([str(chain), os.environ.get("PYTHONPATH", "")])
    out = tmp_path / "probe"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "zipccl.run", "--standalone", "--nproc-per-node", "2"),
            *(str(TESTS / "_zero_code_probe.py"), str(out)),
        ],
        cwd=tmp_path,
        env=_env(
            PYTHONPATH=pythonpath,
            PROBE_BACKEND=backend,
            ZIPCCL_MODE="always",
            ZIPCCL_CACHE_DIR=str(tmp_path / "cache"),
        ),
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in range(2):
        found = json.loads(Path(f"{out}.{rank}.json").read_text())
        asked = backend or "undefined"  # what plain torch reports for no backend
        assert (found["backend"], found["sub_backend"]) == (asked, asked)
        assert (found["name"], found["gloo_backend"]) == ("gloo", "gloo")
        assert found["zipccl"] == [True, True, True]
        assert found["sum_ok"] and found["chained"] == "yes"
        assert found["report"]["all_reduce/bfloat16"]["compressed"] == 2


@pytest.mark.parametrize("fault", ["plan", "inner"])
def test_a_rank_failing_at_start_makes_its_peer_raise(tmp_path: Path, fault: str) -> None:
    """Failed before (``plan``): rank 0 waited in the inner gloo group's connect until killed."""
    store = str(tmp_path / "store")
    procs = [
        subprocess.Popen(
            [sys.executable, str(TESTS / "_zero_code_start.py"), str(rank), store, fault],
            cwd=tmp_path,
            env=_env(ZIPCCL_CACHE_DIR=str(tmp_path / "cache")),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outs = [p.communicate(timeout=WAIT_S)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    (_, healthy), (_, failing) = (out.strip().split("|", 1) for out in outs)
    assert failing == "RuntimeError: injected start failure"
    assert healthy.startswith("PeerError: zipccl: the group could not start")
    assert "rank 1: RuntimeError: injected start failure" in healthy
