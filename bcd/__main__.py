"""The `bcd` console script."""

import sys


def main() -> int:
    print("bcd: the node agent is not built yet in this release", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
