"""``python -m serieskit COMMAND``: the command line (:mod:`serieskit.cli`)."""

import sys

from serieskit.cli import main

sys.exit(main(sys.argv[1:]))
