"""`python -m fabricctl` is the `fabricctl` command."""

from fabricctl.cli import main

main()
