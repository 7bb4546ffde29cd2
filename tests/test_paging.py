"""Slot id -> (page, row in page) by shifts or division (sparsemla.kernels.paging) and the byte offsets of the rows'
L2 prefetch (sparsemla.kernels.prefetch), on Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev
from sparsemla.kernels.paging import page_shift, page_split, page_split_either
from sparsemla.kernels.prefetch import prefetch_offsets


def test_page_shift():
    assert [page_shift(p) for p in (1, 2, 64, 256, 4096)] == [0, 1, 6, 8, 12]
    assert [page_shift(p) for p in (3, 24, 48, 96, 65535)] == [-1] * 5


@triton.jit
def _split_kernel(slots, pages, rows, n, page_size, page_size_x, which, ONE_CACHE: tl.constexpr, SHIFT: tl.constexpr,
                  SHIFT_X: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    o = tl.arange(0, BLOCK)
    m = o < n
    s = tl.load(slots + o, mask=m, other=0)
    if ONE_CACHE:
        p, r = page_split(s, page_size, SHIFT)
    else:  # the cache chosen at run time, as the kernels choose it per tile
        p, r = page_split_either(s, which == 1, page_size, page_size_x, SHIFT, SHIFT_X)
    tl.store(pages + o, p, mask=m)
    tl.store(rows + o, r, mask=m)


@pytest.mark.skipif(not dev.defined_interpreted(_split_kernel), reason="needs TRITON_INTERPRET=1 at startup")
@pytest.mark.parametrize("which", [0, 1, 2], ids=["one-cache", "main", "extra"])
@pytest.mark.parametrize("sizes", [(64, 256), (48, 64), (64, 24), (1, 1), (64, 64)], ids=lambda s: f"{s[0]}-{s[1]}")
def test_page_split_matches_divmod(which, sizes):
    gen = torch.Generator().manual_seed(sum(sizes) + which)
    edges = torch.tensor([0, 1, 63, 64, 255, 256, 2**31 - 1])
    slots = torch.cat([edges, torch.randint(0, 2**31 - 1, (121,), generator=gen)]).to(torch.int32)
    pages, rows = torch.full_like(slots, -7), torch.full_like(slots, -7)
    size = sizes[1] if which == 2 else sizes[0]
    _split_kernel[(1,)](slots, pages, rows, slots.numel(), sizes[0], sizes[1], which, ONE_CACHE=which == 0,
                        SHIFT=page_shift(sizes[0]), SHIFT_X=page_shift(sizes[1]), BLOCK=128)  # fmt: skip
    assert torch.equal(pages, slots // size) and torch.equal(rows, slots % size)


@triton.jit
def _offsets_kernel(out, used, ROW_BYTES: tl.constexpr, STRIDE: tl.constexpr, NP: tl.constexpr):
    o_b, m_b = prefetch_offsets(ROW_BYTES, STRIDE)
    tl.store(out + tl.arange(0, NP), o_b)
    tl.store(used + tl.arange(0, NP), m_b.to(tl.int32))


@pytest.mark.skipif(not dev.defined_interpreted(_offsets_kernel), reason="needs TRITON_INTERPRET=1 at startup")
@pytest.mark.parametrize("stride", [32, 64, 128])
@pytest.mark.parametrize("row_bytes", [8, 576, 656, 1152])
def test_prefetch_offsets_reach_every_granule_of_a_row(row_bytes, stride):
    """Wherever a row starts (any byte), the prefetch addresses land inside it and hit every ``stride``-byte granule
    it touches: what makes one prefetch per granule enough, whatever the prefetch fetches beyond one granule."""
    npf = (row_bytes - 1 + stride - 1) // stride + 1
    np_ = triton.next_power_of_2(npf)
    out, used = torch.full((np_,), -1, dtype=torch.int32), torch.full((np_,), -1, dtype=torch.int32)
    _offsets_kernel[(1,)](out, used, ROW_BYTES=row_bytes, STRIDE=stride, NP=np_)
    offs = out[used.bool()].tolist()
    assert len(offs) == npf and all(0 <= b < row_bytes for b in offs)
    for start in range(0, 2 * stride):
        touched = set(range(start // stride, (start + row_bytes - 1) // stride + 1))
        assert {(start + b) // stride for b in offs} == touched, (start, offs)
