"""The local supervisor process: ``python -m klsweep.submit supervise QUEUE.pkl`` (started by ``klsweep run``;
see ``klsweep.submit.local``)."""

import sys

from klsweep.submit.local import SUPERVISE, supervise

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == SUPERVISE:
        supervise(sys.argv[2])
    else:
        sys.exit(f"usage: python -m klsweep.submit {SUPERVISE} QUEUE.pkl (started by klsweep run)")
