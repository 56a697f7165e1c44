"""paramd.torch.AdamW with staleness=1 against a real daemon: iteration t's forward and backward
run on version t-1 (iterations 0 and 1 on version 0) without waiting for the step committed just
before, bit for bit the trajectory a synchronous optimizer gives when fed the same stale
weights; a rank that runs ahead of another waits for the job, not the daemon's step."""

import threading
import unittest

import support

support.require_torch()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import paramd  # noqa: E402
import paramd.torch  # noqa: E402


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 40), nn.Tanh(),
                         nn.Linear(40, 3))


def batch(step, rank=0):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)


def groups(model):
    decay = [(n, p) for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [(n, p) for n, p in model.named_parameters() if p.dim() != 2]
    return [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def record_forward_weights(model):
    """A list that gets the weights each forward of the model ran on (read as it ends: the
    optimizer's pre-hooks load a version into each layer as it starts)."""
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(weights(module)))
    return seen


class RefusalsSeen:
    """A client's stand-in that passes every call on and notes the steps of the pushes the
    daemon refused (FAILED_PRECONDITION)."""

    def __init__(self, client):
        self._client = client
        self._changed = threading.Condition()
        self.steps = set()

    def __getattr__(self, name):
        return getattr(self._client, name)

    def push_gradients(self, job, rank, step, items):
        try:
            return self._client.push_gradients(job, rank, step, items)
        except paramd.StatusError as error:
            if error.code == "FAILED_PRECONDITION":
                with self._changed:
                    self.steps.add(step)
                    self._changed.notify_all()
            raise

    def wait_refused(self, step, timeout_s=60):
        with self._changed:
            return self._changed.wait_for(lambda: step in self.steps, timeout_s)


class StalenessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = support.daemon(step_threads=1)
        cls.jobs = 0

    @classmethod
    def tearDownClass(cls):
        cls.daemon.__exit__(None, None, None)

    def adamw(self, params, **kwargs):
        StalenessTest.jobs += 1
        options = dict(lr=1e-2, address=self.daemon.address, job=f"stale{self.jobs}",
                       state_policy="fp8", max_grad_norm=1.0)
        options.update(kwargs)
        return paramd.torch.AdamW(params, **options)

    def assert_equal_weights(self, a, b, what):
        for i, (p, q) in enumerate(zip(a, b)):
            self.assertTrue(torch.equal(p, q), f"{what}: parameter {i}")

    def train_stale(self, steps, module, **options):
        """`steps` iterations with staleness=1 (and `options`); returns (the weights each forward
        ran on, the weights after sync_weights())."""
        model = make_model()
        opt = self.adamw(groups(model), staleness=1, module=model if module else None, **options)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        used = record_forward_weights(model)
        for step in range(steps):
            x, y = batch(step)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        opt.sync_weights()
        self.assertEqual(opt.next_step, steps)
        final = weights(model)
        opt.close()
        return used, final

    def test_each_forward_runs_on_the_version_before_the_newest_bit_for_bit(self):
        steps = 7
        # The reference: a synchronous optimizer (staleness 0, every version loaded by step()),
        # whose model is given version max(t-1, 0) before iteration t's forward.
        model = make_model()
        opt = self.adamw(groups(model), module=None)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        versions = [weights(model)]
        for step in range(steps):
            with torch.no_grad():
                for p, w in zip(model.parameters(), versions[max(step - 1, 0)]):
                    p.copy_(w)
            x, y = batch(step)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            versions.append(weights(model))
        opt.close()
        self.assertFalse(torch.equal(versions[-1][0], versions[0][0]))
        # Also a job sharded over a daemon's three backends (the client pushes, commits and
        # pulls every owner's part).
        several = support.daemon(backend="cpu:0,cpu:1,cpu:2", step_threads=3)
        try:
            for module, options in ((True, {}), (False, {}),
                                    (True, {"address": several.address})):
                what = f"module={module}, {options}"
                used, final = self.train_stale(steps, module, **options)
                self.assertEqual(len(used), steps)
                for step in range(steps):
                    self.assert_equal_weights(used[step], versions[max(step - 1, 0)],
                                              f"{what}, iteration {step}'s forward")
                self.assert_equal_weights(final, versions[steps], f"{what}, after sync")
        finally:
            several.stop()

    def test_a_forward_runs_before_the_step_committed_last_can_run(self):
        # Rank 0 trains with staleness=1; rank 1 (staleness 0, in this thread too) commits each
        # step only after rank 0's next forward and backward, so the daemon cannot have run the
        # step rank 0 committed last when that forward starts. Rank 0's pushes of that backward
        # (a bucket per gradient: pushed while backward runs) come before rank 1's commit of
        # the step before, ahead of the job: the daemon refuses them, and they wait for it.
        steps = 5
        stale, fresh = make_model(), make_model()
        opt_stale = self.adamw(stale.named_parameters(), staleness=1, module=stale, rank=0,
                               world_size=2, bucket_bytes=1)
        opt_fresh = self.adamw(fresh.named_parameters(), job=opt_stale._jobs[0].name,
                               module=fresh, rank=1, world_size=2)
        used_stale, used_fresh = record_forward_weights(stale), record_forward_weights(fresh)
        status = paramd.connect(self.daemon.address)
        job = opt_stale._jobs[0].name
        seen = opt_stale._jobs[0].client = RefusalsSeen(opt_stale._jobs[0].client)

        def iteration(model, opt, step, rank):
            x, y = batch(step, rank)
            F.cross_entropy(model(x), y).backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()

        iteration(stale, opt_stale, 0, 0)
        for step in range(steps):
            iteration(stale, None, step + 1, 0)
            # Rank 1 has not committed `step`: the job still collects it, so the daemon has not
            # run it, and rank 0's forward above ran without its version.
            self.assertEqual(status.status(job)["jobs"][0]["next_step"], step)
            self.assertTrue(seen.wait_refused(step + 1), f"no push of step {step + 1} refused")
            iteration(fresh, opt_fresh, step, 1)
            opt_stale.step()
            opt_stale.zero_grad()
        iteration(fresh, opt_fresh, steps, 1)
        opt_stale.sync_weights()
        opt_fresh.sync_weights()
        # Rank 1 ran iteration t on version t, rank 0 ran iteration t on version t-1: the
        # versions each received from the daemon are the same bits.
        self.assert_equal_weights(used_stale[0], used_fresh[0], "version 0")
        for step in range(steps):
            self.assert_equal_weights(used_stale[step + 1], used_fresh[step],
                                      f"version {step} in rank 0's iteration {step + 1}")
        self.assert_equal_weights(weights(stale), weights(fresh), f"version {steps + 1}")
        self.assertEqual(status.status(job)["jobs"][0]["next_step"], steps + 1)
        self.assertEqual(seen.steps, set(range(1, steps + 1)))
        opt_stale.close()
        opt_fresh.close()

    def test_staleness_is_zero_or_one(self):
        for bad in (2, -1, True, "1", 1.0):
            with self.assertRaises(ValueError, msg=repr(bad)):
                self.adamw(make_model().named_parameters(), staleness=bad)


if __name__ == "__main__":
    unittest.main()
