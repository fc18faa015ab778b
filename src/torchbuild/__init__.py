"""torchbuild: reproducible PyTorch source builds for HPC sites."""

__version__ = "0.1.0"
