"""A checkpoint streams: writing a 2 GiB state raises the daemon's peak resident memory by less than
64 MiB (DESIGN.md section 8: peak extra memory bounded by a chunk, not by the state's size).

A real daemon process (cpu backend) with a checkpoint_dir in a temporary folder holds one job of
11 fp32 tensors of 4096 x 4096 with the fp32 policy: 2.06 GiB of state. Its peak resident set
(VmHWM) is reset through /proc/PID/clear_refs just before the checkpoint and read after it."""

import os
import sys
import tempfile

import numpy as np

import support

import paramd  # noqa: E402

ROWS, COLS, TENSORS = 4096, 4096, 11
MARGIN_BYTES = 64 << 20


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def main():
    with tempfile.TemporaryDirectory(prefix="paramd-ckmem-") as tmp:
        config = os.path.join(tmp, "paramd.textproto")
        with open(config, "w") as f:
            f.write(f'checkpoint_dir: "{tmp}/checkpoints"\nshared_memory: false\n')
        with support.daemon(step_threads=2, extra_args=[f"--config={config}"]) as daemon:
            client = paramd.connect(daemon.address, transport="inline", rpc_timeout_s=600)
            names = [f"w{i}" for i in range(TENSORS)]
            client.register(job="big", rank=0, world_size=1,
                            tensors=[(n, ROWS, COLS, "fp32") for n in names],
                            hyperparams=paramd.hyperparams(lr=1e-3), serve=["bf16"])
            weights = np.random.default_rng(0).standard_normal(ROWS * COLS, dtype=np.float32)
            client.upload_initial_weights("big", [(n, weights.view(np.uint8)) for n in names])
            client.push_gradients("big", 0, 0, [(n, weights.view(np.uint8)) for n in names])
            client.commit("big", 0, 0, lr=1e-3, grad_scale=1.0)
            client.pull("big", names[-1], "bf16", 1, 600.0)
            pid = daemon.process.pid
            before = status_kib(pid, "VmRSS") * 1024
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5\n")  # resets VmHWM to the current resident set
            written = client.checkpoint("big")
            peak = status_kib(pid, "VmHWM") * 1024
            client.close()
    state = TENSORS * ROWS * COLS * 12
    extra = peak - before
    print(f"state {state / 2**30:.2f} GiB, checkpoint {written['bytes'] / 2**30:.2f} GiB in "
          f"{written['seconds']:.1f} s; resident {before / 2**20:.0f} MiB before, peak "
          f"{peak / 2**20:.0f} MiB during: {extra / 2**20:.1f} MiB extra (bar "
          f"{MARGIN_BYTES / 2**20:.0f} MiB)")
    checks = {
        "the checkpoint holds the whole state": written["bytes"] >= state,
        "the resident set was measured (the daemon holds its state)": before >= state,
        "extra peak memory below 64 MiB": extra < MARGIN_BYTES,
    }
    failures = [name for name, ok in checks.items() if not ok]
    for name in failures:
        print("FAILED:", name)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
