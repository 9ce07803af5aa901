"""2-GPU benchmark of zipccl's collectives against native NCCL, and a DDP training comparison.

Run from the repository root (``-m benchmarks.collectives``), one launch per transport (NCCL reads
its transport variables once per process group)::

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    torchrun --nproc-per-node 2 -m benchmarks.collectives sweep --transport nvlink --out OUT
    NCCL_P2P_DISABLE=1 torchrun ... sweep --transport shm --train --out OUT
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 torchrun ... sweep --transport socket --out OUT
    python -m benchmarks.collectives table OUT > OUT/tables.md

Where one compressed call's time goes: ``--skip-sweep --trace 256 --trace-ops all_gather
all_to_all`` prints rank 0's timeline of each (torch.profiler: the protocol's stages, runtime
calls over 20 us, every kernel and copy) and writes the chrome traces to OUT. ``--skip-sweep
--phases 256 512`` times its phases without a profiler (CUDA events: to the wire, the collective,
after it) beside native and the native collective of the compressed bytes, into
``OUT/phases-TRANSPORT.json``.

Host overhead of the native fast path and of the compressed protocol (``always``), and the
codec's fixed costs (``probe``: microseconds per call at each ``--kib``), on CPU with gloo (no GPU
needed)::

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 -m benchmarks.collectives overhead --out OUT
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 -m benchmarks.collectives probe --out OUT

For every op, per-rank size and data (BF16 N(0,1); real MiniLM BF16 weights from
``.data/minilm.npz`` tiled to size, rotated per rank so the ranks differ) the same process times
native torch.distributed, zipccl in ``auto`` and in ``always`` mode: median wall time around
device syncs after a barrier, speedup over native, and bytes each rank sent to other ranks
(zipccl's own count; native: the analytic count). Each zipccl result is checked against native
first (bit for bit for data moves; for reductions against the fp32 rank-order reference).

``overhead``: per-call wall time of small BF16 collectives (default 4 KiB, 64 KiB, 1 MiB per rank)
through torch.distributed directly, zipccl auto (default verification policy), zipccl auto with
``ZIPCCL_VERIFY=1`` and zipccl always (the compressed protocol), calls interleaved, median of
``--calls`` each; plus zipccl's own host time on the native path with the torch op stubbed out.
Host-side overhead only, not a GPU figure. ``--stub-codec`` replaces the CPU codec's kernels by
no-ops, so ``always`` shows the compressed protocol's own host cost rather than the torch codec's.

``--train`` then trains a small GPT (bf16 params, DDP, 200 steps) without and with
``zipccl.ddp_hook`` (twice, to show the zipccl runs repeat exactly) and records step times and
loss curves.

Modules: ``common`` (device, data, ops, reference results, interleaved timing), ``sweep`` (the
sweep and the codec's fixed costs), ``phases`` (``--trace`` and ``--phases``), ``overhead``,
``model`` (the GPT of ``--train``), ``report`` (``table``), ``__main__`` (the command line); CUDA
events come from ``benchmarks/timing.py``, shared with ``benchmarks/codec.py``.
"""
