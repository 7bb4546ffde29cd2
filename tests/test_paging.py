"""Slot id -> (page, row in page) by shifts or division (sparsemla.kernels.paging), on Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev
from sparsemla.kernels.paging import page_shift, page_split, page_split_either


def test_page_shift():
    assert [page_shift(p) for p in (1, 2, 64, 256, 4096)] == [0, 1, 6, 8, 12]
    assert [page_shift(p) for p in (3, 24, 48, 96, 65535)] == [-1] * 5


@triton.jit
def _split_kernel(slots, pages, rows, n, page_size, page_size_x, WHICH: tl.constexpr, SHIFT: tl.constexpr,
                  SHIFT_X: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    o = tl.arange(0, BLOCK)
    m = o < n
    s = tl.load(slots + o, mask=m, other=0)
    if WHICH == 0:
        p, r = page_split(s, page_size, SHIFT)
    else:
        p, r = page_split_either(s, WHICH == 1, page_size, page_size_x, SHIFT, SHIFT_X)
    tl.store(pages + o, p, mask=m)
    tl.store(rows + o, r, mask=m)


@pytest.mark.skipif(not dev.defined_interpreted(_split_kernel), reason="needs TRITON_INTERPRET=1 at startup")
@pytest.mark.parametrize("which", [0, 1, 2], ids=["one-cache", "main", "extra"])
@pytest.mark.parametrize("sizes", [(64, 256), (48, 64), (64, 24), (1, 1)], ids=["64-256", "48-64", "64-24", "1-1"])
def test_page_split_matches_divmod(which, sizes):
    gen = torch.Generator().manual_seed(sum(sizes) + which)
    edges = torch.tensor([0, 1, 63, 64, 255, 256, 2**31 - 1])
    slots = torch.cat([edges, torch.randint(0, 2**31 - 1, (121,), generator=gen)]).to(torch.int32)
    pages, rows = torch.full_like(slots, -7), torch.full_like(slots, -7)
    size = sizes[1] if which == 2 else sizes[0]
    _split_kernel[(1,)](slots, pages, rows, slots.numel(), sizes[0], sizes[1], WHICH=which,
                        SHIFT=page_shift(sizes[0]), SHIFT_X=page_shift(sizes[1]), BLOCK=128)  # fmt: skip
    assert torch.equal(pages, slots // size) and torch.equal(rows, slots % size)
