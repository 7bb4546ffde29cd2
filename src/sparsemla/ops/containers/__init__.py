"""The images built and run for real (`make test-containers`): ``Dockerfile``'s ``sim`` target and the compose
``sim`` profile, on podman or Docker.

* :mod:`.engine` — the few engine operations the checks need (build, run, health, remove, compose), podman or Docker.
* :mod:`.standins` — where no registry is reachable: local stand-ins for the base images (a debootstrap Debian, then
  Debian's python3.11 and prometheus on top), cached in the engine's image store under a hash of their recipe.
* :mod:`.checks` — the image check (healthcheck, endpoints, a 20 s load test) and the compose check (every service
  healthy, every Prometheus target up, Locust load, a kernel-share snapshot, every dashboard query with data).
* :mod:`.cli` — ``python -m sparsemla.ops.containers check|standins``.
"""
