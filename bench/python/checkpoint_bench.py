"""Checkpoint write and restore throughput against the filesystem's own, in one run.

    PYTHONPATH=build/python python bench/python/checkpoint_bench.py --daemon build/server/paramd \\
        --dir /var/tmp/paramd-bench --state_gib 2

A daemon (cpu backend) with `checkpoint_dir` under --dir holds one job whose state (fp32 master,
fp32 exp_avg and exp_avg_sq: 12 bytes per parameter) is --state_gib GiB. Rows, each the best of
--rounds:
  paramd checkpoint   Control.Checkpoint: the state streamed into files, fsynced, renamed
  dd write            `dd if=/dev/zero bs=4M conv=fsync` of the same bytes on the same filesystem
  paramd restore      Control.Restore into the idle job, page cache dropped first (cold)
  dd read             `dd of=/dev/null bs=4M` of the dd file, page cache dropped first (cold)
Then the step-time slowdown during a checkpoint: the job's steps (push, commit, pull over inline)
timed alone, and while another connection's Control.Checkpoint runs (the steps committed during
it wait for the state to be copied into the writer's buffer: DESIGN.md section 8), with the
default checkpoint_buffer_bytes (16 MiB: the steps wait for about the write) and, in a second
daemon that restores the job from the checkpoints at start, with a buffer the size of the state
(the steps wait for a copy of it, then go on while the disk catches up).
Dropping the page cache needs root (/proc/sys/vm/drop_caches); without it the reads are warm and
the table says so. Prints MB/s and paramd's ratio to dd (target >= 0.7, DESIGN.md section 10).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import paramd
from paramd.daemon import Daemon

ROWS, COLS = 4096, 4096  # 64 MiB of fp32 master per tensor


def drop_caches():
    """True when the page cache was dropped (root only)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def dd(args):
    started = time.perf_counter()
    subprocess.run(["dd", *args, "status=none"], check=True)
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemon", help="paramd binary (default: $PARAMD_BINARY or PATH)")
    parser.add_argument("--dir", default=None, help="a folder on the filesystem to measure")
    parser.add_argument("--state_gib", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="paramd-checkpoint-bench-")
    os.makedirs(base, exist_ok=True)
    root = os.path.join(base, "checkpoints")
    # A daemon restores the checkpoints it finds at start: an earlier run's would hold the job.
    shutil.rmtree(root, ignore_errors=True)
    tensors = max(1, int(args.state_gib * 2**30 / (ROWS * COLS * 12)))
    state_bytes = tensors * ROWS * COLS * 12
    config = os.path.join(base, "paramd.textproto")
    with open(config, "w") as f:
        f.write(f'checkpoint_dir: "{root}"\nkeep_checkpoints: 1\nshared_memory: false\n')
    rows = {}
    names = [f"w{i}" for i in range(tensors)]
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal(ROWS * COLS, dtype=np.float32) * 0.02)
    grads = [(n, weights.view(np.uint8)) for n in names]
    with Daemon(args.daemon, step_threads=2, extra_args=[f"--config={config}"]) as daemon:
        client = paramd.connect(daemon.address, transport="inline", rpc_timeout_s=600)
        client.register(job="ckpt", rank=0, world_size=1,
                        tensors=[(n, ROWS, COLS, "fp32") for n in names],
                        hyperparams=paramd.hyperparams(lr=1e-3), serve=["bf16"])
        client.upload_initial_weights("ckpt", [(n, weights.view(np.uint8)) for n in names])
        step = Steps(client, names, grads, 0)
        step()  # so the moments are not zeros
        written, read = [], []
        cold = True
        for _ in range(args.rounds):
            started = time.perf_counter()
            client.checkpoint("ckpt")
            written.append(time.perf_counter() - started)
            cold = drop_caches() and cold
            started = time.perf_counter()
            client.restore("ckpt")
            read.append(time.perf_counter() - started)
        checkpoint_bytes = du(root)
        slowdowns = {"default buffer (16 MiB)": slowdown(daemon.address, step, args.rounds)}
        dd_file = os.path.join(base, "dd.bin")
        count = max(1, checkpoint_bytes // (4 << 20))
        dd_write = min(dd(["if=/dev/zero", f"of={dd_file}", "bs=4M", f"count={count}",
                           "conv=fsync"]) for _ in range(args.rounds))
        dd_read = []
        for _ in range(args.rounds):
            drop_caches()
            dd_read.append(dd([f"if={dd_file}", "of=/dev/null", "bs=4M"]))
        os.remove(dd_file)
        client.close()
        # Where a restore's time goes (the daemon's log line: reading, then into the backend).
        restored = [line.split("] ", 1)[-1] for line in daemon.log().splitlines()
                    if "restored version" in line]
    # A buffer the size of the state, in a daemon that takes the job back from its checkpoint.
    with open(config, "a") as f:
        f.write(f"checkpoint_buffer_bytes: {state_bytes + (64 << 20)}\n")
    with Daemon(args.daemon, step_threads=2, extra_args=[f"--config={config}"]) as daemon:
        client = paramd.connect(daemon.address, transport="inline", rpc_timeout_s=600)
        registered = client.register(job="ckpt", rank=0, world_size=1,
                                     tensors=[(n, ROWS, COLS, "fp32") for n in names],
                                     hyperparams=paramd.hyperparams(lr=1e-3), serve=["bf16"])
        step = Steps(client, names, grads, registered["next_step"])
        slowdowns["buffer of the state's size"] = slowdown(daemon.address, step, args.rounds)
        client.close()
    dd_bytes = count * (4 << 20)
    best_write = min(written)
    rows["paramd checkpoint"] = checkpoint_bytes / best_write
    rows["dd write (conv=fsync)"] = dd_bytes / dd_write
    rows["paramd restore" + ("" if cold else " (warm: cache not dropped)")] = (
        checkpoint_bytes / min(read))
    rows["dd read" + ("" if cold else " (warm)")] = dd_bytes / min(dd_read)
    print(f"state {state_bytes / 2**30:.2f} GiB in {tensors} tensors; checkpoint "
          f"{checkpoint_bytes / 2**30:.2f} GiB on disk; {args.rounds} rounds, best of each")
    print("| row | MB/s | paramd / dd |")
    print("| --- | --- | --- |")
    values = list(rows.items())
    print(f"| {values[0][0]} | {values[0][1] / 1e6:.0f} | {values[0][1] / values[1][1]:.2f} |")
    print(f"| {values[1][0]} | {values[1][1] / 1e6:.0f} | |")
    print(f"| {values[2][0]} | {values[2][1] / 1e6:.0f} | {values[2][1] / values[3][1]:.2f} |")
    print(f"| {values[3][0]} | {values[3][1] / 1e6:.0f} | |")
    if restored:
        print(f"the daemon: {restored[-1]}")
    print()
    print("| checkpoint_buffer_bytes | step alone | checkpoint | steps during it | mean step "
          "during | max step during | slowdown |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, (alone, seconds, during) in slowdowns.items():
        print(f"| {name} | {statistics.median(alone) * 1e3:.0f} ms | {seconds:.2f} s | "
              f"{len(during)} | {statistics.mean(during) * 1e3:.0f} ms | "
              f"{max(during) * 1e3:.0f} ms | "
              f"{statistics.mean(during) / statistics.median(alone):.2f}x |")
    return 0


class Steps:
    """The job's steps as a trainer runs them; each call runs one and returns its seconds."""

    def __init__(self, client, names, grads, next_step):
        self.client, self.names, self.grads, self.next_step = client, names, grads, next_step

    def __call__(self):
        started = time.perf_counter()
        self.client.push_gradients("ckpt", 0, self.next_step, self.grads)
        self.client.commit("ckpt", 0, self.next_step, lr=1e-3, grad_scale=1.0)
        self.next_step += 1
        self.client.pull("ckpt", self.names[-1], "bf16", self.next_step, 600.0)
        return time.perf_counter() - started


def slowdown(address, step, rounds):
    """Steps timed alone, then while another connection's checkpoint runs: (the steps alone,
    the checkpoint's seconds, the steps during it)."""
    for _ in range(2):  # untimed: a daemon that restored the job at start faults its memory in
        step()
    alone = [step() for _ in range(rounds + 1)]
    other = paramd.connect(address, transport="inline", rpc_timeout_s=600)
    during, seconds = [], []

    def checkpoint():
        started = time.perf_counter()
        other.checkpoint("ckpt")
        seconds.append(time.perf_counter() - started)

    writer = threading.Thread(target=checkpoint)
    writer.start()
    while writer.is_alive():
        during.append(step())
    writer.join()
    other.close()
    return alone, seconds[0], during


def du(path):
    total = 0
    for folder, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total


if __name__ == "__main__":
    sys.exit(main())
