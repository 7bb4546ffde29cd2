"""The indexer's exact top-k with each participant's span in shared memory (Gluon): the split protocol of
:mod:`sparsemla.kernels.indexer.topk` (start tickets, 8-bit radix passes merged by int32 atomics into the row's
histogram behind a per-row arrival counter, the spans' winner counts exchanged, winners at their position-order slots),
over order keys read back from shared memory one CHUNK at a time instead of held in registers.

Why: a split participant of the Triton kernel holds its 16k-key span in registers (~128 a thread at 512 threads), so
an SM holds one and B = 64 rows of 64k (256 participants) take two waves on 132 SMs. Here a participant is 8 warps with
73-83 registers a thread and SMEM_SPAN * 4 B of keys (66,560 B ahead of time on sm_90), so an sm_90 / sm_100 SM holds
three and the same launch runs in one wave (measurements against the register spans:
results/bench/explore/topk_smem_ab4-native-h100-e66452d.json).

Contract: :func:`topk_smem_fwd` = ``indexer_topk_fwd(sorted=False)``: positions [rows, K] int32 in ascending order,
-1 padded, ties at the threshold to the smaller positions, and with a page table the page slots
``page_table[row, pos >> PAGE_BITS] << PAGE_BITS | pos & (page_size - 1)``. A row of length n > K is selected by
``min(ceil(n / SMEM_MIN_SPAN), SMEM_SPLITS)`` participants of equal spans (at most SMEM_SPAN keys each); a row of
one participant never touches the workspace beyond its ticket (no global histograms, barriers or count exchange).
The grid is ``rows * SMEM_SPLITS`` programs whatever the lengths (graph-safe); programs without a span exit.
Workspace: the Triton kernel's (int32, zero between launches, ``topk._SPLIT_WS`` sized by
:func:`workspace_region`), laid out here as [ticket | rows counters | rows x PASSES * 256 histograms |
rows x 2 * SMEM_SPLITS counts | unused]. No sort (Gluon has none): the launcher keeps ``sorted=True`` on the Triton
kernel. Gluon does not run on Triton's interpreter; the GPU tests run it in both code paths.
"""

from __future__ import annotations

import torch
import triton

try:  # Gluon (Triton >= 3.6); without it the Triton kernel runs
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    _HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    _HAVE_GLUON = False

from sparsemla.kernels import device as dev

SMEM_SPAN = 16384  # keys a participant holds (64 KB)
SMEM_CHUNK = 2048  # keys read back from shared memory at a time (8 a thread)
SMEM_SPLITS = 4  # participants a row may have: rows up to SMEM_SPLITS * SMEM_SPAN positions
SMEM_MIN_SPAN = 4096  # a row takes one participant per this many keys (up to SMEM_SPLITS)
SMEM_WARPS = 8
# ahead of time (Triton 3.8): the keys plus the histograms' scratch
SHARED_BYTES = SMEM_SPAN * 4 + 1024
RADIX_BINS = 256  # 8-bit digits
RADIX_PASSES = 4


def available() -> bool:
    """Whether this Triton has Gluon in a version this kernel is built and tested with (3.6, the GPU machine's, and
    3.8, production's)."""
    return _HAVE_GLUON and dev.triton_at_least(3, 6)


def resident(info: dev.DeviceInfo) -> int:
    """Participants one SM of ``info`` holds at once (shared memory and threads; 75-78 registers a thread on sm_90 /
    sm_100 never bind below three)."""
    return dev.resident_blocks(info, SHARED_BYTES, 32 * SMEM_WARPS)


