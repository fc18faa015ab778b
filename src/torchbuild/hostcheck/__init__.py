"""`invoke host-check`: the benchmark host's tuning. Other features import only torchbuild.hostcheck.host (pyproject's import-linter contracts)."""
