"""Exploratory helpers shared by the loop-anatomy scripts (CPU only): the SASS of one tile iteration."""

import re


def loop_body(raw_sass: str) -> list[str]:
    """Opcodes of the largest backward-branch loop in ``cuobjdump -sass`` output (addresses kept)."""
    ins = []
    for line in raw_sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    best: list[str] = []
    for addr, text in ins:
        b = re.search(r"\bBRA(?:\.U)?\s+(?:!?U?P\w+,\s*)?0x([0-9a-f]+)", text)
        if b and b.group(1) and int(b.group(1), 16) < addr:
            start = int(b.group(1), 16)
            body = [t for a, t in ins if start <= a <= addr]
            if len(body) > len(best):
                best = body
    return [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in best]
