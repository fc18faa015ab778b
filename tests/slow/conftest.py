"""The slow tests share the integration tests' fixtures (engine, test cache, local bases, the
toolchain images, sources, the one-node Slurm)."""

from integration.conftest import (
    arm64_base,
    cpu_image,
    cpu_sif,
    cuda_image,
    debian_dsc,
    debian_torch_wheel,
    engine,
    local_base,
    nccl_sources,
    node_tmp,
    ofi_sources,
    sid_base,
    sid_pythons_image,
    site_certs,
    site_overrides,
    slurm,
    test_cache,
    torch_image,
)

__all__ = [
    "arm64_base",
    "cpu_image",
    "cpu_sif",
    "cuda_image",
    "debian_dsc",
    "debian_torch_wheel",
    "engine",
    "local_base",
    "nccl_sources",
    "node_tmp",
    "ofi_sources",
    "sid_base",
    "sid_pythons_image",
    "site_certs",
    "site_overrides",
    "slurm",
    "test_cache",
    "torch_image",
]
