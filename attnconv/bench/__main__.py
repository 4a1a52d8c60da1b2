"""`python -m attnconv.bench '{"spec": ..., "limit": ...}'`: one memory case in a fresh process (see memory.py)."""

import sys

from attnconv.bench.memory import child_main

if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
