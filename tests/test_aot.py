"""Ahead-of-time compile of every Triton kernel for sm_80, 86, 89, 90, 100 and 120 with the installed Triton (the
production one, 3.8): each launcher picks the configuration that target gets, and every kernel must compile, fit the
target's shared memory per block and spill at most 256 B per thread. docs/portability.md is generated from the same
records. No GPU: Triton compiles for a target it does not run on (see sparsemla.kernels.aot)."""

from __future__ import annotations

from pathlib import Path

import aot_background
import pytest

from sparsemla.kernels import device as dev

ROOT = Path(__file__).resolve().parents[1]
# The records fixture waits for the background compile (up to TIMEOUT_S a child), longer than the suite's per-test
# limit: under scripts/test-lanes.sh this module's tests start while the compile still has minutes to go.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * aot_background.TIMEOUT_S + 60)]


@pytest.fixture(scope="module")
def records(pytestconfig, tmp_path_factory) -> dict:
    """The AOT records of every case on every target: from the children conftest.py started in the background after
    collection, or started here (see tests/aot_background.py)."""
    run = getattr(pytestconfig, "_sparsemla_aot", None) or aot_background.start(tmp_path_factory.mktemp("aot"))
    return run.wait()


def test_every_kernel_compiles_and_fits_on_every_target(records):
    from sparsemla.kernels.aot import KernelResources

    bad = [KernelResources(**r) for r in records["records"]]
    bad = [r for r in bad if not r.ok]
    assert not bad, "\n".join(f"{r.target} {r.case} {r.kernel}: {r.problem()}" for r in bad)
    assert all(run.returncode == 0 for run in records["runs"])
    assert {r["target"] for r in records["records"]} == set(dev.TARGETS)


def test_the_cases_cover_sglangs_shapes_and_every_kernel(records):
    by_target: dict[str, set[str]] = {}
    for r in records["records"]:
        by_target.setdefault(r["target"], set()).add(r["kernel"])
    want = {
        "_sparse_decode_kernel",
        "_sparse_decode_combine_kernel",
        "_indexer_logits_kernel",
        "_indexer_topk_kernel",
        "_topk_smem_kernel",
    }  # the last: the top-k's spans in shared memory (Gluon, no wgmma): every target
    for target, kernels in by_target.items():
        assert want <= kernels, (target, want - kernels)
        # sm_90's Gluon tile from 8 programs (the Triton tile below; warp-specialized from 4 tiles a program), and
        # nowhere else
        for gluon in ("_sparse_decode_sm90_kernel", "_sparse_decode_sm90_ws_kernel"):
            assert (gluon in kernels) == (target == "sm_90"), (target, gluon, kernels)
        # the V3.2 Gluon tile (V32Config.gluon, off by default; its cases force it on sm_90, synchronous and with
        # its gather a tile ahead)
        assert ("_sparse_decode_v32_sm90_kernel" in kernels) == (target == "sm_90"), (target, kernels)
    cases = {r["case"] for r in records["records"]}
    # B {1,8,64,128} x H {8,16,64,128} x 2 top-k, and B 3 x H 128 x 2 top-k (sm_90's V-halves tile)
    assert len([c for c in cases if c.startswith("decode ")]) == 34
    assert len([c for c in cases if c.startswith("indexer_")]) == 8


def test_small_budget_targets_get_their_own_tiles(records):
    """On sm_86/89/120 (101,376 B) the decode kernel never needs the Hopper tile's 196,608 B; on sm_80 it compiles
    at all (no e4m3 type there: the integer dequant)."""
    decode = [r for r in records["records"] if r["kernel"] == "_sparse_decode_kernel"]
    for target in ("sm_80", "sm_86", "sm_89", "sm_120"):
        worst = max(r["shared"] for r in decode if r["target"] == target)
        assert worst <= 101_376, (target, worst)


