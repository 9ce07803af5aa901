"""torchtitan's llama3 debug model, unmodified, under ``zipccl-run`` and under plain ``torchrun``,
offline: every step's loss and gradient norm compared bit for bit, zipccl's report, a JSON
summary. On the GPU machine (no internet), from the repository root::

    PYTHONPATH=sw:. bash benchmarks/frameworks/torchtitan_h200.sh OUT

writes ``OUT/torchtitan.json`` (and each run's log, ``OUT/<run>.node<i>.log``; what it installs
and makes goes to ``--work``, by default a folder in the temporary directory); exit status 0
only if every comparison is equal and every zipccl run compressed calls. ``--cpu`` runs the
same on a machine without a GPU (gloo, a smaller batch, 3 steps), through
``torchtitan_on_cpu.py``.

Nothing is downloaded:

* packages: the wheels in ``.data/wheels`` (:data:`WHEELS`, fetched beforehand by
  :data:`DOWNLOAD`), installed with ``pip --no-index --no-deps --target WORK/site`` for the
  import names this Python lacks; Hugging Face ``datasets`` is replaced, where it is missing, by
  ``offline/datasets`` (its pyarrow alone outweighs the rest);
* data: a synthetic corpus of JSON lines (seeded pseudo-words) read as torchtitan's own
  ``c4_test`` dataset (``--training.dataset_path``);
* tokenizer: a byte-level BPE of 2,000 tokens trained on that corpus (``tokenizers``), with
  ``tokenizer_config.json`` naming its BOS/EOS, in ``--model.hf_assets_path``;
* config: torchtitan's debug model (``llama3`` ``debugmodel``) in a TOML written here, with
  ``--debug.seed`` and ``--debug.deterministic`` so that a rerun gives the same bits.

Runs (``ZIPCCL_LOG=summary``; the zipccl runs ``ZIPCCL_MODE=always``, so every float
collective of a group takes zipccl's compressed protocol where its size allows; ``--mode auto``
leaves it to zipccl's switch, and then compressed calls are not required):

* world 1: ``torchrun`` vs ``zipccl-run``, ``--nproc-per-node 1`` (torchtitan shards nothing
  then: only loss scalars cross the group, which zipccl keeps native);
* world 2, tensor parallel 2 (``--parallelism.tensor_parallel_degree 2
  --parallelism.data_parallel_shard_degree 1``: DTensor's all-reduces, all-gathers and
  reduce-scatters of activations and gradients), with two GPUs or ``--cpu``: ``torchrun`` vs
  ``zipccl-run``, ``--nproc-per-node 2``. With one GPU: two ranks on GPU 0, started as two
  one-process nodes on this host (so each has ``LOCAL_RANK`` 0, the device torchtitan picks);
  torchtitan asks NCCL for CUDA tensors and NCCL refuses two ranks on one GPU, so plain torchrun
  cannot run this; zipccl moves them through its host-staged gloo transport
  (``ZIPCCL_CUDA_TRANSPORT=gloo``), and the reference is the same launch with
  ``ZIPCCL_MODE=never`` (every call native on that transport);
* world 2, FSDP (torchtitan's default), only with two GPUs: ``torchrun`` vs ``zipccl-run``. Its
  gradient reduce-scatters use ``ReduceOp.PREMUL_SUM`` (torchtitan sets FSDP's gradient divide
  factor to 1), which gloo refuses -- plain gloo too -- and which zipccl leaves to NCCL: there
  zipccl compresses FSDP's all-gathers only.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent  # torchtitan_on_cpu.py
OFFLINE = HERE / "offline"  # the datasets stand-in
WHEELS = ROOT / ".data" / "wheels"
# import name -> wheel: what ``python -m torchtitan.train`` imports beyond torch, numpy and
# typing_extensions (torch's and zipccl's own requirements); datasets: offline/datasets
PACKAGES = {
    "torchtitan": "torchtitan",
    "torchdata": "torchdata",
    "tyro": "tyro",
    "docstring_parser": "docstring_parser",
    "typeguard": "typeguard",
    "tokenizers": "tokenizers",
    "tensorboard": "tensorboard",  # torchtitan imports torch.utils.tensorboard at start
    "google.protobuf": "protobuf",
    "absl": "absl_py",
}
DOWNLOAD = (
    "pip download --no-deps --only-binary=:all: --python-version 3.12 --platform "
    "manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .data/wheels "
    "torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.16 docstring_parser==0.18.0 typeguard==4.6.1 "
    "tokenizers==0.23.3 tensorboard==2.21.0 protobuf==7.36.2 absl-py==2.5.1"
)
STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+)")
TAGS = {"loss": "loss_metrics/global_avg_loss", "grad_norm": "grad_norm"}
TP2 = ["--parallelism.tensor_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "1"]

CONFIG = """\
[job]
dump_folder = "{dump}"
description = "llama3 debug model, offline (benchmarks/frameworks/torchtitan_h200.py)"

