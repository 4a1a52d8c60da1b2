"""`python -m attnconv`: the command line. Ctrl-C before `main` runs (it imports the heavy modules itself) is a
quiet exit too."""

import sys

try:
    from attnconv.cli import command
except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None

command()
