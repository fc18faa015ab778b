"""Invoke entry point: every task lives in torchbuild.tasks (`invoke --list`)."""

from torchbuild.tasks import ns

__all__ = ["ns"]
