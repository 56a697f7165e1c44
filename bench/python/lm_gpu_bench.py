"""Training throughput of a 1.1e9-parameter Llama on one GPU: paramd.torch.AdamW with a daemon on
the same GPU (`--backend=cuda:0`, cuda_ipc) against torch.optim.AdamW(fused=True) in the trainer,
and against no optimizer step at all (the ceiling), in one run.

    PYTHONPATH=.bundle/python python3 bench/python/lm_gpu_bench.py \\
        --daemon .bundle/bin/paramd-daemon

The model is transformers' LlamaForCausalLM (hidden 2048, 22 layers, 32 heads with 4 key-value
heads, MLP 5632, vocabulary 32000; random initial weights; --shape for another size) on batches
of 4 x 1024 random tokens, the same forward (bf16 autocast) in every row. Rows, each in a process
of its own (and a daemon of its own), --warmup steps then --steps timed steps, with the device
synchronized at both ends:
  none              forward + backward only: the ceiling
  none_bf16         the same with the parameters in bf16 (the ceiling of the paramd_bf16 rows)
  torch_fused       torch.optim.AdamW(fused=True) over the fp32 parameters
  torch_bf16_master the peer of the bf16 rows (Megatron's recipe): bf16 parameters, an FP32 master
                    copy with FP32 gradient buffers, torch.optim.AdamW(fused=True) over the master,
                    the new master cast into the bf16 parameters after each step
  paramd            paramd fp8 policy (fp32 master, fp8 exp_avg, fp16 exp_avg_sq), bf16
                    served, fp32 parameters in the trainer (its forward is torch's)
  paramd_fp32       the same policy, fp32 served, the fp32 parameters viewing the served bytes
                    in place (weights_in_place: no copy in the trainer; its forward is torch's)
  paramd_bf16       the same policy, the trainer's parameters in bf16 viewing the served bytes
                    in place (weights_in_place: what a trainer needs hold, and nothing more)
  paramd_fp8_gemm   paramd_bf16 plus fp8_tensor weights served for every decoder linear layer,
                    whose forward GEMMs run in FP8 (torch._scaled_mm): reported apart, its
                    forward differs
  paramd_host       the host tier (not in the default rows): a cpu daemon on this GPU's host
                    (--host_threads step threads, --host_policy, bf16 served), bf16 parameters;
                    gradients by DMA into its shared memory, weights by DMA straight into the
                    parameters (docs/host_tier.md). Its peer is torch_bf16_master; none_bf16 is
                    its memory floor
  paramd_host_stale the host tier with one step of staleness (staleness=1): the forward and
                    backward of step t+1 run on version t while the daemon computes version t+1
  paramd_host_copies the same through host copies (host_dma=False): the path before the host tier
  paramd_host_early paramd_host with early_step=True: the daemon steps each tensor as its
                    gradients land, the step after backward adopts those results
  paramd_host_early_gpuembed paramd_host_early with the token embedding's optimizer on the GPU
                    (Bf16MasterAdamW): the tensor backward writes last and the forward reads
                    first is stepped where it lies, off the host round trip
  paramd_host_early_cudaembed the same split with paramd on both sides: the token embedding a
                    job of its own on a second daemon on this GPU (--backend=cuda:0, cuda_ipc,
                    the same fp8 policy, its bf16 weights viewed in place), the rest on the host
                    tier; both *embed rows keep the first --gpu_layers decoder layers with it
  torchao_offload   torchao's CPUOffloadOptimizer (torch's fused AdamW on the CPU over pinned
                    copies of the bf16 parameters; its wheel on PYTHONPATH) (not in the default
                    rows): the host tier's peer among the alternatives
  deepspeed_offload DeepSpeed ZeRO-Offload (ZeRO stage 2, the optimizer offloaded to the CPU: its
                    FP32 master and moments in pinned host memory, stepped by DeepSpeedCPUAdam,
                    JIT-built at the row's start; its wheels on PYTHONPATH) with bf16 parameters,
                    one process of world size 1 (not in the default rows): the host tier's other
                    peer
  paramd_sharded2   paramd's job sharded over two cuda:0 daemons on the same GPU (not in the
                    default rows): the GPU path of a sharded job (sharded_device_path) (each owner's gradient rows
                    pushed from GPU memory, each owner's pieces viewed in place and a split
                    tensor put together on the device) against one daemon's
Peak memory is the GPU's used memory sampled every 10 ms through NVML (trainer, daemon and their
CUDA contexts) less what was used before the row began; torch's own peak is given beside it.
Prints a table and, with --json, writes the figures. Each row is compared with its peer in the same
round: rows with fp32 parameters with torch_fused, rows with bf16 parameters with
torch_bf16_master (tokens/s and peak memory). This machine's step times swing by up to 10 % from
one process to the next: --rounds N runs the rows in turn N times and gives medians, each ratio
taken against the peer's run of its own round.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROWS = ["none", "none_bf16", "torch_fused", "torch_bf16_master", "paramd", "paramd_fp32",
        "paramd_bf16", "paramd_fp8_gemm"]
BF16_ROWS = ("none_bf16", "torch_bf16_master", "paramd_bf16", "paramd_fp8_gemm", "paramd_host",
             "paramd_host_stale", "paramd_host_copies", "paramd_host_early",
             "paramd_host_early_gpuembed", "paramd_host_early_cudaembed", "torchao_offload",
             "deepspeed_offload")
HOST_ROWS = ("paramd_host", "paramd_host_stale", "paramd_host_copies", "paramd_host_early",
             "paramd_host_early_gpuembed", "paramd_host_early_cudaembed")


def peer_of(row):
    """The in-process optimizer a row is judged against: the same parameter dtype."""
    return "torch_bf16_master" if row in BF16_ROWS else "torch_fused"


class Bf16MasterAdamW:
    """bf16 parameters stepped through an FP32 master (Megatron's mixed-precision recipe, in
    process): FP32 master weights and FP32 gradient buffers beside the bf16 parameters, torch's
    fused AdamW over the master, the new master cast into the parameters."""

    def __init__(self, params, **options):
        import torch
        self.params = [p for p in params if p.requires_grad]
        with torch.no_grad():
            self.master = [p.detach().float() for p in self.params]
        for m in self.master:
            m.grad = torch.zeros_like(m)
        self.opt = torch.optim.AdamW(self.master, fused=True, **options)

    def step(self):
        import torch
        with torch.no_grad():
            torch._foreach_copy_([m.grad for m in self.master], [p.grad for p in self.params])
            self.opt.step()
            torch._foreach_copy_(self.params, self.master)


class WithGpuParams:
    """paramd's optimizer for most parameters and another one for a few on the GPU (in-process, or
    paramd's over a daemon on the GPU): the GPU's step queued first, then the host tier's."""

    def __init__(self, paramd_opt, gpu_opt):
        self.paramd_opt, self.gpu_opt = paramd_opt, gpu_opt

    def step(self):
        self.gpu_opt.step()
        self.paramd_opt.step()

    @property
    def timings(self):
        return self.paramd_opt.timings

    @timings.setter
    def timings(self, value):
        self.paramd_opt.timings = value

    def sync_weights(self):
        for opt in (self.gpu_opt, self.paramd_opt):
            if hasattr(opt, "sync_weights"):
                opt.sync_weights()

    def close(self):
        for opt in (self.gpu_opt, self.paramd_opt):
            if hasattr(opt, "close"):
                opt.close()

    def __getattr__(self, name):
        return getattr(self.paramd_opt, name)


