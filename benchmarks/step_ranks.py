"""The decode step on N ranks, flags off vs on: ``python -m benchmarks.step --ranks N --deployment tp|dp-attention``.

One process per GPU (torch.distributed, NCCL; gloo on the CPU for tests), started by :func:`launch` with an
environment built here: every process gets NVLink multicast off (:data:`MULTICAST_OFF`, the device notes' settings)
and refuses to start without it. The step and its collectives are :mod:`benchmarks.step_ranks_model`; a point
(flag state, B per rank, ctx) is captured and timed as in :mod:`benchmarks.step_run`, with a barrier before every
timed replay; the step time of a replay is the slowest rank's, and a point's ``us`` the median of those.

Kernel shares per rank: on GPUs one profiled replay per rank through :mod:`sparsemla.traces`, whose
``communication`` category holds NCCL's kernels (``ncclDevKernel_*`` / ``ncclKernel_*``; their time includes waiting
for the other ranks); on the CPU (gloo runs no CUDA kernels) one eager step with every collective timed by wall
clock: ``communication`` = the collectives' summed wall time, ``other`` = the rest of the step. The point's entry is
the slowest rank's, with every rank's categories under ``per_rank``.

Writes ``<out-dir>/ranks<N>-<deployment>-step-<gpu>-<date>.json`` (a name ``step-*.json`` globs do not match)::

    {"op": "step_ranks", "ranks", "deployment", "deployment_description", "backend": "nccl" | "gloo", "gpu",
     "git_sha", "date", "torch", "triton", "cuda", "nccl_version", "nccl_env", "topology", "cap", "model", "impl",
     "method", "collectives": {B: [{"name", "op", "per_step", "dtype", "bytes_per_call", "where"}]},
     "variant_rows": [{"variant", "B", "B_server", "ctx", "us", "per_rank_us", "slowest_rank", "reps", "mode",
                       "tok_s"}],
     "rows", "speedup", "kernel_share": {variant: {ctx: {B: {...slowest rank's entry, "slowest_rank", "per_rank"}}}},
     "skipped", "errors", "elapsed_s"}

``tok_s`` is the server's: B / step for TP (the ranks share the batch), N x B / step for DP attention.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import typer

from benchmarks.step_model import MAIN_VARIANTS, TINY, V4_FLASH, ModelShape, make_inputs, make_weights, weight_bytes
from benchmarks.step_ranks_model import DEPLOYMENTS, Comm, RankDecodeStep, collective_plan, plan_dicts, rank_shape
from benchmarks.step_run import Prepared, kernel_share, prepare, profile_step, time_one
from sparsemla import flags, traces
from sparsemla import variant as kernel_variant
from sparsemla.artifacts import write_json_atomic

app = typer.Typer(add_completion=False, help=__doc__)

# NVLink multicast off in NCCL, PyTorch and NVSHMEM (device notes, KINDS.md): a program using it can take a shared
# host's GPUs out of service. Every rank process is started with these and checks them before touching a GPU.
MULTICAST_OFF: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_", "GLOO_")
BATCHES = (1, 8, 32, 64)
CONTEXTS = (4096, 65536)
VARIANTS = tuple(MAIN_VARIANTS)  # flags off vs on
SPARSEMLA = kernel_variant.ALL_ON


class MulticastNotOff(RuntimeError):
    """A rank process was started without NVLink multicast switched off."""


def rank_env(rank: int, ranks: int, port: int, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The environment of rank ``rank``: this process's, the rendezvous, and :data:`MULTICAST_OFF` (last: no
    override can switch multicast back on)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank),
           "WORLD_SIZE": str(ranks), **(extra or {}), **MULTICAST_OFF}  # fmt: skip
    return flags.child_env(env)


def used_env() -> dict[str, str]:
    """The NCCL / gloo / NVSHMEM / symmetric-memory variables this process runs with; MulticastNotOff when a
    multicast-off setting is missing or different."""
    env = flags.child_env()
    wrong = {k: env.get(k) for k, v in MULTICAST_OFF.items() if env.get(k) != v}
    if wrong:
        raise MulticastNotOff(f"NVLink multicast must be off in every rank: expected {MULTICAST_OFF}, got {wrong}")
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def topology() -> dict[str, Any]:
    """``nvidia-smi topo -m`` output when it runs, else the reason."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"nvidia_smi_topo_m": None, "reason": "nvidia-smi not found"}
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"nvidia_smi_topo_m": None, "reason": f"nvidia-smi topo -m failed: {exc!r}"}
    if out.returncode != 0:
        return {"nvidia_smi_topo_m": None, "reason": f"nvidia-smi topo -m exited {out.returncode}: {out.stderr[-500:]}"}
    return {"nvidia_smi_topo_m": out.stdout, "reason": None}


def nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def result_name(ranks: int, deployment: str, gpu_slug: str, date: str) -> str:
    return f"ranks{ranks}-{deployment}-step-{gpu_slug}-{date}.json"


# -- per rank ----------------------------------------------------------------------------------------------------------
def cpu_share(step_us: float, records: list[tuple[str, float]]) -> dict[str, Any]:
    """The CPU (gloo) entry of one eager step: ``communication`` = the collectives' wall time, ``other`` = the rest;
    one kernel row per collective name (calls summed) and one for the compute."""
    comm: dict[str, list[float]] = {}
    for name, us in records:
        comm.setdefault(name, []).append(us)
    comm_us = sum(us for _, us in records)
    compute_us = max(step_us - comm_us, 0.0)
    total = comm_us + compute_us
    category_us = {c: 0.0 for c in traces.KERNEL_CATEGORIES}
    category_us["communication"], category_us[traces.OTHER] = comm_us, compute_us
    kernels = [{"name": f"gloo {n}", "category": "communication", "time_us": sum(v), "calls": len(v)}
               for n, v in sorted(comm.items())]  # fmt: skip
    kernels.append({"name": "cpu compute (eager torch)", "category": traces.OTHER, "time_us": compute_us, "calls": 1})
    return {
        "step_us": step_us,
        "total_us": total,
        "total_gpu_us": None,
        "timing": "CPU wall clock (gloo: no CUDA kernels); communication = summed collective wall time",
        "categories": {c: (v / total if total else 0.0) for c, v in category_us.items()},
        "category_us": category_us,
        "categories_sum_within_1pct": abs(sum(category_us.values()) - step_us) <= 0.01 * step_us,
        "collective_calls": {n: len(v) for n, v in sorted(comm.items())},
        "kernels": kernels,
        "files": [],
    }


def gpu_share(prepared: Prepared, step_us: float, trace_path: Path) -> dict[str, Any]:
    """One profiled replay on every rank (the eager step on every rank when any replay's trace shows almost no
    kernels, so that the ranks' collectives stay matched); the kernel-share entry."""
    path = profile_step(prepared.run, trace_path)
    summary = traces.summarize([path])
    flag = torch.tensor([1 if summary.total_us < 0.5 * step_us and prepared.eager is not None else 0], device="cuda")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    mode = prepared.mode
    if int(flag.item()) and prepared.eager is not None:
        summary, mode = traces.summarize([profile_step(prepared.eager, trace_path)]), "eager"
    return kernel_share(summary, step_us) | {"profiled": mode}


