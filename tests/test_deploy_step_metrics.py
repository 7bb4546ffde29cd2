"""Per-step latency hook (plugin/step_metrics.py) on CPU: fake timer with controllable completion, real histograms."""

from __future__ import annotations

import enum
import random
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram

from sparsemla import flags
from sparsemla.metric_names import DECODE_STEP_BUCKETS, DECODE_STEP_LABELS, DECODE_STEP_SECONDS, batch_bucket
from sparsemla.plugin import step_metrics


class ForwardMode(enum.IntEnum):  # the shape of sglang's enum: members named like sglang's
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4
    TARGET_VERIFY = 5


@dataclass
class Batch:
    forward_mode: ForwardMode
    batch_size: int


@dataclass
class Runner:
    is_draft_worker: bool = False


class FakeGpu:
    """A GPU clock the test advances by hand: marks complete only when the test says the GPU got there."""

    def __init__(self) -> None:
        self.queued = 0  # marks recorded so far (GPU work items)
        self.completed = 0  # marks the "GPU" has reached
        self.durations: dict[int, float] = {}

    def start(self) -> int:
        self.queued += 1
        return self.queued

    def stop(self, mark: int) -> FakePending:
        self.queued += 1
        return FakePending(self, mark, self.queued)

    def finish_all(self) -> None:
        self.completed = self.queued


@dataclass
class FakePending:
    gpu: FakeGpu
    start_mark: int
    end_mark: int
    reads: int = 0

    def ready(self) -> bool:
        return self.gpu.completed >= self.end_mark

    def seconds(self) -> float:
        assert self.ready(), "elapsed time read before the GPU finished: that would be a host sync"
        self.reads += 1
        return self.gpu.durations[self.end_mark]


def _histogram() -> tuple[Histogram, CollectorRegistry]:
    registry = CollectorRegistry()
    hist = Histogram(
        DECODE_STEP_SECONDS, "test", labelnames=DECODE_STEP_LABELS, buckets=DECODE_STEP_BUCKETS, registry=registry
    )
    return hist, registry


def _count(registry: CollectorRegistry, mode: str, bucket: str) -> float:
    value = registry.get_sample_value(DECODE_STEP_SECONDS + "_count", {"forward_mode": mode, "batch_bucket": bucket})
    return value or 0.0


def _sum(registry: CollectorRegistry, mode: str, bucket: str) -> float:
    return (
        registry.get_sample_value(DECODE_STEP_SECONDS + "_sum", {"forward_mode": mode, "batch_bucket": bucket}) or 0.0
    )


def test_target_names_the_model_runner_forward() -> None:
    assert step_metrics.STEP_HOOK_TARGET == "sglang.srt.model_executor.model_runner.ModelRunner.forward"


def test_steps_are_observed_only_once_the_gpu_completed_them() -> None:
    rng = random.Random(3)
    gpu = FakeGpu()
    hist, registry = _histogram()
    rec = step_metrics.StepRecorder(gpu, hist, should_record=lambda runner: True)
    calls = []

    def forward(runner: Runner, batch: Batch, *args: object, **kwargs: object) -> str:
        calls.append((batch.batch_size, args, kwargs))
        return f"out-{batch.batch_size}"

    expected: dict[str, list[float]] = {}
    sizes = [rng.randint(1, 300) for _ in range(30)]
    for i, bs in enumerate(sizes):
        out = rec.around(forward, Runner(), Batch(ForwardMode.DECODE, bs), "proxy", reinit=True)
        assert out == f"out-{bs}"  # the hook returns what the original returned
        duration = rng.uniform(0.001, 0.2)
        gpu.durations[gpu.queued] = duration
        expected.setdefault(batch_bucket(bs), []).append(duration)
        # The GPU lags the host by two steps (4 marks): step j (end mark 2j+2) is complete once 2j+2 <= 2i-4, so
        # after step i exactly steps 0..i-3 may have been observed, and never a newer one.
        assert rec.observed == max(0, i - 2)
        gpu.completed = max(0, gpu.queued - 4)
    assert calls[0] == (sizes[0], ("proxy",), {"reinit": True})

    gpu.finish_all()
    rec.drain()
    assert rec.observed == len(sizes) and not rec.pending
    for bucket, durations in expected.items():
        assert _count(registry, "decode", bucket) == len(durations)
        assert _sum(registry, "decode", bucket) == pytest.approx(sum(durations))


def test_modes_are_labelled_and_idle_draft_and_other_ranks_skipped() -> None:
    gpu = FakeGpu()
    hist, registry = _histogram()
    rec = step_metrics.StepRecorder(gpu, hist, should_record=lambda runner: not runner.is_draft_worker)
    forward = lambda runner, batch: None  # noqa: E731
    for batch, runner in [
        (Batch(ForwardMode.DECODE, 64), Runner()),
        (Batch(ForwardMode.EXTEND, 3), Runner()),
        (Batch(ForwardMode.TARGET_VERIFY, 16), Runner()),
        (Batch(ForwardMode.IDLE, 0), Runner()),
        (Batch(ForwardMode.DECODE, 64), Runner(is_draft_worker=True)),
    ]:
        rec.around(forward, runner, batch)
        gpu.durations[gpu.queued] = 0.01
    gpu.finish_all()
    rec.drain()
    assert _count(registry, "decode", "33-64") == 1
    assert _count(registry, "extend", "2-4") == 1
    assert _count(registry, "target_verify", "9-16") == 1
    assert rec.observed == 3


