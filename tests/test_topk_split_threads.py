"""The split top-k's participants on the CPU. Triton's interpreter runs a launch's programs one after another, so a
participant waiting at its row's barrier would wait forever and the interpreter always takes one program per row.
Here every program of a launch runs in its own thread (the interpreter's program index made thread-local, its atomics
serialised), so the barriers, the merged histograms, the count exchange, the filter's merged group maxima and the
workspace zeroing of split rows run for real: exact sets against the reference at several digit widths, in register
and streaming spans, stopping after every radix pass, through the filter and its fallback; the workspace is back at
zero after every launch (the next launch, or a CUDA-graph replay, relies on it)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import threading
import time

import pytest
import torch

from sparsemla.kernels.indexer import topk
from sparsemla.kernels.indexer.reference import indexer_topk_reference

pytestmark = pytest.mark.slow


DEADLINE_S = 240  # one launch; a participant still spinning then waits for one that failed or never arrives
_ABORT = threading.Event()  # set when a program fails or the deadline passes: every other program's next atomic raises


def _threaded_call(self, *args_dev, **kwargs):  # noqa: ANN001, ANN202 - GridExecutor.__call__'s own signature
    """GridExecutor.__call__ with one thread per program (same steps otherwise: arguments to the host, the language
    patched to its interpreted form, the programs, the arguments back). A failing program aborts the others (they
    would wait at its row's barrier forever) and its error is raised here."""
    import triton.runtime.interpreter as interp

    names = inspect.getfullargspec(self.fn).args
    kwargs = {k: v for k, v in kwargs.items() if k in names}
    args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
    scope = interp._patch_lang(self.fn)
    try:
        args = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
        args = {n: a if n in self.constexprs else interp._implicit_cvt(a) for n, a in args.items()}
        grid = self.grid(args) if callable(self.grid) else self.grid
        grid = tuple(grid) + (1,) * (3 - len(grid))
        assert grid[1] == grid[2] == 1, "one grid axis (the top-k kernel's)"
        interp.interpreter_builder.set_grid_dim(*grid)
        errors: list[BaseException] = []
        _ABORT.clear()

        def program(x: int) -> None:
            try:
                interp.interpreter_builder.set_grid_idx(x, 0, 0)  # this thread's index (thread-local, see fixture)
                self.fn(**args)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the launching thread
                errors.append(exc)
                _ABORT.set()

        threads = [threading.Thread(target=program, args=(x,), daemon=True) for x in range(grid[0])]
        for t in threads:
            t.start()
        deadline = time.monotonic() + DEADLINE_S
        for t in threads:
            t.join(timeout=max(deadline - time.monotonic(), 0))
        stuck = sum(t.is_alive() for t in threads)
        if stuck:
            _ABORT.set()
            for t in threads:
                t.join(timeout=30)
        real = [e for e in errors if not _aborted(e)]
        if real:
            raise real[0]
        if stuck:
            raise TimeoutError(f"{stuck} programs still waiting after {DEADLINE_S} s (a barrier never filled)")
    finally:
        scope.restore()
    self._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)


class _Aborted(RuntimeError):
    pass


def _aborted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is an abort (the interpreter wraps it once per device-function level)."""
    while exc is not None:
        if isinstance(exc, _Aborted):
            return True
        exc = exc.__cause__
    return False


@pytest.fixture(scope="module")
def threaded():
    """``topk`` reloaded for the interpreter, whose launches run one thread per program; split counts allowed."""
    import triton.runtime.interpreter as interp

    from sparsemla.kernels import device as dev

    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    local = threading.local()
    mp.setattr(interp.InterpreterBuilder, "grid_idx",
               property(lambda self: getattr(local, "idx", None), lambda self, v: setattr(local, "idx", v)),
               raising=False)  # fmt: skip
    lock = threading.RLock()
    for name in ("create_atomic_rmw", "create_atomic_cas"):  # read-modify-write as one step, as on the GPU

        def locked(self, *a, _orig=getattr(interp.InterpreterBuilder, name)):  # noqa: ANN001, ANN202
            if _ABORT.is_set():
                raise _Aborted("another program of this launch failed or the launch ran out of time")
            with lock:
                return _orig(self, *a)

        mp.setattr(interp.InterpreterBuilder, name, locked)
    mp.setattr(interp.GridExecutor, "__call__", _threaded_call)
    module = importlib.reload(topk)
    # Rewrite every device function for the interpreter now, in this thread: the first call of one rewrites its
    # source and adds names to the module's globals, which other threads iterate at every device call.
    for value in list(vars(module).values()):
        if isinstance(value, interp.InterpretedFunction):
            value.rewrite()
    # the launcher refuses splits under the interpreter (programs one at a time); these programs run at once
    threads_info = dataclasses.replace(dev.INTERPRETER, name="interpreter, one thread per program")
    mp.setattr(module.dev, "launch_info", lambda device: threads_info)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(5e-4)  # spinning participants hand the interpreter lock over often
    yield module
    sys.setswitchinterval(switch)
    mp.undo()
    importlib.reload(topk)


def _check(tk, logits: torch.Tensor, lens: torch.Tensor, k: int, **kw) -> None:
    out = torch.full((logits.shape[0], k), -7, dtype=torch.int32)
    tk.indexer_topk_fwd(logits, lens, k, out=out, **kw)
    ref = indexer_topk_reference(logits, lens, k)
    if not kw.get("sorted", True):  # by ascending position, -1 padding last
        ref = torch.where(ref < 0, 1 << 30, ref).sort(dim=1).values
        ref = torch.where(ref == 1 << 30, -1, ref)
    assert torch.equal(out, ref)
    ws = tk._SPLIT_WS.bufs[torch.device("cpu")]
    assert int((ws != 0).sum()) == 0, "ticket, counters, histograms, counts or group maxima left non-zero"


def _rows(n: int, seed: int) -> torch.Tensor:
    """Random, half-step ties, all equal (a few larger), tiny, all negative, small integers."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.stack([
        torch.randn(n, generator=g), torch.round(torch.randn(n, generator=g) * 2) / 2, torch.full((n,), 0.75),
        torch.randn(n, generator=g) * 1e-30, -torch.rand(n, generator=g),
        torch.randint(-3, 3, (n,), generator=g).float(),
    ])  # fmt: skip
    rows[2, n - 40 : n - 37] = 2.0
    return rows


