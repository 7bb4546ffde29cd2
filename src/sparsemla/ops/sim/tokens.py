"""Deterministic pseudo-tokenizer and pseudo-text of the simulator.

Tokenization: every word (``\\w+``) and every other non-space character is one token, so counts are exact and easy to
predict (``"Hello, world!"`` is 4 tokens). Chat requests are rendered with a tiny template: one role token per
message, the content tokens, and one assistant token at the end (``len(messages) + 1`` extra tokens).
Token ids come from a CRC32 of the piece. Output: token ``i`` of a request is a word picked by a hash of the prompt ids
and ``i``; each output token decodes to ``" " + word``. Without ``ignore_eos`` a request ends at its "natural" length,
64 .. 1023 tokens, also a hash of the prompt.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Sequence

VOCAB_SIZE = 129280  # DeepSeek-V4's vocabulary size
EOS_ID = 1
_SPECIAL = 16  # ids below this are special tokens
_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an which but not have has had can all "
    "their more one will when there been were also would so about into than its only other may some time these two "
    "kernel cache tensor decode attention sparse index batch token layer head page memory latency throughput step "
    "model server request stream metric trace flag value shape block warp thread core graph queue prefill"
).split()
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


_PIECES = tuple(f" {w}" for w in _WORDS)


def piece(token_id: int) -> str:
    """Decoded text of an output token id (EOS and special ids decode to "")."""
    k = token_id - _SPECIAL
    return _PIECES[k] if 0 <= k < len(_PIECES) else ""


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (one per word or punctuation character)."""
    return [_SPECIAL + zlib.crc32(p.encode()) % (VOCAB_SIZE - _SPECIAL) for p in _TOKEN_RE.findall(text)]


def encode_chat(messages: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of a chat: per message one role token + content tokens, then one assistant token."""
    role_ids = {"system": 3, "user": 4, "assistant": 5, "tool": 6, "developer": 7}
    ids: list[int] = []
    for role, content in messages:
        ids.append(role_ids.get(role, 8))
        ids.extend(encode(content))
    ids.append(role_ids["assistant"])
    return ids


def _digest(prompt_ids: Sequence[int], salt: bytes) -> bytes:
    h = hashlib.blake2b(salt, digest_size=16)
    h.update(len(prompt_ids).to_bytes(4, "little"))
    for tid in prompt_ids[:64]:
        h.update(tid.to_bytes(4, "little"))
    return h.digest()


def output_seed(prompt_ids: Sequence[int]) -> int:
    """The per-prompt seed of :func:`output_token_at` (hash it once per request, not once per token)."""
    return int.from_bytes(_digest(prompt_ids, b"out")[:8], "little")


def output_token_at(seed: int, index: int) -> int:
    """The ``index``-th output token id for a prompt whose :func:`output_seed` is ``seed`` (never EOS)."""
    mixed = (seed ^ (index * 0x9E3779B97F4A7C15)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    return _SPECIAL + (mixed >> 29) % len(_WORDS)


def output_token(prompt_ids: Sequence[int], index: int) -> int:
    """The ``index``-th output token id for this prompt (never EOS)."""
    return output_token_at(output_seed(prompt_ids), index)


def natural_length(prompt_ids: Sequence[int]) -> int:
    """How many tokens (EOS included) this prompt generates when EOS is not ignored: 64 .. 1023."""
    return 64 + int.from_bytes(_digest(prompt_ids, b"eos")[:4], "little") % 960
