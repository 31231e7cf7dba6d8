#!/usr/bin/python3
"""Checks the deployment files against the eldr-node they deploy.

    /usr/bin/python3 tests/integration/deploy_manifests_test.py ELDR_NODE SOURCE_DIR [-v]

ELDR_NODE is the built eldr-node, SOURCE_DIR the checkout. Every `--flag` that deploy/k8s,
deploy/systemd, deploy/docker and deploy/local pass to eldr-node must appear in
`eldr-node --help`; every configuration they ship or generate must pass
`eldr-node --config F --check-config` with the command-line overrides they apply (so an unknown
or misspelt key fails here, as it would fail the node); every containerPort, Service port and
probe port must be a port of the configuration; the Kubernetes YAML must parse and hold the
expected objects; the Prometheus Operator monitors (deploy/k8s/monitoring) must select the
metrics Service, ports and pods of the base, on paths a real node serves; the Docker runtime
stage must install existing packages that cover the binary's shared libraries. Registered in
CTest (label integration) by tests/CMakeLists.txt. Needs python3-yaml, and python3-zmq and
python3-msgpack for the node the monitoring check starts (deploy/install-deps.sh).
"""
import functools
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

import yaml

NODE = ""
SRC = Path(".")

FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
ALL_ROLES = {"router", "signature-cache", "load-monitor", "refit"}


def run(argv, **kw):
    kw.setdefault("timeout", 60)
    return subprocess.run(argv, capture_output=True, text=True, **kw)


@functools.lru_cache(maxsize=None)
def help_flags():
    r = run([NODE, "--help"])
    assert r.returncode == 0, f"eldr-node --help failed: {r.stderr}"
    return frozenset(FLAG_RE.findall(r.stdout))


def flags_in(args):
    """The --flags among command-line arguments (--a=b counts as --a)."""
    return [a.split("=", 1)[0] for a in args if isinstance(a, str) and a.startswith("--")]


def check_config(args):
    """eldr-node ARGS --check-config: (returncode, output)."""
    r = run([NODE, *args, "--check-config"])
    return r.returncode, (r.stdout + r.stderr).strip()


# --check-config also checks the files a config names (data_dir, the cluster secret, centroid
# files), as start-up does. Those are the pod's or host's mounts; for the host check they are
# moved under a scratch directory: a secret of 32 bytes, a fresh data directory, and no centroid
# file (the shipped paths name files an operator provides; a missing one must fail, see
# test_missing_files_named_by_the_config_fail_check_config).
PATH_KEYS = re.compile(r'^(\s*)(secret_file|data_dir|centroids)(\s*=\s*)"([^"]*)"', re.M)


def on_this_host(text, scratch):
    """The TOML `text` with its mounted paths moved under `scratch` (created)."""
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)

    def moved(m):
        indent, key, eq, value = m.groups()
        if not value:
            return m.group(0)
        if key == "secret_file":
            secret = scratch / "cluster-secret"
            secret.write_text("0123456789abcdef0123456789abcdef\n")
            value = str(secret)
        elif key == "data_dir":
            value = str(scratch / "data")
        else:
            value = ""
        return f'{indent}{key}{eq}"{value}"'

    return PATH_KEYS.sub(moved, text)


def host_args(args, scratch):
    """Command-line `args` with --data-dir moved under `scratch`."""
    args = list(args)
    if "--data-dir" in args:
        args[args.index("--data-dir") + 1] = str(Path(scratch) / "data")
    return args


def host_port(text):
    """("host", port) of tcp://host:port or host:port."""
    text = text.removeprefix("tcp://")
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def config_ports(cfg):
    """{name: (host, port)} of the TOML's bind addresses (defaults where absent)."""
    ep = cfg.get("endpoints", {})
    out = {
        "route": host_port(ep.get("route", "tcp://127.0.0.1:5700")),
        "worker": host_port(ep.get("worker", "tcp://127.0.0.1:5701")),
        "admin": host_port(ep.get("admin", "tcp://127.0.0.1:5702")),
    }
    if ep.get("metrics", "127.0.0.1:9700"):
        out["metrics"] = host_port(ep.get("metrics", "127.0.0.1:9700"))
    if cfg.get("cluster", {}).get("listen"):
        out["cluster"] = host_port(cfg["cluster"]["listen"])
    return out


def is_loopback(host):
    return host.startswith("127.") or host in ("localhost", "::1")


# ----------------------------------------------------------------------------- eldr-node itself
class HelpTest(unittest.TestCase):
    def test_help_lists_the_flags_the_manifests_rely_on(self):
        # If --help changed shape, every flag check below would pass vacuously.
        for flag in ("--config", "--check-config", "--data-dir", "--ready-file"):
            self.assertIn(flag, help_flags())

    def test_check_config_refuses_an_unknown_key(self):
        # The key checks below rely on this: an unknown key makes --check-config fail.
        with tempfile.TemporaryDirectory() as tmp:
            f = Path(tmp, "bad.toml")
            f.write_text('[cluster]\nlisten_addr = "127.0.0.1:7700"\n[[models]]\nname = "m"\n')
            rc, out = check_config(["--config", str(f)])
            self.assertEqual(rc, 2, out)
            self.assertIn("listen_addr", out)


