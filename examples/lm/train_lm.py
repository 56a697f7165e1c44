"""Trains a small decoder-only transformer LM with 2 ranks, through paramd and with
torch.optim.AdamW, and compares the loss curves.

    python examples/lm/train_lm.py --daemon build/server/paramd --policy fp32 --policy fp8 \
        --plot lm_loss.png
    python examples/lm/train_lm.py --device cuda --policy fp32 --policy fp8_gemm --plot lm.png
    python examples/lm/train_lm.py --policy fp32 --staleness 0 --staleness 1

With --device cuda both ranks train on GPU 0 (gloo still carries the few scalars and DDP's
all-reduce), the daemon it starts runs `--backend=cuda:0`, and gradients and weights move over
cuda_ipc. The fp32 policy is compared with torch AdamW in fp32; the other policies run under
bf16 autocast and are compared with torch AdamW under bf16 autocast. `fp8_gemm` computes the
blocks' linear layers' forward GEMMs with torch._scaled_mm from the daemon's served `fp8_tensor`
weights (the backward uses the bf16 weights).

Each run is `world_size` processes (torch.multiprocessing spawn, gloo) training the same model
from the same seed on the same batches: the torch run averages gradients with
DistributedDataParallel and steps torch.optim.AdamW; a paramd run swaps in paramd.torch.AdamW
(gradients stream to a real daemon during backward, each layer's new weights are pulled before
its forward). Both use two param groups (no decay for biases, norms and embeddings) and a
warm-up + cosine LambdaLR. Rank 0 prints per-step losses (the mean over ranks) and a held-out
loss at the end; --plot writes every curve to a PNG. `--staleness 1` runs the paramd policies
with paramd.torch.AdamW(staleness=1) (each forward one version behind, so it never waits for the
step committed just before); given twice, `--staleness 0 --staleness 1`, it runs both.
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
    # The fp8 policy, with bf16 weights in the parameters and fp8_tensor weights for the forward
    # GEMMs of the blocks' linear layers (CUDA only: torch._scaled_mm).
    "fp8_gemm": ("fp8", ["bf16", "fp8_tensor"]),
}
FP8_GEMM_POLICIES = ("fp8_gemm",)


class Settings:
    """Everything that fixes a run; the same for the torch run and the paramd runs."""

    def __init__(self, steps=40, world_size=2, batch=16, context=32, d_model=64, heads=4,
                 layers=2, lr=3e-3, warmup=5, weight_decay=0.1, seed=1, threads=1, device="cpu"):
        self.steps, self.world_size, self.batch, self.context = steps, world_size, batch, context
        self.d_model, self.heads, self.layers = d_model, heads, layers
        self.lr, self.warmup, self.weight_decay, self.seed = lr, warmup, weight_decay, seed
        self.threads = threads
        self.device = device


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
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
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


def held_out_loss(model, tokens, s, autocast):
    with torch.no_grad():
        losses = []
        for k in range(4):
            x, y = (t.to(s.device) for t in batch(tokens, s, 10_000 + k, 0))
            with _autocast(s, autocast):
                loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
            losses.append(loss.item())
    return sum(losses) / len(losses)


def _autocast(s, enabled):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=enabled and s.device == "cuda")


class Fp8Matmul(torch.autograd.Function):
    """y = x @ W^T with the forward GEMM in FP8: x quantized per tensor here, W as the daemon
    served it (fp8_tensor data and scale_inv); the backward computes in bf16 from `weight`."""

    @staticmethod
    def forward(ctx, x, weight, w_data, w_scale_inv):
        ctx.save_for_backward(x, weight)
        amax = x.detach().abs().amax().float()
        x_scale_inv = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        xq = (x.float() / x_scale_inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, w_data.t(), scale_a=x_scale_inv.reshape(1, 1),
                                scale_b=w_scale_inv.reshape(1, 1), out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        w = weight.to(torch.bfloat16)
        grad_x = (grad.to(torch.bfloat16) @ w).to(x.dtype)
        grad_w = (grad.to(torch.bfloat16).t() @ x.to(torch.bfloat16)).to(weight.dtype)
        return grad_x, grad_w, None, None


def use_fp8_gemms(model, opt):
    """Routes the forward of every block linear layer through Fp8Matmul with the weights the
    optimizer loaded for it (paramd.torch.AdamW.served, fp8_tensor)."""
    for block in model.blocks:
        for linear in (block.qkv, block.proj, block.up, block.down):
            def forward(x, linear=linear):
                served = opt.served(linear.weight, "fp8_tensor")
                y = Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), linear.weight, served.data,
                                     served.scale)
                return (y + linear.bias).reshape(*x.shape[:-1], -1)
            linear.forward = forward


def _rank_main(rank, s, run, port, out_path):
    torch.set_num_threads(s.threads)
    if s.device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=s.world_size)
    train, held_out, vocab = dataset(s)
    torch.manual_seed(s.seed)
    model = TinyLM(vocab, s).to(s.device)
    autocast = run["autocast"]
    if run["optimizer"] == "torch":
        trained = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(param_groups(model, s, named=False), lr=s.lr, betas=(0.9, 0.95))
    else:
        import paramd.torch
        trained = model
        opt = paramd.torch.AdamW(param_groups(model, s, named=True), lr=s.lr, betas=(0.9, 0.95),
                                 address=run["address"], job=run["job"],
                                 state_policy=run["state_policy"], serve=run["serve"],
                                 module=model, seed=s.seed, staleness=run["staleness"])
        if run["policy"] in FP8_GEMM_POLICIES:
            use_fp8_gemms(model, opt)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(s))
    losses, started = [], time.perf_counter()
    for step in range(s.steps):
        x, y = (t.to(s.device) for t in batch(train, s, step, rank))
        with _autocast(s, autocast):
            loss = F.cross_entropy(trained(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses.append(mean_over_ranks(loss.item()))
    seconds = time.perf_counter() - started
    if run["optimizer"] != "torch":
        opt.sync_weights()
    result = {"losses": losses,
              "held_out": mean_over_ranks(held_out_loss(model, held_out, s, autocast)),
              "seconds": seconds}
    if run["optimizer"] != "torch":
        # What the daemon really kept and served, so a test can tell a policy was in effect.
        result["state_policy"] = opt.daemon_status()[0]["state_policy"]
        result["served_dtype"] = str(opt.served(model.head.weight).data.dtype)
        result["transport"] = opt.transport
        result["pull_wait_s"] = opt.timings["pull_wait_s"]  # rank 0's waits for weights
        opt.close()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(s, optimizer="torch", policy="fp32", address=None, job=None, autocast=None, staleness=0):
    """Trains with `world_size` spawned ranks; returns rank 0's {'losses', 'held_out', ...}.
    On CUDA every policy but fp32 runs under bf16 autocast unless `autocast` says otherwise.
    `staleness` is paramd.torch.AdamW's (a paramd run's)."""
    state_policy, serve = POLICIES[policy]
    if autocast is None:
        autocast = s.device == "cuda" and policy != "fp32"
    if policy in FP8_GEMM_POLICIES and s.device != "cuda":
        raise ValueError(f"policy {policy} computes FP8 GEMMs on the GPU: use --device cuda")
    spec = {"optimizer": optimizer, "address": address,
            "job": job or f"lm-{policy}" + (f"-stale{staleness}" if staleness else ""),
            "state_policy": state_policy, "serve": serve, "policy": policy,
            "autocast": autocast, "staleness": staleness}
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


_COLORS = {"torch": (0, 0, 0), "torch_bf16": (127, 127, 127), "fp32": (31, 119, 180),
           "fp8": (214, 39, 40), "fp8_all": (44, 160, 44), "fp8_gemm": (148, 103, 189)}


def run_name(policy, staleness):
    """A paramd run's name in the tables: the policy, `+stale1` with staleness 1."""
    return policy + (f"+stale{staleness}" if staleness else "")


