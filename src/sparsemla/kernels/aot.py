"""Ahead-of-time compile of every Triton kernel of the project for GPUs this machine does not have.

Triton compiles for a target it does not run on: :class:`_TargetDriver` makes the active driver report the target
(``GPUTarget("cuda", arch, 32)``), and while :func:`compile_only` is active every ``kernel[grid](...)`` launch compiles
(through the kernel's own launcher, so the launcher chooses the configuration that target gets from its
:class:`~sparsemla.kernels.device.DeviceInfo`) and returns without running. For each compiled kernel the record holds
``metadata.shared`` (the shared memory a block needs) and, from ``cuobjdump -res-usage`` (shipped in the Triton wheel)
on the cubin, registers per thread and spilled bytes per thread (stack frame + local memory).

With a SASS folder (``--sass DIR``) every compiled kernel's SASS (``cuobjdump -sass``, instruction addresses and
encodings stripped) is written there as ``<target>__<case>__<kernel>.sass``: a refactor that claims to change no
generated code is checked on a machine without a GPU by comparing two such folders (``diff -r``).

Must run in a process without ``TRITON_INTERPRET`` (the interpreter never compiles); ``python -m
sparsemla.kernels.aot`` is that process. The cases are the shapes sglang passes (see :func:`cases`).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase

from sparsemla.kernels import device as dev

SPILL_LIMIT = 256  # bytes per thread: more than this counts as a failure (local memory traffic on every tile)
# Fewer registers than this is a kernel Triton reduced to a trap (seen: Triton 3.8's tcgen05 lowering of a chunked
# 64-head V3.2 tile, REG 4 and no MMA); the smallest real kernel here, a split combine, takes 31.
MIN_REGISTERS = 16


@dataclass(frozen=True)
class KernelResources:
    """One compiled kernel of one case on one target."""

    target: str
    case: str
    kernel: str
    shared: int  # bytes per block (metadata.shared)
    budget: int  # the target's opt-in limit per block
    registers: int
    spilled: int  # bytes per thread: stack frame + local memory
    num_warps: int
    num_stages: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and self.shared <= self.budget
            and self.spilled <= SPILL_LIMIT
            and self.registers >= MIN_REGISTERS
        )

    def problem(self) -> str:
        if self.error:
            return self.error
        if self.shared > self.budget:
            return f"shared memory {self.shared} B > {self.budget} B"
        if self.spilled > SPILL_LIMIT:
            return f"spills {self.spilled} B per thread > {SPILL_LIMIT}"
        if self.registers < MIN_REGISTERS:
            return f"{self.registers} registers: a kernel reduced to a trap (< {MIN_REGISTERS})"
        return ""


class _TargetDriver(DriverBase):
    """A driver that reports ``arch`` as the current target and never launches. ``code_arch``: the architecture whose
    code is emitted for it (another one under ``override_arch``; it keys a per-device cache of its own)."""

    def __init__(self, arch: int, code_arch: int | None = None) -> None:
        self.arch, self.code_arch = arch, code_arch or arch

    @staticmethod
    def is_active() -> bool:
        return True

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", self.arch, 32)

    def get_current_device(self) -> int:
        return 1000 * self.code_arch + self.arch  # a key of its own in each kernel's per-device cache

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_device_interface(self):  # noqa: ANN201 - torch.cuda-like module; unused without a GPU
        return torch.cuda

    def get_benchmarker(self):  # noqa: ANN201
        raise RuntimeError("a compile-only target cannot benchmark")

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise RuntimeError("a compile-only target has no launcher")


def _cuobjdump() -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _cubin_tool(cubin: bytes, option: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(_cuobjdump()), option, f.name], capture_output=True, text=True, check=True).stdout


_SASS_NOISE = re.compile(r"/\*[0-9a-f]{4,}\*/|/\* 0x[0-9a-f]{16} \*/")  # instruction addresses and encodings


def cubin_sass(cubin: bytes) -> str:
    """The SASS of a cubin (``cuobjdump -sass``) with instruction addresses and encodings removed: one instruction or
    label per line, so two builds of the same code compare equal and a diff shows the instructions that changed."""
    lines = (_SASS_NOISE.sub("", line).rstrip() for line in _cubin_tool(cubin, "-sass").splitlines())
    return "\n".join(line for line in lines if line.strip()) + "\n"


def sass_file_name(target: str, case: str, kernel: str) -> str:
    """``<target>__<case>__<kernel>.sass`` with every character outside ``[A-Za-z0-9._+-]`` as ``_``."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", f"{target}__{case}__{kernel}") + ".sass"


