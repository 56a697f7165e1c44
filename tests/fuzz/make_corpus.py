#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz (a few valid inputs per target) into tests/fuzz/corpus/.

Run from anywhere: python3 tests/fuzz/make_corpus.py (needs protoc for the RegisterRequest seeds).
The push_fuzz seeds follow the encoding of push_fuzz.cc's ReadOp.
"""
import pathlib
import shutil
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"

CONFIGS = {
    "minimal.textproto": 'listen: "127.0.0.1:0"\n',
    "limits.textproto": (
        'listen: "0.0.0.0:50051"\nmetrics_listen: ""\nstep_threads: 2\nmax_chunk_bytes: 65536\n'
        "max_message_bytes: 131072\nmax_tensors_per_job: 16\nmax_job_bytes: 1073741824\n"
        'max_jobs: 2\npull_chunk_bytes: 4096\nlog_level: "debug"\naddress_file: "/tmp/paramd.addr"\n'
    ),
}

HYPER = "hyperparams { lr: 0.001 beta1: 0.9 beta2: 0.999 eps: 1e-08 weight_decay: 0.01 }"
REGISTRATIONS = {
    "fp32.txt": f'job: "j" world_size: 1 tensors {{ name: "w" rows: 4 cols: 8 grad_type: '
    f"ELEMENT_TYPE_FP32 }} {HYPER}",
    "policies.txt": f'job: "big-job.1" rank: 2 world_size: 4 tensors {{ name: "layer/0:w" rows: 130 '
    f'cols: 33 grad_type: ELEMENT_TYPE_BF16 }} tensors {{ name: "b" rows: 1 cols: 33 grad_type: '
    f"ELEMENT_TYPE_FP32 }} {HYPER} state_policy {{ master: MASTER_TYPE_BF16_REMAINDER exp_avg: "
    f"MOMENT_TYPE_FP8 exp_avg_sq: MOMENT_TYPE_FP16 exp_avg_sq_rounding: ROUNDING_STOCHASTIC }} "
    f"serve {{ recipe: RECIPE_MXFP8 direction: DIRECTION_COLUMNWISE }} serve {{ recipe: "
    f"RECIPE_FP8_DELAYED amax_history: 8 margin: 1 }} seed: 42 max_grad_norm: 1.0",
    "serve_all.txt": f'job: "s" rank: 1 world_size: 2 tensors {{ name: "t" rows: 3 cols: 129 '
    f"grad_type: ELEMENT_TYPE_FP32 }} {HYPER} serve {{ recipe: RECIPE_BF16 }} serve {{ recipe: "
    f"RECIPE_FP16 direction: DIRECTION_COLUMNWISE }} serve {{ recipe: RECIPE_FP8_TENSOR }} "
    f"serve {{ recipe: RECIPE_FP8_BLOCK direction: DIRECTION_COLUMNWISE }} push_mode: PUSH_MODE_FULL",
}

# push_fuzz: kinds in the low 2 bits of an op's first byte; no raw fields here.
PUSH_GRADIENT, PUSH_WEIGHTS, COMMIT, REGISTER = range(4)
TENSORS = 3  # w (3x5 fp32), b (1x7 bf16), p (129x2 fp32)


def register(rank):
    return [REGISTER, rank + 1]


def push(kind, rank, step, tensor, offset=0, length=0, variant=0):
    """length 0 = to the tensor's end; offset and length are even byte counts up to 510."""
    return [kind, rank + 1, step + 1, tensor, offset // 2, length // 2, variant]


def commit(rank, step, lr=0, grad_scale=0):
    """lr index: 0 none, 2 1e-3, 3 2e-3; grad_scale index: 0 none, 2 0.5, 3 1."""
    return [COMMIT, rank + 1, step + 1, lr, grad_scale]


def full_step(world, step, lr=0, grad_scale=0, split_p=False):
    ops = []
    for rank in range(world):
        for tensor in range(TENSORS):
            if tensor == 2 and split_p:
                ops += push(PUSH_GRADIENT, rank, step, 2, 0, 508, variant=rank)
                ops += push(PUSH_GRADIENT, rank, step, 2, 508, 0, variant=rank)
            else:
                ops += push(PUSH_GRADIENT, rank, step, tensor, variant=rank)
    for rank in range(world):
        ops += commit(rank, step, lr, grad_scale)
    return ops


def job(spec, world, steps):
    ops = [spec]
    for rank in range(1, world):
        ops += register(rank)
    for tensor in range(TENSORS):
        ops += push(PUSH_WEIGHTS, 0, 0, tensor)
    for step in range(steps):
        ops += full_step(world, step, lr=2 if step % 2 else 0, grad_scale=2 if step else 0,
                         split_p=step % 2 == 1)
    return bytes(ops)


def encode(proto, message, text):
    return subprocess.run(["protoc", f"-I{ROOT / 'proto'}", f"--encode={message}", proto],
                          input=text.encode(), capture_output=True, check=True).stdout


def main():
    for target in ("config_fuzz", "register_fuzz", "push_fuzz"):
        shutil.rmtree(CORPUS / target, ignore_errors=True)
        (CORPUS / target).mkdir(parents=True)
    shutil.copy(ROOT / "deploy" / "paramd.example.textproto",
                CORPUS / "config_fuzz" / "example.textproto")
    for name, text in CONFIGS.items():
        (CORPUS / "config_fuzz" / name).write_text(text)
        # The same config serialized: config_fuzz also reads its bytes as a DaemonConfig.
        (CORPUS / "config_fuzz" / name.replace(".textproto", ".bin")).write_bytes(
            encode("paramd/v1/config.proto", "paramd.v1.DaemonConfig", text))
    for name, text in REGISTRATIONS.items():
        (CORPUS / "register_fuzz" / name.replace(".txt", ".bin")).write_bytes(
            encode("paramd/v1/control.proto", "paramd.v1.RegisterRequest", text))
    for spec, world in ((0, 2), (1, 2), (2, 1), (3, 3)):
        (CORPUS / "push_fuzz" / f"spec{spec}_steps.bin").write_bytes(job(spec, world, 3))


if __name__ == "__main__":
    main()
