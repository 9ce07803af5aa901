"""zipccl: lossless compression of LLM-training tensors and compressed collectives."""
from zipccl.codec import *  # noqa: F403  (codec API: compress, decompress, Compressed, ...)