def test_mma_sync_decode_stores_the_gathered_tile_once(records):
    """Where the decode's dots are mma.sync, the tile's opaque move must leave Triton's bf16 operand layout in place:
    one shared copy of the gathered tile next to q and P, i.e. at most (block_h + block_n) KB + P. Without it (the
    tile's uint8 origin sets an 8-bit operand layout) the tile is stored twice: 98,304 instead of 67,584 B at
    32 x 32."""
    import re

    from sparsemla.kernels.sparse_decode.triton import choose_config, opaque_tile_default

    checked = 0
    for r in records["records"]:
        if r["kernel"] != "_sparse_decode_kernel" or not r["case"].startswith("decode "):
            continue
        batch, heads = (int(x) for x in re.match(r"decode B(\d+) H(\d+) ", r["case"]).groups())
        info = dev.TARGETS[r["target"]]
        cfg = choose_config(info, heads, batch, _case_topks(r["case"]))
        if not opaque_tile_default(cfg, info):
            continue
        one_copy = (cfg.block_h + cfg.block_n) * 1024 + cfg.block_h * cfg.block_n * 2
        assert r["shared"] <= one_copy, (r["target"], r["case"], r["shared"], one_copy)
        checked += 1
    assert checked >= 4 * 32  # every decode case on sm_80/86/89/120, and the 16-head ones on sm_90/100


def test_indexer_needs_at_most_what_the_startup_check_assumes(records):
    from sparsemla.kernels.support import INDEXER_SHARED_MAX

    idx = [r for r in records["records"] if r["kernel"].startswith("_indexer")]
    assert max(r["shared"] for r in idx) <= INDEXER_SHARED_MAX


def _case_topks(case: str) -> tuple[int, ...]:
    """The index widths of a decode case ("decode B8 H64 topk128+2048" -> (128, 2048)), as its launcher saw them."""
    word = next(part for part in case.split() if part.startswith("topk"))
    return tuple(int(w) for w in word[4:].split("+"))


def test_decode_shared_estimate_matches_the_compiler(records):
    """shared_bytes() sizes how many programs an SM holds (the split count): it must not under-count."""
    from sparsemla.kernels.sparse_decode.triton import choose_config, shared_bytes

    for r in records["records"]:
        if r["kernel"] not in ("_sparse_decode_kernel", "_sparse_decode_sm90_kernel", "_sparse_decode_sm90_ws_kernel"):
            continue
        b, h = (int(part[1:]) for part in r["case"].split()[1:3])
        info = dev.target(r["target"])
        est = shared_bytes(choose_config(info, h, b, _case_topks(r["case"])), info)
        assert r["shared"] <= est + 1024, (r["target"], r["case"], r["shared"], est)


def test_decode_register_model_matches_the_compiler(records):
    """resident_programs() counts the small mma.sync tiles' registers (SMALL_TILE_REGS, else 128; 4-warp tiles of
    >= 512 scores as 255): it must not count fewer than the compiler allocates (an SM would hold fewer programs than
    the split count assumes), and the per-target entries should not be far above it either."""
    from sparsemla.kernels.sparse_decode.triton import SMALL_TILE_REGS, choose_config, opaque_tile, wgmma_tile

    checked = 0
    for r in records["records"]:
        if r["kernel"] != "_sparse_decode_kernel":
            continue
        b, h = (int(part[1:]) for part in r["case"].split()[1:3])
        info = dev.target(r["target"])
        cfg = choose_config(info, h, b, _case_topks(r["case"]))
        if wgmma_tile(cfg, info) or not opaque_tile(cfg, info) or cfg.block_h * cfg.block_n >= 512:
            continue  # counted as 255 (or by shared memory): an upper bound by construction
        model = SMALL_TILE_REGS.get(info.capability, 128) if cfg.num_warps == 4 else 128
        assert r["registers"] <= model, (r["target"], r["case"], r["registers"], model)
        if cfg.num_warps == 4:
            assert model - r["registers"] <= 8, (r["target"], r["case"], r["registers"], model)
        checked += 1
    assert checked >= 6 * 8  # the 16 x 16 tiles of B 1 / 8 x H 8 / 16 on every target


def test_docs_table_is_generated_from_these_records(records):
    from sparsemla.kernels.aot import KernelResources, markdown

    recs = [KernelResources(**r) for r in records["records"]]
    want = markdown(recs, records["triton"])
    got = (ROOT / "docs" / "portability.md").read_text()
    assert got == want, "docs/portability.md is stale: run `sparsemla aot --markdown docs/portability.md`"


@pytest.mark.parametrize("registers,ok", [(4, False), (15, False), (16, True), (255, True)], ids=lambda v: str(v))
def test_a_kernel_reduced_to_a_trap_fails_the_gate(registers, ok):
    from sparsemla.kernels.aot import KernelResources

    r = KernelResources("sm_100", "decode_v32 fp8_656 B64 H128", "_sparse_decode_v32_kernel", 98816, 232448,
                        registers, 0, 8, 2)  # fmt: skip
    assert r.ok is ok
    assert ("trap" in r.problem()) is not ok


