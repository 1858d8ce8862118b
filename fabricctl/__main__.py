"""`python -m fabricctl` is the `fabricctl` command."""

from fabricctl.cli.app import main

main()
