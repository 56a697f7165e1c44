"""Starting a local paramd daemon from Python (tests, examples, benchmarks).

A production daemon runs beside the job (DESIGN.md section 7); this helper starts the `paramd`
binary on a free loopback port for one process tree and stops it again.
"""

import os
import shutil
import signal
import subprocess
import tempfile


def find_binary(explicit=None):
    """The daemon binary: `explicit`, $PARAMD_BINARY, the one the installed wheel carries, or
    `paramd` on PATH."""
    from paramd import _cli
    for candidate in (explicit, os.environ.get("PARAMD_BINARY"), _cli.binary(),
                      shutil.which("paramd")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "no paramd binary: pass its path, set PARAMD_BINARY, install the wheel "
        "(pip install ./python), or put it on PATH (it is built as build/server/paramd)")


class Daemon:
    """A paramd process on 127.0.0.1 with a port it picked itself; a context manager."""

    def __init__(self, binary=None, backend="cpu", step_threads=0, extra_args=(),
                 start_timeout_s=30.0):
        self.binary = find_binary(binary)
        self._dir = tempfile.TemporaryDirectory(prefix="paramd-")
        address_file = os.path.join(self._dir.name, "address")
        self.log_path = os.path.join(self._dir.name, "paramd.log")
        args = [self.binary, "--listen=127.0.0.1:0", "--metrics_listen=",
                f"--backend={backend}", f"--address_file={address_file}"]
        if step_threads:
            args.append(f"--step_threads={step_threads}")
        args.extend(extra_args)
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        # Waited for by the rule `paramctl wait` uses (the address file written, the address
        # answering), in the extension: it fails at once where the daemon exits first.
        from paramd import _paramd
        try:
            self.address = _paramd.wait_until_serving(address_file, self.process.pid,
                                                      start_timeout_s)
        except _paramd.StatusError as error:
            self.stop()
            log = self.log()
            self._dir.cleanup()
            raise RuntimeError(f"paramd did not start ({error}):\n{log}") from None

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        """SIGTERM (the daemon drains and exits), then waits; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        self._dir.cleanup()
