"""podman or Docker, through their command lines: only what the checks need, each call one command.

podman runs with ``deploy/containers/containers.conf`` (``CONTAINERS_CONF``): these VMs refuse the open-files limit
podman asks for as root. Its compose is podman-compose from the tools venv ``scripts/containers-setup.sh`` makes.
Without systemd, podman runs no healthcheck on its own, so :meth:`Engine.health` runs the container's HEALTHCHECK
itself (``podman healthcheck run``); Docker runs them and reports the status.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparsemla import flags

ENGINES = ("podman", "docker")
CACHE_DIR = Path.home() / ".cache" / "sparsemla" / "containers"
TOOLS_VENV = CACHE_DIR / "tools"  # podman-compose (scripts/containers-setup.sh)
SETUP_HINT = "run `bash scripts/containers-setup.sh` (as root on Debian: podman, debootstrap, runc, podman-compose)"

# Files of the host that make the registries reachable from a build step: the CA bundle (this machine's egress
# re-signs TLS with its own CA; Debian's pip reads the system bundle) and pip's config (its `cert =` names that
# bundle for a pip that ships its own certifi). Mounted read-only into every RUN step by podman builds; they never
# land in a layer.
HOST_TRUST_FILES = (Path("/etc/ssl/certs/ca-certificates.crt"), Path("/etc/pip.conf"))

Log = Callable[[str], None]


class ContainersError(RuntimeError):
    """A prerequisite is missing or a step failed; the message says which and what to do."""


def repo_root(start: Path | None = None) -> Path:
    """The checkout holding ``Dockerfile`` and ``compose.yaml`` (the container checks build from its sources)."""
    here = (start or Path(__file__)).resolve()
    for folder in (here, *here.parents):
        if (folder / "Dockerfile").is_file() and (folder / "compose.yaml").is_file():
            return folder
    raise ContainersError(f"no checkout with Dockerfile and compose.yaml above {here}: run from the sparsemla repo")


@contextlib.contextmanager
def exclusive(log: Log, timeout: float = 1800.0) -> Iterator[None]:
    """One container check at a time on this machine: compose.yaml names its network, so two stacks would share it."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "lock", "w") as lock:
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ContainersError(f"another container check held {lock.name} for {timeout:.0f} s") from None
                if not waited:
                    log(f"another container check holds {lock.name}: waiting for it")
                    waited = True
                time.sleep(5)
        yield  # the lock goes with the file


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class Engine:
    """One container engine: ``podman`` (with this repo's containers.conf) or ``docker``."""

    name: str
    repo: Path

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise ContainersError(f"unknown engine {self.name!r}: use one of {', '.join(ENGINES)}")

    @property
    def podman(self) -> bool:
        return self.name == "podman"

    @property
    def containers_conf(self) -> Path:
        return self.repo / "deploy" / "containers" / "containers.conf"

    def env(self) -> dict[str, str]:
        return flags.child_env({"CONTAINERS_CONF": str(self.containers_conf)} if self.podman else None)

    def compose_argv(self) -> list[str]:
        if not self.podman:
            return [self.name, "compose"]
        local = TOOLS_VENV / "bin" / "podman-compose"
        found = str(local) if local.exists() else shutil.which("podman-compose")
        if found is None:
            raise ContainersError(f"podman-compose is not installed: {SETUP_HINT}")
        return [found]

    def require(self) -> None:
        """Fail with what to install when the engine (or its compose) is missing or cannot run a container."""
        if shutil.which(self.name) is None:
            hint = SETUP_HINT if self.podman else "install Docker Engine with the compose plugin"
            raise ContainersError(f"{self.name} is not installed: {hint}")
        if self.podman and not self.containers_conf.is_file():
            raise ContainersError(f"{self.containers_conf} is missing from the checkout")
        info = self.run("info", check=False, timeout=60)
        if info.returncode != 0 or "Cannot connect" in info.stderr:  # a Docker CLI without a daemon exits 0
            raise ContainersError(f"`{self.name} info` cannot reach the engine:\n{_tail(info.stderr, 5)}")
        if not self.podman and self.run("compose", "version", check=False, timeout=60).returncode != 0:
            raise ContainersError("`docker compose` is missing: install Docker's compose plugin")
        self.compose_argv()

    # -- commands ------------------------------------------------------------------------------------------------

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._exec([self.name, *args], timeout=timeout, check=check)

    def compose(
        self, args: Sequence[str], unset: Sequence[str] = (), timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The engine's compose; ``unset`` names variables removed from its environment (the shell's value of a
        variable wins over ``--env-file``)."""
        return self._exec([*self.compose_argv(), *args], timeout=timeout, check=check, unset=unset)

    def _exec(
        self, argv: list[str], timeout: float, check: bool, unset: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        env = flags.child_env(dict.fromkeys(unset), base=self.env())
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, errors="replace", timeout=timeout, env=env, cwd=self.repo
            )
        except FileNotFoundError:
            raise ContainersError(f"{argv[0]} is not installed: {SETUP_HINT}") from None
        except subprocess.TimeoutExpired:
            raise ContainersError(f"`{' '.join(argv[:4])} ...` did not finish within {timeout:.0f} s") from None
        if check and result.returncode != 0:
            raise ContainersError(
                f"`{' '.join(argv)}` exited {result.returncode}:\n{_tail(result.stdout)}\n{_tail(result.stderr)}"
            )
        return result

    # -- images --------------------------------------------------------------------------------------------------

    def image_exists(self, tag: str) -> bool:
        args = ("image", "exists", tag) if self.podman else ("image", "inspect", tag)
        return self.run(*args, check=False, timeout=60).returncode == 0

    def build(
        self,
        tag: str,
        context: Path,
        containerfile: Path,
        build_args: dict[str, str] | None = None,
        target: str | None = None,
        host_trust: bool = False,
    ) -> str:
        """Build ``containerfile`` into ``tag``; the engine's output (for the log). ``host_trust`` mounts
        HOST_TRUST_FILES into the RUN steps (podman): for builds that download from a registry over TLS, never for
        ones that install ca-certificates, whose package writes the very bundle the mount makes read-only."""
        argv = ["build", "-t", tag, "-f", str(containerfile)]
        if self.podman:
            # docker format: OCI images drop HEALTHCHECK. chroot isolation: RUN steps share the host's network
            # namespace (the registries are reachable without --network) and need no runtime.
            argv += ["--format", "docker", "--layers", "--isolation", "chroot"]
            argv += [f"--volume={f}:{f}:ro" for f in HOST_TRUST_FILES if host_trust and f.is_file()]
        for key, value in (build_args or {}).items():
            argv += ["--build-arg", f"{key}={value}"]
        if target:
            argv += ["--target", target]
        result = self.run(*argv, str(context), timeout=1200)
        return result.stdout + result.stderr

    def healthcheck_of(self, image: str) -> list[str]:
        """The HEALTHCHECK test the image carries (empty when it has none)."""
        fmt = "{{json .Config.Healthcheck}}"
        raw = self.run("image", "inspect", "--format", fmt, image, timeout=60).stdout.strip()
        check = json.loads(raw) if raw and raw != "null" else None
        return list((check or {}).get("Test") or [])

    # -- containers ----------------------------------------------------------------------------------------------

    def health(self, container: str) -> str:
        """``healthy``, ``unhealthy`` or ``starting``. podman runs the HEALTHCHECK now; Docker reports its last."""
        if self.podman:
            code = self.run("healthcheck", "run", container, check=False, timeout=120).returncode
            return {0: "healthy", 1: "unhealthy"}.get(code, "starting")
        fmt = "{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}"
        status = self.run("inspect", "--format", fmt, container, timeout=60).stdout.strip()
        if status == "none":
            raise ContainersError(f"{container} has no healthcheck")
        return status

    def wait_healthy(self, container: str, timeout: float, log: Log) -> float:
        """Seconds until ``container`` is healthy; raises with its last log lines when it is not in time."""
        start = time.monotonic()
        status = "starting"
        while time.monotonic() - start < timeout:
            if not self.running(container):
                break
            status = self.health(container)
            if status == "healthy":
                took = time.monotonic() - start
                log(f"{container}: healthy ({took:.1f} s)")
                return took
            time.sleep(1.0)
        logs = self.run("logs", "--tail", "30", container, check=False, timeout=60)
        state = "running" if self.running(container) else "not running"
        raise ContainersError(
            f"{container} is not healthy after {time.monotonic() - start:.0f} s ({status}, {state}):\n"
            f"{_tail(logs.stdout + logs.stderr, 30)}"
        )

    def running(self, container: str) -> bool:
        result = self.run("inspect", "--format", "{{.State.Running}}", container, check=False, timeout=60)
        return result.returncode == 0 and result.stdout.strip() == "true"

    def containers(self, *filters: str) -> list[str]:
        """Names of every container, running or not, matching all ``filters`` (``label=k=v``, ``network=name``)."""
        argv = ["ps", "-a", "--format", "{{.Names}}"]
        for item in filters:
            argv += ["--filter", item]
        return sorted(self.run(*argv, timeout=60).stdout.split())

    def remove(self, *containers: str) -> None:
        """Force-remove containers; missing ones are no error, one still there after a second try is.

        A container that podman created but could not start (its network setup failed) can survive the first
        ``rm -f`` (seen once: the next run's ``--name`` then collided with it), so the names are checked and retried."""
        for _ in range(2):
            if not containers:
                return
            result = self.run("rm", "-f", *containers, check=False, timeout=120)
            present = set(self.containers())
            containers = tuple(name for name in containers if name in present)
        if containers:
            raise ContainersError(
                f"`{self.name} rm -f {' '.join(containers)}` left them in place:\n{_tail(result.stderr)}"
            )
