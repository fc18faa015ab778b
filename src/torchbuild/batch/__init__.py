"""Slurm and PBS jobs: build jobs, rounds, spread, run jobs. Other features import only torchbuild.batch.host (pyproject's import-linter contracts)."""
