"""The plugin reports, and serves with, only what sglang actually applied; a flag it cannot honour stops startup.

Every case runs sglang 0.5.23's real ``load_plugins()`` in a fresh process (it runs once per process, and the hooks it
applies are process-wide), with the flags set in that process's environment: a child forked from one parent that has
imported ``sglang.srt.plugins`` and nothing else (tests/sglang_fork.py; it saves each case ~8 s of that import). A
case changes the plugin before sglang loads it (an extra hook row, a failing step, another sglang version) and reports
the exit status, stderr and the ``sparsemla_kernel_flags_info`` series that the process exported.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sglang_fork import ForkingSglang

from sparsemla import flags, variant

pytestmark = pytest.mark.sglang

pytest.importorskip("sglang.srt.plugins", reason="sglang 0.5.23 contract tier not installed")

ALL_OFF = {name: None for name in ("SPARSEMLA_MMA_DECODE", "SGLANG_SM120_MMA_FLASHMLA", "SPARSEMLA_TRITON_INDEXER",
                                   "SPARSEMLA_STEP_METRICS", "SPARSEMLA_DISABLE", "SPARSEMLA_FORCE_REFERENCE",
                                   "PROMETHEUS_MULTIPROC_DIR")}  # fmt: skip

_PRELUDE = """
import dataclasses, json, logging
logging.basicConfig(level=logging.INFO)
import sglang.srt.plugins as plugins
from sparsemla import flags
from sparsemla.plugin import sglang as sp
"""

_LOAD_AND_REPORT = """
plugins.load_plugins()
from prometheus_client import REGISTRY, generate_latest
from sparsemla import variant
print("REPORT " + json.dumps({"info": variant.info_from_metrics(generate_latest(REGISTRY).decode()),
                              "applied": sp.applied_hooks()}))
"""

# A row of the hook table whose target does not exist in sglang 0.5.23: HookRegistry.apply_hooks() logs
# "Failed to apply hooks to ..." and moves on.
GHOST = """
base = next(s for s in sp.HOOKS if s.name == "{base}")
sp.HOOKS = (*sp.HOOKS, dataclasses.replace(base, name="ghost", target=base.target.rpartition(".")[0] + ".no_such_fn"))
"""


BASE = {"SGLANG_SM120_FLASHMLA_BACKEND": "torch", **ALL_OFF}
_FORKS: list[ForkingSglang] = []


@pytest.fixture(scope="module", autouse=True)
def _forking_sglang():
    forks = ForkingSglang(flags.child_env(BASE))
    _FORKS.append(forks)
    yield
    _FORKS.remove(forks)
    forks.close()


def _load(setup: str, env: dict[str, str | None]) -> tuple[subprocess.CompletedProcess, dict]:
    code = _PRELUDE + setup + _LOAD_AND_REPORT
    res = _FORKS[0].run(code, flags.child_env({**BASE, **env}))
    reports = [ln.removeprefix("REPORT ") for ln in res.stdout.splitlines() if ln.startswith("REPORT ")]
    return res, json.loads(reports[-1]) if reports else {}


def _plugin_log(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("INFO:sparsemla.plugin:") and "plugin loaded" in ln]


# -- a hook sglang could not apply -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "base,env",
    [
        pytest.param("decode_sm120", {"SPARSEMLA_MMA_DECODE": "1"}, id="decode-hook-missing-decode-on"),
        pytest.param("indexer_torch", {"SPARSEMLA_TRITON_INDEXER": "1"}, id="indexer-hook-missing-indexer-on"),
        pytest.param("step_metrics", {"SPARSEMLA_STEP_METRICS": "1"}, id="step-hook-missing-step-metrics-on"),
    ],
)
def test_a_hook_sglang_did_not_apply_stops_startup_when_its_flag_is_on(base, env):
    res, report = _load(GHOST.format(base=base), env)
    assert "Failed to apply hooks to" in res.stderr and ".no_such_fn" in res.stderr, res.stderr[-3000:]
    assert res.returncode != 0, "sglang would serve with the flag on and the kernel hook missing"
    assert report == {}, "load_plugins() must not return"
    flag = next(iter(env))
    assert f"sparsemla: {flag} set but sglang did not apply the hook(s) on " in res.stderr, res.stderr[-3000:]
    assert not _plugin_log(res.stderr), "no success line before the exit"


def test_a_hook_sglang_did_not_apply_with_its_flag_off_is_reported_and_the_variant_is_baseline():
    res, report = _load(GHOST.format(base="decode_sm120"), {})
    assert res.returncode == 0, res.stderr[-3000:]
    assert report["info"]["variant"] == variant.BASELINE
    assert report["applied"]["ghost"] is False and report["applied"]["decode_sm120"] is True
    (line,) = _plugin_log(res.stderr)
    assert "variant=baseline" in line
    total = len(report["applied"])
    assert f"{total - 1} of {total} hooks applied (not applied: ghost (" in line, line


def test_a_missing_hook_of_another_switch_leaves_the_enabled_one_reported():
    """The decode flag is on and all its hooks applied; a missing indexer hook (flag off) does not stop sglang, the
    variant is ``mma_decode`` and the log names the missing hook."""
    res, report = _load(GHOST.format(base="indexer_torch"), {"SPARSEMLA_MMA_DECODE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert report["info"]["variant"] == "mma_decode" and report["info"]["sparsemla_mma_decode"] == "on"
    (line,) = _plugin_log(res.stderr)
    assert "variant=mma_decode" in line and "not applied: ghost" in line, line


def test_the_log_and_metric_state_what_was_applied():
    res, report = _load("", {"SPARSEMLA_MMA_DECODE": "1", "SPARSEMLA_TRITON_INDEXER": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert report["info"]["variant"] == "mma_decode+triton_indexer"
    total = len(report["applied"])
    assert all(report["applied"].values()) and total >= 6, report["applied"]
    (line,) = _plugin_log(res.stderr)
    assert "variant=mma_decode+triton_indexer" in line and f"{total} of {total} hooks applied" in line, line


def test_a_hook_that_sglang_marks_patched_but_is_not_on_the_target_counts_as_not_applied():
    """Applied means our hook is in the wrapper chain of the target attribute after sglang's apply step, not merely
    sglang's bookkeeping: here the attribute is swapped back to sglang's original right after the apply."""
    setup = """
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.layers.attention.dsv4 import indexer
kept = {"original": indexer.fp8_paged_mqa_logits_torch}  # in a dict: sglang rebinds module globals that hold it
real_apply = HookRegistry.__dict__["apply_hooks"].__func__
def apply_then_undo(cls):
    real_apply(cls)
    indexer.fp8_paged_mqa_logits_torch = kept["original"]
