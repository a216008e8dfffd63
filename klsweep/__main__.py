"""``python -m klsweep``: the same command line as the ``klsweep`` console script (``klsweep.cli``)."""

from klsweep.cli import main

if __name__ == "__main__":
    main()
