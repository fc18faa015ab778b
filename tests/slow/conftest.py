"""The slow tests share the integration tests' fixtures (engine, test cache, local bases, sources, the one-node Slurm)."""

from integration.conftest import (
    arm64_base,
    debian_dsc,
    debian_torch_wheel,
    engine,
    local_base,
    nccl_sources,
    node_tmp,
    ofi_sources,
    sid_base,
    site_certs,
    slurm,
    test_cache,
    torch_image,
)

__all__ = [
    "arm64_base",
    "debian_dsc",
    "debian_torch_wheel",
    "engine",
    "local_base",
    "nccl_sources",
    "node_tmp",
    "ofi_sources",
    "sid_base",
    "site_certs",
    "slurm",
    "test_cache",
    "torch_image",
]
