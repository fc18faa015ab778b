"""`invoke bench`: torchbench against the built torch. Other features import only torchbuild.bench.step (pyproject's import-linter contracts)."""