BATCH, SEQ = 4, 1024
GPU_LAYERS = 0  # --gpu_layers
SHAPE = (2048, 22, 5632)  # hidden size, layers, MLP size (--shape): 1.1e9 parameters


def deepspeed_offload(model):
    """DeepSpeed's ZeRO-Offload over `model` (bf16 parameters) in a world of one: the engine,
    whose backward() and step() the row calls (step() zeroes the gradients)."""
    import socket
    import deepspeed
    with socket.socket() as s:  # a free port for the one-process group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                                "pin_memory": True},
                              "overlap_comm": True, "contiguous_gradients": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1,
                                                  "betas": [0.9, 0.999], "eps": 1e-8}},
        "gradient_clipping": 0.0,
        "steps_per_print": 1 << 30,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    return engine


def build_model(dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    hidden, layers, ffn = SHAPE
    config = LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 512,
                         vocab_size=32000,
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


def report_syncs(step, i):
    """Runs step(i) with torch's synchronization debugging on and prints where each operation that
    made the host wait for the device was called from (a host wait inside a step exposes every
    kernel queued before it, the optimizer's among them)."""
    import traceback
    import warnings
    import torch
    seen = {}

    def show(message, category, filename, lineno, file=None, line=None):
        stack = "".join(traceback.format_stack(limit=14)[:-2])
        seen.setdefault(stack, [str(message).splitlines()[0], 0])[1] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(i)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    print(f"SYNCS in one step: {sum(n for _, n in seen.values())}", file=sys.stderr)
    for stack, (message, n) in seen.items():
        print(f"--- {n}x {message}\n{stack}", file=sys.stderr)


def one_row(row, address, steps, warmup, profile=False, trace=None, sync_debug=False,
            daemons=None, policy="fp8"):
    """Trains `row` in this process; returns its figures."""
    import torch
    torch.cuda.set_device(0)
    dtype = torch.bfloat16 if row in BF16_ROWS else torch.float32
    model = build_model(dtype)
    params = sum(p.numel() for p in model.parameters())
    opt = None
    if row == "torch_fused":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    elif row == "torch_bf16_master":
        opt = Bf16MasterAdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    elif row == "torchao_offload":
        from torchao.optim import CPUOffloadOptimizer
        opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, fused=True, lr=1e-4,
                                  weight_decay=0.1)
    elif row == "deepspeed_offload":
        opt = deepspeed_offload(model)
    elif row.startswith("paramd"):
        import paramd.torch
        serve = {"paramd_fp8_gemm": ["bf16", "fp8_tensor"], "paramd_fp32": ["fp32"]}.get(
            row, ["bf16"])
        host = row in HOST_ROWS
        # The token embedding and the first --gpu_layers decoder layers: what backward writes last
        # and the next forward reads first.
        on_gpu = [model.model.embed_tokens.weight] + [
            p for layer in model.model.layers[:GPU_LAYERS] for p in layer.parameters()
        ] if row.endswith("embed") else []
        gpu_ids = {id(p) for p in on_gpu}
        named = [(n, p) for n, p in model.named_parameters() if id(p) not in gpu_ids]
        opt = paramd.torch.AdamW(named, lr=1e-4, weight_decay=0.1,
                                 address=address, job="llm",
                                 state_policy=policy if host else "fp8", serve=serve,
                                 module=model, daemons=None if host else daemons,
                                 sharded_device_path=daemons is not None and not host,
                                 weights_in_place=row not in ("paramd", "paramd_sharded2") + HOST_ROWS,
                                 host_dma=row != "paramd_host_copies",
                                 staleness=1 if row == "paramd_host_stale" else 0,
                                 early_step=row.startswith("paramd_host_early"))
        if row.endswith("_gpuembed"):
            opt = WithGpuParams(opt, Bf16MasterAdamW(on_gpu, lr=1e-4, weight_decay=0.1))
        elif row.endswith("_cudaembed"):
            first = [(n, p) for n, p in model.named_parameters() if id(p) in gpu_ids]
            embed = paramd.torch.AdamW(first, lr=1e-4, weight_decay=0.1, address=daemons[1],
                                       job="llm-embed", state_policy="fp8", serve=["bf16"],
                                       module=model, weights_in_place=True)
            opt = WithGpuParams(opt, embed)
        if row == "paramd_fp8_gemm":
            use_fp8_gemms(model, opt)
    g = torch.Generator(device="cuda").manual_seed(1)
    tokens = [torch.randint(0, 32000, (BATCH, SEQ), device="cuda", generator=g)
              for _ in range(4)]
    losses = []
    # The host's time in each phase (not the device's: nothing synchronizes inside a step), to
    # tell a device-bound step from one whose launches wait on the host.
    phases = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    # Where in the forward the host's time goes: the clock at each decoder layer's start and at
    # the head's, against the step's start (a host that blocks shows as one long interval).
    marks = []
    points = [0.0] * (len(model.model.layers) + 2)
    for module in list(model.model.layers) + [model.lm_head]:
        module.register_forward_pre_hook(lambda *_: marks.append(time.perf_counter()))

    engine = opt if row == "deepspeed_offload" else None
    forward = engine if engine is not None else model

    def step(i):
        t0 = time.perf_counter()
        marks.clear()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(input_ids=tokens[i % 4], labels=tokens[i % 4]).loss
        t1 = time.perf_counter()
        if engine is not None:
            engine.backward(loss)  # its gradients go to the host as backward makes them
        else:
            loss.backward()
        t2 = time.perf_counter()
        if opt is not None:
            opt.step()
        if engine is None:
            model.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if len(marks) == len(points) - 1:
            clock = [t0] + marks + [t1]
            for k in range(len(points)):
                points[k] += clock[k + 1] - clock[k]
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["step"] += t3 - t2
        return loss

    for i in range(warmup):
        losses.append(step(i).item())
    torch.cuda.synchronize()
    if sync_debug:
        report_syncs(step, warmup)
        torch.cuda.synchronize()
    if hasattr(opt, "timings"):
        opt.timings = {k: 0.0 for k in opt.timings}
    for key in phases:
        phases[key] = 0.0
    points[:] = [0.0] * len(points)
    started = time.perf_counter()
    for i in range(warmup, warmup + steps):
        last = step(i)
    if hasattr(opt, "sync_weights"):
        opt.sync_weights()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    losses.append(last.item())
    if profile:
        # Where the trainer's time goes: its GPU kernels and copies against the wall clock.
        from torch.profiler import ProfilerActivity, profile as torch_profile
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                           with_stack=bool(trace)) as prof:
            began = time.perf_counter()
            for i in range(3):
                step(i)
            torch.cuda.synchronize()
            wall = time.perf_counter() - began
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12),
              file=sys.stderr)
        busy = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3
        print(f"PROFILE {row}: wall {wall * 1e3 / 3:.1f} ms/step, trainer GPU busy "
              f"{busy / 3:.1f} ms/step", file=sys.stderr)
        if trace:
            prof.export_chrome_trace(f"{trace}.{row}.json")
    out = {"row": row, "params": params, "step_ms": 1e3 * seconds / steps,
           "tokens_per_s": BATCH * SEQ * steps / seconds,
           "torch_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
           "first_loss": losses[0], "last_loss": losses[-1]}
    for key, value in phases.items():
        out[f"host_{key}_ms"] = 1e3 * value / steps
    # [to the first layer, each layer, the head]: host milliseconds per timed step.
    out["host_forward_intervals_ms"] = [round(1e3 * p / steps, 2) for p in points]
    if opt is not None and hasattr(opt, "transport"):
        out["transport"] = opt.transport
        status = opt.daemon_status()[0]
        out["daemon_step_ms"] = 1e3 * status["last_step_seconds"]
        # What the daemon holds per parameter: its reservation (the budget a job takes).
        out["daemon_host_bytes_per_param"] = status["reserved_host_bytes"] / params
        out["daemon_state_bytes_per_param"] = status["state_bytes"] / params
        for key in ("early_steps_adopted", "early_steps_discarded", "early_steps_late"):
            if key in status:
                out[key] = status[key]
        # Per timed step: what step() waited for pushes, its commits, and what the forward
        # pre-hooks waited for the next version.
        for key, value in opt.timings.items():
            out[key.replace("_s", "_ms")] = 1e3 * value / steps
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
    parser.add_argument("--daemon_log", help="append each paramd row's daemon log to this file")
    parser.add_argument("--daemon_args", default="",
                        help="extra daemon flags, space-separated (e.g. --log_level=debug)")
    parser.add_argument("--profile", action="store_true",
                        help="profile 3 more steps of each row (torch.profiler) to stderr")
    parser.add_argument("--trace", help="with --profile: write each row's Chrome trace to "
                        "TRACE.<row>.json")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the rows in turn this many times (A B C A B C ...); the table "
                        "gives each row's median, and its ratio to torch_fused as the median of "
                        "the rounds' ratios (each against the torch_fused run of its round)")
    parser.add_argument("--sync_debug", action="store_true",
                        help="after the warm-up, run one more step with torch's synchronization "
                        "debugging on and print where each host wait on the device came from")
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences per step")
    parser.add_argument("--seq", type=int, default=SEQ, help="tokens per sequence")
    parser.add_argument("--shape", default=",".join(str(x) for x in SHAPE),
                        help="the Llama's hidden size, layers and MLP size (64-wide heads, one "
                        "key-value head per 8): 3072,36,8192 is about 3.7e9 parameters")
    parser.add_argument("--host_threads", type=int, default=0,
                        help="the host tier's daemon's step threads (0: the host's cores)")
    parser.add_argument("--host_policy", default="fp8", help="the host tier's state policy")
    parser.add_argument("--host_budget_gib", type=float, default=0,
                        help="the host tier's daemon's memory_budget_bytes, GiB (0: its default)")
    parser.add_argument("--gpu_layers", type=int, default=GPU_LAYERS,
                        help="the *embed rows: decoder layers kept on the GPU with the embedding")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--daemons", help=argparse.SUPPRESS)
    parser.add_argument("--switch_interval_ms", type=float,
                        help="the interpreter's thread switch interval (sys.setswitchinterval)")
    args = parser.parse_args()
    # one_row and the table read them
    globals().update(BATCH=args.batch, SEQ=args.seq, GPU_LAYERS=args.gpu_layers,
                     SHAPE=tuple(int(x) for x in args.shape.split(",")))
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    if args.one:
        daemons = args.daemons.split(",") if args.daemons else None
        print("RESULT " + json.dumps(one_row(args.one, args.address, args.steps, args.warmup,
                                             args.profile, args.trace, args.sync_debug,
                                             daemons, args.host_policy)))
        return 0

    from paramd.daemon import Daemon
    results = []
    rows = args.rows.split(",")
    for round_index, row in [(k, row) for k in range(args.rounds) for row in rows]:
        memory = PeakMemory()
        if row in HOST_ROWS:
            budget = []
            if args.host_budget_gib:  # set explicitly: a config file holds it
                import tempfile
                config = tempfile.NamedTemporaryFile("w", suffix=".textproto", delete=False)
                config.write(f"memory_budget_bytes: {int(args.host_budget_gib * 2**30)}\n")
                config.close()
                budget = [f"--config={config.name}"]
            daemon = Daemon(args.daemon, backend="cpu", step_threads=args.host_threads,
                            extra_args=args.daemon_args.split() + budget)
        elif row.startswith("paramd"):
            daemon = Daemon(args.daemon, backend="cuda:0", extra_args=args.daemon_args.split())
        else:
            daemon = None
        # The sharded row's second owner, or the cudaembed row's embedding daemon: another
        # daemon on the same GPU.
        other = Daemon(args.daemon, backend="cuda:0", extra_args=args.daemon_args.split()) if (
            row in ("paramd_sharded2", "paramd_host_early_cudaembed")) else None
        command = [sys.executable, os.path.abspath(__file__), "--one", row,
                   "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--batch", str(args.batch), "--seq", str(args.seq), "--shape", args.shape,
                   "--host_policy", args.host_policy, "--gpu_layers", str(args.gpu_layers)]
        if daemon is not None:
            command += ["--address", daemon.address]
        if other is not None:
            command += ["--daemons", f"{daemon.address},{other.address}"]
        if args.profile:
            command.append("--profile")
        if args.trace:
            command.append(f"--trace={args.trace}")
        if args.sync_debug:
            command.append("--sync_debug")
        if args.switch_interval_ms:
            command.append(f"--switch_interval_ms={args.switch_interval_ms}")
        done = subprocess.run(command, capture_output=True, text=True)
        if other is not None:
            other.stop()
        if daemon is not None:
            daemon.stop()
            if args.daemon_log:
                with open(args.daemon_log, "a") as f:
                    f.write(f"===== {row}\n{daemon.log()}")
        peak = memory.stop()
        lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(f"{row}: FAILED (exit {done.returncode})\n{done.stdout[-3000:]}"
                  f"{done.stderr[-3000:]}")
            if daemon is not None:
                print(daemon.log()[-2000:])
            results.append({"row": row, "round": round_index, "failed": True})
            continue
        result = json.loads(lines[-1][len("RESULT "):])
        if args.profile or args.sync_debug:
            print(done.stderr[-9000:])
        result["peak_gib"] = peak
        result["round"] = round_index
        results.append(result)
        print(json.dumps(result), flush=True)

    by_round = {(r["row"], r["round"]): r for r in results if not r.get("failed")}
    print()
    print("| row | step ms | tokens/s | x torch fused | peer | x peer | per round | peak GPU GiB "
          "(all) | peak x peer | torch peak GiB | last loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        runs = [r for r in results if r["row"] == row and not r.get("failed")]
        if not runs:
            print(f"| {row} | FAILED | | | | | | | | | |")
            continue

        def ratios(peer):
            return [r["tokens_per_s"] / by_round[(peer, r["round"])]["tokens_per_s"]
                    for r in runs if (peer, r["round"]) in by_round]

        def median(values):
            return f"{statistics.median(values):.3f}" if values else "-"

        peer = peer_of(row)
        to_peer = ratios(peer)
        rounds = " ".join(f"{x:.3f}" for x in to_peer) if len(to_peer) > 1 else ""
        peak = max(r["peak_gib"] for r in runs)
        peer_peaks = [r["peak_gib"] for r in results if r["row"] == peer and not r.get("failed")]
        peak_ratio = f"{peak / max(peer_peaks):.3f}" if peer_peaks else "-"
        step_ms = statistics.median(r["step_ms"] for r in runs)
        last = runs[-1]
        print(f"| {row} | {step_ms:.1f} | {BATCH * SEQ / step_ms:.1f}k | "
              f"{median(ratios('torch_fused'))} | {peer} | {median(to_peer)} | {rounds} | "
              f"{peak:.1f} | {peak_ratio} | {last['torch_peak_gib']:.1f} | "
              f"{last['last_loss']:.4f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(not r.get("failed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