def test_forward_batch_as_keyword_argument() -> None:
    gpu = FakeGpu()
    hist, registry = _histogram()
    rec = step_metrics.StepRecorder(gpu, hist, should_record=lambda runner: True)
    rec.around(lambda runner, forward_batch: 7, Runner(), forward_batch=Batch(ForwardMode.DECODE, 1))
    gpu.durations[gpu.queued] = 0.002
    gpu.finish_all()
    rec.drain()
    assert _count(registry, "decode", "1") == 1


def test_a_failing_step_is_not_recorded_and_the_error_propagates() -> None:
    gpu = FakeGpu()
    hist, registry = _histogram()
    rec = step_metrics.StepRecorder(gpu, hist, should_record=lambda runner: True)

    def boom(runner: Runner, batch: Batch) -> None:
        raise RuntimeError("CUDA error")

    with pytest.raises(RuntimeError, match="CUDA error"):
        rec.around(boom, Runner(), Batch(ForwardMode.DECODE, 8))
    assert not rec.pending


def test_pending_queue_is_bounded_when_the_gpu_never_catches_up() -> None:
    gpu = FakeGpu()
    hist, _ = _histogram()
    rec = step_metrics.StepRecorder(gpu, hist, should_record=lambda runner: True, max_pending=5)
    for _ in range(12):
        rec.around(lambda r, b: None, Runner(), Batch(ForwardMode.DECODE, 2))
    assert len(rec.pending) == 5 and rec.dropped == 7 and rec.observed == 0


def test_hook_is_a_pass_through_when_the_flag_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise AssertionError("recorder must not be built with the flag off")

    monkeypatch.setattr(step_metrics, "_get_recorder", fail)
    with flags.SPARSEMLA_STEP_METRICS.override(False):
        assert step_metrics.time_forward_step(lambda r, b, x=0: x + 1, Runner(), Batch(ForwardMode.DECODE, 1), x=4) == 5


def test_hook_uses_the_process_recorder_when_on(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu()
    hist, registry = _histogram()
    monkeypatch.setattr(step_metrics, "_recorder", step_metrics.StepRecorder(gpu, hist, lambda r: True))
    with flags.SPARSEMLA_STEP_METRICS.override(True):
        step_metrics.time_forward_step(lambda r, b: None, Runner(), Batch(ForwardMode.MIXED, 130))
    gpu.durations[gpu.queued] = 0.05
    gpu.finish_all()
    step_metrics._recorder.drain()
    assert _count(registry, "mixed", "129-256") == 1


def test_recorder_setup_failure_disables_metrics_but_keeps_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_metrics, "_recorder", None)
    monkeypatch.setattr(step_metrics, "_disabled", False)

    class Broken:
        def __init__(self) -> None:
            raise RuntimeError("no CUDA")

    monkeypatch.setattr(step_metrics, "CudaEventTimer", Broken)
    with flags.SPARSEMLA_STEP_METRICS.override(True):
        assert step_metrics.time_forward_step(lambda r, b: "ok", Runner(), Batch(ForwardMode.DECODE, 1)) == "ok"
        assert step_metrics.time_forward_step(lambda r, b: "ok", Runner(), Batch(ForwardMode.DECODE, 1)) == "ok"
    assert step_metrics._disabled is True


def test_multiprocess_mode_values_reach_the_multiprocess_collector(tmp_path: Path) -> None:
    """Two processes record into PROMETHEUS_MULTIPROC_DIR (as sglang's TP schedulers would); the collector sums them."""
    mp_dir = tmp_path / "mp"
    mp_dir.mkdir()
    worker = textwrap.dedent(
        """
        import sys
        from sparsemla.plugin import step_metrics
        class Done:
            def __init__(self, s): self.s = s
            def ready(self): return True
            def seconds(self): return self.s
        class Timer:
            def __init__(self): self.n = 0
            def start(self): return None
            def stop(self, mark):
                self.n += 1
                return Done(0.01 * self.n)
        class B:
            class forward_mode: name = "DECODE"
            batch_size = int(sys.argv[1])
        rec = step_metrics.StepRecorder(Timer(), step_metrics.make_histogram(), should_record=lambda r: True)
        for _ in range(3):
            rec.around(lambda r, b: None, object(), B())
        """
    )
    env = flags.child_env({"PROMETHEUS_MULTIPROC_DIR": str(mp_dir)})
    for bs in ("32", "32"):
        subprocess.run([sys.executable, "-c", worker, bs], env=env, check=True, timeout=60)
    reader = textwrap.dedent(
        f"""
        from prometheus_client import CollectorRegistry, multiprocess
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg, path={str(mp_dir)!r})
        labels = {{"forward_mode": "decode", "batch_bucket": "17-32"}}
        print(reg.get_sample_value("{DECODE_STEP_SECONDS}_count", labels),
              reg.get_sample_value("{DECODE_STEP_SECONDS}_sum", labels))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", reader], env=env, check=True, timeout=60, capture_output=True, text=True
    )
    count, total = map(float, out.stdout.split())
    assert count == 6
    assert total == pytest.approx(2 * (0.01 + 0.02 + 0.03))
