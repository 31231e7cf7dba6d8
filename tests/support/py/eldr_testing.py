"""Helpers the Python test and bench scripts share (the Python side of tests/support/): stopping a
child process, waiting for a process's "<name> ready {json}" line or ready file, one raw HTTP
request, a free port.

Scripts run as plain files (CTest runs them with /usr/bin/python3, bench/ scripts by hand), so each
finds this module by path, relative to its own file, after keeping Python from writing bytecode
into the source tree:

    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support",
                                    "py"))  # (as many ".." as the script is deep below tests/)
    import eldr_testing  # noqa: E402

Standard library only; nothing here sleeps: every wait is bounded by a timeout the caller gives.
"""
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time


def stop_process(proc, timeout, sig=signal.SIGTERM):
    """Stops the subprocess.Popen `proc`: sends it `sig` (SIGTERM unless told), waits up to
    `timeout` seconds for it to exit, and if it has not, SIGKILLs it and waits for that.

    Returns True when it exited within the timeout (or had exited before the call), False when it
    had to be killed; either way it is reaped on return (proc.returncode is set). Nothing is sent
    to a process that has already exited. Its pipes are left for the caller to close.
    """
    if proc.poll() is not None:
        return True
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def kill_process(proc):
    """SIGKILLs the subprocess.Popen `proc` if it is still running and reaps it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def loopback_node_argv(node_bin, data_dir, metrics="127.0.0.1:0"):
    """The command line of an all-roles eldr-node on the embedded default configuration with
    `data_dir` and every endpoint on 127.0.0.1 port 0 (the OS picks; the ready line or a
    --ready-file the caller appends says which); metrics="" turns the HTTP endpoint off."""
    return [node_bin, "--data-dir", data_dir, "--route", "tcp://127.0.0.1:0",
            "--worker", "tcp://127.0.0.1:0", "--admin", "tcp://127.0.0.1:0", "--metrics", metrics]


def ready_prefix(name):
    """The start of the line a process named `name` prints once it serves ("eldr-node ready ")."""
    return name + " ready "


def ready_from_lines(lines, name="eldr-node"):
    """The JSON of the first "<name> ready {json}" line among `lines` (str lines, e.g. a text-mode
    Popen's stdout, where a node's log comes before it); {} when the lines end without one.
    Blocks as long as iterating `lines` does: no deadline of its own."""
    prefix = ready_prefix(name)
    for line in lines:
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    return {}


def read_ready_line(proc, name, log, timeout):
    """Reads the binary stdout pipe of `proc` for up to `timeout` seconds until the line
    "<name> ready {json}", copying every line read to the binary file `log`.

    Returns the parsed JSON; from then on a daemon thread copies the rest of stdout to `log` and
    closes `log` at EOF. Returns None when the deadline passes or stdout ends first: then `log` is
    flushed and left open, and the process is left running, both for the caller to deal with.
    """
    prefix = ready_prefix(name).encode()
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            log.write(line + b"\n")
            if line.startswith(prefix):
                log.write(buf)  # what came after it in the same read
                log.flush()
                threading.Thread(target=_copy_until_eof, args=(fd, log), daemon=True).start()
                return json.loads(line[len(prefix):])
    log.flush()
    return None


def _copy_until_eof(fd, log):
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        log.write(chunk)
        log.flush()
    log.close()


def wait_ready_file(path, proc, timeout, interval=0.05):
    """The JSON of the ready file `path` (a node's --ready-file, written once it serves) as soon as
    it is there and not empty, polled every `interval` seconds for up to `timeout` seconds.
    Returns None when the deadline passes or the subprocess.Popen `proc` exits first (the caller
    tells the two apart by proc.poll() and reports; the process is left as it is)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                return json.load(f)
        if proc.poll() is not None:
            return None
        time.sleep(interval)  # polling a file the process writes once, within a deadline
    return None


def http_request(host, port, path, method="GET", timeout=5.0):
    """(status, body bytes) of one HTTP/1.1 request with no body over a raw socket (the server's
    exact bytes, no client library in between); status 0 when the answer has no status line.
    Raises OSError when the connection fails."""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                   % (method, path)).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body


