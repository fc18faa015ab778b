"""Slurm and PBS jobs: build jobs, rounds, spread, run jobs, the multi-node check's job. Other features import only torchbuild.batch.host (pyproject's import-linter contracts)."""