@pytest.mark.parametrize("bits", [5, 8], ids=lambda b: f"{b}bit")
@pytest.mark.parametrize("spans", ["registers", "streaming"])
def test_split_rows_are_exact_and_leave_the_workspace_at_zero(threaded, spans, bits):
    """Four participants per row (1024-key spans; lengths giving 3 or 4 of them, an idle one too); by position from
    register spans, by value from streaming ones (the sort of the last participant)."""
    n, k = 3500, 512
    lens = torch.tensor([n, n - 333, 2500, 3073], dtype=torch.int32)
    kw = dict(splits=4, span=1024, split_row=0, filter_tiles=(0, 0), sorted=spans == "streaming")
    kw.update(dict(reg_span=2048, reg_bits=bits) if spans == "registers" else dict(reg_span=0, stream_bits=bits))
    _check(threaded, _rows(n, bits)[[0, 1, 2, 5]], lens, k, **kw)


def test_split_streaming_spans_load_a_piece_ahead(threaded):
    """Streaming participants with ``prefetch`` (each piece's loads issued a step ahead, in the merged radix passes
    and the winners' pass): 1024-key spans in 256-key pieces, spans cut short by the row's end, one idle."""
    n, k = 3500, 512
    lens = torch.tensor([n, n - 333, 2500, 3073], dtype=torch.int32)
    _check(threaded, _rows(n, 41)[[0, 1, 3, 5]], lens, k, splits=4, span=1024, split_row=0, filter_tiles=(0, 0),
           reg_span=0, block=256, prefetch=True, sorted=False)  # fmt: skip


def test_split_rows_with_wide_digits(threaded):
    """11-bit digits (2048-bin merged histograms, three passes at most) at k = 512 and 2048, both span kinds."""
    n = 4500
    logits, lens = _rows(n, 7)[:2], torch.tensor([n, 4097], dtype=torch.int32)
    for k, spans in ((512, dict(reg_span=2048, reg_bits=11)), (2048, dict(reg_span=0, stream_bits=11))):
        _check(threaded, logits, lens, k, splits=4, span=1024 if k == 512 else 2048, split_row=0,
               filter_tiles=(0, 0), sorted=False, **spans)  # fmt: skip


def _edge_row(n: int, k: int, bits: int, passes: int, extra: int, seed: int) -> torch.Tensor:
    """A row whose merged radix search ends after pass ``passes`` (``bits``-wide digits): k - 12 outright winners and
    12 + ``extra`` keys in the threshold bin, scattered over every participant's span; the losers differ from the
    threshold bin only in the deciding digit's lowest bit. ``extra > 0``: ties at the threshold (smaller positions
    win) and the search runs on to the last pass."""
    take = 12
    top = 32 - bits * (passes - 1)
    shift = max(top - bits, 0)
    width = top - shift
    one = 0x3F800000  # 1.0: positive floats, the order key is the bit pattern
    common = (one >> top << top) if top < 32 else 0
    if passes == 1:
        win_d = (one >> shift) & ((1 << width) - 1)
        lose = (win_d - 2) & ~1
    else:
        win_d, lose = (1 << width) - 1, 0
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    raw = torch.full((n,), common | (lose << shift), dtype=torch.int64)
    raw[perm[: k - take]] = common | (win_d << shift)
    raw[perm[k - take : k + extra]] = common | ((lose + 1) << shift)
    raw |= 0x15 & ((1 << shift) - 1)
    return raw.to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("bits", [8], ids=lambda b: f"{b}bit")
def test_split_rows_stop_after_every_pass(threaded, bits):
    """The merged search stops after each of its passes on every participant at once (the barrier phases of the
    last arrival count them), in register and streaming spans."""
    n, k = 3000, 512
    rows = [_edge_row(n, k, bits, p, extra, 10 * p + extra) for p in range(1, -(-32 // bits) + 1) for extra in (0, 5)]
    logits = torch.stack(rows)
    lens = torch.full((len(rows),), n, dtype=torch.int32)
    for spans in (dict(reg_span=1024, reg_bits=bits), dict(reg_span=0, stream_bits=bits)):
        _check(threaded, logits, lens, k, splits=4, span=1024, split_row=0, filter_tiles=(0, 0), sorted=False,
               **spans)  # fmt: skip


def test_split_rows_through_the_filter_and_its_fallback(threaded):
    """The two-pass filter of split rows (group maxima merged by atomic max, two barriers, candidates copied to
    position order); the all-equal row overflows the candidate tile and takes the radix passes after them."""
    n = 4500
    lens = torch.tensor([n, 4000, n, 3000], dtype=torch.int32)
    _check(threaded, _rows(n, 3)[[0, 1, 2, 5]], lens, 512, splits=4, span=1024, split_row=0,
           filter_tiles=(1024, 1024), reg_span=0, sorted=True)  # fmt: skip