HookRegistry.apply_hooks = classmethod(apply_then_undo)
"""
    res, _ = _load(setup, {"SPARSEMLA_TRITON_INDEXER": "1"})
    assert res.returncode != 0
    assert "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch" in res.stderr.splitlines()[-1]


# -- an exception inside register() ------------------------------------------------------------------------------------
BOOM = """
def boom(spec):
    raise RuntimeError("boom in make_around")
sp.make_around = boom
"""


@pytest.mark.parametrize(
    "env",
    [{"SPARSEMLA_MMA_DECODE": "1"}, {"SPARSEMLA_TRITON_INDEXER": "1"}, {"SPARSEMLA_STEP_METRICS": "1"}],
    ids=["decode-on", "indexer-on", "step-metrics-on"],
)
def test_an_exception_in_register_stops_startup_with_a_flag_on(env):
    res, report = _load(BOOM, env)
    assert res.returncode != 0, "sglang's load_plugins() swallowed the error and serves with no hooks"
    assert report == {}
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("sparsemla: plugin registration failed with ") and next(iter(env)) in last, last
    assert "RuntimeError: boom in make_around" in last


def test_an_exception_in_register_with_flags_off_is_logged_by_sglang_and_the_variant_is_baseline():
    res, report = _load(BOOM, {})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Failed to execute general plugin: sparsemla" in res.stderr and "boom in make_around" in res.stderr
    assert report["info"]["variant"] == variant.BASELINE


# -- an sglang version the hook table was not tested on ----------------------------------------------------------------
UNTESTED = 'sp._sglang_version = lambda: "0.4.0"\n'


@pytest.mark.parametrize(
    "env",
    [{"SPARSEMLA_MMA_DECODE": "1"}, {"SGLANG_SM120_MMA_FLASHMLA": "1"}, {"SPARSEMLA_TRITON_INDEXER": "1"},
     {"SPARSEMLA_STEP_METRICS": "1"}],
    ids=["decode-on", "decode-alias-on", "indexer-on", "step-metrics-on"],
)  # fmt: skip
def test_an_untested_sglang_version_with_a_flag_on_stops_startup(env):
    res, report = _load(UNTESTED, env)
    assert res.returncode != 0, "a flag on an untested sglang must not serve sglang's own code silently"
    assert report == {}
    last = res.stderr.strip().splitlines()[-1]
    assert "sglang 0.4.0 is not a tested version" in last and "refusing to start" in last, last


def test_an_untested_sglang_version_with_flags_off_warns_once_and_publishes_baseline():
    res, report = _load(UNTESTED, {})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("not a tested version") == 1
    assert report["info"]["variant"] == variant.BASELINE
    assert report["info"]["sparsemla_mma_decode"] == "off" and report["applied"] == {}


# -- an enabled op without a self-check --------------------------------------------------------------------------------
def test_an_enabled_op_without_a_self_check_stops_startup_not_the_first_request():
    setup = """
from sparsemla.plugin import selfcheck
del selfcheck._CHECKS["sparsemla.kernels.indexer.sglang_compat:topk_transform_paged"]
"""
    res, report = _load(setup, {"SPARSEMLA_TRITON_INDEXER": "1"})
    assert res.returncode != 0 and report == {}
    last = res.stderr.strip().splitlines()[-1]
    assert "no startup self-check for sparsemla.kernels.indexer.sglang_compat:topk_transform_paged" in last, last
    off, _ = _load(setup, {"SPARSEMLA_TRITON_INDEXER": "1", "SPARSEMLA_SELF_CHECK": "0"})
    assert off.returncode == 0, off.stderr[-3000:]


# -- the forked child behaves as `python -c` -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "code",
    [
        pytest.param("print('out'); import sys; print('err', file=sys.stderr)", id="clean-exit"),
        pytest.param("import sys; sys.exit(3)", id="exit-status"),
        pytest.param("raise SystemExit('sparsemla: stop')", id="exit-message"),
        pytest.param("raise ValueError('boom')", id="uncaught-exception"),
        pytest.param("import atexit; atexit.register(print, 'at exit')", id="atexit"),
        pytest.param("from sparsemla import flags; print(flags.SPARSEMLA_MMA_DECODE.get())", id="flag-from-env"),
    ],
)
def test_a_forked_case_exits_and_prints_as_a_new_interpreter_would(code):
    env = flags.child_env({**BASE, "SPARSEMLA_MMA_DECODE": "1"})
    want = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    got = _FORKS[0].run(code, env)
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout)
    assert got.stderr.strip().splitlines()[-1:] == want.stderr.strip().splitlines()[-1:]
