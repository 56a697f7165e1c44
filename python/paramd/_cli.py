"""The `paramd` command of the wheel: runs the daemon the wheel carries (paramd/_bin/paramd).

It replaces this process with the daemon (same argv, same pid), so signals reach the daemon
itself. The wheel's daemon is a CPU-only build (backend cpu); for GPUs, build from source.
"""

import os
import sys


def binary():
    """The daemon inside the installed package, or None (a build tree has none)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "paramd")
    return path if os.access(path, os.X_OK) else None


def main():
    path = binary()
    if path is None:
        sys.exit("paramd: this paramd package carries no daemon (paramd/_bin/paramd); "
                 "install it with `pip install ./python`, or run build/server/paramd")
    os.execv(path, ["paramd", *sys.argv[1:]])
