"""``python -m serieskit COMMAND``: the command line (:mod:`serieskit.cli`)."""

import sys

from serieskit.cli import run

sys.exit(run(sys.argv[1:]))
