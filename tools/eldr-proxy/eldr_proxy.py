#!/usr/bin/python3
"""eldr-proxy: an OpenAI-compatible HTTP proxy for vLLM prefill/decode disaggregation that asks
eldr which decode instance serves each request.

Per request (docs/eldr-proxy.md has the whole story and every flag):
  1. prefill on a prefill instance (round robin over the healthy ones): the client's body with
     max_tokens 1, stream off and vLLM's NIXL kv_transfer_params {"do_remote_decode": true, ...},
     as vLLM's toy_proxy_server.py sends it; return_token_ids on when block hashes need them;
  2. the prefill's routed experts (vLLM --enable-return-routed-experts) of the prompt become eldr
     counts per KV block (eldr_proxy_counts.py), the blocks get hashes (eldr_proxy_hashes.py);
  3. an async route call to eldr (eldr_client_aio, several router endpoints, failover);
  4. the client's request, with the prefill's kv_transfer_params, goes to the decode instance eldr
     chose (the i-th --decode is eldr's decode worker i) and its answer, streamed (SSE) or not,
     is relayed to the client;
  5. when the answer ends, the client goes away or anything fails, a `finished` for the request
     goes to eldr (batched per worker).
When eldr does not answer (or answers an error), the proxy serves anyway: it picks the decode
instance with the fewest of its own requests in flight, counts why (/metrics) and logs it at most
once per 10 s per reason. A prefill instance that cannot be reached gets the request a 502 and is
skipped until its /health answers again.

Run with Debian's /usr/bin/python3 (python3-aiohttp, python3-zmq, python3-msgpack, python3-numpy,
python3-cbor2 for vLLM's block hashes, python3-httptools for the instances' answers).
"""
import argparse
import asyncio
import collections
import importlib.util
import json
import logging
import os
import signal
import sys
import time
import urllib.parse
import uuid

from aiohttp import web

_HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("eldr_client") is None:  # not installed: run from the source tree
    sys.path.insert(0, os.path.join(_HERE, "..", "..", "cluster", "python"))
sys.path.insert(0, _HERE)

from eldr_client import EldrError, _z85_key, checked_endpoint  # noqa: E402
from eldr_client_aio import AsyncRouteClient, AsyncWorkerClient  # noqa: E402

import eldr_proxy_hashes as block_hashes  # noqa: E402
from eldr_proxy_metrics import ProxyMetrics  # noqa: E402
from eldr_proxy_counts import (CountsBuilder, CountsError, block_keys,  # noqa: E402
                               keep_large_allocations, moe_layer_spec)
from eldr_routed_experts import load_answer  # noqa: E402
import eldr_proxy_native  # noqa: E402
from eldr_proxy_upstream import (BodyTooLarge, Client, ConnectFailed, Origin,  # noqa: E402
                                 UpstreamError, header_bytes)

log = logging.getLogger("eldr-proxy")

MAX_ROUTE_BLOCKS = 4096  # docs/protocol.md section 3: blocks and counts blocks per request
MAX_UPSTREAM_BODY = 256 << 20  # a prefill or non-streamed decode answer read whole
FINISHED_BATCH = 4096    # docs/protocol.md section 4: ids in one finished message
EXIT_USAGE = 2


# ---------------------------------------------------------------------------------------------
# Configuration: every flag validated once, at start (exit 2 naming the flag)


class UsageError(Exception):
    def __init__(self, flag, message):
        super().__init__("%s: %s" % (flag, message))
        self.flag = flag


def _host_port(flag, value):
    host, sep, port = str(value).rpartition(":")
    if not sep or not host:
        raise UsageError(flag, "%r is not HOST:PORT" % value)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port)
    except ValueError:
        raise UsageError(flag, "port %r is not a number" % port) from None
    if not 0 <= port <= 65535:
        raise UsageError(flag, "port %d is outside 0..65535" % port)
    return host, port


def _zmq_endpoint(flag, value):
    try:
        value = checked_endpoint(flag, value, True)
    except ValueError as e:
        raise UsageError(flag, str(e).split(": ", 1)[-1]) from None
    if value.startswith("tcp://"):
        _host_port(flag, value[len("tcp://"):])
    return value


def _base_url(flag, value):
    """An instance's base URL (http://host:port[/prefix]); the OpenAI API is under /v1."""
    value = str(value).rstrip("/")
    try:
        checked_endpoint(flag, value, False)
    except ValueError as e:
        raise UsageError(flag, str(e).split(": ", 1)[-1]) from None
    u = urllib.parse.urlsplit(value)
    if u.scheme not in ("http", "https"):
        raise UsageError(flag, "%r is not an http:// or https:// URL" % value)
    if not u.hostname:
        raise UsageError(flag, "%r has no host" % value)
    try:
        u.port
    except ValueError as e:
        raise UsageError(flag, "%r: %s" % (value, e)) from None
    if u.query or u.fragment:
        raise UsageError(flag, "%r: a base URL has no query or fragment" % value)
    if u.path.endswith("/v1"):
        raise UsageError(flag, "%r: give the instance's base URL, without /v1" % value)
    if len(value + "/metrics") > 256:
        raise UsageError(flag, "%r: longer than eldr's 256-byte endpoints" % value)
    return value


def _int_in(flag, value, lo, hi):
    if not lo <= value <= hi:
        raise UsageError(flag, "%d is outside %d..%d" % (value, lo, hi))
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError("usage", message)


