"""The daemon killed with SIGKILL at random points of a run and started again: the trainer
follows it back to its newest checkpoint and ends bit-identical to a run without crashes.

A trainer process (paramd.torch.AdamW over shm, an MLP on the CPU, each batch a function of
opt.next_step, reconnect_timeout_s) trains STEPS steps. The daemon has a checkpoint_dir and
writes a checkpoint every 3 steps. For each seed the harness kills it with SIGKILL a few times, at
random moments once a first checkpoint exists (some land while a checkpoint is being written),
and starts it again at the same address after a moment. The final weights must equal, bit for
bit, those of the same trainer against a daemon that was never killed."""

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

import support

support.require_torch()

STEPS = 150
SEEDS = (1, 2, 3)
KILLS = 3

TRAINER = r'''
import sys, torch, torch.nn as nn, torch.nn.functional as F
import paramd.torch
address, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 3))
opt = paramd.torch.AdamW(model.named_parameters(), lr=1e-2, address=address, job="crash",
                         state_policy="fp8", serve="fp32", module=model, seed=7,
                         reconnect_timeout_s=60.0, timeout_s=60.0)
trace = []  # per iteration: (its step, its loss, restarts followed so far, whether it was dropped)
while True:
    while opt.next_step < steps:
        step = opt.next_step
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(32, 12, generator=g), torch.randint(0, 3, (32,), generator=g)
        restarts = opt.restarts
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        # An iteration during which a restart was followed trained nothing (its forward may have
        # run on weights of two versions): marked, so that its loss is not compared.
        trace.append((step, loss.item(), opt.restarts, opt.restarts != restarts))
    # The last version's weights. A restart found here moves next_step back too: train on.
    opt.sync_weights()
    if opt.next_step >= steps:
        break
torch.save({"weights": [p.detach().clone() for p in model.parameters()],
            "restarts": opt.restarts, "trace": trace}, out)
opt.close()
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """paramd at a fixed address with a checkpoint_dir; start() again after kill()."""

    def __init__(self, root, port):
        self.port = port
        self.config = os.path.join(root, "paramd.textproto")
        with open(self.config, "w") as f:
            f.write(f'listen: "127.0.0.1:{port}"\nmetrics_listen: ""\ncheckpoint_dir: '
                    f'"{root}/checkpoints"\ncheckpoint_every_steps: 3\nkeep_checkpoints: 2\n'
                    'step_threads: 1\n')
        self.log = open(os.path.join(root, "paramd.log"), "ab")
        self.process = None

    def start(self):
        from paramd.daemon import find_binary
        self.process = subprocess.Popen([find_binary(), f"--config={self.config}"],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError("paramd exited at start")
                time.sleep(0.02)
        raise RuntimeError("paramd did not start")

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def run(seed, kills):
    """Trains once against a daemon killed up to `kills` times while the trainer runs; returns
    (weights, rollbacks the trainer followed, kills made)."""
    import torch
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="paramd-crash-") as root:
        daemon = Daemon(root, free_port())
        daemon.start()
        out = os.path.join(root, "result.pt")
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, f"127.0.0.1:{daemon.port}",
                                    out, str(STEPS)])
        made = 0
        try:
            checkpoints = os.path.join(root, "checkpoints", "crash")
            for _ in range(kills):
                # Not before the job's first checkpoint: without one its state would be lost.
                deadline = time.monotonic() + 60
                while not (os.path.isdir(checkpoints) and any(
                        n.startswith("step-") for n in os.listdir(checkpoints))):
                    if time.monotonic() > deadline or trainer.poll() is not None:
                        break
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.4))
                if trainer.poll() is not None:
                    break
                daemon.kill()
                made += 1
                time.sleep(rng.uniform(0.05, 0.5))  # down for a moment
                daemon.start()
            code = trainer.wait(timeout=200)
        finally:
            if trainer.poll() is None:
                trainer.kill()
            daemon.stop()
        if code != 0:
            raise RuntimeError(f"the trainer exited with {code}")
        result = torch.load(out)
        with open(os.path.join(root, "paramd.log"), "rb") as f:
            restores = [line.decode(errors="replace").rstrip() for line in f
                        if b"restored" in line or b"checkpoint of version" in line]
        return result["weights"], result["restarts"], made, result["trace"], restores


def main():
    import torch
    started = time.monotonic()
    reference, _, _, reference_trace, _ = run(seed=0, kills=0)
    losses = {step: loss for step, loss, _, _ in reference_trace}
    failures = 0
    for seed in SEEDS:
        weights, rollbacks, made, trace, restores = run(seed, KILLS)
        same = all(torch.equal(a, b) for a, b in zip(weights, reference))
        # A restart whose checkpoint is the version the trainer holds needs no rollback.
        print(f"seed {seed}: daemon killed {made} time(s), {rollbacks} rollback(s) followed; "
              f"final weights {'bit-identical to' if same else 'DIFFERENT from'} the run "
              "without crashes")
        if not same:
            # What the next look needs: the first iteration whose loss differs from the run
            # without crashes (its step, and the restarts followed by then), the iterations
            # around it, and the daemon's checkpoints and restores.
            first = next((i for i, (step, loss, _, dropped) in enumerate(trace)
                          if not dropped and losses[step] != loss), None)
            print(f"  first iteration with another loss: {first} of {len(trace)}")
            if first is not None:
                for step, loss, restarts, dropped in trace[max(0, first - 4):first + 3]:
                    print(f"  step {step}: loss {loss!r} (without crashes {losses[step]!r}), "
                          f"{restarts} restart(s) followed{', dropped' if dropped else ''}")
            for line in restores[-12:]:
                print(f"  daemon: {line}")
        if not same or made < 1:
            failures += 1
    print(f"{len(SEEDS) - failures} of {len(SEEDS)} seeds passed in "
          f"{time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
