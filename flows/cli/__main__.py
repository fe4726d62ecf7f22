"""``python -m flows.cli``: the same as the ``fedapt`` command."""

from flows.cli import main

main()
