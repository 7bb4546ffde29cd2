"""``python -m sparsemla.tether <parent pid> -- <command> [args...]``: run a command that dies with its parent.

The stack's services normally outlive the command that started them (`sparsemla up` returns, `down` stops them).
The demo's must not: a SIGKILL of the demo (which no handler can catch) would leave the simulator and Prometheus
running. The demo starts them through this launcher, which arms ``PR_SET_PDEATHSIG`` (SIGTERM, so they shut down
cleanly) for ``<parent pid>`` and then execs the command: same PID, same start time, so the PID file still
identifies it; the setting survives the exec (it is cleared only for set-user-ID programs).
"""

from __future__ import annotations

import os
import signal
import sys

from sparsemla import procs

USAGE = "usage: python -m sparsemla.tether <parent pid> -- <command> [args...]"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    procs.die_with_parent(int(args[0]), signal.SIGTERM)  # exits at once if that parent is already gone
    os.execvp(args[2], args[2:])


if __name__ == "__main__":
    main()
