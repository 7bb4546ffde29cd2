"""benchmarks.gpu_tests_record: JUnit XML of the two code paths -> the committed record, counted from the XML."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from benchmarks import gpu_tests_record as rec

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="{errors}"
 failures="{failures}" skipped="2" tests="5" time="12.5" timestamp="2026-12-04T07:43:30+00:00" hostname="vm">
<testcase classname="" name="tests.test_containers" time="0.000"><skipped message="collection skipped">('/w/tests/t.py',
 23, "Skipped: could not import 'fastapi': No module named 'fastapi'")</skipped></testcase>
<testcase classname="tests.test_x" name="test_a[B1]" time="1.0" />
<testcase classname="tests.test_x" name="test_b[H33]" time="1.0">{bad}</testcase>
<testcase classname="tests.test_x" name="test_c" time="1.0" />
<testcase classname="tests.test_y" name="test_d" time="0.1"><skipped type="pytest.skip"
 message="needs more shared memory than sm_89 has">skip</skipped></testcase>
</testsuite></testsuites>"""


def _write(path, *, failed: bool):
    bad = '<failure message="assert 1 == 2">tb</failure>' if failed else ""
    path.write_text(XML.format(errors=0, failures=int(failed), bad=bad))


@pytest.mark.parametrize("failed", [False, True], ids=["all-pass", "one-failure"])
def test_summarise_counts_from_the_xml(tmp_path, failed):
    _write(tmp_path / "gpu-sm89.xml", failed=failed)
    s = rec.summarise(tmp_path / "gpu-sm89.xml")
    assert (s["tests"], s["skipped"], s["failures"]) == (5, 2, int(failed))
    assert s["passed"] == 3 - int(failed)
    assert s["failed"] == (["tests.test_x::test_b[H33]"] if failed else [])
    assert s["modules"] == {"tests.test_containers": 1, "tests.test_x": 3, "tests.test_y": 1}
    assert s["skip_reasons"] == {
        "collection: could not import 'fastapi': No module named 'fastapi'": 1,
        "needs more shared memory than sm_89 has": 1,
    }


def test_cli_writes_both_paths_and_refuses_an_empty_folder(tmp_path):
    runner = CliRunner()
    args = ["--sha", "abc", "--gpu", "NVIDIA H200", "--torch", "2.11", "--triton", "3.6"]
    empty = runner.invoke(rec.app, [str(tmp_path), *args])
    assert empty.exit_code == 2 and "no gpu-native.xml" in empty.output
    _write(tmp_path / "gpu-native.xml", failed=False)
    _write(tmp_path / "gpu-sm89.xml", failed=True)
    out = tmp_path / "record.json"
    command = "bash benchmarks/gpu-tests.sh both tests/test_x.py"
    done = runner.invoke(rec.app, [str(tmp_path), *args, "--out", str(out), "--command", command])
    assert done.exit_code == 0, done.output
    record = json.loads(out.read_text())
    assert record["command"].startswith(command + "  (")
    assert record["date"] == "2026-12-04" and record["git_sha"] == "abc"
    assert record["paths"]["native"]["failed"] == [] and record["paths"]["sm89"]["failures"] == 1