def timed_reps(prepared: Prepared, device: torch.device, target_s: float, min_reps: int, max_reps: int) -> list[float]:
    """µs of each timed run on this rank, a barrier before each; every rank runs the same count (rank 0's)."""
    dist.barrier()
    first = time_one(prepared, device)
    reps = torch.tensor([int(min(max_reps, max(min_reps, target_s * 1e6 // max(first, 1.0))))], device=device)
    dist.broadcast(reps, src=0)
    out = []
    for _ in range(int(reps.item())):
        dist.barrier()
        out.append(time_one(prepared, device))
    return out


def rank0_says(value: bool, device: torch.device) -> bool:
    """Rank 0's ``value`` on every rank (so that every rank takes the same branch around the collectives)."""
    t = torch.tensor([1 if value else 0], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def gather(obj: Any, ranks: int) -> list[Any]:
    got: list[Any] = [None] * ranks
    dist.all_gather_object(got, obj)
    return got


def point_row(variant: str, b: int, ctx: int, ranks: int, deployment: str, per_rank: list[list[float]],
              mode: str) -> dict[str, Any]:  # fmt: skip
    """The point's row: per replay the slowest rank's time, their median; per-rank medians."""
    slowest = [max(ts) for ts in zip(*per_rank, strict=True)]
    us = statistics.median(slowest)
    rank_us = [statistics.median(ts) for ts in per_rank]
    server_b = b * ranks if deployment == "dp-attention" else b
    return {"variant": variant, "B": b, "B_server": server_b, "ctx": ctx, "us": us, "min_us": min(slowest),
            "max_us": max(slowest), "per_rank_us": rank_us, "slowest_rank": max(range(ranks), key=rank_us.__getitem__),
            "reps": len(slowest), "mode": mode, "tok_s": server_b / (us * 1e-6)}  # fmt: skip


def point_share(entries: list[dict[str, Any]], rank_us: list[float]) -> dict[str, Any]:
    """The slowest rank's entry, with every rank's categories."""
    slow = max(range(len(entries)), key=rank_us.__getitem__)
    per_rank = [{"rank": r, "step_us": e["step_us"], "categories": e["categories"], "category_us": e["category_us"],
                 "categories_sum_within_1pct": e["categories_sum_within_1pct"]}
                for r, e in enumerate(entries)]  # fmt: skip
    return entries[slow] | {"slowest_rank": slow, "per_rank": per_rank}


def derived(variant_rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    rows = [{"B": r["B"], "ctx": r["ctx"], "provider": MAIN_VARIANTS[r["variant"]], "us": r["us"],
             "tok_s": r["tok_s"]} for r in variant_rows]  # fmt: skip
    cell = {(r["variant"], r["ctx"], r["B"]): r["us"] for r in variant_rows}
    speedup: dict[str, dict[str, float]] = {}
    for (v, ctx, b), us in cell.items():
        if v == kernel_variant.BASELINE and (SPARSEMLA, ctx, b) in cell:
            speedup.setdefault(str(ctx), {})[str(b)] = us / cell[(SPARSEMLA, ctx, b)]
    return sorted(rows, key=lambda r: (r["provider"], r["ctx"], r["B"])), speedup


def run_rank(
    *,
    base: ModelShape,
    deployment: str,
    device: torch.device,
    batches: tuple[int, ...],
    contexts: tuple[int, ...],
    cap: int,
    out_path: Path,
    trace_dir: Path | None,
    baseline_decode: Callable[..., Any],
    baseline_label: str,
    budget_s: float = 400.0,
    target_s: float = 1.0,
    min_reps: int = 3,
    max_reps: int = 20,
    sha: str = "unknown",
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """This rank's share of the run (the process group is initialised); rank 0 writes the JSON and returns it."""
    import triton

    from benchmarks.step import point_order

    rank, ranks = dist.get_rank(), dist.get_world_size()
    nccl_env = used_env()
    on_gpu = device.type == "cuda"
    t_start = time.perf_counter()
    shape = rank_shape(base, deployment, ranks)
    wgen = torch.Generator(device=device).manual_seed(seed + 1000 * rank)  # each rank its own shards
    layers, lm_head, final_norm = make_weights(shape, device, wgen)
    gpu = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    doc: dict[str, Any] = {
        "op": "step_ranks", "ranks": ranks, "deployment": deployment,
        "deployment_description": DEPLOYMENTS[deployment].format(n=ranks, h=shape.heads, e=shape.local_experts),
        "backend": dist.get_backend(), "gpu": gpu, "git_sha": sha,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
        "triton": triton.__version__, "cuda": torch.version.cuda or "none", "nccl_version": nccl_version(),
        "nccl_env": nccl_env, "topology": topology() if rank == 0 else None, "cap": cap,
        "model": {
            "name": "deepseek-ai/DeepSeek-V4-Flash" if base == V4_FLASH else "tiny (CPU smoke shape)",
            "num_layers": shape.num_layers, "indexer_layers": shape.indexer_layers,
            "compress_ratios": list(shape.compress_ratios),
            "shape": {k: getattr(base, k) for k in base.__dataclass_fields__},
            "rank_shape": {k: getattr(shape, k) for k in shape.__dataclass_fields__},
            "deployment": DEPLOYMENTS[deployment].format(n=ranks, h=shape.heads, e=shape.local_experts),
        },
        "impl": {"baseline_decode": baseline_label, "sparsemla_decode": "sparsemla.kernels.sparse_decode "
                 "(told the real heads under TP)", "collectives": f"torch.distributed ({dist.get_backend()})"},
        "method": (
            "one process per GPU; per point one CUDA graph of the whole step with its NCCL collectives, a barrier "
            "before each timed replay (CUDA events), step = the slowest rank's replay, median over replays; one "
            "replay profiled per rank (torch.profiler CUDA activity) -> kernel shares, NCCL kernels = communication"
            if on_gpu
            else "CPU/gloo harness run: eager steps timed with perf_counter, a barrier before each, step = the "
            "slowest rank's; one more eager step with every collective timed -> communication share"
        ),
        "collectives": {str(b): plan_dicts(collective_plan(shape, deployment, ranks, b)) for b in batches},
        "weight_bytes_per_step": {str(b): weight_bytes(shape, layers, lm_head, b) for b in batches},
        "variant_rows": [], "rows": [], "speedup": {}, "kernel_share": {}, "skipped": [], "errors": [],
    }  # fmt: skip
    for ctx, b in point_order(batches, contexts):
        if rank0_says(time.perf_counter() - t_start > budget_s, device):
            doc["skipped"].append({"B": b, "ctx": ctx, "variants": list(VARIANTS), "reason": "time budget"})
            continue
        igen = torch.Generator(device=device).manual_seed(seed + 7 + (rank if deployment == "dp-attention" else 0))
        inp = make_inputs(shape, b, ctx, cap, device, igen)
        for variant in VARIANTS:
            prepared = None
            try:
                comm = Comm(rank, ranks)
                step = RankDecodeStep(shape, layers, lm_head, final_norm, inp, variant, baseline_decode,
                                      deployment=deployment, comm=comm)  # fmt: skip
                prepared = prepare(step, device)
                mine = timed_reps(prepared, device, target_s, min_reps, max_reps)
                if on_gpu and trace_dir is not None:
                    name = f"ranks{ranks}-{deployment}-{variant.replace('+', '_')}-B{b}-ctx{ctx}-r{rank}.trace.json.gz"
                    entry = gpu_share(prepared, statistics.median(mine), trace_dir / name)
                elif not on_gpu:
                    comm.timed, comm.records = True, []
                    dist.barrier()
                    t0 = time.perf_counter()
                    step()
                    entry = cpu_share((time.perf_counter() - t0) * 1e6, comm.records)
                    comm.timed = False
                else:
                    entry = None
                per_rank, entries = gather(mine, ranks), gather(entry, ranks)
                row = point_row(variant, b, ctx, ranks, deployment, per_rank, prepared.mode)
                doc["variant_rows"].append(row)
                if entry is not None:
                    share = point_share(entries, row["per_rank_us"])
                    doc["kernel_share"].setdefault(variant, {}).setdefault(str(ctx), {})[str(b)] = share
                if rank == 0:
                    log(f"{deployment} x{ranks} {variant:<26} B={b:<3} ctx={ctx:<6} {row['us'] / 1e3:10.3f} ms "
                        f"(slowest rank {row['slowest_rank']}, {row['reps']} reps)")  # fmt: skip
            except Exception as exc:  # noqa: BLE001 -- one failing point must not lose the run
                doc["errors"].append({"variant": variant, "B": b, "ctx": ctx, "rank": rank, "error": repr(exc)[:2000]})
                log(f"rank {rank} {variant} B={b} ctx={ctx} FAILED: {exc!r}"[:400])
                raise
            finally:
                if prepared is not None:
                    prepared.release()
            doc["rows"], doc["speedup"] = derived(doc["variant_rows"])
            doc["elapsed_s"] = time.perf_counter() - t_start
            if rank == 0:
                write_json_atomic(out_path, doc, indent=1)
        del inp
    doc["rows"], doc["speedup"] = derived(doc["variant_rows"])
    doc["elapsed_s"] = time.perf_counter() - t_start
    if rank != 0:
        return None
    write_json_atomic(out_path, doc, indent=1)
    return doc


# -- processes ---------------------------------------------------------------------------------------------------------
def init_group(device_kind: str) -> torch.device:
    """Join the process group from the launcher's environment (NCCL on GPUs, gloo on the CPU); this rank's device."""
    env = flags.child_env()
    rank, ranks, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
    used_env()  # refuse before any GPU or communicator exists
    if device_kind == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", rank=rank, world_size=ranks, device_id=device)
        return device
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    return torch.device("cpu")


def launch(ranks: int, argv: list[str], extra_env: Mapping[str, str | None] | None = None,
           timeout_s: float | None = None) -> None:  # fmt: skip
    """Start ``ranks`` processes of ``python -m benchmarks.step_ranks argv`` (the worker) (rank r on GPU r) and wait for
    them; when one fails the others are stopped (they would wait in a collective) and RuntimeError says which."""
    if ranks < 2:
        raise ValueError("--ranks 1 is the single-rank step: run python -m benchmarks.step without --ranks")
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.step_ranks", *argv], env=rank_env(r, ranks, port, extra_env)
        )  # fmt: skip
        for r in range(ranks)
    ]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    failed: list[tuple[int, int | None]] = []
    try:
        while any(p.poll() is None for p in procs):
            failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or (deadline is not None and time.monotonic() > deadline):
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"rank processes failed (rank, exit status): {failed}")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


@app.command("worker")
def worker(
    deployment: str = typer.Option(..., help="tp | dp-attention."),
    out_path: Path = typer.Option(..., help="JSON rank 0 writes."),
    trace_dir: Path = typer.Option(Path("results/traces/step"), help="Per-rank chrome traces (GPU)."),
    batches: str = typer.Option(",".join(map(str, BATCHES)), help="Batch sizes per rank."),
    contexts: str = typer.Option(",".join(map(str, CONTEXTS)), help="Real context lengths."),
    cap: int = typer.Option(1 << 20, help="Server context length."),
    sglang_src: Path = typer.Option(Path(".gpu/sglang_src/flash_mla_sm120_triton.py"), help="sglang's decode."),
    budget_s: float = typer.Option(400.0, help="Stop starting new points after this many seconds."),
    reps: str = typer.Option("3,20", help="min,max timed replays per point."),
    target_s: float = typer.Option(1.0, help="Timed seconds per point (within the replay bounds)."),
    git_sha_: str = typer.Option("unknown", "--git-sha", help="Commit measured."),
    tiny: bool = typer.Option(False, help="CPU/gloo harness run at the tiny shape."),
) -> None:
    """One rank (started by the launcher; reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* from its environment)."""
    if tiny:
        torch.set_num_threads(1)  # the CPU run's ranks share the machine's cores
    device = init_group("cpu" if tiny else "cuda")
    try:
        if tiny:
            from sparsemla.kernels import sparse_decode

            base, baseline, label = TINY, sparse_decode, "fp32 reference (CPU harness run)"
        else:
            from benchmarks.step import sglang_decode

            base, baseline = V4_FLASH, sglang_decode(sglang_src)
            label = f"sglang 0.5.23 flash_mla_sparse_decode_triton ({sglang_src.name}), q padded to 64 heads under TP"
        lo, hi = _ints(reps)
        run_rank(base=base, deployment=deployment, device=device, batches=_ints(batches), contexts=_ints(contexts),
                 cap=cap, out_path=out_path, trace_dir=None if tiny else trace_dir, baseline_decode=baseline,
                 baseline_label=label, budget_s=budget_s, target_s=target_s, min_reps=lo, max_reps=hi,
                 sha=git_sha_)  # fmt: skip
    finally:
        dist.destroy_process_group()


def main(*, ranks: int, deployment: str, out_dir: Path, trace_dir: Path, batches: str, contexts: str, cap: int,
         sglang_src: Path, budget_s: float, sha: str, tiny: bool,
         extra_env: Mapping[str, str | None] | None = None) -> Path:  # fmt: skip
    """``python -m benchmarks.step --ranks N``: check the options, start the ranks, return the JSON written."""
    from benchmarks.indexer import gpu_slug

    if deployment not in DEPLOYMENTS:
        raise ValueError(f"unknown deployment {deployment!r}; choose from {', '.join(DEPLOYMENTS)}")
    if not tiny:
        if not torch.cuda.is_available() or torch.cuda.device_count() < ranks:
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise ValueError(f"--ranks {ranks} needs {ranks} CUDA GPUs, this machine has {have}")
        if not sglang_src.is_file():
            raise ValueError(f"sglang's decode source {sglang_src} is missing")
        gpu = gpu_slug(torch.cuda.get_device_name(0))
    else:
        gpu = "cpu"
    out = out_dir / result_name(ranks, deployment, gpu, _dt.date.today().isoformat())
    argv = ["--deployment", deployment, "--out-path", str(out), "--trace-dir", str(trace_dir), "--batches", batches,
            "--contexts", contexts, "--cap", str(cap), "--sglang-src", str(sglang_src), "--budget-s", str(budget_s),
            "--git-sha", sha]  # fmt: skip
    if tiny:
        argv += ["--tiny", "--reps", "1,2", "--target-s", "0"]
    launch(ranks, argv, extra_env)
    return out


if __name__ == "__main__":
    app()
