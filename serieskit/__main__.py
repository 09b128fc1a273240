import sys

from serieskit.cli import run

sys.exit(run(sys.argv[1:]))
