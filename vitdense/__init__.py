"""vitdense: one Vision Transformer backbone, interchangeable Lightning tasks."""

__version__ = "0.1.0"
