"""Lightning, DDP strategy on CPU: a few steps of a small MLP; rank 0 saves the final
parameters to argv[1]. Run as is under torchrun, or under ``zipccl-run``: Lightning finds the
launcher's environment and joins its processes.
"""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 1))

    def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out: str) -> None:
    torch.manual_seed(0)
    model = Regression()
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=8))
    if trainer.global_rank == 0:
        torch.save(model.state_dict(), out)


if __name__ == "__main__":
    main(sys.argv[1])