def build_parser():
    p = _Parser(prog="eldr-proxy", description=(
        "OpenAI-compatible proxy for vLLM prefill/decode disaggregation; eldr picks the decode "
        "instance. docs/eldr-proxy.md explains every flag."))
    a = p.add_argument
    a("--listen", required=True, metavar="HOST:PORT", help="where clients connect (port 0: any)")
    a("--reuse-port", action="store_true",
      help="share --listen's port with other eldr-proxy processes on this host (SO_REUSEPORT: "
           "the kernel spreads new connections over them); one process serves about 650 "
           "requests per CPU-second, so a busy host runs one per core. Needs a fixed port")
    a("--metrics-listen", metavar="HOST:PORT",
      help="also serve GET /metrics and /health here: this process's own (on a shared "
           "--reuse-port port they come from whichever process the connection reached)")
    a("--eldr", action="append", required=True, metavar="ENDPOINT",
      help="an eldr node's route endpoint (tcp://H:P); repeat for several nodes (failover)")
    a("--eldr-worker", action="append", required=True, metavar="ENDPOINT",
      help="an eldr node's worker endpoint (registrations and finished events); repeatable")
    a("--model", required=True, help="the eldr model ([[models]] name) the decode pool serves")
    a("--prefill", action="append", required=True, metavar="URL",
      help="a prefill instance's base URL (http://H:P); repeatable")
    a("--decode", action="append", required=True, metavar="URL",
      help="a decode instance's base URL; the i-th is eldr's decode worker i; repeatable")
    a("--layers", type=int, required=True, help="L: MoE layers of eldr's geometry")
    a("--experts", type=int, required=True, help="E: routed experts per layer")
    a("--top-k", type=int, required=True, help="k: experts each token picks per layer")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--moe-layers", metavar="SPEC",
                   help="vLLM layer indices of the L MoE layers, e.g. 1-26 or 0,2,4-9; all; "
                        "auto (per response: the layers that are not all zero)")
    g.add_argument("--first-moe-layer", type=int, metavar="F",
                   help="the MoE layers are vLLM layers F..F+L-1 (default 0; DeepSeek-V2: 1)")
    a("--block-size", type=int, default=16, help="vLLM's KV block size in tokens (16)")
    a("--block-hash", choices=block_hashes.SOURCES,
      help="vllm: vLLM's sha256_cbor hashes (needs --hash-seed); proxy: the proxy's own chained "
           "hashes; request: per-request hashes. Default: vllm with --hash-seed, else proxy")
    a("--hash-seed", help="the PYTHONHASHSEED every vLLM instance runs with (vllm hashes); the "
                          "proxy's seed for proxy hashes")
    a("--eldr-timeout-ms", type=int, default=200,
      help="wait per route attempt before the next endpoint (200)")
    a("--eldr-retry-ms", type=int, default=1000,
      help="after 3 route timeouts in a row, skip eldr for this long (1000)")
    a("--worker-timeout-ms", type=int, default=2000,
      help="wait per registration/finished attempt (2000)")
    a("--curve-server-key", metavar="Z85", help="the eldr nodes' CURVE public key")
    a("--curve-secret-key-file", metavar="FILE",
      help="this proxy's CURVE secret key (Z85); default: an ephemeral pair")
    a("--decode-capacity", type=int, default=0,
      help="capacity registered for each decode instance (0 = unbounded)")
    a("--max-concurrent", type=int, default=1024,
      help="client requests served at once; more get 503 (1024)")
    a("--max-body-bytes", type=int, default=8 << 20, help="largest client body (8 MiB)")
    a("--connect-timeout-ms", type=int, default=2000, help="connecting to an instance (2000)")
    a("--upstream-timeout-s", type=float, default=600.0,
      help="longest silence from an instance while it answers (600)")
    a("--retry-down-ms", type=int, default=2000,
      help="an unreachable instance is skipped and its /health probed this often (2000)")
    a("--finished-flush-ms", type=int, default=2,
      help="finished events are batched per worker for at most this long (2)")
    a("--ready-file", help="written with the ready JSON once serving")
    a("--event-loop", default="asyncio", choices=["asyncio", "uvloop"],
      help="asyncio's own loop (default) or uvloop (Debian's python3-uvloop; no gain measured "
           "by bench/eldr_proxy_bench.py on this project's 2-core machine)")
    a("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


class Config:
    """The validated command line."""

    def __init__(self, ns):
        self.listen = _host_port("--listen", ns.listen)
        if ns.reuse_port and self.listen[1] == 0:
            raise UsageError("--reuse-port", "needs a fixed --listen port: with port 0 every "
                             "process would get a port of its own")
        self.reuse_port = ns.reuse_port
        self.metrics_listen = (None if ns.metrics_listen is None else
                               _host_port("--metrics-listen", ns.metrics_listen))
        self.eldr = [_zmq_endpoint("--eldr", e) for e in ns.eldr]
        self.eldr_worker = [_zmq_endpoint("--eldr-worker", e) for e in ns.eldr_worker]
        model = ns.model
        if not model or len(model.encode("utf-8", "surrogatepass")) > 256:
            raise UsageError("--model", "1..256 bytes")
        try:
            model.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("--model", "not valid UTF-8") from None
        self.model = model
        self.prefill = [_base_url("--prefill", u) for u in ns.prefill]
        self.decode = [_base_url("--decode", u) for u in ns.decode]
        for u in self.decode:
            if not u.startswith("http://"):
                raise UsageError("--decode", "%r: eldr scrapes a decode instance's /metrics over "
                                 "http:// only" % u)
        for flag, urls in (("--prefill", self.prefill), ("--decode", self.decode)):
            dup = [u for u, n in collections.Counter(urls).items() if n > 1]
            if dup:
                raise UsageError(flag, "%s given twice" % dup[0])
        self.block_size = _int_in("--block-size", ns.block_size, 1, 255)
        _int_in("--layers", ns.layers, 1, 1024)
        if ns.experts < 1:
            raise UsageError("--experts", "must be >= 1, got %d" % ns.experts)
        if not 1 <= ns.top_k <= ns.experts:
            raise UsageError("--top-k", "%d is outside 1..--experts (%d)" % (ns.top_k,
                                                                            ns.experts))
        if ns.moe_layers is not None:
            flag, spec = "--moe-layers", ns.moe_layers
        else:
            first = 0 if ns.first_moe_layer is None else ns.first_moe_layer
            _int_in("--first-moe-layer", first, 0, 4096)
            flag, spec = "--first-moe-layer", "%d-%d" % (first, first + ns.layers - 1)
        try:
            moe_layer_spec(spec, ns.layers, ns.top_k)
        except ValueError as e:
            raise UsageError(flag, "%r: %s" % (spec, e)) from None
        # The compiled conversion when its library is found (eldr_proxy_native), else numpy:
        # serve() says which, once, and /metrics shows it (eldr_proxy_counts_native).
        native, self.counts_note = eldr_proxy_native.load()
        try:
            self.counts = CountsBuilder(ns.layers, ns.experts, ns.top_k, spec, self.block_size,
                                        MAX_ROUTE_BLOCKS, native)
        except ValueError as e:  # what remains is the counts encoder's bound on E
            raise UsageError("--experts", str(e)) from None
        source = ns.block_hash or ("vllm" if ns.hash_seed is not None else "proxy")
        if source == "vllm" and ns.hash_seed is None:
            raise UsageError("--hash-seed", "required with --block-hash vllm: the "
                             "PYTHONHASHSEED of the vLLM instances (without it vLLM's block "
                             "hashes are random per process)")
        try:
            self.hasher = block_hashes.BlockHasher(source, ns.hash_seed, native=native)
        except (RuntimeError, ValueError) as e:
            raise UsageError("--block-hash", str(e)) from None
        self.eldr_timeout_ms = _int_in("--eldr-timeout-ms", ns.eldr_timeout_ms, 1, 60000)
        self.eldr_retry_s = _int_in("--eldr-retry-ms", ns.eldr_retry_ms, 1, 3600000) / 1000.0
        self.worker_timeout_ms = _int_in("--worker-timeout-ms", ns.worker_timeout_ms, 1, 60000)
        self.curve_server_key = None
        self.curve_secret_key = None
        if ns.curve_server_key is not None:
            try:
                self.curve_server_key = _z85_key(ns.curve_server_key, "--curve-server-key")
            except ValueError as e:
                raise UsageError("--curve-server-key", str(e).split(": ", 1)[-1]) from None
        if ns.curve_secret_key_file is not None:
            if self.curve_server_key is None:
                raise UsageError("--curve-secret-key-file", "needs --curve-server-key")
            try:
                with open(ns.curve_secret_key_file) as f:
                    secret = f.read().strip()
            except OSError as e:
                raise UsageError("--curve-secret-key-file", str(e)) from None
            try:
                self.curve_secret_key = _z85_key(secret, "--curve-secret-key-file")
            except ValueError:
                raise UsageError("--curve-secret-key-file", "not a Z85 CURVE secret key "
                                 "(40 characters)") from None
        self.decode_capacity = _int_in("--decode-capacity", ns.decode_capacity, 0, 2**32 - 1)
        self.max_concurrent = _int_in("--max-concurrent", ns.max_concurrent, 1, 1 << 20)
        self.max_body_bytes = _int_in("--max-body-bytes", ns.max_body_bytes, 1024, 1 << 30)
        self.connect_timeout_s = _int_in("--connect-timeout-ms", ns.connect_timeout_ms, 1,
                                         600000) / 1000.0
        if not 0.001 <= ns.upstream_timeout_s <= 86400:
            raise UsageError("--upstream-timeout-s", "%r is outside 0.001..86400"
                             % ns.upstream_timeout_s)
        self.upstream_timeout_s = ns.upstream_timeout_s
        self.retry_down_s = _int_in("--retry-down-ms", ns.retry_down_ms, 1, 3600000) / 1000.0
        self.finished_flush_s = _int_in("--finished-flush-ms", ns.finished_flush_ms, 0,
                                        10000) / 1000.0
        self.ready_file = ns.ready_file
        self.event_loop = ns.event_loop
        if ns.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise UsageError("--event-loop", "uvloop is not installed (apt-get install "
                             "python3-uvloop)")
        self.log_level = ns.log_level


def parse_config(argv):
    """The Config of a command line; raises UsageError naming the flag."""
    return Config(build_parser().parse_args(argv))


# ---------------------------------------------------------------------------------------------
# Small pieces


class LogLimiter:
    """At most one log line per key every `interval` seconds, saying how many were suppressed:
    a failing dependency is loud, never a flood."""

    def __init__(self, interval=10.0, clock=time.monotonic, max_keys=1024):
        self.interval, self.clock, self.max_keys = interval, clock, max_keys
        self.last = {}
        self.suppressed = collections.Counter()

    def warning(self, key, fmt, *args, exc_info=False):
        now = self.clock()
        last = self.last.get(key)
        if last is not None and now - last < self.interval:
            self.suppressed[key] += 1
            return
        if last is None and len(self.last) >= self.max_keys:
            self.last.clear()  # bound memory; at worst a line more
        self.last[key] = now
        n = self.suppressed.pop(key, 0)
        log.warning(fmt + (" (%d more like this in the last %.0f s)" % (n, self.interval)
                           if n else ""), *args, exc_info=exc_info)


def error_body(status, message, kind):
    """vLLM's (OpenAI's) error shape, so clients parse proxy errors like instance errors."""
    return web.json_response({"error": {"message": message, "type": kind, "param": None,
                                        "code": status}}, status=status)


class Upstream:
    """One vLLM instance: its URLs, whether the proxy sends to it, its requests in flight."""

    def __init__(self, role, index, base_url):
        self.role, self.index, self.base = role, index, base_url
        self.healthy = True
        self.in_flight = 0
        self.probe = None
        self.origin = Origin(base_url)  # parsed once: scheme, host, port, path prefix


class Pool:
    """Prefill or decode instances with health marks: an instance that cannot be reached is
    skipped, and its /health is probed every retry_s until it answers 200."""

    def __init__(self, role, urls, retry_s, limiter):
        self.role = role
        self.members = [Upstream(role, i, u) for i, u in enumerate(urls)]
        self.by_base = {u.base: u for u in self.members}
        self.retry_s = retry_s
        self.limiter = limiter
        self.client = None
        self._rr = 0

    def healthy(self):
        return [u for u in self.members if u.healthy]

    def next_round_robin(self):
        ok = self.healthy()
        if not ok:
            return None
        self._rr = (self._rr + 1) % len(ok)
        return ok[self._rr]

    def least_loaded(self):
        ok = self.healthy()
        if not ok:
            return None
        self._rr += 1  # ties rotate, so equal loads spread
        n = len(ok)
        return min((ok[(self._rr + i) % n] for i in range(n)), key=lambda u: u.in_flight)

    def mark_down(self, up, reason):
        if not up.healthy:
            return
        up.healthy = False
        log.warning("%s instance %d (%s) marked down: %s; probing %s/health every %.1f s",
                    self.role, up.index, up.base, reason, up.base, self.retry_s)
        up.probe = asyncio.ensure_future(self._probe(up))

    async def _probe(self, up):
        while not up.healthy:
            await asyncio.sleep(self.retry_s)  # a retry period, not a synchronisation
            try:
                r = await asyncio.wait_for(self.client.request(up.origin, "GET", "/health"),
                                           max(self.retry_s, 1.0))
                r.close()
                if r.status == 200:
                    up.healthy = True
                    log.warning("%s instance %d (%s) answers /health again: back in use",
                                self.role, up.index, up.base)
            except (UpstreamError, asyncio.TimeoutError):
                pass

    def health_values(self):
        return {(self.role, u.index): 1 if u.healthy else 0 for u in self.members}


class FinishedReporter:
    """Sends eldr the ids of finished requests, batched per decode worker: at most one message
    per worker every flush_s, up to 4,096 ids each. A batch eldr does not acknowledge is retried
    twice, then given up and counted; at most max_pending ids wait (the oldest are dropped and
    counted beyond), so an unreachable node costs bounded memory."""

    def __init__(self, client, model, flush_s, metrics, limiter, on_unregistered,
                 max_pending=1 << 16):
        self.client, self.model, self.flush_s = client, model, flush_s
        self.metrics, self.limiter = metrics, limiter
        self.on_unregistered = on_unregistered
        self.max_pending = max_pending
        self.pending = collections.OrderedDict()  # worker -> list of ids
        self.n_pending = 0
        self._task = None
        self._tasks = set()

    def add(self, worker, request_id):
        """Queues one id; never blocks (safe in a cancelled request's cleanup)."""
        self.pending.setdefault(worker, []).append(request_id)
        self.n_pending += 1
        while self.n_pending > self.max_pending:
            w, ids = next(iter(self.pending.items()))
            ids.pop(0)
            self.n_pending -= 1
            self.metrics.finished_lost.inc()
            if not ids:
                del self.pending[w]
        if self._task is None:
            self._task = asyncio.ensure_future(self._flush_later())

    async def _flush_later(self):
        try:
            if self.flush_s > 0:
                await asyncio.sleep(self.flush_s)  # the batching window
        finally:
            self._task = None
        self.flush()

    def flush(self):
        batches, self.pending, self.n_pending = self.pending, collections.OrderedDict(), 0
        for worker, ids in batches.items():
            for i in range(0, len(ids), FINISHED_BATCH):
                t = asyncio.ensure_future(self._send(worker, ids[i:i + FINISHED_BATCH]))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)

    async def _send(self, worker, ids):
        for attempt in range(3):
            try:
                ack = await self.client.finished(self.model, worker, ids)
                self.metrics.finished.inc(by=len(ids))
                if ack.get("state") == "unregistered":
                    self.on_unregistered(worker)
                return
            except (TimeoutError, EldrError) as e:
                err = e
                if isinstance(e, EldrError):
                    break
        self.metrics.finished_lost.inc(by=len(ids))
        self.limiter.warning("finished", "eldr did not take %d finished request ids of worker "
                             "%d (%s); its in-flight count stays high until the worker's load "
                             "is scraped or reported", len(ids), worker, err)

    async def close(self):
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.flush()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class Registrar:
    """Registers every decode instance with eldr (endpoint = its base URL, metrics_url = its
    /metrics), retrying until the node takes them, and again when the node shows it forgot them
    (a restarted node: registrations are not persisted, docs/node.md)."""

    def __init__(self, client, config, metrics, limiter):
        self.client, self.config, self.metrics, self.limiter = client, config, metrics, limiter
        self.missing = set(range(len(config.decode)))
        self._wake = asyncio.Event()
        self._task = None
        self.registered_once = asyncio.Event()

    def start(self):
        self._task = asyncio.ensure_future(self._run())

    def reregister(self, workers=None):
        self.missing |= set(range(len(self.config.decode)) if workers is None else workers)
        self._wake.set()

    async def _run(self):
        while True:
            for w in sorted(self.missing):
                base = self.config.decode[w]
                try:
                    await self.client.register(self.config.model, w, base,
                                               capacity=self.config.decode_capacity,
                                               metrics_url=base + "/metrics")
                    self.missing.discard(w)
                    self.metrics.registrations.inc("ok")
                    log.info("registered decode instance %d (%s) with eldr", w, base)
                except (TimeoutError, EldrError) as e:
                    self.metrics.registrations.inc("failed")
                    self.limiter.warning("register", "registering decode instance %d (%s) with "
                                         "eldr failed: %s; retrying every %.1f s", w, base, e,
                                         self.config.eldr_retry_s)
                    break
            if not self.missing:
                self.registered_once.set()
                self._wake.clear()
                await self._wake.wait()
            else:
                try:
                    await asyncio.wait_for(self._wake.wait(), self.config.eldr_retry_s)
                except asyncio.TimeoutError:
                    pass
                self._wake.clear()

    async def close(self):
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


