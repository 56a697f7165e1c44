"""PyTorch on the GPU (label gpu): paramd.torch.AdamW with CUDA parameters against a daemon on
cuda:0, over cuda_ipc. Gradients are lent from GPU memory (or copied), weights are viewed where the daemon
serves them and written with one device copy (or viewed in place), served FP8 weights feed
torch._scaled_mm, and the results are those of the cpu backend bit for bit. Without a GPU the test
exits 77 (skipped) with the reason, after checking that asking for cuda_ipc fails clearly."""

import os
import subprocess
import sys
import time
import unittest

import support

support.require_torch()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import paramd  # noqa: E402
import paramd.torch  # noqa: E402

DEVICE = "cuda:0"

# A trainer that registers 16 tensors of 64 MiB, uploads them and pushes step 0's gradients from
# GPU memory by DMA, saying "pushing" just before and "pushed" after.
KILLED_TRAINER = """
import sys, torch, paramd
client = paramd.connect(sys.argv[1], transport="shm", cuda_device=0)
tensors = [(f"t{i:02d}", 4096, 4096, "fp32") for i in range(16)]
client.register(job="killed", rank=0, world_size=1, tensors=tensors,
                hyperparams=paramd.hyperparams(lr=1e-2), serve=["fp32"])
paramd.upload_initial_weights(client, "killed", {t[0]: torch.zeros(4096, 4096) for t in tensors})
grads = {t[0]: torch.ones(4096, 4096, device="cuda:0") for t in tensors}
torch.cuda.synchronize()
print("pushing", flush=True)
paramd.push_gradients(client, "killed", 0, 0, grads)
print("pushed", flush=True)
"""


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(48, 96), nn.Tanh(), nn.Linear(96, 96), nn.Tanh(),
                          nn.Linear(96, 16))
    return model.to(device=DEVICE, dtype=dtype)


