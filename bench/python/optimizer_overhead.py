"""Optimizer overhead of paramd.torch.AdamW per training step, against torch.optim.AdamW on the
same model and machine, and the share of the daemon's work hidden behind backward and the next
forward.

    PYTHONPATH=build/python python bench/python/optimizer_overhead.py --daemon build/server/paramd

One trainer rank (torch with --threads threads) and a local daemon (cpu backend,
--step_threads) train examples/lm's transformer, scaled up (--d_model, --layers), for --steps
timed steps after a warm-up. Rows (milliseconds per step, median):
  forward+backward   the loop without an optimizer: the floor every optimizer adds to
  torch AdamW        foreach (torch's default on CPU), and fused=True
  paramd serial      gradients pushed after backward, every weight pulled inside step()
  paramd overlapped  pushes streamed from the grad hooks during backward, each layer's weights
                     pulled by the pull thread and written just before that layer's forward
Overhead = row - forward+backward; variants run in --rounds interleaved rounds, medians reported.
Hidden share, two ways: from the trainer's own clock of what it waited for (pushes in step();
the daemon's step and the pulls, in step() when serial, in the forward pre-hooks when
overlapped), 1 - wait(overlapped) / wait(serial); and from whole steps,
1 - overhead(overlapped) / overhead(serial), which also counts the CPU the overlapped work takes
from backward and forward on a machine with few cores.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "examples", "lm"))
import train_lm  # noqa: E402

import paramd.torch  # noqa: E402
from paramd.daemon import Daemon  # noqa: E402


def time_loop(model, data, s, steps, warmup, opt=None, on_step=None, fb_times=None):
    """Seconds of each timed step (forward, backward, optimizer step, zero_grad); the forward +
    backward part of each step is appended to fb_times."""
    times = []
    for step in range(warmup + steps):
        x, y = train_lm.batch(data, s, step, 0)
        started = time.perf_counter()
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        backward_done = time.perf_counter()
        if opt is not None:
            opt.step()
        model.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - started
        if on_step is not None:
            on_step()
        if step >= warmup:
            times.append(elapsed)
            if fb_times is not None:
                fb_times.append(backward_done - started)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemon", help="paramd binary (default: $PARAMD_BINARY or PATH)")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    parser.add_argument("--step_threads", type=int, default=1, help="daemon step threads")
    parser.add_argument("--policy", default="fp32", choices=sorted(train_lm.POLICIES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    s = train_lm.Settings(d_model=args.d_model, layers=args.layers, context=args.context,
                          batch=args.batch, heads=max(1, args.d_model // 64))
    data, _, vocab = train_lm.dataset(s)

    def model():
        torch.manual_seed(0)
        return train_lm.TinyLM(vocab, s)

    params = sum(p.numel() for p in model().parameters())
    state_policy, serve = train_lm.POLICIES[args.policy]
    # Variants run in interleaved rounds and report the median step, so a burst of load from
    # elsewhere on the machine does not land on one variant only.
    times = {}
    daemon_s, waits, fb_times = [], {}, {}
    with Daemon(args.daemon, step_threads=args.step_threads) as daemon:
        for r in range(args.rounds):
            m = model()
            times.setdefault("forward+backward", []).extend(
                time_loop(m, data, s, args.steps, args.warmup))
            for name, fused in (("torch AdamW (foreach)", False), ("torch AdamW (fused)", True)):
                m = model()
                opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=not fused, fused=fused)
                times.setdefault(name, []).extend(
                    time_loop(m, data, s, args.steps, args.warmup, opt))
            for name, overlapped in (("paramd serial", False), ("paramd overlapped", True)):
                m = model()
                opt = paramd.torch.AdamW(m.named_parameters(), lr=1e-4, address=daemon.address,
                                         job=f"{name.replace(' ', '-')}-{r}",
                                         state_policy=state_policy, serve=serve,
                                         module=m if overlapped else None,
                                         stream_pushes=overlapped)
                on_step = None
                if overlapped:
                    def on_step(opt=opt):
                        daemon_s.append(opt.daemon_status()[0]["last_step_seconds"])
                times.setdefault(name, []).extend(
                    time_loop(m, data, s, args.steps, args.warmup, opt, on_step,
                              fb_times.setdefault(name, [])))
                for k, v in opt.timings.items():
                    w = waits.setdefault(name, {})
                    w[k] = w.get(k, 0.0) + v * 1e3 / (args.steps + args.warmup) / args.rounds
                transport = opt.transport
                opt.close()
    rows = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    daemon_ms = statistics.median(daemon_s) * 1e3

    floor = rows["forward+backward"]
    print(f"model: {params / 1e6:.2f} M parameters ({args.layers} layers, d_model {args.d_model},"
          f" batch {args.batch}x{args.context}); trainer threads {args.threads}, daemon step "
          f"threads {args.step_threads}; policy {args.policy} (state {state_policy}, serve "
          f"{serve[0]}), transport {transport}")
    print(f"{'':24} {'ms/step':>9} {'overhead ms':>12}")
    for name, ms in rows.items():
        print(f"{name:24} {ms:9.2f} {ms - floor:12.2f}")
    serial = rows["paramd serial"] - floor
    overlapped = rows["paramd overlapped"] - floor
    print(f"daemon step (its own timer, median): {daemon_ms:.2f} ms")
    for name, w in waits.items():
        fb = statistics.median(fb_times[name]) * 1e3
        print(f"{name}: the trainer waited per step {w['push_wait_s']:.2f} ms for pushes, "
              f"{w['commit_s']:.2f} ms in commits, {w['pull_wait_s']:.2f} ms for weights; its "
              f"forward+backward took {fb:.2f} ms ({fb - floor:+.2f} ms)")
    ws, wo = waits["paramd serial"], waits["paramd overlapped"]
    print(f"hidden share of the waits for pushes: {1 - wo['push_wait_s'] / ws['push_wait_s']:.0%};"
          f" for the daemon's step and the pulls: "
          f"{1 - wo['pull_wait_s'] / ws['pull_wait_s']:.0%}")
    print(f"hidden share of the whole overhead (step time): {1 - overlapped / serial:.0%} "
          f"({serial:.2f} ms serial -> {overlapped:.2f} ms overlapped)")
    print(f"paramd overlapped overhead / torch AdamW (foreach) overhead: "
          f"{overlapped / (rows['torch AdamW (foreach)'] - floor):.2f}x")


if __name__ == "__main__":
    main()
