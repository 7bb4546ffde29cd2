"""Device facts the kernels' launch configurations depend on, in one frozen record per GPU.

Every launcher's configuration is a pure function of a :class:`DeviceInfo` and the call's shapes: nothing else is read
at launch time, so a launch stays CUDA-graph safe, and a test (or the ahead-of-time compile check in
:mod:`sparsemla.kernels.aot`) can hand it another GPU's facts with :func:`assume`.

What the targets allow (CUDA programming guide, compute-capability tables):

    target   GPUs                                   shared memory per block (opt-in)   MMA Triton emits   e4m3 type
    sm_80    A100, A800                             166,912 B                          mma.sync           no
    sm_86    A10, A40, RTX 3090                     101,376 B                          mma.sync           no
    sm_89    L40S, L20, L4, RTX 4090                101,376 B                          mma.sync           yes
    sm_90    H100, H200, H800                       232,448 B                          wgmma              yes
    sm_100   B200, GB200                            232,448 B                          tcgen05            yes
    sm_120   RTX PRO 6000 Blackwell, RTX 5090       101,376 B                          mma.sync           yes

It is also the one place that decides which implementation a public op runs (:func:`select_backend`: the torch
reference, the Triton kernels on Triton's CPU interpreter, or on the GPU) and whether Triton is interpreting
(:func:`interpreting`; launchers configure through :func:`launch_info`).

``TRITON_OVERRIDE_ARCH`` (e.g. ``sm89`` on an H200) makes Triton emit another architecture's code; the record then
describes that architecture (its capability and shared-memory budget, capped by the real GPU's) with the real GPU's SM
count, so the configurations chosen are the ones that target gets.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

import torch
import triton

from sparsemla import flags

MIN_CAPABILITY = (8, 0)  # mma.sync with bf16 operands: Ampere and newer


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a Triton version string ("3.8.0", "3.6.0+git1234")."""
    major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    return major, minor


# (major, minor) of the Triton that compiles the kernels: some configurations are a compiler question as much as a GPU
# one (production runs Triton 3.8, the GPU machine 3.6: the top-k's digit widths, the decode tile's axis order). Read
# through triton_at_least at every launch; benchmarks/prod_cubins.py sets it while replaying another Triton's cubins.
TRITON_VERSION: tuple[int, int] = version_tuple(triton.__version__)


def triton_at_least(major: int, minor: int) -> bool:
    """Whether the Triton compiling the launches (:data:`TRITON_VERSION`) is ``major.minor`` or newer."""
    return TRITON_VERSION >= (major, minor)


@dataclass(frozen=True)
class DeviceInfo:
    """capability: (major, minor) the kernels are compiled for; smem_per_block: opt-in shared memory a block may use
    (bytes); num_sms: streaming multiprocessors; smem_per_sm: shared memory of one SM (how many blocks can be
    resident at once); name: for messages and result files; threads_per_sm / blocks_per_sm: resident threads and
    blocks one SM holds."""

    capability: tuple[int, int]
    smem_per_block: int
    num_sms: int
    smem_per_sm: int
    name: str = ""
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32

    @property
    def arch(self) -> int:
        """The capability as Triton writes it: (12, 0) -> 120."""
        return self.capability[0] * 10 + self.capability[1]

    @property
    def has_fp8(self) -> bool:
        """Triton has an e4m3 type (``tl.float8e4nv``) on this target: sm_89 and newer."""
        return self.capability >= (8, 9)

    @property
    def has_wgmma(self) -> bool:
        """``tl.dot`` lowers to warpgroup MMAs that read the A operand from registers (sm_90 and sm_100 class);
        sm_80..sm_89 and sm_120 get mma.sync, which stages both operands in shared memory."""
        return self.capability[0] in (9, 10)

    @property
    def supported(self) -> bool:
        return self.capability >= MIN_CAPABILITY


# The six targets the project compiles for, with a typical part's SM count (the SM count only sizes grids).
TARGETS: dict[str, DeviceInfo] = {
    "sm_80": DeviceInfo((8, 0), 166_912, 108, 167_936, "A100"),
    "sm_86": DeviceInfo((8, 6), 101_376, 84, 102_400, "A40", threads_per_sm=1536, blocks_per_sm=16),
    "sm_89": DeviceInfo((8, 9), 101_376, 142, 102_400, "L40S", threads_per_sm=1536, blocks_per_sm=24),
    "sm_90": DeviceInfo((9, 0), 232_448, 132, 233_472, "H200"),
    "sm_100": DeviceInfo((10, 0), 232_448, 148, 233_472, "B200"),
    "sm_120": DeviceInfo((12, 0), 101_376, 188, 102_400, "RTX PRO 6000 Blackwell", threads_per_sm=1536),
}


class UnsupportedDevice(RuntimeError):
    """No configuration of the project's kernels runs on this GPU (the message says why)."""


def target_name(name: str) -> str:
    """The canonical key of a target written ``sm_120``, ``sm120`` or ``120``."""
    key = "sm_" + re.sub(r"^sm_?", "", name.strip().lower())
    if key not in TARGETS:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    return key


def target(name: str) -> DeviceInfo:
    """A target by name: ``sm_120``, ``sm120`` or ``120``."""
    return TARGETS[target_name(name)]


def _override_arch() -> tuple[int, int] | None:
    raw = flags.TRITON_OVERRIDE_ARCH.get()
    if not raw:
        return None
    match = re.fullmatch(r"sm_?(\d+)", raw.strip().lower())
    if not match:
        raise flags.FlagError(f"TRITON_OVERRIDE_ARCH={raw!r} is not of the form smNN (e.g. sm89)")
    arch = int(match.group(1))
    return arch // 10, arch % 10