def batch(step, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(64, 48, generator=g)
    y = torch.randint(0, 16, (64,), generator=g)
    return x.to(DEVICE, dtype), y.to(DEVICE)


def train(model, opt, steps, first_step=0, dtype=torch.float32):
    losses = []
    for step in range(first_step, first_step + steps):
        x, y = batch(step, dtype)
        loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if hasattr(opt, "sync_weights"):
        opt.sync_weights()
    return losses


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def leases_reach(client, job, count, timeout_s=10.0):
    give_up = time.monotonic() + timeout_s
    while client.status(job)["jobs"][0]["leases"] != count and time.monotonic() < give_up:
        time.sleep(0.01)
    return client.status(job)["jobs"][0]["leases"]


class CudaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = support.daemon(backend="cuda:0")
        cls.cpu_daemon = support.daemon(step_threads=2)
        cls.jobs = 0

    @classmethod
    def tearDownClass(cls):
        cls.daemon.__exit__(None, None, None)
        cls.cpu_daemon.__exit__(None, None, None)

    def adamw(self, model, address=None, **kwargs):
        CudaTest.jobs += 1
        options = dict(lr=1e-2, weight_decay=0.01, address=address or self.daemon.address,
                       job=f"gpu{self.jobs}", module=model)
        options.update(kwargs)
        return paramd.torch.AdamW(model.named_parameters(), **options)

    def test_a_sharded_job_with_cuda_parameters_trains_as_one_daemon(self):
        """CUDA parameters of a job sharded over two cuda:0 daemons (the first layer's weight split
        between them; by default the GPU path: gradients pushed from GPU memory,
        lent and copied, from the push thread while backward runs too, weights viewed where each
        daemon serves them, the split weight's pieces put together on the device; without it,
        host copies), and over one daemon of two backends, cuda:0 and cpu:1 (the cpu one over shm:
        host copies both ways): bit for bit the one daemon's run, fp8_tensor weights included,
        and state_dict() put together from the parts is the one daemon's."""
        def wide(seed):
            torch.manual_seed(seed)
            return nn.Sequential(nn.Linear(48, 600), nn.Tanh(),
                                 nn.Linear(600, 16)).to(DEVICE)

        other = support.daemon(backend="cuda:0")
        several = support.daemon(backend="cuda:0,cpu:1")
        try:
            daemons = sorted([self.daemon.address, other.address])
            finals, served, states = [], [], []
            # (address, daemon list, lend_gradients, bucket_bytes): the last sharded run pushes
            # each gradient as backward makes it (a bucket of 4 KiB), from the push thread.
            runs = ((self.daemon.address, None, True, None),
                    (self.daemon.address, daemons, True, None),
                    (self.daemon.address, daemons, False, None),
                    (self.daemon.address, daemons, True, 4096),
                    (several.address, None, True, None),
                    (self.daemon.address, daemons, True, "host"))
            for address, listed, lend, bucket in runs:
                # "host": sharded_device_path=False (host copies both ways); the GPU path is the
                # default.
                device_path = bucket != "host"
                extra = {} if device_path else {"sharded_device_path": False}
                bucket = None if bucket == "host" else bucket
                model = wide(5)
                opt = self.adamw(model, state_policy="fp8", serve=["bf16", "fp8_tensor"],
                                 max_grad_norm=1.0, daemons=listed, address=address,
                                 lend_gradients=lend, bucket_bytes=bucket, **extra)
                if listed:
                    self.assertEqual(opt.transport, ",".join(f"{a}=cuda_ipc" for a in daemons))
                    self.assertEqual(opt._direct, device_path)
                if address == several.address:
                    self.assertEqual(opt.transport, f"{several.address}/cpu:1=shm,"
                                                    f"{several.address}/cuda:0=cuda_ipc")
                    self.assertFalse(opt._direct)
                train(model, opt, 5)
                finals.append(weights(model))
                fp8 = opt.served(model[0].weight, "fp8_tensor")
                served.append((fp8.data.cpu().view(torch.uint8), fp8.scale.cpu()))
                states.append(opt.state_dict())
                opt.close()
            for run in range(1, len(runs)):
                for a, b in zip(finals[0], finals[run]):
                    self.assertTrue(b.is_cuda)
                    self.assertTrue(torch.equal(a, b), run)
                self.assertTrue(torch.equal(served[0][0], served[run][0]), run)
                self.assertTrue(torch.equal(served[0][1], served[run][1]), run)
                for index, fields in states[0]["state"].items():
                    for field, tensor in fields.items():
                        self.assertTrue(
                            torch.equal(states[run]["state"][index][field].view(torch.uint8),
                                        tensor.view(torch.uint8)), (run, index, field))
        finally:
            other.__exit__(None, None, None)
            several.__exit__(None, None, None)

    def test_cuda_gradients_and_views_equal_host_ones(self):
        """The same gradients pushed from GPU memory over cuda_ipc and from host memory over
        shm to a cpu daemon give the same served bytes; views are CUDA tensors, copies agree."""
        fmts = ["fp32", "bf16", "fp8_tensor", "mxfp8"]
        w = torch.randn(130, 96, generator=torch.Generator().manual_seed(1)) * 0.02
        results = []
        for address, on_gpu in ((self.daemon.address, True), (self.cpu_daemon.address, False)):
            client = paramd.connect(address)
            client.register(job="views", rank=0, world_size=1,
                            tensors=[("w", 130, 96, "fp32"), ("b", 1, 96, "bf16")],
                            hyperparams=paramd.hyperparams(lr=1e-2), serve=fmts)
            self.assertEqual(client.transport, "cuda_ipc" if on_gpu else "shm")
            traits = client.transport_traits()
            self.assertEqual([(t["reads_device_memory"], t["views_in_place"], t["memory"])
                              for t in traits],
                             [(True, True, "device")] if on_gpu else [(False, True, "host")])
            paramd.upload_initial_weights(client, "views", {
                "w": w.to(DEVICE) if on_gpu else w, "b": torch.zeros(96)})
            for step in range(3):
                g = torch.Generator().manual_seed(7 + step)
                grads = {"w": torch.randn(130, 96, generator=g),
                         "b": torch.randn(96, generator=g).bfloat16()}
                if on_gpu:
                    grads = {k: v.to(DEVICE) for k, v in grads.items()}
                paramd.push_gradients(client, "views", 0, step, grads)
                client.commit("views", 0, step, lr=1e-2, grad_scale=1.0)
            got = {}
            for fmt in fmts:
                copy = paramd.pull(client, "views", "w", fmt, 3)
                self.assertEqual(copy.data.device.type, "cpu")
                if on_gpu:
                    view = paramd.pull_in_place(client, "views", "w", fmt, 3)
                    self.assertTrue(view.data.is_cuda, fmt)
                    self.assertTrue(torch.equal(view.data.cpu().view(torch.uint8),
                                                copy.data.view(torch.uint8)), fmt)
                    if view.scale is not None:
                        self.assertTrue(view.scale.is_cuda)
                        self.assertTrue(torch.equal(view.scale.cpu(), copy.scale), fmt)
                    if fmt == "fp8_tensor":
                        self.assertEqual(view.data.dtype, torch.float8_e4m3fn)
                got[fmt] = copy.data.view(torch.uint8).clone()
            client.close()
            results.append(got)
        for fmt in fmts:
            self.assertTrue(torch.equal(results[0][fmt], results[1][fmt]), fmt)

    def test_a_view_stays_unchanged_under_its_lease_while_steps_run(self):
        client = paramd.connect(self.daemon.address)
        client.register(job="lease", rank=0, world_size=1, tensors=[("w", 256, 64, "bf16")],
                        hyperparams=paramd.hyperparams(lr=1e-2), serve=["bf16"])
        paramd.upload_initial_weights(client, "lease", {"w": torch.randn(256, 64) * 0.02})
        view = paramd.pull_in_place(client, "lease", "w", "bf16", 0)
        before = view.data.clone()
        self.assertEqual(leases_reach(client, "lease", 1), 1)
        for step in range(4):
            grad = torch.randn(256, 64, device=DEVICE, dtype=torch.bfloat16)
            paramd.push_gradients(client, "lease", 0, step, {"w": grad})
            client.commit("lease", 0, step, lr=1e-2, grad_scale=1.0)
        newest = paramd.pull(client, "lease", "w", "bf16", 4)
        self.assertFalse(torch.equal(newest.data, before.cpu()))  # the steps changed the weights
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(view.data, before))  # the leased version did not change
        del view
        self.assertEqual(leases_reach(client, "lease", 0), 0)  # the tensor held the lease
        client.close()

    def test_gpu_memory_over_another_transport_is_refused(self):
        client = paramd.connect(self.daemon.address, transport="inline")
        client.register(job="inline-gpu", rank=0, world_size=1, tensors=[("w", 4, 4, "fp32")],
                        hyperparams=paramd.hyperparams(lr=1e-2), serve=["fp32"])
        paramd.upload_initial_weights(client, "inline-gpu", {"w": torch.zeros(4, 4)})
        with self.assertRaises(paramd.StatusError) as caught:
            paramd.push_gradients(client, "inline-gpu", 0, 0,
                                  {"w": torch.ones(4, 4, device=DEVICE)})
        self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")
        self.assertIn("only a transport that reads device memory takes", str(caught.exception))
        self.assertFalse(client.transport_traits()[0]["reads_device_memory"])
        self.assertIn("this client uses inline", str(caught.exception))
        client.close()

    def test_fp32_policy_follows_torch_adamw_on_the_gpu(self):
        reference = make_model()
        torch_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01)
        expected = train(reference, torch_opt, 6)
        model = make_model()
        opt = self.adamw(model, serve="fp32")
        self.assertEqual(opt.transport, "cuda_ipc")
        got = train(model, opt, 6)
        for a, b in zip(got, expected):
            self.assertLess(abs(a - b) / abs(b), 1e-3)
        for p, q in zip(model.parameters(), reference.parameters()):
            self.assertTrue(p.is_cuda)
            self.assertLess(float((p - q).norm() / q.norm()), 1e-4)
        opt.close()

    def test_the_cuda_and_cpu_backends_train_bit_identically(self):
        """fp8 states with bf16 weights: CUDA parameters through cuda:0 over cuda_ipc, through a
        cpu daemon by DMA into its page-locked segments (the host tier), and through a cpu daemon
        with host copies, end bit for bit the same. The host tier's page-locking ends with it."""
        finals = []
        runs = ((self.daemon.address, True, "cuda_ipc"), (self.cpu_daemon.address, True, "dma"),
                (self.cpu_daemon.address, False, "host copies"))
        for address, host_dma, path in runs:
            model = make_model(seed=3)
            opt = self.adamw(model, address=address, state_policy="fp8", serve="bf16",
                             max_grad_norm=1.0, host_dma=host_dma)
            self.assertEqual(opt.transport, "cuda_ipc" if path == "cuda_ipc" else "shm")
            self.assertEqual(opt._dma, path == "dma", path)
            train(model, opt, 5)
            if path == "dma":
                self.assertGreater(paramd._paramd.page_locked_bytes(), 0)
            finals.append(weights(model))
            opt.close()
            self.assertEqual(paramd._paramd.page_locked_bytes(), 0, path)
        for run in finals[1:]:
            for a, b in zip(finals[0], run):
                self.assertTrue(torch.equal(a, b))

    def test_the_host_tier_writes_bf16_parameters_in_place_and_serves_fp8_on_the_gpu(self):
        """bf16 parameters over the host tier: each step's bf16 weights go host-to-device straight
        into the parameters, the fp8 format into GPU buffers served() gives, and both equal the
        host-copy path's bit for bit, step after step."""
        runs = []
        for host_dma in (True, False):
            model = make_model(seed=8, dtype=torch.bfloat16)
            opt = self.adamw(model, address=self.cpu_daemon.address, state_policy="fp8",
                             serve=["bf16", "fp8_tensor"], host_dma=host_dma)
            self.assertEqual(opt._dma, host_dma)
            served = []
            for step in range(4):
                x, y = batch(step, torch.bfloat16)
                F.cross_entropy(model(x).float(), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                opt.sync_weights()
                first = next(model.parameters())
                fp8 = opt.served(first, "fp8_tensor")
                self.assertEqual(fp8.data.device.type, "cuda" if host_dma else "cpu")
                served.append((fp8.data.view(torch.uint8).cpu().clone(), fp8.scale.cpu().clone()))
            runs.append((weights(model), served))
            opt.close()
        (dma_weights, dma_served), (host_weights, host_served) = runs
        for a, b in zip(dma_weights, host_weights):
            self.assertEqual(a.dtype, torch.bfloat16)
            self.assertTrue(torch.equal(a, b))
        for (da, ds), (ha, hs) in zip(dma_served, host_served):
            self.assertTrue(torch.equal(da, ha))
            self.assertTrue(torch.equal(ds, hs))

    def test_one_step_of_staleness_trains_the_same_over_the_host_tier_and_host_copies(self):
        """staleness=1 with bf16 parameters: the host tier (each version copied into a GPU buffer
        while the next forward runs, written into the parameters at the next step()) and the host
        copies give the same losses and weights bit for bit, and the model learns."""
        runs = []
        for host_dma in (True, False):
            model = make_model(seed=9, dtype=torch.bfloat16)
            opt = self.adamw(model, address=self.cpu_daemon.address, state_policy="fp32",
                             serve="bf16", host_dma=host_dma, staleness=1)
            self.assertEqual(opt._dma, host_dma)
            losses = []
            for step in range(8):
                x, y = batch(0, torch.bfloat16)  # one batch: its loss must fall
                loss = F.cross_entropy(model(x).float(), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
            opt.sync_weights()
            runs.append((losses, weights(model)))
            opt.close()
        (dma_losses, dma_weights), (host_losses, host_weights) = runs
        self.assertEqual(dma_losses, host_losses)
        self.assertLess(host_losses[-1], 0.9 * host_losses[0], host_losses)
        for a, b in zip(dma_weights, host_weights):
            self.assertTrue(torch.equal(a, b))

    def test_a_trainer_killed_while_its_gradients_are_copied_leaves_no_slot_marked(self):
        """A trainer pushing 1 GiB of gradients by DMA is killed (SIGKILL) while the push runs:
        the daemon has no byte of step 0 marked (the marks follow the copies), refuses a commit
        naming the first tensor's 0 bytes, and takes the step from a trainer that comes back."""
        tensors = [(f"t{i:02d}", 4096, 4096, "fp32") for i in range(16)]
        child = subprocess.Popen([sys.executable, "-c", KILLED_TRAINER, self.cpu_daemon.address],
                                 stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(child.stdout.readline().strip(), "pushing")
            time.sleep(0.01)
            child.kill()
            rest = child.stdout.read()
        finally:
            child.wait()
        self.assertNotIn("pushed", rest, "the push ended before the kill: no copy was cut")
        client = paramd.connect(self.cpu_daemon.address, transport="shm", cuda_device=0)
        client.register(job="killed", rank=0, world_size=1, tensors=tensors,
                        hyperparams=paramd.hyperparams(lr=1e-2), serve=["fp32"])
        with self.assertRaises(paramd.StatusError) as caught:
            client.commit("killed", 0, 0, lr=1e-2, grad_scale=1.0)
        self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")
        self.assertIn('tensor "t00" has 0 of', str(caught.exception))
        grads = {name: torch.full((rows, cols), 1e-3, device=DEVICE)
                 for name, rows, cols, _ in tensors}
        paramd.push_gradients(client, "killed", 0, 0, grads)
        client.commit("killed", 0, 0, lr=1e-2, grad_scale=1.0)
        for name, _, _, _ in tensors:  # AdamW's first step against g > 0, from zeros
            self.assertTrue(torch.all(paramd.pull(client, "killed", name, "fp32", 1).data < 0))
        client.close()

    def test_lent_gradients_train_as_copied_ones_and_take_no_daemon_slots(self):
        """Gradients lent to the daemon (the default: read where backward left them, in another
        process) and copied into its slots give the same weights bit for bit, also when
        zero_grad zeroes them in place right after step(); the lent job holds no slots."""
        finals = []
        for lend, set_to_none in ((False, True), (True, True), (True, False)):
            model = make_model(seed=5)
            opt = self.adamw(model, state_policy="fp8", serve="bf16", max_grad_norm=1.0,
                             lend_gradients=lend)
            for step in range(5):
                x, y = batch(step)
                F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)
            opt.sync_weights()
            slot_bytes = opt.daemon_status()[0]["slot_bytes"]
            if lend:
                self.assertEqual(slot_bytes, 0, "the daemon kept slots for lent gradients")
            else:
                self.assertGreater(slot_bytes, 0)
            finals.append(weights(model))
            opt.close()
        for run in finals[1:]:
            for a, b in zip(finals[0], run):
                self.assertTrue(torch.equal(a, b))

    def test_step_and_the_next_forward_are_queued_while_the_gpu_is_still_busy(self):
        """Neither the trainer's host nor the daemon's waits for backward: with a long GPU sleep
        queued ahead of each backward, step() and the next forward return while the GPU is still
        busy, and the weights are those of the same run without the sleeps, bit for bit (the
        daemon's step waited for the lent gradients on the GPU, the forward for the step)."""
        finals = []
        for sleep in (False, True):
            model = make_model(seed=6)
            opt = self.adamw(model, state_policy="fp8", serve="bf16", max_grad_norm=1.0)
            # Every batch goes up before the loop: a copy from pageable host memory (x.to(DEVICE))
            # synchronizes the stream, which would wait for the sleep itself.
            batches = [batch(step) for step in range(5)]
            x, y = batches[0]
            loss = F.cross_entropy(model(x), y)
            for step in range(4):
                if sleep:
                    torch.cuda.synchronize()
                    torch.cuda._sleep(int(1.5e9))  # about a second of GPU clock cycles
                    started = time.perf_counter()
                loss.backward()
                opt.step()
                stepped = time.perf_counter() - started if sleep else 0.0
                opt.zero_grad(set_to_none=True)
                x, y = batches[step + 1]
                loss = F.cross_entropy(model(x), y)  # loads the step's version first
                if sleep:
                    queued = time.perf_counter() - started
                    busy = not torch.cuda.current_stream().query()
                    torch.cuda.synchronize()
                    total = time.perf_counter() - started
                    where = (f"backward and step() took {stepped:.3f} s, with the next forward "
                             f"{queued:.3f} s, of the {total:.3f} s the GPU was busy")
                    self.assertTrue(busy, f"step {step}: the GPU was idle once the host had "
                                    f"queued the next forward ({where})")
                    self.assertLess(queued, 0.5 * total, f"step {step}: a host waited ({where})")
            opt.sync_weights()
            finals.append(weights(model))
            opt.close()
        for a, b in zip(*finals):
            self.assertTrue(torch.equal(a, b))

    def test_bf16_parameters_push_bf16_and_may_view_their_weights_in_place(self):
        runs = []
        for in_place in (False, True):
            model = make_model(seed=4, dtype=torch.bfloat16)
            opt = self.adamw(model, state_policy="fp8", serve="bf16", weights_in_place=in_place)
            self.assertTrue(all(t.grad_type == "bf16" for j in opt._jobs for t in j.tensors))
            losses = train(model, opt, 5, dtype=torch.bfloat16)
            if in_place:
                for p in model.parameters():
                    served = opt.served(p)
                    self.assertEqual(p.data_ptr(), served.data.data_ptr())  # no copy
                # Every version's leases but the loaded one's are let go.
                client = opt._jobs[0].client
                tensors = len(list(model.parameters()))
                self.assertEqual(leases_reach(client, opt._jobs[0].name, tensors), tensors)
            runs.append((losses, weights(model)))
            opt.close()
        self.assertEqual(runs[0][0], runs[1][0])
        for a, b in zip(runs[0][1], runs[1][1]):
            self.assertTrue(torch.equal(a, b))

    def test_served_fp8_tensor_weights_feed_scaled_mm(self):
        model = make_model(seed=5)
        opt = self.adamw(model, state_policy="fp8", serve=["bf16", "fp8_tensor"])
        train(model, opt, 2)
        linear = model[2]
        served = opt.served(linear.weight, "fp8_tensor")
        self.assertTrue(served.data.is_cuda and served.scale.is_cuda)
        self.assertEqual(served.data.dtype, torch.float8_e4m3fn)
        x = torch.randn(64, 96, device=DEVICE)
        amax = x.abs().amax()
        x_scale_inv = (amax / 448.0).reshape(1, 1)
        xq = (x / x_scale_inv).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, served.data.t(), scale_a=x_scale_inv,
                             scale_b=served.scale.reshape(1, 1), out_dtype=torch.float32)
        expected = x @ paramd.dequantize(served).t()
        self.assertLess(float((y - expected).norm() / expected.norm()), 0.08)
        opt.close()

    def test_state_dict_round_trip_on_the_cuda_backend_resumes_bit_identically(self):
        model = make_model(seed=6)
        opt = self.adamw(model, state_policy="fp8", serve="bf16")
        train(model, opt, 3)
        saved = opt.state_dict()
        train(model, opt, 3, first_step=3)
        straight = weights(model)
        opt.close()
        # A new job with other initial weights, loaded from the saved state, trains on the same.
        resumed = make_model(seed=7)
        opt = self.adamw(resumed, state_policy="fp8", serve="bf16")
        opt.load_state_dict(saved)
        again = opt.state_dict()
        for index, fields in saved["state"].items():
            for field, tensor in fields.items():
                self.assertTrue(torch.equal(tensor.view(torch.uint8) if tensor.numel() else tensor,
                                            again["state"][index][field].view(torch.uint8)
                                            if tensor.numel() else again["state"][index][field]),
                                field)
        train(resumed, opt, 3, first_step=3)
        for a, b in zip(weights(resumed), straight):
            self.assertTrue(torch.equal(a, b))
        opt.close()


def main():
    if not torch.cuda.is_available():
        # The CUDA paths fail with a clear message where there is no GPU.
        with support.daemon(step_threads=1) as daemon:
            try:
                paramd.connect(daemon.address, transport="cuda_ipc").register(
                    job="nogpu", rank=0, world_size=1, tensors=[("w", 4, 4, "fp32")],
                    hyperparams=paramd.hyperparams())
            except paramd.StatusError as error:
                if error.code != "FAILED_PRECONDITION":
                    print(f"FAILED: cuda_ipc without a GPU gave {error.code}: {error}")
                    return 1
                print(f"cuda_ipc without a GPU: {error}")
            else:
                print("FAILED: cuda_ipc was accepted without a GPU")
                return 1
        print("SKIPPED: no CUDA GPU visible to torch "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
        return support.SKIP
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
