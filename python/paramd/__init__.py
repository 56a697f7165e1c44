"""paramd: Python client of the paramd optimizer daemon.

Low level (tensors in and out, no PyTorch optimizer semantics):

    import paramd
    client = paramd.connect("127.0.0.1:50051")
    client.register(job="lm", rank=0, world_size=1, tensors=[("w", 4, 8, "fp32")],
                    hyperparams=paramd.hyperparams(lr=1e-3), serve=["bf16"])
    paramd.upload_initial_weights(client, "lm", {"w": w})
    paramd.push_gradients(client, "lm", rank=0, step=0, grads={"w": w.grad})
    client.commit("lm", 0, 0, lr=1e-3, grad_scale=1.0)
    weight = paramd.pull(client, "lm", "w", "bf16", min_version=1)  # ServedWeight, zero-copy
    w.data.copy_(paramd.dequantize(weight))

A job sharded over several daemons names them all in register(daemons=[...]), each as it
advertises itself (paramd --advertise_address), in any order; every rank gives the same list. The
client still talks to the daemon it connected to alone (no fan-out to the owners yet).

The optimizer a training loop swaps in for torch.optim.AdamW is paramd.torch.AdamW.
"""

from paramd._paramd import Client, PulledBatch, PulledBytes, PulledView, StatusError
# The CMake project's version, compiled into the extension (the daemon's `--version` prints it).
from paramd._paramd import __version__

__all__ = [
    "Client", "PulledBatch", "PulledBytes", "PulledView", "StatusError", "byte_view", "connect",
    "dequantize", "hyperparams", "pull", "pull_in_place", "pull_in_place_many", "pull_many",
    "push_gradients", "served", "state_policy", "upload_initial_weights",
]

# Named state policies (DESIGN.md section 3); a dict with the keys below picks any other mix.
STATE_POLICIES = {
    "fp32": {},
    "bf16": {"exp_avg": "bf16", "exp_avg_sq": "bf16"},
    "fp16": {"exp_avg": "fp16", "exp_avg_sq": "fp16"},
    # fp8 exp_avg with a block-scaled fp16 exp_avg_sq: 3 + 1/16 bytes of moments per parameter.
    "fp8": {"exp_avg": "fp8", "exp_avg_sq": "fp16"},
    # Both moments fp8 (stochastic rounding of exp_avg_sq by default): 2 + 1/16 bytes.
    "fp8_all": {"exp_avg": "fp8", "exp_avg_sq": "fp8"},
    # A bit-exact FP32 master kept as the served bf16 plus a 16-bit remainder.
    "bf16_remainder": {"master": "bf16_remainder"},
}

_POLICY_KEYS = ("master", "exp_avg", "exp_avg_sq", "exp_avg_rounding", "exp_avg_sq_rounding")


def connect(address="127.0.0.1:50051", transport="auto", rpc_timeout_s=30.0,
            connect_timeout_s=10.0, max_attempts=5, cuda_stream=0, reconnect_timeout_s=0.0,
            lend_gradients=False, daemons_wait_s=120.0, daemons_count=0, token_file=None,
            token="", cuda_device=-1):
    """Connects to a daemon; waits up to connect_timeout_s for it to answer. A call keeps
    retrying a daemon that answers UNAVAILABLE (gone, or restarting) for reconnect_timeout_s
    (0: max_attempts tries). `cuda_stream` (an
    int, torch.cuda.Stream.cuda_stream; 0 = the default stream) is the stream gradients in GPU
    memory are written on: cuda_ipc's push copies wait for the work queued there. With
    `lend_gradients`, cuda_ipc lends gradients on the daemon's GPU instead of copying them: the
    daemon reads them where they lie when the step runs, and the caller keeps them unchanged
    until a pull of the step's version has returned (paramd.torch.AdamW does so). A register()
    with a list of daemons waits up to daemons_wait_s for every one of them to answer (they may
    start late; 0: no wait). A list entry "dns:NAME:PORT" stands for every address NAME resolves
    to (a Kubernetes headless Service's name): register() resolves it again until it gives
    daemons_count addresses (0: the first answer), within daemons_wait_s. A daemon started with a
    token file (paramd --token_file) takes calls that carry a token: `token_file` names a file
    holding it alone, mode 0600 (None: $PARAMD_TOKEN_FILE where set), or `token` gives it. The
    address may be "unix:PATH" for a daemon listening on a Unix socket. `cuda_device` (a CUDA
    device index; -1: none) is the trainer's GPU for a host-memory transport (shm): the daemon's
    segments are page-locked for it, gradients in its memory are pushed by DMA straight into
    their slots, and in-place views of served bytes can be copied to it by DMA; the client's
    transport_traits() then say reads_device_memory."""
    return Client(address, transport=transport, rpc_timeout_s=rpc_timeout_s,
                  connect_timeout_s=connect_timeout_s, max_attempts=max_attempts,
                  cuda_stream=cuda_stream, reconnect_timeout_s=reconnect_timeout_s,
                  lend_gradients=lend_gradients, daemons_wait_s=daemons_wait_s,
                  daemons_count=daemons_count, token_file=token_file, token=token,
                  cuda_device=cuda_device)


