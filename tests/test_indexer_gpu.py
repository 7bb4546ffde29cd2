"""Lightning-indexer Triton kernels on a CUDA GPU: logits against the fp32 reference over batch, next_n, lengths at
page edges, a page table far wider than the lengths, shuffled pages and extreme scales; exact top-k; the fused path;
CUDA-graph replays with changing lengths."""

from __future__ import annotations

import pytest
import torch

from sparsemla.kernels import device as dev
from sparsemla.kernels import layouts
from sparsemla.kernels.indexer import sglang_compat, topk
from sparsemla.kernels.indexer import triton as tri
from sparsemla.kernels.indexer.reference import indexer_logits_reference, indexer_topk_reference, row_lengths

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _inputs(seq, next_n, max_pages, seed, *, key_std=1.0, scale_range=(0.01, 0.1), q_std=2.0, w_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor(seq, dtype=torch.int32)
    need = sum(-(-s // 64) for s in seq) + 7
    kv = layouts.random_indexer_cache(need, generator=g, key_std=key_std, scale_range=scale_range)
    pt = layouts.random_page_table(seq_lens, max_pages, need, generator=g)
    q = (torch.randn(len(seq), next_n, 64, 128, generator=g) * q_std).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = torch.randn(len(seq) * next_n, 64, generator=g) * w_scale
    return q.to(DEV), kv.to(DEV), w.to(DEV), seq_lens.to(DEV), pt.to(DEV)


EDGE = [0, 1, 63, 64, 65]
CASES = [
    pytest.param(EDGE, 1, 4096, {}, id="B5-n1-edges-cap256k"),
    pytest.param(EDGE, 2, 4096, {}, id="B5-n2-edges-cap256k"),
    pytest.param([20000], 1, 16384, {}, id="B1-n1-20k-cap1M"),
    pytest.param([3000, 129, 7000, 1], 2, 512, {}, id="B4-n2-mixed"),
    pytest.param([5000] * 3 + [65] * 30, 1, 128, {}, id="B33-n1"),
    pytest.param([4100, 300], 1, 256, dict(key_std=50.0, scale_range=(1e-6, 1e3), q_std=100.0), id="extreme-scales"),
    pytest.param([2000, 70], 2, 64, dict(scale_range=(1e-20, 1e-18), w_scale=1e6), id="tiny-scales-huge-weights"),
]


@pytest.mark.parametrize("seq, next_n, max_pages, kw", CASES)
@pytest.mark.parametrize("dot", ["auto", "bf16", "bf16-opaque"])
def test_logits(seq, next_n, max_pages, kw, dot, monkeypatch):
    """Written positions match the fp32 reference (relative error); positions past each length stay NaN-poisoned.
    ``bf16-opaque``: sm_80/86's bf16 mode with its operands through the opaque move (LogitsConfig.opaque_bf16).

    fp8 ``tl.dot`` on Hopper accumulates with reduced precision (like DeepGEMM's fast accumulation): ~1e-4."""
    if dot.startswith("bf16"):
        monkeypatch.setattr(tri, "_dot_mode", lambda info: tri.DOT_BF16)
    q, kv, w, seq_lens, pt = _inputs(seq, next_n, max_pages, seed=sum(seq) + next_n, **kw)
    cap = max_pages * 64
    out = torch.full((len(seq) * next_n, cap), float("nan"), device=DEV)
    tri._launch_logits(q, kv, w, seq_lens, pt, out, cap, opaque_bf16=dot == "bf16-opaque")
    ref = indexer_logits_reference(q, kv, w, seq_lens, pt, None, cap, True)
    lens = row_lengths(seq_lens, len(seq), next_n, cap)
    written = torch.arange(cap, device=DEV)[None, :] < lens[:, None]
    assert torch.isfinite(out[written]).all()
    assert torch.isnan(out[~written]).all(), "a position past a row's length was written"
    if written.any():
        err = (out[written].double() - ref[written].double()).norm() / ref[written].double().norm()
        assert err < (1e-5 if dot.startswith("bf16") else 1e-3), err


def test_clean_logits_public_api():
    """clean_logits=True: -inf exactly past each length."""
    q, kv, w, seq_lens, pt = _inputs([300, 0, 64], 1, 64, seed=9)
    out = tri.indexer_logits_fwd(q, kv, w, seq_lens, pt, None, True)
    ref = indexer_logits_reference(q, kv, w, seq_lens, pt, None, None, True)
    assert torch.equal(torch.isinf(out), torch.isinf(ref))


@pytest.mark.parametrize("k", [512, 1024, 2048])
def test_topk_exact(k):
    """Exact top-k (recall 1.0, identical order) with ties, over lengths around k and long rows."""
    g = torch.Generator().manual_seed(k)
    lengths = torch.tensor([0, 1, k - 1, k, k + 1, 5000, 70000, 200000], dtype=torch.int32)
    logits = torch.randn(len(lengths), 200000, generator=g)
    logits[::2] = torch.round(logits[::2] * 8) / 8  # many ties at the threshold
    logits[3, : k // 2] = -0.0
    out = torch.full((len(lengths), k), -7, dtype=torch.int32, device=DEV)
    topk.indexer_topk_fwd(logits.to(DEV), lengths.to(DEV), k, out=out)
    ref = indexer_topk_reference(logits, lengths, k)
    assert torch.equal(out.cpu(), ref)


def _tied_rows(rows: int, cols: int, seed: int) -> torch.Tensor:
    """fp32 rows with heavy ties, negatives, +-0.0 and +-inf (even rows), plain random ones (odd rows)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x[::2] = torch.round(x[::2] * 8) / 8
    x[::2][torch.rand(x[::2].shape, generator=g) < 0.1] = -0.0
    x[::4][torch.rand(x[::4].shape, generator=g) < 0.001] = float("inf")
    x[::4][torch.rand(x[::4].shape, generator=g) < 0.001] = float("-inf")
    return x


@pytest.mark.parametrize("k", [512, 1024, 2048])
@pytest.mark.parametrize("slots", [False, True])
def test_topk_register_tiles(k, slots):
    """Rows of 4k, 8k and 16k (the in-register tiles and their edges) and longer (streaming) in one call, with the
    page-table transform too; exact positions and order against the reference."""
    small, big = topk.TOPK_ROW_TILES
    lengths = [k + 1, small - 1, small, small + 1, 8192, big - 1, big, big + 1, 3 * big]
    cols = 3 * big
    logits = _tied_rows(len(lengths), cols, seed=k + slots)
    lens = torch.tensor(lengths, dtype=torch.int32)
    ref = indexer_topk_reference(logits, lens, k)
    out = torch.full((len(lengths), k), -7, dtype=torch.int32, device=DEV)
    if not slots:
        topk.indexer_topk_fwd(logits.to(DEV), lens.to(DEV), k, out=out)
        assert torch.equal(out.cpu(), ref)
        return
    g = torch.Generator().manual_seed(k)
    table = torch.randperm(len(lengths) * cols // 64, generator=g).view(len(lengths), -1).to(torch.int32)
    pos_slots = torch.full((len(lengths), k), -7, dtype=torch.int32, device=DEV)
    topk.indexer_topk_fwd(
        logits.to(DEV), lens.to(DEV), k, out=out, page_table=table.to(DEV), page_size=64, out_slots=pos_slots
    )
    assert torch.equal(out.cpu(), ref)
    p = ref.clamp(min=0).long()
    expect = torch.where(ref >= 0, table.long().gather(1, p // 64) * 64 + p % 64, -1)
    assert torch.equal(pos_slots.cpu().long(), expect)


def test_topk_more_rows_than_sms():
    """More rows than SMs: the launcher drops the large register tile; rows of every length still come out exact."""
    rows = dev.launch_info(torch.device(DEV)).num_sms + 40
    g = torch.Generator().manual_seed(17)
    lengths = torch.randint(0, 20000, (rows,), generator=g, dtype=torch.int32)
    lengths[:6] = torch.tensor([0, 512, 513, 4096, 4097, 16385], dtype=torch.int32)
    logits = _tied_rows(rows, 20000, seed=17)
    out = topk.indexer_topk_fwd(logits.to(DEV), lengths.to(DEV), 512)
    assert torch.equal(out.cpu(), indexer_topk_reference(logits, lengths, 512))


@pytest.mark.parametrize("k", [512, 1024, 2048])
@pytest.mark.parametrize("next_n", [1, 2])
def test_fused_register_tiles(k, next_n):
    """The fused tail on decode-sized rows (4k, 8k, 16k and a streamed 20k) in a 64k-wide page table, and on a row of
    all-equal logits (zero query): exactly top-k of the unfused logits."""
    fused_small, fused_big = tri.FUSED_ROW_TILES
    seq = [fused_small, fused_small + 1, 8192, fused_big, fused_big + 1, 20000, 3000]
    q, kv, w, seq_lens, pt = _inputs(seq, next_n, 1024, seed=k + next_n)
    q[-1, 0] = torch.zeros(q.shape[2:], device=DEV).to(q.dtype)  # that row's logits are all 0.0: its first k win
    cap = pt.shape[1] * 64
    out = torch.full((len(seq) * next_n, k), -7, dtype=torch.int32, device=DEV)
    tri.indexer_logits_topk_fwd(q, kv, w, seq_lens, pt, k, cap, out=out, fuse=True)
    logits = tri.indexer_logits_fwd(q, kv, w, seq_lens, pt, cap, True)
    ref = indexer_topk_reference(logits.cpu(), row_lengths(seq_lens, len(seq), next_n, cap).cpu(), k)
    assert torch.equal(out.cpu(), ref)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "logits-then-split-topk"])
@pytest.mark.parametrize("next_n", [1, 2])
def test_fused_equals_unfused_and_is_graph_safe(next_n, fuse):
    """Both decode schedules (the fused launch, and the logits launch then the split top-k that rows wider than
    FUSED_MAX_COLS take) give exactly top-k(logits); replays of a captured graph follow new lengths."""
    seq = [9000, 0, 1, 65, 700, 30000]
    q, kv, w, seq_lens, pt = _inputs(seq, next_n, 2048, seed=next_n)
    cap = pt.shape[1] * 64
    k = 512

    def expected(lens):
        logits = tri.indexer_logits_fwd(q, kv, w, lens, pt, cap, True)
        return indexer_topk_reference(logits.cpu(), row_lengths(lens, len(seq), next_n, cap).cpu(), k)

    out = torch.full((len(seq) * next_n, k), -7, dtype=torch.int32, device=DEV)
    for _ in range(2):  # counters must be reset by every launch
        tri.indexer_logits_topk_fwd(q, kv, w, seq_lens, pt, k, cap, out=out, fuse=fuse)
        assert torch.equal(out.cpu(), expected(seq_lens))

    lens = seq_lens.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tri.indexer_logits_topk_fwd(q, kv, w, lens, pt, k, cap, out=out, fuse=fuse)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tri.indexer_logits_topk_fwd(q, kv, w, lens, pt, k, cap, out=out, fuse=fuse)
    for new in ([100, 5, 0, 64, 9000, 29000], [30000, 30000, 2, 3, 4, 5]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), expected(lens))


def _by_position(ref: torch.Tensor) -> torch.Tensor:
    """The reference's sets in ascending position order, -1 padded (the ``sorted=False`` order)."""
    big = torch.iinfo(torch.int32).max
    pos = torch.where(ref >= 0, ref, big).sort(dim=1).values
    return torch.where(pos == big, -1, pos)


def _captured(call) -> torch.cuda.CUDAGraph:  # noqa: ANN001
    """``call`` warmed up on a side stream (launch-time allocations happen outside the capture), then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def _split_rows(k: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows for the split path: lengths around k and the span edges, long rows with heavy ties, an all-equal row, a
    row of -inf, a row of NaN-free random logits."""
    lengths = [0, 1, k - 1, k, k + 1, 1023, 1024, 1025, 4097, 9000, cols // 2, cols, cols, cols]
    logits = _tied_rows(len(lengths), cols, seed)
    logits[-2] = 0.25  # all equal: the first k positions win
    logits[-1] = float("-inf")
    return logits, torch.tensor(lengths, dtype=torch.int32)


@pytest.mark.parametrize("filt", ["filter", "radix-registers", "radix-streaming", "radix-default"])
@pytest.mark.parametrize("splits", [2, 4, 32])
@pytest.mark.parametrize("sort", [True, False], ids=["by-value", "by-position"])
@pytest.mark.parametrize("k", [512, 2048])
def test_topk_split_rows(k, sort, splits, filt):
    """Rows shared by several programs (1024-position spans to reach many participants), through the two-pass filter
    (its random rows pass it, tied and all-equal ones overflow it into the radix passes) or the radix passes alone
    (spans of at most 4096 positions in registers, longer ones streaming; every span streaming; or the launcher's own
    choice, a 1024 tile where SPLIT_REG_TILE[k] holds spans): exact sets, the order asked for, page slots,
    NaN-poisoned outputs fully written, and the workspace left at zero for the next launch."""
    tiles = (topk.FILTER_TILES[k] if topk.FILTER_TILES[k][0] else (4096, 4096)) if filt == "filter" else (0, 0)
    reg_span = {"radix-streaming": 0, "radix-default": None}.get(filt, 4096)  # <= 4096 in registers, longer stream
    logits, lens = _split_rows(k, 70000, seed=k + splits)
    ref = indexer_topk_reference(logits, lens, k)
    expect = ref if sort else _by_position(ref)
    g = torch.Generator().manual_seed(splits)
    table = torch.randperm(len(lens) * 70016 // 64, generator=g).view(len(lens), -1).to(torch.int32)
    out = torch.full((len(lens), k), -7, dtype=torch.int32, device=DEV)
    slots = torch.full((len(lens), k), -7, dtype=torch.int32, device=DEV)
    for _ in range(2):  # the workspace must come back to zero after every launch
        topk.indexer_topk_fwd(
            logits.to(DEV), lens.to(DEV), k, out=out, page_table=table.to(DEV), page_size=64, out_slots=slots,
            sorted=sort, splits=splits, span=1024, filter_tiles=tiles, reg_span=reg_span,
        )  # fmt: skip
        assert torch.equal(out.cpu(), expect)
        p = expect.clamp(min=0).long()
        assert torch.equal(
            slots.cpu().long(), torch.where(expect >= 0, table.long().gather(1, p // 64) * 64 + p % 64, -1)
        )
        ws = topk._SPLIT_WS.bufs[torch.device(DEV, torch.cuda.current_device())]
        assert int(ws.abs().sum()) == 0, "ticket, counters, histograms, span counts or group maxima left non-zero"


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_topk_split_register_digits(bits):
    """The register path of split participants with each digit width: 32 participants of <= 2048 positions, rows of
    heavy ties, all-equal and -inf rows among random ones; exact sets in position order and a zeroed workspace."""
    k = 512
    logits, lens = _split_rows(k, 40000, seed=bits)
    expect = _by_position(indexer_topk_reference(logits, lens, k))
    out = torch.full((len(lens), k), -7, dtype=torch.int32, device=DEV)
    for _ in range(2):
        topk.indexer_topk_fwd(logits.to(DEV), lens.to(DEV), k, out=out, sorted=False, splits=32, span=1024,
                              filter_tiles=(0, 0), reg_span=2048, reg_bits=bits)  # fmt: skip
        assert torch.equal(out.cpu(), expect)
        ws = topk._SPLIT_WS.bufs[torch.device(DEV, torch.cuda.current_device())]
        assert int(ws.abs().sum()) == 0


def test_topk_split_many_rows_and_graph_replay():
    """More programs than the SMs hold at once (waves of split rows), the launcher's own split choice, and a captured
    graph replayed with new lengths (the grid comes from shapes only)."""
    rows, cols, k = 300, 40000, 512
    assert topk.topk_splits(8, cols, topk.dev.device_info(torch.device(DEV))) > 1
    logits = _tied_rows(rows, cols, seed=3).to(DEV)
    lens = torch.randint(0, cols + 1, (rows,), dtype=torch.int32).to(DEV)
    out = torch.full((rows, k), -7, dtype=torch.int32, device=DEV)
    topk.indexer_topk_fwd(logits, lens, k, out=out, splits=16, span=2048)
    assert torch.equal(out.cpu(), indexer_topk_reference(logits.cpu(), lens.cpu(), k))

    few, few_lens = logits[:8].contiguous(), lens[:8].clone()
    few_out = torch.full((8, k), -7, dtype=torch.int32, device=DEV)
    graph = _captured(lambda: topk.indexer_topk_fwd(few, few_lens, k, out=few_out, sorted=False))
    for new in ([cols] * 8, [0, 1, 511, 512, 513, 5000, 20000, cols]):
        few_lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(few_out.cpu(), _by_position(indexer_topk_reference(few.cpu(), few_lens.cpu(), k)))


@pytest.mark.parametrize("sort", [True, False], ids=["by-value", "by-position"])
@pytest.mark.parametrize("cols", [16384, 65536], ids=["one-program", "16k-spans"])
@pytest.mark.parametrize("k", [512, 2048])
def test_topk_wide_launch(k, cols, sort):
    """The wide launch the launcher takes at >= WIDE_MIN_ROWS rows: 16-warp programs, rows of up to 16k in one
    register tile, longer ones in 16k register spans (``smem=False``: test_topk_smem_spans covers the spans in shared
    memory that smem_spans picks for position order where these need two waves). Lengths around k and the span
    edges, heavy ties, all-equal and -inf rows; exact against the reference, the workspace left at zero, and a
    captured graph replayed with new lengths equal to eager calls."""
    info = topk.dev.device_info(torch.device(DEV))
    rows = topk.WIDE_MIN_ROWS + 3
    launch = topk.choose_topk_launch(rows, cols, k, info)
    assert launch.wide and launch.splits == cols // topk.WIDE_SPAN
    lengths = [0, 1, k - 1, k, k + 1, 4096, 4097, 9000, 16383, 16384, 16385, 40000, cols, cols]
    lengths = torch.tensor([min(n, cols) for n in lengths] * 3, dtype=torch.int32)[:rows]
    logits = _tied_rows(rows, cols, seed=k + cols)
    logits[-2] = 0.25  # all equal: the first k positions win
    logits[-1] = float("-inf")
    out = torch.full((rows, k), -7, dtype=torch.int32, device=DEV)
    dl, dn = logits.to(DEV), lengths.to(DEV)
    topk.indexer_topk_fwd(dl, dn, k, out=out, sorted=sort, smem=False)
    ref = indexer_topk_reference(logits, lengths, k)
    assert torch.equal(out.cpu(), ref if sort else _by_position(ref))
    ws = topk._SPLIT_WS.bufs.get(torch.device(DEV, torch.cuda.current_device()))
    assert ws is None or int(ws.abs().sum()) == 0
    graph = _captured(lambda: topk.indexer_topk_fwd(dl, dn, k, out=out, sorted=sort, smem=False))
    new = torch.randint(0, cols + 1, (rows,), generator=torch.Generator().manual_seed(cols), dtype=torch.int32)
    dn.copy_(new)
    out.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    ref = indexer_topk_reference(logits, new, k)
    assert torch.equal(out.cpu(), ref if sort else _by_position(ref))


def _slot_rows(rows: int, cols: int, k: int, lengths: list[int]) -> tuple:
    """Position-order top-k inputs with page slots: CPU ``(logits, lengths, table)`` (tied rows, an all-equal and a
    -inf row last; lengths cycled over the rows), their device copies and NaN-like poisoned outputs (-7)."""
    lengths = torch.tensor((lengths * 5)[:rows], dtype=torch.int32)
    logits = _tied_rows(rows, cols, seed=k + rows)
    logits[-2] = 0.25  # all equal: the first k positions win
    logits[-1] = float("-inf")
    g = torch.Generator().manual_seed(rows)
    table = torch.randperm(rows * cols // 64, generator=g).view(rows, -1).to(torch.int32)
    out = torch.full((rows, k), -7, dtype=torch.int32, device=DEV)
    return logits, lengths, table, logits.to(DEV), lengths.to(DEV), table.to(DEV), out, torch.full_like(out, -7)


def _split_ws_sum() -> int:
    """Sum of |ints| of the split workspace on this device (every launch leaves it at zero)."""
    return int(topk._SPLIT_WS.bufs[torch.device(DEV, torch.cuda.current_device())].abs().sum())


def _check_slot_rows(out, slots, logits, table, lens, k) -> None:  # noqa: ANN001
    """``out`` holds the reference top-k positions in ascending order and ``slots`` their 64-token page slots."""
    expect = _by_position(indexer_topk_reference(logits, lens, k))
    assert torch.equal(out.cpu(), expect)
    p = expect.clamp(min=0).long()
    assert torch.equal(slots.cpu().long(), torch.where(expect >= 0, table.long().gather(1, p // 64) * 64 + p % 64, -1))


@pytest.mark.parametrize("kind", ["no-long-row", "long-rows", "one-long-row"])
@pytest.mark.parametrize("k", [512, 2048])
def test_topk_length_split_kinds(k, kind, monkeypatch):
    """topk.LENGTH_SPLIT with rows of every kind at a 64k capacity: ``no-long-row`` (lengths up to WIDE_SPAN, so
    every shared-memory program finds no row of its own), ``long-rows`` and ``one-long-row`` (only a row near the
    end). 64 rows x 64k (the launcher's default there is the split), lengths -3 .. cap + 5; exact positions in
    ascending order and page slots, poisoned outputs fully written, the workspace (start ticket included) left at
    zero, and a captured graph replayed with new lengths of another kind equal to the reference."""
    rows, cols = 64, 65536
    info = topk.dev.device_info(torch.device(DEV))
    if not topk.smem_spans(rows, cols, k, info):
        pytest.skip(f"the launcher does not split {rows} rows of {cols} at k = {k} on {info.name}")
    monkeypatch.setattr(topk, "LENGTH_SPLIT", True)
    long_row = rows - 3  # a random row (the last two are all-equal and -inf)
    lengths = [0, 1, k - 1, k, k + 1, 4096, 4097, 9000, 16383, 16384, 16385, 40000, cols, -3, cols + 5]
    if kind != "long-rows":
        lengths = [min(n, topk.WIDE_SPAN) for n in lengths]
    logits, lengths, table, dl, dn, dt, out, slots = _slot_rows(rows, cols, k, lengths)
    if kind == "one-long-row":
        lengths[long_row] = cols - 1
        dn[long_row] = cols - 1

    def call() -> None:
        topk.indexer_topk_fwd(dl, dn, k, out=out, page_table=dt, page_size=64, out_slots=slots, sorted=False)

    call()
    torch.cuda.synchronize()
    _check_slot_rows(out, slots, logits, table, lengths, k)
    assert _split_ws_sum() == 0
    graph = _captured(call)
    longest = cols if kind == "no-long-row" else topk.WIDE_SPAN  # replayed with lengths of another kind
    new = torch.randint(0, longest + 1, (rows,), generator=torch.Generator().manual_seed(k), dtype=torch.int32)
    if kind == "long-rows":
        new[long_row] = cols  # one long row among short ones
    dn.copy_(new)
    out.fill_(-7)
    slots.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    _check_slot_rows(out, slots, logits, table, new, k)
    assert _split_ws_sum() == 0


@pytest.mark.parametrize("split", [False, True], ids=["smem", "length-split"])
@pytest.mark.parametrize("rows", [64, 37], ids=["64-rows", "37-rows"])
@pytest.mark.parametrize("k", [512, 1024, 2048])
def test_topk_smem_spans(k, rows, split, monkeypatch):
    """The spans in shared memory (topk_smem, Gluon; ``smem=True``): lengths 0, 1, k - 1 .. k + 1, one to four
    participants (SMEM_MIN_SPAN each), around 16k and the 64k capacity, heavy ties, all-equal and -inf rows; exact
    positions in ascending order and page slots, poisoned outputs fully written, two launches on the workspace the
    first left at zero, and a captured graph replayed with new lengths equal to the reference. ``length-split``: the
    launcher's default where smem_spans holds, with LENGTH_SPLIT (rows up to 16k in the register launch, longer ones
    in shared memory on a forked stream, in one captured graph)."""
    from sparsemla.kernels.indexer import topk_smem

    info = topk.dev.device_info(torch.device(DEV))
    cols = 65536
    if topk_smem.fits(rows, cols, k, info):
        pytest.skip(topk_smem.fits(rows, cols, k, info))
    if split and not topk.smem_spans(rows, cols, k, info):
        pytest.skip(f"smem_spans does not take {rows} rows of {cols} at k = {k} on {info.name}")
    monkeypatch.setattr(topk, "LENGTH_SPLIT", split)
    forks = []
    monkeypatch.setattr(topk, "_length_split", lambda *a, f=topk._length_split: forks.append(1) or f(*a))
    lengths = [0, 1, k - 1, k, k + 1, 4096, 4097, 9000, 12289, 16383, 16384, 16385, 30000, 40000, cols - 1, cols, cols]
    lengths += [-3, cols + 5]  # clamped to 0 and to the capacity by both kernels alike
    logits, lengths, table, dl, dn, dt, out, slots = _slot_rows(rows, cols, k, lengths)
    g = torch.Generator().manual_seed(rows)

    def call() -> None:
        topk.indexer_topk_fwd(dl, dn, k, out=out, page_table=dt, page_size=64, out_slots=slots, sorted=False,
                              smem=None if split else True)  # fmt: skip

    def check(lens: torch.Tensor) -> None:
        _check_slot_rows(out, slots, logits, table, lens, k)
        assert _split_ws_sum() == 0, "ticket, counters, histograms or span counts left non-zero"

    for _ in range(2):
        call()
        check(lengths)  # no device-wide sync: the copies to the host wait for the current stream only (and its join)
    assert len(forks) == (2 if split else 0)
    graph = _captured(call)
    new = torch.randint(0, cols + 1, (rows,), generator=g, dtype=torch.int32)
    dn.copy_(new)
    out.fill_(-7)
    slots.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    check(new)
    if split:  # each kernel alone leaves the other's rows poisoned: no row is written twice
        short = (new.clamp(0, cols) <= topk.WIDE_SPAN).to(DEV)
        expect_new = _by_position(indexer_topk_reference(logits, new, k))
        ws = topk._SPLIT_WS.get(dl.device, rows, topk_smem.SMEM_SPLITS, 0, topk_smem.workspace_region())

        def smem_alone() -> None:
            topk_smem.topk_smem_fwd(dl, dn, k, out, dt, slots, 64, ws, len_min=topk.WIDE_SPAN)

        def regs_alone() -> None:
            topk.indexer_topk_fwd(dl, dn, k, out=out, page_table=dt, page_size=64, out_slots=slots, sorted=False,
                                  smem=False, length_max=topk.WIDE_SPAN)  # fmt: skip

        for launch, untouched in ((smem_alone, short), (regs_alone, ~short)):
            out.fill_(-7)
            slots.fill_(-7)
            launch()
            assert bool((out[untouched] == -7).all()) and bool((slots[untouched] == -7).all())
            written = (~untouched).cpu()
            assert torch.equal(out.cpu()[written], expect_new[written])


def test_sglang_topk_transform_contract():
    """sglang's topk_transform_paged contract: page-table slots (-1 padded) and raw positions; v2 raw mode."""
    g = torch.Generator().manual_seed(5)
    rows, k = 6, 512
    lengths = torch.tensor([0, 3, 600, 512, 5000, 40000], dtype=torch.int32)
    scores = torch.randn(rows, 40960, generator=g)
    table = torch.randperm(4000, generator=g)[: rows * 640].view(rows, 640).to(torch.int32)
    slots = torch.full((rows, k), -7, dtype=torch.int32, device=DEV)
    raw = torch.full((rows, k), -7, dtype=torch.int32, device=DEV)
    sglang_compat.topk_transform_paged(scores.to(DEV), lengths.to(DEV), table.to(DEV), slots, 64, raw)
    ref = _by_position(indexer_topk_reference(scores, lengths, k))  # sglang's order is unspecified: ours by position
    assert torch.equal(raw.cpu(), ref)
    p = ref.clamp(min=0).long()
    assert torch.equal(slots.cpu().long(), torch.where(ref >= 0, table.long().gather(1, p // 64) * 64 + p % 64, -1))
    only = torch.full((rows, k), -7, dtype=torch.int32, device=DEV)
    sglang_compat.topk_transform_paged_v2(scores.to(DEV), lengths.to(DEV), None, only, 64, torch.empty(0))
    assert torch.equal(only.cpu(), ref)
