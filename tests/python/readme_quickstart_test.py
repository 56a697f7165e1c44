"""README.md's PyTorch CPU quickstart, run as written, so that the README cannot drift: the
```python block between the marker lines below is run with the Python of the venv the wheel test
made (its fixture: a fresh venv with torch and `pip install ./python`), from an empty folder, with
none of the build tree's settings. Its loss must fall. The install block before it must hold the
command the wheel test ran. Exits 77, skipped, where the wheel test skipped (no torch).
"""

import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
MARKER = "<!-- quickstart-cpu:"
END_MARKER = "<!-- /quickstart-cpu -->"


def blocks_after_marker(readme):
    """The fenced blocks (language, text) between the two markers."""
    with open(readme) as f:
        text = f.read()
    start = text.find(MARKER)
    end = text.find(END_MARKER, start)
    if start < 0 or end < 0:
        raise SystemExit(f"FAILED: no {MARKER!r} ... {END_MARKER!r} markers in {readme}")
    section = text[start:end]
    return re.findall(r"^```(\w*)\n(.*?)^```", section, flags=re.S | re.M)


def main():
    source = os.environ["PARAMD_SOURCE_DIR"]
    venv = os.environ["PARAMD_WHEEL_VENV"]
    if not os.path.exists(os.path.join(venv, "paramd-wheel-ready")):
        print(f"SKIPPED: the wheel test left no venv with paramd installed in {venv} "
              "(it skipped: no torch, or it failed)")
        return SKIP
    blocks = blocks_after_marker(os.path.join(source, "README.md"))
    install = [text for lang, text in blocks if lang in ("", "sh", "bash")]
    code = [text for lang, text in blocks if lang == "python"]
    if not install or "pip install ./python" not in install[0] or len(code) != 1:
        print(f"FAILED: the quickstart should be an install block with `pip install ./python` "
              f"and one python block; found {[lang or 'plain' for lang, _ in blocks]}")
        return 1

    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PARAMD_BINARY", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = venv
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="paramd-quickstart-") as work:
        script = os.path.join(work, "quickstart.py")
        with open(script, "w") as f:
            f.write(code[0])
        result = subprocess.run([os.path.join(venv, "bin", "python"), script], cwd=work, env=env,
                                capture_output=True, text=True, timeout=300)
    print(result.stdout, end="")
    if result.returncode != 0:
        print(f"FAILED: the quickstart exited {result.returncode}:\n{result.stderr[-6000:]}")
        return 1
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", result.stdout)]
    if len(losses) < 2 or not losses[-1] < losses[0] / 2:
        print(f"FAILED: the quickstart's loss did not fall by half: {losses}")
        return 1
    print(f"readme_quickstart_test: README.md's quickstart ran as written, loss {losses[0]} -> "
          f"{losses[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
