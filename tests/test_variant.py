"""The variant protocol (sparsemla.variant): the closed set, names from flags, and the flag-info series round trip."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sparsemla import __version__, flags, variant

KERNEL_ENV = ("SPARSEMLA_MMA_DECODE", "SPARSEMLA_TRITON_INDEXER", "SPARSEMLA_FORCE_REFERENCE", "SPARSEMLA_DISABLE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*KERNEL_ENV, "SGLANG_SM120_MMA_FLASHMLA"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_closed_set_follows_the_switches():
    assert variant.VARIANTS == ("baseline", "mma_decode", "triton_indexer", "mma_decode+triton_indexer")
    assert variant.ALL_ON == "mma_decode+triton_indexer"
    assert variant.PARTS == tuple(s.name.removeprefix("SPARSEMLA_").lower() for s in variant.SWITCHES)
    assert all(s.group == "kernels" and isinstance(s.default, bool) for s in variant.SWITCHES)


@pytest.mark.parametrize("name", variant.VARIANTS)
def test_parse_compose_round_trip(name):
    state = variant.parse(name)
    assert state.name == name
    assert variant.compose(state.on) == name
    labels = state.flag_labels()
    assert set(labels) == {"sparsemla_mma_decode", "sparsemla_triton_indexer"}
    assert [labels[variant.label_name(s)] == "on" for s in variant.SWITCHES] == [
        state.is_on(s) for s in variant.SWITCHES
    ]


@pytest.mark.parametrize(
    "name",
    ["", "fast", "triton_indexer+mma_decode", "baseline+mma_decode", "mma_decode+mma_decode", "reference", "unknown"],
    ids=["empty", "unknown-part", "wrong-order", "baseline-plus", "repeated", "reference-alone", "unknown"],
)
def test_parse_rejects_names_outside_the_set(name):
    with pytest.raises(variant.VariantError, match="expected one of"):
        variant.parse(name, allow_reference=True)


def test_reference_suffix_only_where_allowed():
    assert variant.parse("triton_indexer+reference", allow_reference=True) == variant.Variant(
        frozenset({"triton_indexer"}), True
    )
    with pytest.raises(variant.VariantError, match="torch references"):
        variant.parse("triton_indexer+reference")


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, "baseline"),
        ({"SPARSEMLA_MMA_DECODE": "1"}, "mma_decode"),
        ({"SPARSEMLA_MMA_DECODE": "1", "SPARSEMLA_TRITON_INDEXER": "yes"}, "mma_decode+triton_indexer"),
        ({"SPARSEMLA_TRITON_INDEXER": "1", "SPARSEMLA_FORCE_REFERENCE": "1"}, "triton_indexer+reference"),
        ({"SPARSEMLA_FORCE_REFERENCE": "1"}, "baseline"),
        ({"SPARSEMLA_MMA_DECODE": "1", "SPARSEMLA_DISABLE": "1"}, "baseline"),
        ({"SGLANG_SM120_MMA_FLASHMLA": "1"}, "mma_decode"),
    ],
    ids=["none", "decode", "both", "reference", "reference-alone", "disabled", "seed-alias"],
)
def test_current_from_the_flags(clean_env, env, expected):
    for key, value in env.items():
        clean_env.setenv(key, value)
    assert variant.current() == expected


def test_publish_then_read_back_through_a_real_exposition(clean_env):
    clean_env.setenv("SPARSEMLA_TRITON_INDEXER", "1")
    registry = CollectorRegistry()
    assert variant.publish(registry=registry) is True
    assert variant.publish(registry=registry) is False  # registered once per registry
    page = generate_latest(registry).decode() + "sglang:num_running_reqs 3\n"
    info = variant.info_from_metrics(page)
    assert info == {**variant.flag_labels(), "version": __version__, "variant": "triton_indexer"}
    assert info["sparsemla_triton_indexer"] == "on" and info["sparsemla_mma_decode"] == "off"
    assert variant.from_metrics(page) == "triton_indexer"


REFERENCE_INDEXER = {"SPARSEMLA_TRITON_INDEXER": "1", "SPARSEMLA_FORCE_REFERENCE": "1"}


@pytest.mark.parametrize(
    "env,applied,expected",
    [
        ({"SPARSEMLA_MMA_DECODE": "1", "SPARSEMLA_TRITON_INDEXER": "1"}, {"mma_decode"}, "mma_decode"),
        ({"SPARSEMLA_MMA_DECODE": "1"}, set(), "baseline"),
        (REFERENCE_INDEXER, set(), "baseline"),
        (REFERENCE_INDEXER, {"triton_indexer"}, "triton_indexer+reference"),
        ({}, {"mma_decode", "triton_indexer"}, "baseline"),
        ({"SPARSEMLA_MMA_DECODE": "1"}, None, "mma_decode"),
    ],
    ids=["one-of-two-applied", "none-applied", "reference-none-applied", "reference-applied", "applied-but-off",
         "flags-alone"],
)  # fmt: skip
def test_the_variant_names_only_the_switches_that_are_on_and_applied(clean_env, env, applied, expected):
    for key, value in env.items():
        clean_env.setenv(key, value)
    assert variant.current(applied) == expected
    assert variant.info_labels(applied)["variant"] == expected


def test_publish_with_applied_reports_the_flags_as_set_and_the_variant_as_applied(clean_env):
    clean_env.setenv("SPARSEMLA_MMA_DECODE", "1")
    registry = CollectorRegistry()
    assert variant.publish(registry=registry, applied=frozenset()) is True
    info = variant.info_from_metrics(generate_latest(registry).decode())
    assert info["variant"] == "baseline" and info["sparsemla_mma_decode"] == "on"


@pytest.mark.parametrize(
    "page",
    [
        "sglang:num_running_reqs 3\n",
        "garbage {{{ not metrics",
        'sparsemla_kernel_flags_info{variant="mma_decode"} 0\n',
    ],
    ids=["absent", "malformed", "value-0"],
)
def test_reading_a_page_without_the_series_says_unknown(page):
    assert variant.info_from_metrics(page) == {}
    assert variant.from_metrics(page) == variant.UNKNOWN


def test_the_truthy_set_is_the_flags_one():
    for raw in ("1", "true", "YES", " on "):
        assert flags.is_true(raw)
    for raw in ("0", "off", "", "2", "enabled"):
        assert not flags.is_true(raw)
