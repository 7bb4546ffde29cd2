"""The startup self-check: each enabled kernel against its fp32 reference on a small random case; a mismatch stops."""

from __future__ import annotations

import pytest
import torch

from sparsemla.plugin import selfcheck
from sparsemla.plugin.sglang import HOOKS, _SelfCheck

OPS = sorted({spec.op for spec in HOOKS if spec.op in selfcheck._CHECKS})


def test_every_kernel_hook_has_a_self_check():
    kernel_ops = {spec.op for spec in HOOKS if spec.call != "timer" and "sglang_compat" not in spec.op}
    assert kernel_ops <= set(selfcheck._CHECKS), kernel_ops - set(selfcheck._CHECKS)


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
