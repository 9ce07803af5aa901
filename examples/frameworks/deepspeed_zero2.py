"""DeepSpeed ZeRO stage 2 on CPU (``DS_ACCELERATOR=cpu``, gloo): a few steps of a small MLP;
rank 0 saves the final parameters to argv[1]. Run as is under torchrun, or under
``zipccl-run``: DeepSpeed joins the launcher's processes with its own ``init_distributed``.
"""

import sys

import deepspeed
import torch
from torch import nn

CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,
}


def main(out: str) -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=CONFIG
    )
    torch.manual_seed(1 + engine.global_rank)
    for _ in range(3):
        x = torch.randn(8, 64)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0:
        torch.save(model.state_dict(), out)


if __name__ == "__main__":
    main(sys.argv[1])
