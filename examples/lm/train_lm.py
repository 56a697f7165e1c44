"""Trains a small decoder-only transformer LM with 2 ranks, through paramd and with
torch.optim.AdamW, and compares the loss curves.

    python examples/lm/train_lm.py --daemon build/server/paramd --policy fp32 --policy fp8 \
        --plot lm_loss.png

Each run is `world_size` processes (torch.multiprocessing spawn, gloo) training the same model
from the same seed on the same batches: the torch run averages gradients with
DistributedDataParallel and steps torch.optim.AdamW; a paramd run swaps in paramd.torch.AdamW
(gradients stream to a real daemon during backward, each layer's new weights are pulled before
its forward). Both use two param groups (no decay for biases, norms and embeddings) and a
warm-up + cosine LambdaLR. Rank 0 prints per-step losses (the mean over ranks) and a held-out
loss at the end; --plot writes every curve to a PNG.
"""

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import png  # noqa: E402

# Policies the example knows by name: (state policy, serve formats).
POLICIES = {
    "fp32": ("fp32", ["fp32"]),
    # fp8 exp_avg + block-scaled fp16 exp_avg_sq; the model computes with bf16 weights.
    "fp8": ("fp8", ["bf16"]),
    # Both moments fp8; bf16 weights.
    "fp8_all": ("fp8_all", ["bf16"]),
}