def http_get(host, port, path, timeout=5.0):
    """(status, body bytes) of one raw GET: http_request(host, port, path, "GET", timeout)."""
    return http_request(host, port, path, "GET", timeout)


def free_port(host="127.0.0.1"):
    """A TCP port on `host` the kernel reported free a moment ago; nothing listens there on return
    (another process may take it later: for "nothing listens here" tests, not for servers, which
    bind port 0 themselves)."""
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def hold_port(host="127.0.0.1"):
    """(socket, port): a listening TCP socket on `host` with a kernel-chosen port; the caller
    closes the socket."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen(1)
    return s, s.getsockname()[1]


class Skip(Exception):
    """Raised by a test function that cannot run here (the message says why):
    run_test_functions counts it as skipped, not failed."""


def run_test_functions(namespace):
    """The small runner of the script-style unit tests: calls every callable named test_* in
    `namespace` (a module's globals()), in name order, printing PASS, SKIP (a Skip raised) or FAIL
    with its traceback for each. Returns the exit code: 0 when none failed, else 1."""
    import traceback
    failures = skips = 0
    for name, fn in sorted(namespace.items()):
        if not name.startswith("test_") or not callable(fn):
            continue
        try:
            fn()
            print("PASS", name)
        except Skip as e:
            skips += 1
            print("SKIP", name, "-", e)
        except Exception:  # noqa: BLE001 - report every failing test
            failures += 1
            print("FAIL", name)
            traceback.print_exc()
    if failures:
        print("%d tests failed" % failures)
        return 1
    print("all tests passed (%d skipped)" % skips)
    return 0


def check(cond, what):
    """The script-style tests' assertion: raises AssertionError(what) unless cond."""
    if not cond:
        raise AssertionError(what)


def shared_data(root):
    """The recorded traces' folder: $ELDR_SHARED_DATA, else ../shared/data beside the checkout
    `root`. Raises Skip when it is not there."""
    d = os.environ.get("ELDR_SHARED_DATA") or os.path.join(root, "..", "shared", "data")
    if not os.path.isdir(d):
        raise Skip("no shared data at %s (set ELDR_SHARED_DATA)" % d)
    return d


class FakeRouter:
    """A fake eldr node for client tests: a ZeroMQ ROUTER bound to a free loopback port (or to
    `bind`, e.g. the endpoint of one closed before) (a CURVE
    server when server_secret, a Z85 secret key, is given), served by a daemon thread that runs
    the subclass's serve() until close(). serve() polls with a short timeout and returns when
    self.stopping is set; the timeout only bounds how late it sees that, nothing waits on it.
    Needs pyzmq (python3-zmq); imported here, so only the scripts that use this need it."""

    def __init__(self, server_secret=None, bind="tcp://127.0.0.1:*"):
        import zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if server_secret is not None:
            self.sock.setsockopt(zmq.CURVE_SERVER, 1)
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, server_secret.encode())
        self.sock.bind(bind)
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def start(self):
        """Starts serving; the subclass calls it at the end of its __init__."""
        self.thread.start()

    def serve(self):
        raise NotImplementedError

    def close(self):
        self.stopping.set()
        self.thread.join()
        self.sock.close(0)
        self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def toy_blocks(domain, first_hash, n):
    """n chained blocks (hash, parent, ids) of the toy model (2 layers, 8 experts, top-2): 4
    tokens each, every token picking experts {2d, 2d+1} in both layers, so the blocks belong to
    worker `domain` (tests/support/toy_model.hpp is the C++ side)."""
    out, parent = [], None
    for i in range(n):
        h = first_hash + i
        out.append((h, parent, [[[2 * domain, 2 * domain + 1]] * 4] * 2))
        parent = h
    return out
