"""deploy/kubernetes, read as Kubernetes reads it: the manifests parsed and the fields that must
agree across files asserted, offline (no cluster, no kubectl).

    /usr/bin/python3 tests/deploy/kubernetes_manifests_test.py [PARAMD_BINARY]

Run it with Debian's /usr/bin/python3 (package python3-yaml, which scripts/setup.sh installs):
PyYAML is the one module it needs beyond the standard library, and neither the bindings' venv
(which does not see the system's packages) nor another python3 earlier on PATH is sure to have
it. With PARAMD_BINARY, the daemon also starts with the ConfigMap's config file and the
DaemonSet's --advertise_address (on loopback ports) and must answer before it is stopped.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUBERNETES = os.path.join(ROOT, "deploy", "kubernetes")
PARAMD_BINARY = None


def load(name):
    with open(os.path.join(KUBERNETES, name)) as f:
        documents = [d for d in yaml.safe_load_all(f) if d is not None]
    assert len(documents) == 1, f"{name} holds {len(documents)} objects; one per file"
    return documents[0]


def textproto_fields(text):
    """The top-level scalar fields of a text-format message (this config has no nested ones)."""
    fields = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r'(\w+)\s*:\s*("(?:[^"\\]|\\.)*"|[^\s"]+)', line)
        assert match, f"cannot read config line {line!r}"
        value = match.group(2)
        fields[match.group(1)] = value[1:-1] if value.startswith('"') else value
    return fields


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def quantity_bytes(quantity):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "": 1}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|)", quantity)
    assert match, f"cannot read the quantity {quantity!r}"
    return int(match.group(1)) * units[match.group(2)]


class KubernetesManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.kustomization = load("kustomization.yaml")
        cls.objects = {name: load(name) for name in sorted(os.listdir(KUBERNETES))
                       if name.endswith((".yaml", ".yml")) and name != "kustomization.yaml"}
        by_kind = {}
        for name, obj in cls.objects.items():
            by_kind.setdefault(obj["kind"], []).append(obj)
        for kind in ("Namespace", "ConfigMap", "Service", "DaemonSet"):
            found = by_kind.get(kind, [])
            assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        cls.namespace = by_kind["Namespace"][0]
        cls.configmap = by_kind["ConfigMap"][0]
        cls.service = by_kind["Service"][0]
        cls.daemonset = by_kind["DaemonSet"][0]
        cls.pod = cls.daemonset["spec"]["template"]
        containers = cls.pod["spec"]["containers"]
        assert len(containers) == 1, "one container: paramd"
        cls.container = containers[0]
        cls.ports = {p["name"]: p for p in cls.container["ports"]}
        (cls.config_key, cls.config_text), = cls.configmap["data"].items()
        cls.config = textproto_fields(cls.config_text)

    def test_the_kustomization_lists_every_manifest_once_namespace_first(self):
        resources = self.kustomization["resources"]
        self.assertEqual(sorted(resources), sorted(self.objects))
        self.assertEqual(len(set(resources)), len(resources))
        self.assertEqual(self.objects[resources[0]]["kind"], "Namespace")

    def test_every_object_lives_in_the_namespace(self):
        name = self.namespace["metadata"]["name"]
        for file, obj in self.objects.items():
            if obj["kind"] != "Namespace":
                self.assertEqual(obj["metadata"].get("namespace"), name, file)

    def test_the_service_is_headless_and_selects_the_daemonset_pods(self):
        spec = self.service["spec"]
        self.assertEqual(spec["clusterIP"], "None")
        # Ready daemons only (the default): a daemon answers DNS once its probes pass.
        self.assertFalse(spec.get("publishNotReadyAddresses", False))
        labels = self.pod["metadata"]["labels"]
        self.assertTrue(spec["selector"])
        self.assertLessEqual(spec["selector"].items(), labels.items())
        match = self.daemonset["spec"]["selector"]["matchLabels"]
        self.assertLessEqual(match.items(), labels.items())
        # The name the documentation resolves: paramd.paramd.svc.cluster.local.
        self.assertEqual(self.service["metadata"]["name"], "paramd")
        self.assertEqual(self.service["metadata"]["namespace"], "paramd")

    def test_service_ports_name_container_ports_and_the_configs_ports(self):
        self.assertEqual(set(self.ports), {"grpc", "metrics"})
        for port in self.service["spec"]["ports"]:
            target = port["targetPort"]
            self.assertIn(target, self.ports, f"Service port {port['name']}")
            # With hostNetwork a client reaches the container port on the node: same number.
            self.assertEqual(port["port"], self.ports[target]["containerPort"], port["name"])
            self.assertEqual(port["protocol"], self.ports[target]["protocol"])
        self.assertEqual(port_of(self.config["listen"]), self.ports["grpc"]["containerPort"])
        self.assertEqual(port_of(self.config["metrics_listen"]),
                         self.ports["metrics"]["containerPort"])
        annotations = self.pod["metadata"]["annotations"]
        self.assertEqual(int(annotations["prometheus.io/port"]),
                         self.ports["metrics"]["containerPort"])

    def test_pods_use_the_node_network_so_dns_answers_node_addresses(self):
        spec = self.pod["spec"]
        self.assertIs(spec["hostNetwork"], True)
        self.assertEqual(spec["dnsPolicy"], "ClusterFirstWithHostNet")
        # Every interface, so that the node's address (what the daemon advertises) reaches it.
        self.assertEqual(self.config["listen"].rsplit(":", 1)[0], "0.0.0.0")

    def test_the_daemon_advertises_its_node_address_and_the_grpc_port(self):
        env = {e["name"]: e for e in self.container.get("env", [])}
        from_host_ip = [name for name, e in env.items()
                        if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                        == "status.hostIP"]
        self.assertEqual(len(from_host_ip), 1, "one env variable from status.hostIP")
        flags = [a for a in self.container["args"] if a.startswith("--advertise_address=")]
        self.assertEqual(flags, [f"--advertise_address=$({from_host_ip[0]}):"
                                 f"{self.ports['grpc']['containerPort']}"])
        # The flag alone decides it: a config field would be overridden and mislead a reader.
        self.assertNotIn("advertise_address", self.config)

    def test_the_config_file_is_the_mounted_configmap_key(self):
        config_flags = [a for a in self.container["args"] if a.startswith("--config=")]
        self.assertEqual(len(config_flags), 1)
        path = config_flags[0].split("=", 1)[1]
        volumes = {v["name"]: v for v in self.pod["spec"]["volumes"]}
        mounts = [m for m in self.container["volumeMounts"]
                  if path.startswith(m["mountPath"].rstrip("/") + "/")]
        self.assertEqual(len(mounts), 1, f"one mount holds {path}")
        source = volumes[mounts[0]["name"]]["configMap"]
        self.assertEqual(source["name"], self.configmap["metadata"]["name"])
        items = {i["path"]: i["key"] for i in source.get("items", [])}
        relative = path[len(mounts[0]["mountPath"].rstrip("/")) + 1:]
        self.assertEqual(items.get(relative, relative), self.config_key)
        self.assertTrue(mounts[0].get("readOnly"))

    def test_the_token_file_is_the_generated_secret_mounted_for_the_daemons_group(self):
        flags = [a for a in self.container["args"] if a.startswith("--token_file=")]
        self.assertEqual(len(flags), 1, "the daemon takes a token file: its port is the node's")
        path = flags[0].split("=", 1)[1]
        mounts = [m for m in self.container["volumeMounts"]
                  if path.startswith(m["mountPath"].rstrip("/") + "/")]
        self.assertEqual(len(mounts), 1, f"one mount holds {path}")
        self.assertTrue(mounts[0].get("readOnly"))
        volumes = {v["name"]: v for v in self.pod["spec"]["volumes"]}
        secret = volumes[mounts[0]["name"]]["secret"]
        generated = {g["name"]: g for g in self.kustomization["secretGenerator"]}
        self.assertIn(secret["secretName"], generated)
        self.assertEqual(generated[secret["secretName"]]["namespace"],
                         self.namespace["metadata"]["name"])
        self.assertIn(os.path.basename(path), generated[secret["secretName"]]["files"])
        # The name stays: the kubelet updates the file in place for a SIGHUP to read.
        self.assertIs(self.kustomization["generatorOptions"]["disableNameSuffixHash"], True)
        # Root's and the pod's group, which may read it and nobody else: the daemon takes that.
        self.assertIn(secret["defaultMode"], (0o440, 0o400))
        context = self.pod["spec"]["securityContext"]
        self.assertEqual(context["fsGroup"], context["runAsGroup"])
        with open(os.path.join(ROOT, ".gitignore")) as f:
            self.assertIn("/deploy/kubernetes/tokens", f.read().split())

    def test_probes_ask_the_grpc_port(self):
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(self.container[probe]["grpc"]["port"],
                             self.ports["grpc"]["containerPort"], probe)

    def test_resources_agree_with_the_config(self):
        resources = self.container["resources"]
        self.assertEqual(int(self.config["step_threads"]), int(resources["requests"]["cpu"]))
        self.assertNotIn("cpu", resources.get("limits", {}), "a CPU limit throttles the step")
        self.assertLess(int(self.config["max_job_bytes"]),
                        quantity_bytes(resources["limits"]["memory"]))

    def test_the_pod_runs_as_the_images_user_and_is_never_replaced_under_a_job(self):
        with open(os.path.join(ROOT, "docker", "Dockerfile")) as f:
            user = re.search(r"^USER (\d+):(\d+)$", f.read(), re.M)
        context = self.pod["spec"]["securityContext"]
        self.assertEqual((context["runAsUser"], context["runAsGroup"]),
                         (int(user.group(1)), int(user.group(2))))
        self.assertTrue(context["runAsNonRoot"])
        self.assertEqual(self.daemonset["spec"]["updateStrategy"]["type"], "OnDelete")

    def test_the_image_tags_carry_the_projects_one_version(self):
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            version = re.search(r"^project\(paramd VERSION ([0-9.]+) ", f.read(), re.M).group(1)
        self.assertEqual(self.container["image"].split(":")[1].split("-")[0], version)
        with open(os.path.join(ROOT, "docker", "README.md")) as f:
            tags = re.findall(r"paramd:([0-9.]+)-(?:cpu|cuda)", f.read())
        self.assertTrue(tags)
        self.assertEqual(set(tags), {version})

    def test_the_daemon_starts_with_the_configmaps_config_and_advertise_flag(self):
        if not PARAMD_BINARY:
            self.skipTest("no daemon binary given")
        advertise = [a for a in self.container["args"] if a.startswith("--advertise_address=")][0]
        # The node's address, as the kubelet would put it in the variable.
        advertise = re.sub(r"\$\(\w+\)", "127.0.0.1", advertise)
        with tempfile.TemporaryDirectory() as work:
            config = os.path.join(work, "paramd.textproto")
            with open(config, "w") as f:
                f.write(self.config_text)
            address_file = os.path.join(work, "address")
            # The token file as the kubelet mounts the Secret: root's, mode 0440 (as root); the
            # owner's alone otherwise.
            tokens = os.path.join(work, "tokens")
            with open(tokens, "w") as f:
                for role in ("admin", "peer", "trainer"):
                    f.write(f"{role} {os.urandom(24).hex()}{' llama-*' * (role == 'trainer')}\n")
            os.chmod(tokens, 0o440 if os.geteuid() == 0 else 0o600)
            token_flag = [a for a in self.container["args"] if a.startswith("--token_file=")][0]
            daemon = subprocess.Popen(
                [PARAMD_BINARY, f"--config={config}", "--listen=127.0.0.1:0",
                 "--metrics_listen=127.0.0.1:0", f"--address_file={address_file}", advertise,
                 token_flag.split("=", 1)[0] + "=" + tokens],
                stderr=subprocess.PIPE, text=True)
            try:
                deadline = time.monotonic() + 30
                while not os.path.exists(address_file) and daemon.poll() is None:
                    self.assertLess(time.monotonic(), deadline, "the daemon did not start")
                    time.sleep(0.05)
                started = daemon.poll() is None
            finally:
                if daemon.poll() is None:
                    daemon.send_signal(signal.SIGTERM)
                _, log = daemon.communicate(timeout=30)
            self.assertTrue(started, f"the daemon refused the ConfigMap's config:\n{log}")
            self.assertEqual(daemon.returncode, 0, log)
            self.assertIn(f"(advertised as {advertise.split('=', 1)[1]},", log)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        PARAMD_BINARY = sys.argv.pop(1)
    unittest.main()
