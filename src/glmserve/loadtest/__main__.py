"""`python -m glmserve.loadtest [LOCUST OPTIONS]`: Locust with the decode suite registered
before Locust builds its parser, so that `--help` lists the suite's options beside Locust's.

`locust -f loadtest/decode.py --help` cannot: Locust prints its help before it imports the
locustfile (locustio/locust#2917, closed unfixed). Everything else is plain Locust; without
-f, the locustfile is loadtest/decode.py when the current folder has one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

LOCUSTFILE = Path("loadtest") / "decode.py"


def main(argv: Sequence[str] | None = None) -> int:
    import locust.main  # gevent patches the process here, before anything else runs

    from glmserve.loadtest.plugin import register

    register()
    args = list(sys.argv[1:] if argv is None else argv)
    given = any(a in ("-f", "--locustfile") or a.startswith(("-f=", "--locustfile=")) for a in args)
    if not given and LOCUSTFILE.is_file():
        args = ["-f", str(LOCUSTFILE), *args]
    sys.argv = ["locust", *args]
    locust.main.main()  # exits with Locust's (and the suite's) exit code
    return 0


if __name__ == "__main__":
    sys.exit(main())
