"""The slow tests share the integration tests' fixtures (engine, test cache, local bases)."""

from integration.conftest import arm64_base, engine, site_certs, test_cache

__all__ = ["arm64_base", "engine", "site_certs", "test_cache"]