def color_of(name):
    """A run's curve colour: its policy's, lighter with staleness."""
    color = _COLORS[name.split("+")[0]]
    return color if "+" not in name else tuple((c + 255) // 2 for c in color)


def reference_of(s, policy):
    """The torch run a policy is compared with: fp32, or bf16 autocast on CUDA."""
    return "torch_bf16" if s.device == "cuda" and policy != "fp32" else "torch"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemon", help="paramd binary (default: $PARAMD_BINARY or PATH)")
    parser.add_argument("--address", help="use a running daemon instead of starting one")
    parser.add_argument("--policy", action="append", choices=sorted(POLICIES),
                        help="paramd policies to run (repeatable; default fp32 and fp8)")
    parser.add_argument("--staleness", type=int, action="append", choices=(0, 1),
                        help="paramd.torch.AdamW's staleness for the paramd runs (repeatable: "
                             "each policy runs once per value; default 0)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the ranks train (cuda: GPU 0, daemon on --backend=cuda:0)")
    parser.add_argument("--plot", help="write the loss curves to this PNG")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU, and torch sees none "
                     f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
    policies = args.policy or (["fp32", "fp8_gemm"] if args.device == "cuda" else ["fp32", "fp8"])
    s = Settings(steps=args.steps, device=args.device)
    stalenesses = args.staleness or [0]

    from paramd.daemon import Daemon
    backend = "cuda:0" if args.device == "cuda" else "cpu"
    daemon = None if args.address else Daemon(args.daemon, backend=backend, step_threads=1)
    address = args.address or daemon.address
    try:
        results = {"torch": run(s, "torch", autocast=False)}
        if any(reference_of(s, p) == "torch_bf16" for p in policies):
            results["torch_bf16"] = run(s, "torch", autocast=True)
        for policy in policies:
            for staleness in stalenesses:
                results[run_name(policy, staleness)] = run(s, "paramd", policy, address,
                                                           staleness=staleness)
    finally:
        if daemon is not None:
            daemon.stop()

    names = list(results)
    print("step  " + "  ".join(f"{n:>9}" for n in names))
    for step in range(s.steps):
        print(f"{step:4d}  " + "  ".join(f"{results[n]['losses'][step]:9.5f}" for n in names))
    print("held  " + "  ".join(f"{results[n]['held_out']:9.5f}" for n in names))
    for policy in policies:
        ref = reference_of(s, policy)
        for name in (run_name(policy, staleness) for staleness in stalenesses):
            r = results[name]
            per_step, held = compare(results[ref], r)
            print(f"{name} (against {ref}, transport {r['transport']}): max per-step relative "
                  f"loss difference {per_step:.2e}, final loss {r['losses'][-1]:.5f} "
                  f"({ref} {results[ref]['losses'][-1]:.5f}), held-out {r['held_out']:.5f} "
                  f"({held:.2e}), {r['seconds']:.2f} s ({ref} {results[ref]['seconds']:.2f} s; "
                  f"rank 0 waited {r['pull_wait_s']:.2f} s for weights)")
    if args.plot:
        png.plot_curves(args.plot, [(results[n]["losses"], color_of(n)) for n in names])
        print(f"wrote {args.plot}: " + ", ".join(
            f"{n} = rgb{color_of(n)}" for n in names))


if __name__ == "__main__":
    main()
