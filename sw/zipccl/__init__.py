"""zipccl: lossless compression of LLM-training tensors and compressed collectives."""