# ----------------------------------------------------------------------------- Kubernetes
class KubernetesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = SRC / "deploy" / "k8s"
        cls.docs = []  # (file name, object)
        for f in sorted(cls.dir.glob("*.yaml")) + sorted(cls.dir.glob("*.yml")):
            with open(f) as fh:
                for doc in yaml.safe_load_all(fh):
                    if doc is not None:
                        cls.docs.append((f.name, doc))
        cls.tmp = tempfile.mkdtemp(prefix="eldr-k8s-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def objects(self, kind):
        return [d for _, d in self.docs if d.get("kind") == kind]

    def one(self, kind, name=None):
        found = [d for d in self.objects(kind) if name is None or d["metadata"]["name"] == name]
        self.assertEqual(len(found), 1, f"expected one {kind} {name or ''}, found {len(found)}")
        return found[0]

    def workloads(self):
        return self.objects("Deployment") + self.objects("StatefulSet")

    def config_of(self, workload, container):
        """(path in the pod, TOML text) of the container's --config."""
        args = container.get("args", [])
        self.assertIn("--config", args, f"{workload['metadata']['name']}: no --config")
        path = args[args.index("--config") + 1]
        spec = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for m in container.get("volumeMounts", []):
            if path.startswith(m["mountPath"].rstrip("/") + "/"):
                key = path[len(m["mountPath"].rstrip("/")) + 1:]
                cm_name = volumes[m["name"]]["configMap"]["name"]
                for item in volumes[m["name"]]["configMap"].get("items", []):
                    if item["path"] == key:
                        key = item["key"]
                cm = self.one("ConfigMap", cm_name)
                self.assertIn(key, cm["data"], f"ConfigMap {cm_name} has no {key}")
                return path, cm["data"][key]
        self.fail(f"{workload['metadata']['name']}: --config {path} is on no mounted volume")

    def pod_args(self, workload, container, config_file):
        """The container's args with --config pointing at config_file and $(VAR) expanded the
        way the kubelet would for one pod."""
        name = workload["metadata"]["name"]
        values = {}
        for e in container.get("env", []):
            if "value" in e:
                values[e["name"]] = e["value"]
                continue
            field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            self.assertIsNotNone(field, f"{name}: env {e['name']} is neither a value nor a fieldRef")
            values[e["name"]] = {
                "status.podIP": "10.244.1.7",
                "metadata.name": f"{name}-0",
                "metadata.namespace": workload["metadata"].get("namespace", "default"),
                "spec.nodeName": "node-1",
            }.get(field)
            self.assertIsNotNone(values[e["name"]], f"{name}: unexpected fieldRef {field}")
        out = []
        args = list(container.get("args", []))
        for i, a in enumerate(args):
            if i > 0 and args[i - 1] == "--config":
                a = config_file
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                self.assertIn(var, values, f"{name}: $({var}) is not in the container's env")
                a = a.replace(f"$({var})", values[var])
            out.append(a)
        return out

    def test_yaml_parses_and_has_the_expected_objects(self):
        kinds = {d.get("kind") for _, d in self.docs}
        for kind in ("Namespace", "ConfigMap", "Secret", "Deployment", "StatefulSet", "Service"):
            self.assertIn(kind, kinds)
        for f, d in self.docs:
            self.assertIn("apiVersion", d, f)
            if d.get("kind") != "Kustomization":
                self.assertIn("name", d.get("metadata", {}), f)
        ns = self.one("Namespace")["metadata"]["name"]
        for f, d in self.docs:
            if d.get("kind") not in ("Namespace", "Kustomization"):
                self.assertEqual(d["metadata"].get("namespace"), ns, f"{f}: {d['kind']}")
        self.assertEqual(self.one("Deployment")["spec"]["replicas"], 3)
        sts = self.one("StatefulSet")
        self.assertEqual(sts["spec"]["replicas"], 3)
        cm = self.one("ConfigMap")
        self.assertIn("router.toml", cm["data"])
        self.assertIn("sigcache.toml", cm["data"])

    def test_kustomization_lists_every_manifest(self):
        for k in self.objects("Kustomization"):
            listed = set(k.get("resources", []))
            files = {f for f, d in self.docs if d.get("kind") != "Kustomization"}
            self.assertEqual(listed, files)
            for f in listed:
                self.assertTrue((self.dir / f).is_file(), f)

    def test_roles_per_kind(self):
        cm = self.one("ConfigMap")
        router = tomllib.loads(cm["data"]["router.toml"])
        sigcache = tomllib.loads(cm["data"]["sigcache.toml"])
        self.assertEqual(set(router["node"]["roles"]), {"router", "load-monitor", "refit"})
        self.assertEqual(set(sigcache["node"]["roles"]), {"signature-cache"})
        deploy = self.one("Deployment")
        self.assertTrue(self.config_of(deploy, deploy["spec"]["template"]["spec"]["containers"][0])
                        [0].endswith("router.toml"))
        sts = self.one("StatefulSet")
        self.assertTrue(self.config_of(sts, sts["spec"]["template"]["spec"]["containers"][0])
                        [0].endswith("sigcache.toml"))

    def test_every_flag_exists(self):
        for w in self.workloads():
            for c in w["spec"]["template"]["spec"]["containers"]:
                for flag in flags_in(c.get("command", []) + c.get("args", [])):
                    self.assertIn(flag, help_flags(),
                                  f"{w['metadata']['name']}: eldr-node has no {flag}")

    def test_every_config_passes_check_config_with_the_pod_overrides(self):
        for w in self.workloads():
            name = w["metadata"]["name"]
            for c in w["spec"]["template"]["spec"]["containers"]:
                path, text = self.config_of(w, c)
                f = Path(self.tmp, f"{name}-{Path(path).name}")
                f.write_text(on_this_host(text, Path(self.tmp, f"{name}-host")))
                args = self.pod_args(w, c, str(f))
                rc, out = check_config(args)
                hint = ""
                if "cluster.advertise: required" in out and "--cluster-advertise" in args:
                    hint = ("\n(eldr-node validated the file before applying --cluster-advertise: "
                            "load_node_config() must not run the cross-field checks that the "
                            "command-line overrides can satisfy; main.cpp validates again after "
                            "the overrides)")
                self.assertEqual(rc, 0, f"{name}: eldr-node {' '.join(args)}: {out}{hint}")
                # The advertised address comes from the pod's IP (downward API).
                raw = c.get("args", [])
                self.assertIn("--cluster-advertise", raw, name)
                adv = raw[raw.index("--cluster-advertise") + 1]
                env = {e["name"]: e for e in c.get("env", [])}
                var = re.match(r"\$\((\w+)\):(\d+)$", adv)
                self.assertIsNotNone(var, f"{name}: --cluster-advertise {adv}")
                self.assertEqual(env[var.group(1)]["valueFrom"]["fieldRef"]["fieldPath"],
                                 "status.podIP")
                cfg = tomllib.loads(text)
                self.assertEqual(int(var.group(2)), host_port(cfg["cluster"]["listen"])[1])

    def test_secret_and_data_dir_are_mounted(self):
        for w in self.workloads():
            name = w["metadata"]["name"]
            spec = w["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
            for c in spec["containers"]:
                cfg = tomllib.loads(self.config_of(w, c)[1])
                mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts", [])}
                secret_file = cfg["cluster"]["secret_file"]
                parent, key = secret_file.rsplit("/", 1)
                self.assertIn(parent, mounts, f"{name}: {secret_file} is on no mount")
                vol = volumes[mounts[parent]["name"]]
                secret = self.one("Secret", vol["secret"]["secretName"])
                values = {**secret.get("stringData", {}), **secret.get("data", {})}
                self.assertIn(key, values, f"{name}: Secret has no {key}")
                self.assertGreaterEqual(len(values[key]), 16)
                data_dir = cfg["node"]["data_dir"].rstrip("/")
                self.assertIn(data_dir, mounts, f"{name}: data_dir {data_dir} is not a mount")
                if w["kind"] == "StatefulSet":
                    self.assertIn(mounts[data_dir]["name"], claims,
                                  f"{name}: the data dir must be a volumeClaimTemplate")
                else:
                    self.assertIn(mounts[data_dir]["name"], volumes)

    def test_ports_match_the_configuration(self):
        services = self.objects("Service")
        for w in self.workloads():
            name = w["metadata"]["name"]
            labels = w["spec"]["template"]["metadata"]["labels"]
            for c in w["spec"]["template"]["spec"]["containers"]:
                cfg = tomllib.loads(self.config_of(w, c)[1])
                ports = config_ports(cfg)
                numbers = {p for _, p in ports.values()}
                named = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
                declared = {p["containerPort"] for p in c.get("ports", [])}
                for p in declared:
                    self.assertIn(p, numbers, f"{name}: containerPort {p} is not in the TOML")
                for what, (host, p) in ports.items():
                    if not is_loopback(host):
                        self.assertIn(p, declared, f"{name}: {what} port {p} has no containerPort")
                        if what in named:
                            self.assertEqual(named[what], p, f"{name}: port name {what}")
                metrics = ports["metrics"][1]
                for probe in ("readinessProbe", "livenessProbe"):
                    self.assertIn(probe, c, f"{name}: no {probe}")
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    if probe not in c:
                        continue
                    get = c[probe]["httpGet"]
                    # Readiness is /readyz (503 until the node can serve); liveness and start-up
                    # stay on the cheap /healthz, so a node waiting for workers is not restarted.
                    want = "/readyz" if probe == "readinessProbe" else "/healthz"
                    self.assertEqual(get["path"], want, f"{name}: {probe}")
                    port = named.get(get["port"], get["port"])
                    self.assertEqual(port, metrics, f"{name}: {probe} is not on the metrics port")
                # Services selecting this pod: each port reaches a containerPort of the TOML.
                for s in services:
                    sel = s["spec"].get("selector", {})
                    if not sel or any(labels.get(k) != v for k, v in sel.items()):
                        continue
                    for sp in s["spec"]["ports"]:
                        target = sp.get("targetPort", sp["port"])
                        target = named.get(target, target)
                        if isinstance(target, str):
                            # A named port this pod lacks: only the headless cluster Service may
                            # select pods without it, and every eldr pod has "cluster".
                            self.fail(f"Service {s['metadata']['name']}: {name} has no port "
                                      f"named {target}")
                        self.assertIn(target, declared, f"Service {s['metadata']['name']}")
                        self.assertIn(sp["port"], numbers, f"Service {s['metadata']['name']}")

    def test_service_per_endpoint_and_headless_cluster_service(self):
        services = {s["metadata"]["name"]: s for s in self.objects("Service")}
        names = {p.get("name") for s in services.values() for p in s["spec"]["ports"]
                 if s["spec"].get("clusterIP") != "None"}
        for endpoint in ("route", "worker", "admin", "metrics"):
            self.assertIn(endpoint, names, f"no Service port named {endpoint}")
        sts = self.one("StatefulSet")
        headless = services.get(sts["spec"]["serviceName"])
        self.assertIsNotNone(headless, "the StatefulSet's serviceName is no Service")
        self.assertEqual(headless["spec"].get("clusterIP"), "None")
        self.assertTrue(headless["spec"].get("publishNotReadyAddresses"))

    def test_seeds_are_the_statefulset_pods(self):
        sts = self.one("StatefulSet")
        ns = sts["metadata"]["namespace"]
        svc = sts["spec"]["serviceName"]
        base = sts["metadata"]["name"]
        want = {f"{base}-{i}.{svc}.{ns}.svc.cluster.local" for i in range(sts["spec"]["replicas"])}
        headless = self.one("Service", svc)
        for key, text in self.one("ConfigMap")["data"].items():
            cfg = tomllib.loads(text)
            port = host_port(cfg["cluster"]["listen"])[1]
            self.assertIn(port, {p["port"] for p in headless["spec"]["ports"]}, key)
            seeds = [host_port(s) for s in cfg["cluster"]["seeds"]]
            self.assertEqual({h for h, _ in seeds}, want, key)
            self.assertEqual({p for _, p in seeds}, {port}, key)

    def test_pods_are_hardened(self):
        for w in self.workloads():
            spec = w["spec"]["template"]["spec"]
            self.assertTrue(spec.get("securityContext", {}).get("runAsNonRoot"))
            for c in spec["containers"]:
                sc = c.get("securityContext", {})
                self.assertIs(sc.get("allowPrivilegeEscalation"), False)
                self.assertIn("ALL", sc.get("capabilities", {}).get("drop", []))


# ----------------------------------------------------------------------------- monitoring
def live_paths(paths):
    """{path: HTTP status} of GETs to the metrics port of a real eldr-node started on free ports
    (port 0; tests/adversarial/eldr_live.py, which needs python3-zmq and python3-msgpack)."""
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, str(SRC / "tests" / "adversarial"))
    import eldr_live as live
    with tempfile.TemporaryDirectory(prefix="eldr-paths-") as tmp:
        centroids = Path(tmp, "toy.centroids")
        centroids.write_bytes(live.toy_centroid_file())
        config = Path(tmp, "node.toml")
        config.write_text(live.node_toml(str(Path(tmp, "data")), str(centroids)))
        node = live.Node(NODE, str(config), str(Path(tmp, "node.log"))).start()
        try:
            return {p: live.http_get(node.endpoint("metrics"), p)[0] for p in paths}
        finally:
            node.stop()


class MonitoringTest(unittest.TestCase):
    """deploy/k8s/monitoring: the Prometheus Operator's ServiceMonitor and PodMonitor, each a
    kustomization of its own applied after the base."""

    @classmethod
    def setUpClass(cls):
        cls.k8s = SRC / "deploy" / "k8s"
        cls.base = []
        for f in sorted(cls.k8s.glob("*.yaml")):
            with open(f) as fh:
                cls.base += [d for d in yaml.safe_load_all(fh) if d is not None]
        cls.monitors = {}  # kind -> (directory, object)
        for d in sorted((cls.k8s / "monitoring").iterdir()):
            with open(d / "kustomization.yaml") as fh:
                k = yaml.safe_load(fh)
            for r in k["resources"]:
                with open(d / r) as fh:
                    for doc in yaml.safe_load_all(fh):
                        if doc is not None:
                            cls.monitors[doc["kind"]] = (d, k, doc)

    def base_objects(self, kind):
        return [d for d in self.base if d.get("kind") == kind]

    def workloads(self):
        return self.base_objects("Deployment") + self.base_objects("StatefulSet")

    def metrics_port(self, w):
        """The TOML's metrics port of workload w, and its container's ports by name."""
        c = w["spec"]["template"]["spec"]["containers"][0]
        path = c["args"][c["args"].index("--config") + 1]
        cm = self.base_objects("ConfigMap")[0]
        cfg = tomllib.loads(cm["data"][Path(path).name])
        return host_port(cfg["endpoints"]["metrics"])[1], \
            {p["name"]: p["containerPort"] for p in c["ports"]}

    def test_both_monitors_and_their_kustomizations(self):
        self.assertEqual(set(self.monitors), {"ServiceMonitor", "PodMonitor"})
        ns = self.base_objects("Namespace")[0]["metadata"]["name"]
        for kind, (d, k, m) in self.monitors.items():
            self.assertEqual(m["apiVersion"], "monitoring.coreos.com/v1", kind)
            self.assertEqual(k["kind"], "Kustomization", d)
            self.assertEqual(k["namespace"], ns, d)
            self.assertEqual(m["metadata"]["namespace"], ns, kind)

    def test_the_base_needs_no_operator(self):
        # A cluster without the Prometheus Operator's CRDs must still apply deploy/k8s.
        for d in self.base:
            self.assertFalse(d.get("apiVersion", "").startswith("monitoring.coreos.com"),
                             d.get("kind"))

    def endpoints(self, kind):
        spec = self.monitors[kind][2]["spec"]
        eps = spec["endpoints"] if kind == "ServiceMonitor" else spec["podMetricsEndpoints"]
        self.assertEqual(len(eps), 1, kind)
        return spec, eps[0]

    def test_service_monitor_selects_the_metrics_service_and_port(self):
        spec, ep = self.endpoints("ServiceMonitor")
        want = spec["selector"]["matchLabels"]
        chosen = [s for s in self.base_objects("Service")
                  if all(s["metadata"].get("labels", {}).get(k) == v for k, v in want.items())
                  and any(p.get("name") == ep["port"] for p in s["spec"]["ports"])]
        self.assertEqual([s["metadata"]["name"] for s in chosen], ["eldr-metrics"])
        svc = chosen[0]
        self.assertNotEqual(svc["spec"].get("clusterIP"), "None")
        target = next(p for p in svc["spec"]["ports"] if p["name"] == ep["port"])["targetPort"]
        selected = [w for w in self.workloads()
                    if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v
                           for k, v in svc["spec"]["selector"].items())]
        kinds = {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in selected}
        self.assertEqual(kinds, {"router", "signature-cache"})
        for w in selected:
            metrics, named = self.metrics_port(w)
            self.assertEqual(named.get(target), metrics, w["metadata"]["name"])

    def test_pod_monitor_selects_every_eldr_pod_on_its_metrics_port(self):
        spec, ep = self.endpoints("PodMonitor")
        want = spec["selector"]["matchLabels"]
        selected = [w for w in self.workloads()
                    if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v
                           for k, v in want.items())]
        self.assertEqual({w["metadata"]["labels"]["app.kubernetes.io/component"]
                          for w in selected}, {"router", "signature-cache"})
        for w in selected:
            metrics, named = self.metrics_port(w)
            self.assertEqual(named.get(ep["port"]), metrics, w["metadata"]["name"])

    def test_paths_exist_and_both_monitors_label_alike(self):
        _, sm = self.endpoints("ServiceMonitor")
        _, pm = self.endpoints("PodMonitor")
        # The dashboard's $instance is the pod's name whichever monitor scrapes.
        for k in ("path", "interval", "scrapeTimeout", "relabelings"):
            self.assertEqual(sm.get(k), pm.get(k), k)
        self.assertIn({"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "instance"},
                      sm["relabelings"])
        paths = {sm["path"]}
        for w in self.workloads():
            tmpl = w["spec"]["template"]
            self.assertEqual(tmpl["metadata"]["annotations"]["prometheus.io/path"], sm["path"])
            for c in tmpl["spec"]["containers"]:
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if probe in c:
                        paths.add(c[probe]["httpGet"]["path"])
        self.assertEqual(paths, {"/metrics", "/healthz", "/readyz"})
        # A real node serves each (a node with no worker is not ready: /readyz 503, not 404).
        status = live_paths(sorted(paths) + ["/no-such-path"])
        self.assertEqual(status, {"/metrics": 200, "/healthz": 200, "/readyz": 503,
                                  "/no-such-path": 404})

    def test_kubectl_renders_each_kustomization(self):
        if not shutil.which("kubectl"):
            self.skipTest("kubectl is not installed (kubectl kustomize renders offline)")
        r = run(["kubectl", "kustomize", str(self.k8s)])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("monitoring.coreos.com", r.stdout)
        for kind, (d, _, _) in self.monitors.items():
            r = run(["kubectl", "kustomize", str(d)])
            self.assertEqual(r.returncode, 0, r.stderr)
            docs = [x for x in yaml.safe_load_all(r.stdout) if x]
            self.assertEqual([(x["kind"], x["metadata"]["namespace"]) for x in docs],
                             [(kind, "eldr")])


# ----------------------------------------------------------------------------- systemd
def unit_lines(path):
    """(key, value) of a unit file, continuation lines joined."""
    out, pending = [], ""
    for line in Path(path).read_text().splitlines():
        if line.lstrip().startswith(("#", ";")) and not pending:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if "=" in line and not line.startswith("["):
            k, v = line.split("=", 1)
            out.append((k.strip(), v.strip()))
    return out


class SystemdTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.units = sorted((SRC / "deploy" / "systemd").glob("eldr-node*.service"))
        cls.proxy_units = sorted((SRC / "deploy" / "systemd").glob("eldr-proxy*.service"))

    def exec_lines(self, unit):
        for k, v in unit_lines(unit):
            if k.startswith("Exec"):
                argv = v.lstrip("-@:+!").split()
                if argv and argv[0].endswith("/eldr-node"):
                    yield k, argv

    def test_units_exist(self):
        names = {u.name for u in self.units}
        self.assertIn("eldr-node.service", names)
        every = {u.name for u in (SRC / "deploy" / "systemd").glob("*.service")}
        self.assertEqual(every, names | {u.name for u in self.proxy_units},
                         "a unit this test does not check")

    def test_proxy_unit(self):
        """eldr-proxy@.service: the hardening of the node's units, and a command line of flags
        eldr-proxy has, sharing the port (--reuse-port) with a ready file in its runtime
        directory."""
        self.assertEqual([u.name for u in self.proxy_units], ["eldr-proxy@.service"])
        proxy = SRC / "tools" / "eldr-proxy" / "eldr-proxy"
        r = run(["/usr/bin/python3", str(proxy), "--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        known = frozenset(FLAG_RE.findall(r.stdout))
        for unit in self.proxy_units:
            kv = dict(unit_lines(unit))
            self.assertEqual(kv.get("Restart"), "on-failure", unit.name)
            self.assertEqual(kv.get("RestartPreventExitStatus"), "2", unit.name)
            self.assertEqual(kv.get("NoNewPrivileges"), "yes", unit.name)
            self.assertEqual(kv.get("ProtectSystem"), "strict", unit.name)
            self.assertIn("LimitNOFILE", kv, unit.name)
            argv = kv["ExecStart"].split()
            self.assertEqual(argv[0], "/usr/bin/eldr-proxy", unit.name)
            for flag in flags_in(argv):
                self.assertIn(flag, known, f"{unit.name}: eldr-proxy has no {flag}")
            self.assertIn("--reuse-port", argv, unit.name)
            ready = argv[argv.index("--ready-file") + 1]
            self.assertTrue(ready.startswith("/run/" + kv["RuntimeDirectory"] + "/"),
                            f"{unit.name}: {ready} is outside RuntimeDirectory (read-only system)")

    def test_every_flag_exists_and_the_command_line_is_valid(self):
        with tempfile.TemporaryDirectory() as tmp:
            example = Path(tmp, "eldr-node.example.toml")
            example.write_text(on_this_host(
                (SRC / "deploy" / "eldr-node.example.toml").read_text(), tmp))
            for unit in self.units:
                found = False
                for key, argv in self.exec_lines(unit):
                    found = True
                    argv = [a.replace("%i", "router") for a in argv]
                    for flag in flags_in(argv):
                        self.assertIn(flag, help_flags(), f"{unit.name} {key}: no {flag}")
                    self.assertIn("--config", argv)
                    args = host_args(argv[1:], tmp)
                    args[args.index("--config") + 1] = str(example)
                    args = [a for a in args if a != "--check-config"]
                    rc, out = check_config(args)
                    self.assertEqual(rc, 0, f"{unit.name} {key}: {out}")
                self.assertTrue(found, f"{unit.name}: no Exec line runs eldr-node")

    def test_missing_files_named_by_the_config_fail_check_config(self):
        # ExecStartPre relies on --check-config failing where start-up would (issue 12 defect
        # 13): the shipped example names a centroid file; on a host without it, the check fails
        # naming the key.
        with tempfile.TemporaryDirectory() as tmp:
            text = (SRC / "deploy" / "eldr-node.example.toml").read_text()
            self.assertRegex(text, r'(?m)^centroids = "/')
            moved = PATH_KEYS.sub(lambda m: m.group(0) if m.group(2) == "centroids"
                                  else m.group(1) + m.group(2) + m.group(3) + '""', text)
            moved = moved.replace('centroids = "/var/lib/eldr/', f'centroids = "{tmp}/none/', 1)
            example = Path(tmp, "example.toml")
            example.write_text(moved)
            rc, out = check_config(["--config", str(example), "--data-dir", str(Path(tmp, "d"))])
            self.assertEqual(rc, 2, out)
            self.assertIn("models[0].centroids", out)
            self.assertIn("no such file", out)

    def test_restart_limits_and_hardening(self):
        for unit in self.units:
            kv = dict(unit_lines(unit))
            self.assertEqual(kv.get("Restart"), "on-failure", unit.name)
            self.assertEqual(kv.get("NoNewPrivileges"), "yes", unit.name)
            self.assertEqual(kv.get("ProtectSystem"), "strict", unit.name)
            self.assertIn("LimitNOFILE", kv, unit.name)
            state = kv.get("StateDirectory")
            self.assertIsNotNone(state, unit.name)
            # The data dir given to eldr-node is the StateDirectory (writable under strict).
            start = dict(self.exec_lines(unit))["ExecStart"]
            self.assertEqual(start[start.index("--data-dir") + 1], "/var/lib/" + state, unit.name)

    def test_systemd_analyze_verify(self):
        tool = shutil.which("systemd-analyze")
        if tool is None:
            self.skipTest("systemd-analyze not installed")
        with tempfile.TemporaryDirectory() as tmp:
            probe = Path(tmp, "eldr-probe.service")
            probe.write_text("[Service]\nExecStart=/bin/true\n")
            r = run([tool, "verify", str(probe)])
            if r.returncode != 0 or r.stderr.strip():
                self.skipTest(f"systemd-analyze verify does not work here: {r.stderr.strip()}")
            proxy = str((SRC / "tools" / "eldr-proxy" / "eldr-proxy").resolve())
            for unit in self.units + self.proxy_units:
                name = unit.name.replace("@.service", "@router.service")
                copy = Path(tmp, name)
                copy.write_text(unit.read_text().replace("/usr/bin/eldr-node", NODE)
                                .replace("/usr/bin/eldr-proxy", proxy))
                r = run([tool, "verify", str(copy)])
                problems = [ln for ln in (r.stdout + r.stderr).splitlines() if name in ln]
                self.assertEqual(r.returncode, 0, f"{unit.name}: {r.stdout}{r.stderr}")
                self.assertEqual(problems, [], f"{unit.name}: systemd-analyze verify complains")


# ----------------------------------------------------------------------------- Docker
def dockerfile_instructions(path):
    """[(INSTRUCTION, text)] with continuations joined and comment lines dropped."""
    out, pending = [], ""
    for line in Path(path).read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


class DockerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import json
        cls.json = json
        cls.dockerfile = SRC / "deploy" / "docker" / "Dockerfile"
        cls.entrypoint = SRC / "deploy" / "docker" / "entrypoint.sh"
        cls.instr = dockerfile_instructions(cls.dockerfile)
        stages, current = [], None
        for word, rest in cls.instr:
            if word == "FROM":
                current = {"from": rest, "instr": []}
                stages.append(current)
            elif current is not None:
                current["instr"].append((word, rest))
        cls.stages = stages

    def exec_form(self, word):
        vals = [rest for w, rest in self.stages[-1]["instr"] if w == word]
        self.assertEqual(len(vals), 1, f"the runtime stage needs one {word}")
        v = self.json.loads(vals[0])
        self.assertIsInstance(v, list, f"{word} must use the exec (JSON) form")
        return v

    def test_build_stage(self):
        self.assertGreaterEqual(len(self.stages), 2, "multi-stage build expected")
        build = self.stages[0]
        self.assertTrue(build["from"].startswith("debian:12"), build["from"])
        runs = " ".join(rest for w, rest in build["instr"] if w == "RUN")
        self.assertIn("install-deps.sh", runs)
        self.assertIn("-DCMAKE_BUILD_TYPE=Release", runs)
        self.assertIn("eldr-node", runs)
        self.assertTrue(self.stages[-1]["from"].startswith("debian:12"), self.stages[-1]["from"])

    def test_cmd_flags_exist_and_are_valid(self):
        cmd = self.exec_form("CMD")
        for flag in flags_in(cmd):
            self.assertIn(flag, help_flags(), f"Dockerfile CMD: no {flag}")
        with tempfile.TemporaryDirectory() as tmp:
            rc, out = check_config(host_args(cmd, tmp))
        self.assertEqual(rc, 0, f"Dockerfile CMD: {out}")
        for flag in flags_in(self.exec_form("ENTRYPOINT")):
            self.assertIn(flag, help_flags(), f"Dockerfile ENTRYPOINT: no {flag}")

    def test_exposed_ports_are_the_default_and_cluster_ports(self):
        exposed = {int(p.split("/")[0]) for w, rest in self.stages[-1]["instr"] if w == "EXPOSE"
                   for p in rest.split()}
        cmd = self.exec_form("CMD")
        want = {host_port(cmd[cmd.index(f) + 1])[1] for f in ("--route", "--worker", "--admin",
                                                              "--metrics")}
        self.assertTrue(want <= exposed, f"EXPOSE {exposed} lacks {want - exposed}")
        for cm_text in self.k8s_configs():
            cfg = tomllib.loads(cm_text)
            self.assertIn(host_port(cfg["cluster"]["listen"])[1], exposed)

    def k8s_configs(self):
        out = []
        for f in (SRC / "deploy" / "k8s").glob("*.yaml"):
            for d in yaml.safe_load_all(f.read_text()):
                if d and d.get("kind") == "ConfigMap":
                    out += list(d["data"].values())
        return out

    def test_entrypoint_is_installed_and_works(self):
        entry = self.exec_form("ENTRYPOINT")[0]
        runs = " ".join(rest for s in self.stages for w, rest in s["instr"] if w == "RUN")
        self.assertRegex(runs, r"deploy/docker/entrypoint\.sh\s+/out" + re.escape(entry))
        text = self.entrypoint.read_text()
        self.assertIn("/etc/fstab", text)
        self.assertIn("/proc/sys/kernel/random/uuid", text)
        self.assertEqual(run(["sh", "-n", str(self.entrypoint)]).returncode, 0)
        if shutil.which("shellcheck"):
            r = run(["shellcheck", str(self.entrypoint)])
            self.assertEqual(r.returncode, 0, r.stdout)
        # Run it against a scratch fstab and the real eldr-node.
        with tempfile.TemporaryDirectory() as tmp:
            fstab = Path(tmp, "fstab")
            fstab.write_text("# UNCONFIGURED FSTAB FOR BASE SYSTEM\n")
            script = Path(tmp, "entrypoint.sh")
            script.write_text(text.replace("/etc/fstab", str(fstab))
                              .replace("/usr/bin/eldr-node", NODE))
            r = run(["sh", str(script), *host_args(self.exec_form("CMD"), tmp), "--check-config"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("is valid", r.stdout)
            first = fstab.read_text()
            self.assertRegex(first, r"^UUID=[0-9a-f-]{36} / ext4 defaults 0 1\n$")
            run(["sh", str(script), "--check-config"])
            self.assertNotEqual(fstab.read_text(), first, "the UUID must be fresh every start")

    def runtime_packages(self):
        pkgs = []
        for w, rest in self.stages[-1]["instr"]:
            if w != "RUN":
                continue
            for m in re.finditer(r"apt-get install((?:\s+[^\s&;|]+)+)", rest):
                pkgs += [p for p in m.group(1).split() if not p.startswith("-")]
        self.assertTrue(pkgs, "the runtime stage installs no package")
        return pkgs

    @functools.lru_cache(maxsize=None)
    def apt_usable(self):
        if not shutil.which("apt-cache"):
            return False
        r = run(["apt-cache", "show", "--no-all-versions", "libc6"])
        return r.returncode == 0 and "Package: libc6" in r.stdout

    def test_runtime_packages_exist(self):
        pkgs = self.runtime_packages()
        for p in pkgs:
            self.assertNotRegex(p, r"-dev$", "the runtime stage must not install -dev packages")
        if not self.apt_usable():
            self.skipTest("apt-cache has no package lists here")
        r = run(["apt-cache", "show", "--no-all-versions", *pkgs])
        found = set(re.findall(r"^Package: (\S+)$", r.stdout, re.M))
        for p in pkgs:
            self.assertIn(p, found, f"Dockerfile runtime package {p} is not in apt")

    def test_runtime_packages_cover_the_shared_libraries(self):
        if not self.apt_usable() or not shutil.which("dpkg") or not shutil.which("ldd"):
            self.skipTest("needs apt-cache, dpkg and ldd")
        binaries = [NODE]
        ctl = Path(NODE).resolve().parent.parent / "eldrctl" / "eldrctl"
        if ctl.is_file():
            binaries.append(str(ctl))
        libs = set()
        for b in binaries:
            r = run(["ldd", b])
            self.assertEqual(r.returncode, 0, r.stderr)
            libs |= {lib for lib in re.findall(r"=>\s+(/\S+)", r.stdout)
                     if "/build" not in lib and str(SRC) not in lib}
        # dpkg knows a library under one of its names (/lib or /usr/lib, link or target): ask
        # about all of them in one call (dpkg -S is slow) and map every name to its owner.
        names = {lib: {lib, os.path.realpath(lib)} for lib in libs}
        for lib in libs:
            names[lib] |= {n.replace("/usr/lib/", "/lib/", 1) for n in names[lib]}
        r = run(["dpkg", "-S", *sorted(set().union(*names.values()))], timeout=120)
        owner_of = {}
        for line in r.stdout.splitlines():
            pkg, _, path = line.partition(": ")
            owner_of[path.strip()] = pkg.split(",")[0].split(":")[0].strip()
        needed = set()
        for lib in sorted(libs):
            owners = {owner_of[n] for n in names[lib] if n in owner_of}
            self.assertTrue(owners, f"no Debian package owns {lib}")
            needed |= owners
        closure = set()
        r = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                 "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
                 *self.runtime_packages(), "apt", "coreutils"], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        for line in r.stdout.splitlines():
            m = re.match(r"^\s*(?:\|?(?:Pre)?Depends:\s+)?<?([a-z0-9][a-z0-9+.-]+)>?$", line.strip())
            if m:
                closure.add(m.group(1).split(":")[0])
        missing = needed - closure
        self.assertEqual(missing, set(), "runtime libraries no runtime package brings in")


# ----------------------------------------------------------------------------- deploy/local
class LocalClusterTest(unittest.TestCase):
    script = None

    @classmethod
    def setUpClass(cls):
        cls.script = SRC / "deploy" / "local" / "eldr-cluster"
        cls.tmp = Path(tempfile.mkdtemp(prefix="eldr-local-"))
        cls.bin = str(Path(NODE).resolve().parent)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def cluster(self, *args, check=True):
        r = run(["bash", str(self.script), *args])
        if check:
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r

    def test_script_is_clean_shell(self):
        self.assertEqual(run(["bash", "-n", str(self.script)]).returncode, 0)
        text = self.script.read_text()
        self.assertIn("set -euo pipefail", text)
        if shutil.which("shellcheck"):
            r = run(["shellcheck", "-x", str(self.script)])
            self.assertEqual(r.returncode, 0, r.stdout)

    def test_static_flags_exist(self):
        text = self.script.read_text()
        block = re.search(r"# BEGIN eldr-node flags(.*?)# END eldr-node flags", text, re.S)
        self.assertIsNotNone(block, "the eldr-node flags block markers are gone")
        flags = FLAG_RE.findall(block.group(1))
        # Every other line that runs eldr-node directly.
        for line in text.splitlines():
            m = re.match(r'\s*"\$node_bin"\s+(.*)', line)
            if m:
                flags += FLAG_RE.findall(m.group(1))
        self.assertIn("--config", flags)
        for flag in flags:
            self.assertIn(flag, help_flags(), f"deploy/local/eldr-cluster: eldr-node has no {flag}")

    def check_generated(self, d, n, hosts, roles_of):
        secret = d / "secret"
        self.assertGreaterEqual(len(secret.read_bytes().rstrip(b"\n")), 16)
        self.assertEqual(stat.S_IMODE(secret.stat().st_mode), 0o600)
        cfgs = {}
        for i in range(1, n + 1):
            nd = d / f"n{i}"
            cfg = tomllib.loads((nd / "eldr.toml").read_text())
            cfgs[i] = cfg
            self.assertEqual(cfg["node"]["name"], f"n{i}")
            self.assertEqual(set(cfg["node"]["roles"]), roles_of.get(i, ALL_ROLES))
            self.assertEqual(cfg["node"]["data_dir"], str(nd / "data"))
            self.assertTrue((nd / "data").is_dir())
            self.assertEqual(cfg["cluster"]["secret_file"], str(secret))
            for what, (host, _) in config_ports(cfg).items():
                self.assertEqual(host, hosts(i), f"n{i} {what}")
            argv = (nd / "command").read_text().splitlines()
            self.assertEqual(Path(argv[0]).resolve(), Path(NODE).resolve())
            for flag in flags_in(argv):
                self.assertIn(flag, help_flags(), f"n{i} command: eldr-node has no {flag}")
            rc, out = check_config(argv[1:])
            self.assertEqual(rc, 0, f"n{i}: {out}")
        listens = sorted(c["cluster"]["listen"] for c in cfgs.values())
        self.assertEqual(len(set(listens)), n)
        for c in cfgs.values():
            self.assertEqual(sorted(c["cluster"]["seeds"]), listens)
            self.assertEqual(c["cluster"].get("advertise", c["cluster"]["listen"]),
                             c["cluster"]["listen"])
        return cfgs

    def test_configs_3_loopback(self):
        d = self.tmp / "loop"
        r = self.cluster("configs", "3", "--dir", str(d), "--bin", self.bin, "--base-port", "31000",
                         "--roles-of", "2=signature-cache,refit", "--check")
        self.assertEqual(r.stdout.split(), [str(d / f"n{i}" / "eldr.toml") for i in (1, 2, 3)])
        cfgs = self.check_generated(d, 3, lambda i: "127.0.0.1",
                                    {2: {"signature-cache", "refit"}})
        ports = [p for c in cfgs.values() for _, p in config_ports(c).values()]
        self.assertEqual(len(ports), len(set(ports)), "loopback nodes need distinct ports")
        self.assertEqual(min(ports), 31000)

    def test_configs_3_default_dir_ports_and_tag(self):
        d1, d2 = self.tmp / "a", self.tmp / "b"
        self.cluster("configs", "3", "--dir", str(d1), "--bin", self.bin)
        self.cluster("configs", "3", "--dir", str(d2), "--bin", self.bin)
        self.check_generated(d1, 3, lambda i: "127.0.0.1", {})
        env1 = dict(ln.split("=", 1) for ln in (d1 / "cluster.env").read_text().splitlines())
        env2 = dict(ln.split("=", 1) for ln in (d2 / "cluster.env").read_text().splitlines())
        self.assertNotEqual(env1["tag"], env2["tag"], "two directories, one tag")

    def test_configs_3_netns(self):
        d = self.tmp / "ns"
        self.cluster("configs", "3", "--dir", str(d), "--bin", self.bin, "--netns")
        cfgs = self.check_generated(d, 3, lambda i: f"10.213.0.{10 + i}", {})
        self.assertEqual(len({host_port(c["cluster"]["listen"])[1] for c in cfgs.values()}), 1)

    def test_start_status_kill_restart_stop_loopback(self):
        import json
        d = self.tmp / "live"
        r = self.cluster("start", "2", "--dir", str(d), "--bin", self.bin, "--timeout", "60",
                         check=False)
        try:
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            lines = [json.loads(ln) for ln in r.stdout.splitlines()]
            self.assertEqual([n["name"] for n in lines], ["n1", "n2"])
            for n in lines:
                for key in ("pid", "route", "worker", "admin", "metrics", "cluster", "netns"):
                    self.assertIn(key, n)
                self.assertTrue(Path(f"/proc/{n['pid']}").exists())
            st = self.cluster("status", "--dir", str(d)).stdout
            self.assertEqual(st.count("alive pid"), 2, st)
            # Readable: every line within 100 columns, each node's endpoints named (the eldrctl
            # summary needs eldrctl beside eldr-node, which --bin does not give here).
            for ln in st.splitlines():
                self.assertLessEqual(len(ln), 100, ln)
            self.assertEqual(st.count("  route   tcp://"), 2, st)
            self.cluster("kill", "2", "--dir", str(d), "--signal", "KILL")
            r = self.cluster("restart", "2", "--dir", str(d), "--timeout", "60")
            pid2 = json.loads(r.stdout)["pid"]
            self.assertNotEqual(pid2, lines[1]["pid"])
        finally:
            self.cluster("stop", "--dir", str(d), check=False)
        for n in lines:
            self.assertFalse(Path(f"/proc/{n['pid']}").exists() and
                             "eldr-node" in Path(f"/proc/{n['pid']}/cmdline").read_text())
        self.assertIn("down", self.cluster("status", "--dir", str(d)).stdout)

    def test_start_moves_to_other_ports_when_one_is_taken(self):
        import json
        import socket
        d = self.tmp / "taken"
        # configs writes the state start will use: the base port this directory gets by default.
        self.cluster("configs", "2", "--dir", str(d), "--bin", self.bin)
        env = dict(ln.split("=", 1) for ln in (d / "cluster.env").read_text().splitlines())
        first = int(env["base_port"])
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        self.assertGreaterEqual(first, 10000)
        self.assertLessEqual(first + 20, low, "default ports must lie below the ephemeral range")
        squatter = socket.socket()
        try:
            squatter.bind(("127.0.0.1", first + 10 + 4))  # n2's cluster port
            squatter.listen()
            r = self.cluster("start", "2", "--dir", str(d), "--bin", self.bin, "--timeout", "60",
                             check=False)
            try:
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("a port was taken", r.stderr)
                moved = [json.loads(ln) for ln in r.stdout.splitlines()]
                self.assertNotIn(f":{first + 14}", moved[1]["cluster"])
            finally:
                self.cluster("stop", "--dir", str(d), check=False)
            # A port the user chose is not moved: taken means failed.
            e = self.tmp / "taken-fixed"
            r = self.cluster("start", "2", "--dir", str(e), "--bin", self.bin, "--timeout", "60",
                             "--base-port", str(first), check=False)
            self.cluster("stop", "--dir", str(e), check=False)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("cannot listen on", r.stderr)
        finally:
            squatter.close()

    def test_usage_errors(self):
        self.assertEqual(self.cluster("configs", "0", check=False).returncode, 2)
        self.assertEqual(self.cluster("frobnicate", check=False).returncode, 2)
        self.assertEqual(self.cluster("start", "2", "--bogus", check=False).returncode, 2)
        d = self.tmp / "part"
        self.cluster("configs", "2", "--dir", str(d), "--bin", self.bin)
        r = self.cluster("partition", "1", "--dir", str(d), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--netns", r.stderr)
        r = self.cluster("kill", "1", "--dir", str(d), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not running", r.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    NODE = os.path.abspath(sys.argv[1])
    SRC = Path(sys.argv[2]).resolve()
    unittest.main(argv=[sys.argv[0], *sys.argv[3:]])
