"""Production-Triton timing on the GPU machine: kernels compiled here by Triton 3.8 (the version sglang 0.5.23's torch
2.14.1 installs, which cannot be carried to the GPU machine), launched there from their cubins.

The GPU machine has Triton 3.6, which lowers some operations very differently (``tl.histogram``: 3.6 one warp vote
per bin-index bit and a popcount per bin, 3.8 one shared-memory atomic per key; the top-k kernel's SASS is 2.7x
longer on 3.6), so timings taken there describe a compiler production does not run. This module closes the gap:

- ``build`` (here, Triton 3.8, no GPU): runs a workload's launchers with the same shapes as on the GPU, compiled for a
  fake target (``sparsemla.kernels.aot.compile_only``), and stores each distinct launch's cubin with what launching it
  takes: the specialisation key, the kernel parameters in order (non-constexpr arguments, then Triton 3.8's global
  and profile scratch pointers), threads, shared memory and scratch sizes (``manifest.json`` + ``*.cubin.gz``).
- ``replay`` (the GPU machine, Triton 3.6): within the block every ``kernel[grid](...)`` whose key is in the manifest
  is launched from its cubin through the CUDA driver (``cuModuleLoadData`` / ``cuLaunchKernel`` on torch's current
  stream, so CUDA-graph capture records it; a kernel compiled with ``num_ctas`` > 1 as clusters of that many CTAs
  through ``cuLaunchKernelEx``, as Triton launches it); a launch with no cubin raises instead of silently timing
  Triton 3.6.

Occupancy of another GPU (``Replayer(..., occupancy_of=dev.target("sm_89"))``): the mma.sync code that sm_80..sm_120
get runs on the H200, but an H200 SM holds 228 KB of shared memory where an sm_86/89/120 SM holds 100 KB, so a block
of 84 KB runs two per SM here and one there. With ``occupancy_of`` every replayed launch asks for more dynamic shared
memory than it uses, just enough that an H200 SM holds as many of its blocks as that target's SM would
(:func:`padded_shared`; ``Replayer.occupancy`` records per kernel the blocks per SM of the target and the ones the
driver reports for the padded launch). What stays the H200's: SM count, clocks, L2 and memory bandwidth.

Keys are computed by :func:`launch_key` on both sides from the call's own arguments (kernel name, constexpr values,
launch options, and per runtime argument the class Triton specialises on: dtype and 16-byte alignment of tensors,
ints equal to 1 / divisible by 16 / needing 64 bits), so the two Triton versions never have to agree on internals.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gzip
import hashlib
import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import torch
import triton

from sparsemla.kernels import device as dev

MANIFEST = "manifest.json"
GPU_TARGET = "sm_90"  # the GPU machine's (an H200): every code path's cubins are for it
_OPTIONS = ("num_warps", "num_stages", "maxnreg", "num_ctas")  # launch options that select a compile
_CTYPES = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
    "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float, "fp64": ctypes.c_double,
}  # fmt: skip


def _arg_class(value: object) -> object:
    """What Triton specialises a runtime argument on (the union over 3.6 and 3.8)."""
    if isinstance(value, torch.Tensor):
        return ["t", str(value.dtype), value.data_ptr() % 16 == 0]
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", value == 1, value % 16 == 0, not -(2**31) <= value < 2**31]
    if isinstance(value, float):
        return ["f"]
    if value is None:
        return ["n"]
    return ["?", type(value).__name__]


def _bind(fn: triton.JITFunction, args: tuple, kwargs: dict) -> dict[str, object]:
    """The call's arguments by parameter name (positional first, then keywords; launch options left out)."""
    names = fn.arg_names
    bound = dict(zip(names, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    return bound


def launch_key(fn: triton.JITFunction, args: tuple, kwargs: dict) -> str:
    """A stable key of one launch's compile: kernel name, constexpr values, launch options and the specialisation
    class of every runtime argument; for a kernel defined outside the package (an explore script's modified copy of a
    package module) also its module, so that copies of one kernel get cubins of their own."""
    bound = _bind(fn, args, kwargs)
    constexpr = {p.name for p in fn.params if p.is_constexpr}
    module = fn.fn.__module__
    desc = {
        "kernel": fn.fn.__name__ if module.startswith("sparsemla.") else f"{module}:{fn.fn.__name__}",
        "args": [[n, repr(bound.get(n)) if n in constexpr else _arg_class(bound.get(n))] for n in fn.arg_names],
        "options": {k: kwargs.get(k) for k in _OPTIONS if kwargs.get(k) is not None},
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:24]


def source_hash(fn: triton.JITFunction, cache: dict[str, str] | None = None) -> str:
    """sha256 (24 hex digits) of the file that defines ``fn``: a kernel whose module changed since its cubin was built
    gets rebuilt by :func:`build` and refused by the replay (the module holds the kernel and its jit helpers).
    ``cache``: per-kernel results of one build or replayer, so a launch does not read the file again."""
    name = f"{fn.fn.__module__}:{fn.fn.__qualname__}"
    if cache is None or name not in cache:
        digest = hashlib.sha256(Path(inspect.getsourcefile(fn.fn)).read_bytes()).hexdigest()[:24]
        if cache is None:
            return digest
        cache[name] = digest
    return cache[name]


def _entry(kernel: object, key: str) -> dict:
    """What launching a compiled (Triton 3.8) kernel takes, from its source signature and metadata."""
    md = kernel.metadata
    sig = kernel.src.signature
    params = [[name, ty] for name, ty in sig.items() if ty != "constexpr"]
    if any(isinstance(ty, tuple) or str(ty).startswith("tensordesc") for _, ty in params):
        raise ValueError(f"{md.name}: tuple or tensor-descriptor arguments are not supported by the replay")
    if md.launch_pdl or md.launch_cooperative_grid:
        raise ValueError(f"{md.name}: PDL and cooperative launches are not supported by the replay")
    clusters = {"num_ctas": md.num_ctas} if getattr(md, "num_ctas", 1) != 1 else {}  # a CTA cluster per program
    return {
        **clusters,
        "key": key, "name": md.name, "cubin": f"{key}.cubin.gz", "num_warps": md.num_warps, "shared": md.shared,
        "global_scratch": [md.global_scratch_size, md.global_scratch_align],
        "profile_scratch": [md.profile_scratch_size, md.profile_scratch_align], "params": params,
        "triton": triton.__version__, "target": f"{md.target.backend}:{md.target.arch}",
    }  # fmt: skip


def path_dir(root: Path, code_path: str) -> Path:
    """Where a benchmark's ``--build-cubins ROOT`` puts, and its ``--cubins ROOT`` finds, one code path's cubins."""
    return root / code_path


def missing(cubin_dir: Path) -> str | None:
    """Why ``cubin_dir`` cannot be replayed (no manifest), or None: what a benchmark's ``--cubins`` checks first."""
    if (cubin_dir / MANIFEST).is_file():
        return None
    return f"--cubins: no {MANIFEST} in {cubin_dir}"


def require(root: Path, code_paths: list[str]) -> None:
    """What a benchmark's ``--cubins ROOT`` checks before it touches the GPU: every code path it runs has its
    manifest; else the CLI stops (exit 2) saying which and how to make it."""
    from sparsemla.console import fail

    for code_path in code_paths:
        if why := missing(path_dir(root, code_path)):
            fail(why, f"make it with --build-cubins DIR --paths {code_path} on the build machine (no GPU)")


def path_info(code_path: str) -> tuple[dev.DeviceInfo, int]:
    """What the GPU machine's launchers see in ``code_path`` (``native``, or ``sm89``: TRITON_OVERRIDE_ARCH there),
    and the architecture its cubins are for: the GPU's own in every path (the override changes the code Triton emits,
    not the GPU that runs it)."""
    gpu = dev.target(GPU_TARGET)
    if code_path == "native":
        return gpu, gpu.arch
    return dev.running_as(gpu, dev.target(code_path).capability), gpu.arch


def _running_path() -> str:
    """This process's code path as the benchmarks name it: ``native`` or ``smNN`` (TRITON_OVERRIDE_ARCH, parsed by
    the device module's own rule)."""
    override = dev._override_arch()
    return "native" if override is None else f"sm{override[0]}{override[1]}"


def build(workload: Callable[[], object], out_dir: Path, code_path: str = "native") -> list[dict]:
    """Compile every launch ``workload()`` makes on the GPU machine in ``code_path`` (here, no GPU; ``sm89``: the
    mma.sync code Triton emits under TRITON_OVERRIDE_ARCH=sm89, as cubins for the GPU machine's sm_90) and add its
    cubin to ``out_dir``'s manifest. Returns the entries added by this call (a launch already in the manifest is kept
    once)."""
    from sparsemla.kernels import aot

    info, arch = path_info(code_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_file = out_dir / MANIFEST
    manifest = json.loads(manifest_file.read_text()) if manifest_file.exists() else {}
    if manifest and (manifest_path(manifest), compiler_version(manifest)) != (
        code_path,
        dev.version_tuple(triton.__version__),
    ):
        raise ValueError(
            f"{out_dir} holds the {manifest_path(manifest)} path's cubins of Triton "
            f"{'.'.join(map(str, compiler_version(manifest)))}: build the {code_path} path with Triton "
            f"{triton.__version__} into a folder of its own"
        )
    added: list[dict] = []
    sources: dict[str, str] = {}
    real_run = triton.JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202 - JITFunction.run's own signature
        kernel = real_run(self, *args, grid=grid, warmup=True, **kwargs)
        key = launch_key(self, args, kwargs)
        source = source_hash(self, sources)
        if manifest.get(key, {}).get("source") != source:  # new, or built from another version of its module
            (out_dir / f"{key}.cubin.gz").write_bytes(gzip.compress(kernel.asm["cubin"], mtime=0))
            manifest[key] = {**_entry(kernel, key), "code_path": code_path, "source": source}
            added.append(manifest[key])
        return kernel

    records: list = []
    with triton.knobs.runtime.scope():  # restores the knobs and their environment variables on exit
        # the code path's instruction selection (Triton reads override_arch when it parses a compile's options)
        triton.knobs.runtime.override_arch = None if code_path == "native" else code_path
        with aot.compile_only(code_path, info, "prod-cubins", records, compile_arch=arch):  # launches only compile
            inner = triton.JITFunction.run  # compile_only's own patch, restored for its exit
            triton.JITFunction.run = run
            try:
                workload()
            finally:
                triton.JITFunction.run = inner
    manifest_file.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return added


class _Driver:
    """The few CUDA driver calls the replay needs, through libcuda (torch has made the primary context current)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.functions: dict[str, ctypes.c_void_p] = {}

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise RuntimeError(f"{what} failed: CUDA error {rc} {(msg.value or b'').decode()}")

    def function(self, entry: dict, cubin: bytes, shared: int) -> ctypes.c_void_p:
        if entry["key"] not in self.functions:
            module, func = ctypes.c_void_p(), ctypes.c_void_p()
            self.check(self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
            self.check(self.lib.cuModuleGetFunction(ctypes.byref(func), module, entry["name"].encode()),
                       "cuModuleGetFunction")  # fmt: skip
            if shared > 49152:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                self.check(self.lib.cuFuncSetAttribute(func, 8, shared), "cuFuncSetAttribute")
            self.functions[entry["key"]] = func
        return self.functions[entry["key"]]

    def blocks_per_sm(self, func: ctypes.c_void_p, threads: int, shared: int) -> int:
        """The driver's count of blocks of ``func`` one SM holds (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        n = ctypes.c_int()
        occupancy = self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor
        self.check(occupancy(ctypes.byref(n), func, ctypes.c_int(threads), ctypes.c_size_t(shared)), "cuOccupancy")
        return n.value

    def launch(self, func: ctypes.c_void_p, grid: tuple[int, int, int], threads: int, shared: int,
               stream: int, params: list, num_ctas: int = 1) -> None:  # fmt: skip
        """``grid`` in programs; ``num_ctas`` > 1: each program is a cluster of that many CTAs along x (Triton's
        launch: ``gridDimX = grid x num_ctas`` with the cluster-dimension attribute, through ``cuLaunchKernelEx``)."""
        holders = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])
        if num_ctas == 1:
            self.check(self.lib.cuLaunchKernel(func, *(ctypes.c_uint(g) for g in grid), ctypes.c_uint(threads),
                                               ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(shared),
                                               ctypes.c_void_p(stream), holders, None), "cuLaunchKernel")  # fmt: skip
            return
        attr = _LaunchAttribute(id=_CLUSTER_DIMENSION)
        attr.value.cluster_dim[:] = (num_ctas, 1, 1)
        config = _LaunchConfig(grid[0] * num_ctas, grid[1], grid[2], threads, 1, 1, shared, ctypes.c_void_p(stream),
                               ctypes.pointer(attr), 1)  # fmt: skip
        self.check(self.lib.cuLaunchKernelEx(ctypes.byref(config), func, holders, None), "cuLaunchKernelEx")


_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (cuda.h)


class _LaunchAttributeValue(ctypes.Union):  # CUlaunchAttributeValue: a 64-byte union
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster_dim", ctypes.c_uint * 3)]


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: the id, padded to 8 bytes, then the value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]  # fmt: skip