def _target_of(capability: tuple[int, int]) -> DeviceInfo | None:
    return next((info for info in TARGETS.values() if info.capability == capability), None)


_ASSUMED: list[DeviceInfo] = []
_CACHE: dict[int, DeviceInfo] = {}


def _from_torch(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    known = _target_of(capability)
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or (known.smem_per_block if known else 49_152))
    per_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or smem)
    threads = int(getattr(props, "max_threads_per_multi_processor", 0) or (known.threads_per_sm if known else 2048))
    blocks = known.blocks_per_sm if known else 32
    info = DeviceInfo(capability, smem, props.multi_processor_count, per_sm, props.name, threads, blocks)
    override = _override_arch()
    return info if override is None else running_as(info, override)


def running_as(info: DeviceInfo, capability: tuple[int, int]) -> DeviceInfo:
    """``info``'s GPU running another architecture's code (``TRITON_OVERRIDE_ARCH``): configured as that target would
    be (its budget per block, capped by this GPU's), on this GPU's SMs. Blocks per SM stay this GPU's: that is what
    runs here (an H200 fits two 98 KB blocks per SM where an sm_120 fits one)."""
    if capability == info.capability:
        return info
    as_target = _target_of(capability)
    budget = min(info.smem_per_block, as_target.smem_per_block) if as_target else info.smem_per_block
    name = f"{info.name} as sm_{capability[0]}{capability[1]}"
    return replace(info, capability=capability, smem_per_block=budget, name=name)


# CUDA keeps 1 KB of every resident block's shared memory for itself (sm_80 and newer)
SMEM_RESERVED_PER_BLOCK = 1024


def resident_blocks(info: DeviceInfo, shared: int, threads: int) -> int:
    """Blocks of ``threads`` threads using ``shared`` bytes of shared memory that one SM of ``info`` holds at once, as
    far as shared memory, threads and the SM's block slots limit it (registers: 64K per SM on every target, so a
    cubin's register limit is the same on all of them and is left out). 0: the block does not fit at all."""
    if shared > info.smem_per_block or threads > info.threads_per_sm:
        return 0
    by_shared = info.smem_per_sm // (shared + SMEM_RESERVED_PER_BLOCK)
    return min(by_shared, info.threads_per_sm // threads, info.blocks_per_sm)


def device_info(device: torch.device | int | None = None) -> DeviceInfo:
    """Facts of ``device`` (read from torch once per device), or the innermost :func:`assume`'d record."""
    if _ASSUMED:
        return _ASSUMED[-1]
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise UnsupportedDevice(f"the Triton kernels run on CUDA GPUs, got a {device.type} tensor")
        device = device.index
    index = torch.cuda.current_device() if device is None else int(device)
    if index not in _CACHE:
        _CACHE[index] = _from_torch(index)
    return _CACHE[index]


@contextlib.contextmanager
def assume(info: DeviceInfo) -> Iterator[DeviceInfo]:
    """Within the block every launcher configures itself for ``info`` (another GPU's facts, or the interpreter's)."""
    _ASSUMED.append(info)
    try:
        yield info
    finally:
        _ASSUMED.pop()


# What the CPU interpreter pretends to be: an sm_90-sized part (only grid sizes and tile choices depend on it).
INTERPRETER = DeviceInfo((9, 0), 232_448, 4, 233_472, "Triton interpreter")


# -- backend choice (the one place both ops decide it) ----------------------------------------------------------------
Backend = Literal["reference", "interpreter", "triton"]


def interpreting() -> bool:
    """Triton runs on its CPU interpreter (``TRITON_INTERPRET=1``; ``triton.jit`` reads it when a kernel is defined, so
    it must be set before the kernel modules are imported)."""
    return flags.TRITON_INTERPRET.get()


def defined_interpreted(kernel: object) -> bool:
    """True when ``kernel`` (a ``triton.jit`` function) was defined for Triton's CPU interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_interpreting(defined: bool, built: str = "the kernels were built") -> bool:
    """:func:`interpreting`, or RuntimeError when it differs from how a module's kernels were ``defined``
    (:func:`defined_interpreted`): TRITON_INTERPRET changed after triton.jit read it. ``built`` words the message."""
    interpret = interpreting()
    if interpret != defined:
        raise RuntimeError(
            "TRITON_INTERPRET must be set before triton is imported (triton.jit reads it when kernels are defined); "
            f"TRITON_INTERPRET={int(interpret)} but {built} for the "
            f"{'interpreter' if not interpret else 'GPU'}"
        )
    return interpret


def launch_info(device: torch.device) -> DeviceInfo:
    """The facts a launch on ``device`` is configured for: :data:`INTERPRETER` under the interpreter, else
    :func:`device_info` (the innermost :func:`assume`'d record included)."""
    return INTERPRETER if interpreting() else device_info(device)


def select_backend(t: torch.Tensor) -> Backend:
    """Which implementation a public op runs for input ``t``: ``"reference"`` (SPARSEMLA_FORCE_REFERENCE, or CPU
    tensors without Triton's interpreter), ``"interpreter"`` (TRITON_INTERPRET=1: the Triton kernels on the CPU
    interpreter) or ``"triton"`` (CUDA tensors)."""
    if flags.SPARSEMLA_FORCE_REFERENCE.get():
        return "reference"
    if interpreting():
        return "interpreter"
    return "triton" if t.is_cuda else "reference"


__all__ = [
    "INTERPRETER",
    "SMEM_RESERVED_PER_BLOCK",
    "TARGETS",
    "Backend",
    "DeviceInfo",
    "UnsupportedDevice",
    "assume",
    "device_info",
    "interpreting",
    "launch_info",
    "resident_blocks",
    "select_backend",
    "target",
    "target_name",
]
