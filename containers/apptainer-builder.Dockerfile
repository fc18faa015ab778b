# The apptainer-builder image: Apptainer (with squashfs and FUSE tools) and torchbuild, for
# hosts without Apptainer. `invoke sif` converts a toolchain image to a SIF in it, and
# `invoke build --engine apptainer` runs SIFs with it. Apptainer is packaged in Debian sid.
ARG BASE_IMAGE=debian:sid
FROM ${BASE_IMAGE}

# Extra apt options, e.g. -o Acquire::Check-Valid-Until=false for snapshot mirrors.
ARG APT_OPTIONS=""

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Site CA certificates from the profile's ca_certificates (often none).
COPY certs/ /usr/local/share/ca-certificates/torchbuild/

# debootstrap and the archive keyrings: `invoke sif --from-recipe` with a debootstrap bootstrap.
# hadolint ignore=SC2086
RUN apt-get ${APT_OPTIONS} update \
 && apt-get ${APT_OPTIONS} install -y --no-install-recommends \
      apptainer squashfs-tools squashfuse fuse2fs fuse-overlayfs uidmap ca-certificates \
      debootstrap debian-archive-keyring ubuntu-keyring \
      python3 python3-venv \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && apptainer --version
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

# torchbuild (with spython) drives apptainer in here exactly as it does on an HPC node.
COPY torchbuild-src /opt/torchbuild-src
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install /opt/torchbuild-src \
 && /opt/venv/bin/torchbuild --version
ENV PATH=/opt/venv/bin:${PATH}
COPY apptainer-entrypoint.sh /usr/local/bin/torchbuild-as-caller
ENTRYPOINT ["/usr/local/bin/torchbuild-as-caller"]
CMD ["apptainer", "--version"]
