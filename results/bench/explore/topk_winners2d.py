"""Exploratory (sessions 47-48, not a benchmark claim): the top-k's winner ranks over a [ROW // C, C] view.

``_write_winners`` used to rank each winner in position order with one ``tl.cumsum`` over the whole register row
(16k keys for a 16k row: session 43's timeline put that scan at ~3.75 us and the stores at ~2.0 of a solo row's
~12.5 us). Session 47 wrote the variant that views the row as ROW // C rows of C adjacent keys (a reshape that keeps
order): each C-key row is summed and scanned on its own, and only the ROW // C row totals are scanned across the
program (C = 32: 8 lanes of 4 keys a row; C = 128: a warp's 32 lanes). Same ranks, same slots, same bits out. Session
48 measured it (H100, 3.8 cubins: 64 x 16k 1.4 us faster at C = 32) and adopted it as ``topk.WINNERS_COLS``; this
script now writes copies of topk.py with another C (a C of at least the row's keys is the one scan of before).

    python results/bench/explore/topk_winners2d.py write --cols 16 --out F.py    # the variant copy of topk.py
    TRITON_INTERPRET=1 python results/bench/explore/topk_winners2d.py check --cols 16   # exact vs the reference
    python results/bench/explore/topk_winners2d.py aot --out F.json   # registers, spills, SASS (compile-only)

The GPU A/B takes the copy as ``--old`` of topk_split_regs_ab.py (gpu_t38.sh build-w2d / w2d).
"""

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src/sparsemla/kernels/indexer/topk.py"

ANCHOR = "WINNERS_COLS = tl.constexpr(32)\n"


def variant_source(cols: int, src: Path = SRC) -> str:
    """topk.py with ``_write_winners`` ranking over the [N // cols, cols] view (one scan where cols >= N)."""
    text = src.read_text()
    if text.count(ANCHOR) != 1:
        raise SystemExit("topk.WINNERS_COLS = 32 is not in topk.py once (topk.py changed?)")
    return text.replace(ANCHOR, f"WINNERS_COLS = tl.constexpr({cols})\n")


def load(path: Path, name: str = "topk_w2d"):  # noqa: ANN201
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its frozen dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return mod


def check(cols: int) -> None:
    """Interpreter: the variant's positions (both orders) and page slots equal the reference's, for one-program rows
    in one and two register tiles, the filter's candidate lists and split register spans (8-warp launch)."""
    import tempfile

    import torch

    from sparsemla.kernels.indexer.reference import indexer_topk_reference

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "topk_w2d.py"
        path.write_text(variant_source(cols))
        mod = load(path)
        g = torch.Generator().manual_seed(cols)
        cases = [  # (k, cols, lengths, launcher keywords)
            (512, 5000, [0, 1, 511, 512, 513, 1024, 1025, 3000, 4096, 4097, 5000], dict(row_tiles=(1024, 4096))),
            (2048, 9000, [2047, 2048, 2049, 4096, 8192, 9000, 6000], dict(row_tiles=(4096, 8192))),
            (512, 20000, [20000, 19999, 9000, 600], dict(filter_tiles=(2048, 1024), row_tiles=(1024, 4096))),
        ]
        for k, n_cols, lengths, kw in cases:
            logits = torch.randn(len(lengths), n_cols, generator=g)
            logits[:, ::7] = 0.5  # ties
            lens = torch.tensor(lengths, dtype=torch.int32)
            ref = indexer_topk_reference(logits, lens, k)
            by_pos = torch.where(ref >= 0, ref, 1 << 30).sort(dim=1).values.masked_fill(ref < 0, -1)
            table = torch.randperm(len(lengths) * (n_cols // 64 + 1), generator=g).view(len(lengths), -1).int()
            for srt in (True, False):
                out = torch.full((len(lengths), k), -7, dtype=torch.int32)
                slots = torch.full_like(out, -7)
                mod.indexer_topk_fwd(logits, lens, k, out=out, sorted=srt, page_table=table, page_size=64,
                                     out_slots=slots, **kw)  # fmt: skip
                want = ref if srt else by_pos
                p = want.clamp(min=0).long()
                want_slots = torch.where(want >= 0, table.long().gather(1, p // 64) * 64 + p % 64, -1)
                ok = torch.equal(out, want) and torch.equal(slots.long(), want_slots)
                print(f"k={k} cols={n_cols} {kw} sorted={srt}: {'exact' if ok else 'MISMATCH'}", flush=True)
                if not ok:
                    raise SystemExit(1)


def aot(cols_list: list[int], out: str) -> None:
    """Ahead of time (this machine's Triton, compile-only): registers, spills, shared memory and SASS instructions of
    the package's top-k kernel (C = 32) and each variant at the A/B's register launches (position order, page
    slots), sm_90 and sm_89. Static counts: the scan is straight-line code, but the passes' loops are counted once."""
    import json
    import tempfile

    import torch
    import triton

    from sparsemla.kernels import aot as kaot
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.indexer import topk as base

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        mods = {"package": base}
        for cols in cols_list:
            path = Path(tmp) / f"topk_w2d{cols}.py"
            path.write_text(variant_source(cols))
            mods[f"c{cols}"] = load(path, f"topk_w2d{cols}")
        for target in ("sm_90", "sm_89"):
            info = dev.target(target)
            for rows, n_cols, k in ((64, 16384, 2048), (64, 16384, 512), (64, 4096, 2048), (8, 16384, 2048)):
                for name, mod in mods.items():
                    sink: list = []
                    sass = Path(tempfile.mkdtemp(dir=tmp))
                    with kaot.compile_only(target, info, "w2d", sink, sass_dir=sass):
                        out_pos = torch.empty(rows, k, dtype=torch.int32)
                        mod.indexer_topk_fwd(torch.randn(rows, n_cols), torch.full((rows,), n_cols, dtype=torch.int32),
                                             k, out=out_pos, sorted=False, smem=False, page_size=64,
                                             page_table=torch.zeros(rows, n_cols // 64, dtype=torch.int32),
                                             out_slots=torch.empty_like(out_pos))  # fmt: skip
                    for r, f in zip(sink, sorted(sass.iterdir()), strict=True):
                        n = sum(1 for line in f.read_text().splitlines() if line.strip().endswith(";"))
                        rec = dict(target=target, rows=rows, cols=n_cols, k=k, code=name, kernel=r.kernel,
                                   shared=r.shared, registers=r.registers, spilled=r.spilled,
                                   sass_instructions=n)  # fmt: skip
                        print(json.dumps(rec), flush=True)
                        records.append(rec)
    if out:
        Path(out).write_text(json.dumps(dict(triton=triton.__version__, records=records), indent=1) + "\n")
        print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["write", "check", "aot"])
    p.add_argument("--cols", type=int, default=32, help="C: keys a row of the view (a power of two; 65536: one scan)")
    p.add_argument("--out", default="", help="write: the variant copy's path; aot: a JSON of the records")
    args = p.parse_args()
    if args.cols < 1 or args.cols & (args.cols - 1):
        raise SystemExit(f"--cols must be a power of two, got {args.cols}")
    if args.command == "write":
        if not args.out:
            raise SystemExit("write needs --out")
        Path(args.out).write_text(variant_source(args.cols))
        print(f"wrote {args.out}")
    elif args.command == "aot":
        aot(sorted({128, 65536, args.cols}), args.out)
    else:
        check(args.cols)


if __name__ == "__main__":
    main()