def test_sass_folder_holds_each_kernels_instructions_without_addresses(tmp_path):
    """`sparsemla aot --sass DIR` (how a refactor is shown to leave the generated code alone without a GPU): one file
    per target, case and kernel, instructions only, so two builds of the same code compare equal."""
    import subprocess
    import sys

    from sparsemla import flags
    from sparsemla.kernels.aot import sass_file_name

    case = "indexer_fused_top512 B1 ctx64k"  # two kernels in one case
    cmd = [
        sys.executable,
        "-m",
        "sparsemla.cli",
        "aot",
        "--arch",
        "sm_120",
        "--case",
        case,
        "--sass",
        str(tmp_path / "s"),
    ]
    done = subprocess.run(cmd, env=flags.child_env({"TRITON_INTERPRET": None}), capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(p.name for p in (tmp_path / "s").iterdir())
    kernels = ("_indexer_logits_kernel", "_indexer_topk_kernel")
    assert files == sorted(sass_file_name("sm_120", case, k) for k in kernels)
    assert (
        sass_file_name("sm_120", case, kernels[0])
        == "sm_120__indexer_fused_top512_B1_ctx64k___indexer_logits_kernel.sass"
    )
    for name, kernel in zip(files, kernels, strict=True):
        text = (tmp_path / "s" / name).read_text()
        assert f"Function : {kernel}" in text and "EF_CUDA_SM120" in text
        assert "EXIT" in text and "/*0000*/" not in text and "/* 0x" not in text
        assert all(line.strip() for line in text.splitlines())


PREFETCH_PROBE = """
import dataclasses, json
import torch
from sparsemla.kernels import aot, device as dev
from sparsemla.kernels.layouts import V32_DIM, V32_PAGE, v32_row_width
from sparsemla.kernels.sparse_decode import triton as T, triton_v32 as v32
rows = []
for target in ("sm_80", "sm_90", "sm_120"):
    info = dev.target(target)
    chosen = T.choose_config
    T.choose_config = lambda *a, **k: dataclasses.replace(chosen(*a, **k), l2_prefetch=2)
    got, recs = {}, []
    with aot.compile_only(target, info, "v4", recs), aot.watch_launches(lambda n, k: got.setdefault(n, k)):
        aot._decode_case(64, 64, 512)()
    T.choose_config = chosen
    cfg = dataclasses.replace(v32.choose_v32_config(info, 128, 1), l2_prefetch=3)  # 2 programs: the Triton tile
    with aot.compile_only(target, info, "v32", recs), aot.watch_launches(lambda n, k: got.setdefault(n, k)):
        kv = torch.empty(4, V32_PAGE, 1, v32_row_width("fp8_656"), dtype=torch.uint8)
        q, idx = torch.empty(64, 1, 128, V32_DIM, dtype=torch.bfloat16), torch.empty(64, 1, 2048, dtype=torch.int32)
        v32.sparse_decode_v32_fwd(q, kv, idx, 0.04, kv_format="fp8_656", config=cfg)
    v4 = next(k for k in ("_sparse_decode_sm90_ws_kernel", "_sparse_decode_sm90_kernel", "_sparse_decode_kernel")
              if k in got)
    for name in (v4, "_sparse_decode_v32_kernel"):
        r = next(r for r in recs if r.kernel == name)
        sass = aot.cubin_sass(got[name].asm["cubin"])
        rows.append(dict(target=target, kernel=name, ok=r.ok, prefetches=sass.count("CCTL.E.PF2")))
print(json.dumps(rows))
"""


def test_l2_prefetch_compiles_on_every_kind_of_target():
    """DecodeConfig / V32Config.l2_prefetch (V4: one tile ahead from 4 tiles a program by default) compiles for
    sm_80, sm_90 (V4: the warp-specialized Gluon tile, whose producer prefetches) and sm_120 within the gate, and the
    prefetches are in the SASS (``CCTL.E.PF2``: prefetch.global.L2)."""
    import json
    import subprocess
    import sys

    from sparsemla import flags

    done = subprocess.run([sys.executable, "-c", PREFETCH_PROBE], env=flags.child_env({"TRITON_INTERPRET": None}),
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(rows) == 6
    for row in rows:
        assert row["ok"] and row["prefetches"] > 0, row
