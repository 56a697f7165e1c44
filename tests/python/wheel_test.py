"""The wheel as a user gets it: a fresh venv with torch, `pip install ./python` (which builds the
client and the daemon), then from the venv alone: `paramd --version` and
paramd.__version__ say CMake's version, the `paramd` command starts the daemon the wheel carries,
and paramd.torch.AdamW trains two steps through it as torch.optim.AdamW does.

torch: where the interpreter running this file has one (scripts/setup.sh installs it for the
Python tests), the venv sees that installation through a .pth file instead of installing a second
copy (torch with its CUDA libraries is 4-5 GB on disk and about 80 s to fetch); otherwise it is
installed into the venv from the CPU wheel index, else PyPI. Either way the venv's own
site-packages holds only what `pip install ./python` put there.

Run by ctest with the build's interpreter; the training half runs inside the venv (this file with
--train). The venv stays for the README quickstart test (a ctest fixture). Without torch (neither
index reachable) it exits 77, skipped, saying why. Prints each phase's time.
"""

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import time

SKIP = 77
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def run(args, **kwargs):
    """Runs a command; on failure prints its output and fails the test."""
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        print(f"FAILED: {' '.join(args)} exited {result.returncode}:\n"
              f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}")
        sys.exit(1)
    return result.stdout


def venv_env(venv):
    """The environment of a shell that activated the venv: none of the build tree's settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PARAMD_BINARY", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = venv
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    return env


def install_torch(python):
    """torch the way scripts/setup.sh installs it: the CPU index, else PyPI. False: neither."""
    for where, index in (("the CPU wheel index", ["--index-url", CPU_INDEX]), ("PyPI", [])):
        result = subprocess.run([python, "-m", "pip", "install", "-q", *index, "torch"],
                                capture_output=True, text=True)
        if result.returncode == 0:
            print(f"torch from {where}")
            return True
        print(f"pip install torch from {where} failed:\n{result.stderr[-2000:]}")
    return False


def shared_torch():
    """The folder this interpreter's torch is installed in, where the venv may see it: None without
    torch, or where that folder also holds a paramd (pip installing the wheel would replace it)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    folder = os.path.dirname(os.path.dirname(spec.origin))
    if any(d.metadata["Name"] == "paramd" for d in importlib.metadata.distributions(path=[folder])):
        return None
    return folder


def share_torch(python, folder):
    """Makes the venv's interpreter see `folder` (after its own site-packages) through a .pth."""
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    with open(os.path.join(site, "paramd-test-torch.pth"), "w") as f:
        f.write(folder + "\n")
    print(f"torch from {folder} (this interpreter's, through {site}/paramd-test-torch.pth)")


def main():
    if os.environ.get("PARAMD_TORCH_TESTS", "ON").upper() in ("OFF", "0", "NO", "FALSE"):
        print("SKIPPED: PARAMD_TORCH_TESTS is OFF")
        return SKIP
    source = os.environ["PARAMD_SOURCE_DIR"]
    version = os.environ["PARAMD_VERSION"]
    venv = os.environ["PARAMD_WHEEL_VENV"]
    build_dir = os.environ["PARAMD_WHEEL_BUILD_DIR"]
    ready = os.path.join(venv, "paramd-wheel-ready")
    times = {}

    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", venv])
    python = os.path.join(venv, "bin", "python")
    env = venv_env(venv)
    folder = shared_torch()
    if folder:
        share_torch(python, folder)
    elif not install_torch(python):
        print(f"SKIPPED: torch cannot be installed into {venv} from {CPU_INDEX} or PyPI "
              "(see pip's errors above); the wheel was not tested")
        return SKIP
    times["venv and torch"] = time.monotonic() - started

    # scikit-build-core's build tree is this test's own (not the repository's build/), kept
    # between runs so that a second run rebuilds only what changed.
    started = time.monotonic()
    run([python, "-m", "pip", "install", "-q", f"--config-settings=build-dir={build_dir}",
         os.path.join(source, "python")], env=env, cwd=venv)
    times["pip install ./python"] = time.monotonic() - started

    started = time.monotonic()
    said = run(["paramd", "--version"], env=env, cwd=venv).strip()
    if shutil.which("paramd", path=env["PATH"]) != os.path.join(venv, "bin", "paramd"):
        print(f"FAILED: `paramd` on the venv's PATH is {shutil.which('paramd', path=env['PATH'])}")
        return 1
    if said != f"paramd {version}":
        print(f"FAILED: paramd --version says {said!r}, not 'paramd {version}' (CMakeLists.txt)")
        return 1
    versions = run([python, "-c", "import importlib.metadata, paramd; "
                    "print(paramd.__version__, importlib.metadata.version('paramd'))"],
                   env=env, cwd=venv).split()
    if versions != [version, version]:
        print(f"FAILED: paramd.__version__ and the wheel's metadata say {versions}, not {version}")
        return 1
    print(run([python, __file__, "--train"], env=env, cwd=venv), end="")
    times["version and training"] = time.monotonic() - started

    with open(ready, "w") as f:
        f.write(version)
    print(f"wheel_test: paramd {version} from the wheel trained two steps; "
          + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in times.items()))
    return 0


def train():
    """Inside the venv: the daemon through the `paramd` command, two steps of paramd.torch.AdamW
    against torch.optim.AdamW on the same tiny model and batches."""
    import torch

    import paramd
    import paramd.daemon
    import paramd.torch

    packaged = os.path.join(os.path.dirname(paramd.__file__), "_bin", "paramd")
    assert paramd.daemon.find_binary() == packaged, paramd.daemon.find_binary()

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    batches = [(torch.randn(32, 8, generator=torch.Generator().manual_seed(s)),
                torch.randn(32, 2, generator=torch.Generator().manual_seed(100 + s)))
               for s in range(2)]

    def fit(model, opt):
        for x, y in batches:
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()

    theirs = make_model()
    fit(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-2))
    with paramd.daemon.Daemon(binary=shutil.which("paramd")) as daemon:
        ours = make_model()
        opt = paramd.torch.AdamW(ours.named_parameters(), lr=1e-2, address=daemon.address,
                                 job="wheel", module=ours)
        fit(ours, opt)
        opt.sync_weights()
        opt.close()
    initial = make_model()
    for (name, p), q, p0 in zip(ours.named_parameters(), theirs.parameters(), initial.parameters()):
        assert not torch.equal(p, p0), f"{name} did not change"
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), \
            f"{name}: paramd {p.flatten()[:4]} torch {q.flatten()[:4]}"
    print(f"trained 2 steps through {daemon.binary} at {daemon.address}: as torch.optim.AdamW")


if __name__ == "__main__":
    if sys.argv[1:] == ["--train"]:
        train()
    else:
        sys.exit(main())
