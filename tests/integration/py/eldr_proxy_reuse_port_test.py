#!/usr/bin/python3
"""Several eldr-proxy processes on one port (--reuse-port), with real processes and sockets:
the kernel spreads new connections over both (each /health answer names its process); when one
stops, the other serves every connection; each process's own /metrics and /health are on its
--metrics-listen port; a third process without --reuse-port is refused the port with a clear
error, as is a --metrics-listen address that is taken, and --reuse-port with port 0 is a usage
error naming the flag.

The proxies' upstreams and eldr endpoints are addresses nothing listens on: /health needs
neither (instances count as healthy until a request to them fails), and the proxies start
without a node (registration is retried in the background).

usage: eldr_proxy_reuse_port_test.py      exit 0 when every check passes.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.request

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from proxy_harness import PROXY, PYTHON, ReadyProcess  # noqa: E402


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def reserve_port():
    """A socket bound to 127.0.0.1:0 with SO_REUSEPORT and never listening: it holds the port for
    the test (no other program can take it) and receives no connection, which only listening
    sockets of the group do."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def proxy_cmd(port, reuse=True, metrics="127.0.0.1:0"):
    return ([PYTHON, PROXY, "--listen", "127.0.0.1:%d" % port, "--metrics-listen", metrics,
             "--eldr", "tcp://127.0.0.1:9",
             "--eldr-worker", "tcp://127.0.0.1:9", "--model", "m", "--prefill",
             "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9", "--layers", "2",
             "--experts", "8", "--top-k", "2", "--log-level", "warning"] +
            (["--reuse-port"] if reuse else []))


def get(url):
    """(status, body) of a GET on a new connection (urllib closes it after each request)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


def health_pid(port):
    status, body = get("http://127.0.0.1:%d/health" % port)
    check(status == 200, "/health HTTP %d" % status)
    return json.loads(body)["pid"]


def main():
    env = dict(os.environ, ELDR_COUNTS_NATIVE="off")
    holder, port = reserve_port()
    with tempfile.TemporaryDirectory(prefix="eldr-proxy-reuse-") as tmp:
        procs = []
        try:
            for i in range(2):
                p = ReadyProcess(proxy_cmd(port), "eldr-proxy",
                                 os.path.join(tmp, "proxy%d.log" % i), env=env)
                procs.append(p)
                p.start()
            pids = {p.ready["pid"] for p in procs}
            check(len(pids) == 2, "two processes: %r" % pids)

            # 64 connections: the kernel hashes each one to a listener, so both serve some (all
            # on one would happen with probability 2^-63).
            seen = [health_pid(port) for _ in range(64)]
            check(set(seen) == pids, "connections served by %r, the proxies are %r"
                  % (sorted(set(seen)), sorted(pids)))
            print("PASS both processes serve the shared port (%s)"
                  % ", ".join("%d: %d" % (pid, seen.count(pid)) for pid in sorted(pids)))

            # Each process's own metrics and health, on its own port.
            for p in procs:
                url = p.ready["metrics_listen"]
                status, body = get(url + "/health")
                check(status == 200 and json.loads(body)["pid"] == p.ready["pid"],
                      "%s/health: %d %r" % (url, status, body[:200]))
                status, body = get(url + "/metrics")
                check(status == 200 and b"\neldr_proxy_in_flight " in body,
                      "%s/metrics: %d %r" % (url, status, body[:200]))
            print("PASS each process's /metrics and /health on its --metrics-listen port")

            # One stops: the other takes every new connection.
            procs[0].stop()
            left = procs[1].ready["pid"]
            seen = [health_pid(port) for _ in range(16)]
            check(set(seen) == {left}, "after one stopped: served by %r" % sorted(set(seen)))
            print("PASS with one stopped, the other serves every connection")

            # Without --reuse-port the port is refused, with the flag and the reason.
            r = subprocess.run(proxy_cmd(port, reuse=False), capture_output=True, text=True,
                               env=env, timeout=60)
            check(r.returncode == 1 and "--listen 127.0.0.1:%d" % port in r.stderr,
                  "a third proxy without --reuse-port: exit %d, stderr %r"
                  % (r.returncode, r.stderr[-500:]))
            print("PASS a proxy without --reuse-port is refused the port")

            r = subprocess.run(proxy_cmd(0, reuse=False, metrics="127.0.0.1:%d" % port),
                               capture_output=True, text=True, env=env, timeout=60)
            check(r.returncode == 1 and "--metrics-listen 127.0.0.1:%d" % port in r.stderr,
                  "--metrics-listen on a taken port: exit %d, stderr %r"
                  % (r.returncode, r.stderr[-500:]))
            print("PASS a taken --metrics-listen address is refused, naming the flag")

            r = subprocess.run(proxy_cmd(0), capture_output=True, text=True, env=env,
                               timeout=60)
            check(r.returncode == 2 and "--reuse-port" in r.stderr,
                  "--reuse-port with port 0: exit %d, stderr %r" % (r.returncode, r.stderr[-500:]))
            print("PASS --reuse-port with port 0 is a usage error naming the flag")
        finally:
            for p in procs:
                p.stop()
            holder.close()
    print("all tests passed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print("FAIL", e)
        sys.exit(1)