def state_policy(policy):
    """A policy name from STATE_POLICIES, or a dict of its keys -> the dict register() takes."""
    if isinstance(policy, str):
        if policy not in STATE_POLICIES:
            raise ValueError(f"unknown state policy {policy!r}; one of {sorted(STATE_POLICIES)} "
                             f"or a dict with keys {_POLICY_KEYS}")
        return dict(STATE_POLICIES[policy])
    unknown = set(policy) - set(_POLICY_KEYS)
    if unknown:
        raise ValueError(f"unknown state policy keys {sorted(unknown)}; keys: {_POLICY_KEYS}")
    return dict(policy)


def hyperparams(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
    return {"lr": float(lr), "betas": (float(betas[0]), float(betas[1])), "eps": float(eps),
            "weight_decay": float(weight_decay)}


def upload_initial_weights(client, job, weights):
    """Rank 0, once: {name: float32 tensor} as version 0 (read in place, not copied)."""
    client.upload_initial_weights(
        job, [(name, byte_view(t.detach().float())) for name, t in weights.items()])


def push_gradients(client, job, rank, step, grads):
    """{name: gradient tensor (fp32 or bf16, as registered)}, read in place."""
    client.push_gradients(job, rank, step, [(name, byte_view(g)) for name, g in grads.items()])


def pull(client, job, tensor, fmt="fp32", min_version=0, timeout_s=60.0):
    """Waits for `min_version` and returns the served weight as a ServedWeight (no copy)."""
    return served(client.pull(job, tensor, fmt, min_version, timeout_s))


def pull_in_place(client, job, tensor, fmt="fp32", min_version=0, timeout_s=60.0, lease_s=0.0):
    """Waits for `min_version` and views the served weight where it lies as a ServedWeight: no
    copy at all. Over shm its tensors are CPU tensors over the daemon's shared memory; over
    cuda_ipc CUDA tensors over the daemon's GPU memory (queue the work that reads them before
    the lease ends). The view holds a lease on the bytes; its tensors keep the view alive, so the
    lease ends when they go (or at client.pull_in_place(...).release(), or after `lease_s`, 0 =
    the daemon's default). Until then the bytes are unchanged while later steps run; a tensor
    used after its lease ended reads whatever a later step writes there. Read-only: do not write
    into it. Raises StatusError FAILED_PRECONDITION on a transport that cannot read in place
    (inline)."""
    return served(client.pull_in_place(job, tensor, fmt, min_version, timeout_s, lease_s))


def pull_in_place_many(client, job, tensors, fmt="fp32", min_version=0, timeout_s=60.0,
                       lease_s=0.0):
    """pull_in_place of several tensors in one call: {name: ServedWeight}. They are sliced from
    one tensor per region of the daemon's memory (client.pull_in_place_batch), and their leases
    end together, once every one of them is gone."""
    from paramd import _formats
    batch = client.pull_in_place_batch(job, list(tensors), fmt, min_version, timeout_s, lease_s)
    return dict(zip(tensors, _formats.served_batch(batch)))


def pull_many(client, job, tensors, fmt="fp32", min_version=0, timeout_s=60.0):
    """Several tensors in one call: {name: ServedWeight}, each as soon as its step published it."""
    pulled = client.pull_many(job, list(tensors), fmt, min_version, timeout_s)
    return {name: served(p) for name, p in zip(tensors, pulled)}


# The tensor helpers need torch; they are imported on first use so that the bindings alone work
# without it.
def byte_view(tensor):
    """The bytes of a tensor in place: a uint8 numpy array (CPU) or a flat uint8 CUDA tensor."""
    from paramd import _formats
    return _formats.byte_view(tensor)


def served(pulled):
    """A PulledBytes viewed as a ServedWeight (torch tensors over the same memory)."""
    from paramd import _formats
    return _formats.served(pulled)


def dequantize(weight):
    """A ServedWeight as float32 [rows, cols]."""
    from paramd import _formats
    return _formats.dequantize(weight)
