"""ninfer: a single-GPU inference server for the Qwen3.5 model family."""

__version__ = "0.1.0"
