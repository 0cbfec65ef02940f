"""``python -m vfops`` is the ``vfops`` command."""

from vfops.cli import main

main()