# ---------------------------------------------------------------------------------------------
# The proxy


_PREFILL_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                      "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                      "remote_port": None}

_APIS = {"completions": "/v1/completions", "chat_completions": "/v1/chat/completions"}


class _Request:
    """Per-request state the cleanup needs."""
    __slots__ = ("rid", "outcome", "eldr_worker", "decode", "decided_by", "started",
                 "decode_retried", "timing")

    def __init__(self, rid):
        self.rid = rid
        self.outcome = "ok"
        self.started = False     # a streamed answer's headers are sent
        self.eldr_worker = None  # the worker eldr counted the request on (gets the finished)
        self.decode = None       # the Upstream serving the decode
        self.decided_by = ""
        self.decode_retried = False  # sent to another decode instance after a refused connect
        self.timing = []  # (stage, seconds) so far, for the Server-Timing header


class Proxy:
    def __init__(self, config):
        self.config = config
        self.limiter = LogLimiter()
        self.prefill = Pool("prefill", config.prefill, config.retry_down_s, self.limiter)
        self.decode = Pool("decode", config.decode, config.retry_down_s, self.limiter)
        self.in_flight = 0
        self.metrics = ProxyMetrics(
            lambda: self.in_flight,
            lambda: {**self.prefill.health_values(), **self.decode.health_values()},
            lambda: 0 if config.counts.native is None else 1,
            lambda: self.client)
        self.client = None
        self.router = None
        self.workers = None
        self.finished = None
        self.registrar = None
        self._route_timeouts = 0       # consecutive route timeouts
        self._eldr_down_until = 0.0    # skip eldr until then (monotonic)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self):
        c = self.config
        keys = dict(server_public_key=c.curve_server_key, secret_key=c.curve_secret_key)
        self.router = AsyncRouteClient(c.eldr, timeout_ms=c.eldr_timeout_ms, **keys)
        self.workers = AsyncWorkerClient(c.eldr_worker, timeout_ms=c.worker_timeout_ms, **keys)
        # Not aiohttp's client: a lean one spends under a third of its CPU per request
        # (eldr_proxy_upstream's docstring).
        self.client = Client(c.connect_timeout_s, c.upstream_timeout_s)
        self.prefill.client = self.decode.client = self.client
        self.registrar = Registrar(self.workers, c, self.metrics, self.limiter)
        self.finished = FinishedReporter(self.workers, c.model, c.finished_flush_s, self.metrics,
                                         self.limiter, lambda w: self.registrar.reregister([w]))
        self.registrar.start()

    async def close(self):
        if self.finished is not None:
            await self.finished.close()
        if self.registrar is not None:
            await self.registrar.close()
        for pool in (self.prefill, self.decode):
            for u in pool.members:
                if u.probe is not None:
                    u.probe.cancel()
        if self.client is not None:
            self.client.close()
        for c in (self.router, self.workers):
            if c is not None:
                await c.close()

    def app(self):
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/v1/completions", lambda r: self.generate(r, "completions"))
        app.router.add_post("/v1/chat/completions",
                            lambda r: self.generate(r, "chat_completions"))
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        return app

    def metrics_app(self):
        """--metrics-listen's: this process's /metrics and /health only."""
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        return app

    # -- small endpoints ------------------------------------------------------------------------

    async def health(self, request):
        p, d = len(self.prefill.healthy()), len(self.decode.healthy())
        body = {"status": "ok" if p and d else "unavailable", "prefill_healthy": p,
                "decode_healthy": d,
                "eldr": "down" if time.monotonic() < self._eldr_down_until else "up",
                "in_flight": self.in_flight,
                # Which process answered: several share a port with --reuse-port.
                "pid": os.getpid()}
        return web.json_response(body, status=200 if p and d else 503)

    async def prometheus(self, request):
        return web.Response(text=self.metrics.render(),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def models(self, request):
        """The model list of the first instance that answers (prefill, then decode)."""
        try:
            headers = _forward_headers(request)
        except ValueError as e:
            return error_body(400, str(e), "BadRequestError")
        for up in self.prefill.healthy() + self.decode.healthy():
            try:
                r = await self.client.request(up.origin, "GET", "/v1/models", headers=headers)
                try:
                    body = await r.read(MAX_UPSTREAM_BODY)
                finally:
                    r.close()
                return web.Response(body=body, status=r.status,
                                    headers={"Content-Type": _ctype(r, "application/json")})
            except UpstreamError as e:
                up_pool = self.prefill if up.role == "prefill" else self.decode
                up_pool.mark_down(up, "GET /v1/models: %s" % _what(e))
        return error_body(502, "no vLLM instance answered /v1/models", "BadGatewayError")

    # -- the request path -----------------------------------------------------------------------

    async def generate(self, request, api):
        if self.in_flight >= self.config.max_concurrent:
            self.metrics.requests.inc(api, "rejected")
            return error_body(503, "eldr-proxy serves %d requests at once (--max-concurrent); "
                              "retry later" % self.config.max_concurrent, "ServiceUnavailable")
        self.in_flight += 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        st = _Request("eldrp-" + uuid.uuid4().hex)
        try:
            return await self._serve(request, api, st)
        except asyncio.CancelledError:  # aiohttp cancels the handler of a client that left
            st.outcome = "disconnected"
            raise
        except Exception as e:  # a bug: loud, counted, and the client still gets an answer
            st.outcome = "internal_error"
            self.limiter.warning("internal", "request %s failed inside eldr-proxy: %s",
                                 st.rid, _what(e), exc_info=True)
            if st.started:
                raise
            return error_body(500, "eldr-proxy internal error (logged): %s" % _what(e),
                              "InternalServerError")
        finally:
            self.in_flight -= 1
            if st.decode is not None:
                st.decode.in_flight -= 1
            if st.eldr_worker is not None:
                self.finished.add(st.eldr_worker, st.rid)
            self.metrics.requests.inc(api, st.outcome)
            self.metrics.latency.observe(loop.time() - t0, "total")

    async def _serve(self, request, api, st):
        loop = asyncio.get_running_loop()
        try:
            body = json.loads(await request.read())
        except web.HTTPRequestEntityTooLarge:
            st.outcome = "client_error"
            return error_body(413, "request body over %d bytes (--max-body-bytes)"
                              % self.config.max_body_bytes, "BadRequestError")
        except ValueError as e:
            st.outcome = "client_error"
            return error_body(400, "the body is not JSON: %s" % e, "BadRequestError")
        if not isinstance(body, dict):
            st.outcome = "client_error"
            return error_body(400, "the body must be a JSON object", "BadRequestError")
        prompt = body.get("prompt")
        if (api == "completions" and isinstance(prompt, list) and prompt
                and not isinstance(prompt[0], int)):
            if len(prompt) != 1:
                st.outcome = "client_error"
                return error_body(400, "eldr-proxy serves one prompt per request (the P/D "
                                  "handshake carries one kv_transfer_params)", "BadRequestError")
        stream = body.get("stream") is True
        try:
            headers = _forward_headers(request)
        except ValueError as e:
            st.outcome = "client_error"
            return error_body(400, str(e), "BadRequestError")
        headers.append(("X-Request-Id", st.rid))
        path = _APIS[api]

        # 1. Prefill.
        pre = self.prefill.next_round_robin()
        if pre is None:
            st.outcome = "prefill_error"
            return error_body(502, "no prefill instance is reachable (all marked down; "
                              "probing their /health)", "BadGatewayError")
        t = loop.time()
        pre_body = dict(body)
        pre_body["kv_transfer_params"] = dict(_PREFILL_KV_PARAMS)
        pre_body["stream"] = False
        pre_body["max_tokens"] = 1
        if "max_completion_tokens" in pre_body:
            pre_body["max_completion_tokens"] = 1
        for k in ("stream_options", "min_tokens", "min_completion_tokens",
                  "routed_experts_prompt_start"):
            pre_body.pop(k, None)
        if self.config.hasher.source != "request":
            pre_body["return_token_ids"] = True
        pre.in_flight += 1
        try:
            r = await self.client.request(pre.origin, "POST", path, _dumps(pre_body), headers)
            try:
                raw = await r.read(MAX_UPSTREAM_BODY)
            finally:
                r.close()
            status = r.status
            ctype = _ctype(r, "application/json")
        except UpstreamError as e:
            self.metrics.prefill_failures.inc(pre.index, e.reason)
            if not isinstance(e, BodyTooLarge):  # it answers: not down
                self.prefill.mark_down(pre, _what(e))
            st.outcome = "prefill_error"
            return error_body(502, "prefill instance %d (%s) failed: %s"
                              % (pre.index, pre.base, _what(e)), "BadGatewayError")
        finally:
            pre.in_flight -= 1
        self._stage(st, "prefill", loop.time() - t)
        if status != 200:
            if 400 <= status < 500:  # the client's request: vLLM's answer is the answer
                st.outcome = "client_error"
                return web.Response(body=raw, status=status, headers={"Content-Type": ctype})
            self.metrics.prefill_failures.inc(pre.index, "status")
            st.outcome = "prefill_error"
            self.limiter.warning("prefill_status:%d" % pre.index, "prefill instance %d (%s) "
                                 "answered HTTP %d", pre.index, pre.base, status)
            return error_body(502, "prefill instance %d (%s) answered HTTP %d: %s"
                              % (pre.index, pre.base, status, raw[:512].decode("utf-8",
                                                                              "replace")),
                              "BadGatewayError")
        try:
            pre_resp = load_answer(raw)
            choice = pre_resp["choices"][0]
            if not isinstance(pre_resp, dict) or not isinstance(choice, dict):
                raise TypeError("not an object")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            self.metrics.prefill_failures.inc(pre.index, "bad_response")
            st.outcome = "prefill_error"
            return error_body(502, "prefill instance %d (%s) sent an unreadable response: %s"
                              % (pre.index, pre.base, e), "BadGatewayError")
        kv_params = pre_resp.get("kv_transfer_params")
        if not isinstance(kv_params, dict):
            kv_params = None
            self.metrics.missing_kv_params.inc()
            self.limiter.warning("kv_params", "prefill instance %d (%s) returned no "
                                 "kv_transfer_params: the decode instance will recompute the "
                                 "prompt (is vLLM started with a KV connector, e.g. "
                                 "NixlConnector?)", pre.index, pre.base)

        # 2. Routed experts -> block hashes and counts.
        t = loop.time()
        blocks, counts, cached_blocks = self._blocks_and_counts(body, pre_resp, choice, st.rid)
        self._stage(st, "conversion", loop.time() - t)

        # 3. eldr decides.
        t = loop.time()
        await self._route(st, blocks, counts, cached_blocks)
        self._stage(st, "route", loop.time() - t)
        if st.decode is None:
            st.outcome = "decode_error"
            return error_body(502, "no decode instance is reachable (all marked down)",
                              "BadGatewayError")
        st.decode.in_flight += 1
        self.metrics.routed.inc(st.decode.index, st.decided_by)

        # 4. Decode, relayed.
        dec_body = dict(body)
        if kv_params is not None:
            dec_body["kv_transfer_params"] = kv_params
        out_headers = {"X-Request-Id": st.rid, "X-Eldr-Decode": str(st.decode.index),
                       "X-Eldr-Decided-By": st.decided_by}
        return await self._decode(request, st, path, dec_body, headers, stream, out_headers)

    def _stage(self, st, stage, seconds):
        """One stage's time: into the stage histogram and the answer's Server-Timing header."""
        self.metrics.latency.observe(seconds, stage)
        st.timing.append((stage, seconds))

    def _blocks_and_counts(self, body, pre_resp, choice, rid):
        """(block hashes as uint64 keys (a numpy array), counts message or None, cached blocks
        or None). Never raises: a problem costs the request its counts (eldr then routes by
        cached blocks or load), counted and logged."""
        cfg = self.config
        token_ids = choice.get("prompt_token_ids")
        if token_ids is None:
            token_ids = pre_resp.get("prompt_token_ids")
        if not (isinstance(token_ids, list) and set(map(type, token_ids)) <= {int}):
            token_ids = None
        salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
        try:
            ids = cfg.counts.decode(choice.get("routed_experts"))
            ids = cfg.counts.prompt_ids(ids, len(token_ids) if token_ids is not None else None)
            n_tokens = ids.shape[0]
        except CountsError as e:
            ids = None
            n_tokens = len(token_ids) if token_ids is not None else 0
            self._counts_error(e)
        source = cfg.hasher.source if token_ids is not None else "request"
        hasher = cfg.hasher if source == cfg.hasher.source else _REQUEST_HASHER
        # The uint64 keys eldr knows blocks by, made once for the counts and the route request.
        keys = block_keys(hasher.hashes(token_ids, cfg.block_size, n_tokens=n_tokens,
                                        cache_salt=salt, request_id=rid)[:MAX_ROUTE_BLOCKS])
        self.metrics.block_hashes.inc(source)
        counts = None
        if ids is not None and len(keys):
            try:
                counts = cfg.counts.message(ids, keys)
            except CountsError as e:
                self._counts_error(e)
        cached_blocks = None if counts is None else self._cached_blocks(pre_resp, len(keys))
        return keys, counts, cached_blocks

    def _cached_blocks(self, pre_resp, n_blocks):
        """How many leading blocks the prefill served from its prefix cache: vLLM's
        usage.prompt_tokens_details.cached_tokens (sent with --enable-prompt-tokens-details when
        nonzero; vLLM caches whole blocks) over the block size. The counts carry those blocks too
        (vLLM returns the routed experts of every prompt token), and eldr then sums them without
        storing them again. None when vLLM does not say: eldr stores every carried block."""
        usage = pre_resp.get("usage")
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(cached, int) or isinstance(cached, bool) or cached < 0:
            return None
        return min(cached // self.config.block_size, n_blocks)

    def _counts_error(self, e):
        self.metrics.counts_errors.inc(e.reason)
        self.limiter.warning("counts:" + e.reason, "request routed without counts: %s", e)

    async def _route(self, st, blocks, counts, cached_blocks=None):
        """Sets st.decode (None: nothing reachable), st.eldr_worker, st.decided_by."""
        now = time.monotonic()
        reason = None
        reply = None
        if now < self._eldr_down_until:
            reason = "eldr_down"
        else:
            task = asyncio.ensure_future(self.router.route(st.rid, self.config.model, blocks,
                                                           counts=counts,
                                                           cached_blocks=cached_blocks))
            try:
                reply = await asyncio.shield(task)
                self._route_timeouts = 0
            except asyncio.CancelledError:
                # The client left while eldr decided: eldr may still count the request on a
                # worker, so its decision, when it comes, is reported finished.
                task.add_done_callback(self._finish_orphan_route(st.rid))
                raise
            except TimeoutError:
                reason = "timeout"
                self._route_timeouts += 1
                if self._route_timeouts >= 3:
                    self._eldr_down_until = time.monotonic() + self.config.eldr_retry_s
                    self.limiter.warning("eldr_down", "eldr did not answer %d route calls in a "
                                         "row (%s): deciding without it for %.1f s",
                                         self._route_timeouts, ", ".join(self.config.eldr),
                                         self.config.eldr_retry_s)
            except EldrError as e:
                reason = e.name
                self._route_timeouts = 0
                if e.name == "no_eligible_worker":
                    self.registrar.reregister()  # a restarted node forgot the registrations
        if reply is not None:
            st.eldr_worker = reply["worker"]
            if reply["fallback"]:
                self.metrics.route_fallbacks.inc(reply["fallback"])
                self.limiter.warning("fallback:" + reply["fallback"], "eldr decided by load "
                                     "only: %s", reply["fallback"])
            for w in reply["warnings"]:
                self.metrics.route_warnings.inc(str(w).split(":", 1)[0][:64])
            up = self.decode.by_base.get(reply.get("endpoint", "").rstrip("/"))
            if up is None and 0 <= st.eldr_worker < len(self.decode.members):
                up = self.decode.members[st.eldr_worker]
            if up is None:
                reason = "unknown_worker"
                self.limiter.warning("unknown_worker", "eldr chose worker %r (%r), which is no "
                                     "--decode of this proxy", st.eldr_worker,
                                     reply.get("endpoint"))
            elif not up.healthy:
                reason = "eldr_pick_down"
            else:
                st.decode = up
                st.decided_by = "eldr"
                return
        else:
            if reason != "eldr_down":  # skipped calls are not errors; own_picks counts them
                self.metrics.eldr_errors.inc(reason)
            self.limiter.warning("route:" + reason, "eldr gave no decision (%s): the proxy "
                                 "picks the least-loaded decode instance", reason)
        self.metrics.own_picks.inc(reason)
        st.decode = self.decode.least_loaded()
        st.decided_by = "proxy:" + reason

    def _finish_orphan_route(self, rid):
        def done(task):
            if task.cancelled() or task.exception() is not None:
                return
            self.finished.add(task.result()["worker"], rid)
        return done

    async def _decode(self, request, st, path, dec_body, headers, stream, out_headers):
        loop = asyncio.get_running_loop()
        up = st.decode
        t = loop.time()
        resp = None
        while resp is None:
            try:
                resp = await self.client.request(up.origin, "POST", path, _dumps(dec_body),
                                                 headers)
            except UpstreamError as e:
                self.metrics.decode_failures.inc(up.index, e.reason)
                self.decode.mark_down(up, _what(e))
                # Refused before any byte was sent: the instance never saw the request, so it is
                # sent once to the least-loaded healthy one instead (a decode instance that died
                # since eldr's last scrape, or one the proxy picked itself while eldr was down).
                # eldr still hears `finished` for the worker it chose, which it counted.
                alt = self.decode.least_loaded()
                if not isinstance(e, ConnectFailed) or st.decode_retried or alt is None:
                    st.outcome = "decode_error"
                    return error_body(502, "decode instance %d (%s) failed: %s"
                                      % (up.index, up.base, _what(e)), "BadGatewayError")
                st.decode_retried = True
                up.in_flight -= 1
                alt.in_flight += 1
                up = st.decode = alt
                st.decided_by = "proxy:decode_down"
                self.metrics.own_picks.inc("decode_down")
                self.metrics.routed.inc(alt.index, st.decided_by)
                out_headers["X-Eldr-Decode"] = str(alt.index)
                out_headers["X-Eldr-Decided-By"] = st.decided_by
        try:
            self._stage(st, "first_byte", loop.time() - t)
            out_headers["Server-Timing"] = _server_timing(st.timing)
            if not stream or resp.status != 200:
                try:
                    raw = await resp.read(MAX_UPSTREAM_BODY)
                except UpstreamError as e:
                    self.metrics.decode_failures.inc(up.index, e.reason)
                    st.outcome = "decode_error"
                    return error_body(502, "decode instance %d (%s) failed while answering: %s"
                                      % (up.index, up.base, _what(e)), "BadGatewayError")
                if resp.status >= 500:
                    self.metrics.decode_failures.inc(up.index, "status")
                    st.outcome = "decode_error"
                elif resp.status >= 400:
                    st.outcome = "client_error"
                out_headers["Content-Type"] = _ctype(resp, "application/json")
                return web.Response(body=raw, status=resp.status, headers=out_headers)
            out_headers["Content-Type"] = _ctype(resp, "text/event-stream")
            out = web.StreamResponse(status=200, headers=out_headers)
            out.headers["Cache-Control"] = "no-cache"
            await out.prepare(request)
            st.started = True
            try:
                async for chunk in resp.chunks():
                    try:
                        await out.write(chunk)
                    except ConnectionResetError:  # the client went away
                        st.outcome = "disconnected"
                        return out
            except UpstreamError as e:
                # Headers are gone: tell the client in-band, as vLLM reports stream errors.
                self.metrics.decode_failures.inc(up.index, "stream")
                st.outcome = "decode_error"
                self.limiter.warning("decode_stream", "decode instance %d (%s) broke off a "
                                     "stream: %s", up.index, up.base, _what(e))
                err = {"error": {"message": "decode instance failed mid-stream: %s" % _what(e),
                                 "type": "BadGatewayError", "param": None, "code": 502}}
                await out.write(b"data: " + _dumps(err) + b"\n\ndata: [DONE]\n\n")
            await out.write_eof()
            return out
        finally:
            # On every path, also a client that went away: closing an unread response drops the
            # connection, which makes vLLM abort the request.
            resp.close()


_REQUEST_HASHER = block_hashes.BlockHasher("request")


def _server_timing(timing):
    """The W3C Server-Timing header of the stages before the answer's first byte, in ms: what a
    client (or the benchmark) reads to see where one request's time went, e.g.
    `prefill;dur=2.310, conversion;dur=0.081, route;dur=0.402, first_byte;dur=1.200`."""
    return ", ".join("%s;dur=%.3f" % (stage, 1e3 * s) for stage, s in timing)


def _dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def _ctype(resp, default):
    return resp.headers.get("content-type") or default


def _forward_headers(request):
    """The headers a client's request passes on to the instances, as (name, value) pairs.
    ValueError when one cannot be sent (eldr_proxy_upstream.header_bytes): the client's fault."""
    h = [("Content-Type", "application/json")]
    auth = request.headers.get("Authorization")
    if auth is not None:
        try:
            header_bytes(auth)
        except ValueError as e:
            raise ValueError("the Authorization header cannot be passed on: %s" % e) from None
        h.append(("Authorization", auth))
    return h


def _what(e):
    return "%s: %s" % (type(e).__name__, e) if str(e) else type(e).__name__


# ---------------------------------------------------------------------------------------------
# main


class _ListenError(Exception):
    def __init__(self, flag, address, error):
        super().__init__("%s %s:%d: %s" % ((flag,) + address + (error,)))


def _url(host, port):
    return "http://%s:%d" % (host if ":" not in host else "[%s]" % host, port)


async def _listen(app, flag, address, **site_args):
    """A started AppRunner serving app at address; raises _ListenError naming the flag."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, address[0], address[1], **site_args).start()
    except OSError as e:  # e.g. the address is taken
        await runner.cleanup()
        raise _ListenError(flag, address, e) from None
    return runner


async def serve(config, stop):
    proxy = Proxy(config)
    await proxy.start()
    runners = []
    try:
        await _serve_until(proxy, config, stop, runners)
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await proxy.close()


async def _serve_until(proxy, config, stop, runners):
    host = config.listen[0]
    runners.append(await _listen(proxy.app(), "--listen", config.listen, backlog=1024,
                                 reuse_port=config.reuse_port or None))
    ready = {"listen": _url(host, runners[0].addresses[0][1]),
             "pid": os.getpid(), "event_loop": type(asyncio.get_running_loop()).__module__,
             "model": config.model, "block_hash": config.hasher.source,
             "prefill": config.prefill, "decode": config.decode, "eldr": config.eldr,
             "counts": "numpy" if config.counts.native is None else "native"}
    if config.metrics_listen is not None:
        runners.append(await _listen(proxy.metrics_app(), "--metrics-listen",
                                     config.metrics_listen))
        ready["metrics_listen"] = _url(config.metrics_listen[0], runners[1].addresses[0][1])
    line = json.dumps(ready)
    if config.ready_file:
        tmp = config.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(line + "\n")
        os.replace(tmp, config.ready_file)
    print("eldr-proxy ready " + line, flush=True)
    if config.counts.native is None:
        log.warning("%s", config.counts_note)
    else:
        log.info("%s", config.counts_note)
    if config.hasher.source != "vllm":
        log.warning("block hashes are %s-side, not vLLM's: eldr's signature cache keeps their "
                    "counts only as orphans (signature_cache.orphan_counts_grace_ms); give "
                    "--hash-seed (vLLM's PYTHONHASHSEED, with --prefix-caching-hash-algo "
                    "sha256_cbor) for vLLM's hashes", config.hasher.source)
    await stop.wait()


def main(argv=None):
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        sys.stderr.write("eldr-proxy: %s\n(eldr-proxy --help lists the flags)\n" % e)
        return EXIT_USAGE
    logging.basicConfig(level=getattr(logging, config.log_level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    keep_large_allocations()
    if config.event_loop == "uvloop":
        import uvloop  # the same asyncio API, a faster loop and transports (libuv)
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        loop.run_until_complete(serve(config, stop))
    except _ListenError as e:  # e.g. the address is taken
        sys.stderr.write("eldr-proxy: %s\n" % e)
        return 1
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
