"""zipccl: lossless compression of LLM-training tensors and compressed collectives."""
from zipccl.codec import *  # noqa: F403  (codec API: compress, decompress, Compressed, ...)
from zipccl.collectives import *  # noqa: F403  (collectives: all_gather_into_tensor, ...)
from zipccl.hooks import *  # noqa: F403  (ddp_hook, ZipAllGather, ZipReduceScatter)
