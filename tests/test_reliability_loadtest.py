"""Load-test reliability and security without servers: run ids are names (never paths, nothing outside a point's own
files is deleted), every numeric option is bounded, a corrupt resume file is a clear exit-2 error, failed requests
add no throughput and a too-high error rate is a non-zero exit, users back off from a failing server, the API key
never reaches Locust's command line, and SIGTERM unwinds like Ctrl-C. (With servers: test_reliability_loadtest_e2e.)
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sparsemla import flags
from sparsemla.loadtest import ab, cli, runner, sweep
from sparsemla.loadtest.backoff import BACKOFF_MAX_S, backoff_s
from sparsemla.loadtest.options import LoadOptions
from sparsemla.loadtest.records import RequestRecord
from sparsemla.loadtest.report import ReportError, load_run
from sparsemla.loadtest.runner import LoadTestConfig, reset_point_dir, validate_run_id
from sparsemla.loadtest.summary import summarize
from sparsemla.loadtest.sweep import SweepError, run_sweep
from sparsemla.loadtest.target import TargetInfo
from sparsemla.procs import Terminated, is_alive, sigterm_as_interrupt

BAD_RUN_IDS = [".", "..", "../../somewhere", "a/b", "/tmp/x", "", "-rf", "x y", "a\\b", "r" * 200]
TARGET = "http://127.0.0.1:9"


class _Ran(Exception):
    """Raised by the stand-ins: the command got past its validation and started a run."""


def _summary(concurrency: int, failure_rate: float) -> dict[str, Any]:
    return {
        "concurrency": concurrency, "repeat": 1, "duration_s": 2.0, "requests": 10, "req_per_s": 5.0,
        "output_tok_per_s": 100.0, "peak_output_tok_per_s": 120.0, "failure_rate": failure_rate,
        "failures": {"connection": 0, "http_error": 3, "timeout": 0, "sse": 0, "total": 3},
        "failures_marked": failure_rate > 0.01, "failure_examples": ["[http_error] HTTP 500"],
        "goodput": {"share": 1.0}, "variant": "baseline",
        **{k: {"p50": 0.1, "p90": 0.1, "p99": 0.1, "mean": 0.1} for k in ("ttft_s", "itl_s", "tpot_s", "e2e_s")},
    }  # fmt: skip


@pytest.fixture
def results(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SPARSEMLA_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "results"


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch, results: Path) -> dict[str, Any]:
    """run_point / run_sweep / run_ab record their call and raise _Ran (nothing is run)."""
    seen: dict[str, Any] = {}

    def ran(**kw: Any) -> Any:
        seen.update(kw)
        raise _Ran

    monkeypatch.setattr(runner, "run_point", lambda cfg, out, run_id, **_: ran(cfg=cfg, out=out))
    monkeypatch.setattr(sweep, "run_sweep", lambda cfg, points, repeat, run_dir, **_: ran(cfg=cfg, out=run_dir))
    monkeypatch.setattr(ab, "require_kernel_flag", lambda flag: None)
    monkeypatch.setattr(ab, "run_ab", lambda flag, points, repeat, cfg, **kw: ran(cfg=cfg, **kw))
    return seen


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli.app, list(args))


# -- 1. run ids are names ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["loadtest", "sweep", "ab"])
@pytest.mark.parametrize("run_id", BAD_RUN_IDS, ids=lambda r: repr(r[:12]))
def test_a_run_id_that_is_a_path_is_refused_before_anything_runs(
    stand_ins: dict[str, Any], command: str, run_id: str
) -> None:
    result = _invoke(command, "--target", TARGET, "--run-id", run_id)
    assert not stand_ins, f"{command} started a run with --run-id {run_id!r}"
    assert result.exit_code == 2, result.output
    assert "run-id" in result.output and "plain name" in result.output


@pytest.mark.parametrize("run_id", ["sweep-20240101-120000", "my_run.2", "A-b_c.d"], ids=str)
def test_a_plain_run_id_is_accepted(stand_ins: dict[str, Any], results: Path, run_id: str) -> None:
    result = _invoke("loadtest", "--target", TARGET, "--run-id", run_id)
    assert isinstance(result.exception, _Ran), result.output
    assert stand_ins["out"] == results / "loadtest" / run_id


def _fake_locust(monkeypatch: pytest.MonkeyPatch) -> None:
    """A target that answers (probe) and a Locust that cannot start: run_point stops right after its reset."""
    monkeypatch.setattr(runner, "probe", lambda url, **_: TargetInfo(url=url))

    def no_locust(*_a: Any, **_kw: Any) -> Any:
        raise _Ran

    monkeypatch.setattr(runner.subprocess, "Popen", no_locust)


def test_run_id_dot_deletes_no_earlier_run(monkeypatch: pytest.MonkeyPatch, results: Path, tmp_path: Path) -> None:
    """`loadtest --run-id .` used to delete results/loadtest (every earlier run); `../..` a directory outside."""
    _fake_locust(monkeypatch)
    earlier = results / "loadtest" / "earlier-run" / "summary.json"
    outside = tmp_path / "precious" / "keep.txt"
    for path in (earlier, outside):
        path.parent.mkdir(parents=True)
        path.write_text(secrets.token_hex(8))
    for run_id in (".", "..", "../../precious"):
        result = _invoke("loadtest", "--target", TARGET, "--run-id", run_id)
        assert result.exit_code == 2, (run_id, result.output)
    assert earlier.exists() and outside.exists()


def test_rerunning_a_point_deletes_only_its_own_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_locust(monkeypatch)
    out = tmp_path / "point"
    foreign = [out / "other-run" / "summary.json", out / "notes.txt", out / "c0001-r1" / "requests.jsonl"]
    own = [out / name for name in ("summary.json", "requests.jsonl", "timeline.json", "locust.log")] + [
        out / "prom" / "counter_1.db"
    ]
    for path in foreign + own:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(4))
    cfg = LoadTestConfig(target=TARGET, concurrency=2, duration_s=1.0, metrics_port=0)
    with pytest.raises(_Ran):
        runner.run_point(cfg, out, "point")
    assert all(p.exists() for p in foreign), [p for p in foreign if not p.exists()]
    assert not any(p.exists() for p in own[:-1]) and not (out / "prom" / "counter_1.db").exists()


def test_reset_never_follows_a_symlinked_prom_dir(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.db").write_text("keep")
    out = tmp_path / "point"
    out.mkdir()
    (out / "prom").symlink_to(elsewhere, target_is_directory=True)
    reset_point_dir(out)
    assert (elsewhere / "data.db").exists() and not (out / "prom").exists()


@pytest.mark.parametrize("name", ["../elsewhere", "../../loadtest-root", "a/../../elsewhere"], ids=str)
def test_compare_takes_a_run_id_as_a_name_not_a_path(
    monkeypatch: pytest.MonkeyPatch, results: Path, tmp_path: Path, name: str
) -> None:
    """A run id that is not an existing directory is looked up under results/loadtest as a name, never as a path."""
    cwd = tmp_path / "cwd" / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)  # `name` relative to here is no directory; relative to results/loadtest it would be
    target = (results / "loadtest" / name).resolve()
    target.mkdir(parents=True, exist_ok=True)
    (target / "summary.json").write_text(json.dumps(_summary(1, 0.0)))
    with pytest.raises(ReportError, match="neither an existing run directory nor a run id"):
        load_run(name)
    result = CliRunner().invoke(cli.app, ["compare", name, name, "--prometheus", "off"])
    assert result.exit_code == 2 and "run id" in result.output


def test_a_run_given_as_a_directory_gets_a_safe_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "my run (old)"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(_summary(1, 0.0)))
    monkeypatch.chdir(run)
    for given in (".", str(run)):
        name = load_run(given).name
        assert validate_run_id(name) == name == "my_run__old_"


@pytest.mark.parametrize("run_id", BAD_RUN_IDS, ids=lambda r: repr(r[:12]))
def test_validate_run_id_refuses_paths(run_id: str) -> None:
    with pytest.raises(ValueError, match="plain name"):
        validate_run_id(run_id)


# -- 12. bounds on every numeric option ----------------------------------------------------------------------------
OUT_OF_BOUNDS = [
    ("--request-timeout", "-1"), ("--request-timeout", "0"), ("--ttft-slo", "-1"), ("--ttft-slo", "0"),
    ("--tpot-slo", "-0.5"), ("--processes", "100000"), ("--metrics-port", "70000"),
    ("--metrics-port", "-1"), ("--seed", "-1"), ("--max-tokens", "99999999999"),
    ("--max-error-rate", "1.5"), ("--max-error-rate", "-0.1"), ("--duration", "99999h"),
]  # fmt: skip


@pytest.mark.parametrize("command", ["loadtest", "sweep", "ab"])
@pytest.mark.parametrize(("option", "value"), OUT_OF_BOUNDS, ids=lambda v: str(v))
def test_out_of_bounds_options_exit_2(stand_ins: dict[str, Any], command: str, option: str, value: str) -> None:
    result = _invoke(command, "--target", TARGET, option, value)
    assert not stand_ins, f"{command} {option} {value} started a run"
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize(
    ("command", "value"),
    [("loadtest", "99999999999999999999"), ("sweep", "1 99999999999999999999"), ("ab", "1 200000")],
    ids=lambda v: str(v)[:14],
)
def test_concurrency_is_bounded(stand_ins: dict[str, Any], command: str, value: str) -> None:
    result = _invoke(command, "--target", TARGET, "-c", value)
    assert not stand_ins and result.exit_code == 2, result.output


@pytest.mark.parametrize(
    "field",
    [("request_timeout_s", -1.0), ("ttft_slo_s", -1.0), ("tpot_slo_s", 0.0), ("concurrency", 10**20),
     ("metrics_port", 70000), ("max_tokens", -1), ("warmup_s", -2.0), ("duration_s", float("inf"))],
    ids=lambda f: f"{f[0]}={f[1]}",
)  # fmt: skip
def test_config_validate_bounds_for_api_callers(field: tuple[str, Any]) -> None:
    kw = {"target": TARGET, "concurrency": 4, "duration_s": 5.0, field[0]: field[1]}
    with pytest.raises(ValueError):
        LoadTestConfig(**kw).validate()


# -- 12. a corrupt resume file is a clear error --------------------------------------------------------------------
def _truncate(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text[: random.Random(len(text)).randrange(1, len(text) - 1)])


@pytest.mark.parametrize("which", ["sweep.json", "summary.json"])
def test_a_truncated_resume_file_is_an_exit_2_naming_the_file(results: Path, which: str) -> None:
    run_dir = results / "loadtest" / "resumed"
    opts = LoadOptions(target=TARGET, duration="2s", metrics_port=0)
    manifest = sweep._manifest(opts.config(1), [1], 1, {})
    if which == "sweep.json":
        _truncate(run_dir / "sweep.json", json.dumps(manifest))
        bad = run_dir / "sweep.json"
    else:
        (run_dir / "sweep.json").parent.mkdir(parents=True)
        (run_dir / "sweep.json").write_text(json.dumps(manifest))
        bad = run_dir / "c0001-r1" / "summary.json"
        _truncate(bad, json.dumps(_summary(1, 0.0)))
    result = _invoke("sweep", "--target", TARGET, "--duration", "2s", "--metrics-port", "0", "-c", "1",
                     "--run-id", "resumed")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    flat = " ".join(result.output.split())
    assert str(bad) in flat.replace(" ", "") or bad.name in flat
    assert "--run-id" in flat and "delete" in flat
    with pytest.raises(SweepError, match=which.replace(".", r"\.")):
        run_sweep(opts.config(1), [1], 1, run_dir)


def test_a_sweep_json_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "sweep.json").write_text(json.dumps([1, 2]))
    cfg = LoadTestConfig(target=TARGET, concurrency=1, duration_s=1.0)
    with pytest.raises(SweepError, match="new --run-id"):
        run_sweep(cfg, [1], 1, tmp_path / "r")


# -- 10. failed requests add no throughput; the error rate decides the exit code; back-off -------------------------
def test_tokens_of_failed_requests_are_not_throughput() -> None:
    rng = random.Random(7)
    records, delivered = [], 0.0
    for k in range(200):
        start = 100.0 + rng.uniform(0, 9)
        n = rng.randint(2, 30)
        offsets = sorted(rng.uniform(0.01, 0.9) for _ in range(n))
        error = rng.choice([None, "http_error", "sse", "connection", "timeout"])
        records.append(RequestRecord(start, offsets, None, n, 10, offsets[-1] + 0.01, error, f"[{error}]" if error
                                     else None, request_id=str(k)))  # fmt: skip
        if error is None:
            delivered += sum(1 for t in offsets if 100.0 <= start + t < 110.0)
    s = summarize(records, measure_start=100.0, stop=110.0, concurrency=8, ttft_slo_s=1.0, tpot_slo_s=1.0)
    assert s["output_tokens"] == pytest.approx(delivered)
    all_failed = [RequestRecord(r.start, r.offsets, None, r.output_tokens, 10, r.e2e, "http_error") for r in records]
    s = summarize(all_failed, measure_start=100.0, stop=110.0, concurrency=8, ttft_slo_s=1.0, tpot_slo_s=1.0)
    assert s["output_tokens"] == 0 and s["output_tok_per_s"] == 0 and s["peak_output_tok_per_s"] == 0
    assert s["failure_rate"] == 1.0


@pytest.mark.parametrize(
    ("rate", "args", "code"),
    [(1.0, (), 1), (0.06, (), 1), (0.05, (), 0), (0.0, (), 0), (1.0, ("--max-error-rate", "1"), 0),
     (0.02, ("--max-error-rate", "0.01"), 1)],
    ids=lambda v: str(v),
)  # fmt: skip
def test_exit_code_follows_max_error_rate(
    monkeypatch: pytest.MonkeyPatch, results: Path, rate: float, args: tuple[str, ...], code: int
) -> None:
    monkeypatch.setattr(runner, "run_point", lambda cfg, out, run_id, **_: _summary(cfg.concurrency, rate))
    result = _invoke("loadtest", "--target", TARGET, "-c", "3", *args)
    assert result.exit_code == code, result.output
    if code:
        assert "max-error-rate" in result.output
    monkeypatch.setattr(sweep, "run_sweep", lambda cfg, pts, rep, d, **_: [_summary(1, 0.0), _summary(2, rate)])
    assert _invoke("sweep", "--target", TARGET, "-c", "1 2", *args).exit_code == code


def test_backoff_grows_is_capped_and_spares_a_single_failure() -> None:
    delays = [backoff_s(n) for n in range(40)]
    assert delays[0] == delays[1] == 0.0 and delays[2] > 0
    assert all(b >= a for a, b in zip(delays, delays[1:], strict=False))
    assert max(delays) == BACKOFF_MAX_S
    # a dead server: two users failing instantly for 4 s send a handful of requests, not thousands
    sent, clock, n = 0, 0.0, 0
    while clock < 4.0:
        clock += backoff_s(n)
        n += 1
        sent += 1
    assert sent < 20


# -- 13. the API key never reaches a command line ------------------------------------------------------------------
def test_the_api_key_is_not_on_locusts_command_line(tmp_path: Path) -> None:
    key = "sk-" + "".join(random.choices(string.ascii_letters + string.digits, k=32))
    cfg = LoadTestConfig(target=TARGET, concurrency=2, duration_s=1.0, api_key=key)
    argv = runner._locust_argv(cfg, tmp_path, "r", TargetInfo(url=TARGET))
    assert not any(key in arg for arg in argv), argv
    env = runner.locust_env(cfg, tmp_path / "prom")
    assert env[flags.SPARSEMLA_LOADTEST_API_KEY.name] == key
    no_key = runner.locust_env(LoadTestConfig(target=TARGET, concurrency=2, duration_s=1.0), tmp_path)
    assert flags.SPARSEMLA_LOADTEST_API_KEY.name not in no_key


# -- 4. SIGTERM unwinds like Ctrl-C ---------------------------------------------------------------------------------
def test_sigterm_raises_terminated_inside_the_block_and_is_restored_after() -> None:
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(Terminated), sigterm_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            cleaned.append(True)
    assert cleaned == [True] and signal.getsignal(signal.SIGTERM) is before


def test_die_with_parent_kills_an_orphan(tmp_path: Path) -> None:
    """A grandchild armed with die_with_parent is killed when its parent (the child) is SIGKILLed."""
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import os, time; from sparsemla.procs import "
        "die_with_parent; die_with_parent(os.getppid()); time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(pid_file.read_text())
        time.sleep(1.0)  # the grandchild has armed itself (its interpreter is up)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while is_alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = is_alive(grandchild)
        if alive:
            os.kill(grandchild, signal.SIGKILL)
        assert not alive, "the orphaned grandchild kept running"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_worker_forked_by_the_locustfile_process_dies_with_it_before_locust_init(tmp_path: Path) -> None:
    """Locust's `--processes` workers wait in connect_to_master (minutes) before the init event: they are armed at the
    fork. The process that imported the locustfile forks a worker and a worker's own fork, then dies; the worker must
    go at once, and the worker's child (whose parent is the worker, not the importer) must not be killed by the
    importer's death nor exit at its own fork."""
    pids = tmp_path / "pids"
    code = (
        "import os, sys, time\n"
        "import sparsemla.loadtest.locustfile\n"
        "worker = os.fork()\n"
        "if worker == 0:\n"
        "    grandchild = os.fork()\n"
        "    if grandchild == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        f"    open({str(pids)!r} + '.tmp', 'w').write(f'{{os.getpid()}} {{grandchild}}')\n"
        f"    os.rename({str(pids)!r} + '.tmp', {str(pids)!r})\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        f"while not os.path.exists({str(pids)!r}):\n"
        "    time.sleep(0.01)\n"
        "os._exit(0)\n"  # dies without reaping or signalling its worker, like a SIGKILLed master
    )
    importer = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert importer.returncode == 0
    worker, grandchild = (int(p) for p in pids.read_text().split())
    try:
        deadline = time.monotonic() + 10
        while is_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_alive(worker), "the forked worker kept running after the process that forked it died"
        assert is_alive(grandchild), "the worker's own child was killed with the importer or exited at its fork"
    finally:
        for pid in (worker, grandchild):
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
