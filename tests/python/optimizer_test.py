"""paramd.torch.AdamW in one process against a real daemon: the same trajectory as
torch.optim.AdamW (fp32 policy, param groups, an LR scheduler, gradient accumulation), lazy
weight loading before each module's forward, served FP8 weights, state_dict round trips."""

import copy
import os
import socket
import tempfile
import unittest
from unittest import mock

import support

support.require_torch()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import paramd  # noqa: E402
import paramd.torch  # noqa: E402


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 40), nn.Tanh(),
                         nn.Linear(40, 3))


def make_model_weight(model):
    return next(model.parameters()).detach().clone()


def batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)


def groups(model, named):
    decay = [(n, p) for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [(n, p) for n, p in model.named_parameters() if p.dim() != 2]
    strip = (lambda pairs: pairs) if named else (lambda pairs: [p for _, p in pairs])
    return [{"params": strip(decay), "weight_decay": 0.05},
            {"params": strip(no_decay), "weight_decay": 0.0}]


def train(model, opt, steps, micro_batches=1, first_step=0):
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for step in range(first_step, first_step + steps):
        for micro in range(micro_batches):
            x, y = batch(step, micro)
            last = micro == micro_batches - 1
            context = opt.accumulating() if (hasattr(opt, "accumulating") and not last) else (
                _nothing())
            with context:
                F.cross_entropy(model(x), y).div(micro_batches).backward()
        opt.step()
        opt.zero_grad()
        sched.step()


def _join_gloo(rank, port):
    """Rank `rank` of two, over gloo on 127.0.0.1:port, one thread each."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.set_num_threads(1)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_rank_resume(rank, address, port, out_dir):
    """Each rank trains 3 steps, saves, trains 3 more (A); then, on a new job with other initial
    weights, loads the saved state and trains the same 3 steps (B). Rank r writes A == B."""
    _join_gloo(rank, port)

    def run(job, seed, saved=None):
        model = make_model(seed)
        opt = paramd.torch.AdamW(model.named_parameters(), lr=1e-2, address=address, job=job,
                                 module=model, state_policy="fp8", serve="bf16")
        first = 0
        if saved is not None:
            opt.load_state_dict(saved)
            first = 3
        for step in range(first, 6):
            if step == 3 and saved is None:
                saved = opt.state_dict()
            x, y = batch(step, rank)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        opt.sync_weights()
        opt.close()
        return model, saved

    straight, saved = run("resume-a", 0)
    resumed, _ = run("resume-b", 7, saved)
    same = all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters()))
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write("same" if same else "different")
    dist.destroy_process_group()


def _two_rank_pre_reduced(rank, single, daemons, port, out_dir):
    """Two ranks train the same model three ways: every rank pushing its gradients (full) to one
    daemon; the ranks reducing them with torch.distributed (gloo) and one rank pushing each
    owner's part (pre_reduced), to one daemon and over three. With two ranks the sum is one FP32
    addition, the same whichever rank adds, so the collective's sum is the daemon's own: the three
    runs end bit for bit the same. Rank r writes what it found."""
    _join_gloo(rank, port)

    def run(job, address, mode, listed):
        torch.manual_seed(4)
        model = nn.Sequential(nn.Linear(12, 600), nn.Tanh(), nn.Linear(600, 3))
        opt = paramd.torch.AdamW(model.named_parameters(), lr=1e-2, address=address, job=job,
                                 module=model, state_policy="fp8", max_grad_norm=0.5,
                                 push_mode=mode, daemons=listed)
        for step in range(4):
            x, y = batch(step, rank)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        opt.sync_weights()
        opt.close()
        return [p.detach().clone() for p in model.parameters()]

    full = run("pre-full", single, "full", None)
    one = run("pre-one", single, "pre_reduced", None)
    three = run("pre-three", daemons[0], "pre_reduced", daemons)
    torch.manual_seed(4)
    initial = list(nn.Sequential(nn.Linear(12, 600), nn.Tanh(), nn.Linear(600, 3)).parameters())
    found = []
    if not all(torch.equal(a, b) for a, b in zip(full, one)):
        found.append("pre_reduced on one daemon differs from full")
    if not all(torch.equal(a, b) for a, b in zip(full, three)):
        found.append("pre_reduced over three daemons differs from full")
    if all(torch.equal(a, b) for a, b in zip(full, initial)):
        found.append("the weights did not change")
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write("; ".join(found) or "same")
    dist.destroy_process_group()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class OptimizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = support.daemon(step_threads=1)
        cls.jobs = 0

    @classmethod
    def tearDownClass(cls):
        cls.daemon.__exit__(None, None, None)

    def paramd_adamw(self, model, **kwargs):
        OptimizerTest.jobs += 1
        options = dict(lr=1e-2, address=self.daemon.address, job=f"opt{self.jobs}",
                       module=model)
        options.update(kwargs)
        return paramd.torch.AdamW(groups(model, named=True), **options)

    def daemon_client(self):
        return paramd.connect(self.daemon.address)

    def assert_same_weights(self, a, b, rtol):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            scale = float(q.detach().abs().max())
            self.assertLessEqual(float((p - q).detach().abs().max()), rtol * scale, name)

    def assert_same_trained_model(self, a, b):
        """make_model()s trained two ways: the same weights bit for bit, moved from the start."""
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            self.assertTrue(torch.equal(p, q), name)
        self.assertFalse(torch.equal(make_model_weight(a), make_model_weight(make_model())))

    def test_fp32_policy_follows_torch_adamw(self):
        ours, theirs = make_model(), make_model()
        opt = self.paramd_adamw(ours)
        train(ours, opt, 8, micro_batches=2)
        opt.sync_weights()
        opt.close()
        train(theirs, torch.optim.AdamW(groups(theirs, named=False), lr=1e-2), 8,
              micro_batches=2)
        self.assert_same_weights(ours, theirs, rtol=1e-5)

    def test_initial_weights_in_groups_train_as_in_one_push(self):
        """Rank 0 uploads version 0 in groups of about _UPLOAD_GROUP_BYTES (a large model's host
        copy one group at a time): with a group per tensor the model trains bit for bit as with
        the whole model in one push."""
        trained = []
        # Two jobs (paramd_adamw: one per param group) of three tensors each.
        for group_bytes, pushes in ((paramd.torch._UPLOAD_GROUP_BYTES, 2), (1, 6)):
            model = make_model()
            with mock.patch.object(paramd.torch, "_UPLOAD_GROUP_BYTES", group_bytes), \
                    mock.patch.object(paramd, "upload_initial_weights",
                                      wraps=paramd.upload_initial_weights) as upload:
                opt = self.paramd_adamw(model, state_policy="fp8")
            self.assertEqual(upload.call_count, pushes)
            train(model, opt, 3)
            opt.sync_weights()
            opt.close()
            trained.append(model)
        self.assert_same_trained_model(*trained)

    def train_sharded_and_one(self, **sharded):
        """Six steps of a model whose Linear(12, 600) weight, 600 rows and most of the job's bytes,
        is split over the owners `sharded` (paramd_adamw's arguments) gives, and of the same
        model on this daemon alone: the weights must end bit-identical. Returns (one, sharded
        model, their optimizers)."""
        def model_of():
            torch.manual_seed(4)
            return nn.Sequential(nn.Linear(12, 600), nn.Tanh(), nn.Linear(600, 3))

        one, three = model_of(), model_of()
        opt_one = self.paramd_adamw(one, state_policy="fp8", max_grad_norm=0.5)
        opt_three = self.paramd_adamw(three, state_policy="fp8", max_grad_norm=0.5, **sharded)
        for model, opt in ((one, opt_one), (three, opt_three)):
            for step in range(6):
                x, y = batch(step)
                F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            opt.sync_weights()
        for (name, p), q in zip(one.named_parameters(), three.parameters()):
            self.assertTrue(torch.equal(p, q), name)
        self.assertFalse(torch.equal(make_model_weight(one), make_model_weight(model_of())))
        return one, three, opt_one, opt_three

    def test_a_job_over_three_daemons_trains_bit_identically_to_one(self):
        # The split weight over the three daemons; the others stay whole.
        others = [support.daemon(step_threads=1) for _ in range(2)]
        try:
            daemons = sorted([self.daemon.address] + [o.address for o in others])
            one, three, opt_one, opt_three = self.train_sharded_and_one(daemons=daemons)
            # Every daemon holds a part of the job (the split weight's rows on each), and the
            # parts' state adds up to the one daemon's.
            name = opt_three._jobs[0].name
            parts = [paramd.connect(a).status(name)["jobs"][0]["state_bytes"] for a in daemons]
            whole = self.daemon_client().status(opt_one._jobs[0].name)["jobs"][0]["state_bytes"]
            self.assertTrue(all(0 < part < whole for part in parts), (parts, whole))
            self.assertEqual(sum(parts), whole)
            # The whole state, from the daemons' parts, is the one daemon's, tensor for tensor.
            saved_one, saved_three = opt_one.state_dict(), opt_three.state_dict()
            self.assertEqual(saved_three["state"].keys(), saved_one["state"].keys())
            for index, fields in saved_one["state"].items():
                self.assertEqual(saved_three["state"][index].keys(), fields.keys())
                for field, tensor in fields.items():
                    self.assertTrue(torch.equal(saved_three["state"][index][field].view(torch.uint8),
                                                tensor.view(torch.uint8)), (index, field))
            # Two more steps, then the saved state back in: the same two steps again end where
            # the one daemon does.
            for model, opt in ((one, opt_one), (three, opt_three)):
                for step in range(6, 8):
                    x, y = batch(step)
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
            opt_three.load_state_dict(saved_three)
            for step in range(6, 8):
                x, y = batch(step)
                F.cross_entropy(three(x), y).backward()
                opt_three.step()
                opt_three.zero_grad()
            opt_one.sync_weights()
            opt_three.sync_weights()
            for (name, p), q in zip(one.named_parameters(), three.parameters()):
                self.assertTrue(torch.equal(p, q), name)
            opt_one.close()
            opt_three.close()
        finally:
            for o in others:
                o.stop()

    def test_a_job_on_a_daemon_of_three_backends_trains_bit_identically_to_one(self):
        # The daemon's address alone: the client shards the job over its backends.
        several = support.daemon(backend="cpu:0,cpu:1,cpu:2", step_threads=3)
        try:
            _, _, opt_one, opt_three = self.train_sharded_and_one(address=several.address)
            backends = paramd.connect(several.address).status()["backend_addresses"]
            self.assertEqual(backends, [f"{several.address}/cpu:{i}" for i in range(3)])
            name = opt_three._jobs[0].name
            parts = [paramd.connect(a).status(name)["jobs"][0]["state_bytes"] for a in backends]
            whole = self.daemon_client().status(opt_one._jobs[0].name)["jobs"][0]["state_bytes"]
            self.assertTrue(all(0 < part < whole for part in parts), (parts, whole))
            self.assertEqual(sum(parts), whole)
            opt_one.close()
            opt_three.close()
        finally:
            several.stop()

    def test_a_model_split_over_two_optimizers_trains_as_one(self):
        """docs/host_tier.md's split: the first layer on a daemon of its own, the rest stepping
        early on another, both optimizers' pre-hooks on one module, the same weights as one
        optimizer over the whole model (no clipping: it is per job)."""
        other = support.daemon(step_threads=1)
        try:
            trained = []
            for split in (False, True):
                model = make_model()
                named = list(model.named_parameters())
                first = [(n, p) for n, p in named if n.startswith("0.")]
                rest = [(n, p) for n, p in named if not n.startswith("0.")]
                OptimizerTest.jobs += 1
                options = dict(lr=1e-2, state_policy="fp8", module=model)
                opts = [paramd.torch.AdamW(first, address=other.address, job=f"first{self.jobs}",
                                           **options),
                        paramd.torch.AdamW(rest, address=self.daemon.address, early_step=True,
                                           job=f"rest{self.jobs}", **options)] if split else [
                    paramd.torch.AdamW(named, address=self.daemon.address,
                                       job=f"whole{self.jobs}", **options)]
                for step in range(5):
                    x, y = batch(step)
                    F.cross_entropy(model(x), y).backward()
                    for opt in opts:
                        opt.step()
                        opt.zero_grad()
                for opt in opts:
                    opt.sync_weights()
                    opt.close()
                trained.append(model)
            self.assert_same_trained_model(*trained)
        finally:
            other.stop()

    def test_weights_are_written_just_before_their_module_runs(self):
        model = make_model()
        opt = self.paramd_adamw(model)
        before = copy.deepcopy(model)
        x, y = batch(0)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        # Nothing written yet: the new version is loaded by the next forward, layer by layer.
        self.assert_same_weights(model, before, rtol=0.0)
        model[0](x)
        self.assertFalse(torch.equal(model[0].weight, before[0].weight))
        self.assertTrue(torch.equal(model[4].weight, before[4].weight))
        model(x)
        self.assertFalse(torch.equal(model[4].weight, before[4].weight))
        self.assertEqual(opt.next_step, 1)
        opt.close()

    def test_fp8_weights_are_served_as_float8_with_scales(self):
        model = make_model()
        opt = self.paramd_adamw(model, serve=["fp32", "fp8_tensor", "mxfp8"],
                                state_policy="fp8")
        x, y = batch(0)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        model(x)
        weight = model[2].weight
        served = opt.served(weight, "fp8_tensor")
        self.assertEqual(served.data.dtype, torch.float8_e4m3fn)
        self.assertEqual(tuple(served.data.shape), tuple(weight.shape))
        self.assertEqual(tuple(served.scale.shape), (1, 1))
        self.assertEqual(served.version, 1)
        approx = served.data.float() * served.scale
        self.assertLess(float((approx - weight).detach().norm() / weight.detach().norm()), 0.05)
        self.assertEqual(opt.served(weight, "mxfp8").scale.dtype, torch.uint8)
        opt.close()

    def test_parameters_without_gradients_still_step(self):
        model = make_model()
        opt = self.paramd_adamw(model)
        model[4].weight.requires_grad_(False)
        x, y = batch(0)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.sync_weights()
        self.assertEqual(opt.daemon_status()[0]["applied_steps"], 1)
        opt.close()

    def test_state_dict_round_trip_continues_bit_identically(self):
        for policy in ("fp32", "fp8"):
            with self.subTest(policy=policy):
                straight = make_model()
                opt = self.paramd_adamw(straight, state_policy=policy, serve="bf16")
                train(straight, opt, 4)
                saved = opt.state_dict()
                fields = saved["state"][0]
                if policy == "fp8":
                    self.assertEqual(fields["exp_avg"].dtype, torch.float8_e4m3fn)
                    self.assertEqual(fields["exp_avg_sq"].dtype, torch.float16)
                    self.assertIn("exp_avg_scales", fields)
                train(straight, opt, 4, first_step=4)
                opt.sync_weights()
                opt.close()

                resumed = make_model(seed=5)  # different weights: the import replaces them
                opt2 = self.paramd_adamw(resumed, state_policy=policy, serve="bf16")
                opt2.load_state_dict(saved)
                self.assertEqual(opt2.next_step, 4)
                train(resumed, opt2, 4, first_step=4)
                opt2.sync_weights()
                opt2.close()
                self.assert_same_weights(resumed, straight, rtol=0.0)

    def test_pre_reduced_ranks_push_the_collectives_sum_once_per_owner(self):
        others = [support.daemon(step_threads=1) for _ in range(2)]
        try:
            daemons = sorted([self.daemon.address] + [o.address for o in others])
            port = _free_port()
            with tempfile.TemporaryDirectory() as out_dir:
                mp.spawn(_two_rank_pre_reduced,
                         args=(self.daemon.address, daemons, port, out_dir), nprocs=2)
                for rank in range(2):
                    with open(os.path.join(out_dir, f"rank{rank}")) as f:
                        self.assertEqual(f.read(), "same", f"rank {rank}")
        finally:
            for o in others:
                o.stop()
        with self.assertRaises(ValueError):
            paramd.torch.AdamW(make_model().named_parameters(), address=self.daemon.address,
                               job="pre-bad", push_mode="reduced")

    def test_two_ranks_resume_from_a_state_dict_bit_identically(self):
        port = _free_port()
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(_two_rank_resume, args=(self.daemon.address, port, out_dir), nprocs=2)
            for rank in range(2):
                with open(os.path.join(out_dir, f"rank{rank}")) as f:
                    self.assertEqual(f.read(), "same", f"rank {rank}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
