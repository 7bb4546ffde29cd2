"""benchmarks/prod_cubins.py on the CPU: Triton 3.8 compiles a small kernel's launches for sm_90 into cubins with
the parameter lists the driver launch needs, keys separate what Triton specialises on, and a launch with no cubin
raises instead of running under another Triton. (The launch itself needs the GPU machine.) Runs in a child process:
the test session's kernels are interpreted (conftest), the build needs Triton's compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import prod_cubins
from sparsemla import flags

ROOT = Path(__file__).resolve().parents[1]

KERNEL = """
import triton
import triton.language as tl


@triton.jit
def _tiny_kernel(x, y, n, one, scale, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(y + o, tl.load(x + o, mask=m) * scale + one, mask=m)
"""

CHILD = """
import ctypes, json, sys
from pathlib import Path
import torch
from benchmarks import prod_cubins as pc
from tiny import _tiny_kernel

out = Path(sys.argv[1])
x, y = torch.randn(100), torch.empty(100)
calls = [((x, y, 100, 1, 2.0), dict(BLOCK=32)), ((x, y, 96, 1, 2.0), dict(BLOCK=32)),
         ((x, y, 100, 3, 2.0), dict(BLOCK=32, num_warps=2)), ((x, y, 101, 1, 0.5), dict(BLOCK=32))]


def work():
    for args, kw in calls:
        _tiny_kernel[(4,)](*args, **kw)


added = pc.build(work, out)
again = pc.build(work, out)  # the same launches: nothing new
keys = [pc.launch_key(_tiny_kernel, a, kw) for a, kw in calls]
entry = json.loads((out / pc.MANIFEST).read_text())[keys[2]]
packed = pc.pack_params(entry, pc._bind(_tiny_kernel, calls[2][0], calls[2][1]), [0, 0])
try:
    with pc.replay(out) as counts:
        _tiny_kernel[(4,)](x, y, 100, 1, 2.0, BLOCK=64)  # never built
    missing = "ran"
except KeyError as exc:
    missing = str(exc)
try:
    pc.build(work, out, "sm89")  # another code path into this folder
    other_path = "built"
except ValueError as exc:
    other_path = str(exc)
# the kernel's module changes: the replay refuses its old cubins, a rebuild replaces them
tiny = Path(sys.modules["tiny"].__file__)
tiny.write_text(tiny.read_text() + "# edited\\n")
try:
    with pc.replay(out):
        _tiny_kernel[(4,)](*calls[0][0], **calls[0][1])
    stale = "ran"
except RuntimeError as exc:
    stale = str(exc)
rebuilt = pc.build(work, out)
print(json.dumps(dict(added=added, again=len(again), keys=keys, packed=[type(p).__name__ for p in packed],
                      packed_ptr=packed[0].value == x.data_ptr(), missing=missing, other_path=other_path,
                      stale=stale, rebuilt=len(rebuilt))))
"""


def test_build_stores_cubins_with_launch_parameters_and_replay_refuses_unbuilt_launches(tmp_path):
    (tmp_path / "tiny.py").write_text(KERNEL)
    (tmp_path / "child.py").write_text(CHILD)
    path = os.pathsep.join([str(ROOT), str(tmp_path), str(ROOT / "src")])
    env = flags.child_env({"TRITON_INTERPRET": None, "PYTHONPATH": path, "TRITON_CACHE_DIR": str(tmp_path / "cache")})
    proc = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "cubins")], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # n = 96 (divisible by 16) and one = 3 (not specialised to a constant) compile apart; n = 101 shares n = 100's
    assert len(set(got["keys"])) == 3 and got["keys"][0] == got["keys"][3]
    assert len(got["added"]) == 3 and got["again"] == 0
    by_key = {e["key"]: e for e in got["added"]}
    first, third = by_key[got["keys"][0]], by_key[got["keys"][2]]
    assert first["params"] == [["x", "*fp32"], ["y", "*fp32"], ["n", "i32"], ["scale", "fp32"]]  # one = 1: constant
    assert third["params"] == [["x", "*fp32"], ["y", "*fp32"], ["n", "i32"], ["one", "i32"], ["scale", "fp32"]]
    assert first["num_warps"] == 4 and third["num_warps"] == 2 and first["target"] == "cuda:90"
    assert first["triton"].startswith("3.8") and first["name"] == "_tiny_kernel"
    for e in got["added"]:
        assert (tmp_path / "cubins" / e["cubin"]).stat().st_size > 1000
    # parameters, then the global and profile scratch pointers Triton 3.8 kernels take
    assert got["packed"] == ["c_ulong", "c_ulong", "c_int", "c_int", "c_float", "c_ulong", "c_ulong"]
    assert got["packed_ptr"] is True
    assert "no Triton 3.8 cubin" in got["missing"]  # the manifest's compiler, 3.8 here
    assert "holds the native path's cubins" in got["other_path"]
    assert "built from another version of its module" in got["stale"] and got["rebuilt"] == 3


def _assert_same_layout(filled: dict, empty: dict) -> None:
    import torch

    assert filled.keys() == empty.keys()
    for name, value in filled.items():
        if isinstance(value, torch.Tensor):
            other = empty[name]
            assert (value.shape, value.dtype, value.stride()) == (other.shape, other.dtype, other.stride()), name
            assert value.storage_offset() == other.storage_offset(), name
        else:
            assert value == empty[name], name


def test_decode_builds_from_unfilled_inputs_of_the_same_layout_as_the_timed_ones():
    """benchmarks/decode.py and decode_v32.py --build-cubins compile from ``make_inputs(fill=False)``: every tensor
    must have the shape, dtype and strides (what a launch's key and integer arguments come from) of the filled inputs
    timed on the GPU (V3.2: in both cache formats)."""
    from benchmarks import decode, decode_v32

    for shape in (decode.Shape(2, 8, 128, 512), decode.Shape(3, 64, 128, 2048)):
        _assert_same_layout(decode.make_inputs(shape, 1, "cpu"), decode.make_inputs(shape, 1, "cpu", fill=False))
    for fmt in decode_v32.V32_FORMATS:
        shape = decode_v32.Shape(2, 2, 16, 128, fmt, 256)
        filled = decode_v32.make_inputs(shape, 1, "cpu")
        _assert_same_layout(filled, decode_v32.make_inputs(shape, 1, "cpu", fill=False))


def test_benchmarks_refuse_a_cubin_folder_without_a_manifest(tmp_path):
    from typer.testing import CliRunner

    from benchmarks import decode, decode_v32, indexer, topk

    for app in (decode.app, decode_v32.app, indexer.app, topk.app):
        result = CliRunner().invoke(app, ["--cubins", str(tmp_path)])
        assert result.exit_code == 2 and "no manifest.json" in result.output and "--build-cubins" in result.output


def test_replay_makes_launchers_choose_for_the_cubins_compiler(tmp_path, monkeypatch):
    """Launch choices that depend on the compiler (the top-k's digit widths) follow the cubins' Triton while a
    Replayer is entered, so the GPU machine's Triton 3.6 makes the launches that Triton 3.8 compiled (the keys match);
    outside it they are the running Triton's again. Cubins of two versions in one folder are refused."""
    from benchmarks import prod_cubins as pc
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.indexer import topk

    monkeypatch.setattr(dev, "TRITON_VERSION", (3, 6))
    (tmp_path / pc.MANIFEST).write_text(json.dumps({"a": {"triton": "3.8.0"}, "b": {"triton": "3.8.1"}}))
    three_six = (topk.radix_bits(512, 0), topk.radix_bits(2048, 4096), topk.split_reg_bits())
    assert three_six == (topk.RADIX_BITS, topk.RADIX_BITS_WIDE_K, topk.SPLIT_REG_BITS) == (5, 8, 5)
    replayer = pc.Replayer(tmp_path)
    for _ in range(2):  # reusable: every entry switches, every exit restores
        with replayer:
            assert dev.TRITON_VERSION == (3, 8)
            assert (topk.radix_bits(512, 0), topk.radix_bits(2048, 4096), topk.split_reg_bits()) == (8, 8, 8)
        assert dev.TRITON_VERSION == (3, 6)
        assert (topk.radix_bits(512, 0), topk.radix_bits(2048, 4096), topk.split_reg_bits()) == three_six
    (tmp_path / pc.MANIFEST).write_text(json.dumps({"a": {"triton": "3.8.0"}, "b": {"triton": "3.6.0"}}))
    with pytest.raises(ValueError, match="several Triton versions"):
        pc.Replayer(tmp_path)


DOT_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def _dot_kernel(a, b, c, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    x = tl.load(a + o[:, None] * BLOCK + o[None, :])  # [BLOCK, BLOCK] bf16
    y = tl.load(b + o[:, None] * BLOCK + o[None, :])  # [BLOCK, BLOCK] bf16
    tl.store(c + o[:, None] * BLOCK + o[None, :], tl.dot(x, y))  # [BLOCK, BLOCK] fp32
"""

PATHS_CHILD = """
import json, sys
from pathlib import Path
import torch
import triton
from benchmarks import prod_cubins as pc
from sparsemla.kernels import aot, device as dev
from dot import _dot_kernel

root = Path(sys.argv[1])
a, b, c = torch.randn(64, 64).bfloat16(), torch.randn(64, 64).bfloat16(), torch.empty(64, 64)
seen = {}


def work():
    seen[triton.knobs.runtime.override_arch] = dev.device_info().smem_per_block
    _dot_kernel[(1,)](a, b, c, BLOCK=64)


out = {}
for path in ("native", "sm89"):
    (entry,) = pc.build(work, pc.path_dir(root, path), path)
    sass = aot.cubin_sass(pc.gzip.decompress((pc.path_dir(root, path) / entry["cubin"]).read_bytes()))
    out[path] = dict(entry=entry, hgmma="HGMMA" in sass, hmma="HMMA" in sass)
out["seen"] = {str(k): v for k, v in seen.items()}
out["override_after"] = triton.knobs.runtime.override_arch
print(json.dumps(out))
"""


def test_build_compiles_each_code_path_for_the_gpu_machine(tmp_path):
    """``build(..., code_path="sm89")`` makes what the GPU machine runs under TRITON_OVERRIDE_ARCH=sm89: mma.sync code
    (no wgmma) in cubins for its sm_90, launchers configured for sm_89's 101,376 B budget; the native build is wgmma
    for the H200's budget; the override is restored afterwards and each path gets a folder of its own."""
    (tmp_path / "dot.py").write_text(DOT_KERNEL)
    (tmp_path / "child.py").write_text(PATHS_CHILD)
    path = os.pathsep.join([str(ROOT), str(tmp_path), str(ROOT / "src")])
    env = flags.child_env({"TRITON_INTERPRET": None, "TRITON_OVERRIDE_ARCH": None, "PYTHONPATH": path,
                           "TRITON_CACHE_DIR": str(tmp_path / "cache")})  # fmt: skip
    proc = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "cubins")], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    native, sm89 = got["native"], got["sm89"]
    assert native["hgmma"] and not native["hmma"]
    assert sm89["hmma"] and not sm89["hgmma"]
    assert native["entry"]["target"] == sm89["entry"]["target"] == "cuda:90"
    assert (native["entry"]["code_path"], sm89["entry"]["code_path"]) == ("native", "sm89")
    assert got["seen"] == {"None": 232_448, "sm89": 101_376}
    assert got["override_after"] is None
    assert (tmp_path / "cubins" / "native" / "manifest.json").is_file()
    assert (tmp_path / "cubins" / "sm89" / "manifest.json").is_file()


def test_replay_refuses_another_code_paths_cubins(tmp_path, monkeypatch):
    """A folder of sm89-path cubins replays only in a process running that path (TRITON_OVERRIDE_ARCH=sm89), and
    native cubins (also those of manifests from before paths were recorded) only in a native one."""
    from benchmarks import prod_cubins as pc

    sm89, native, old = tmp_path / "sm89", tmp_path / "native", tmp_path / "old"
    for folder, entry in ((sm89, {"code_path": "sm89"}), (native, {"code_path": "native"}), (old, {})):
        folder.mkdir()
        (folder / pc.MANIFEST).write_text(json.dumps({"a": {"triton": "3.8.0", **entry}}))
    monkeypatch.delenv("TRITON_OVERRIDE_ARCH", raising=False)
    assert pc.Replayer(native).code_path == pc.Replayer(old).code_path == "native"
    with pytest.raises(ValueError, match="sm89 code path's cubins, this process runs native"):
        pc.Replayer(sm89)
    monkeypatch.setenv("TRITON_OVERRIDE_ARCH", "sm89")
    assert pc.Replayer(sm89).code_path == "sm89"
    with pytest.raises(ValueError, match="native code path's cubins, this process runs sm89"):
        pc.Replayer(native)
    mixed = {"a": {"triton": "3.8.0", "code_path": "sm89"}, "b": {"triton": "3.8.0"}}
    (sm89 / pc.MANIFEST).write_text(json.dumps(mixed))
    with pytest.raises(ValueError, match="several code paths"):
        pc.Replayer(sm89)


def test_running_as_configures_another_targets_budget_on_this_gpus_sms():
    from sparsemla.kernels import device as dev

    h200 = dev.target("sm_90")
    as89 = dev.running_as(h200, (8, 9))
    assert (as89.capability, as89.smem_per_block, as89.num_sms, as89.smem_per_sm) == ((8, 9), 101_376, 132, 233_472)
    assert as89.name == "H200 as sm_89" and not as89.has_wgmma
    assert dev.running_as(h200, (8, 0)).smem_per_block == 166_912
    assert dev.running_as(h200, (9, 0)) is h200


def test_path_info_is_what_the_gpu_machines_launchers_see(monkeypatch):
    """The build configures each code path as the GPU machine's own process does (``device._from_torch`` on an H200,
    with and without TRITON_OVERRIDE_ARCH=sm89): the launches, hence their keys, only match because of that."""
    from types import SimpleNamespace

    from benchmarks import prod_cubins as pc
    from sparsemla.kernels import device as dev

    h200 = SimpleNamespace(
        major=9, minor=0, shared_memory_per_block_optin=232_448, shared_memory_per_multiprocessor=233_472,
        multi_processor_count=132, name="NVIDIA H200",
    )  # fmt: skip
    monkeypatch.setattr(dev.torch.cuda, "get_device_properties", lambda index: h200)
    for path, env in (("native", None), ("sm89", "sm89")):
        if env is None:
            monkeypatch.delenv("TRITON_OVERRIDE_ARCH", raising=False)
        else:
            monkeypatch.setenv("TRITON_OVERRIDE_ARCH", env)
        built, arch = pc.path_info(path)
        seen = dev._from_torch(0)
        assert (built.capability, built.smem_per_block, built.num_sms, built.smem_per_sm) == (
            seen.capability, seen.smem_per_block, seen.num_sms, seen.smem_per_sm), path  # fmt: skip
        assert arch == 90


def test_indexer_builds_from_an_unfilled_cache_of_the_timed_layout():
    import torch

    from benchmarks import indexer

    filled = indexer.gpu_indexer_cache(3, torch.device("cpu"), torch.Generator().manual_seed(0))
    empty = indexer.unfilled_indexer_cache(3)
    assert (filled.shape, filled.dtype, filled.stride()) == (empty.shape, empty.dtype, empty.stride())


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_120"])
def test_padded_launches_hold_the_targets_blocks_per_sm_on_an_h200(target):
    """The occupancy emulation: a block padded for ``target`` runs as many per H200 SM as it would per ``target``
    SM (or fewer where the H200's own limit is lower), over shared sizes and block widths the kernels use."""
    from sparsemla.kernels import device as dev

    tgt, h200 = dev.target(target), dev.target("sm_90")
    checked = 0
    for warps in (1, 2, 4, 8, 16, 32):
        threads = 32 * warps
        for shared in (0, 64, 16_384, 30_000, 50_176, 67_584, 83_968, 98_432, 101_376, 131_072, 166_912):
            want = dev.resident_blocks(tgt, shared, threads)
            if want == 0:
                with pytest.raises(ValueError, match="does not fit"):
                    prod_cubins.padded_shared(shared, threads, tgt, h200)
                continue
            padded = prod_cubins.padded_shared(shared, threads, tgt, h200)
            assert shared <= padded <= h200.smem_per_block
            got = dev.resident_blocks(h200, padded, threads)
            assert got == min(want, dev.resident_blocks(h200, shared, threads)), (warps, shared, padded)
            checked += 1
    assert checked > 40


def test_resident_blocks_follows_the_cuda_occupancy_rules():
    from sparsemla.kernels import device as dev

    sm89, h200 = dev.target("sm_89"), dev.target("sm_90")
    assert dev.resident_blocks(sm89, 83_968, 256) == 1  # 84 KB + 1 KB reserved: one per 100 KB SM
    assert dev.resident_blocks(h200, 83_968, 256) == 2
    assert dev.resident_blocks(sm89, 50_176, 128) == 2  # exactly 2 x (49 KB + 1 KB)
    assert dev.resident_blocks(sm89, 4_096, 512) == 3  # 1,536 threads per SM
    assert dev.resident_blocks(h200, 4_096, 512) == 4
    assert dev.resident_blocks(sm89, 102_400, 128) == 0  # over the per-block budget
    assert dev.resident_blocks(sm89, 0, 32) == 24  # the SM's block slots (sm_86: 16)
    assert dev.resident_blocks(dev.target("sm_86"), 0, 32) == 16 and dev.resident_blocks(h200, 0, 32) == 32


def _fake_kernel(num_ctas: int, pdl: bool = False):
    from types import SimpleNamespace

    md = SimpleNamespace(name="_k", num_ctas=num_ctas, launch_pdl=pdl, launch_cooperative_grid=False, num_warps=8,
                         shared=1024, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                         profile_scratch_align=1, target=SimpleNamespace(backend="cuda", arch=90))  # fmt: skip
    return SimpleNamespace(metadata=md, src=SimpleNamespace(signature={"x": "*bf16", "n": "i32", "B": "constexpr"}))


def test_cluster_kernels_are_recorded_and_launched_as_clusters():
    """A kernel compiled with ``num_ctas=2`` is recorded with its cluster size and launched as Triton launches it:
    ``cuLaunchKernelEx`` with grid x times the cluster size and the cluster-dimension attribute (CUDA's struct
    layouts: a 72-byte attribute, a 56-byte config); one-CTA kernels keep ``cuLaunchKernel`` and their manifest entry
    unchanged; PDL launches are still refused."""
    import ctypes

    assert prod_cubins._entry(_fake_kernel(2), "k")["num_ctas"] == 2
    assert "num_ctas" not in prod_cubins._entry(_fake_kernel(1), "k")
    with pytest.raises(ValueError, match="PDL"):
        prod_cubins._entry(_fake_kernel(1, pdl=True), "k")
    assert ctypes.sizeof(prod_cubins._LaunchAttribute) == 72 and ctypes.sizeof(prod_cubins._LaunchConfig) == 56
    seen: dict = {}

    class FakeLib:
        def cuLaunchKernelEx(self, config, func, params, extra):  # noqa: N802 - the driver's name
            cfg = config._obj
            attr = cfg.attrs.contents
            seen["ex"] = (cfg.grid_x, cfg.grid_y, cfg.grid_z, cfg.block_x, cfg.shared, cfg.stream, cfg.num_attrs,
                          attr.id, tuple(attr.value.cluster_dim))  # fmt: skip
            return 0

        def cuLaunchKernel(self, func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
            seen["plain"] = (gx.value, gy.value, gz.value, bx.value, shared.value)
            return 0

    driver = prod_cubins._Driver.__new__(prod_cubins._Driver)
    driver.lib = FakeLib()
    params = [ctypes.c_uint64(0), ctypes.c_int32(5)]
    driver.launch(ctypes.c_void_p(1), (64, 1, 3), 256, 221_696, 1234, params, num_ctas=2)
    assert seen["ex"] == (128, 1, 3, 256, 221_696, 1234, 1, 4, (2, 1, 1))
    driver.launch(ctypes.c_void_p(1), (64, 1, 3), 256, 1024, 1234, params)
    assert seen["plain"] == (64, 1, 3, 256, 1024)
