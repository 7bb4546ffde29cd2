# syntax=docker/dockerfile:1
# sparsemla images. Two targets:
#   gpu (default, last stage): sglang 0.5.23 (CUDA 13) + this package; sglang loads the plugin through its
#       `sglang.srt.plugins` entry point in every process. No sglang fork, no patched files.
#       docker build -t sparsemla-sglang:0.1.0 .
#   sim: small CPU image with the simulator, the kernel-share exporter and the Locust load generator.
#       docker build --target sim -t sparsemla-ops:0.1.0 .
#
# Base images are pinned by tag. lmsysorg/sglang publishes releases as v<version>-cu130 (CUDA 13); to pin the digest
# as well, resolve it once and pass it in:
#   docker buildx imagetools inspect lmsysorg/sglang:v0.5.23-cu130 --format '{{json .Manifest.Digest}}'
#   docker build --build-arg SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-cu130@sha256:<digest> .
# Every kernel flag is off in the image; set them at run time (compose reads them from .env).
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-cu130
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# ---------------------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS sim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SGLANG_TORCH_PROFILER_DIR=/profiles \
    SPARSEMLA_RESULTS_DIR=/data
WORKDIR /app
COPY pyproject.toml ./
# The dependencies (base + ops + loadtest, read from pyproject.toml) in a layer of their own, so that a change under
# src/ or in the README rebuilds only the small install of the package below.
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
        x = p["optional-dependencies"]; print("\n".join(p["dependencies"] + x["ops"] + x["loadtest"]))' \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
# Everything but kernels/ and plugin/: they run inside sglang and import torch, which this image does not have, and
# the `sparsemla` CLI imports the commands of every installed area, so with them installed no command could start.
# /app keeps the sources for `locust -f /app/src/sparsemla/loadtest/locustfile.py`.
COPY README.md ./
COPY src/sparsemla/*.py ./src/sparsemla/
COPY src/sparsemla/ops ./src/sparsemla/ops
COPY src/sparsemla/loadtest ./src/sparsemla/loadtest
COPY src/sparsemla/dashboards ./src/sparsemla/dashboards
# The build fails unless every requirement is met and the CLI starts with the simulator's command.
RUN pip install --no-cache-dir --no-deps /app \
    && pip check \
    && sparsemla sim --help > /dev/null \
    && useradd --create-home --uid 10001 sparsemla \
    && mkdir -p /profiles /data /prom \
    && chown sparsemla:sparsemla /profiles /data /prom
USER 10001
EXPOSE 30000 9400 8089 9646
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30000/health', timeout=4)"]
CMD ["sparsemla", "sim", "--host", "0.0.0.0", "--port", "30000"]

# ---------------------------------------------------------------------------------------------------------------------
FROM ${SGLANG_IMAGE} AS gpu
ENV SGLANG_TORCH_PROFILER_DIR=/profiles \
    SPARSEMLA_DISABLE=0 \
    SPARSEMLA_MMA_DECODE=0 \
    SPARSEMLA_TRITON_INDEXER=0 \
    SPARSEMLA_STEP_METRICS=0
WORKDIR /opt/sparsemla
COPY pyproject.toml README.md ./
# The runtime only: what sglang's processes import (kernels, plugin, flags and the few modules they use). The ops
# tools (simulator, exporter, loadtest, dashboards) live in the sim image; tests/test_packaging.py builds the wheel
# from exactly these COPY lines and checks it.
COPY src/sparsemla/__init__.py src/sparsemla/cli.py src/sparsemla/console.py src/sparsemla/flags.py \
     src/sparsemla/metric_names.py src/sparsemla/variant.py ./src/sparsemla/
COPY src/sparsemla/kernels ./src/sparsemla/kernels
COPY src/sparsemla/plugin ./src/sparsemla/plugin
# Base dependencies only (typer, rich, prometheus-client); torch, triton and sglang come from the base image and must
# not be touched, which the check below proves: it fails the build if sglang cannot see the plugin.
RUN pip install --no-cache-dir . \
    && python3 -c "from importlib.metadata import entry_points; assert any(e.name == 'sparsemla' for e in entry_points(group='sglang.srt.plugins'))" \
    && mkdir -p /profiles
EXPOSE 30000
# /health runs a one-token generation; loading DeepSeek-V4 weights and capturing CUDA graphs takes many minutes.
HEALTHCHECK --interval=30s --timeout=30s --start-period=40m --retries=5 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:30000/health"]
CMD ["python3", "-m", "sglang.launch_server", "--host", "0.0.0.0", "--port", "30000", "--enable-metrics"]
