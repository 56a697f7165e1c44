"""paramd's Python bindings against a real daemon: register, push, commit, pull in every serve
format (zero-copy views, dequantized against the recipes' error bounds), errors with codes."""

import gc
import os
import time
import unittest

import support

support.require_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import paramd  # noqa: E402

FORMATS = ["fp32", "bf16", "fp16", "fp8_tensor", "fp8_block", "mxfp8", "bf16:columnwise",
           "fp8_block:columnwise", "mxfp8:columnwise"]
# Largest error of one element relative to its block's amax (FP8 E4M3 keeps 3 mantissa bits:
# half an ulp is 2^-4 of the value; the block's pow2 scale costs at most another factor 2) or to
# the element itself (16-bit formats).
FP8_BOUND = 2.0 ** -3
ROWS, COLS = 130, 70  # not multiples of 128 or 32: edge blocks are partial


class BindingsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = support.daemon(step_threads=1)
        # The daemon lists below name daemons that do not exist: register() does not wait for them.
        cls.client = paramd.connect(cls.daemon.address, daemons_wait_s=0)
        cls.weights = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(3)) * 0.02
        reply = cls.client.register(
            job="bind", rank=0, world_size=1, tensors=[("w", ROWS, COLS, "fp32")],
            hyperparams=paramd.hyperparams(lr=1e-2, weight_decay=0.0),
            serve=FORMATS)
        assert reply["version"] == -1 and reply["next_step"] == 0
        paramd.upload_initial_weights(cls.client, "bind", {"w": cls.weights})

    @classmethod
    def tearDownClass(cls):
        del cls.client
        cls.daemon.__exit__(None, None, None)

    def test_every_format_dequantizes_within_its_recipe_bound(self):
        w = self.weights
        for fmt in FORMATS:
            with self.subTest(fmt=fmt):
                served = paramd.pull(self.client, "bind", "w", fmt, 0)
                self.assertEqual(served.version, 0)
                columnwise = fmt.endswith(":columnwise") and not fmt.startswith("mxfp8")
                self.assertEqual(tuple(served.data.shape),
                                 (COLS, ROWS) if columnwise else (ROWS, COLS))
                x = paramd.dequantize(served)
                self.assertEqual(tuple(x.shape), (ROWS, COLS))
                error = (x - w).abs()
                if fmt == "fp32":
                    self.assertTrue(torch.equal(x, w))
                elif fmt.startswith(("bf16", "fp16")):
                    self.assertEqual(served.data.dtype,
                                     torch.bfloat16 if fmt.startswith("bf16") else torch.float16)
                    # fp16 subnormals (below 2^-14) are spaced 2^-24 apart.
                    self.assertTrue(bool((error <= w.abs() * 2.0 ** -8 + 2.0 ** -25).all()))
                else:
                    self.assertEqual(served.data.dtype, torch.float8_e4m3fn)
                    self.assertIsNotNone(served.scale)
                    self.assertLessEqual(float(error.max()), float(w.abs().max()) * FP8_BOUND)
                    self.assertGreater(float(error.max()), 0.0)

    def test_scales_have_the_headers_shapes(self):
        expected = {"fp8_tensor": (1, 1), "fp8_block": (2, 1), "fp8_block:columnwise": (1, 2),
                    "mxfp8": (ROWS, 3), "mxfp8:columnwise": (5, COLS)}
        for fmt, shape in expected.items():
            with self.subTest(fmt=fmt):
                served = paramd.pull(self.client, "bind", "w", fmt, 0)
                self.assertEqual(tuple(served.scale.shape), shape)
                want = torch.uint8 if fmt.startswith("mxfp8") else torch.float32
                self.assertEqual(served.scale.dtype, want)

    def test_pulled_bytes_are_viewed_not_copied(self):
        pulled = self.client.pull("bind", "w", "fp32", 0)
        view = paramd.served(pulled)
        start = np.asarray(pulled).ctypes.data
        self.assertEqual(view.data.data_ptr(), start)
        self.assertEqual(len(pulled), ROWS * COLS * 4)

    def test_a_step_applies_adamw_to_the_pushed_gradient(self):
        # One step of bias-corrected AdamW moves every weight by lr * sign(g) (to within eps).
        # A job of its own: the other tests read version 0 of "bind".
        client = paramd.connect(self.daemon.address)
        client.register(job="step", rank=0, world_size=1, tensors=[("w", ROWS, COLS, "fp32")],
                        hyperparams=paramd.hyperparams(lr=1e-2, weight_decay=0.0))
        paramd.upload_initial_weights(client, "step", {"w": self.weights})
        grad = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(4))
        paramd.push_gradients(client, "step", 0, 0, {"w": grad})
        reply = client.commit("step", 0, 0, lr=1e-2, grad_scale=1.0)
        self.assertTrue(reply["step_started"])
        new = paramd.pull(client, "step", "w", "fp32", 1).data
        moved = (self.weights - new) / 1e-2
        self.assertTrue(torch.allclose(moved, grad.sign(), atol=1e-3))
        status = client.status("step")["jobs"][0]
        self.assertEqual(status["applied_steps"], 1)

    def test_pull_in_place_views_the_served_bytes_under_a_lease_its_tensor_holds(self):
        client = paramd.connect(self.daemon.address)
        client.register(job="view", rank=0, world_size=1, tensors=[("w", ROWS, COLS, "fp32")],
                        hyperparams=paramd.hyperparams(lr=1e-2))
        self.assertEqual(client.transport, "shm")  # the daemon is local: shm is the automatic pick
        self.assertEqual(client.transport_traits(), [{
            "daemon": "", "name": "shm", "reads_device_memory": False, "views_in_place": True,
            "memory": "host"}])
        paramd.upload_initial_weights(client, "view", {"w": self.weights})

        def leases():
            return client.status("view")["jobs"][0]["leases"]

        def leases_reach(count):
            give_up = time.monotonic() + 10.0
            while leases() != count and time.monotonic() < give_up:
                gc.collect()
                time.sleep(0.01)
            return leases() == count

        w = paramd.pull_in_place(client, "view", "w", "fp32", 0).data
        self.assertTrue(torch.equal(w, self.weights))
        self.assertEqual(leases(), 1)
        # Later steps publish new versions; the leased version 0 stays, byte for byte.
        for step in range(3):
            grad = torch.full((ROWS, COLS), 0.01 * (step + 1))
            paramd.push_gradients(client, "view", 0, step, {"w": grad})
            client.commit("view", 0, step)
        newest = paramd.pull(client, "view", "w", "fp32", 3).data
        self.assertFalse(torch.equal(newest, self.weights))
        self.assertTrue(torch.equal(w, self.weights))
        # The tensor holds the lease: it ends when the tensor goes.
        del w
        self.assertTrue(leases_reach(0), f"{leases()} leases left after the view went")

        view = client.pull_in_place("view", "w", "fp32", 3)
        self.assertEqual(view.version, 3)
        self.assertFalse(view.on_device)
        self.assertTrue(leases_reach(1))
        view.release()
        self.assertTrue(view.released)
        self.assertTrue(leases_reach(0))
        self.assertEqual(len(memoryview(view)), 0)  # no bytes to read once released
        with self.assertRaises(ValueError):
            paramd.served(view)
        client.close()

    def test_pull_in_place_over_inline_is_failed_precondition(self):
        client = paramd.connect(self.daemon.address, transport="inline")
        self.assertEqual(client.transport_traits(), [])  # none before register()
        reply = client.register(job="inline-traits", rank=0, world_size=1,
                                tensors=[("w", ROWS, COLS, "fp32")],
                                hyperparams=paramd.hyperparams(lr=1e-2))
        self.assertEqual(reply["transport_traits"], [{
            "daemon": "", "name": "inline", "reads_device_memory": False,
            "views_in_place": False, "memory": None}])
        self.assertEqual(client.transport_traits(), reply["transport_traits"])
        with self.assertRaises(paramd.StatusError) as caught:
            client.pull_in_place("bind", "w", "fp32", 0, 5.0)
        self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")
        client.close()

    def test_pull_many_gives_each_tensor_in_the_order_asked(self):
        shapes = {"a": (3, 5), "b": (64, 2), "c": (1, 7)}
        self.client.register(job="many", rank=0, world_size=1,
                             tensors=[(n, r, c, "fp32") for n, (r, c) in shapes.items()],
                             hyperparams=paramd.hyperparams(), serve=["fp32", "bf16"])
        weights = {n: torch.randn(r, c, generator=torch.Generator().manual_seed(i))
                   for i, (n, (r, c)) in enumerate(shapes.items())}
        paramd.upload_initial_weights(self.client, "many", weights)
        for fmt in ("fp32", "bf16"):
            with self.subTest(fmt=fmt):
                many = paramd.pull_many(self.client, "many", ["c", "a", "b"], fmt, 0)
                self.assertEqual(list(many), ["c", "a", "b"])
                for name, got in many.items():
                    alone = paramd.pull(self.client, "many", name, fmt, 0)
                    self.assertEqual(tuple(got.data.shape), shapes[name])
                    self.assertTrue(torch.equal(got.data, alone.data), name)
                    if fmt == "fp32":
                        self.assertTrue(torch.equal(got.data, weights[name]), name)
        with self.assertRaises(paramd.StatusError) as caught:
            self.client.pull_many("many", ["a", "a"], "fp32", 0, 5.0)
        self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")

    def test_pull_in_place_many_slices_few_blocks_whose_leases_end_together(self):
        client = paramd.connect(self.daemon.address)
        shapes = {"a": (3, 5), "b": (130, 70), "c": (1, 7), "d": (64, 33)}
        client.register(job="batch", rank=0, world_size=1,
                        tensors=[(n, r, c, "fp32") for n, (r, c) in shapes.items()],
                        hyperparams=paramd.hyperparams(), serve=FORMATS)
        self.assertEqual(client.transport, "shm")
        weights = {n: torch.randn(r, c, generator=torch.Generator().manual_seed(i))
                   for i, (n, (r, c)) in enumerate(shapes.items())}
        paramd.upload_initial_weights(client, "batch", weights)
        order = ["d", "a", "c", "b"]
        for fmt in FORMATS:
            with self.subTest(fmt=fmt):
                batch = client.pull_in_place_batch("batch", order, fmt, 0)
                self.assertEqual(len(batch), len(order))
                self.assertFalse(batch.on_device)
                # One block per region the views lie in: fewer than the tensors here.
                self.assertLess(len(batch.blocks), len(order))
                self.assertEqual(client.status("batch")["jobs"][0]["leases"], len(order))
                got = paramd.pull_in_place_many(client, "batch", order, fmt, 0)
                self.assertEqual(list(got), order)
                for name in order:
                    alone = paramd.pull(client, "batch", name, fmt, 0)
                    self.assertTrue(torch.equal(got[name].data.view(torch.uint8),
                                                alone.data.view(torch.uint8)), name)
                    if alone.scale is None:
                        self.assertIsNone(got[name].scale)
                    else:
                        self.assertTrue(torch.equal(got[name].scale, alone.scale), name)
                    self.assertTrue(torch.equal(paramd.dequantize(got[name]),
                                                paramd.dequantize(alone)), name)
                batch.release()
                self.assertTrue(batch.released)
                with self.assertRaises(ValueError):
                    paramd._formats.block_tensors(batch)
                del got
                gc.collect()
                give_up = time.monotonic() + 10.0
                while (client.status("batch")["jobs"][0]["leases"] and
                       time.monotonic() < give_up):
                    gc.collect()
                    time.sleep(0.01)
                self.assertEqual(client.status("batch")["jobs"][0]["leases"], 0)
        client.close()

    def test_a_daemon_list_is_sent_sorted_and_must_name_this_daemon(self):
        me = self.client.status("")["advertise_address"]
        self.assertEqual(me, self.daemon.address)
        # A job over three real daemons, given out of order: the client registers with each.
        others = [support.daemon(step_threads=1) for _ in range(2)]
        try:
            listed = sorted([me] + [o.address for o in others], reverse=True)
            client = paramd.connect(me, daemons_wait_s=0)
            client.register(job="listed", rank=0, world_size=1, tensors=[("w", 4, 8, "fp32")],
                            hyperparams=paramd.hyperparams(), daemons=listed)
            for address in [me] + [o.address for o in others]:
                status = paramd.connect(address).status("listed")
                self.assertEqual(status["jobs"][0]["daemons"], sorted(listed))
            # A list of one daemon that is not this one: refused by this daemon, naming itself.
            with self.assertRaises(paramd.StatusError) as caught:
                client.register(job="elsewhere", rank=0, world_size=1,
                                tensors=[("w", 4, 8, "fp32")], hyperparams=paramd.hyperparams(),
                                daemons=["127.0.0.1:1"])
            self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")
            self.assertIn(me, str(caught.exception))
            client.close()
        finally:
            for o in others:
                o.stop()

    def test_a_dns_name_in_the_list_stands_for_the_addresses_it_resolves_to(self):
        me = self.client.status("")["advertise_address"]
        host, port = me.rsplit(":", 1)
        client = paramd.connect(self.daemon.address, daemons_count=1, daemons_wait_s=5.0)
        client.register(job="named", rank=0, world_size=1, tensors=[("w", 4, 8, "fp32")],
                        hyperparams=paramd.hyperparams(), daemons=[f"dns:{host}:{port}"])
        self.assertEqual(self.client.status("named")["jobs"][0]["daemons"], [me])
        with self.assertRaises(paramd.StatusError) as caught:
            client.register(job="malformed", rank=0, world_size=1, tensors=[("w", 4, 8, "fp32")],
                            hyperparams=paramd.hyperparams(), daemons=[f"dns:{host}"])
        self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
        self.assertIn("dns:NAME:PORT", str(caught.exception))
        client.close()

    def test_a_register_waits_for_the_jobs_daemons_and_names_those_that_never_answer(self):
        me = self.client.status("")["advertise_address"]
        client = paramd.connect(self.daemon.address, daemons_wait_s=0.3)
        started = time.monotonic()
        with self.assertRaises(paramd.StatusError) as caught:
            client.register(job="waits", rank=0, world_size=1, tensors=[("w", 4, 8, "fp32")],
                            hyperparams=paramd.hyperparams(), daemons=[me, "127.0.0.1:1"])
        self.assertGreaterEqual(time.monotonic() - started, 0.25)
        self.assertEqual(caught.exception.code, "DEADLINE_EXCEEDED")
        self.assertIn("127.0.0.1:1 of its daemons", str(caught.exception))
        self.assertNotIn("waits", [j["name"] for j in self.client.status("")["jobs"]])
        client.close()

    def test_pre_reduced_jobs_take_one_ranks_push_per_daemon(self):
        # A job over two daemons: rank i of 2 pushes daemon i's part (sorted list), reduced over
        # the ranks. "w" is one whole tensor, which the shard map gives to the first daemon: rank
        # 0 pushes it, and rank 1's push sends nothing.
        other = support.daemon(step_threads=1)
        try:
            daemons = sorted([self.daemon.address, other.address])
            clients = [paramd.connect(self.daemon.address, daemons_wait_s=0) for _ in range(2)]
            for rank, client in enumerate(clients):
                client.register(job="pre", rank=rank, world_size=2,
                                tensors=[("w", ROWS, COLS, "fp32")],
                                hyperparams=paramd.hyperparams(lr=1e-2, weight_decay=0.0),
                                daemons=daemons, push_mode="pre_reduced")
            paramd.upload_initial_weights(clients[0], "pre", {"w": self.weights})
            grad = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(5))
            paramd.push_gradients(clients[1], "pre", 1, 0, {"w": grad * 100})  # sends nothing
            paramd.push_gradients(clients[0], "pre", 0, 0, {"w": grad})
            for rank, client in enumerate(clients):
                client.commit("pre", rank, 0, lr=1e-2, grad_scale=0.5)
            new = paramd.pull(clients[0], "pre", "w", "fp32", 1).data
            self.assertTrue(torch.allclose((self.weights - new) / 1e-2, grad.sign(), atol=1e-3))
            with self.assertRaises(ValueError):
                clients[0].register(job="pre", rank=0, world_size=2,
                                    tensors=[("w", ROWS, COLS, "fp32")],
                                    hyperparams=paramd.hyperparams(), push_mode="summed")
            for client in clients:
                client.close()
        finally:
            other.stop()

    def test_errors_carry_the_daemons_code(self):
        with self.assertRaises(paramd.StatusError) as caught:
            self.client.pull("bind", "no_such_tensor", "fp32", 0, 5.0)
        self.assertEqual(caught.exception.code, "NOT_FOUND")
        with self.assertRaises(ValueError):
            self.client.pull("bind", "w", "fp7", 0, 5.0)
        with self.assertRaises(ValueError):
            paramd.state_policy({"exp_avg": "fp8", "momentum": "fp8"})

    def test_a_daemon_that_exits_before_serving_fails_its_start_at_once_with_its_log(self):
        # paramd.daemon waits by `paramctl wait`'s rule (paramd._paramd.wait_until_serving).
        from paramd.daemon import Daemon
        start = time.monotonic()
        with self.assertRaises(RuntimeError) as caught:
            Daemon(self.daemon.binary, extra_args=["--no_such_flag"], start_timeout_s=60)
        self.assertLess(time.monotonic() - start, 10)
        message = str(caught.exception)
        self.assertIn("ended before the daemon served", message)
        self.assertIn("no_such_flag", message)  # the daemon's log follows
        with self.assertRaises(paramd.StatusError) as caught:
            paramd._paramd.wait_until_serving("/nonexistent/paramd/address", 0, 0.2)
        self.assertEqual(caught.exception.code, "DEADLINE_EXCEEDED")
        self.assertEqual(paramd._paramd.wait_until_serving(self.daemon_address_file(), 0, 5),
                         self.daemon.address)

    def daemon_address_file(self):
        return os.path.join(self.daemon._dir.name, "address")

    def test_non_contiguous_buffers_are_refused(self):
        grad = np.zeros((ROWS, COLS * 2), dtype=np.float32)[:, ::2]
        with self.assertRaises(ValueError):
            self.client.push_gradients("bind", 0, 5, [("w", grad)])


if __name__ == "__main__":
    unittest.main(verbosity=2)
