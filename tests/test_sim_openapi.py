"""The simulator's OpenAPI schema: exported by `sparsemla sim --openapi`, fuzzed with schemathesis (no 5xx, no hang).

The fuzzed server runs with a 64-token context and the fastest calibrated state, so any generated request finishes in
well under a second; hypothesis is limited to a few examples per operation to keep the file under a minute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparsemla.ops.sim.calibration import PROVISIONAL_PATH
from sparsemla.ops.sim.testing import run_sim

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

pytestmark = pytest.mark.slow
FAST = {
    "SPARSEMLA_MMA_DECODE": "1",
    "SPARSEMLA_TRITON_INDEXER": "1",
    "SPARSEMLA_SIM_CALIBRATION": str(PROVISIONAL_PATH),
}
ROUTES = {"/v1/chat/completions", "/v1/completions", "/generate", "/v1/models", "/health", "/health_generate",
          "/get_model_info", "/server_info", "/metrics", "/start_profile", "/stop_profile", "/flush_cache"}  # fmt: skip


def test_openapi_export_lists_every_route(tmp_path: Path) -> None:
    out = tmp_path / "openapi.json"
    cmd = [sys.executable, "-c", "from sparsemla.ops.sim.cli import app; app()", "--openapi", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    doc = json.loads(out.read_text())
    assert doc["openapi"].startswith("3.")
    assert ROUTES <= set(doc["paths"])
    assert "messages" in doc["components"]["schemas"]["ChatCompletionRequest"]["required"]


@pytest.fixture(scope="module")
def fuzz_sim(tmp_path_factory):
    profile_dir = tmp_path_factory.mktemp("profiles")
    env = {**FAST, "SGLANG_TORCH_PROFILER_DIR": str(profile_dir)}
    with run_sim(env, ("--context-length", "64", "--max-total-tokens", "4096")) as sim:
        yield sim


def test_fuzz_no_server_errors(fuzz_sim) -> None:
    """Every operation, positive and negative data, a bounded number of examples each: never a 5xx, never a hang.
    The profiling routes too: /start_profile writes only below the server's profiler directory, whatever output_dir
    says (a fuzzed path elsewhere is a 400)."""
    api = schemathesis.openapi.from_url(f"{fuzz_sim.url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                      database=None)  # fmt: skip
            def run(case) -> None:
                response = case.call(base_url=fuzz_sim.url, timeout=15)
                case.validate_response(response, checks=[not_a_server_error])

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, operation.label  # no inputs to break (e.g. GET /health)
