"""PyTorch's source: git / dir / tarball / .dsc fetch, the patch series. Other features import only torchbuild.source.fetch (pyproject's import-linter contracts)."""
