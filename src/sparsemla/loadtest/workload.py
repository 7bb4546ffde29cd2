"""Seeded request workloads for the LLM Locust user: what each request asks for (prompt, output length).

A workload is named by a spec string (the Makefile's ``WORKLOAD=``):

- ``random:IN:OUT[:R]`` — prompts of IN tokens and outputs of OUT tokens. With a range ratio R in [0, 1], lengths are
  drawn uniformly from ``[R*IN, IN]`` and ``[R*OUT, OUT]`` (sglang bench_serving's ``--random-range-ratio``); R
  defaults to 1 (fixed lengths, the most comparable A/B setting).
- ``sharegpt:PATH[:OUT]`` (or a bare ``PATH.json``) — ShareGPT-format conversations (``[{"conversations": [{"from":
  "human", "value": ...}, {"from": "gpt", "value": ...}]}]``): the first human turn is the prompt, the output length is
  the reference answer's length in words unless OUT caps it.
- ``shared-prefix:GROUPS:PREFIX:Q:OUT`` — GROUPS system prompts of PREFIX tokens each; every request takes one group
  (uniformly) and adds a fresh question of Q tokens, exercising the server's prefix (radix) cache.

Token counts are approximate for real tokenizers: prompts are built from short common English words, one word being
close to one token for DeepSeek's and most BPE vocabularies; the simulator counts exactly this way. Output lengths are
exact when ``ignore_eos`` is on (the default): the server must produce ``max_tokens`` tokens.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

# Short, common words (mostly single BPE tokens); a prompt of N words is ~N tokens.
_WORDS = (
    "the of and to in is was for on are as with his they at be this from have or by one had not but what all were "
    "when we there can an your which their said if do will each about how up out them then she many some so these "
    "would other into has more her two like him see time could no make than first been its who now people my made "
    "over did down only way find use may water long little very after words called just where most know get through "
    "back much go good new write our me man too any day same right look think also around another came come work "
    "three word must because does part even place well such here take why things help put years different away again "
    "off went old number great tell men say small every found still between name should home big give air line set "
    "own under read last never us left end along while might next sound below saw something thought both few those"
).split()

DEFAULT_WORKLOAD = "random:512:256"
"""The one default workload: `sparsemla loadtest | sweep | ab`, `make loadtest | sweep | ab` (the Makefile passes
``--workload`` only when ``WORKLOAD=`` is given), the locustfile and compose's Locust (tests/test_loadtest_options.py
checks compose.yaml's literal). A serving-sized request: 512 prompt tokens, 256 output tokens."""

DEMO_WORKLOAD = "random:64:12"
"""`sparsemla demo`'s workload, deliberately not :data:`DEFAULT_WORKLOAD`: short prompts (64 tokens) and 12 output
tokens (``ignore_eos``). Short enough that in a 12 s point users finish requests and send new ones at every point but
the slowest (flags off at C=64, 2.2 s per decode step: a request takes ~27 s), so TTFT and goodput have values there
(the report says in words why the slowest point has none); long enough that prefill stays a small share of each
request's time, so the measured A/B tok/s ratio tracks the simulator's calibrated decode-step ratio that the demo
checks it against (``sparsemla.ops.demo.calibrated_ratios``)."""


