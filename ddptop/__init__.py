"""ddptop: a live monitor and launcher for PyTorch distributed training."""

__version__ = "0.1.0"
