"""A Llama trained through one cuda:0 daemon and through two (the job sharded over both, with
sharded_device_path), on the same batches, in one process: each run's losses, and whether its
final weights are bit-identical to the first run's. The check behind an open question: one run of
lm_gpu_bench's paramd_sharded2 row ended far from the one daemon's loss, which this has not
reproduced (a small Llama: bit-identical over 24 pipelined steps, gradients lent and copied; the
1.1e9-parameter one: within 0.013 after 23 steps, its backward not being deterministic).

    PYTHONPATH=.bundle/python PARAMD_BINARY=.bundle/bin/paramd-daemon \\
        python3 bench/python/sharded_gpu_check.py [--big]
"""

import os
import sys

import torch

import paramd.torch
from paramd.daemon import Daemon

BIG = "--big" in sys.argv
VOCAB = 32000 if BIG else 3200


def model_of():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(3)
    config = LlamaConfig(hidden_size=2048 if BIG else 256, intermediate_size=5632 if BIG else 512,
                         num_hidden_layers=22 if BIG else 4, num_attention_heads=32 if BIG else 8,
                         num_key_value_heads=4 if BIG else 2, vocab_size=VOCAB,
                         max_position_embeddings=2048 if BIG else 256, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        return LlamaForCausalLM(config)


def main():
    binary = os.environ.get("PARAMD_BINARY")
    generator = torch.Generator(device="cuda").manual_seed(1)
    tokens = [torch.randint(0, VOCAB, (4, 1024 if BIG else 128), device="cuda",
                            generator=generator) for _ in range(4)]
    daemons = [Daemon(binary, backend="cuda:0") for _ in range(3)]
    pair = sorted(d.address for d in daemons[1:])
    runs = [("one", dict(address=daemons[0].address), True)]
    for lend in ((True,) if BIG else (True, False)):
        runs.append(("two", dict(address=pair[0], daemons=pair, sharded_device_path=True), lend))
    results = []
    for index, (name, where, lend) in enumerate(runs):
        model = model_of()
        opt = paramd.torch.AdamW(model.named_parameters(), lr=1e-4 if BIG else 1e-3,
                                 weight_decay=0.1, job=f"check{index}", state_policy="fp8",
                                 serve=["bf16"], module=model, lend_gradients=lend, **where)
        losses = []
        for step in range(23 if BIG else 24):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=tokens[step % 4], labels=tokens[step % 4]).loss
            loss.backward()
            opt.step()
            model.zero_grad(set_to_none=True)
            losses.append(loss.detach())  # no host sync: the steps run pipelined, as in training
        opt.sync_weights()
        results.append((f"{name} lend={lend}", [p.detach().clone() for p in model.parameters()],
                        [x.item() for x in losses], opt.transport))
        opt.close()
        del model
    for label, _, losses, transport in results:
        print(label, transport, " ".join(f"{x:.4f}" for x in losses))
    first = results[0][1]
    for label, weights, _, _ in results:
        same = all(torch.equal(a, b) for a, b in zip(first, weights))
        most = max(float((a - b).abs().max()) for a, b in zip(first, weights))
        print(label, "bit-identical to the first run" if same else f"differs, at most {most:.3e}")
    for d in daemons:
        d.stop()


if __name__ == "__main__":
    main()
