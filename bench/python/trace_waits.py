"""Where a profiled training step leaves the GPU idle, read from a torch.profiler Chrome trace
(lm_gpu_bench.py --profile --trace=PREFIX writes one per row).

    python3 bench/python/trace_waits.py PREFIX.paramd.json [--min_ms 0.2]

Prints the trainer's GPU busy time against the wall clock of the profiled steps, the idle gaps
on its GPU longer than --min_ms (what the host was doing when each began), and the host calls
that blocked on the device (synchronizations, blocking copies), each with the Python frames
around it when the trace holds them (with_stack). A gap the trainer's own kernels leave is either
the host falling behind (no wait around it) or the GPU running another process's work (the
daemon's step: its kernels are not in the trainer's trace).
"""

import argparse
import json
import sys

BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
            "cudaMemcpy", "cudaMemcpyAsync", "cudaStreamWaitValue", "cuStreamWaitValue")


def load(path):
    with open(path) as f:
        trace = json.load(f)
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--min_ms", type=float, default=0.2)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    events = load(args.trace)
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    if not gpu:
        print("no GPU events in the trace")
        return 1
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    python = [e for e in events if e.get("cat") == "python_function"]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    start, end = gpu[0]["ts"], max(e["ts"] + e["dur"] for e in gpu)
    busy, gaps, reach = 0.0, [], gpu[0]["ts"]
    for e in gpu:
        if e["ts"] > reach:
            gaps.append((reach, e["ts"] - reach))
        busy += max(0.0, e["ts"] + e["dur"] - max(e["ts"], reach))
        reach = max(reach, e["ts"] + e["dur"])
    wall = end - start
    print(f"trainer GPU: {len(gpu)} kernels and copies, busy {busy / 1e3:.1f} ms of "
          f"{wall / 1e3:.1f} ms ({100 * busy / wall:.0f} %)")
    long = sorted((g for g in gaps if g[1] >= args.min_ms * 1e3), key=lambda g: -g[1])
    print(f"idle gaps >= {args.min_ms} ms: {len(long)}, {sum(g[1] for g in long) / 1e3:.1f} ms "
          f"in all; the longest:")

    def around(t, pool):
        inside = [e for e in pool if e["ts"] <= t <= e["ts"] + e["dur"]]
        inside.sort(key=lambda e: e["ts"])
        return [e["name"] for e in inside][-4:]

    for t, d in long[:args.top]:
        ops = around(t, cpu_ops) or ["(no torch op)"]
        calls = [e for e in runtime if e["ts"] <= t <= e["ts"] + e["dur"]]
        print(f"  {d / 1e3:6.2f} ms at +{(t - start) / 1e3:7.1f} ms: host in "
              f"{' > '.join(ops)}" + (f"; blocked in {calls[0]['name']}" if calls else ""))
    waits = [e for e in runtime if e["name"].startswith(BLOCKING) and e["dur"] >= args.min_ms * 1e3]
    print(f"host calls that blocked >= {args.min_ms} ms: {len(waits)}, "
          f"{sum(e['dur'] for e in waits) / 1e3:.1f} ms in all")
    for e in sorted(waits, key=lambda e: -e["dur"])[:args.top]:
        frames = around(e["ts"], python)
        ops = around(e["ts"], cpu_ops)
        print(f"  {e['dur'] / 1e3:6.2f} ms {e['name']} at +{(e['ts'] - start) / 1e3:7.1f} ms: "
              f"{' > '.join(ops) or '(no torch op)'}")
        for f in frames:
            print(f"      {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
