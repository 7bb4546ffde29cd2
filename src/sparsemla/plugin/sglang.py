"""sglang plugin: swaps DeepSeek-V4 sparse-attention calls to sparsemla's kernels behind flags, in every sglang process.

sglang discovers :func:`register` through the entry-point group ``sglang.srt.plugins`` (see pyproject.toml), calls it
early in every process (server, tokenizer, schedulers/TP workers, detokenizer) and then applies the hooks registered
with ``sglang.srt.plugins.hook_registry.HookRegistry``. The hooks are described by :data:`HOOKS`, a table of data:
sglang target (dotted path) -> our op -> the flag that enables it -> the sglang versions it was tested on.

Each kernel hook is AROUND: it decides at call time (a dictionary lookup) whether to run sglang's original or our op,
so a flag that is off gives sglang's own behaviour bit for bit. With the flag on, our op's errors propagate: there is
no silent fallback to the original. An explicitly enabled kernel that cannot run (bad flag value, no Triton, GPU
mismatch in the self-check, a hook sglang did not apply, a sglang version not in the table) stops the process loudly.
With every flag off on a sglang version not in the table: one warning, no hooks, the flag metric says ``baseline``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sparsemla import SGLANG_VERSION, __version__, flags, variant
from sparsemla.metric_names import KERNEL_FLAGS_INFO
from sparsemla.plugin import real_heads

log = logging.getLogger("sparsemla.plugin")

SGLANG_VERSIONS = (SGLANG_VERSION,)


@dataclass(frozen=True)
class HookSpec:
    """One row of the hook table.

    ``call`` says how the original's arguments reach our op: ``kwargs`` binds them to the original's signature and
    passes them all by name (sglang's decode entries take keywords); ``positional`` passes them in the original's
    parameter order (the indexer logits functions share one positional contract); ``timer`` always runs the original
    and ``op`` wraps it (``op(original, *args, **kwargs)``). ``params`` are the original's parameter names our op
    relies on (the contract tests check them against the installed sglang). ``requires`` names a module that must be
    importable for the target to exist (the hook is skipped, with a debug line, when it is not); ``required``: the
    flag cannot be honoured without this hook, so a flag that is on while ``requires`` is missing stops startup.
    ``when`` (``module:function`` of the call's arguments by name -> bool, ``kwargs`` hooks only): with the flag on,
    only calls it accepts go to our op, the others to sglang's original (one sglang entry point serves several
    models, e.g. FlashMLA's decode serves DeepSeek-V4 and V3.2 caches)."""

    name: str
    target: str
    op: str
    flag: flags.Flag[Any]
    call: Literal["kwargs", "positional", "timer"]
    params: tuple[str, ...]
    requires: str | None = None
    versions: tuple[str, ...] = SGLANG_VERSIONS
    note: str = ""
    required: bool = False
    when: str | None = None


_DECODE_PARAMS = ("q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v", "softmax_scale",
                  "extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length")  # fmt: skip
_INDEXER_PARAMS = ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table", "deep_gemm_metadata", "max_seq_len",
                   "clean_logits")  # fmt: skip
_V32_DECODE_PARAMS = ("q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata",
                      "num_splits", "softmax_scale", "is_fp8_kvcache", "indices", "topk_length",
                      "kv_format")  # fmt: skip
_TOPK_PARAMS = ("scores", "seq_lens", "page_tables", "out_page_indices", "page_size", "out_raw_indices")
_TOPK_OP = "sparsemla.kernels.indexer.sglang_compat:topk_transform_paged"
_FLASHMLA = "sglang.kernels.ops.attention.flash_mla_interface"
_DSA = "sparsemla.kernels.dsa_compat"

HOOKS: tuple[HookSpec, ...] = (
    HookSpec(
        name="decode_sm120",
        target="sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120",
        op="sparsemla.kernels.sparse_decode.api:sparse_decode",
        flag=flags.SPARSEMLA_MMA_DECODE,
        call="kwargs",
        params=(),  # the original takes **kwargs; the keyword names are checked at its call site instead
        note="DeepSeek-V4 decode on SM120 (deepseek_v4_backend.py imports it at call time)",
    ),
    HookSpec(
        name="decode_flashmla",
        target="sglang.kernels.ops.attention.flash_mla_interface.flash_mla_with_kvcache",
        op="sparsemla.kernels.sparse_decode.api:sparse_decode",
        flag=flags.SPARSEMLA_MMA_DECODE,
        call="kwargs",
        params=_DECODE_PARAMS,
        requires="flash_mla",
        note="DeepSeek-V4 decode on Hopper/Blackwell datacenter GPUs (bound into a partial at backend init)",
        when=f"{_DSA}:is_not_v32_sparse_decode",  # the V3.2 calls of this entry point are dsa_v32_decode's
    ),
    HookSpec(
        name="dsa_v32_resolution",
        target="sglang.srt.arg_groups.overrides._dsa_split_backend_resolution",
        op="sparsemla.plugin.dsa_v32:resolve_dsa_backends",
        flag=flags.SPARSEMLA_DSA_V32,
        call="timer",  # not a timer: it always runs sglang's pass and amends its result (see plugin/dsa_v32.py)
        params=("view",),
        note="DSA backend auto-resolution: on sm_8x/sm_12x, trtllm/fa3 (no kernel there) -> flashmla_kv/_sparse",
    ),
    HookSpec(
        name="dsa_v32_decode",
        target=f"{_FLASHMLA}.flash_mla_with_kvcache",
        op=f"{_DSA}:flash_mla_with_kvcache",
        flag=flags.SPARSEMLA_DSA_V32,
        call="kwargs",
        params=_V32_DECODE_PARAMS,
        requires="flash_mla",
        required=True,
        when=f"{_DSA}:is_v32_sparse_decode",
        note="DeepSeek-V3.2 sparse decode of the flashmla_kv impl (fp8 656 B/token cache; imported at call time)",
    ),
    HookSpec(
        name="dsa_v32_schedule",
        target=f"{_FLASHMLA}.get_mla_metadata",
        op=f"{_DSA}:get_mla_metadata",
        flag=flags.SPARSEMLA_DSA_V32,
        call="kwargs",
        params=("cache_seqlens", "num_q_tokens_per_head_k", "num_heads_k", "num_heads_q", "is_fp8_kvcache", "topk"),
        requires="flash_mla",
        required=True,
        when=f"{_DSA}:is_v32_decode_schedule",
        note="FlashMLA's split-KV schedule for flashmla_kv (a CUDA kernel with no sm_8x/sm_12x image); ours: zeros",
    ),
    HookSpec(
        name="dsa_v32_prefill",
        target=f"{_FLASHMLA}.flash_mla_sparse_fwd",
        op=f"{_DSA}:flash_mla_sparse_fwd",
        flag=flags.SPARSEMLA_DSA_V32,
        call="kwargs",
        params=("q", "kv", "indices", "sm_scale", "d_v", "attn_sink", "topk_length"),
        requires="flash_mla",
        required=True,
        note="DeepSeek-V3.2 sparse prefill of the flashmla_sparse impl (bf16 576-wide KV; also its decode)",
    ),
    HookSpec(
        name="indexer_sm120_torch",
        target="sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120",
        op="sparsemla.kernels.indexer.api:indexer_logits",
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=_INDEXER_PARAMS,
        note="indexer logits fallback on SM120 (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1); O(max context) in sglang",
    ),
    HookSpec(
        name="indexer_torch",
        target="sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch",
        op="sparsemla.kernels.indexer.api:indexer_logits",
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=_INDEXER_PARAMS,
        note="indexer logits torch path on non-SM120 GPUs (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1), O(page-table width)",
    ),
    HookSpec(
        name="indexer_topk_torch",
        target="sglang.srt.layers.attention.dsv4.indexer.topk_transform_pytorch_vectorized",
        op=_TOPK_OP,
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=_TOPK_PARAMS,
        note="top-k + page transform of the torch top-k backend: torch.topk over the whole width -> real lengths",
    ),
    HookSpec(
        name="indexer_topk_paged",
        target="sglang.srt.layers.attention.dsv4.indexer.topk_transform_paged",
        op=_TOPK_OP,
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=_TOPK_PARAMS,
        note="sglang's default top-k (--dsa-topk-backend sgl-kernel, v1): its JIT CUDA kernel -> our Triton top-k",
    ),
    HookSpec(
        name="indexer_topk_paged_v2",
        target="sglang.srt.layers.attention.dsv4.indexer.topk_transform_paged_v2",
        op="sparsemla.kernels.indexer.sglang_compat:topk_transform_paged_v2",
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=("scores", "seq_lens", "page_tables", "out_page_indices", "page_size", "metadata", "out_raw_indices"),
        note="sglang's default top-k with SGLANG_OPT_USE_TOPK_V2 (its v2 JIT kernel); the routing plan is not needed",
    ),
    HookSpec(
        name="indexer_topk_plan_v2",
        target="sglang.kernels.ops.attention.dsv4.plan_topk_v2",
        op="sparsemla.kernels.indexer.sglang_compat:plan_topk_v2",
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=("seq_lens", "static_threshold", "out"),
        note="the v2 plan, built by a JIT kernel in sglang; ours is a zeroed buffer (imported at call time)",
    ),
    HookSpec(
        name="indexer_topk_flashinfer",
        target="sglang.srt.layers.attention.dsv4.indexer.topk_transform_flashinfer_unfused",
        op=_TOPK_OP,
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=_TOPK_PARAMS,
        note="--dsa-topk-backend flashinfer, unfused (flashinfer.top_k, then the page transform in torch)",
    ),
    HookSpec(
        name="indexer_topk_flashinfer_fused",
        target="sglang.srt.layers.attention.dsv4.indexer.topk_transform_flashinfer_fused",
        op=_TOPK_OP,
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=_TOPK_PARAMS,
        note="--dsa-topk-backend flashinfer, fused (flashinfer.top_k_page_table_transform)",
    ),
    HookSpec(
        name="indexer_deepgemm",
        target="deep_gemm.fp8_paged_mqa_logits",
        op="sparsemla.kernels.indexer.api:indexer_logits",
        flag=flags.SPARSEMLA_TRITON_INDEXER,
        call="positional",
        params=(),  # a compiled function: no Python signature to check
        requires="deep_gemm",
        note="indexer logits through DeepGEMM (imported at call time by dsv4/indexer.py)",
    ),
    HookSpec(
        name="decode_real_heads",
        target="sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend._forward_attention",
        op="sparsemla.plugin.real_heads:track_real_heads",
        flag=flags.SPARSEMLA_MMA_DECODE,
        call="timer",
        params=("self", "q", "k", "v", "layer"),
        note="records layer.tp_q_head_num so the decode op skips the heads sglang pads q to (TP > 1)",
    ),
    HookSpec(
        name="step_metrics",
        target="sglang.srt.model_executor.model_runner.ModelRunner.forward",
        op="sparsemla.plugin.step_metrics:time_forward_step",
        flag=flags.SPARSEMLA_STEP_METRICS,
        call="timer",
        params=("self", "forward_batch"),
        note="one model forward per scheduler step; CUDA events read lazily",
    ),
)


def _resolve(path: str) -> Callable[..., Any]:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def kernel_enabled(spec: HookSpec) -> bool:
    """True when ``spec``'s flag asks for our op (and the master switch does not forbid it)."""
    return spec.flag.get() and not flags.SPARSEMLA_DISABLE.get()


def _flatten_kwargs(signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict:
    if signature is None:
        return dict(kwargs)
    bound = signature.bind(*args, **kwargs)
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        param = signature.parameters[name]
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif param.kind is not inspect.Parameter.VAR_POSITIONAL:
            out[name] = value
    return out


class _SelfCheck:
    """Runs each enabled kernel against its reference once per process, on the device of the first eager call."""

    def __init__(self) -> None:
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def maybe_run(self, spec: HookSpec, device: Any) -> None:
        if spec.op in self._done or not flags.SPARSEMLA_SELF_CHECK.get():
            return
        import torch

        if getattr(device, "type", "cpu") != "cuda" or torch.cuda.is_current_stream_capturing():
            return  # CPU calls are the reference's job; under graph capture a check cannot synchronise
        with self._lock:
            if spec.op in self._done:  # several hooks share an op: its check runs once
                return
            from sparsemla.plugin.selfcheck import run_self_check

            run_self_check(spec.op, device)
            self._done.add(spec.op)


_self_check = _SelfCheck()


def make_around(spec: HookSpec) -> Callable[..., Any]:
    """The AROUND hook for ``spec``: original when the flag is off, our op when it is on (errors propagate).

    A ``timer`` op is itself an AROUND hook that honours its flag, so it is registered as it is."""
    if spec.call == "timer":
        return _resolve(spec.op)
    # Resolved on first use (importing the kernels pulls Triton), then reused: the hook sits on the decode path.
    cache: dict[str, Any] = {}

    def op() -> Callable[..., Any]:
        if "op" not in cache:
            cache["op"] = _resolve(spec.op)
        return cache["op"]

    def signature_of(original: Callable[..., Any]) -> inspect.Signature | None:
        if "signature" not in cache:
            try:
                cache["signature"] = inspect.signature(original)
            except (TypeError, ValueError):  # compiled functions
                cache["signature"] = None
        return cache["signature"]

    def accepts(call_kwargs: dict[str, Any]) -> bool:
        if spec.when is None:
            return True
        if "when" not in cache:
            cache["when"] = _resolve(spec.when)
        return bool(cache["when"](call_kwargs))

    def around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not kernel_enabled(spec):
            return original(*args, **kwargs)
        if spec.call == "kwargs":
            call_kwargs = _flatten_kwargs(signature_of(original), args, kwargs)
            if not accepts(call_kwargs):
                return original(*args, **kwargs)
            _self_check.maybe_run(spec, getattr(call_kwargs.get("q"), "device", None))
            real = real_heads.current()
            if real is not None and "q" in call_kwargs and real < call_kwargs["q"].shape[2]:
                call_kwargs["num_real_heads"] = real  # sglang padded q to more heads than the layer has
            return op()(**call_kwargs)
        if args:
            _self_check.maybe_run(spec, getattr(args[0], "device", None))
        return op()(*args, **kwargs)

    return around


def _sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _target_available(spec: HookSpec) -> bool:
    if spec.requires is None:
        return True
    try:
        return importlib.util.find_spec(spec.requires) is not None
    except (ImportError, ValueError):
        return False


_OPS_OF_FLAG = {
    flags.SPARSEMLA_MMA_DECODE.name: "decode",
    flags.SPARSEMLA_TRITON_INDEXER.name: "indexer",
    flags.SPARSEMLA_DSA_V32.name: "dsa_v32",
}
# The flags whose hooks switch kernels (they obey SPARSEMLA_DISABLE): the variant's switches, plus SPARSEMLA_DSA_V32,
# which is not a variant switch (see sparsemla.variant.SWITCHES) but routes sglang's V3.2 calls to our kernels.
KERNEL_FLAGS: tuple[flags.Flag[bool], ...] = (*variant.SWITCHES, flags.SPARSEMLA_DSA_V32)


def _check_kernels_runnable() -> None:
    """Explicitly enabled kernels must be able to run here: Triton importable, and every visible GPU one that a
    configuration of each enabled kernel fits (sm_80+, enough shared memory per block). Raises SystemExit otherwise,
    so sglang stops at startup with the reason instead of failing at CUDA-graph capture."""
    wanted = sorted({s.flag.name for s in HOOKS if s.call != "timer" and kernel_enabled(s)})
    if not wanted or flags.SPARSEMLA_FORCE_REFERENCE.get():
        return
    if importlib.util.find_spec("triton") is None:
        raise SystemExit(f"sparsemla: {', '.join(wanted)} set but Triton is not installed")
    import torch

    if not torch.cuda.is_available():
        return  # CPU-only process (the tokenizer/detokenizer of a GPU server see the GPUs; tests do not)
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.support import check_device

    ops = tuple(_OPS_OF_FLAG[name] for name in wanted if name in _OPS_OF_FLAG)
    for index in range(torch.cuda.device_count()):
        try:
            check_device(dev.device_info(index), ops)
        except (dev.UnsupportedDevice, flags.FlagError) as exc:
            raise SystemExit(f"sparsemla: GPU {index}: {exc}") from None


def hook_wanted(spec: HookSpec) -> bool:
    """True when ``spec``'s flag asks its hook to act: the kernel switches obey ``SPARSEMLA_DISABLE``
    (:func:`kernel_enabled`), the step-metrics switch does not (its hook only observes)."""
    if any(spec.flag is switch for switch in KERNEL_FLAGS):
        return kernel_enabled(spec)
    return bool(spec.flag.get())


def _wanted_flags() -> list[str]:
    """The names of the flags that are on and need hooks (empty: sglang runs its own code whatever we do)."""
    return sorted({s.flag.name for s in HOOKS if hook_wanted(s)})


def publish_flags_metric(applied: frozenset[str] = frozenset()) -> None:
    """Export ``sparsemla_kernel_flags_info{<flag>=..., version, variant} 1`` on sglang's /metrics; the variant names
    only the kernel switches in ``applied`` (whose hooks sglang applied), never merely the flags that are set.

    sglang serves /metrics from every process through prometheus_client's multiprocess collector; a gauge created in a
    process where PROMETHEUS_MULTIPROC_DIR is set lands in that directory (mode ``max``: one series, value 1). Metrics
    are informative: a failure to publish is logged, never fatal."""
    try:
        variant.publish(multiprocess_mode="max" if flags.PROMETHEUS_MULTIPROC_DIR.get() else None, applied=applied)
    except Exception:
        log.exception("sparsemla: could not publish %s", KERNEL_FLAGS_INFO)


# -- what sglang actually applied --------------------------------------------------------------------------------------
# HookRegistry.register() only records a hook; sglang's load_plugins() applies them all in HookRegistry.apply_hooks(),
# after every plugin's register() returned (it imports each target's module, wraps the attribute and adds the target
# to HookRegistry._patched; a target that fails is logged as "Failed to apply hooks to <target>" and skipped). So
# register() cannot know what was applied. load_plugins() calls HookRegistry.apply_hooks() outside any try, looked up
# on the class at call time: register() replaces it by a one-shot wrapper that restores sglang's own method, runs
# it, then checks every hook of ours on the patched attribute. A SystemExit raised there leaves load_plugins() and
# stops the process at startup (an exception from register() itself is caught by load_plugins() as ``Exception``
# and logged; SystemExit is not an Exception, so it is not swallowed there either).
_applied: dict[str, bool] = {}


def applied_hooks() -> dict[str, bool]:
    """Hook name -> whether sglang applied it, for the hooks registered in this process (empty before apply)."""
    return dict(_applied)


def _holds_hook(fn: Any, hook: Callable[..., Any]) -> bool:
    """Whether ``hook`` is in the wrapper chain of ``fn`` (sglang's wrappers keep ``hook`` in their closure and the
    wrapped function in ``__wrapped__``)."""
    for _ in range(64):  # a bounded walk: a chain of more wrappers than that is not sglang's
        if fn is None:
            return False
        cells = getattr(fn, "__closure__", None) or ()
        if any(_cell_value(cell) is hook for cell in cells):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _is_applied(target: str, hook: Callable[..., Any], patched: set[str]) -> bool:
    if target not in patched:
        return False
    import pkgutil

    owner, _, attr = target.rpartition(".")
    try:
        current = getattr(pkgutil.resolve_name(owner), attr)
    except (ImportError, AttributeError, ValueError):
        return False
    return _holds_hook(current, hook)


def _applied_switches(installed: list[tuple[HookSpec, Callable[..., Any]]]) -> frozenset[str]:
    """The kernel switches with at least one hook registered here and every registered one applied."""
    out = set()
    for switch in variant.SWITCHES:
        mine = [spec.name for spec, _ in installed if spec.flag is switch]
        if mine and all(_applied.get(name) for name in mine):
            out.add(variant.part_name(switch))
    return frozenset(out)


def _verify_applied(installed: list[tuple[HookSpec, Callable[..., Any]]], patched: set[str], version: str) -> None:
    """After sglang's apply step: stop when a wanted hook is missing, else publish and log what was applied."""
    for spec, hook in installed:
        _applied[spec.name] = _is_applied(spec.target, hook, patched)
    missing = [spec for spec, _ in installed if not _applied[spec.name]]
    fatal = [spec for spec in missing if hook_wanted(spec)]
    if fatal:
        names = sorted({spec.flag.name for spec in fatal})
        targets = ", ".join(spec.target for spec in fatal)
        raise SystemExit(
            f"sparsemla: {', '.join(names)} set but sglang did not apply the hook(s) on {targets} (see sglang's "
            "'Failed to apply hooks to ...' above); refusing to serve with sglang's own code in place of the "
            "requested kernels. Unset the flag or fix the sglang installation."
        )
    if missing:
        log.warning("sparsemla: hooks not applied by sglang (their flags are off): %s", _names(missing))
    applied = _applied_switches(installed)
    publish_flags_metric(applied)
    active = ", ".join(f"{k}={v}" for k, v in variant.flag_labels().items())
    log.info(
        "sparsemla %s plugin loaded on sglang %s: variant=%s; %s; %d of %d hooks applied%s",
        __version__, version, variant.current(applied), active, len(installed) - len(missing), len(installed),
        f" (not applied: {_names(missing)})" if missing else "",
    )  # fmt: skip


def _names(specs: list[HookSpec]) -> str:
    return ", ".join(f"{spec.name} ({spec.target})" for spec in specs)


def _verify_after_sglang_applies(installed: list[tuple[HookSpec, Callable[..., Any]]], version: str) -> None:
    """Arm :func:`_verify_applied` to run right after sglang's next ``HookRegistry.apply_hooks()`` (see above)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    sglang_apply = HookRegistry.__dict__["apply_hooks"]  # the classmethod object, restored as it was

    def apply_hooks_then_verify(cls: type) -> None:
        setattr(HookRegistry, "apply_hooks", sglang_apply)  # noqa: B010 -- one shot: sglang's own method again
        sglang_apply.__func__(cls)
        _verify_applied(installed, HookRegistry._patched, version)

    setattr(HookRegistry, "apply_hooks", classmethod(apply_hooks_then_verify))  # noqa: B010


# -- the entry point ---------------------------------------------------------------------------------------------------
_registered: list[str] = []


def register() -> list[str]:
    """Entry point called by sglang's ``load_plugins()`` in every process. Returns the registered targets.

    Registers the AROUND hooks of :data:`HOOKS` for this sglang version; once sglang applied them, checks what it
    applied, publishes the flag-info metric and logs the active kernel set (see :func:`_verify_applied`). A flag that
    is on and cannot be honoured (bad value, untested sglang, kernel that cannot run here, op without a self-check,
    hook that sglang did not apply, any error in here) stops the process with SystemExit, which ``load_plugins()``
    does not catch. With every flag off an error in here propagates as it is (sglang logs it; nothing was asked of
    us) and the metric says ``baseline``. Idempotent within a process."""
    if _registered:
        return list(_registered)
    try:
        flags.validate_all()
    except flags.FlagError as exc:
        raise SystemExit(f"sparsemla: {exc}") from None
    try:
        return _register()
    except SystemExit:
        raise
    except Exception as exc:
        wanted = _wanted_flags()
        if not wanted:
            publish_flags_metric()
            raise
        # load_plugins() would catch and log this and serve with the flags on and no hooks: stop instead.
        log.exception("sparsemla: plugin registration failed")
        raise SystemExit(
            f"sparsemla: plugin registration failed with {', '.join(wanted)} set: {type(exc).__name__}: {exc}"
        ) from exc


def _register() -> list[str]:
    version = _sglang_version()
    specs = [s for s in HOOKS if version in s.versions]
    wanted = _wanted_flags()
    if version is None or not specs:
        if wanted:
            raise SystemExit(
                f"sparsemla {__version__}: sglang {version} is not a tested version {SGLANG_VERSIONS}; refusing to "
                f"start with {', '.join(wanted)} set (no hooks exist for it). Unset them or install a tested sglang."
            )
        log.warning(
            "sparsemla %s: sglang %s is not a tested version %s; no hooks", __version__, version, SGLANG_VERSIONS
        )
        publish_flags_metric()
        return []
    _check_kernels_runnable()
    _check_self_checks(specs)

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    installed: list[tuple[HookSpec, Callable[..., Any]]] = []
    for spec in specs:
        if not _target_available(spec):
            log.debug("sparsemla: skip %s (%s not installed)", spec.target, spec.requires)
            continue
        hook = make_around(spec)
        HookRegistry.register(spec.target, hook, HookType.AROUND)
        installed.append((spec, hook))
    missing = [s for s in specs if s.required and hook_wanted(s) and all(s is not i for i, _ in installed)]
    if missing:
        raise SystemExit(
            "sparsemla: "
            + "; ".join(f"{s.flag.name} needs {s.target}, but {s.requires} is not importable" for s in missing)
            + ". Install sglang's pinned dependencies (sgl-flash-mla) or unset the flag."
        )
    unhooked = sorted(set(wanted) - {spec.flag.name for spec, _ in installed})
    if unhooked:
        raise SystemExit(f"sparsemla: {', '.join(unhooked)} set but no hook for it exists on sglang {version} here")
    _verify_after_sglang_applies(installed, version or "")
    _registered.extend(spec.target for spec, _ in installed)
    return list(_registered)


def _check_self_checks(specs: list[HookSpec]) -> None:
    """Every enabled kernel op has a self-check (it runs at the op's first eager CUDA call, mid-serving)."""
    if not flags.SPARSEMLA_SELF_CHECK.get():
        return
    ops = sorted({s.op for s in specs if s.call != "timer" and hook_wanted(s)})
    if not ops:
        return
    from sparsemla.plugin import selfcheck

    unchecked = [op for op in ops if not selfcheck.has_check(op)]
    if unchecked:
        raise SystemExit(
            f"sparsemla: no startup self-check for {', '.join(unchecked)} (SPARSEMLA_SELF_CHECK=1); refusing to "
            "serve an unchecked kernel. This is a sparsemla bug: every op of the hook table needs a check."
        )
