"""HF Trainer: a few steps of a tiny GPT-2 built from a config (nothing downloaded) on random
tokens; rank 0 saves the final parameters to argv[1]. Run as is under torchrun, or under
``zipccl-run`` (the Trainer's own ``ddp_backend``, here gloo, becomes a zipccl group).
"""

import sys
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(out: str) -> None:
    config = GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(
            output_dir=scratch,
            max_steps=3,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            use_cpu=True,
            ddp_backend="gloo",
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(32, 16, 256))
        trainer.train()
        if trainer.is_world_process_zero():
            torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, out)


if __name__ == "__main__":
    main(sys.argv[1])
