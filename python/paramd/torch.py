"""paramd.torch.AdamW: a drop-in for torch.optim.AdamW whose state lives in a paramd daemon.

    opt = paramd.torch.AdamW(model.named_parameters(), lr=3e-4, weight_decay=0.1,
                             address="127.0.0.1:50051", job="lm",
                             state_policy="fp8", serve="bf16", module=model)
    for batch in data:
        loss = model(batch).mean()
        loss.backward()   # gradients stream to the daemon bucket by bucket as they appear
        opt.step()        # pushes what is left, commits (with this step's lr), returns
        opt.zero_grad()
        sched.step()      # any torch LR scheduler: the lr travels with each commit

What happens when:
- Construction registers every parameter ([rows, cols]; 1-D as [1, n]; N-D as [shape[0], rest])
  with the job; rank 0 uploads the initial weights; every rank then loads version 0, so all
  ranks start from the same (served) weights. Rank and world size come from torch.distributed
  when it is initialized. Each param group is a job of its own ("<job>.g<i>" beyond the first),
  since the daemon keeps one set of hyper-parameters per job.
- Backward: a post-accumulate-grad hook per parameter hands its gradient to a push thread in
  buckets of `bucket_bytes`; the pushes run while backward goes on (the GIL is released).
- step(): pushes gradients backward did not (parameters without a gradient push zeros), waits
  for the pushes, commits with lr = the group's lr and grad_scale = 1 / world_size (the mean,
  as DistributedDataParallel computes it), and starts a pull thread that fetches the new version
  tensor by tensor in forward order.
- Forward: with `module` given, a forward pre-hook on every module that owns parameters waits
  only for that module's tensors and writes them (dequantized) before it runs, so the first
  layers compute while later ones are still stepped and pulled (over cuda_ipc one pre-hook on
  `module` itself loads the whole version: see below). Without `module`, step() waits for all
  tensors before it returns.
- The job is served exactly the formats in `serve` (FP32 only when listed), and pays memory for
  those alone. Every one is pulled; the first one is written into the parameters; served() gives
  each as a ServedWeight (FP8 data as torch.float8_e4m3fn with its scales) for FP8 GEMMs.
- Several daemons, `daemons=[...]` (each "host:port" as it advertises itself, or "dns:NAME:PORT";
  `address` one of them): the job is sharded over them, each daemon holding its part, and every
  push, commit and pull goes to the owners (the client does it). The result is bit-identical to
  one daemon's, and so are state_dict() (put together from every daemon's part) and
  load_state_dict() (cut into the parts). CUDA parameters of a job whose every owner is reached
  over cuda_ipc take the GPU path as with one daemon: each owner's rows of a gradient are pushed
  (or lent) from GPU memory, and the weights are viewed where the owners serve them, one in-place
  pull per owner and format, a split tensor's pieces put together on the device (a copy).
  `sharded_device_path=False`, or an owner reached another way, moves them through host copies
  instead. A daemon of several backends (paramd --backend=cuda:all, or a list) is one owner per backend: a
  job given its address alone is sharded over them the same way.
- `push_mode="pre_reduced"`: the ranks sum their gradients among themselves with
  torch.distributed (its process group initialized first; NCCL for CUDA parameters, gloo for CPU
  ones) and exactly one rank pushes each owner's part: at step(), each owner's rows of each
  gradient are reduced into rank `owner mod world_size` (one reduce per piece, the job's layout
  giving the pieces; no padding), which pushes them. Backward then pushes nothing while it runs.
  The sum is the collective's, in its order, not the daemon's rank order: bit-identical to
  `full` for two ranks (one addition), within rounding for more. Gradients of the rows another
  rank pushes are left as the collective leaves them.
- A daemon with a token file (paramd --token_file): every call carries the trainer's token, read
  from `token_file` (None: $PARAMD_TOKEN_FILE), a file holding the token alone, mode 0600. The
  token's line must name the job (or a prefix of it): state_dict(), load_state_dict() and
  hyper-parameter changes go through it too.
- A daemon that restarts: with reconnect_timeout_s > 0 the calls wait that long for it. Once it
  answers again (its checkpoint_dir restored the job), the optimizer registers again, loads the
  version the daemon holds and goes back to the step it collects: `next_step` moves back, and the
  iteration under way pushes nothing. A loop whose batch is a function of `opt.next_step` ends
  bit-identical to a run without the restart, if it checks `opt.next_step` again after its final
  sync_weights() (a restart found there moves it back too). `restarts` counts them.
- `staleness=1` (opt-in; default 0): one step of staleness, for a daemon whose step takes about
  as long as a forward and backward (a cpu daemon). The forward and backward after step() run on
  the weights the parameters already hold, while the daemon steps; the gradients of step t+1
  are computed on version t, and iteration t+2's forward runs on version t+1 (iterations 0 and
  1 on version 0). The version a step() commits is pulled meanwhile and loaded by the next
  step(), before its commit (so the trainer waits only for the step committed an iteration
  earlier). sync_weights() (state_dict() and load_state_dict() too) loads the newest version,
  which the next iteration then runs on. A rank may then push step t+1 before a slower rank
  committed step t; the daemon refuses that push as ahead of its step, and the push thread
  waits (asking the job's status) until the job collects it. Host path only: CUDA parameters
  over cuda_ipc raise ValueError.
- `early_step=True` (opt-in; a cpu daemon with max_grad_norm 0): the daemon steps each tensor as
  its gradients land, during backward, into a second copy of its state that the commit adopts
  where its scalars were predicted right (the same bits as without it); costs the state's bytes
  again in the daemon's memory. A learning rate the loop changes (a schedule) is told to the
  daemon (set_hyperparams) before the step's first push, so the prediction holds.
- CUDA parameters, with the daemon on this node's GPU (`paramd --backend=cuda:N`; the automatic
  choice then picks cuda_ipc): gradients are lent, not copied. A push waits for nothing: it
  records an interprocess event on the current stream at construction (`cuda_stream`) and tells
  the daemon where each gradient lies and which event orders it; the daemon's step waits for the
  event on the GPU and reads them there. The daemon decides skip and clip on the GPU too, so
  neither process's host waits for backward. The optimizer keeps them alive until the step's version is loaded (the next
  forward), whose pull orders the current stream after the daemon's step, so their memory is
  reused only by work queued after the step read it. Do not write into gradients between step()
  and the next forward: zero_grad(set_to_none=False) loads the version first. With
  `lend_gradients=False` (or memory CUDA cannot share, such as PyTorch's expandable segments) the
  push copies them into the daemon's GPU slots instead. The new version is viewed
  where the daemon serves it (one in-place pull per job and format, sliced from a few block
  tensors, a lease per tensor) as soon as the daemon has queued its step: the current stream
  waits for that step on the GPU, not the host. The model's forward (`module`) first writes the
  whole version into the parameters, with device copies queued by one call; with
  `weights_in_place=True` a parameter whose dtype is the first format's views those bytes
  instead (no copy; do not write into it). Each version's views are let go once the next one is
  loaded and the work queued on them has run, so no lease outlives a step. A bf16 parameter
  pushes bf16 gradients; fp32 and fp16 ones push fp32.
- CUDA parameters with a daemon stepping in host memory (the cpu backend, over shm: the host
  tier, docs/host_tier.md): the GPU holds the weights and gradients alone. The client page-locks
  the daemon's shared-memory segments for this GPU once (`cuda_device`); gradients go
  device-to-host by DMA straight into their slots as backward produces them (a copy stream of the
  client's waits on the device for an event each bucket's gradient hook recorded on backward's
  stream, not for the rest of backward; the push thread, not the trainer's, waits for the copies,
  then marks them, so a gradient lands in the daemon while backward still runs); each new weight, as the daemon publishes it in forward order, goes
  host-to-device by DMA straight from the served bytes into its parameter where the parameter's
  dtype is the first format's (bf16 parameters with serve="bf16"), else into a GPU buffer that is
  dequantized into it; the other formats land in GPU buffers that served() gives. The copies wait
  on the GPU for the work queued before step() (the last forward and backward), and each module's
  forward pre-hook makes the current stream wait for its tensors' copies. So between step() and
  the next forward the parameters are being written: read them only after sync_weights().
  `host_dma=False` takes the host copies instead (as any other transport of host memory does).
"""

