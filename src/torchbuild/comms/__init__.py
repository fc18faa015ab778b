"""NCCL and the aws-ofi-nccl plugin: host checks, the comms step. Other features import only torchbuild.comms.host (pyproject's import-linter contracts)."""
