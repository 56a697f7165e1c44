"""Tokens from Python: a daemon started with a token file takes paramd.connect's and
paramd.torch.AdamW's calls only with a token (token_file, $PARAMD_TOKEN_FILE, token), each
reaching the jobs its line names; the same over a Unix socket address."""

import os
import tempfile
import unittest

import support

support.require_torch()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import paramd  # noqa: E402
import paramd.torch  # noqa: E402

TRAINER = "python-trainer-token-0123456789"
ADMIN = "python-admin-token-0123456789"


def write_secret(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path


def train(model, opt, steps):
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def model_of():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


class TokensTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="paramd-tokens-")
        tokens = write_secret(os.path.join(cls.dir.name, "tokens"),
                              f"trainer {TRAINER} tok-*\nadmin {ADMIN}\n")
        cls.trainer_file = write_secret(os.path.join(cls.dir.name, "trainer"), TRAINER + "\n")
        cls.socket = os.path.join(cls.dir.name, "paramd.sock")
        cls.daemon = support.daemon(extra_args=[f"--token_file={tokens}",
                                                f"--listen=unix:{cls.socket}"])

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.dir.cleanup()

    def register(self, client, job):
        client.register(job=job, rank=0, world_size=1, tensors=[("w", 2, 3, "fp32")],
                        hyperparams=paramd.hyperparams())

    def test_the_daemon_listens_on_its_unix_socket(self):
        self.assertEqual(self.daemon.address, f"unix:{self.socket}")

    def test_a_call_without_a_token_is_unauthenticated_and_changes_nothing(self):
        client = paramd.connect(self.daemon.address, token_file="", max_attempts=1)
        with self.assertRaises(paramd.StatusError) as caught:
            self.register(client, "tok-none")
        self.assertEqual(caught.exception.code, "UNAUTHENTICATED")
        client.close()
        admin = paramd.connect(self.daemon.address, token_file="", token=ADMIN)
        with self.assertRaises(paramd.StatusError) as caught:
            admin.status("tok-none")
        self.assertEqual(caught.exception.code, "NOT_FOUND")
        admin.close()

    def test_a_trainer_token_reaches_its_jobs_and_no_other(self):
        client = paramd.connect(self.daemon.address, token_file=self.trainer_file)
        self.register(client, "tok-a")
        with self.assertRaises(paramd.StatusError) as caught:
            self.register(client, "other")
        self.assertEqual(caught.exception.code, "PERMISSION_DENIED")
        client.close()

    def test_the_token_file_comes_from_the_environment_where_none_is_given(self):
        os.environ["PARAMD_TOKEN_FILE"] = self.trainer_file
        try:
            client = paramd.connect(self.daemon.address)
            self.register(client, "tok-env")
            client.close()
        finally:
            del os.environ["PARAMD_TOKEN_FILE"]

    def test_adamw_trains_and_round_trips_its_state_with_a_token(self):
        ours, theirs = model_of(), model_of()
        opt = paramd.torch.AdamW(ours.named_parameters(), lr=1e-2, address=self.daemon.address,
                                 job="tok-train", token_file=self.trainer_file)
        train(ours, opt, 2)
        opt.sync_weights()
        train(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-2), 2)
        for p, q in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
        # state_dict(), load_state_dict() and a hyper-parameter change go through the token.
        opt.load_state_dict(opt.state_dict())
        opt.param_groups[0]["lr"] = 5e-3
        train(ours, opt, 1)
        opt.sync_weights()
        opt.close()
        with self.assertRaises(paramd.StatusError) as caught:
            paramd.torch.AdamW(model_of().named_parameters(), lr=1e-2,
                               address=self.daemon.address, job="not-mine",
                               token_file=self.trainer_file)
        self.assertEqual(caught.exception.code, "PERMISSION_DENIED")


if __name__ == "__main__":
    unittest.main()
