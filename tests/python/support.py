"""What every Python test needs first: torch (or an explicit skip), the package, the daemon.

ctest sets PYTHONPATH to the build tree's package, PARAMD_BINARY to the built daemon and
PARAMD_TORCH_TESTS to the CMake option. Without torch a test fails, naming the interpreter,
unless the option was turned off on purpose; then it exits 77, which ctest reports as skipped.
"""

import os
import sys

SKIP = 77


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError as error:
        if os.environ.get("PARAMD_TORCH_TESTS", "ON").upper() in ("OFF", "0", "NO", "FALSE"):
            print(f"SKIPPED: torch is not importable ({error}) and PARAMD_TORCH_TESTS is OFF")
            sys.exit(SKIP)
        print(f"FAILED: torch is not importable from {sys.executable} ({error}); "
              "scripts/setup.sh installs it, or configure with -DPARAMD_TORCH_TESTS=OFF to skip")
        sys.exit(1)


def source_dir():
    return os.environ.get("PARAMD_SOURCE_DIR") or os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def daemon(**kwargs):
    from paramd.daemon import Daemon
    return Daemon(os.environ.get("PARAMD_BINARY"), **kwargs)
