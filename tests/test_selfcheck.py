"""The startup self-check: each enabled kernel against its fp32 reference on a small random case; a mismatch stops."""

from __future__ import annotations

import pytest
import torch

from sparsemla import flags
from sparsemla.plugin import selfcheck
from sparsemla.plugin.sglang import HOOKS, _SelfCheck

OPS = sorted({spec.op for spec in HOOKS if spec.op in selfcheck._CHECKS})
KERNEL_HOOKS = [pytest.param(spec, id=spec.name) for spec in HOOKS if spec.call != "timer"]


def test_every_kernel_hook_has_a_self_check():
    """Every hook that can run our op (all but the ``timer`` hooks, which always run sglang's original) has a check."""
    kernel_ops = {spec.op for spec in HOOKS if spec.call != "timer"}
    assert kernel_ops <= set(selfcheck._CHECKS), kernel_ops - set(selfcheck._CHECKS)
    assert all(selfcheck.has_check(op) for op in kernel_ops)


@pytest.mark.parametrize("spec", KERNEL_HOOKS)
def test_the_first_eager_cuda_call_of_every_kernel_hook_finds_its_check(monkeypatch, spec):
    """What the hook does at its first eager CUDA call (graph capture stubbed off): it must reach the op's check (a
    missing one was a KeyError that killed the server mid-serving). The checks are recorded, not run: no GPU here."""
    ran = []
    table = {op: (lambda device, op=op: ran.append((op, device.type)) or 0.0, tol) for op, (_, tol) in
             selfcheck._CHECKS.items()}  # fmt: skip
    monkeypatch.setattr(selfcheck, "_CHECKS", table)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with flags.SPARSEMLA_SELF_CHECK.override(True):
        _SelfCheck().maybe_run(spec, torch.device("cuda"))
    assert ran == [(spec.op, "cuda")]


def test_an_op_without_a_check_is_a_named_error_not_a_key_error():
    with pytest.raises(RuntimeError, match="no self-check for sparsemla.kernels.nowhere:op; the checked ops are"):
        selfcheck.run_self_check("sparsemla.kernels.nowhere:op", "cpu")


@pytest.mark.parametrize("op", OPS)
def test_self_check_passes_on_cpu(op):
    """On the CPU the ops run Triton's interpreter (conftest) or the reference; either must pass the check."""
    assert selfcheck.run_self_check(op, "cpu") <= selfcheck._CHECKS[op][1]


def test_a_wrong_kernel_is_refused(monkeypatch):
    from sparsemla.kernels.sparse_decode import api

    real = api.sparse_decode

    def off_by_a_bit(**kwargs):
        out, lse = real(**kwargs)
        return out * 1.1, lse

    monkeypatch.setattr(api, "sparse_decode", off_by_a_bit)
    with pytest.raises(RuntimeError, match="self-check failed .* Refusing to serve"):
        selfcheck.run_self_check("sparsemla.kernels.sparse_decode.api:sparse_decode", "cpu")


def test_nan_output_is_refused(monkeypatch):
    from sparsemla.kernels.indexer import api

    real = api.indexer_logits

    def with_nan(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0, 0] = float("nan")
        return out

    monkeypatch.setattr(api, "indexer_logits", with_nan)
    with pytest.raises(RuntimeError, match="indexer_logits"):
        selfcheck.run_self_check("sparsemla.kernels.indexer.api:indexer_logits", "cpu")


@pytest.mark.parametrize("fault", ["one-slot-off", "raw-positions-unwritten"])
def test_a_wrong_topk_transform_is_refused(monkeypatch, fault):
    from sparsemla.kernels.indexer import sglang_compat

    real = sglang_compat.topk_transform_paged

    slot_off = fault == "one-slot-off"  # else the raw positions stay as the check filled them

    def wrong(scores, lens, tables, out, page_size, raw=None):
        real(scores, lens, tables, out, page_size, raw if slot_off else None)
        if slot_off:
            out[0, 0] += 1

    monkeypatch.setattr(sglang_compat, "topk_transform_paged", wrong)
    with pytest.raises(RuntimeError, match="self-check failed for .*topk_transform_paged"):
        selfcheck.run_self_check("sparsemla.kernels.indexer.sglang_compat:topk_transform_paged", "cpu")


def test_plugin_runs_the_check_once_per_op_and_never_under_graph_capture(monkeypatch):
    calls = []
    monkeypatch.setattr(selfcheck, "run_self_check", lambda op, device: calls.append((op, str(device))))
    check = _SelfCheck()
    spec = next(s for s in HOOKS if s.name == "decode_sm120")
    check.maybe_run(spec, torch.device("cpu"))
    assert calls == [], "CPU calls are the reference's job"
    if torch.cuda.is_available():
        check.maybe_run(spec, torch.device("cuda"))
        check.maybe_run(spec, torch.device("cuda"))
        assert len(calls) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_self_check_passes_on_the_gpu(op):
    assert selfcheck.run_self_check(op, "cuda") <= selfcheck._CHECKS[op][1]
