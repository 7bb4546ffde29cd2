"""Local stand-ins for the base images Dockerfile and compose.yaml name, for machines that reach no registry.

The chain is three images, each tagged with a hash of its recipe, so a second run finds them in the engine's image
store and says "reusing" (change a Containerfile and only what depends on it is rebuilt):

1. ``localhost/sparsemla-standin/debian:bookworm-minbase-<key>``: ``debootstrap --variant=minbase`` from the Debian
   mirror, imported as an image (key: the debootstrap command line).
2. ``localhost/sparsemla-standin/python:<key>`` and ``localhost/sparsemla-standin/prometheus:<key>``: the
   Containerfiles of ``deploy/containers/`` on top of it (key: the Containerfile's bytes and the base tag).

Then :func:`build_ops_image` builds Dockerfile's ``sim`` target on the python stand-in through ``PYTHON_IMAGE``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sparsemla import __version__
from sparsemla.ops.containers.engine import CACHE_DIR, SETUP_HINT, ContainersError, Engine, Log

STANDIN_REPO = "localhost/sparsemla-standin"
STANDINS = ("python", "prometheus")  # deploy/containers/<name>.Containerfile


def _key(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class BaseRecipe:
    """The debootstrap command the base image comes from."""

    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"

    def argv(self, rootfs: Path) -> list[str]:
        return ["debootstrap", "--variant=minbase", self.suite, str(rootfs), self.mirror]

    @property
    def tag(self) -> str:
        return f"{STANDIN_REPO}/debian:{self.suite}-minbase-{_key(*self.argv(Path('ROOTFS')))}"


@dataclass(frozen=True)
class Standins:
    """Tags of the stand-in images, and which were found already built."""

    base: str
    python: str
    prometheus: str
    reused: dict[str, bool]


def upstream_images(repo: Path) -> dict[str, str]:
    """The images the stand-ins replace: Dockerfile's PYTHON_IMAGE default and compose.yaml's Prometheus."""
    dockerfile = (repo / "Dockerfile").read_text()
    python = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, flags=re.M)
    prometheus = re.search(r"^\s+image: (prom/prometheus:\S+)$", (repo / "compose.yaml").read_text(), flags=re.M)
    if python is None or prometheus is None:
        raise ContainersError("Dockerfile has no `ARG PYTHON_IMAGE=` or compose.yaml no prom/prometheus image")
    return {"python": python.group(1), "prometheus": prometheus.group(1)}


def containerfile(repo: Path, name: str) -> Path:
    if name not in STANDINS:
        raise ContainersError(f"no stand-in named {name!r}: the stand-ins are {', '.join(STANDINS)}")
    path = repo / "deploy" / "containers" / f"{name}.Containerfile"
    if not path.is_file():
        raise ContainersError(f"{path} is missing from the checkout")
    return path


def standin_tag(repo: Path, name: str, base_tag: str) -> str:
    return f"{STANDIN_REPO}/{name}:{_key(containerfile(repo, name).read_bytes(), base_tag)}"


def ensure_base(engine: Engine, log: Log, recipe: BaseRecipe = BaseRecipe()) -> tuple[str, bool]:
    """The base image's tag, and whether it was already built; debootstraps and imports it when it is not."""
    tag = recipe.tag
    if engine.image_exists(tag):
        log(f"reusing stand-in base {tag}")
        return tag, True
    if shutil.which("debootstrap") is None:
        raise ContainersError(f"debootstrap is not installed: {SETUP_HINT}")
    if os.geteuid() != 0:
        raise ContainersError("debootstrap needs root to build the stand-in base image: run as root")
    log(f"building stand-in base {tag} (debootstrap {recipe.suite} from {recipe.mirror})")
    start = time.monotonic()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="debootstrap-") as work:
        rootfs, tarball = Path(work) / "rootfs", Path(work) / "rootfs.tar"
        for argv in (recipe.argv(rootfs), ["tar", "-C", str(rootfs), "-cf", str(tarball), "."]):
            done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=900)
            if done.returncode != 0:
                raise ContainersError(f"`{' '.join(argv)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
        engine.run("import", str(tarball), tag, timeout=600)
    log(f"built stand-in base {tag} in {time.monotonic() - start:.0f} s")
    return tag, False


def ensure_standins(engine: Engine, log: Log) -> Standins:
    """Every stand-in, built only when its tag is missing from the image store."""
    if not engine.podman:
        raise ContainersError("the stand-ins are built with podman; with Docker use the registry images (--registry)")
    base, reused_base = ensure_base(engine, log)
    upstream = upstream_images(engine.repo)
    tags, reused = {}, {"base": reused_base}
    for name in STANDINS:
        tag = standin_tag(engine.repo, name, base)
        reused[name] = engine.image_exists(tag)
        if reused[name]:
            log(f"reusing stand-in for {upstream[name]}: {tag}")
        else:
            log(f"building stand-in for {upstream[name]}: {tag}")
            start = time.monotonic()
            path = containerfile(engine.repo, name)
            engine.build(tag, path.parent, path, build_args={"BASE": base})
            log(f"built {tag} in {time.monotonic() - start:.0f} s")
        tags[name] = tag
    return Standins(base=base, python=tags["python"], prometheus=tags["prometheus"], reused=reused)


def build_ops_image(engine: Engine, tag: str, log: Log, python_image: str | None = None) -> float:
    """Build Dockerfile's ``sim`` target into ``tag`` (on ``python_image`` when given); the seconds it took."""
    start = time.monotonic()
    log(f"building {tag} (Dockerfile target sim{f' on {python_image}' if python_image else ''})")
    output = engine.build(
        tag,
        engine.repo,
        engine.repo / "Dockerfile",
        build_args={"PYTHON_IMAGE": python_image} if python_image else None,
        target="sim",
        host_trust=True,  # its RUN steps download from PyPI
    )
    took = time.monotonic() - start
    cached = output.count("Using cache") + output.count("CACHED")
    log(f"built {tag} in {took:.0f} s ({cached} cached steps)")
    return took


@dataclass(frozen=True)
class Images:
    """What the checks run: the ops image (Dockerfile's sim target) and the Prometheus image compose gets."""

    ops: str
    ops_version: str  # the tag after `sparsemla-ops:`, compose's SPARSEMLA_VERSION
    prometheus: str | None  # the stand-in; None: compose.yaml's own (from its registry)
    standins: Standins | None
    build_s: float


def prepare_images(engine: Engine, registry: bool, log: Log) -> Images:
    """The stand-ins (unless ``registry``: then the bases come from their registries), then the ops image on them.

    The ops image gets a tag of its own (``sparsemla-ops:<version>-standins`` or ``-test``), never the one
    `docker compose build` gives, which a user's stack may be running."""
    standins = None if registry else ensure_standins(engine, log)
    version = f"{__version__}-{'test' if registry else 'standins'}"
    tag = f"sparsemla-ops:{version}"
    took = build_ops_image(engine, tag, log, standins.python if standins else None)
    return Images(tag, version, standins.prometheus if standins else None, standins, took)