[metrics]
log_freq = 1
enable_tensorboard = true
disable_color_printing = true

[model]
name = "llama3"
flavor = "debugmodel"
hf_assets_path = "{tokenizer}"

[optimizer]
name = "AdamW"
lr = 8e-4
eps = 1e-8

[lr_scheduler]
warmup_steps = 2
decay_ratio = 0.8
decay_type = "linear"
min_lr_factor = 0.0

[training]
local_batch_size = {batch}
seq_len = {seq_len}
max_norm = 1.0
steps = {steps}
dataset = "c4_test"
dataset_path = "{data}"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1

[checkpoint]
enable = false

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"

[debug]
seed = 42
deterministic = true
"""


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package (google for google.protobuf)
        return False


def install(wheels: Path, site: Path) -> list[str]:
    """Install (no index, no dependencies) the wheels of the PACKAGES this Python lacks into
    ``site``, put it first on this process's path; the wheel files installed."""
    missing = [wheel for module, wheel in PACKAGES.items() if not _has(module)]
    files = []
    for wheel in missing:
        found = sorted(wheels.glob(f"{wheel}-*.whl"))
        if not found:
            raise SystemExit(f"no {wheel} wheel in {wheels}: fetch them first with\n  {DOWNLOAD}")
        files.append(found[-1])
    shutil.rmtree(site, ignore_errors=True)
    if files:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        subprocess.run([*pip, "--target", str(site), *map(str, files)], check=True)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return [f.name for f in files]