class Settings:
    """Everything that fixes a run; the same for the torch run and the paramd runs."""

    def __init__(self, steps=40, world_size=2, batch=16, context=32, d_model=64, heads=4,
                 layers=2, lr=3e-3, warmup=5, weight_decay=0.1, seed=1, threads=1):
        self.steps, self.world_size, self.batch, self.context = steps, world_size, batch, context
        self.d_model, self.heads, self.layers = d_model, heads, layers
        self.lr, self.warmup, self.weight_decay, self.seed = lr, warmup, weight_decay, seed
        self.threads = threads


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab, s):
        super().__init__()
        self.tok = nn.Embedding(vocab, s.d_model)
        self.pos = nn.Embedding(s.context, s.d_model)
        self.blocks = nn.ModuleList(Block(s.d_model, s.heads) for _ in range(s.layers))
        self.ln = nn.LayerNorm(s.d_model)
        self.head = nn.Linear(s.d_model, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def dataset(s):
    """(train tokens, held-out tokens, vocabulary size) from the generated corpus."""
    vocab = corpus.vocabulary()
    index = {c: i for i, c in enumerate(vocab)}
    text = corpus.make_corpus(120_000, seed=s.seed)
    tokens = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(len(tokens) * 0.9)
    return tokens[:split], tokens[split:], len(vocab)


def batch(tokens, s, step, rank):
    """The batch of (step, rank): the same in every run."""
    g = torch.Generator().manual_seed(s.seed * 1_000_003 + step * 997 + rank)
    starts = torch.randint(0, len(tokens) - s.context - 1, (s.batch,), generator=g)
    x = torch.stack([tokens[i:i + s.context] for i in starts])
    y = torch.stack([tokens[i + 1:i + s.context + 1] for i in starts])
    return x, y


def param_groups(model, s, named):
    """Decay for matrices, none for biases, norms and embeddings (as GPT trainers do)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        is_matrix = p.dim() >= 2 and not name.startswith(("tok.", "pos."))
        (decay if is_matrix else no_decay).append((name, p) if named else p)
    return [{"params": decay, "weight_decay": s.weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def lr_lambda(s):
    def f(step):
        if step < s.warmup:
            return (step + 1) / s.warmup
        progress = (step - s.warmup) / max(1, s.steps - s.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def mean_over_ranks(value):
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def held_out_loss(model, tokens, s):
    with torch.no_grad():
        losses = []
        for k in range(4):
            x, y = batch(tokens, s, 10_000 + k, 0)
            losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    return sum(losses) / len(losses)


def _rank_main(rank, s, run, port, out_path):
    torch.set_num_threads(s.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=s.world_size)
    train, held_out, vocab = dataset(s)
    torch.manual_seed(s.seed)
    model = TinyLM(vocab, s)
    if run["optimizer"] == "torch":
        trained = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(param_groups(model, s, named=False), lr=s.lr, betas=(0.9, 0.95))
    else:
        import paramd.torch
        trained = model
        opt = paramd.torch.AdamW(param_groups(model, s, named=True), lr=s.lr, betas=(0.9, 0.95),
                                 address=run["address"], job=run["job"],
                                 state_policy=run["state_policy"], serve=run["serve"],
                                 module=model, seed=s.seed)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(s))
    losses, started = [], time.perf_counter()
    for step in range(s.steps):
        x, y = batch(train, s, step, rank)
        loss = F.cross_entropy(trained(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses.append(mean_over_ranks(loss.item()))
    seconds = time.perf_counter() - started
    if run["optimizer"] != "torch":
        opt.sync_weights()
    result = {"losses": losses, "held_out": mean_over_ranks(held_out_loss(model, held_out, s)),
              "seconds": seconds}
    if run["optimizer"] != "torch":
        # What the daemon really kept and served, so a test can tell a policy was in effect.
        result["state_policy"] = opt.daemon_status()[0]["state_policy"]
        result["served_dtype"] = str(opt.served(model.head.weight).data.dtype)
        result["transport"] = opt.transport
        opt.close()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(s, optimizer="torch", policy="fp32", address=None, job=None):
    """Trains with `world_size` spawned ranks; returns rank 0's {'losses', 'held_out', ...}."""
    state_policy, serve = POLICIES[policy]
    spec = {"optimizer": optimizer, "address": address, "job": job or f"lm-{policy}",
            "state_policy": state_policy, "serve": serve}
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        mp.spawn(_rank_main, args=(s, spec, _free_port(), out_path), nprocs=s.world_size)
        with open(out_path) as f:
            return json.load(f)


def relative(a, b):
    return abs(a - b) / abs(b)


def compare(reference, result):
    """(max per-step relative difference of the loss, relative difference of the held-out
    loss) of a paramd run against the torch run."""
    per_step = max(relative(a, b) for a, b in zip(result["losses"], reference["losses"]))
    return per_step, relative(result["held_out"], reference["held_out"])


_COLORS = {"torch": (0, 0, 0), "fp32": (31, 119, 180), "fp8": (214, 39, 40),
           "fp8_all": (44, 160, 44)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemon", help="paramd binary (default: $PARAMD_BINARY or PATH)")
    parser.add_argument("--address", help="use a running daemon instead of starting one")
    parser.add_argument("--policy", action="append", choices=sorted(POLICIES),
                        help="paramd policies to run (repeatable; default fp32 and fp8)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--plot", help="write the loss curves to this PNG")
    args = parser.parse_args()
    policies = args.policy or ["fp32", "fp8"]
    s = Settings(steps=args.steps)

    from paramd.daemon import Daemon
    daemon = None if args.address else Daemon(args.daemon, step_threads=1)
    address = args.address or daemon.address
    try:
        results = {"torch": run(s, "torch")}
        for policy in policies:
            results[policy] = run(s, "paramd", policy, address)
    finally:
        if daemon is not None:
            daemon.stop()

    names = list(results)
    print("step  " + "  ".join(f"{n:>9}" for n in names))
    for step in range(s.steps):
        print(f"{step:4d}  " + "  ".join(f"{results[n]['losses'][step]:9.5f}" for n in names))
    print("held  " + "  ".join(f"{results[n]['held_out']:9.5f}" for n in names))
    for policy in policies:
        per_step, held = compare(results["torch"], results[policy])
        print(f"{policy}: max per-step relative loss difference {per_step:.2e}, held-out "
              f"{held:.2e}, {results[policy]['seconds']:.2f} s (torch "
              f"{results['torch']['seconds']:.2f} s)")
    if args.plot:
        png.plot_curves(args.plot, [(results[n]["losses"], _COLORS[n]) for n in names])
        print(f"wrote {args.plot}: " + ", ".join(
            f"{n} = rgb{_COLORS[n]}" for n in names))


if __name__ == "__main__":
    main()
