"""`python -m gpuwatch.cli`: the `gpuwatch` command, for child processes of the same Python."""

import sys

from gpuwatch.cli.main import main

sys.exit(main())
