#!/usr/bin/env python3
"""Peers of paramd's CPU fused step (DESIGN.md §10): fp32 AdamW on one flat tensor of n elements.

Measures DeepSpeedCPUAdam (AVX-512/AVX2 + OpenMP, compiled by DeepSpeed on first use) and
torch.optim.AdamW (foreach, and fused=True where the CPU build supports it) with the same thread
count. Prints one JSON line per peer on stdout: {"peer": ..., "elems_per_s": ...}, or
{"peer": ..., "error": "..."} when a peer cannot run. Bytes per element for these peers: 28 (read
grad, read + write p, m, v); paramd's step moves its policy's bytes (30 for fp32 serving bf16,
about 17 for fp8 states serving FP8).

With --paramd PATH (paramd_cpu_step_bench), paramd runs every policy of --policies between the
peers in every round, because memory bandwidth on a shared machine drifts from minute to minute:
each round gives a ratio paramd / peer measured seconds apart, and the median over rounds is
printed, one table row per policy.
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=64 << 20, help="elements (default 64 Mi)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads (default: all)")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per peer and round (best kept)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of all peers (and paramd)")
    ap.add_argument("--peers", default="deepspeed,torch_foreach,torch_fused",
                    help="comma-separated subset of deepspeed,torch_foreach,torch_fused")
    ap.add_argument("--paramd", default="", help="path of paramd_cpu_step_bench to interleave")
    ap.add_argument("--policies", default="all",
                    help="paramd policies, comma-separated (paramd_cpu_step_bench --list)")
    return ap.parse_args()


ARGS = parse_args()
# OpenMP reads its thread count when its runtime starts: set it before torch and DeepSpeed load.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
with contextlib.redirect_stdout(sys.stderr):  # keep stdout for results only
    import torch

torch.set_num_threads(ARGS.threads)
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


def make_deepspeed(params):
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    return DeepSpeedCPUAdam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)


def make_torch_foreach(params):
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=True)


def make_torch_fused(params):
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)


PEERS = {
    "deepspeed": ("deepspeed_cpu_adam", make_deepspeed),
    "torch_foreach": ("torch_adamw_foreach", make_torch_foreach),
    "torch_fused": ("torch_adamw_fused", make_torch_fused),
}


def make_peer(make):
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(ARGS.n, generator=gen) * 0.02)
    p.grad = torch.randn(ARGS.n, generator=gen) * 1e-3
    with contextlib.redirect_stdout(sys.stderr):
        opt = make([p])
        opt.step()  # warm-up: builds the extension if needed, allocates and touches the states
    return opt


def best_step_seconds(opt):
    times = []
    for _ in range(ARGS.reps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    return min(times)


def run_paramd():
    """One JSON result per policy, in the bench's order."""
    cmd = [ARGS.paramd, "--threads", str(ARGS.threads), "--n", str(ARGS.n), "--reps",
           str(ARGS.reps), "--policy", ARGS.policies, "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    peers, results = {}, {}
    for key in ARGS.peers.split(","):
        name, make = PEERS[key]
        try:
            peers[name] = make_peer(make)
            results[name] = []
        except Exception as e:  # a peer that cannot run is reported, not fatal
            msg = f"{type(e).__name__}: {e}".strip().replace("\n", " | ")
            print(json.dumps({"peer": name, "n": ARGS.n, "threads": ARGS.threads,
                              "error": msg[-3000:]}), flush=True)
    paramd_rounds = []
    for _ in range(ARGS.rounds):
        if ARGS.paramd:
            paramd_rounds.append(run_paramd())
        for name, opt in peers.items():
            results[name].append(ARGS.n / best_step_seconds(opt))

    for name, rounds in results.items():
        print(json.dumps({"peer": name, "n": ARGS.n, "threads": ARGS.threads,
                          "elems_per_s": statistics.median(rounds),
                          "gbs_at_28b": 28 * statistics.median(rounds) / 1e9,
                          "rounds_elems_per_s": rounds}), flush=True)
    if not paramd_rounds:
        return
    print(json.dumps({"paramd_rounds": paramd_rounds}), flush=True)
    names = list(results)
    short = {"deepspeed_cpu_adam": "/DeepSpeed", "torch_adamw_foreach": "/torch",
             "torch_adamw_fused": "/torch fused"}
    print(f"\n{len(paramd_rounds)} rounds, {ARGS.threads} threads, n={ARGS.n}; medians over rounds "
          f"of per-round ratios (peers: fp32 AdamW, 28 B/element)")
    header = f"{'policy':<14} {'B/elem':>6} {'Gelem/s':>8} {'GB/s':>6} {'/ceiling':>8}"
    header += "".join(f" {short.get(n, n):>12}" for n in names)
    print(header)
    for i, first in enumerate(paramd_rounds[0]):
        per_round = [r[i] for r in paramd_rounds]
        elems = [r["step_elems_per_s"] for r in per_round]
        row = (f"{first['policy']:<14} {first['bytes_per_element']:>6.1f} "
               f"{statistics.median(elems) / 1e9:>8.3f} "
               f"{statistics.median([r['step_gbs'] for r in per_round]):>6.1f} "
               f"{statistics.median([r['ratio_to_ceiling'] for r in per_round]):>8.2f}")
        for name in names:
            ratios = [a / b for a, b in zip(elems, results[name])]
            row += f" {statistics.median(ratios):>11.2f}x"
        print(row)
    for name in names:
        print(f"{name}: {statistics.median(results[name]) / 1e9:.3f} G elem/s "
              f"({', '.join(f'{x / 1e9:.3f}' for x in results[name])})")
    ceilings = [r[0]["ceiling_gbs"] for r in paramd_rounds]
    print(f"CPU ceiling (fp32 policy pattern / memcpy, best): "
          f"{', '.join(f'{c:.1f}' for c in ceilings)} GB/s per round")


if __name__ == "__main__":
    main()
