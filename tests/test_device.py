"""Device facts and what each target gets: every configuration the launchers choose fits the target's shared-memory
budget, the sm_80/86 paths never need an e4m3 type, and a GPU no configuration fits is refused with the reason."""

from __future__ import annotations

import pytest

from sparsemla import flags
from sparsemla.kernels import device as dev
from sparsemla.kernels.support import INDEXER_SHARED_MAX, check_device, decode_shared_need

TARGET_IDS = list(dev.TARGETS)


def test_targets_have_the_documented_budgets():
    budgets = {name: info.smem_per_block for name, info in dev.TARGETS.items()}
    assert budgets == {"sm_80": 166_912, "sm_86": 101_376, "sm_89": 101_376, "sm_90": 232_448, "sm_100": 232_448,
                       "sm_120": 101_376}  # fmt: skip
    assert [n for n, i in dev.TARGETS.items() if i.has_fp8] == ["sm_89", "sm_90", "sm_100", "sm_120"]
    assert [n for n, i in dev.TARGETS.items() if i.has_wgmma] == ["sm_90", "sm_100"]
    assert dev.target("sm120") is dev.target("120") is dev.target("SM_120")
    with pytest.raises(ValueError, match="unknown target"):
        dev.target("sm_75")


@pytest.mark.parametrize("name", TARGET_IDS)
def test_every_decode_config_fits_the_budget(name):
    info = dev.target(name)
    assert decode_shared_need(info) <= info.smem_per_block
    check_device(info)  # does not raise


@pytest.mark.parametrize("name", ["sm_86", "sm_89", "sm_120"])
def test_small_budget_targets_never_get_the_hopper_tiles(name):
    from sparsemla.kernels.sparse_decode.triton import choose_config

    info = dev.target(name)
    for heads in (8, 16, 64, 128):
        for rows in (1, 8, 64, 8192):
            cfg = choose_config(info, heads, rows)
            assert cfg.int_dequant, "sm_80/86 have no e4m3 type; every mma.sync target takes the integer dequant"
            assert cfg.block_h <= 32 and cfg.num_stages == 1, cfg


@pytest.mark.parametrize("name", TARGET_IDS)
def test_the_opaque_tile_goes_where_the_dots_are_mma_sync(name):
    """The decode tile's opaque move (operands laid out for bf16, not for the uint8 bytes it came from) is on for every
    configuration whose dots are mma.sync -- all of sm_80/86/89/120, 16-head blocks everywhere -- and off for wgmma
    tiles and pipelined configurations; asking for it with a pipelined one is refused."""
    from sparsemla.kernels.sparse_decode.triton import DecodeConfig, choose_config, opaque_tile_default

    info = dev.target(name)
    for heads in (8, 16, 33, 64, 128):
        for rows in (1, 8, 64, 8192):
            cfg = choose_config(info, heads, rows)
            mma_sync = not (info.has_wgmma and cfg.block_h >= 64)
            assert opaque_tile_default(cfg, info) == (mma_sync and cfg.num_stages == 1), (heads, rows, cfg)
            if not info.has_wgmma or heads <= 16:
                assert opaque_tile_default(cfg, info), (heads, rows, cfg)
    assert not opaque_tile_default(DecodeConfig(32, 16, 4, 2), info)
    with pytest.raises(ValueError, match="num_stages=1"):
        DecodeConfig(32, 16, 4, 2, opaque_tile=True)


def test_old_or_small_gpus_are_refused_with_the_reason():
    volta = dev.DeviceInfo((7, 0), 98_304, 80, 98_304, "Tesla V100")
    with pytest.raises(dev.UnsupportedDevice, match="sm_80 or newer"):
        check_device(volta)
    tiny = dev.DeviceInfo((8, 6), 49_152, 10, 49_152, "tiny")
    with pytest.raises(dev.UnsupportedDevice, match="SPARSEMLA_MMA_DECODE needs"):
        check_device(tiny, ("decode",))
    check_device(dev.DeviceInfo((8, 6), INDEXER_SHARED_MAX, 10, INDEXER_SHARED_MAX, "indexer only"), ("indexer",))


def test_assume_hands_launchers_another_gpu():
    info = dev.target("sm_120")
    with dev.assume(info):
        assert dev.device_info() is info
        with dev.assume(dev.target("sm_80")):
            assert dev.device_info().arch == 80
        assert dev.device_info() is info


def test_override_arch_is_parsed_through_flags():
    with flags.TRITON_OVERRIDE_ARCH.override("sm89"):
        assert dev._override_arch() == (8, 9)
    with flags.TRITON_OVERRIDE_ARCH.override("sm_120"):
        assert dev._override_arch() == (12, 0)
    with flags.TRITON_OVERRIDE_ARCH.override("hopper"), pytest.raises(flags.FlagError, match="smNN"):
        dev._override_arch()