class WorkloadError(ValueError):
    """The workload spec cannot be used (bad syntax, missing file, empty dataset); the message says why."""


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: the prompt text, its approximate token count and the number of tokens to generate."""

    prompt: str
    prompt_tokens: int
    max_tokens: int


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _parse_int(text: str, what: str, spec: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise WorkloadError(f"{what} in workload {spec!r} must be an integer, got {text!r}") from None
    if value < minimum:
        raise WorkloadError(f"{what} in workload {spec!r} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class RandomWorkload:
    """Uniform random lengths in ``[ratio*input_len, input_len]`` and ``[ratio*output_len, output_len]``."""

    input_len: int
    output_len: int
    range_ratio: float = 1.0

    def _length(self, rng: random.Random, full: int) -> int:
        low = max(1, round(full * self.range_ratio))
        return rng.randint(low, full)

    def sample(self, rng: random.Random) -> RequestSpec:
        n_in = self._length(rng, self.input_len)
        return RequestSpec(_words(rng, n_in), n_in, self._length(rng, self.output_len))


@dataclass(frozen=True)
class SharedPrefixWorkload:
    """``groups`` fixed system prompts of ``prefix_len`` words; each request = one prefix + a fresh question."""

    groups: int
    prefix_len: int
    question_len: int
    output_len: int
    seed: int = 0

    def prefixes(self) -> list[str]:
        rng = random.Random(f"shared-prefix:{self.seed}")
        return [_words(rng, self.prefix_len) for _ in range(self.groups)]

    def sample(self, rng: random.Random) -> RequestSpec:
        prefix = self.prefixes()[rng.randrange(self.groups)] if self.groups else ""
        prompt = f"{prefix}\n{_words(rng, self.question_len)}"
        return RequestSpec(prompt, self.prefix_len + self.question_len, self.output_len)


@dataclass(frozen=True)
class ShareGPTWorkload:
    """Prompts and reference output lengths from a ShareGPT-format file (``output_cap`` caps the output length)."""

    items: tuple[tuple[str, int], ...]
    output_cap: int | None = None

    @classmethod
    def load(cls, path: Path, output_cap: int | None = None) -> ShareGPTWorkload:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise WorkloadError(f"ShareGPT file {path} does not exist") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise WorkloadError(f"ShareGPT file {path} is not readable JSON: {exc}") from None
        if not isinstance(data, list):
            raise WorkloadError(f"ShareGPT file {path} must hold a JSON list of conversations")
        items = []
        for conv in data:
            turns = conv.get("conversations") if isinstance(conv, dict) else None
            if not isinstance(turns, list) or len(turns) < 2:
                continue
            first, second = turns[0], turns[1]
            if not (isinstance(first, dict) and isinstance(second, dict)):
                continue
            prompt, answer = first.get("value"), second.get("value")
            if first.get("from") != "human" or not isinstance(prompt, str) or not isinstance(answer, str):
                continue
            if not prompt.strip() or not answer.strip():
                continue
            items.append((prompt, max(1, len(answer.split()))))
        if not items:
            raise WorkloadError(f"ShareGPT file {path} holds no usable human/gpt conversation pair")
        return cls(tuple(items), output_cap)

    def sample(self, rng: random.Random) -> RequestSpec:
        prompt, out = self.items[rng.randrange(len(self.items))]
        if self.output_cap is not None:
            out = min(out, self.output_cap)
        return RequestSpec(prompt, len(prompt.split()), out)


Workload = RandomWorkload | SharedPrefixWorkload | ShareGPTWorkload


def parse_workload(spec: str, seed: int = 0) -> Workload:
    """Build the workload named by ``spec`` (see the module docstring); raise WorkloadError on a bad spec."""
    spec = spec.strip()
    if not spec:
        raise WorkloadError(f"empty workload spec; try {DEFAULT_WORKLOAD}")
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    if kind == "random":
        if len(parts) not in (2, 3):
            raise WorkloadError(f"workload {spec!r}: expected random:IN:OUT[:RANGE_RATIO], e.g. {DEFAULT_WORKLOAD}")
        ratio = 1.0
        if len(parts) == 3:
            try:
                ratio = float(parts[2])
            except ValueError:
                raise WorkloadError(f"range ratio in workload {spec!r} must be a number in [0, 1]") from None
            if not 0.0 <= ratio <= 1.0:
                raise WorkloadError(f"range ratio in workload {spec!r} must be in [0, 1], got {ratio}")
        return RandomWorkload(_parse_int(parts[0], "IN", spec), _parse_int(parts[1], "OUT", spec), ratio)
    if kind == "shared-prefix":
        if len(parts) != 4:
            raise WorkloadError(f"workload {spec!r}: expected shared-prefix:GROUPS:PREFIX:Q:OUT, e.g. 8:1024:64:128")
        groups, prefix, question, out = (
            _parse_int(parts[0], "GROUPS", spec),
            _parse_int(parts[1], "PREFIX", spec, 0),
            _parse_int(parts[2], "Q", spec),
            _parse_int(parts[3], "OUT", spec),
        )
        return SharedPrefixWorkload(groups, prefix, question, out, seed)
    if kind == "sharegpt":
        if not parts or not parts[0]:
            raise WorkloadError(f"workload {spec!r}: expected sharegpt:PATH[:OUT]")
        path, cap = parts[0], None
        if len(parts) >= 2 and parts[-1].isdigit():
            path, cap = ":".join(parts[:-1]), _parse_int(parts[-1], "OUT", spec)
        elif len(parts) >= 2:
            path = ":".join(parts)
        return ShareGPTWorkload.load(Path(path), cap)
    if spec.endswith(".json"):
        return ShareGPTWorkload.load(Path(spec))
    raise WorkloadError(
        f"unknown workload {spec!r}; use random:IN:OUT[:R], sharegpt:PATH[:OUT] or shared-prefix:G:P:Q:O"
    )


def user_rng(seed: int, worker_index: int, user_index: int) -> random.Random:
    """The private, reproducible random stream of one simulated user (same seed -> same request sequence)."""
    return random.Random(f"{seed}:{worker_index}:{user_index}")