def cubin_resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, spilled bytes per thread = STACK + LOCAL) of a cubin, from ``cuobjdump -res-usage``."""
    out = _cubin_tool(cubin, "-res-usage")
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if not m:
        raise RuntimeError(f"cuobjdump -res-usage printed no resource line: {out[-400:]}")
    reg, stack, _, local = (int(g) for g in m.groups())
    return reg, stack + local


@contextlib.contextmanager
def watch_launches(on_kernel: Callable[[str, object], None], compile_only: bool = False) -> Iterator[None]:
    """Within the block every ``kernel[grid](...)`` calls ``on_kernel(kernel name, compiled kernel)`` after its
    compile; with ``compile_only`` the launch stops there (Triton's warm-up path) instead of running."""
    real_run = triton.JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202 - JITFunction.run's own signature
        kernel = real_run(self, *args, grid=grid, warmup=warmup or compile_only, **kwargs)
        if hasattr(kernel, "metadata"):
            on_kernel(self.fn.__name__, kernel)
        return kernel

    triton.JITFunction.run = run
    try:
        yield
    finally:
        triton.JITFunction.run = real_run


@contextlib.contextmanager
def compile_only(
    name: str,
    info: dev.DeviceInfo,
    case: str,
    sink: list[KernelResources],
    sass_dir: Path | None = None,
    compile_arch: int | None = None,
) -> Iterator[None]:
    """Within the block, launches compile for ``info`` and append their resources to ``sink`` instead of running;
    with ``sass_dir`` each kernel's SASS goes there too (:func:`sass_file_name`; a kernel launched again in the same
    case gets ``.2.sass``, ``.3.sass`` ...). ``compile_arch`` (default ``info.arch``): the GPU the cubins are for, when
    ``info`` describes another architecture's code running on it (``device.running_as``; the caller sets Triton's
    ``override_arch``)."""
    seen: dict[str, int] = {}

    def record(kernel_name: str, kernel) -> None:  # noqa: ANN001 - a CompiledKernel
        reg, spilled = cubin_resources(kernel.asm["cubin"])
        if sass_dir is not None:
            seen[kernel_name] = seen.get(kernel_name, 0) + 1
            file = sass_file_name(name, case, kernel_name)
            if seen[kernel_name] > 1:
                file = file.removesuffix(".sass") + f".{seen[kernel_name]}.sass"
            (sass_dir / file).write_text(cubin_sass(kernel.asm["cubin"]))
        md = kernel.metadata
        sink.append(
            KernelResources(name, case, kernel_name, md.shared, info.smem_per_block, reg, spilled, md.num_warps,
                            md.num_stages)
        )  # fmt: skip

    drivers = triton.runtime.driver
    previous = drivers._active  # None on a machine without a GPU: reset_active() would try to create one
    drivers.set_active(_TargetDriver(compile_arch or info.arch, info.arch))
    try:
        with dev.assume(info), watch_launches(record, compile_only=True):
            yield
    finally:
        drivers._active = previous


# -- the cases: the shapes sglang passes ------------------------------------------------------------------------------
DECODE_BATCHES = (1, 8, 64, 128)
DECODE_HEADS = (8, 16, 64, 128)
DECODE_EXTRA_TOPK = (512, 2048)
INDEXER_BATCHES = (1, 64)
INDEXER_CONTEXTS = (4096, 65536)


def _decode_case(batch: int, heads: int, extra_topk: int) -> Callable[[], object]:
    from sparsemla.kernels.layouts import random_slots, random_v4_cache
    from sparsemla.kernels.sparse_decode.triton import sparse_decode_fwd

    def call() -> object:
        g = torch.Generator().manual_seed(0)
        main = random_v4_cache(1, 256, generator=g)  # one page: the compile needs shapes and strides, not volume
        extra = random_v4_cache(extra_topk // 64, 64, generator=g)
        q = torch.randn(batch, 1, heads, 512, generator=g).to(torch.bfloat16)
        idx = random_slots(batch, 128, main.num_slots, generator=g)
        idx_x = random_slots(batch, extra_topk, extra.num_slots, generator=g)
        lens = torch.full((batch,), extra_topk, dtype=torch.int32)
        return sparse_decode_fwd(
            q, main.k_cache, idx, topk_length=torch.full((batch,), 128, dtype=torch.int32),
            attn_sink=torch.randn(heads), extra_k_cache=extra.k_cache, extra_indices_in_kvcache=idx_x,
            extra_topk_length=lens,
        )  # fmt: skip

    return call


def _indexer_case(batch: int, ctx: int, fused: bool) -> Callable[[], object]:
    from sparsemla.kernels.indexer.triton import indexer_logits_fwd, indexer_logits_topk_fwd
    from sparsemla.kernels.layouts import IDX_PAGE, random_indexer_cache

    def call() -> object:
        g = torch.Generator().manual_seed(0)
        pages = ctx // IDX_PAGE
        cache = random_indexer_cache(2, generator=g)
        q = torch.randn(batch, 1, 64, 128, generator=g).to(torch.float8_e4m3fn)
        w = torch.rand(batch, 64, generator=g)
        lens = torch.full((batch,), ctx, dtype=torch.int32)
        table = torch.zeros(batch, pages, dtype=torch.int32)
        if fused:
            return indexer_logits_topk_fwd(q, cache, w, lens, table, 512, ctx)
        return indexer_logits_fwd(q, cache, w, lens, table, ctx)

    return call


def _topk_case(rows: int, cols: int, k: int, **options: int) -> Callable[[], object]:
    from sparsemla.kernels.indexer.topk import indexer_topk_fwd

    def call() -> object:
        logits = torch.randn(rows, cols)
        return indexer_topk_fwd(logits, torch.full((rows,), cols, dtype=torch.int32), k, **options)

    return call


PREFILL_TOKENS = (1024, 8192)
PREFILL_HEADS = (16, 64, 128)  # per rank: 128 / TP 8, 128 / TP 2, the whole model
PREFILL_TOPK = 2048


def _prefill_case(s_q: int, heads: int, topk: int, d_qk: int = 576, sink: bool = False) -> Callable[[], object]:
    from sparsemla.kernels.sparse_prefill.triton import sparse_prefill_fwd

    def call() -> object:
        # torch.empty: only shapes and strides reach the compiler, and an 8k-token q is 1.2 GB
        q = torch.empty(s_q, heads, d_qk, dtype=torch.bfloat16)
        kv = torch.empty(2 * s_q, 1, d_qk, dtype=torch.bfloat16)
        idx = torch.empty(s_q, 1, topk, dtype=torch.int32)
        lens = torch.empty(s_q, dtype=torch.int32)
        attn_sink = torch.empty(heads) if sink else None
        return sparse_prefill_fwd(q, kv, idx, d_qk**-0.5, 512, topk_length=lens, attn_sink=attn_sink)

    return call


def prefill_cases() -> dict[str, Callable[[], object]]:
    """Sparse prefill (``flash_mla_sparse_fwd`` contract): 1k / 8k-token chunks x 16 / 64 / 128 heads, top-k 2048,
    with topk_length as sglang passes it; plus d_qk 512 with a sink (the same entry without RoPE)."""
    out: dict[str, Callable[[], object]] = {}
    for s_q in PREFILL_TOKENS:
        for h in PREFILL_HEADS:
            out[f"sparse_prefill s_q{s_q} H{h} topk{PREFILL_TOPK}"] = _prefill_case(s_q, h, PREFILL_TOPK)
    out[f"sparse_prefill s_q8192 H64 topk{PREFILL_TOPK} d512 sink"] = _prefill_case(8192, 64, PREFILL_TOPK, 512, True)
    return out


DECODE_V32_CASES = (  # (kv_format, B, H, s_q): every branch of choose_v32_config, split and unsplit, MTP s_q=2
    ("fp8_656", 1, 16, 1),
    ("fp8_656", 2, 16, 1),
    ("fp8_656", 1, 128, 1),
    ("fp8_656", 64, 16, 1),
    ("fp8_656", 64, 128, 1),
    ("fp8_656", 128, 16, 1),
    ("fp8_656", 128, 128, 1),
    ("fp8_656", 1, 128, 2),
    ("fp8_656", 64, 128, 2),
    ("bf16_576", 1, 16, 1),
    ("bf16_576", 1, 128, 1),
    ("bf16_576", 64, 128, 1),
    ("bf16_576", 128, 16, 2),
)
DECODE_V32_TOPK = 2048


def _decode_v32_case(kv_format: str, batch: int, heads: int, s_q: int, gluon: str = "") -> Callable[[], object]:
    """``gluon`` ("sync" / "prefetch"): sm_90's Gluon tile (``V32Config.gluon``; with ``gluon_prefetch``)
    with the integer dequant, which the chooser does not pick (it takes the prefetching tile with cvt)."""
    from sparsemla.kernels.layouts import V32_DIM, V32_PAGE, v32_row_width
    from sparsemla.kernels.sparse_decode.triton_v32 import V32Config, sparse_decode_v32_fwd

    def call() -> object:
        # torch.empty: only shapes and strides reach the compiler
        dtype = torch.uint8 if kv_format == "fp8_656" else torch.bfloat16
        kv = torch.empty(4, V32_PAGE, 1, v32_row_width(kv_format), dtype=dtype)
        q = torch.empty(batch, s_q, heads, V32_DIM, dtype=torch.bfloat16)
        idx = torch.empty(batch, s_q, DECODE_V32_TOPK, dtype=torch.int32)
        lens = torch.empty(batch, dtype=torch.int32)
        cfg = V32Config(64, 64, 8, 1, True, gluon=True, gluon_prefetch=gluon == "prefetch") if gluon else None
        return sparse_decode_v32_fwd(q, kv, idx, V32_DIM**-0.5, kv_format=kv_format, topk_length=lens, config=cfg)

    return call


def decode_v32_cases(target: str | None = None) -> dict[str, Callable[[], object]]:
    """DeepSeek-V3.2 sparse decode (``sparse_decode_v32``): fp8_656 / bf16_576 caches, page 64, top-k 2048, 16 heads
    (TP 8) and 128, B 1 / 64 / 128, s_q 1 and 2 (MTP), with topk_length; for ``target`` sm_90 (or None: every case)
    also sm_90's Gluon tile at B 1 / 64, H 128."""
    out = {
        f"decode_v32 {fmt} B{b} H{h} topk{DECODE_V32_TOPK} s_q{s}": _decode_v32_case(fmt, b, h, s)
        for fmt, b, h, s in DECODE_V32_CASES
    }
    for gluon in ("sync", "prefetch") if target in (None, "sm_90") else ():  # sm_90's Gluon tile (V32Config.gluon)
        for b in (1, 64):  # split and unsplit
            out[f"decode_v32 fp8_656 B{b} H128 topk{DECODE_V32_TOPK} s_q1 gluon-{gluon}"] = _decode_v32_case(
                "fp8_656", b, 128, 1, gluon
            )
    return out


def cases(target: str | None = None) -> dict[str, Callable[[], object]]:
    """Case name -> a call of the public launcher at that shape (CPU tensors; only shapes and strides matter); with
    ``target``, the cases that target has (a tile only one target runs is compiled there only)."""
    out: dict[str, Callable[[], object]] = {}
    for b in DECODE_BATCHES:
        for h in DECODE_HEADS:
            for k in DECODE_EXTRA_TOPK:
                out[f"decode B{b} H{h} topk128+{k}"] = _decode_case(b, h, k)
    for k in DECODE_EXTRA_TOPK:  # 6 64-head programs: sm_90's wgmma tile with V halves (5 - 7, see SM90_MMA_BUSY)
        out[f"decode B3 H128 topk128+{k}"] = _decode_case(3, 128, k)
    for b in INDEXER_BATCHES:
        for ctx in INDEXER_CONTEXTS:
            out[f"indexer_logits B{b} ctx{ctx // 1024}k"] = _indexer_case(b, ctx, fused=False)
            out[f"indexer_fused_top512 B{b} ctx{ctx // 1024}k"] = _indexer_case(b, ctx, fused=True)
    for rows, cols in ((1, 4096), (8, 65536), (64, 16384), (256, 65536)):  # 8 rows: the 8-warp split launch
        for k in (512, 2048):
            out[f"topk{k} rows{rows} cols{cols // 1024}k"] = _topk_case(rows, cols, k)
    for k in (512, 2048):  # the spans in shared memory (topk_smem, Gluon), position order
        out[f"topk{k} rows64 cols64k smem"] = _topk_case(64, 65536, k, smem=True, sorted=False)
    # position order by default: the length split (LENGTH_SPLIT) where smem_spans
    out["topk2048 rows64 cols64k by-position"] = _topk_case(64, 65536, 2048, sorted=False)
    out.update(prefill_cases())
    out.update(decode_v32_cases(target))
    return out


def compile_target(name: str, selected: list[str] | None = None, sass_dir: Path | None = None) -> list[KernelResources]:
    """Compile every case (or the ``selected`` ones) for target ``name`` (SASS to ``sass_dir`` when given, see
    :func:`compile_only`); a case that fails to compile is a record with its error, never an exception."""
    info = dev.target(name)
    records: list[KernelResources] = []
    for case, call in cases(dev.target_name(name)).items():
        if selected and case not in selected:
            continue
        before = len(records)
        try:
            with compile_only(name, info, case, records, sass_dir):
                call()
        except Exception as exc:  # noqa: BLE001 - the record carries the compiler's reason
            msg = f"{type(exc).__name__}: {exc}".strip().splitlines()
            reason = next((line for line in reversed(msg) if line.strip()), "compile failed")[:300]
            records.append(KernelResources(name, case, "?", 0, info.smem_per_block, 0, 0, 0, 0, reason))
        if len(records) == before:
            records.append(KernelResources(name, case, "?", 0, info.smem_per_block, 0, 0, 0, 0, "no kernel launched"))
    return records


def markdown(records: list[KernelResources], triton_version: str) -> str:
    """docs/portability.md: per case and kernel, each target's shared bytes / registers / spilled bytes."""
    targets = list(dict.fromkeys(r.target for r in records))
    cell: dict[tuple[str, str], dict[str, KernelResources]] = {}
    for r in records:
        cell.setdefault((r.case, r.kernel), {})[r.target] = r
    budgets = " / ".join(f"{t} {dev.target(t).smem_per_block:,} B" for t in targets)
    lines = [
        "# Portability: every kernel compiled for every target",
        "",
        f"Generated by `sparsemla aot --markdown docs/portability.md` (Triton {triton_version}, ahead of time, no GPU:",
        '`GPUTarget("cuda", arch, 32)`; shared memory is `metadata.shared`, registers and spilled bytes per thread',
        "(stack frame + local memory) come from `cuobjdump -res-usage` on the cubin). `make test` recompiles all of",
        f"it and fails on a kernel that does not compile, exceeds its target's budget or spills over {SPILL_LIMIT} B.",
        f"Budgets per block: {budgets}.",
        "",
        "Cell: shared bytes / registers / spilled bytes. Decode shapes: B requests x H heads, 128 SWA + 512 or 2048",
        "extra indices; each launcher chose its configuration from the target's `DeviceInfo`.",
        "",
        "| case | kernel | " + " | ".join(targets) + " |",
        "|---|---|" + "---|" * len(targets),
    ]
    for (case, kernel), per in cell.items():
        cells = []
        for t in targets:
            r = per.get(t)
            if r is None:
                cells.append("-")
            elif r.error:
                cells.append("does not compile")
            else:
                mark = "" if r.ok else " **over**"
                cells.append(f"{r.shared:,} / {r.registers} / {r.spilled}{mark}")
        lines.append(f"| {case} | `{kernel}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m sparsemla.kernels.aot [--arch sm_120 ...] [--json PATH] [--sass DIR]``: compile, print, optionally
    write JSON and the SASS.
    Exit 1 when any kernel fails to compile, exceeds its shared-memory budget or spills more than SPILL_LIMIT."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--arch", action="append", help="target (sm_80 ... sm_120); repeatable; default: all six")
    parser.add_argument("--case", action="append", help="only these cases (names as printed)")
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument("--markdown", type=Path, help="write the docs/portability.md table here")
    parser.add_argument("--sass", type=Path, help="write each kernel's SASS into this folder (compare with diff -r)")
    args = parser.parse_args(argv)
    if args.sass:
        args.sass.mkdir(parents=True, exist_ok=True)
    names = [dev.target_name(a) for a in args.arch or list(dev.TARGETS)]
    records: list[KernelResources] = []
    for name in names:
        t0 = time.time()
        records += compile_target(name, args.case, args.sass)
        print(f"[aot] {name}: {time.time() - t0:.0f} s", file=sys.stderr)
    for r in records:
        status = "ok" if r.ok else f"FAIL {r.problem()}"
        print(
            f"{r.target:7} {r.case:36} {r.kernel:34} smem {r.shared:7} reg {r.registers:3} spill {r.spilled:4} {status}"
        )
    if args.json:
        payload = {"triton": triton.__version__, "spill_limit": SPILL_LIMIT, "records": [asdict(r) for r in records]}
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(records, triton.__version__))
    return 0 if all(r.ok for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
