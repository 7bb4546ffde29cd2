"""Byte layouts of the DeepSeek-V4 caches the kernels read, and builders of random valid caches for tests and benches.

V4 sparse-MLA KV cache ("V4" page-split layout, what sglang 0.5.23's DSv4 pools hand to the decode kernel)
-------------------------------------------------------------------------------------------------------------
A page holds ``page_size`` tokens (256 for the SWA cache, e.g. 64 for a compressed "extra" cache) and is one row of a
uint8 buffer ``[num_pages, page_bytes]``::

    page_bytes = ceil(page_size * 584 / 576) * 576           # padded to the reader's 576-byte row stride

    offset                                    bytes   content (slot i = 0 .. page_size-1 of the page)
    i * 576           + [0, 448)              448     NoPE, float8_e4m3fn, 448 values
    i * 576           + [448, 576)            128     RoPE, bfloat16 little-endian, 64 values
    page_size * 576 + i * 8 + [0, 7)          7       ue8m0 scales, one per 64 NoPE values (value = 2 ** (byte - 127))
    page_size * 576 + i * 8 + 7               1       pad
    page_size * 584 .. page_bytes                     pad up to a multiple of 576

The kernel sees it as ``k_cache = buf[:, :page_size * 584].view(num_pages, page_size, 1, 584)`` (strides
``(page_bytes, 584, 584, 1)``): the shape gives ``page_size``; ``k_cache.stride(0)`` is the page stride. A token index
(a "slot") is ``page * page_size + offset``; ``-1`` means invalid. The dequantized key/value row is 512 wide:
``[nope * scale (448) | rope (64)]``; V is the same 512-wide latent.

Indexer key cache (lightning indexer, "paged MQA logits")
----------------------------------------------------------
A page holds 64 tokens and is one row of ``[num_pages, 64 * 132]`` uint8, viewed as ``[num_pages, 64, 1, 132]``::

    offset                   bytes       content
    t * 128 + [0, 128)       64 * 128    keys, float8_e4m3fn, token-major (t = 0 .. 63)
    8192 + t * 4             64 * 4      per-token float32 scale

Note the 4D view's rows are NOT the tokens' bytes: the view is only a shape; address with the flat page offsets above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# -- V4 sparse-MLA KV layout ------------------------------------------------------------------------------------------
V4_NOPE_DIM = 448
V4_ROPE_DIM = 64
V4_DIM = V4_NOPE_DIM + V4_ROPE_DIM  # 512: q.k width and V width
V4_DATA_BYTES = V4_NOPE_DIM + 2 * V4_ROPE_DIM  # 576 per token data row
V4_TILE = 64  # NoPE values sharing one ue8m0 scale
V4_NUM_SCALES = V4_NOPE_DIM // V4_TILE  # 7
V4_SCALE_BYTES = V4_NUM_SCALES + 1  # 8 per token scale row (7 scales + 1 pad)
V4_BYTES_PER_TOKEN = V4_DATA_BYTES + V4_SCALE_BYTES  # 584
V4_PAGE_ALIGN = 576

# -- indexer key layout -----------------------------------------------------------------------------------------------
IDX_PAGE = 64
IDX_DIM = 128
IDX_BYTES_PER_TOKEN = IDX_DIM + 4  # 132
IDX_SCALE_OFFSET = IDX_PAGE * IDX_DIM  # 8192: scales start here inside a page
IDX_PAGE_BYTES = IDX_PAGE * IDX_BYTES_PER_TOKEN  # 8448


def v4_page_bytes(page_size: int) -> int:
    """Bytes between two pages of a V4 cache with ``page_size`` tokens per page (padded to 576)."""
    raw = page_size * V4_BYTES_PER_TOKEN
    return -(-raw // V4_PAGE_ALIGN) * V4_PAGE_ALIGN


def v4_cache_view(buf: torch.Tensor, page_size: int) -> torch.Tensor:
    """The ``[num_pages, page_size, 1, 584]`` ``k_cache`` view sglang passes, over ``[num_pages, page_bytes]``."""
    if buf.dim() != 2 or buf.shape[1] != v4_page_bytes(page_size):
        raise ValueError(f"V4 buffer must be [num_pages, {v4_page_bytes(page_size)}], got {list(buf.shape)}")
    return buf[:, : page_size * V4_BYTES_PER_TOKEN].view(buf.shape[0], page_size, 1, V4_BYTES_PER_TOKEN)


def v4_raw_pages(k_cache: torch.Tensor) -> torch.Tensor:
    """The whole-page uint8 view ``[num_pages, page_stride]`` behind a V4 ``k_cache`` view (honours ``stride(0)``)."""
    num_pages = k_cache.shape[0]
    stride = k_cache.stride(0)
    return k_cache.view(torch.uint8).as_strided((num_pages, stride), (stride, 1))


def decode_v4_rows(k_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Dequantize the rows of ``slots`` (any shape, int, >= 0) from a V4 ``k_cache``: fp32 ``[*slots.shape, 512]``."""
    page_size = k_cache.shape[1]
    raw = v4_raw_pages(k_cache)
    flat = slots.reshape(-1).long()
    page, off = flat // page_size, flat % page_size
    data = off[:, None] * V4_DATA_BYTES + torch.arange(V4_DATA_BYTES, device=flat.device)
    rows = raw[page[:, None], data]  # [N, 576] uint8
    nope = rows[:, :V4_NOPE_DIM].view(torch.float8_e4m3fn).float()
    rope = rows[:, V4_NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    sc = page_size * V4_DATA_BYTES + off[:, None] * V4_SCALE_BYTES + torch.arange(V4_NUM_SCALES, device=flat.device)
    scale_exp = raw[page[:, None], sc].to(torch.int32) - 127  # [N, 7]
    scale = torch.exp2(scale_exp.float())
    nope = (nope.view(-1, V4_NUM_SCALES, V4_TILE) * scale[:, :, None]).view(-1, V4_NOPE_DIM)
    return torch.cat([nope, rope], dim=-1).view(*slots.shape, V4_DIM)


@dataclass
class V4Cache:
    """A random V4 cache: ``buf`` [num_pages, page_bytes] uint8 and ``k_cache`` the 4D view sglang passes."""

    buf: torch.Tensor
    k_cache: torch.Tensor
    page_size: int

    @property
    def num_slots(self) -> int:
        return self.buf.shape[0] * self.page_size


def random_v4_cache(
    num_pages: int,
    page_size: int,
    *,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    nope_std: float = 2.0,
    scale_exp_range: tuple[int, int] = (-5, 0),
) -> V4Cache:
    """A V4 cache of random valid data: fp8 NoPE ~ N(0, nope_std^2), ue8m0 scales 2^[lo..hi], bf16 RoPE ~ N(0, 1).

    Pads are random bytes too, so a kernel that reads them shows up as a mismatch."""
    page_bytes = v4_page_bytes(page_size)
    buf = torch.randint(0, 256, (num_pages, page_bytes), dtype=torch.uint8, generator=generator)
    tokens = num_pages * page_size
    nope = (torch.randn(tokens, V4_NOPE_DIM, generator=generator) * nope_std).to(torch.float8_e4m3fn)
    rope = torch.randn(tokens, V4_ROPE_DIM, generator=generator).to(torch.bfloat16)
    lo, hi = scale_exp_range
    scales = torch.randint(127 + lo, 127 + hi + 1, (tokens, V4_NUM_SCALES), dtype=torch.uint8, generator=generator)
    data = torch.cat([nope.view(torch.uint8), rope.view(torch.uint8)], dim=1).view(num_pages, page_size * V4_DATA_BYTES)
    buf[:, : page_size * V4_DATA_BYTES] = data
    scale_rows = buf[:, page_size * V4_DATA_BYTES : page_size * V4_BYTES_PER_TOKEN].view(
        num_pages, page_size, V4_SCALE_BYTES
    )
    scale_rows[:, :, :V4_NUM_SCALES] = scales.view(num_pages, page_size, V4_NUM_SCALES)
    buf = buf.to(device)
    return V4Cache(buf=buf, k_cache=v4_cache_view(buf, page_size), page_size=page_size)


def random_slots(
    batch: int,
    topk: int,
    num_slots: int,
    *,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    invalid_fraction: float = 0.0,
) -> torch.Tensor:
    """``[batch, 1, topk]`` int32 distinct random slot ids per row (as sglang's top-k gives), some set to -1."""
    if topk > num_slots:
        raise ValueError(f"topk={topk} needs at least that many slots, cache has {num_slots}")
    rows = [torch.randperm(num_slots, generator=generator)[:topk] for _ in range(batch)]
    idx = torch.stack(rows).to(torch.int32) if batch else torch.empty(0, topk, dtype=torch.int32)
    if invalid_fraction > 0:
        drop = torch.rand(idx.shape, generator=generator) < invalid_fraction
        idx[drop] = -1
    return idx.view(batch, 1, topk).to(device)


# -- indexer cache ----------------------------------------------------------------------------------------------------
def decode_indexer_pages(kv_cache: torch.Tensor, pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and scales of whole pages: (fp32 ``[*pages.shape, 64, 128]``, fp32 ``[*pages.shape, 64]``)."""
    flat = kv_cache.view(torch.uint8).reshape(kv_cache.shape[0], IDX_PAGE_BYTES)
    rows = flat[pages.reshape(-1).long()]  # [N, 8448]
    keys = rows[:, :IDX_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).float().view(-1, IDX_PAGE, IDX_DIM)
    scales = rows[:, IDX_SCALE_OFFSET:].contiguous().view(torch.float32).view(-1, IDX_PAGE)
    return keys.view(*pages.shape, IDX_PAGE, IDX_DIM), scales.view(*pages.shape, IDX_PAGE)


def random_indexer_cache(
    num_pages: int,
    *,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    key_std: float = 1.0,
    scale_range: tuple[float, float] = (0.01, 0.1),
) -> torch.Tensor:
    """``[num_pages, 64, 1, 132]`` uint8 indexer cache: fp8 keys ~ N(0, key_std^2), fp32 scales in scale_range."""
    keys = (torch.randn(num_pages, IDX_PAGE * IDX_DIM, generator=generator) * key_std).to(torch.float8_e4m3fn)
    lo, hi = scale_range
    scales = lo + (hi - lo) * torch.rand(num_pages, IDX_PAGE, generator=generator)
    page = torch.cat([keys.view(torch.uint8), scales.view(torch.uint8)], dim=1)
    return page.view(num_pages, IDX_PAGE, 1, IDX_BYTES_PER_TOKEN).to(device)


def random_page_table(
    seq_lens: torch.Tensor,
    max_pages: int,
    num_pages: int,
    *,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """``[B, max_pages]`` int32: each request's pages drawn at random (out of order) without sharing; the unused tail
    entries hold random *valid* page ids, as sglang's capture-width tables do (a kernel must not read them)."""
    need = sum(-(-int(s) // IDX_PAGE) for s in seq_lens.tolist())
    if need > num_pages:
        raise ValueError(f"cache has {num_pages} pages, requests need {need}")
    perm = torch.randperm(num_pages, generator=generator)
    table = torch.randint(0, num_pages, (len(seq_lens), max_pages), generator=generator, dtype=torch.int64)
    start = 0
    for b, length in enumerate(seq_lens.tolist()):
        n = -(-int(length) // IDX_PAGE)
        if n > max_pages:
            raise ValueError(f"request {b} needs {n} pages, table has {max_pages}")
        table[b, :n] = perm[start : start + n]
        start += n
    return table.to(torch.int32).to(device)


# -- DeepSeek-V3.2 (DSA) sparse-MLA KV layouts ------------------------------------------------------------------------
# A token's latent is 576 wide: 512 NoPE values (also the value vector, d_v = 512) then 64 RoPE values. The cache is
# ``[num_blocks, page_size (64), 1, bytes_per_token]``; a slot id is ``block * page_size + offset``. Two formats:
#
#   "bf16_576": 576 bfloat16 values per token (1152 bytes), NoPE then RoPE.
#   "fp8_656" (FlashMLA's "FP8 with scale", 656 bytes per token; dtype uint8 / int8 / float8_e4m3fn):
#       offset       bytes   content
#       [0, 512)     512     NoPE, float8_e4m3fn; tile t = values [128 t, 128 t + 128)
#       [512, 528)   16      4 x float32 little-endian: the scale of NoPE tile t (value = e4m3 * scale[t])
#       [528, 656)   128     RoPE, 64 x bfloat16 little-endian, not quantized
#   Rows are 656 = 41 x 16 bytes, so every row of a contiguous page starts 16-byte aligned.
V32_NOPE_DIM = 512
V32_ROPE_DIM = 64
V32_DIM = V32_NOPE_DIM + V32_ROPE_DIM  # 576: q.k width (d_qk)
V32_TILE = 128  # NoPE values sharing one fp32 scale
V32_NUM_SCALES = V32_NOPE_DIM // V32_TILE  # 4
V32_SCALE_OFFSET = V32_NOPE_DIM  # 512: byte offset of the scales in an fp8 row
V32_ROPE_OFFSET = V32_NOPE_DIM + 4 * V32_NUM_SCALES  # 528: byte offset of the bf16 RoPE in an fp8 row
V32_FP8_BYTES = V32_ROPE_OFFSET + 2 * V32_ROPE_DIM  # 656
V32_PAGE = 64
V32_FORMATS = ("fp8_656", "bf16_576")


def v32_row_width(kv_format: str) -> int:
    """Last dimension of a V3.2 cache of ``kv_format``: 656 (bytes) or 576 (bf16 values)."""
    if kv_format == "fp8_656":
        return V32_FP8_BYTES
    if kv_format == "bf16_576":
        return V32_DIM
    raise ValueError(f"kv_format must be one of {V32_FORMATS}, got {kv_format!r}")


def quantize_v32_fp8(latent: torch.Tensor) -> torch.Tensor:
    """``[..., 576]`` float latents -> ``[..., 656]`` uint8 rows of the fp8_656 format: per 128-value NoPE tile,
    scale = amax / 448 (fp32; 1 for an all-zero tile) and e4m3 = round(x / scale); RoPE stored as bf16."""
    if latent.shape[-1] != V32_DIM:
        raise ValueError(f"latent must be [..., {V32_DIM}], got {list(latent.shape)}")
    lead = latent.shape[:-1]
    x = latent.reshape(-1, V32_DIM).float()
    nope = x[:, :V32_NOPE_DIM].view(-1, V32_NUM_SCALES, V32_TILE)
    amax = nope.abs().amax(dim=-1)  # [N, 4]
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q8 = (nope / scale[:, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(-1, V32_NOPE_DIM)
    rope = x[:, V32_NOPE_DIM:].to(torch.bfloat16)
    parts = [q8.view(torch.uint8), scale.contiguous().view(torch.uint8), rope.contiguous().view(torch.uint8)]
    return torch.cat(parts, dim=1).view(*lead, V32_FP8_BYTES)


def decode_v32_rows(kv_cache: torch.Tensor, slots: torch.Tensor, kv_format: str) -> torch.Tensor:
    """The rows of ``slots`` (any shape, int, ``0 <= slot < num_blocks * page_size``) of a V3.2 ``kv_cache``,
    dequantized: fp32 ``[*slots.shape, 576]`` (fp8_656: ``e4m3 * scale`` per tile, in fp32)."""
    width = v32_row_width(kv_format)
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] != width:
        raise ValueError(f"kv_cache must be [num_blocks, page_size, 1, {width}], got {list(kv_cache.shape)}")
    page_size = kv_cache.shape[1]
    flat = slots.reshape(-1).long()
    rows = kv_cache[flat // page_size, flat % page_size, 0]  # [N, width]
    if kv_format == "bf16_576":
        return rows.float().view(*slots.shape, V32_DIM)
    raw = rows.view(torch.uint8)
    nope = raw[:, :V32_NOPE_DIM].view(torch.float8_e4m3fn).float().view(-1, V32_NUM_SCALES, V32_TILE)
    scale = raw[:, V32_SCALE_OFFSET:V32_ROPE_OFFSET].contiguous().view(torch.float32)  # [N, 4]
    rope = raw[:, V32_ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    nope = (nope * scale[:, :, None]).view(-1, V32_NOPE_DIM)
    return torch.cat([nope, rope], dim=-1).view(*slots.shape, V32_DIM)


def random_v32_cache(
    num_blocks: int,
    kv_format: str,
    *,
    page_size: int = V32_PAGE,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    tile_std: tuple[float, ...] = (0.5, 2.0, 8.0, 1.0),
) -> torch.Tensor:
    """A V3.2 cache ``[num_blocks, page_size, 1, 656]`` uint8 or ``[..., 576]`` bf16 of random latents: NoPE tile t ~
    N(0, tile_std[t]^2) (so the four scales of a row differ), RoPE ~ N(0, 1); fp8_656 rows are quantized with
    :func:`quantize_v32_fp8`. No zeros, no NaN."""
    tokens = num_blocks * page_size
    nope = torch.randn(tokens, V32_NUM_SCALES, V32_TILE, generator=generator)
    nope = nope * torch.tensor(tile_std, dtype=torch.float32).view(1, V32_NUM_SCALES, 1)
    rope = torch.randn(tokens, V32_ROPE_DIM, generator=generator)
    latent = torch.cat([nope.view(tokens, V32_NOPE_DIM), rope], dim=1)
    width = v32_row_width(kv_format)
    rows = quantize_v32_fp8(latent) if kv_format == "fp8_656" else latent.to(torch.bfloat16)
    return rows.view(num_blocks, page_size, 1, width).to(device)
