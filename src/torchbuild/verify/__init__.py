"""Verify a wheel or an install: the step, the probe, upstream tests, the ranks' checks and their job. Other features import only torchbuild.verify.host (pyproject's import-linter contracts)."""
