"""``python -m klsweep.cli`` (as ``python -m klsweep``): the ``klsweep`` console script."""

from klsweep.cli import main

if __name__ == "__main__":
    main()
