"""What a build is made from: the profile (config) and what is derived from it (environment,
job plan, rendering), sources and patches, toolchain images and the Docker engine, SIFs and
recipes, locks, the companion table and NCCL's architectures. Imports only the core."""
