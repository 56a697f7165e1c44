#!/usr/bin/env python3
"""The torch peers of the GPU fused step (DESIGN.md §10), on the shape sets of
paramd_gpu_step_bench (1e9 parameters as one tensor, as 291 LLM-shaped tensors, as 10,000 small
tensors), timed with CUDA events (median) in the same run as paramd:

  torch_fused:   torch.optim.AdamW(fused=True) on fp32 parameters, gradients and states.
  torch_compile: torch.compile of the issue's job, tensor by tensor: fp32 master, bf16 gradient,
                 fp8 (E4M3) exp_avg and fp16 exp_avg_sq with a power-of-two scale per 128-element
                 chunk, the AdamW update, re-quantized moments, and the new weights quantized to
                 MXFP8 rowwise and columnwise (E8M0 scales per 32 elements). 1-D tensors (rows not
                 a multiple of 32) get no columnwise copy. Also DESIGN.md's reference setup, 64
                 tensors of 4096 x 4096 ("ref64").

Prints one JSON object per line (and writes them to --json).
"""
import argparse
import json
import math
import sys
import time

import torch


def shape_set(name):
    if name == "one":
        return [(245760, 4096)]
    if name == "llm":
        h, f, vocab = 1536, 4096, 32000
        s = [(vocab, h)]
        for _ in range(32):
            s += [(1, h)] + [(h, h)] * 4 + [(1, h), (f, h), (f, h), (h, f)]
        s += [(1, h), (vocab, h)]
        return s
    if name == "ref64":
        return [(4096, 4096)] * 64
    return [(256, 384)] * 10000


def time_cuda(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def fused_adamw(shapes, reps):
    params = [torch.randn(r, c, device="cuda") * 0.02 for r, c in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
    ms = time_cuda(opt.step, 3, reps)
    numel = sum(p.numel() for p in params)
    del opt, params
    torch.cuda.empty_cache()
    return ms, numel


E4M3 = torch.float8_e4m3fn
BETA1, BETA2, EPS, LR, WD, K = 0.9, 0.999, 1e-8, 1e-3, 0.01, 10
DECAY = 1 - LR * WD
STEP_SIZE = LR / (1 - BETA1**K)
BC2 = 1 / math.sqrt(1 - BETA2**K)


def pow2_scale(amax, top):
    s = torch.exp2(torch.floor(torch.log2(top / amax)))
    s = torch.where((amax > 0) & torch.isfinite(amax), s, torch.ones_like(s))
    return s.clamp(2.0**-126, 2.0**126)


def mx_codes(amax):
    e = torch.ceil(torch.log2(amax / 448.0))
    e = torch.where(amax > 0, e, torch.zeros_like(e))
    return e


def job_step(p, g, mq, ms, vq, vs, rowq, rows, colq, cols):
    R, C = p.shape
    g = g.float().view(-1, 128)
    m = mq.float().view(-1, 128) * ms.view(-1, 1)
    v = vq.float().view(-1, 128) * vs.view(-1, 1)
    m = BETA1 * m + (1 - BETA1) * g
    v = BETA2 * v + (1 - BETA2) * g * g
    pn = p.view(-1, 128) * DECAY - STEP_SIZE * m / (v.sqrt() * BC2 + EPS)
    s_m = pow2_scale(m.abs().amax(1, keepdim=True), 448.0)
    mq.copy_((m * s_m).to(E4M3).view(-1))
    ms.copy_((1.0 / s_m).view(-1))
    s_v = pow2_scale(v.abs().amax(1, keepdim=True), 32768.0)
    vq.copy_((v * s_v).half().view(-1))
    vs.copy_((1.0 / s_v).view(-1))
    pn = pn.view(R, C)
    p.copy_(pn)
    blocks = pn.view(R, C // 32, 32)
    e = mx_codes(blocks.abs().amax(-1, keepdim=True))
    rowq.copy_((blocks * torch.exp2(-e)).to(E4M3).view(R, C))
    rows.copy_((e + 127).clamp(0, 254).to(torch.uint8).view(R, C // 32))
    if colq is not None:
        blocks = pn.view(R // 32, 32, C)
        e = mx_codes(blocks.abs().amax(1, keepdim=True))
        colq.copy_((blocks * torch.exp2(-e)).to(E4M3).view(R, C))
        cols.copy_((e + 127).clamp(0, 254).to(torch.uint8).view(R // 32, C))


def compiled_job(shapes, reps, compiled=True):
    # Eager PyTorch runs the same function op by op (the issue asks for its ratio too).
    step = torch.compile(job_step, dynamic=False) if compiled else job_step
    tensors = []
    numel = 0
    for r, c in shapes:
        n = r * c
        numel += n
        has_col = r % 32 == 0
        t = dict(
            p=torch.randn(r, c, device="cuda") * 0.02,
            g=(torch.randn(r, c, device="cuda") * 1e-3).to(torch.bfloat16),
            mq=(torch.randn(n, device="cuda") * 10).to(E4M3),
            ms=torch.full((n // 128,), 2.0**-12, device="cuda"),
            vq=(torch.rand(n, device="cuda") * 1000).half(),
            vs=torch.full((n // 128,), 2.0**-24, device="cuda"),
            rowq=torch.empty(r, c, device="cuda", dtype=E4M3),
            rows=torch.empty(r, c // 32, device="cuda", dtype=torch.uint8),
            colq=torch.empty(r, c, device="cuda", dtype=E4M3) if has_col else None,
            cols=torch.empty(r // 32, c, device="cuda", dtype=torch.uint8) if has_col else None,
        )
        tensors.append(t)

    def run():
        for t in tensors:
            step(**t)

    start = time.time()
    run()  # compiles every distinct shape
    torch.cuda.synchronize()
    compile_s = time.time() - start
    ms = time_cuda(run, 1, reps)
    del tensors
    torch.cuda.empty_cache()
    return ms, numel, compile_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="one,llm,small")
    ap.add_argument("--peers", default="torch_fused,torch_compile")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    out = open(args.json, "w") if args.json else None

    def emit(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    emit({"kind": "peer_env", "torch": torch.__version__, "device": torch.cuda.get_device_name()})
    sets = args.sets.split(",")
    for peer in args.peers.split(","):
        for s in sets + (["ref64"] if peer == "torch_compile" else []):
            shapes = shape_set(s)
            reps = args.reps if s != "small" else max(2, args.reps // 4)
            try:
                if peer == "torch_fused":
                    ms, numel = fused_adamw(shapes, reps)
                    extra = {}
                elif peer == "torch_eager":
                    ms, numel, _ = compiled_job(shapes, reps, compiled=False)
                    extra = {}
                else:
                    ms, numel, compile_s = compiled_job(shapes, reps)
                    extra = {"compile_s": round(compile_s, 1)}
                emit(dict(kind="peer", peer=peer, set=s, tensors=len(shapes), numel=numel,
                          ms=round(ms, 4), gelems=round(numel / (ms * 1e-3) / 1e9, 2), **extra))
            except Exception as e:  # a peer that fails is reported, not fatal
                emit(dict(kind="peer", peer=peer, set=s, error=repr(e)[:300]))
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
