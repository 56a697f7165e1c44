#!/usr/bin/env python3
"""Joins paramd_gpu_step_bench's and peer_torch_adam.py's JSON lines into the short table
scripts/gpu.sh prints last: per shape set, paramd's issue policy (best tuning) in GB/s, its ratio
to the copy ceiling of the same run, G elements/s, and its elements/s over each peer's.

  report.py BENCH_JSON PEERS_JSON
"""
import json
import sys


def load(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    except OSError:
        pass
    return rows


def main():
    bench = load(sys.argv[1])
    peers = load(sys.argv[2]) if len(sys.argv) > 2 else []
    ceiling = next((r["gbs"] for r in bench if r["kind"] == "ceiling"), None)
    if ceiling is None:
        print("no benchmark results")
        return 1
    print(f"copy ceiling (cudaMemcpyAsync D2D 4 GiB, read+write): {ceiling:.0f} GB/s")
    peer = {(r["peer"], r["set"]): r for r in peers if r.get("kind") == "peer" and "ms" in r}
    for r in peers:
        if r.get("kind") == "peer" and "error" in r:
            print(f"peer {r['peer']} on {r['set']} failed: {r['error']}")
    hdr = (f"{'set':6} {'policy':6} {'tensors':>7} {'ms':>8} {'GB/s':>6} {'of copy':>7} "
           f"{'Gelem/s':>8} {'torch fused':>12} {'x fused':>8} {'compile':>8} {'x compile':>9} "
           f"{'eager':>7} {'x eager':>8}")
    print(hdr)
    for s in ("one", "llm", "small"):
        for policy in ("issue", "fp32"):
            cand = [r for r in bench if r["kind"] == "paramd" and r["set"] == s
                    and r["policy"] == policy]
            if not cand:
                continue
            best = min(cand, key=lambda r: r["ms"])
            fused = peer.get(("torch_fused", s))
            comp = peer.get(("torch_compile", s))
            eager = peer.get(("torch_eager", s)) if policy == "issue" else None
            e_g = f"{eager['gelems']:.2f}" if eager else "-"
            e_x = f"{best['gelems'] / eager['gelems']:.1f}x" if eager else "-"
            f_g = f"{fused['gelems']:.1f}" if fused else "-"
            f_x = f"{best['gelems'] / fused['gelems']:.2f}x" if fused else "-"
            c_g = f"{comp['gelems']:.1f}" if comp and policy == "issue" else "-"
            c_x = (f"{best['gelems'] / comp['gelems']:.2f}x" if comp and policy == "issue"
                   else "-")
            print(f"{s:6} {policy:6} {best['tensors']:7d} {best['ms']:8.3f} {best['gbs']:6.0f} "
                  f"{best['ratio']:7.3f} {best['gelems']:8.1f} {f_g:>12} {f_x:>8} {c_g:>8} "
                  f"{c_x:>9} {e_g:>7} {e_x:>8}  (tuning {best['tuning']})")
    ref = peer.get(("torch_compile", "ref64"))
    if ref:
        print(f"torch.compile reference setup (64 x 4096x4096): {ref['gelems']:.1f} Gelem/s")
    print("targets: issue policy >= 0.85 of copy; >= 1.6x torch fused (fp32 AdamW); "
          ">= 2x torch.compile of the same job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
