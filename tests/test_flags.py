"""The flag registry: typed values, clear errors, overrides, the env-reading rule and the generated docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparsemla import flags

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "raw,expected",
    [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("false", False), ("off", False)],
    ids=lambda v: repr(v),
)
def test_bool_flag_parses(monkeypatch, raw, expected):
    monkeypatch.setenv("SPARSEMLA_MMA_DECODE", raw)
    assert flags.SPARSEMLA_MMA_DECODE.get() is expected


@pytest.mark.parametrize("raw,expected", [("auto", "auto"), ("", "auto"), ("4", 4), ("32", 32)])
def test_split_k_values(monkeypatch, raw, expected):
    monkeypatch.setenv("SPARSEMLA_SPLIT_K", raw)
    assert flags.SPARSEMLA_SPLIT_K.get() == expected


@pytest.mark.parametrize(
    "name,raw,allowed",
    [
        ("SPARSEMLA_MMA_DECODE", "maybe", "1/0"),
        ("SPARSEMLA_SPLIT_K", "0", "auto | a positive integer"),
        ("SPARSEMLA_SPLIT_K", "many", "auto | a positive integer"),
        ("SPARSEMLA_LOG_LEVEL", "loud", "debug | info"),
    ],
)
def test_bad_values_name_the_flag_and_the_allowed_values(monkeypatch, name, raw, allowed):
    monkeypatch.setenv(name, raw)
    with pytest.raises(flags.FlagError) as err:
        flags.REGISTRY[name].get()
    assert name in str(err.value) and allowed in str(err.value) and repr(raw) in str(err.value)
    with pytest.raises(flags.FlagError):
        flags.validate_all()


def test_override_is_scoped_and_validated(monkeypatch):
    monkeypatch.delenv("SPARSEMLA_TRITON_INDEXER", raising=False)
    assert flags.SPARSEMLA_TRITON_INDEXER.get() is False
    with flags.SPARSEMLA_TRITON_INDEXER.override(True):
        assert flags.SPARSEMLA_TRITON_INDEXER.get() is True
        with flags.SPARSEMLA_TRITON_INDEXER.override("off"):
            assert flags.SPARSEMLA_TRITON_INDEXER.get() is False
        assert flags.SPARSEMLA_TRITON_INDEXER.get() is True
    assert flags.SPARSEMLA_TRITON_INDEXER.get() is False
    with pytest.raises(ValueError):
        with flags.SPARSEMLA_TRITON_INDEXER.override("sometimes"):
            pass


def test_truth_testing_a_flag_object_is_an_error():
    with pytest.raises(TypeError, match=r"\.get\(\)"):
        bool(flags.SPARSEMLA_MMA_DECODE)


def test_alias_and_canonical_precedence(monkeypatch):
    monkeypatch.setenv("SGLANG_SM120_MMA_FLASHMLA", "1")
    monkeypatch.delenv("SPARSEMLA_MMA_DECODE", raising=False)
    assert flags.SPARSEMLA_MMA_DECODE.get() is True
    assert flags.SPARSEMLA_MMA_DECODE.source() == "SGLANG_SM120_MMA_FLASHMLA"
    monkeypatch.setenv("SPARSEMLA_MMA_DECODE", "0")
    assert flags.SPARSEMLA_MMA_DECODE.get() is False


def test_child_env_applies_and_removes():
    env = flags.child_env({"SPARSEMLA_MMA_DECODE": "1", "SGLANG_SM120_MMA_FLASHMLA": None}, base={"A": "b"})
    assert env == {"A": "b", "SPARSEMLA_MMA_DECODE": "1"}
    env = flags.child_env({"SPARSEMLA_MMA_DECODE": None}, base={"SGLANG_SM120_MMA_FLASHMLA": "1"})
    assert env == {}, "removing a flag removes its aliases too"


def test_docs_flags_md_is_generated_from_the_registry():
    committed = (ROOT / "docs" / "flags.md").read_text()
    assert committed == flags.markdown_table(), (
        "docs/flags.md is stale: run `sparsemla flags --markdown > docs/flags.md`"
    )
    for name in flags.REGISTRY:
        assert f"`{name}`" in committed


def test_only_flags_py_reads_the_environment():
    pattern = re.compile(r"\bos\.(environ|getenv|putenv)\b|\bgetenv\(|from os import .*\b(environ|getenv)\b")
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in {".venv", "build", "results", ".git", ".gpu", ".whl"} or "egg-info" in str(rel):
            continue
        # tests/sglang_fork.py writes a forked child's whole environment (what subprocess's env= does), reading none
        if rel in (Path("src/sparsemla/flags.py"), Path("tests/test_flags.py"), Path("tests/sglang_fork.py")):
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code):
                offenders.append(f"{rel}:{lineno}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_cli_reports_bad_flag_with_exit_2():
    res = subprocess.run(
        [sys.executable, "-m", "sparsemla.cli", "flags", "--check"],
        env=flags.child_env({"SPARSEMLA_SPLIT_K": "-3"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "SPARSEMLA_SPLIT_K" in res.stderr and "Traceback" not in res.stderr