import contextlib
import queue
import threading
import time

import torch
import torch.distributed as dist

import paramd
from paramd import _formats

# Rank 0 uploads version 0 in groups of about this many bytes of FP32 (a whole tensor at least):
# the trainer holds one group's host copy at a time, not the model's, and each push is bounded.
_UPLOAD_GROUP_BYTES = 1 << 30


class _Tensor:
    """One registered parameter."""

    __slots__ = ("name", "param", "shape", "rows", "cols", "grad_type", "grad_dtype", "grad_nbytes",
                 "job", "pushed_step")

    def __init__(self, name, param, job):
        self.name = name
        self.param = param
        self.shape = tuple(param.shape)
        self.rows = self.shape[0] if len(self.shape) >= 2 else 1
        self.cols = max(1, param.numel() // self.rows)
        self.grad_type = _formats.grad_type_of(param.dtype)
        self.grad_dtype = torch.float32 if self.grad_type == "fp32" else torch.bfloat16
        self.grad_nbytes = self.rows * self.cols * self.grad_dtype.itemsize
        self.job = job
        self.pushed_step = -1

    def grad_tensor(self):
        """The gradient to push, in the pushed dtype (zeros where backward left none)."""
        grad = self.param.grad
        if grad is None:
            return torch.zeros(self.rows * self.cols, dtype=self.grad_dtype,
                               device=self.param.device)
        if grad.dtype != self.grad_dtype:
            return grad.to(self.grad_dtype)
        return grad

    def grad_bytes(self, direct, grad=None):
        """(bytes to push, their size, what must stay alive until pushed) of `grad` (default: the
        parameter's gradient, grad_tensor()). Where the transport reads the parameter's memory
        (`direct`: CUDA over cuda_ipc or nccl) the bytes are the GPU gradient's (address, size), read in
        place (nccl sends it from there); else a host view (of a host copy of a GPU gradient)."""
        grad = self.grad_tensor() if grad is None else grad
        if direct:
            # Few Python calls here: this runs in backward, once per parameter.
            if not grad.is_contiguous():
                grad = grad.contiguous()
            return (grad.data_ptr(), self.grad_nbytes), self.grad_nbytes, grad
        if grad.device.type == "cuda":
            grad = grad.cpu()
        data = _formats.byte_view(grad)
        return data, data.nbytes, None


class _Job:
    """One param group: its daemon job and client."""

    def __init__(self, name, client, group):
        self.name = name
        self.client = client
        self.group = group
        self.tensors = []
        self.registered = None  # hyper-parameters as registered (betas and eps cannot change)
        self.pieces = {}  # pre_reduced: tensor name -> [(owner index, first row, end row)]
        self.pushes = True  # pre_reduced: whether this rank pushes some owner's part
        # early_step: the lr the daemon predicts the next step with (the last commit's, or the
        # last one set); None: not known, told at the next push
        self.told_lr = None


class _Worker:
    """A thread that runs queued calls in order; the first error is kept and re-raised."""

    def __init__(self, name):
        self._queue = queue.Queue()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            call = self._queue.get()
            if call is None:
                return
            try:
                if self._error is None:
                    call()
            except BaseException as error:  # re-raised on the trainer's thread by wait()
                self._error = error
            finally:
                self._queue.task_done()

    def submit(self, call):
        self._queue.put(call)

    def wait(self):
        self._queue.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def drain(self):
        """Waits for the queued calls and forgets their error (their work was dropped)."""
        self._queue.join()
        self._error = None

    def close(self):
        self._queue.put(None)
        self._thread.join()


def _release_once_copied(copied, views):
    """Ends the leases of `views` once the copies before `copied` (a blocking CUDA event: the
    thread sleeps) have run. A release that fails is let go: its lease expires."""
    copied.synchronize()
    for view in views:
        try:
            view.release()
        except Exception:  # noqa: BLE001 - the daemon ends the lease at its expiry
            pass


class _PendingPull:
    """The pulled formats of one tensor for one version, filled by the pull thread (`weight`:
    the first format as float32 on the host path; None when `served` is written directly)."""

    __slots__ = ("version", "done", "weight", "served", "error", "copied")

    def __init__(self, version):
        self.version = version
        self.done = threading.Event()
        self.weight = None
        self.served = {}
        self.error = None
        self.copied = None  # host tier: a CUDA event after the copies to the GPU (None: none)


class _DeviceVersion:
    """One job's version viewed where the daemon serves it in GPU memory (cuda_ipc): per format a
    PulledBatch and its block tensors, filled by the pull thread. Every parameter of the job
    loads from it at once (the GPU backend publishes a step's tensors together); ServedWeights
    are sliced from the blocks when asked for. Holding it holds the version's leases."""

    __slots__ = ("version", "tensors", "index", "done", "error", "batches", "blocks", "weights",
                 "loaded", "lent", "pieces")

    def __init__(self, version, tensors, index):
        self.version = version
        self.tensors = tensors  # the job's, in forward order: the order pulled
        self.index = index  # tensor name -> position in `tensors`
        self.done = threading.Event()
        self.error = None
        self.batches = {}  # format -> paramd.PulledBatch
        self.blocks = {}  # format -> [uint8 CUDA tensor per block]
        self.weights = {}  # (name, format) -> ServedWeight, made on demand
        self.loaded = False
        self.lent = []  # gradients of the step before, lent to the daemon until this loads
        self.pieces = {}  # format -> per tensor, its spans in the batch (several: split)

    def _spans(self, fmt):
        """Per tensor, in order, the indexes of its spans in the format's batch: a tensor of a
        job sharded over several daemons may be split, its pieces consecutive spans in row order
        (a span whose row_begin is not 0 continues the tensor before it)."""
        spans = self.pieces.get(fmt)
        if spans is None:
            spans = []
            for i, row in enumerate(self.batches[fmt].row_begins):
                if row == 0 or not spans:
                    spans.append([i])
                else:
                    spans[-1].append(i)
            self.pieces[fmt] = spans
        return spans

    def _view(self, fmt, i):
        block, offset, fields = self.batches[fmt].spans[i]
        raw = self.blocks[fmt][block][offset:offset + fields[3] + fields[4]]
        return _formats.served_view(raw, fields)

    def served(self, name, fmt):
        weight = self.weights.get((name, fmt))
        if weight is None:
            spans = self._spans(fmt)[self.index[name]]
            if len(spans) == 1:
                weight = self._view(fmt, spans[0])
            else:  # split over daemons: its pieces put together on the device
                weight = _formats.join_pieces([self._view(fmt, i) for i in spans])
            self.weights[(name, fmt)] = weight
        return weight

    def data(self, fmt, dtype):
        """Each tensor's data in `fmt`, flat, in `dtype` (a plain format's), in order: each
        block is cut at its tensors' edges by one split (a slice per tensor would cost the host
        a few calls into torch per tensor, every step). A job with split tensors takes each
        tensor's put together instead."""
        if len(self.batches[fmt].spans) != len(self.tensors):
            return [self.served(t.name, fmt).data.reshape(-1).view(dtype) for t in self.tensors]
        blocks = self.blocks[fmt]
        spans = self.batches[fmt].spans
        size = torch.empty(0, dtype=dtype).element_size()
        by_block = {}
        for i, (block, offset, fields) in enumerate(spans):
            by_block.setdefault(block, []).append((offset, fields[3], i))
        out = [None] * len(spans)
        for block, items in by_block.items():
            items.sort()
            lengths, which, end = [], [], 0
            for offset, length, i in items:
                if offset % size or length % size or offset < end:
                    return [blocks[b][o:o + f[3]].view(dtype) for b, o, f in spans]
                if offset > end:
                    lengths.append((offset - end) // size)  # a gap between two tensors
                    which.append(None)
                lengths.append(length // size)
                which.append(i)
                end = offset + length
            for piece, i in zip(blocks[block][:end].view(dtype).split(lengths), which):
                if i is not None:
                    out[i] = piece
        return out


class AdamW(torch.optim.Optimizer):
    """AdamW with decoupled weight decay, stepped by a paramd daemon (see the module doc)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 address="127.0.0.1:50051", job="paramd", state_policy="fp32", serve="fp32",
                 module=None, rank=None, world_size=None, transport="auto", seed=0,
                 max_grad_norm=0.0, bucket_bytes=None, stream_pushes=True,
                 write_weights=True, weights_in_place=False, lend_gradients=True,
                 timeout_s=300.0, reconnect_timeout_s=0.0, daemons=None, push_mode="full",
                 sharded_device_path=True, token_file=None, host_dma=True, staleness=0,
                 early_step=False):
        groups = self._named_groups(params)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__([{**g, "params": [p for _, p in g["params"]]} for g in groups],
                         defaults)
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        self.rank = 0 if rank is None else int(rank)
        self.world_size = 1 if world_size is None else int(world_size)
        self.serve = [_formats.check_format(f) for f in
                      ([serve] if isinstance(serve, str) else list(serve))]
        self.state_policy = paramd.state_policy(state_policy)
        self.stream_pushes = stream_pushes
        self.write_weights = write_weights
        self.weights_in_place = weights_in_place
        self._bucket_bytes = bucket_bytes  # None: chosen by the transport at registration
        self._timeout_s = timeout_s
        self._seed = seed
        self._daemons = list(daemons or [])
        if push_mode not in ("full", "pre_reduced"):
            raise ValueError(f"push_mode is 'full' or 'pre_reduced', not {push_mode!r}")
        if (push_mode == "pre_reduced" and self.world_size > 1
                and not (dist.is_available() and dist.is_initialized())):
            raise ValueError("push_mode='pre_reduced' reduces the gradients with "
                             "torch.distributed: initialize its process group first")
        self.push_mode = push_mode
        if type(staleness) is not int or staleness not in (0, 1):
            raise ValueError(f"staleness is 0 (every forward runs on the newest version) or 1 "
                             f"(one version behind: see the module doc), not {staleness!r}")
        self.staleness = staleness
        self._stale = {}  # staleness 1: id(param) -> _PendingPull held back until the next step()
        self._max_grad_norm = max_grad_norm
        # The daemon steps each tensor as its gradients land (RegisterRequest.early_step; a cpu
        # daemon, max_grad_norm 0): the same weights, less of the step after backward.
        self._early_step = bool(early_step)
        self._lock = threading.Lock()
        self._bucket = {}  # job name -> [(tensor name, bytes)], filled by the grad hooks
        self._bucket_size = {}
        self._lent = {}  # job name -> gradients lent for the step collected (cuda_ipc)
        self._pushes = _Worker("paramd-push")
        self._pulls = _Worker("paramd-pull")
        self._releases = _Worker("paramd-release")  # the host tier's leases, once copied
        self._pending = {}  # id(param) -> _PendingPull of the version being loaded
        self._served = {}  # tensor name -> {format: ServedWeight} of the loaded version
        self._copies = None  # host tier: the CUDA stream of the copies to the GPU
        self._versions = {}  # cuda_ipc: job name -> _DeviceVersion loaded
        self._device_pending = []  # cuda_ipc: _DeviceVersion of each job, being pulled
        # (CUDA event, _DeviceVersion) of versions replaced by newer ones, let go once the event
        # has run (cuda_ipc).
        self._retired = []
        self._hooks = []
        self.restarts = 0  # daemon restarts followed (resume from its checkpoints)
        self._resumed = False  # a restart was followed during this iteration: drop its gradients
        # Overlap accounting (what bench/python reports): seconds the trainer waited.
        # load_s: the host's time loading versions into the parameters (cuda_ipc; pull waits
        # included).
        self.timings = {"push_wait_s": 0.0, "commit_s": 0.0, "pull_wait_s": 0.0, "load_s": 0.0}

        devices = {p.device for g in groups for _, p in g["params"]}
        if len(devices) != 1:
            raise ValueError(f"paramd.torch.AdamW needs every parameter on one device; got "
                             f"{sorted(str(d) for d in devices)}")
        self.device = devices.pop()
        cuda_stream, cuda_device = 0, -1
        if self.device.type == "cuda":
            # The client's cuda_ipc end maps the daemon's memory on the current device, shm's
            # page-locks the daemon's segments for it (the host tier), and their pushes wait for
            # the stream backward writes gradients on.
            torch.cuda.set_device(self.device)
            cuda_stream = torch.cuda.current_stream(self.device).cuda_stream
            cuda_device = torch.cuda.current_device() if host_dma else -1
        self._lend = lend_gradients and self.device.type == "cuda"
        self._sharded_device_path = sharded_device_path
        self._jobs = []
        for index, (group, torch_group) in enumerate(zip(groups, self.param_groups)):
            name = job if index == 0 else f"{job}.g{index}"
            client = paramd.connect(address, transport=transport, cuda_stream=cuda_stream,
                                    reconnect_timeout_s=reconnect_timeout_s,
                                    lend_gradients=self._lend, token_file=token_file,
                                    cuda_device=cuda_device)
            j = _Job(name, client, torch_group)
            for tensor_name, param in group["params"]:
                j.tensors.append(_Tensor(tensor_name, param, j))
            self._jobs.append(j)
        self._by_param = {id(t.param): t for j in self._jobs for t in j.tensors}
        self._by_name = {t.name: t for j in self._jobs for t in j.tensors}
        # Forward order: the module's parameter order when we have it, else registration order.
        if module is not None:
            order = [self._by_param[id(p)] for p in module.parameters() if id(p) in self._by_param]
            seen = {id(t.param) for t in order}
            order += [t for j in self._jobs for t in j.tensors if id(t.param) not in seen]
        else:
            order = [t for j in self._jobs for t in j.tensors]
        self._forward_order = order
        self._module = module

        self._step = self._register_and_load()
        for t in self._forward_order:
            if t.param.requires_grad:
                self._hooks.append(t.param.register_post_accumulate_grad_hook(self._on_grad))
        if module is not None and self._direct:
            # One hook: the version loads whole (every job's) when the model's forward starts.
            # A pre-hook on every module would cost the host each module's call, every step.
            self._hooks.append(module.register_forward_pre_hook(self._before_model_forward))
        elif module is not None:
            for m in module.modules():
                if any(True for _ in m.parameters(recurse=False)):
                    self._hooks.append(m.register_forward_pre_hook(self._before_forward))

    # ----- construction -----

    @staticmethod
    def _named_groups(params):
        """[{'params': [(name, param)], ...options}] from named_parameters() or named groups."""
        params = list(params)
        if not params:
            raise ValueError("paramd.torch.AdamW got an empty parameter list")
        if isinstance(params[0], dict):
            groups = []
            for g in params:
                named = list(g["params"])
                if named and not isinstance(named[0], tuple):
                    raise TypeError("each param group's 'params' must hold (name, parameter) "
                                    "pairs, as model.named_parameters() gives")
                groups.append({**g, "params": named})
            return groups
        if not isinstance(params[0], tuple):
            raise TypeError("paramd.torch.AdamW takes model.named_parameters() (names are the "
                            "daemon's tensor names), or param groups of (name, parameter) pairs")
        return [{"params": params}]

    def _upload_initial_weights(self, j):
        """Version 0 of job `j` from the parameters, from host memory in FP32, in groups of
        about _UPLOAD_GROUP_BYTES."""
        group, size = {}, 0
        for t in j.tensors:
            group[t.name] = t.param.detach().to("cpu", torch.float32)
            size += 4 * t.param.numel()
            if size >= _UPLOAD_GROUP_BYTES:
                paramd.upload_initial_weights(j.client, j.name, group)
                group, size = {}, 0
        if group:
            paramd.upload_initial_weights(j.client, j.name, group)

    def _register_and_load(self):
        """Registers every job; rank 0 uploads version 0 of a new job; loads the served
        version. Returns the step the job collects next."""
        next_steps = set()
        for j in self._jobs:
            g = j.group
            j.registered = paramd.hyperparams(g["lr"], g["betas"], g["eps"], g["weight_decay"])
            tensors = [(t.name, t.rows, t.cols, t.grad_type) for t in j.tensors]
            reply = j.client.register(
                job=j.name, rank=self.rank, world_size=self.world_size, tensors=tensors,
                hyperparams=j.registered, state_policy=self.state_policy,
                serve=self.serve, seed=self._seed,
                max_grad_norm=self._max_grad_norm, daemons=self._daemons,
                push_mode=self.push_mode, early_step=self._early_step)
            self.transport = reply["transport"]  # for display; decisions read the traits
            self._transport_traits = reply["transport_traits"]  # one per owner daemon
            if self.restarts > 0 and reply["version"] < 0:
                raise RuntimeError(
                    f"the daemon restarted without a checkpoint of job {j.name!r}: its state is "
                    "lost (give the daemon a checkpoint_dir and checkpoint_every_steps)")
            if self.rank == 0 and reply["version"] < 0:
                self._upload_initial_weights(j)
            next_steps.add(reply["next_step"])
            if self.push_mode == "pre_reduced":
                self._place_owners(j)
        if len(next_steps) != 1:
            raise RuntimeError(f"the jobs of this optimizer are at different steps {next_steps}")
        step = next_steps.pop()
        # Decided from every owner daemon's transport traits, never from names. GPU memory moves
        # directly where each transport reads device memory and views it in place (cuda_ipc):
        # gradients are pushed, or lent, from it and weights viewed where the daemon serves them.
        # A job sharded over several owners (one traits entry each) does the same with
        # sharded_device_path (a split tensor's pieces put together on the device); without it,
        # it takes host copies.
        traits = self._transport_traits
        on_gpu = self.device.type == "cuda"
        reads_device = on_gpu and bool(traits) and all(t["reads_device_memory"] for t in traits)
        in_place = all(t["views_in_place"] for t in traits)
        self._direct = (reads_device and in_place and all(t["memory"] == "device" for t in traits)
                        and (len(traits) == 1 or self._sharded_device_path))
        # The host tier: a daemon stepping in host memory that this process reaches by DMA (shm
        # with cuda_device): gradients go device-to-host straight into their slots, the served
        # bytes host-to-device straight into the parameters.
        self._dma = (reads_device and in_place and all(t["memory"] == "host" for t in traits))
        if self._dma and self._copies is None:
            self._copies = torch.cuda.Stream(self.device)
        # A transport that reads device memory but views nothing in place (nccl: a daemon on
        # another GPU without a peer path) sends gradients from GPU memory too, and its pulls
        # copy the weights out.
        self._push_device = self._direct or self._dma or (
            reads_device and any(not t["views_in_place"] for t in traits))
        if self._bucket_bytes is None:
            # A push of GPU memory waits for the stream and costs a round trip whatever its size,
            # while its copies run at device speed: few large buckets (by DMA, smaller ones, so
            # the copies run while backward does). Host pushes stream in small ones, which keep
            # the copies in cache.
            if self._dma:
                self._bucket_bytes = 32 << 20
            else:
                self._bucket_bytes = (256 << 20) if self._push_device else (1 << 20)
        if self.staleness and self._direct:
            raise ValueError(f"staleness=1 runs on the host path; {self.device} parameters over "
                             f"{self.transport} view the daemon's GPU memory, whose step does not "
                             f"hold the next forward back (use staleness=0)")
        if self.weights_in_place and not self._direct:
            raise ValueError(f"weights_in_place needs CUDA parameters and a transport that views "
                             f"device memory in place, cuda_ipc (this optimizer has "
                             f"{self.device} parameters over {self.transport})")
        self._start_pulls(step)
        self.sync_weights()
        return step

    # ----- gradients -----

    @contextlib.contextmanager
    def accumulating(self):
        """Backward passes inside this block only accumulate (micro-batches before the last):
        nothing is pushed until a backward outside it or step()."""
        previous, self.stream_pushes = self.stream_pushes, False
        try:
            yield
        finally:
            self.stream_pushes = previous

    def _place_owners(self, j):
        """pre_reduced: each tensor's pieces (owner index in the job's sorted daemon list, first
        row, end row), from the job's layout; whether this rank pushes any owner's part (rank
        owner mod world_size pushes owner's)."""
        listed = j.client.status(j.name)["jobs"][0]["daemons"]
        j.pieces = {t.name: [] for t in j.tensors}
        for p in j.client.layout(j.name):
            owner = listed.index(p["daemon"]) if listed else 0
            j.pieces[p["tensor"]].append((owner, p["row_begin"], p["row_end"]))
        j.pushes = any(owner % self.world_size == self.rank
                       for pieces in j.pieces.values() for owner, _, _ in pieces)

    def _reduce_to_pushers(self):
        """pre_reduced: sums every owner's rows of every gradient over the ranks, into the rank
        that pushes them (torch.distributed.reduce to rank owner mod world_size), one reduce per
        piece (an owner's rows of a tensor; no padding: the pieces are uneven), every rank in the
        same order. Returns {tensor name: the gradient to push}."""
        reduced, waits = {}, []
        for j in self._jobs:
            for t in j.tensors:
                grad = t.grad_tensor().contiguous()
                reduced[t.name] = grad
                if self.world_size == 1:
                    continue
                rows = grad.view(t.rows, t.cols)
                for owner, begin, end in j.pieces[t.name]:
                    waits.append(dist.reduce(rows[begin:end], dst=owner % self.world_size,
                                             op=dist.ReduceOp.SUM, async_op=True))
        for w in waits:
            w.wait()
        return reduced

    def _on_grad(self, param):
        if not self.stream_pushes or self._resumed or self.push_mode == "pre_reduced":
            return
        t = self._by_param[id(param)]
        data, nbytes, keep = t.grad_bytes(self._push_device)
        with self._lock:
            t.pushed_step = self._step
            self._bucket.setdefault(t.job.name, []).append((t.name, data, keep))
            size = self._bucket_size.get(t.job.name, 0) + nbytes
            self._bucket_size[t.job.name] = size
            if size >= self._bucket_bytes:
                self._flush(t.job)

    def _flush(self, job):
        """Hands the job's bucket to the push thread (called with the lock held). The bucket
        keeps its gradients alive until the push has read them."""
        bucket = self._bucket.pop(job.name, None)
        self._bucket_size.pop(job.name, None)
        if bucket:
            step, rank = self._step, self.rank
            items = [(name, data) for name, data, _ in bucket]
            if self._lend and self._direct:
                # The daemon may read them where they lie when the step runs: they stay alive,
                # unchanged, until the step's version is loaded (_load_device).
                self._lent.setdefault(job.name, []).extend(keep for _, _, keep in bucket)
            # The step's lr as the loop set it (a schedule moves it after step()): with
            # early_step the daemon is told before the gradients land, so it predicts it.
            lr = float(job.group["lr"]) if self._early_step else None
            # GPU gradients: an event after the work that wrote them, recorded here (in
            # backward, on its stream), so their copies wait for it and not for the rest of
            # backward, which the host has queued by the time the push thread gets to them.
            ready = None
            if self._push_device and self.device.type == "cuda":
                ready = torch.cuda.Event()
                ready.record()
            self._pushes.submit(
                lambda: (self._announce_lr(job, lr),
                         self._push_gradients(job, rank, step, items, ready), bucket))

    def _announce_lr(self, job, lr):
        """early_step: tells the daemon the step's lr where it is not the one it predicts (the
        last commit's), before the step's first gradient lands (on the push thread)."""
        if lr is not None and lr != job.told_lr:
            job.client.set_hyperparams(job.name, lr=lr)
            job.told_lr = lr

    def _push_gradients(self, job, rank, step, items, ready=None):
        """Pushes a bucket (on the push thread). With staleness 1 a rank may push step s before
        another rank committed step s-1 (its forward waited for step s-2 only); the daemon refuses
        such a push (FAILED_PRECONDITION: ahead of the step it collects). The push then waits
        until the job's status says it collects step s (the daemon at `address`: the owners of a
        job over several open a step together, give or take a commit in flight) and goes again,
        four tries in all; a refusal that waiting does not cure is raised. `ready`: the bucket's
        torch.cuda.Event (GPU gradients), which their copies wait for."""
        ready = {} if ready is None else {"ready_event": ready.cuda_event}
        if not self.staleness:
            job.client.push_gradients(job.name, rank, step, items, **ready)
            return
        deadline = time.monotonic() + self._timeout_s
        for attempt in range(4):
            try:
                job.client.push_gradients(job.name, rank, step, items, **ready)
                return
            except paramd.StatusError as error:
                if error.code != "FAILED_PRECONDITION" or attempt == 3:
                    raise
                refused = error
            delay = 0.001
            while True:
                time.sleep(delay)
                if job.client.status(job.name)["jobs"][0]["next_step"] >= step:
                    break
                if time.monotonic() > deadline:
                    raise refused
                delay = min(2 * delay, 0.05)

    # ----- the step -----

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Weights of modules the last forward did not run are loaded now, so every parameter
        # holds the version this step's gradients belong to. With staleness 1 the version held
        # back at the last step() (the step before this one's) is loaded too, before this step is
        # committed: the daemon serves a tensor's newest version only, and cannot publish the next
        # one until this rank commits.
        self._pending.update(self._stale)
        self._stale = {}
        self._load_all()
        if self._resumed:
            # The daemon restarted during this iteration: its gradients belong to a step the
            # daemon went back from. The loop goes on from next_step.
            self._resumed = False
            return loss
        started = time.perf_counter()
        try:
            reduced = self._reduce_to_pushers() if self.push_mode == "pre_reduced" else None
            with self._lock:
                for j in self._jobs:
                    for t in j.tensors:
                        if reduced is not None and not j.pushes:
                            continue  # another rank pushes every owner's part of this job
                        if t.pushed_step != self._step:
                            t.pushed_step = self._step
                            data, _, keep = t.grad_bytes(
                                self._push_device, None if reduced is None else reduced[t.name])
                            self._bucket.setdefault(j.name, []).append((t.name, data, keep))
                    self._flush(j)
            self._pushes.wait()
            pushed = time.perf_counter()
            # The earlier versions' leases go before the commit, which asks the daemon for room
            # for the next version: all but the newest one retired, whose reads (the last
            # forward's, backward's) the GPU may still run (the pushes do not wait for the device).
            # So at most two versions are held while the daemon's step needs a third.
            self._drop_retired(keep=1)
            for j in self._jobs:
                self._update_hyperparams(j)
                j.client.commit(j.name, self.rank, self._step, lr=float(j.group["lr"]),
                                grad_scale=1.0 / self.world_size)
                j.told_lr = float(j.group["lr"])
        except paramd.StatusError as error:
            if not self._restarted(error):
                raise
            self._resume()
            return loss
        self.timings["push_wait_s"] += pushed - started
        self.timings["commit_s"] += time.perf_counter() - pushed
        self._step += 1
        self._start_pulls(self._step)
        if self.staleness:
            # The next forward and backward run on the weights loaded now; the version this
            # commit makes is pulled meanwhile and loaded at the next step().
            self._stale, self._pending = self._pending, {}
        elif self._module is None:
            self.sync_weights()
        return loss

    def _update_hyperparams(self, j):
        g, registered = j.group, j.registered
        if tuple(g["betas"]) != registered["betas"] or g["eps"] != registered["eps"]:
            raise ValueError("paramd keeps betas and eps as registered; only lr and weight_decay "
                             "may change during training")
        if g["weight_decay"] != registered["weight_decay"]:
            j.client.set_hyperparams(j.name, weight_decay=float(g["weight_decay"]))
            registered["weight_decay"] = g["weight_decay"]

    # ----- weights -----

    def _start_pulls(self, version):
        if self._direct:
            self._start_device_pulls(version)
            return
        if self._dma:
            self._start_dma_pulls(version)
            return
        module_format = self.serve[0]
        for t in self._forward_order:
            pending = _PendingPull(version)
            self._pending[id(t.param)] = pending

            def pull(t=t, pending=pending):
                try:
                    for fmt in self.serve:
                        pending.served[fmt] = paramd.pull(t.job.client, t.job.name, t.name, fmt,
                                                          version, self._timeout_s)
                    if self.write_weights:
                        w = _formats.dequantize(pending.served[module_format])
                        pending.weight = w.reshape(t.param.shape).to(t.param.dtype)
                except BaseException as error:  # raised where the weight is needed
                    pending.error = error
                finally:
                    pending.done.set()

            self._pulls.submit(pull)

    def _start_dma_pulls(self, version):
        """The host tier: tensor by tensor in forward order, as the daemon publishes each, the pull
        thread leases the served bytes where they lie (page-locked for this GPU) and copies them
        host-to-device on a copy stream of ours: the first format straight into the parameter
        where its dtype is the format's (else into a GPU buffer, dequantized on the GPU), the
        others into GPU buffers that served() gives. The copies wait on the GPU for the work queued
        so far (the last forward and backward read the parameters); the forward pre-hooks make
        the current stream wait for each tensor's copies. Nothing on the trainer's thread waits
        for the device; the lease ends once its copy has run, on the release thread, so the next
        tensor's pull and copies are queued while this one's run (waiting for each copy here put
        two round trips to the daemon and a wake-up between copies: the forward then took 7-9.4 ms
        per Llama layer whose weights were ready, 5.5-7.9 since)."""
        free = torch.cuda.Event()
        free.record()  # after every read of the parameters queued so far
        copies, module_format = self._copies, self.serve[0]
        for t in self._forward_order:
            pending = _PendingPull(version)
            self._pending[id(t.param)] = pending

            def pull(t=t, pending=pending):
                views = []
                try:
                    with torch.cuda.stream(copies):
                        copies.wait_event(free)
                        for fmt in self.serve:
                            view = t.job.client.pull_in_place(t.job.name, t.name, fmt, version,
                                                              self._timeout_s, 0.0)
                            views.append(view)
                            write = self.write_weights and fmt == module_format
                            pending.served[fmt] = self._copy_to_gpu(t, fmt, view, write, pending)
                        pending.copied = torch.cuda.Event()
                        pending.copied.record(copies)
                except BaseException as error:  # raised where the weight is needed
                    pending.error = error
                finally:
                    if views:
                        # After every copy queued on the stream (a failed tensor's too).
                        copied = torch.cuda.Event(blocking=True)
                        copied.record(copies)
                        self._releases.submit(lambda: _release_once_copied(copied, views))
                    pending.done.set()

            self._pulls.submit(pull)

    def _copy_to_gpu(self, t, fmt, view, write, pending):
        """One leased view copied to the GPU on the current (copy) stream: into `t`'s parameter
        where `write` and its dtype is the format's, else into a buffer of its own (with `write`,
        that buffer is pending.weight where it holds the parameter's dtype, as with staleness 1,
        else it is dequantized into pending.weight). The ServedWeight of the copy."""
        raw = _formats.host_bytes(view)
        fields = view.fields
        param = t.param.data
        # With staleness 1 the next forward and backward read the parameters while this version
        # is copied: it lands in a buffer, written into them when it is loaded.
        if (write and not self.staleness and _formats.is_plain(fmt)
                and param.dtype == _formats.data_dtype(fmt) and param.is_contiguous()
                and param.numel() * param.element_size() == len(raw)):
            into = param.view(-1).view(torch.uint8)
            into.copy_(raw, non_blocking=True)
            return _formats.served_view(into, fields)
        into = torch.empty(len(raw), dtype=torch.uint8, device=self.device)
        into.copy_(raw, non_blocking=True)
        served = _formats.served_view(into, fields)
        if write and _formats.is_plain(fmt) and param.dtype == _formats.data_dtype(fmt):
            # The buffer is the weight (staleness 1): no dequantized copy beside it, whose FP32
            # transient and second copy held the GPU 4 bytes per parameter over the floor. It
            # stays held (pending.served, then served()) until the next version is loaded.
            pending.weight = served.data.reshape(t.shape)
        elif write:
            pending.weight = _formats.dequantize(served).reshape(t.shape).to(t.param.dtype)
        return served

    def _start_device_pulls(self, version):
        """cuda_ipc: one in-place pull per job and format views every tensor of the version in
        the daemon's GPU memory, as a few block tensors (the cuda:N backend publishes a step's
        tensors together). The pull thread only waits and maps: the views are sliced, and the
        weights written, on the trainer's thread, so the two never contend for the GIL."""
        for j in self._jobs:
            order = [t for t in self._forward_order if t.job is j]
            pending = _DeviceVersion(version, order, {t.name: i for i, t in enumerate(order)})
            pending.lent = self._lent.pop(j.name, [])
            for t in order:
                self._pending[id(t.param)] = pending
            self._device_pending.append(pending)

            def pull(j=j, pending=pending):
                try:
                    names = [t.name for t in pending.tensors]
                    for fmt in self.serve:
                        batch = j.client.pull_in_place_batch(j.name, names, fmt, version,
                                                             self._timeout_s)
                        pending.batches[fmt] = batch
                        pending.blocks[fmt] = _formats.block_tensors(batch)
                except BaseException as error:  # raised where the weights are needed
                    pending.error = error
                finally:
                    pending.done.set()

            self._pulls.submit(pull)

    def _load_device(self, pending):
        """Loads one job's version into all its parameters (the first of them a forward needs
        brings the rest): one device copy each, queued by one call, or in-place views."""
        if pending in self._device_pending:
            self._device_pending.remove(pending)
        if pending.loaded:
            return
        pending.loaded = True
        started = time.perf_counter()
        for t in pending.tensors:
            self._pending.pop(id(t.param), None)
        awaited = self._await(pending)
        # The pull made the current stream wait for the daemon's step on the GPU, so work queued
        # from now on runs after the step read the lent gradients: their memory may be reused.
        pending.lent = []
        if not awaited:
            return
        if self.write_weights:
            self._write_device_weights(pending)
        job = pending.tensors[0].job.name
        if job in self._versions:
            self._retire(self._versions[job])
        self._versions[job] = pending
        self.timings["load_s"] += time.perf_counter() - started

    @torch.no_grad()
    def _write_device_weights(self, pending):
        """Writes the first format's served bytes into the job's CUDA parameters: device copies
        queued by one call (a dequantization each for the scaled formats), or, with
        weights_in_place, parameters of the served dtype view them (no copy)."""
        fmt = self.serve[0]
        if not _formats.is_plain(fmt):
            for t in pending.tensors:
                t.param.copy_(_formats.dequantize(pending.served(t.name, fmt)).view(t.shape))
            return
        dtype = _formats.data_dtype(fmt)
        targets, sources = [], []
        for t, data in zip(pending.tensors, pending.data(fmt, dtype)):
            if self.weights_in_place and t.param.dtype == dtype:
                t.param.data = data.view(t.shape)
            else:
                targets.append(t.param)
                sources.append(data.view(t.shape))
        if targets:
            torch._foreach_copy_(targets, sources)

    def _retire(self, old):
        """Lets go of a job's version that a newer one replaced (cuda_ipc) once the work queued
        so far has run: every read of it (the last forward and backward, the copies from it; a
        parameter viewing it views the new one now) was queued before this event. No lease
        outlives the next step's load, and nothing here waits."""
        event = torch.cuda.Event()
        event.record()
        self._retired.append((event, old))
        self._drop_retired()

    def _drop_retired(self, keep=None):
        """Lets go of the retired versions whose reads have run; with `keep`, waits for the oldest
        ones until at most `keep` are held."""
        while self._retired and self._retired[0][0].query():
            self._retired.pop(0)
        while keep is not None and len(self._retired) > keep:
            self._retired[0][0].synchronize()
            self._retired.pop(0)

    def _await(self, pending):
        """Waits for a pull the weights need; False when it found the daemon restarted (the
        optimizer then resumed from it, and this iteration's forward ran on other weights)."""
        if not pending.done.is_set():
            started = time.perf_counter()
            pending.done.wait()
            self.timings["pull_wait_s"] += time.perf_counter() - started
        if pending.error is not None:
            if self._restarted(pending.error):
                self._resume()
                self._resumed = True
                return False
            raise pending.error
        return True

    def _load(self, param):
        pending = self._pending.pop(id(param), None)
        if pending is None:
            return
        if isinstance(pending, _DeviceVersion):
            self._load_device(pending)
            return
        if not self._await(pending):
            return
        if pending.copied is not None:  # the host tier: copied to the GPU on our stream
            torch.cuda.current_stream(self.device).wait_event(pending.copied)
        if pending.weight is not None:
            with torch.no_grad():
                param.copy_(pending.weight)
        self._served[self._by_param[id(param)].name] = pending.served

    def _before_forward(self, module, args):
        for p in module.parameters(recurse=False):
            self._load(p)

    def _before_model_forward(self, module, args):
        while self._device_pending:
            self._load_device(self._device_pending[0])

    def _restarted(self, error):
        """Whether `error` comes from a daemon that restarted since registration (ABORTED, or a
        refusal from another start of it, which knows nothing of this step)."""
        if not isinstance(error, paramd.StatusError):
            return False
        if error.code == "ABORTED":
            return True
        if error.code not in ("FAILED_PRECONDITION", "NOT_FOUND", "DEADLINE_EXCEEDED"):
            return False
        return any(j.client.daemon_restarted() for j in self._jobs)

    def _resume(self):
        """The daemon restarted (a call was ABORTED): drop the work of the step under way,
        register again, load the version the daemon restored from its checkpoints and go back to
        the step it collects (next_step)."""
        with self._lock:
            self._bucket.clear()
            self._bucket_size.clear()
            self._lent.clear()  # the daemon that could read them is gone
        self._pushes.drain()
        self._pulls.drain()
        self._releases.drain()
        self._pending = {}
        self._stale = {}
        self._device_pending = []
        self._served = {}
        self._versions = {}
        self._retired = []
        for j in self._jobs:
            j.told_lr = None  # the restored job predicts its own
        self.restarts += 1
        self._step = self._register_and_load()

    def _load_all(self):
        for t in self._forward_order:
            self._load(t.param)
        self._pulls.wait()

    def zero_grad(self, set_to_none=True):
        """As torch's. Zeroing in place (set_to_none=False) writes gradients the daemon may still
        be reading (lent, cuda_ipc): it first loads the new version, whose pull orders the current
        stream after the daemon's step."""
        if not set_to_none and self._lend and self._direct:
            self._load_all()
        super().zero_grad(set_to_none=set_to_none)

    def sync_weights(self):
        """Waits for every tensor of the version being loaded and writes it (e.g. before
        evaluating or saving the model outside a forward). With staleness 1 that is the newest
        version, of the step committed last: the next iteration runs on it."""
        self._pending.update(self._stale)
        self._stale = {}
        self._load_all()
        # A point where the caller waits anyway: the earlier versions' GPU views go now.
        if self._direct:
            torch.cuda.synchronize(self.device)
        self._retired = []

    def served(self, param_or_name, fmt=None):
        """The ServedWeight of a parameter in `fmt` (default: the first serve format), of the
        version its module last loaded: FP8 data as float8_e4m3fn and its scales. Over cuda_ipc
        they are CUDA tensors viewing the daemon's bytes, valid until the next version is loaded
        (queue the work that reads them before the next step())."""
        t = (self._by_name[param_or_name] if isinstance(param_or_name, str) else
             self._by_param[id(param_or_name)])
        if self._direct:
            return self._versions[t.job.name].served(t.name, fmt or self.serve[0])
        return self._served[t.name][fmt or self.serve[0]]

    @property
    def next_step(self):
        """The step whose gradients the optimizer collects next (= the version loaded)."""
        return self._step

    def daemon_status(self):
        """The daemon's view of this optimizer's jobs (steps, timings, state bytes)."""
        return [j.client.status(j.name)["jobs"][0] for j in self._jobs]

    # ----- state -----

    _TORCH_TYPES = {
        "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
        "fp8_e4m3": torch.float8_e4m3fn, "int16": torch.int16,
    }
    _TYPE_NAMES = {v: k for k, v in _TORCH_TYPES.items()}

    def state_dict(self):
        """The daemon's state of every job, streamed out in the stored dtypes with their scales:
        {'state': {param index: {field: tensor}}, 'param_groups': [...], 'paramd': [per job]}.
        Fields (see client/job_state.h): master (+ master_remainder), exp_avg, exp_avg_sq and
        their per-128-element *_scales, FP8 serve scales. Call it at a step boundary."""
        self.sync_weights()
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        state, jobs = {}, []
        for j in self._jobs:
            exported = j.client.export_state(j.name)
            names = {t.name: index[id(t.param)] for t in j.tensors}
            for f in exported.pop("fields"):
                dtype = self._TORCH_TYPES[f["type"]]
                if len(f["bytes"]) == 0:  # e.g. an empty amax history; frombuffer refuses those
                    tensor = torch.empty(f["shape"], dtype=dtype)
                else:
                    values = torch.frombuffer(f["bytes"], dtype=torch.uint8)
                    tensor = values.view(dtype).view(f["shape"])
                state.setdefault(names[f["tensor"]], {})[f["field"]] = tensor
            jobs.append(exported)
        groups = []
        for g in self.param_groups:
            saved = {k: v for k, v in g.items() if k != "params"}
            saved["params"] = [index[id(p)] for p in g["params"]]
            groups.append(saved)
        return {"state": state, "param_groups": groups, "paramd": jobs}

    def load_state_dict(self, state_dict):
        """Sends a state_dict() back to the daemon (rank 0 imports, every rank then loads the
        imported version) and takes its param-group options (lr, weight_decay, ...)."""
        self.sync_weights()
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError("the state_dict has a different number of param groups")
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("a param group of the state_dict has a different size")
            group.update({k: v for k, v in saved.items() if k != "params"})
        if self.rank == 0:
            for j, exported in zip(self._jobs, state_dict["paramd"]):
                fields = []
                for t in j.tensors:
                    for field, tensor in state_dict["state"][index[id(t.param)]].items():
                        fields.append({
                            "tensor": t.name, "field": field,
                            "type": self._TYPE_NAMES[tensor.dtype],
                            "shape": list(tensor.shape),
                            "bytes": _formats.byte_view(tensor.cpu())})
                g = j.group
                j.client.import_state({
                    **exported, "job": j.name, "fields": fields,
                    "hyperparams": paramd.hyperparams(g["lr"], g["betas"], g["eps"],
                                                      g["weight_decay"])})
                j.registered["weight_decay"] = g["weight_decay"]
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            dist.barrier()
        self._step = state_dict["paramd"][0]["next_step"]
        self._start_pulls(self._step)
        self.sync_weights()

    def close(self):
        """Stops the push and pull threads, removes the hooks and closes the connections (the
        optimizer cannot step afterwards)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._pushes.close()
        self._pulls.close()
        self._releases.close()
        for j in self._jobs:
            j.client.close()