@functools.cache
def physical_gpu(device: torch.device) -> dev.DeviceInfo:
    """The GPU itself (no ``dev.assume``, no ``TRITON_OVERRIDE_ARCH``): what the driver schedules blocks on."""
    props = torch.cuda.get_device_properties(device)
    return dev.DeviceInfo(
        (props.major, props.minor), props.shared_memory_per_block_optin, props.multi_processor_count,
        props.shared_memory_per_multiprocessor, props.name, props.max_threads_per_multi_processor,
    )  # fmt: skip


def occupancy_facts(target: dev.DeviceInfo, num_sms: int) -> dev.DeviceInfo:
    """What the launcher is given in a replay at ``target``'s occupancy (:class:`Replayer` ``occupancy_of``): that
    target's facts on the ``num_sms`` SMs of the GPU that runs it."""
    return replace(target, num_sms=num_sms, name=f"{target.name} on {num_sms} SMs")


def padded_shared(shared: int, threads: int, target: dev.DeviceInfo, real: dev.DeviceInfo) -> int:
    """The dynamic shared memory to launch a block of ``threads`` threads that uses ``shared`` bytes with, on
    ``real``, so that one of ``real``'s SMs holds no more such blocks than one of ``target``'s
    (:func:`sparsemla.kernels.device.resident_blocks`); ``shared`` itself where ``real`` holds no more anyway."""
    want = dev.resident_blocks(target, shared, threads)
    if want == 0:
        raise ValueError(f"a block of {threads} threads and {shared} B of shared memory does not fit {target.name}")
    if dev.resident_blocks(real, shared, threads) <= want:
        return shared
    return min(real.smem_per_block, real.smem_per_sm // want - dev.SMEM_RESERVED_PER_BLOCK)


def pack_params(entry: dict, bound: dict[str, object], scratch: list[int]) -> list:
    """The kernel's parameters as ctypes values, in the cubin's order: runtime arguments by the manifest's types,
    then the two scratch pointers."""
    out: list = []
    for name, ty in entry["params"]:
        value = bound[name]
        if ty.startswith("*"):
            out.append(ctypes.c_uint64(value.data_ptr() if isinstance(value, torch.Tensor) else int(value or 0)))
        elif ty in _CTYPES:
            out.append(_CTYPES[ty](value))
        else:
            raise ValueError(f"{entry['name']}: parameter {name} of type {ty} is not supported by the replay")
    return out + [ctypes.c_uint64(p) for p in scratch]


def compiler_version(manifest: dict) -> tuple[int, int]:
    """(major, minor) of the Triton that compiled a manifest's cubins (one version per folder); an empty manifest
    counts as the running one."""
    versions = {dev.version_tuple(e["triton"]) for e in manifest.values()}
    if len(versions) > 1:
        raise ValueError(f"cubins of several Triton versions in one folder: {sorted(versions)}")
    return versions.pop() if versions else dev.TRITON_VERSION


def manifest_path(manifest: dict) -> str:
    """The code path a manifest's cubins were built for (one per folder; entries from before paths were recorded are
    native)."""
    paths = {e.get("code_path", "native") for e in manifest.values()}
    if len(paths) > 1:
        raise ValueError(f"cubins of several code paths in one folder: {sorted(paths)}")
    return paths.pop() if paths else _running_path()


class Replayer:
    """Launches of ``kernels`` (kernel function names; None: all) from ``cubin_dir``'s cubins while entered (see the
    module docstring), other kernels as usual. Reusable: modules stay loaded and scratch buffers stay alive between
    entries (a captured CUDA graph may still use them), so a benchmark can enter it around every call it times.
    ``counts`` counts the replayed launches per kernel name. A replayed launch whose key has no cubin raises. While
    entered, ``device.TRITON_VERSION`` is the cubins' compiler's for every launcher (it is one global), so launchers
    whose choices depend on the compiler (the top-k's digit widths, the decode tile's axis order) make the launches
    that compiler was given -- also those of kernels outside ``kernels``, which then run on this machine's Triton with
    the other compiler's choices: replay every kernel whose launcher reads the version."""

    def __init__(self, cubin_dir: Path, kernels: set[str] | None = None,
                 occupancy_of: dev.DeviceInfo | None = None) -> None:  # fmt: skip
        self.cubin_dir, self.kernels, self.occupancy_of = cubin_dir, kernels, occupancy_of
        # kernel name -> [{"shared", "launched_shared", "unpadded_blocks_per_sm", "target_blocks_per_sm",
        # "blocks_per_sm"}] per loaded cubin (with occupancy_of; blocks_per_sm: the driver's, padded)
        self.occupancy: dict[str, list[dict]] = {}
        self.manifest = json.loads((cubin_dir / MANIFEST).read_text())
        self.compiler = compiler_version(self.manifest)
        self.code_path = manifest_path(self.manifest)
        if self.code_path != _running_path():
            raise ValueError(
                f"{cubin_dir} holds the {self.code_path} code path's cubins, this process runs {_running_path()}: "
                "replay each path's cubins in that path's process"
            )
        self.driver: _Driver | None = None  # created at the first launch (libcuda exists only on the GPU machine)
        self.counts: dict[str, int] = {}
        self.scratch_bufs: list[torch.Tensor] = []
        self._saved: list = []
        self._sources: dict[str, str] = {}

    def _run(self, fn: triton.JITFunction, real_run: Callable, args: tuple, grid: object, warmup: bool,
             kwargs: dict) -> None:  # fmt: skip
        key = launch_key(fn, args, kwargs)
        entry = self.manifest.get(key)
        if entry is None:
            raise KeyError(
                f"no Triton {'.'.join(map(str, self.compiler))} cubin for this launch of {fn.fn.__name__} (key {key}): "
                "build it first"
            )
        if entry.get("source") not in (None, source_hash(fn, self._sources)):
            raise RuntimeError(
                f"the cubin of {fn.fn.__name__} (key {key}) was built from another version of its module: rebuild it"
            )
        bound = _bind(fn, args, kwargs)
        g = grid(bound) if callable(grid) else grid
        g = (tuple(g) + (1, 1))[:3]
        if warmup:
            return
        device = next(v.device for v in bound.values() if isinstance(v, torch.Tensor))
        scratch = []
        for size, align in (entry["global_scratch"], entry["profile_scratch"]):
            if size > 0:
                ctas = g[0] * g[1] * g[2] * entry.get("num_ctas", 1)
                buf = torch.empty(ctas * size + align, dtype=torch.uint8, device=device)
                self.scratch_bufs.append(buf)
                scratch.append((buf.data_ptr() + align - 1) // align * align)
            else:
                scratch.append(0)
        if self.driver is None:
            self.driver = _Driver()
        threads, shared = 32 * entry["num_warps"], entry["shared"]
        if self.occupancy_of is not None:
            shared = padded_shared(shared, threads, self.occupancy_of, physical_gpu(device))
        fresh = entry["key"] not in self.driver.functions
        func = self.driver.function(entry, gzip.decompress((self.cubin_dir / entry["cubin"]).read_bytes()), shared)
        if fresh and self.occupancy_of is not None:
            # registers bound both GPUs alike (64K per SM), so the target holds min(its shared / threads / slots
            # limit, what this GPU's driver reports for the unpadded launch)
            here = self.driver.blocks_per_sm(func, threads, entry["shared"])
            self.occupancy.setdefault(entry["name"], []).append({
                "shared": entry["shared"], "threads": threads, "launched_shared": shared,
                "unpadded_blocks_per_sm": here,
                "target_blocks_per_sm": min(here, dev.resident_blocks(self.occupancy_of, entry["shared"], threads)),
                "blocks_per_sm": self.driver.blocks_per_sm(func, threads, shared),
            })  # fmt: skip
        stream = torch.cuda.current_stream(device).cuda_stream
        params = pack_params(entry, bound, scratch)
        self.driver.launch(func, g, threads, shared, stream, params, entry.get("num_ctas", 1))
        self.counts[entry["name"]] = self.counts.get(entry["name"], 0) + 1

    def __enter__(self) -> dict[str, int]:
        real_run = triton.JITFunction.run
        replayer = self

        def run(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202 - JITFunction.run's own signature
            if replayer.kernels is not None and self.fn.__name__ not in replayer.kernels:
                return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)
            return replayer._run(self, real_run, args, grid, warmup, kwargs)

        self._saved.append((real_run, dev.TRITON_VERSION))
        triton.JITFunction.run = run
        # launchers whose choices depend on the compiler (the top-k's digit widths) make the launches it was given
        dev.TRITON_VERSION = self.compiler
        return self.counts

    def __exit__(self, *exc: object) -> None:
        triton.JITFunction.run, dev.TRITON_VERSION = self._saved.pop()


@contextlib.contextmanager
def replay(cubin_dir: Path, kernels: set[str] | None = None,
           occupancy_of: dev.DeviceInfo | None = None) -> Iterator[dict[str, int]]:  # fmt: skip
    """Within the block, launches of ``kernels`` (None: all) run from ``cubin_dir``'s cubins (:class:`Replayer`; with
    ``occupancy_of``, padded to that GPU's blocks per SM); yields a dict counting the replayed launches per kernel."""
    with Replayer(cubin_dir, kernels, occupancy_of) as counts:
        yield counts


__all__ = [
    "Replayer", "build", "compiler_version", "launch_key", "manifest_path", "missing", "occupancy_facts",
    "pack_params", "padded_shared",
    "path_dir",
    "path_info", "replay", "require", "source_hash",
]  # fmt: skip
