#!/usr/bin/env bash
# `make test-containers`, first step: the container tools, installed only when missing (re-running changes nothing).
#   1. podman, debootstrap and runc (+ netavark, aardvark-dns: container networks with service names; iptables, which
#      netavark runs for every network and published port: podman only suggests it, and without it every `podman run`
#      fails with "netavark: No such file or directory") from Debian
#   2. podman-compose 1.6.0 from PyPI, in its own venv: ~/.cache/sparsemla/containers/tools (not the project's .venv)
#   3. a check that the project venv has the ops extras the checks import (its test modules skip without them)
# A tool that cannot be installed here is an error that says what to install: the container test never skips.
# Usage: scripts/containers-setup.sh [PYTHON for the tools venv] [the project venv's python]
set -euo pipefail

PYTHON="${1:-python3}"
PROJECT_PY="${2:-.venv/bin/python}"
TOOLS="${HOME}/.cache/sparsemla/containers/tools"
PODMAN_COMPOSE_VERSION=1.6.0
DEBIAN_PACKAGES=(podman debootstrap runc netavark aardvark-dns iptables)

say() { printf '\033[36m[containers-setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[containers-setup] error:\033[0m %s\n' "$*" >&2; exit 2; }

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        die "missing ${missing[*]}: install them (Debian, as root: apt-get install -y ${DEBIAN_PACKAGES[*]}); elsewhere see the container section of docs/deploy.md"
    fi
    say "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! "$TOOLS/bin/podman-compose" --version 2>/dev/null | grep -q "podman-compose version $PODMAN_COMPOSE_VERSION"; then
    say "installing podman-compose $PODMAN_COMPOSE_VERSION into $TOOLS"
    "$PYTHON" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip --disable-pip-version-check -q install "podman-compose==$PODMAN_COMPOSE_VERSION" 2>&1 \
        | grep -v 'is ignored' || true
fi
"$TOOLS/bin/podman-compose" --version >/dev/null || die "podman-compose did not install into $TOOLS"
"$PROJECT_PY" -c 'import grafana_foundation_sdk, httpx, locust' 2>/dev/null \
    || die "$PROJECT_PY lacks the ops and loadtest extras the container checks import: run \`make setup\`"
say "podman $(podman --version | awk '{print $3}'), $(debootstrap --version), runc $(runc --version | awk 'NR==1 {print $3}'), podman-compose $PODMAN_COMPOSE_VERSION"