if _HAVE_GLUON:
    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # Triton 3.8's name; 3.6 calls it thread_barrier

    NB: gl.constexpr = gl.constexpr(RADIX_BINS)
    PASSES: gl.constexpr = gl.constexpr(RADIX_PASSES)
    MIN_I32: gl.constexpr = gl.constexpr(-2147483648)

    @gluon.jit
    def _order_key(v):
        """int32 image of fp32 ``v`` whose signed order is the float order (-0.0 onto +0.0; NaN unsupported)."""
        x = v.to(gl.int32, bitcast=True)
        x = gl.where(x == MIN_I32, 0, x)
        return x ^ ((x >> 31) & 0x7FFFFFFF)

    @gluon.jit
    def _add(a, b):
        return a + b

    @gluon.jit
    def _arrive_and_wait(bar_ptr, target):
        """This program's arrival at the row's counter, then a spin until ``target`` arrivals; the CTA barrier first
        orders every thread's earlier stores and atomics before the release."""
        _barrier()
        n = gl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") + 1
        while n < target:
            n = gl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        _barrier()

    @gluon.jit
    def _page_slots(pt_row_ptr, pos, ok, PAGE_BITS: gl.constexpr):
        """``page_table[pos >> PAGE_BITS] << PAGE_BITS | pos & page_mask`` where ``ok``, else -1."""
        page = gl.load(pt_row_ptr + (pos >> PAGE_BITS), mask=ok, other=0)
        return gl.where(ok, (page << PAGE_BITS) | (pos & ((1 << PAGE_BITS) - 1)), -1)

    @gluon.jit
    def _topk_smem_kernel(
        logits_ptr,  # fp32 [rows, >= lengths], unit column stride
        lens_ptr,  # int32 [rows]
        idx_ptr,  # int32 [rows, K]: positions, ascending, -1 padded
        pt_ptr,  # int32 [rows, max_pages] (WRITE_SLOTS)
        slot_ptr,  # int32 [rows, K] page slots, -1 padded (WRITE_SLOTS)
        ws_ptr,  # int32 workspace, see the module docstring
        stride_l,
        stride_idx,
        stride_pt,
        stride_slot,
        n_cols,
        n_rows,
        len_min,  # rows of at most this many positions are another launch's (topk.LENGTH_SPLIT): left untouched
        K: gl.constexpr,
        WRITE_SLOTS: gl.constexpr,
        PAGE_BITS: gl.constexpr,
        SPLITS: gl.constexpr,
        SPAN: gl.constexpr,
        CHUNK: gl.constexpr,
        MIN_SPAN: gl.constexpr,
        NUM_WARPS: gl.constexpr,
    ):
        NCH: gl.constexpr = SPAN // CHUNK
        L1: gl.constexpr = gl.BlockedLayout([4], [32], [NUM_WARPS], [0])  # a chunk: 4 contiguous keys a thread
        LH: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])  # histograms, counts, the K outputs
        keys = gl.allocate_shared_memory(gl.int32, [NCH, CHUNK], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # order keys

        ticket = gl.atomic_add(ws_ptr, 1, sem="relaxed", scope="gpu")
        if ticket == n_rows * SPLITS - 1:
            gl.atomic_xchg(ws_ptr, 0, sem="relaxed", scope="gpu")  # the last ticket: ready for the next launch
        i_r = (ticket // SPLITS).to(gl.int64)
        part = ticket % SPLITS
        n = gl.minimum(gl.maximum(gl.load(lens_ptr + i_r), 0), n_cols)
        # participants: one per MIN_SPAN keys up to SPLITS (a short row still spreads over SMs; spans <= SPAN)
        n_part = gl.minimum(gl.maximum(gl.cdiv(n, MIN_SPAN), 1), SPLITS)
        o_k = gl.arange(0, K, layout=LH)
        p_idx = idx_ptr + i_r * stride_idx
        mine = n > len_min
        if (n <= K) & (part == 0) & mine:  # no selection: every position, then -1
            gl.store(p_idx + o_k, gl.where(o_k < n, o_k, -1))
            if WRITE_SLOTS:
                gl.store(slot_ptr + i_r * stride_slot + o_k, _page_slots(pt_ptr + i_r * stride_pt, o_k, o_k < n,
                                                                         PAGE_BITS))  # fmt: skip
        if (n > K) & (part < n_part) & mine:
            rows64 = i_r * 0 + n_rows  # int64: the regions' offsets grow with the row count
            p_bar = ws_ptr + 1 + i_r
            p_hist = ws_ptr + 1 + rows64 + i_r * (PASSES * NB)
            p_cnt = ws_ptr + 1 + rows64 * (1 + PASSES * NB) + i_r * (2 * SPLITS)
            src = logits_ptr + i_r * stride_l
            span = gl.cdiv(n, n_part)
            lo = part * span
            hi = gl.minimum(lo + span, n)
            n_ch = gl.cdiv(hi - lo, CHUNK)  # chunks this span fills (<= NCH)
            o_c = gl.arange(0, CHUNK, layout=L1)
            o_h = gl.arange(0, NB, layout=LH)
            for c in range(n_ch):  # global -> order keys -> shared memory (a runtime loop: one chunk live at a time)
                offs = lo + c * CHUNK + o_c
                keys.index(c).store(_order_key(gl.load(src + offs, mask=offs < hi, other=0.0)))  # [CHUNK]
            _barrier()
            zero = n * 0
            prefix = zero  # the threshold's sign-flipped bits, one digit at a time from the top
            k_rem = zero + K  # keys still to take from the bin matching ``prefix``
            low = zero + 32  # low bits of the threshold not determined yet
            more = zero + 1  # 0 once a pass leaves exactly k_rem keys in its threshold bin
            phase = zero
            n_above = zero  # this span's keys above the settled bits / sharing them
            n_in = zero
            for p in gl.static_range(PASSES):
                top = 32 - 8 * p  # bits at and above ``top`` are settled (constexpr: p is a static index)
                shift = top - 8  # this pass's digit: bits [shift, top)
                if more != 0:
                    hist = gl.zeros([NB], gl.int32, layout=LH)
                    for c in range(n_ch):
                        u = keys.index(c).load(L1) ^ MIN_I32  # [CHUNK] sign flipped: digit order is key order
                        m = (lo + c * CHUNK + o_c) < hi
                        if p > 0:
                            m = m & ((u >> top) == (prefix >> top))
                        hist += gl.histogram((u >> shift) & (NB - 1), NB, mask=m, layout=LH)  # [NB]
                    own = hist
                    if n_part > 1:  # the row's histogram, every participant's merged behind the row's barrier
                        gl.atomic_add(p_hist + p * NB + o_h, hist, mask=hist > 0, sem="relaxed", scope="gpu")
                        phase += 1
                        _arrive_and_wait(p_bar, phase * n_part)
                        hist = gl.load(p_hist + p * NB + o_h, cache_modifier=".cg")  # [NB] the whole row's
                    ge = gl.associative_scan(hist, 0, _add, reverse=True)  # [NB] keys at or above each bin
                    d = gl.sum((ge >= k_rem).to(gl.int32), axis=0) - 1  # the bin of the k_rem-th largest key
                    above = gl.sum(gl.where(o_h > d, hist, 0), axis=0)
                    in_bin = gl.sum(gl.where(o_h == d, hist, 0), axis=0)
                    n_above += gl.sum(gl.where(o_h > d, own, 0), axis=0)
                    n_in = gl.sum(gl.where(o_h == d, own, 0), axis=0)
                    k_rem -= above
                    prefix = prefix | (d << shift)
                    low = zero + shift
                    more = (in_bin != k_rem).to(gl.int32)
            o_s = gl.arange(0, SPLITS, layout=LH)
            gt_before = zero  # winners above / at the threshold in earlier spans
            eq_before = zero
            if n_part > 1:  # the spans' counts above / at the threshold, exchanged: where this span's winners start
                gl.store(p_cnt + part * 2, n_above)
                gl.store(p_cnt + part * 2 + 1, n_in)
                phase += 1
                _arrive_and_wait(p_bar, phase * n_part)
                earlier = o_s < part
                gt_before = gl.sum(gl.load(p_cnt + o_s * 2, mask=earlier, other=0, cache_modifier=".cg"), axis=0)
                eq_before = gl.sum(gl.load(p_cnt + o_s * 2 + 1, mask=earlier, other=0, cache_modifier=".cg"), axis=0)
            thr = (prefix ^ MIN_I32) >> low  # the settled bits in signed order-key form
            for c in range(n_ch):  # the winners, a chunk at a time, at their position-order slots
                offs = lo + c * CHUNK + o_c
                valid = offs < hi
                hk = keys.index(c).load(L1) >> low  # [CHUNK]
                gt = (valid & (hk > thr)).to(gl.int32)
                eq = (valid & (hk == thr)).to(gl.int32)
                both = gt | (eq << 16)  # one scan counts both (a chunk holds fewer than 65536 keys)
                before = gl.associative_scan(both, 0, _add) - both
                eq_rank = eq_before + (before >> 16)  # ties before this one in the row
                take = (gt != 0) | ((eq != 0) & (eq_rank < k_rem))
                slot = gt_before + (before & 0xFFFF) + gl.minimum(eq_rank, k_rem)  # winners before this one
                gl.store(p_idx + slot, offs, mask=take)
                gt_before += gl.sum(gt, axis=0)
                eq_before += gl.sum(eq, axis=0)
            _barrier()  # every thread's winners stored before this program's arrival (or its own slot loads)
            if n_part > 1:
                arrived = gl.atomic_add(p_bar, 1, sem="acq_rel", scope="gpu") + 1
                last = arrived == (phase + 1) * n_part
                if last:  # the last participant: every other one is past the row's workspace
                    gl.store(p_hist + gl.arange(0, PASSES * NB, layout=LH),
                             gl.zeros([PASSES * NB], gl.int32, layout=LH))  # fmt: skip
                    gl.store(p_cnt + o_s, gl.zeros([SPLITS], gl.int32, layout=LH))
                    gl.store(p_cnt + SPLITS + o_s, gl.zeros([SPLITS], gl.int32, layout=LH))
                    gl.atomic_xchg(p_bar, 0, sem="relaxed", scope="gpu")
            else:  # one participant: no workspace touched beyond the ticket
                last = n_part == 1
            if WRITE_SLOTS:
                if last:  # every participant's winners are in (their stores came before their arrival)
                    pos = gl.load(p_idx + o_k, cache_modifier=".cg")  # [K] ascending
                    gl.store(slot_ptr + i_r * stride_slot + o_k, _page_slots(pt_ptr + i_r * stride_pt, pos,
                                                                             pos >= 0, PAGE_BITS))  # fmt: skip


def workspace_region() -> int:
    """Histogram ints per row this kernel needs of the Triton kernel's split workspace (``hist_region`` there)."""
    return RADIX_PASSES * RADIX_BINS


def fits(rows: int, n_cols: int, k: int, info: dev.DeviceInfo) -> str | None:
    """Why this kernel cannot take the launch, or None: Gluon, the GPU (a CUDA device, not the interpreter), rows of
    at most SMEM_SPLITS * SMEM_SPAN positions, ``k`` in (512, 1024, 2048), and every participant of a row resident at
    once (no deadlock at the row's barriers)."""
    if not available():
        return f"Gluon (Triton >= 3.6) is not available (Triton {triton.__version__})"
    if info is dev.INTERPRETER:
        return "Gluon kernels do not run on Triton's interpreter"
    if n_cols > SMEM_SPLITS * SMEM_SPAN:
        return f"rows of at most {SMEM_SPLITS * SMEM_SPAN} positions, got a capacity of {n_cols}"
    if k not in (512, 1024, 2048):
        return f"k must be 512, 1024 or 2048, got {k}"
    if resident(info) * info.num_sms < SMEM_SPLITS:
        return f"{info.name or 'this GPU'} holds fewer than {SMEM_SPLITS} programs of {SHARED_BYTES} B at once"
    return None


def topk_smem_fwd(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    out: torch.Tensor,
    page_table: torch.Tensor | None,
    out_slots: torch.Tensor | None,
    page_size: int,
    ws: torch.Tensor,
    len_min: int = -1,
) -> torch.Tensor:
    """Launches the kernel on arguments :func:`sparsemla.kernels.indexer.topk.indexer_topk_fwd` checked: ``logits``
    fp32 [rows, cols] (unit column stride), ``lengths`` int32 [rows], ``out`` int32 [rows, k]; with ``page_table``
    int32 [rows, max_pages] also ``out_slots`` int32 [rows, k] (``page_size`` a power of two); ``ws`` the zeroed
    split workspace, at least 1 + rows * (1 + :func:`workspace_region` + 2 * SMEM_SPLITS) ints. Rows of at most
    ``len_min`` positions are left untouched (another launch writes them). Returns ``out``."""
    rows = logits.shape[0]
    write_slots = page_table is not None
    pt = page_table if write_slots else lengths
    slots = out_slots if write_slots else out
    _topk_smem_kernel[(rows * SMEM_SPLITS,)](
        logits, lengths, out, pt, slots, ws,
        logits.stride(0), out.stride(0), pt.stride(0), slots.stride(0), logits.shape[1], rows, len_min,
        K=k, WRITE_SLOTS=write_slots, PAGE_BITS=max(page_size.bit_length() - 1, 0), SPLITS=SMEM_SPLITS,
        SPAN=SMEM_SPAN, CHUNK=SMEM_CHUNK, MIN_SPAN=SMEM_MIN_SPAN, NUM_WARPS=SMEM_WARPS, num_warps=SMEM_WARPS,
    )  # fmt: skip
    return out
