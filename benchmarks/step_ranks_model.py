"""The DeepSeek-V4-Flash decode step on N ranks: per-rank shapes and the collectives sglang 0.5.23 issues.

Two deployments of ``sglang serve deepseek-ai/DeepSeek-V4-Flash`` on N GPUs (facts from sglang 0.5.23's
``srt/models/deepseek_v4.py``, ``deepseek_v4_mhc.py``, ``deepseek_v2.py`` (``DeepseekV2MoE``),
``layers/logits_processor.py``, ``layers/dp_attention.py``, ``layers/moe/token_dispatcher/deepep.py``):

* ``tp`` (``--tp N``): attention TP over the heads: ``wq_b`` / ``wo_a`` column-parallel (64 / N heads, 8 / N output
  groups per rank), ``wo_b`` row-parallel (its ``o_lora`` x groups input sharded), ``wqkv_a``, the compressor and the
  indexer (64 x 128 heads) replicated. The decode kernel gets q zero-padded to 64 heads (``_kernel_num_heads``: "other
  FlashMLA implementations retain their existing padded shape"; sink padded with zeros); flags on, our decode is told
  the real head count (``sparsemla.plugin.real_heads``) and skips the pad. MoE without an all-to-all backend is TP over
  the intermediate size (every rank holds all 256 experts at ``moe_intermediate_size / N``; the shared expert is TP
  too). Collectives per step, all bf16 SUM over the N ranks' ``[B, 4096]`` rows unless said: the vocab-parallel
  embedding's all-reduce (1), per layer the attention output's all-reduce after ``wo_b`` and the MoE output's
  all-reduce (routed + shared, 2 x 43; on Hopper the fused mHC all-reduce kernels are not registered: they are
  Blackwell-only), and the LM head's all-gather of the ``[B, vocab / N]`` logit shards (1).
* ``dp-attention`` (``--tp N --dp N --enable-dp-attention --moe-a2a-backend deepep``, EP N): every rank runs the whole
  attention (64 heads, no pad) on its own B requests, no attention collective; MoE through DeepEP (low-latency mode
  in decode): per layer a dispatch of each (token, expert) pair's hidden row, fp8 with per-128 fp32 scales (DeepEP's
  default output dtype for fp8 checkpoints), to the rank holding the expert (256 / N local experts), and a combine of
  the bf16 expert outputs back (2 x 43 all-to-alls); the shared expert replicated on the rank's tokens. The embedding
  is replicated; the LM head stays vocab-parallel over the N ranks (``enable_dp_lm_head`` off): the DP ranks' hidden
  rows are all-gathered (``dp_gather_replicate``), each rank computes ``[N x B, vocab / N]`` and the shards are
  all-gathered (2 per step); each rank keeps its own rows (``dp_scatter``, no collective).

The collectives here are torch.distributed's (NCCL on GPUs, gloo on the CPU for tests). sglang on one NVLink host
runs small all-reduces through its custom all-reduce kernel and the MoE all-to-all through DeepEP's NVSHMEM kernels,
neither of which is NCCL: the communication share measured with NCCL is that of NCCL's kernels for the same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from benchmarks.step_model import DecodeFn, DecodeStep, LayerWeights, ModelShape, StepInputs, _rms, variant_flags

DEPLOYMENTS: dict[str, str] = {
    "tp": "TP {n}: attention heads split {h} per rank (q padded to 64 for the decode kernel), all-reduce after "
    "attention and after the MoE (experts TP over the intermediate size), vocab-parallel embedding and LM head",
    "dp-attention": "DP-attention + EP {n}: all 64 heads per rank on its own requests, MoE dispatch/combine "
    "all-to-all (DeepEP low-latency: fp8 dispatch, bf16 combine) to {e} local experts per rank, LM head "
    "vocab-parallel after a DP all-gather",
}
PAD_HEADS = 64  # sglang pads q to 64 heads per rank for the decode kernel when the rank has <= 64
FP8_BLOCK = 128  # DeepEP's fp8 dispatch: one fp32 scale per 128 hidden values


def rank_shape(base: ModelShape, deployment: str, ranks: int) -> ModelShape:
    """The per-rank shape of ``base`` (the whole model) in ``deployment`` over ``ranks`` ranks."""
    if deployment not in DEPLOYMENTS:
        raise ValueError(f"unknown deployment {deployment!r}; choose from {', '.join(DEPLOYMENTS)}")
    if ranks < 1 or base.vocab % ranks or base.experts % ranks:
        raise ValueError(f"{ranks} ranks do not divide the vocabulary ({base.vocab}) and the experts ({base.experts})")
    if deployment == "tp":
        if base.heads % ranks or base.o_groups % ranks or base.moe_inter % ranks:
            raise ValueError(f"TP {ranks} does not divide heads {base.heads} / groups {base.o_groups} / intermediate")
        return replace(base, heads=base.heads // ranks, o_groups=base.o_groups // ranks,
                       moe_inter=base.moe_inter // ranks, ep=1, vocab=base.vocab // ranks)  # fmt: skip
    return replace(base, ep=ranks, vocab=base.vocab // ranks)


@dataclass(frozen=True)
class Collective:
    """One collective of a decode step: name, torch.distributed op, calls per step, dtype, bytes sent per rank per
    call, and where sglang issues it."""

    name: str
    op: str
    per_step: int
    dtype: str
    bytes_per_call: int
    where: str


def dispatch_row_bytes(hidden: int) -> int:
    """Bytes of one dispatched (token, expert) row: fp8 values + one fp32 scale per 128."""
    return hidden + 4 * (hidden // FP8_BLOCK)


def collective_plan(shape: ModelShape, deployment: str, ranks: int, batch: int) -> list[Collective]:
    """The collectives of one decode step at ``batch`` requests per rank (``shape``: the per-rank shape)."""
    s, n, layers = shape, ranks, shape.num_layers
    row = s.hidden * 2
    if deployment == "tp":
        return [
            Collective("embed_all_reduce", "all_reduce", 1, "bf16", batch * row, "VocabParallelEmbedding"),
            Collective("attn_all_reduce", "all_reduce", layers, "bf16", batch * row, "wo_b (RowParallelLinear)"),
            Collective("moe_all_reduce", "all_reduce", layers, "bf16", batch * row, "MoE output (routed + shared)"),
            Collective("lm_head_all_gather", "all_gather", 1, "bf16", batch * s.vocab * 2, "LogitsProcessor"),
        ]
    pairs = batch * s.experts_per_token
    return [
        Collective(
            "moe_dispatch",
            "all_to_all",
            layers,
            "fp8+fp32 scales",
            pairs * dispatch_row_bytes(s.hidden),
            "DeepEP low_latency_dispatch",
        ),  # fmt: skip
        Collective("moe_combine", "all_to_all", layers, "bf16", pairs * row, "DeepEP low_latency_combine"),
        Collective("lm_head_dp_gather", "all_gather", 1, "bf16", batch * row, "dp_gather_replicate (LM head)"),
        Collective("lm_head_all_gather", "all_gather", 1, "bf16", n * batch * s.vocab * 2, "LogitsProcessor"),
    ]


def plan_dicts(plan: list[Collective]) -> list[dict[str, Any]]:
    return [asdict(c) for c in plan]


@dataclass
class Comm:
    """The step's collectives over the default process group; with ``timed`` each call's wall time is recorded
    (the CPU/gloo measurement: gloo runs no CUDA kernels, so its time cannot come from a trace)."""

    rank: int
    ranks: int
    timed: bool = False
    records: list[tuple[str, float]] = field(default_factory=list)

    def _run(self, name: str, fn: Callable[[], Any]) -> None:
        if not self.timed:
            fn()
            return
        t0 = time.perf_counter()
        fn()
        self.records.append((name, (time.perf_counter() - t0) * 1e6))

    def all_reduce(self, name: str, t: torch.Tensor) -> torch.Tensor:
        self._run(name, lambda: dist.all_reduce(t))
        return t

    def all_gather(self, name: str, inp: torch.Tensor) -> torch.Tensor:
        out = inp.new_empty((self.ranks * inp.shape[0], *inp.shape[1:]))  # NCCL and gloo: ranks stacked on dim 0
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.14
        self._run(name, lambda: gather(out, inp.contiguous()))
        return out.view(self.ranks, *inp.shape)

    def all_to_all(self, name: str, inp: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        out = inp.new_empty((sum(recv), *inp.shape[1:]))
        self._run(name, lambda: dist.all_to_all_single(out, inp, recv, send))
        return out


def even_splits(total: int, ranks: int) -> list[int]:
    """``total`` rows over ``ranks`` destinations as evenly as possible (the first ``total % ranks`` get one more)."""
    return [total // ranks + (1 if r < total % ranks else 0) for r in range(ranks)]


class RankDecodeStep(DecodeStep):
    """:class:`DecodeStep` on one rank of ``deployment``, with the collectives of :func:`collective_plan`."""

    def __init__(
        self,
        shape: ModelShape,
        layers: dict[int, LayerWeights],
        lm_head: torch.Tensor,
        final_norm: torch.Tensor,
        inputs: StepInputs,
        variant: str,
        baseline_decode: DecodeFn,
        *,
        deployment: str,
        comm: Comm,
    ) -> None:
        super().__init__(shape, layers, lm_head, final_norm, inputs, variant, baseline_decode)
        self.deployment, self.comm = deployment, comm
        if deployment == "tp" and shape.heads < PAD_HEADS:
            self.decode = self._padded(self.decode, pass_real=variant_flags(variant)[0])
        if deployment == "dp-attention":
            self._routing()

    def _padded(self, kernel: DecodeFn, pass_real: bool) -> DecodeFn:
        """The decode with q and the sink zero-padded to 64 heads (as sglang calls its kernel under TP); our kernel is
        also given the real head count (what the plugin's real-heads hook does with the flag on)."""
        real = self.shape.heads

        def call(q: torch.Tensor, attn_sink: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
            qp = q.new_zeros((*q.shape[:2], PAD_HEADS, q.shape[3]))
            qp[:, :, :real] = q
            sink = attn_sink.new_zeros(PAD_HEADS)
            sink[:real] = attn_sink
            extra = {"num_real_heads": real} if pass_real else {}
            out, lse = kernel(q=qp, attn_sink=sink, **kw, **extra)
            return out[:, :, :real].contiguous(), lse

        return call

    def _routing(self) -> None:
        """Fixed (token, expert) pair layout of the dispatch: pair p is token p // k; pairs split evenly over ranks;
        the received rows feed the touched local experts' slots in order."""
        s, dev, b = self.shape, self.inp.x.device, self.inp.batch
        k, n = s.experts_per_token, self.comm.ranks
        pairs = b * k
        self.send_splits = even_splits(pairs, n)
        self.recv_splits = [self.send_splits[self.comm.rank]] * n  # every rank has the same B: symmetric counts
        received = sum(self.recv_splits)
        experts, per_expert = self.inp.experts
        self.pair_token = torch.arange(pairs, device=dev) // k
        self.slot_row = torch.arange(experts * per_expert, device=dev) % max(received, 1)
        self.received = received

    def attention(self, w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        o = super().attention(w, x)
        return self.comm.all_reduce("attn_all_reduce", o) if self.deployment == "tp" else o

    def moe(self, w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        if self.deployment == "tp":
            return self.comm.all_reduce("moe_all_reduce", super().moe(w, x))
        s, b = self.shape, self.inp.batch
        h = _rms(x, w.ffn_norm, s.eps)
        scores = F.softplus(F.linear(h, w.gate).float()).sqrt()
        top_w, _ = scores.topk(s.experts_per_token, dim=-1)
        # dispatch: fp8 rows with per-128 fp32 scales, one per (token, expert) pair
        blocks = h.float().view(b, -1, FP8_BLOCK)
        scale = blocks.abs().amax(-1).clamp_min(1e-12) / 448.0
        q8 = (blocks / scale[..., None]).to(torch.float8_e4m3fn).view(b, s.hidden).view(torch.uint8)
        payload = torch.cat((q8, scale.view(torch.uint8)), dim=1).index_select(0, self.pair_token)
        got = self.comm.all_to_all("moe_dispatch", payload, self.send_splits, self.recv_splits)
        vals = got[:, : s.hidden].contiguous().view(torch.float8_e4m3fn).float().view(self.received, -1, FP8_BLOCK)
        scales = got[:, s.hidden :].contiguous().view(torch.float32)
        rows = (vals * scales[..., None]).view(self.received, s.hidden).to(torch.bfloat16)
        experts, per_expert = self.inp.experts
        xe = rows.index_select(0, self.slot_row).view(experts, per_expert, s.hidden)
        gu = torch.bmm(xe, w.w13[:experts].transpose(1, 2))
        act = F.silu(gu[..., : s.moe_inter]) * gu[..., s.moe_inter :]
        ye = torch.bmm(act, w.w2[:experts].transpose(1, 2)).view(-1, s.hidden)
        back = ye.new_zeros((self.received, s.hidden)).index_add_(0, self.slot_row, ye)
        comb = self.comm.all_to_all("moe_combine", back, self.recv_splits, self.send_splits)
        coef = (top_w.sum(-1, keepdim=True) / s.experts_per_token).to(comb.dtype)
        routed = torch.zeros_like(h).index_add_(0, self.pair_token, comb * coef.index_select(0, self.pair_token))
        sh = F.linear(h, w.shared_w13)
        sh = F.linear(F.silu(sh[:, : s.moe_inter]) * sh[:, s.moe_inter :], w.shared_w2)
        return routed * s.routed_scale + sh

    def lm_head_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm, the vocab-parallel LM head with its gathers, argmax of this rank's rows."""
        h = _rms(x, self.final_norm, self.shape.eps)
        b, n, r = self.inp.batch, self.comm.ranks, self.comm.rank
        if self.deployment == "tp":
            shards = self.comm.all_gather("lm_head_all_gather", F.linear(h, self.lm_head))  # [N, B, V / N]
            return shards.permute(1, 0, 2).reshape(b, -1).argmax(dim=-1)
        every = self.comm.all_gather("lm_head_dp_gather", h).view(n * b, -1)  # [N x B, hidden]
        shards = self.comm.all_gather("lm_head_all_gather", F.linear(every, self.lm_head))  # [N, N x B, V / N]
        mine = shards[:, r * b : (r + 1) * b]
        return mine.permute(1, 0, 2).reshape(b, -1).argmax(dim=-1)

    def __call__(self) -> torch.Tensor:
        x = self.inp.x
        if self.deployment == "tp":
            x = self.comm.all_reduce("embed_all_reduce", x.clone())
        for ratio in self.shape.compress_ratios:
            w = self.layers[ratio]
            x = x + self.attention(w, x)
            x = x + self.moe(w, x)
        return self.lm_head_tokens(x)
