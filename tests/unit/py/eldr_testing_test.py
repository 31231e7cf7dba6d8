#!/usr/bin/python3
"""Unit tests of the shared Python test helpers (tests/support/py/eldr_testing.py) against real
child processes and a loopback socket: what stop_process promises (signal, timeout, kill, reap),
the ready line and ready file readers, the raw HTTP request, the port helpers. Standard library only.

    eldr_testing_test.py      # exit 0 passes
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support",
                                "py"))
import eldr_testing  # noqa: E402

PY = "/usr/bin/python3"


def child(code, **kw):
    """A Python child running `code` that prints "up" once its signal handlers are in place."""
    p = subprocess.Popen([PY, "-c", "import signal, sys, time\n" + code + "\nprint('up', flush=True)"
                          "\nwhile True: time.sleep(1)"], stdout=subprocess.PIPE, text=True, **kw)
    assert p.stdout.readline() == "up\n"
    return p


class StopProcessTest(unittest.TestCase):
    def test_a_process_that_honours_sigterm_stops_within_the_timeout(self):
        p = child("")
        self.assertTrue(eldr_testing.stop_process(p, timeout=30))
        self.assertEqual(p.returncode, -signal.SIGTERM)
        p.stdout.close()

    def test_a_process_that_ignores_sigterm_is_killed_and_reaped(self):
        p = child("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
        self.assertFalse(eldr_testing.stop_process(p, timeout=0.2))
        self.assertEqual(p.returncode, -signal.SIGKILL)
        p.stdout.close()

    def test_the_signal_can_be_chosen(self):
        p = child("")
        self.assertTrue(eldr_testing.stop_process(p, timeout=30, sig=signal.SIGUSR1))
        self.assertEqual(p.returncode, -signal.SIGUSR1)
        p.stdout.close()

    def test_an_exited_process_is_reaped_and_sent_nothing(self):
        p = subprocess.Popen([PY, "-c", "raise SystemExit(3)"])
        p.wait()
        self.assertTrue(eldr_testing.stop_process(p, timeout=0.2))
        self.assertEqual(p.returncode, 3)

    def test_kill_process(self):
        p = child("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
        eldr_testing.kill_process(p)
        self.assertEqual(p.returncode, -signal.SIGKILL)
        eldr_testing.kill_process(p)  # already reaped: nothing happens
        p.stdout.close()


class ReadyLineTest(unittest.TestCase):
    def test_ready_from_lines(self):
        lines = ["log line\n", 'eldr-node ready {"route": "tcp://127.0.0.1:1"}\n', "after\n"]
        self.assertEqual(eldr_testing.ready_from_lines(lines), {"route": "tcp://127.0.0.1:1"})
        self.assertEqual(eldr_testing.ready_from_lines(["log\n"]), {})
        self.assertEqual(eldr_testing.ready_from_lines(['fake ready {"a": 1}\n'], "fake"),
                         {"a": 1})

    def test_read_ready_line_copies_the_output_to_the_log(self):
        with tempfile.TemporaryDirectory(prefix="eldr-testing-") as tmp:
            path = os.path.join(tmp, "log")
            log = open(path, "wb")
            p = subprocess.Popen([PY, "-c", "print('before'); print('x ready {\"n\": 2}', "
                                  "flush=True); print('after')"], stdout=subprocess.PIPE)
            before = set(threading.enumerate())
            self.assertEqual(eldr_testing.read_ready_line(p, "x", log, timeout=30), {"n": 2})
            p.wait()
            for t in set(threading.enumerate()) - before:  # the copier closes the log at EOF
                t.join(30)
            self.assertTrue(log.closed)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), b'before\nx ready {"n": 2}\nafter\n')
            p.stdout.close()

    def test_read_ready_line_is_none_when_the_output_ends_first(self):
        with tempfile.TemporaryDirectory(prefix="eldr-testing-") as tmp:
            with open(os.path.join(tmp, "log"), "wb") as log:
                p = subprocess.Popen([PY, "-c", "print('no ready line')"], stdout=subprocess.PIPE)
                self.assertIsNone(eldr_testing.read_ready_line(p, "x", log, timeout=30))
                self.assertFalse(log.closed)
                p.wait()
                p.stdout.close()


class ReadyFileTest(unittest.TestCase):
    def test_the_file_once_written(self):
        with tempfile.TemporaryDirectory(prefix="eldr-testing-") as tmp:
            path = os.path.join(tmp, "ready.json")
            p = child("open(%r, 'w').write('{\"port\": 7}')" % path)
            self.assertEqual(eldr_testing.wait_ready_file(path, p, timeout=30), {"port": 7})
            eldr_testing.kill_process(p)
            p.stdout.close()

    def test_none_when_the_process_exits_first_or_the_deadline_passes(self):
        with tempfile.TemporaryDirectory(prefix="eldr-testing-") as tmp:
            path = os.path.join(tmp, "ready.json")
            p = subprocess.Popen([PY, "-c", "raise SystemExit(2)"])
            self.assertIsNone(eldr_testing.wait_ready_file(path, p, timeout=30))
            self.assertEqual(p.returncode, 2)
            p = child("")
            self.assertIsNone(eldr_testing.wait_ready_file(path, p, timeout=0.1))
            self.assertIsNone(p.poll())
            eldr_testing.kill_process(p)
            p.stdout.close()

    def test_loopback_node_argv(self):
        self.assertEqual(eldr_testing.loopback_node_argv("eldr-node", "/d", metrics=""),
                         ["eldr-node", "--data-dir", "/d", "--route", "tcp://127.0.0.1:0",
                          "--worker", "tcp://127.0.0.1:0", "--admin", "tcp://127.0.0.1:0",
                          "--metrics", ""])


class HttpTest(unittest.TestCase):
    def serve_once(self, answer):
        """A one-shot server answering `answer` bytes; returns (port, thread, received list)."""
        srv, port = eldr_testing.hold_port()
        got = []

        def run():
            conn, _ = srv.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                got.append(data)
                conn.sendall(answer)
            srv.close()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return port, t, got

    def test_request_and_answer(self):
        port, t, got = self.serve_once(b"HTTP/1.1 404 Not Found\r\nX: y\r\n\r\nnot here")
        self.assertEqual(eldr_testing.http_request("127.0.0.1", port, "/a", "POST"),
                         (404, b"not here"))
        t.join(30)
        self.assertTrue(got[0].startswith(b"POST /a HTTP/1.1\r\n"))
        self.assertIn(b"Connection: close\r\n", got[0])

    def test_get_and_no_status_line(self):
        port, t, got = self.serve_once(b"garbage")
        self.assertEqual(eldr_testing.http_get("127.0.0.1", port, "/m"), (0, b""))
        t.join(30)
        self.assertTrue(got[0].startswith(b"GET /m HTTP/1.1\r\n"))

    def test_free_port_has_no_listener(self):
        port = eldr_testing.free_port()
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False, verbosity=2).result.wasSuccessful() else 1)
