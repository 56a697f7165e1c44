"""Training throughput of a 1.1e9-parameter Llama on one GPU: paramd.torch.AdamW with a daemon on
the same GPU (`--backend=cuda:0`, cuda_ipc) against torch.optim.AdamW(fused=True) in the trainer,
and against no optimizer step at all (the ceiling), in one run.

    PYTHONPATH=.bundle/python python3 bench/python/lm_gpu_bench.py \\
        --daemon .bundle/bin/paramd-daemon

The model is transformers' LlamaForCausalLM (hidden 2048, 22 layers, 32 heads with 4 key-value
heads, MLP 5632, vocabulary 32000; random initial weights) on batches of 4 x 1024 random tokens,
the same forward (bf16 autocast) in every row. Rows, each in a process of its own (and a daemon
of its own), --warmup steps then --steps timed steps, with the device synchronized at both ends:
  none              forward + backward only: the ceiling
  torch_fused       torch.optim.AdamW(fused=True) over the fp32 parameters
  paramd            paramd fp8 policy (fp32 master, fp8 exp_avg, fp16 exp_avg_sq), bf16
                    served, fp32 parameters in the trainer (its forward is torch's)
  paramd_bf16       the same policy, the trainer's parameters in bf16 viewing the served bytes
                    in place (weights_in_place: what a trainer needs hold, and nothing more)
  paramd_fp8_gemm   paramd_bf16 plus fp8_tensor weights served for every decoder linear layer,
                    whose forward GEMMs run in FP8 (torch._scaled_mm): reported apart, its
                    forward differs
Peak memory is the GPU's used memory sampled every 10 ms through NVML (trainer, daemon and their
CUDA contexts) less what was used before the row began; torch's own peak is given beside it.
Prints a table and, with --json, writes the figures.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROWS = ["none", "torch_fused", "paramd", "paramd_bf16", "paramd_fp8_gemm"]
BATCH, SEQ = 4, 1024


def build_model(dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                         num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def use_fp8_gemms(model, opt):
    """Every decoder linear layer's forward GEMM in FP8 from the served fp8_tensor weights."""
    import torch.nn as nn
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "examples", "lm"))
    from train_lm import Fp8Matmul
    for name, module in model.model.layers.named_modules():
        if isinstance(module, nn.Linear):
            def forward(x, linear=module):
                served = opt.served(linear.weight, "fp8_tensor")
                y = Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), linear.weight, served.data,
                                    served.scale)
                if linear.bias is not None:
                    y = y + linear.bias
                return y.reshape(*x.shape[:-1], -1)
            module.forward = forward


def one_row(row, address, steps, warmup):
    """Trains `row` in this process; returns its figures."""
    import torch
    torch.cuda.set_device(0)
    dtype = torch.bfloat16 if row in ("paramd_bf16", "paramd_fp8_gemm") else torch.float32
    model = build_model(dtype)
    params = sum(p.numel() for p in model.parameters())
    opt = None
    if row == "torch_fused":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    elif row.startswith("paramd"):
        import paramd.torch
        serve = ["bf16", "fp8_tensor"] if row == "paramd_fp8_gemm" else ["bf16"]
        opt = paramd.torch.AdamW(model.named_parameters(), lr=1e-4, weight_decay=0.1,
                                 address=address, job="llm", state_policy="fp8", serve=serve,
                                 module=model, weights_in_place=dtype == torch.bfloat16)
        if row == "paramd_fp8_gemm":
            use_fp8_gemms(model, opt)
    g = torch.Generator(device="cuda").manual_seed(1)
    tokens = [torch.randint(0, 32000, (BATCH, SEQ), device="cuda", generator=g)
              for _ in range(4)]
    losses = []

    def step(i):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tokens[i % 4], labels=tokens[i % 4]).loss
        loss.backward()
        if opt is not None:
            opt.step()
        model.zero_grad(set_to_none=True)
        return loss

    for i in range(warmup):
        losses.append(step(i).item())
    torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(warmup, warmup + steps):
        last = step(i)
    if hasattr(opt, "sync_weights"):
        opt.sync_weights()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    losses.append(last.item())
    out = {"row": row, "params": params, "step_ms": 1e3 * seconds / steps,
           "tokens_per_s": BATCH * SEQ * steps / seconds,
           "torch_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
           "first_loss": losses[0], "last_loss": losses[-1]}
    if opt is not None and hasattr(opt, "transport"):
        out["transport"] = opt.transport
        out["pull_wait_ms"] = 1e3 * opt.timings["pull_wait_s"] / (warmup + steps)
        out["push_wait_ms"] = 1e3 * opt.timings["push_wait_s"] / (warmup + steps)
        opt.close()
    return out


class PeakMemory:
    """The GPU's used memory, sampled every 10 ms (NVML), as a peak over a baseline."""

    def __init__(self):
        import pynvml
        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.baseline = self._used()
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _used(self):
        return self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used

    def _run(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._used())

    def stop(self):
        self._stop.set()
        self._thread.join()
        return (self.peak - self.baseline) / 2**30


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemon", help="paramd binary (default: $PARAMD_BINARY or PATH)")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_row(args.one, args.address, args.steps, args.warmup)))
        return 0

    from paramd.daemon import Daemon
    results = []
    for row in args.rows.split(","):
        memory = PeakMemory()
        daemon = Daemon(args.daemon, backend="cuda:0") if row.startswith("paramd") else None
        command = [sys.executable, os.path.abspath(__file__), "--one", row,
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]
        if daemon is not None:
            command += ["--address", daemon.address]
        done = subprocess.run(command, capture_output=True, text=True)
        if daemon is not None:
            daemon.stop()
        peak = memory.stop()
        lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(f"{row}: FAILED (exit {done.returncode})\n{done.stdout[-3000:]}"
                  f"{done.stderr[-3000:]}")
            if daemon is not None:
                print(daemon.log()[-2000:])
            results.append({"row": row, "failed": True})
            continue
        result = json.loads(lines[-1][len("RESULT "):])
        result["peak_gib"] = peak
        results.append(result)
        print(json.dumps(result), flush=True)

    by_row = {r["row"]: r for r in results if not r.get("failed")}
    fused = by_row.get("torch_fused", {}).get("tokens_per_s")
    print()
    print("| row | step ms | tokens/s | x torch fused | peak GPU GiB (all) | torch peak GiB | "
          "last loss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if r.get("failed"):
            print(f"| {r['row']} | FAILED | | | | | |")
            continue
        ratio = f"{r['tokens_per_s'] / fused:.3f}" if fused else "-"
        print(f"| {r['row']} | {r['step_ms']:.1f} | {r['tokens_per_s'] / 1e3:.1f}k | {ratio} | "
              f"{r['peak_gib']:.1f} | {r['torch_peak_gib']:.1f} | {r['last_loss']:.4f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(not r.get("failed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
