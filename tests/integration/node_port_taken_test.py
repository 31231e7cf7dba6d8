#!/usr/bin/python3
"""Integration test: an eldr-node started on a port another process holds says which
configuration key and port are taken and exits non-zero, cleanly (issue 16).

    node_port_taken_test.py --build-dir BUILD      # exit 0 passes, 77 = eldr-node not built

For each of endpoints.route, .worker, .admin (ZeroMQ ROUTER sockets) and endpoints.metrics (HTTP)
the test holds a listening TCP socket on 127.0.0.1 (port 0, so the kernel picks a free one),
starts eldr-node with that endpoint on the held port and the others on port 0, and checks: the
exit code is 1 (a start-up failure, not a signal, not 2 = invalid configuration), within the
timeout, no "ready" line, and stderr names the key, the port and "in use". The same for a
model's models[].kv_events.bind (a ZeroMQ SUB socket the node binds) and cluster.listen. Then
the real case: a second eldr-node on the first one's route port.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "py"))
import eldr_testing  # noqa: E402

NODE = None
TIMEOUT_S = 60


def node_args(tmp, **override):
    args = {"--route": "tcp://127.0.0.1:0", "--worker": "tcp://127.0.0.1:0",
            "--admin": "tcp://127.0.0.1:0", "--metrics": "127.0.0.1:0"}
    args.update(override)
    out = [NODE, "--data-dir", os.path.join(tmp, "data")]
    for k, v in args.items():
        out += [k, v]
    return out


def write_file(tmp, name, text):
    """Writes `text` to tmp/name; returns the path."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


class PortTakenTest(unittest.TestCase):
    def run_node(self, argv):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        return r.returncode, r.stdout, r.stderr

    def check_taken(self, key, argv_for, says_in_use=True):
        """Starts eldr-node with argv_for(tmp, port), `port` one this process holds, and checks
        that it fails cleanly naming `key` and the port (and "in use", unless says_in_use is
        False)."""
        held, port = eldr_testing.hold_port()
        try:
            with tempfile.TemporaryDirectory(prefix="eldr-port-taken-") as tmp:
                rc, out, err = self.run_node(argv_for(tmp, port))
        finally:
            held.close()
        self.assertEqual(rc, 1, f"{key} on a taken port: exit {rc}\nstdout: {out}\nstderr: {err}")
        self.assertNotIn("eldr-node ready", out)
        self.assertIn(key, err, err)
        self.assertIn(str(port), err, err)
        if says_in_use:
            self.assertIn("in use", err, err)
        # One message, not a crash dump.
        self.assertNotIn("terminate called", err)

    def check_endpoint_taken(self, flag, key, value_of_port):
        self.check_taken(key, lambda tmp, port: node_args(tmp, **{flag: value_of_port(port)}))

    def test_route_port_taken(self):
        self.check_endpoint_taken("--route", "endpoints.route", lambda p: f"tcp://127.0.0.1:{p}")

    def test_worker_port_taken(self):
        self.check_endpoint_taken("--worker", "endpoints.worker", lambda p: f"tcp://127.0.0.1:{p}")

    def test_admin_port_taken(self):
        self.check_endpoint_taken("--admin", "endpoints.admin", lambda p: f"tcp://127.0.0.1:{p}")

    def test_metrics_port_taken(self):
        self.check_endpoint_taken("--metrics", "endpoints.metrics", lambda p: f"127.0.0.1:{p}")

    def test_cluster_listen_port_taken(self):
        # CAF's middleman port (cluster.listen), which needs a cluster secret.
        def argv(tmp, port):
            secret = write_file(tmp, "cluster.secret", "s" * 32 + "\n")
            config = write_file(tmp, "eldr.toml",
                                f'[cluster]\nsecret_file = "{secret}"\n\n[[models]]\nname = "m"\n')
            return node_args(tmp) + ["--config", config, "--cluster-listen", f"127.0.0.1:{port}"]
        self.check_taken("cluster.listen", argv, says_in_use=False)

    def test_kv_events_bind_port_taken(self):
        # A model's KV-event SUB socket (models[].kv_events.bind) is bound at start like the
        # endpoints: a taken port fails the start and names the key, not a log line later.
        def argv(tmp, port):
            config = write_file(tmp, "eldr.toml", '[[models]]\nname = "m"\n'
                                f'kv_events.bind = "tcp://127.0.0.1:{port}"\n')
            return node_args(tmp) + ["--config", config]
        self.check_taken("models[0].kv_events.bind", argv)

    def test_second_node_on_the_first_ones_ports(self):
        with tempfile.TemporaryDirectory(prefix="eldr-port-taken-") as tmp:
            ready = os.path.join(tmp, "ready.json")
            first = subprocess.Popen(node_args(os.path.join(tmp, "a")) + ["--ready-file", ready],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, stdin=subprocess.DEVNULL)
            try:
                # The ready line is printed once every endpoint is bound (no sleep: read it).
                bound = eldr_testing.ready_from_lines(first.stdout)
                self.assertIn("route", bound, "the first node did not start")
                route_port = bound["route"].rsplit(":", 1)[1]
                rc, out, err = self.run_node(node_args(os.path.join(tmp, "b"),
                                                       **{"--route": bound["route"]}))
                self.assertEqual(rc, 1, f"exit {rc}\nstdout: {out}\nstderr: {err}")
                self.assertIn("endpoints.route", err)
                self.assertIn(route_port, err)
                self.assertIn("in use", err)
                self.assertIsNone(first.poll(), "the first node must keep serving")
            finally:
                eldr_testing.stop_process(first, timeout=30)
                first.stdout.close()
            self.assertEqual(first.returncode, 0)


def main():
    global NODE
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    args, rest = parser.parse_known_args()
    NODE = os.path.join(args.build_dir, "tools", "eldr-node", "eldr-node")
    if not os.access(NODE, os.X_OK):
        print(f"SKIP: {NODE} is not built", file=sys.stderr)
        return 77
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