def make_corpus(folder: Path, documents: int = 2000, seed: int = 0) -> list[str]:
    """Seeded pseudo-text (a 3,000-word vocabulary of random letters) as JSON lines, the layout
    torchtitan's c4_test dataset reads; the texts."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(3000)]
    texts = [" ".join(rng.choices(words, k=rng.randint(50, 200))) for _ in range(documents)]
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    (folder / "c4_synthetic.json").write_text(lines)
    return texts


def make_tokenizer(folder: Path, texts: list[str]) -> None:
    """A byte-level BPE of 2,000 tokens (the debug model has 2,048 embeddings) with
    ``<|begin_of_text|>`` / ``<|end_of_text|>``, where torchtitan's HuggingFaceTokenizer reads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": special[0], "eos_token": special[1]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def read_scalars(dump: Path) -> dict[int, dict[str, str]]:
    """Step -> {loss, grad_norm} from the TensorBoard events rank 0 wrote under ``dump``, each
    float32 as its bit pattern in hex (TFRecord framing: length, CRC, Event, CRC)."""
    from tensorboard.compat.proto import event_pb2

    steps: dict[int, dict[str, str]] = {}
    for path in sorted(dump.glob("tb/**/events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                for name, tag in TAGS.items():
                    if value.tag == tag:
                        bits = struct.pack("<f", value.simple_value).hex()
                        steps.setdefault(event.step, {})[name] = bits
    return steps


def read_report(log: str, shown: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``ZIPCCL_LOG=summary``'s tables in ``log``: rank -> "op/dtype" (or "total") -> counts;
    their lines appended to ``shown``."""
    ranks: dict[str, dict[str, dict[str, Any]]] = {}
    table: dict[str, dict[str, Any]] | None = None
    for line in log.splitlines():
        head = re.search(r"zipccl\[rank (\d+)\] summary:", line)
        if head:
            table = ranks.setdefault(head.group(1), {})
            shown.append(line[head.start() :])
            continue
        cells = line.split()
        if table is None or not cells:
            continue
        shown.append(line)
        if cells[0] == "op":
            continue
        if cells[0] == "not":  # "not compressed: reason (n), ...": the table's last line
            table["not_compressed"] = {"reasons": line.split(":", 1)[1].strip()}
            table = None
        elif len(cells) in (7, 8) and cells[-6].isdigit():
            key = cells[0] if len(cells) == 7 else f"{cells[0]}/{cells[1]}"
            calls, compressed, mb_in, mb_out, ratio, seconds = cells[-6:]
            table[key] = {
                "calls": int(calls),
                "compressed": int(compressed),
                "mb_in": float(mb_in),
                "mb_out": float(mb_out),
                "ratio": float(ratio),
                "seconds": float(seconds),
            }
        else:
            shown.pop()
            table = None
    return ranks


def warm_kernels() -> float:
    """Build zipccl's CUDA kernels (nvcc, cached in ZIPCCL_CACHE_DIR) once, here, so that no run
    pays for the build inside its timeout, nor two ranks build at once; the seconds it took."""
    import torch
    import zipccl

    start = time.perf_counter()
    x = torch.randn(1 << 16, device="cuda").bfloat16()
    assert torch.equal(zipccl.decompress(zipccl.compress(x)), x)
    return round(time.perf_counter() - start, 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Runner:
    """Launches torchtitan (``-m torchtitan.train``, or the CPU wrapper) under a launcher."""

    def __init__(self, args: argparse.Namespace, work: Path, python_path: list[str]) -> None:
        self.args, self.work, self.out = args, work, args.out
        self.module = "torchtitan_on_cpu" if args.cpu else "torchtitan.train"
        self.python_path = python_path
        self.results: dict[str, dict[str, Any]] = {}

    def _env(self, zipccl: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZIPCCL_")}
        path = [*self.python_path, *env.get("PYTHONPATH", "").split(os.pathsep)]
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in path if p)
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        env.update(CUBLAS_WORKSPACE_CONFIG=":4096:8", OMP_NUM_THREADS="1")
        return {**env, "ZIPCCL_LOG": "summary", **zipccl}

    def run(
        self, name: str, launcher: str, world: int, nodes: int, flags: list[str], **zipccl: str
    ) -> None:
        """Run ``name`` on ``world`` ranks (``nodes`` > 1: that many one-process launches on this
        host) with torchtitan's ``flags``; record its steps, zipccl report and status."""
        dump = self.work / "dump" / name
        shutil.rmtree(dump, ignore_errors=True)  # the events read back must be this run's
        config = self.work / "configs" / f"{name}.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            CONFIG.format(
                dump=dump,
                tokenizer=self.work / "tokenizer",
                data=self.work / "data",
                batch=self.args.batch,
                seq_len=self.args.seq_len,
                steps=self.args.steps,
            )
        )
        titan = ["-m", self.module, "--job.config_file", str(config), *flags]
        if nodes == 1:
            shapes = [["--standalone", f"--nproc-per-node={world}"]]
        else:
            port = _free_port()
            master = ["--master-addr=127.0.0.1", f"--master-port={port}"]
            shapes = [
                [f"--nnodes={nodes}", f"--node-rank={i}", "--nproc-per-node=1", *master]
                for i in range(nodes)
            ]
        commands = [[sys.executable, "-m", launcher, *shape, *titan] for shape in shapes]
        start = time.perf_counter()
        logs = [self.out / f"{name}.node{i}.log" for i in range(nodes)]
        procs = [
            subprocess.Popen(
                c, cwd=ROOT, env=self._env(zipccl), stdout=log.open("w"), stderr=subprocess.STDOUT
            )
            for c, log in zip(commands, logs, strict=True)
        ]
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=self.args.timeout))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                codes.append(-9)
        text = "\n".join(log.read_text() for log in logs)
        steps = read_scalars(dump)
        printed = {int(m[0]): [m[1], m[2]] for m in STEP_LINE.findall(text)}
        report: list[str] = []
        self.results[name] = {
            "commands": [" ".join(c) for c in commands],
            "env": {k: v for k, v in zipccl.items()},
            "world": world,
            "returncodes": codes,
            "seconds": round(time.perf_counter() - start, 1),
            "steps": {str(k): v for k, v in sorted(steps.items())},
            "printed": {str(k): v for k, v in sorted(printed.items())},
            "zipccl": read_report(text, report),
            "logs": [log.name for log in logs],
        }
        status = "ok" if codes == [0] * nodes else f"FAILED {codes}"
        print(f"{name}: {status}, {len(steps)} steps, {self.results[name]['seconds']} s")
        if codes != [0] * nodes:
            print(text[-3000:])
        for line in report:
            print(f"  {line}")

    def compare(self, reference: str, zipped: str, compresses: bool = True) -> dict[str, Any]:
        """Whether ``zipped``'s steps equal ``reference``'s bit for bit, and that it ran zipccl:
        every rank printed zipccl's report, which shows compressed calls where ``compresses``
        (at world 1 torchtitan shards nothing: only its loss scalars cross a group)."""
        a, b = self.results[reference], self.results[zipped]
        same = bool(a["steps"]) and a["steps"] == b["steps"] and a["printed"] == b["printed"]
        compressed = [t.get("total", {}).get("compressed", 0) for t in b["zipccl"].values()]
        ok = same and len(compressed) == b["world"] and not any(a["returncodes"] + b["returncodes"])
        ok = ok and (min(compressed) > 0 if compresses else True)
        line = f"{zipped} vs {reference}: {'equal' if same else 'DIFFERENT'} over "
        print(line + f"{len(a['steps'])} steps; compressed calls per rank {compressed}")
        return {"reference": reference, "zipccl": zipped, "equal": same, "ok": ok}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--wheels", type=Path, default=WHEELS)
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "zipccl-torchtitan",
        help="installed packages, corpus, tokenizer, configs, TensorBoard events",
    )
    parser.add_argument("--cpu", action="store_true", help="no GPU: gloo, small, 3 steps")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument(
        "--timeout", type=int, default=120, help="seconds per run (a hang fails it)"
    )
    parser.add_argument("--mode", default="always", help="ZIPCCL_MODE of the zipccl runs")
    args = parser.parse_args(argv)
    small = {"steps": 3, "batch": 2, "seq_len": 128} if args.cpu else {}
    for key, value in {"steps": 10, "batch": 8, "seq_len": 512, **small}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.out, work = args.out.resolve(), args.work.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)

    installed = install(args.wheels, work / "site")
    stand_in = not _has("datasets")
    texts = make_corpus(work / "data")
    make_tokenizer(work / "tokenizer", texts)
    python_path = [str(work / "site"), *([str(OFFLINE)] if stand_in else [])]
    python_path += [str(HERE)] if args.cpu else []
    import torch

    gpus = 0 if args.cpu else torch.cuda.device_count()
    comparisons: list[dict[str, Any]] = []
    runner = Runner(args, work, python_path)
    summary = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "gpus": gpus,
        "cpu_smoke": args.cpu,
        "config": {"steps": args.steps, "batch": args.batch, "seq_len": args.seq_len},
        "zipccl_mode": args.mode,
        "wheels_installed": installed,
        "datasets": "offline/datasets stand-in" if stand_in else "installed datasets",
        "runs": runner.results,
        "comparisons": comparisons,
        "ok": False,
    }
    path = args.out / "torchtitan.json"

    def save() -> None:  # after every run: a run cut short by the caller's limit still reports
        path.write_text(json.dumps(summary, indent=1))

    save()
    summary["kernel_build_seconds"] = warm_kernels() if gpus else None
    plain, zipped = "torch.distributed.run", "zipccl.run"
    mode = {"ZIPCCL_MODE": args.mode}
    forced = args.mode == "always"  # else the switch may keep every call native
    # (reference, its launcher, the zipccl run, ranks, nodes, torchtitan's flags, settings,
    # whether the zipccl run must compress); a zipccl reference runs with ZIPCCL_MODE=never
    pairs: list[tuple[str, str, str, int, int, list[str], dict[str, str], bool]] = [
        ("world1_torchrun", plain, "world1_zipccl", 1, 1, [], {}, False),  # nothing sharded
    ]
    if gpus >= 2 or args.cpu:
        pairs.append(("tp2_torchrun", plain, "tp2_zipccl", 2, 1, TP2, {}, forced))
    elif gpus == 1:  # two one-process nodes on GPU 0
        staged = {"ZIPCCL_CUDA_TRANSPORT": "gloo"}
        shared = ("tp2_shared_gpu_native", zipped, "tp2_shared_gpu_zipccl", 2, 2, TP2)
        pairs.append((*shared, staged, forced))
    if gpus >= 2:
        pairs.append(("fsdp2_torchrun", plain, "fsdp2_zipccl", 2, 1, [], {}, forced))
    for reference, launcher, name, world, nodes, flags, extra, compresses in pairs:
        native = {"ZIPCCL_MODE": "never", **extra} if launcher == zipped else {}
        runner.run(reference, launcher, world, nodes, flags, **native)
        save()
        runner.run(name, zipped, world, nodes, flags, **mode, **extra)
        comparisons.append(runner.compare(reference, name, compresses))
        save()
    summary["ok"] = all(c["ok"] for c in comparisons)
    save()
    print(f"{'OK' if summary['ok'] else 'FAILED'}: {path}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
