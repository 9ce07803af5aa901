"""The name zipccl's torch.distributed backend answers to, below every module that uses it: the
registration (:mod:`zipccl._register`), the launcher's wrapping (:mod:`zipccl.wrap`) and the
backend itself (:mod:`zipccl.backend`). Imports nothing, so the registration can name the
backend while torch is still being imported."""

NAME = "zipccl"
