#!/usr/bin/python3
"""eldr_client_aio: the asyncio twin of eldr_client.py, for programs that serve many requests at
once from one event loop (eldr-proxy, eldr-record).

Same wire protocol (docs/protocol.md sections 3 to 5), same codec (the functions of eldr_client
are imported, not copied), same failover and id semantics as the synchronous clients:

  - endpoints: one endpoint (str) or a list, the same protocol on several nodes; one DEALER per
    endpoint, all connected at once, with LINGER 0 and IMMEDIATE (nothing is queued for an
    endpoint whose connection, and CURVE handshake, is not complete).
  - A call goes to the current endpoint. When no answer comes within timeout_ms it is resent,
    with the same id, to the next endpoint (round robin, max_attempts attempts in all, default
    one per endpoint); answers from every endpoint tried before are still accepted. The first
    answer carrying the id wins, and its endpoint becomes the current one. After the last
    attempt the call raises TimeoutError; a late answer to it is dropped (.late_replies).
  - Pipelining is the normal case here: any number of calls may be outstanding on one client
    (so on one socket per endpoint); one reader task per socket matches each reply to its call
    by "id". Two calls outstanding with the same id at once are refused (ValueError): their
    replies could not be told apart.

  - The sockets are plain pyzmq sockets driven by the event loop's reader on each socket's
    ZMQ_FD (not zmq.asyncio, whose futures and flag enums took eldr-proxy about a third of a
    millisecond per route call in a cProfile, which overstates Python's calls; with the proxy's
    own HTTP client the change cut its CPU per request by a third: BENCHMARKS.md, "eldr-proxy
    without aiohttp's client and zmq.asyncio"). The descriptor is edge-triggered: every wake-up, and every send,
    drains the socket until ZMQ_EVENTS shows nothing more to do.

Requirements: Python 3.11 with Debian's python3-zmq and python3-msgpack; run with
/usr/bin/python3. Put cluster/python on PYTHONPATH (this module imports eldr_client).

Classes (each also takes max_attempts=None, server_public_key=None, public_key=None,
secret_key=None, context=None (a zmq.Context, or a zmq.asyncio.Context, whose underlying
context is used); has .failovers, .last_endpoint, .endpoint,
.late_replies, .bad_replies; must be used from one event loop; close with `await c.close()` or
`async with`):

AsyncRouteClient(endpoints, timeout_ms=2000)
    await route(request_id, model, blocks, counts=None, label=None, explain=False,
                cached_blocks=None) -> dict
        the route_reply, with `fallback` and `warnings` always present (counted in
        .fallback_replies / .warned_replies and logged per code at most once per 10 s, as by
        eldr_client.RouteClient). Raises EldrError on an error_reply, TimeoutError.

AsyncWorkerClient(endpoints, timeout_ms=2000)
    await register(model, worker, endpoint, capacity=0, metrics_url=None)
        metrics_url: the worker's Prometheus /metrics URL (http://), for a node that scrapes
        vLLM's load; sent as the field "metrics_url", left out when None.
    await report_load(model, worker, in_flight, running=0, waiting=0, kv_usage=0.0, seq=None)
    await finished(model, worker, request_ids)
    await drain(model, worker, drain=True)
    await register_publisher(model, endpoint, replay_endpoint="")
        each returns the worker_ack dict; raises EldrError/TimeoutError.

AsyncAdminClient(endpoints, timeout_ms=5000)
    await call(command, **args) -> result; raises EldrError when the node answers ok = false.

Example:

    router = AsyncRouteClient(["tcp://eldr-1:5700", "tcp://eldr-2:5700"], timeout_ms=200)
    replies = await asyncio.gather(*(router.route(rid, "m", hashes[rid]) for rid in ids))
    await router.close()
"""
import asyncio
import collections
import itertools
import logging
import os
import time

import zmq
import zmq.asyncio

from eldr_client import (PROTOCOL_VERSION, DealerClientBase, EldrError, LoadReports,
                         ProtocolError, RouteReplySurfacing, admin_request, admin_result,
                         connect_dealers, decode, error_from, finished_message,
                         publisher_register_message, route_request, worker_ack,
                         worker_drain_message, worker_register_message, worker_request)

__all__ = ["AsyncRouteClient", "AsyncWorkerClient", "AsyncAdminClient", "EldrError",
           "ProtocolError", "PROTOCOL_VERSION"]

_log = logging.getLogger("eldr_client")


_TIMED_OUT = object()  # an attempt's future when its time ran out before a reply

# Plain ints: pyzmq's flag enums cost an enum operation per test in the pump below.
_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
_NOBLOCK = int(zmq.NOBLOCK)


def _time_out(fut):
    if not fut.done():
        fut.set_result(_TIMED_OUT)


def _sync_context(context):
    """A plain zmq.Context for a caller's `context` (None stays None: the client makes and owns
    one). A zmq.asyncio.Context is shadowed: the same libzmq context, sockets without asyncio's
    layer."""
    if isinstance(context, zmq.asyncio.Context):
        return zmq.Context.shadow(context.underlying)
    return context


class _Dealer:
    """One DEALER socket in the event loop: frames that arrive go to on_frames(frames); send()
    queues what ZeroMQ cannot take yet (IMMEDIATE: no connection) and sends it when the socket
    becomes writable. ZMQ_FD only says that the socket's state may have changed, once: after
    every wake-up and every send the socket is pumped until ZMQ_EVENTS shows nothing left."""

    def __init__(self, sock, loop, on_frames):
        self.sock = sock
        self.loop = loop
        self.on_frames = on_frames
        self.waiting = collections.deque()  # (payload, future): sends ZeroMQ did not take yet
        self._pump_scheduled = False
        self._fd = sock.getsockopt(zmq.FD)
        loop.add_reader(self._fd, self.pump)

    def send(self, payload):
        """None when ZeroMQ took the payload; else a future resolved when it does (cancel it to
        withdraw the payload)."""
        if not self.waiting:
            try:
                self.sock.send(payload, _NOBLOCK)
                self._schedule_pump()
                return None
            except zmq.Again:
                pass
        fut = self.loop.create_future()
        self.waiting.append((payload, fut))
        self._schedule_pump()
        return fut

    def _schedule_pump(self):
        # A send may consume the descriptor's edge while a reply is readable: look once more,
        # after this loop turn's other sends (one pump for all of them).
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.loop.call_soon(self.pump)

    def pump(self):
        self._pump_scheduled = False
        sock = self.sock
        if sock.closed:
            return
        while True:
            events = sock.getsockopt(_EVENTS)
            progressed = False
            if events & _POLLIN:
                try:
                    frames = sock.recv_multipart(_NOBLOCK)
                except zmq.Again:
                    frames = None
                if frames is not None:
                    progressed = True
                    self.on_frames(frames)
            while self.waiting and self.waiting[0][1].done():  # withdrawn: timed out, cancelled
                self.waiting.popleft()
            if self.waiting and events & _POLLOUT:
                payload, fut = self.waiting[0]
                try:
                    sock.send(payload, _NOBLOCK)
                    self.waiting.popleft()
                    fut.set_result(None)
                    progressed = True
                except zmq.Again:
                    pass
            if not progressed:
                return

    def close(self):
        if not self.sock.closed:
            self.loop.remove_reader(self._fd)
        for _, fut in self.waiting:
            if not fut.done():
                fut.cancel()
        self.waiting.clear()


class _AsyncClient(DealerClientBase):
    """DEALERs to one or more node endpoints, a reader task per socket, and calls matched to
    replies by id, with timeouts and failover (module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, endpoints, timeout_ms, reply_types, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, reply_types, _sync_context(context),
                         max_attempts, server_public_key, public_key, secret_key, zmq.Context)
        self.late_replies = 0    # answers that came after their call had given up
        self.bad_replies = 0     # replies that did not decode (logged, dropped)
        self._dealers = []  # one _Dealer per socket, made in the running loop at the first call
        # id -> (future of (endpoint index, reply), endpoint index of the latest attempt)
        self._pending = {}
        self._closed = False
        self._bad_logged_at = None
        try:
            connect_dealers(self._ctx, self.endpoints, self._keys, self._socks)
        except Exception:
            self._close_sockets()
            raise
        self._prefix = "aio-%d-%x-" % (os.getpid(), id(self))

    @property
    def in_flight(self):
        """Calls waiting for their answer."""
        return len(self._pending)

    def next_id(self):
        return self._prefix + str(next(_AsyncClient._ids))

    def _start_readers(self):
        # Made on the first call, inside the running loop (the constructor may run outside).
        if not self._dealers and not self._closed:
            loop = asyncio.get_running_loop()
            self._dealers = [_Dealer(s, loop, lambda frames, i=i: self._on_reply(i, frames))
                             for i, s in enumerate(self._socks)]

    def _on_reply(self, i, frames):
        try:
            # The last frame is the message (a node adding an empty delimiter is understood).
            reply = decode(frames[-1], self._reply_types)
        except ProtocolError as e:
            self.bad_replies += 1
            self._log_bad("%s: %s" % (self.endpoints[i], e))
            return
        rid = reply.get("id")
        entry = self._pending.get(rid) if rid else None
        if entry is None and not rid:
            # A reply without id answers a request the node could not read; it can only be
            # matched when exactly one call waits on this endpoint.
            waiting = [e for e in self._pending.values() if e[1] == i]
            entry = waiting[0] if len(waiting) == 1 else None
            if entry is None:
                self.bad_replies += 1
                self._log_bad("%s: a reply without id (%s) matches no single call"
                              % (self.endpoints[i], reply.get("message", "")))
                return
        if entry is None or entry[0].done():
            self.late_replies += 1
            return
        entry[0].set_result((i, reply))

    def _log_bad(self, what):
        now = time.monotonic()
        if self._bad_logged_at is None or now - self._bad_logged_at >= 10.0:
            self._bad_logged_at = now
            _log.warning("eldr node reply dropped (%d so far): %s", self.bad_replies, what)

    async def _send_on(self, i, payload, timeout_s):
        sent = self._dealers[i].send(payload)
        if sent is None:  # queued by ZeroMQ at once: no timer, no task
            return
        # With IMMEDIATE, a DEALER whose connection is not up takes nothing; bound the wait (a
        # timed-out payload is withdrawn: wait_for cancels its future).
        await asyncio.wait_for(sent, timeout_s)

    async def _call(self, request_id, payload, resend=None):
        """Sends `payload` (which carries `request_id`) and waits for its reply, failing over on
        a timeout; returns the reply dict. resend: makes the payload of the attempts after the
        first (a route request marked retry), called at the first failover only; else payload
        again."""
        if self._closed:
            raise RuntimeError("client is closed")
        if request_id in self._pending:
            raise ValueError("request id %r is already in flight on this client" % request_id)
        self._start_readers()
        loop = asyncio.get_running_loop()
        n = len(self._socks)
        start = self._current
        timeout_s = self.timeout_ms / 1000.0
        fut = None
        try:
            for attempt in range(self.max_attempts):
                i = (start + attempt) % n
                if attempt:
                    self.failovers += 1
                # A future per attempt, which the attempt's timer resolves with _TIMED_OUT: the
                # reply wakes this call directly (asyncio.wait cost a waiter future, callbacks
                # and a loop turn more per call). The reader resolves whichever future is
                # current, so answers from the endpoints tried before still count.
                fut = loop.create_future()
                self._pending[request_id] = (fut, i)
                deadline = loop.time() + timeout_s
                try:
                    if attempt and callable(resend):
                        resend = resend()  # made once, at the first failover
                    await self._send_on(i, resend if attempt and resend is not None else payload,
                                        timeout_s)
                except asyncio.TimeoutError:
                    pass  # not connected: still wait out the attempt for earlier endpoints
                if not fut.done() and deadline > loop.time():
                    timer = loop.call_at(deadline, _time_out, fut)
                    try:
                        await fut
                    finally:
                        timer.cancel()
                if fut.done() and not fut.cancelled() and fut.result() is not _TIMED_OUT:
                    j, reply = fut.result()
                    self._current = j
                    self.last_endpoint = self.endpoints[j]
                    return reply
            self._current = (start + self.max_attempts) % n
            raise self._no_reply()
        finally:
            self._pending.pop(request_id, None)
            if fut is not None and not fut.done():
                fut.cancel()

    def _close_sockets(self):
        for s in self._socks:
            s.close(0)
        self._socks = []
        if self._own_context:
            self._ctx.term()
            self._own_context = False

    async def close(self):
        """Stops the readers and closes the sockets; calls in flight get CancelledError."""
        if self._closed:
            return
        self._closed = True
        for d in self._dealers:
            d.close()
        self._dealers = []
        for fut, _ in list(self._pending.values()):
            if not fut.done():
                fut.cancel()
        self._close_sockets()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class AsyncRouteClient(RouteReplySurfacing, _AsyncClient):
    """A prefill worker's (or a proxy's) connection to the node's route endpoint."""

    def __init__(self, endpoints, timeout_ms=2000, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, ("route_reply", "error_reply"), context,
                         max_attempts, server_public_key, public_key, secret_key)
        self._init_surfacing()

    async def route(self, request_id, model, blocks, counts=None, label=None, explain=False,
                    cached_blocks=None):
        """Where to decode this request: the route_reply dict. Raises EldrError, TimeoutError.
        A failover's resend is marked retry (docs/cluster.md, "Retries: ask, don't broadcast")."""
        payload = route_request(request_id, model, blocks, counts, label, explain, cached_blocks)
        def resend():  # encoded only if a failover happens: counts can be megabytes
            return route_request(request_id, model, blocks, counts, label, explain,
                                 cached_blocks, retry=True)
        reply = await self._call(str(request_id), payload, resend)
        if reply["type"] == "error_reply":
            raise error_from(reply)
        return self._surface(reply)


class AsyncWorkerClient(LoadReports, _AsyncClient):
    """A decode worker's (or its proxy's, or a publisher's) connection to the worker endpoint."""

    def __init__(self, endpoints, timeout_ms=2000, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, ("worker_ack", "error_reply"), context,
                         max_attempts, server_public_key, public_key, secret_key)
        self._seq = 0

    async def _worker_call(self, message):
        rid = self.next_id()
        return worker_ack(await self._call(rid, worker_request(rid, message)))

    async def register(self, model, worker, endpoint, capacity=0, metrics_url=None):
        """Announces decode worker `worker` (its index in the model's pool), the endpoint route
        replies name, and (optionally) the metrics URL the node scrapes for its load."""
        return await self._worker_call(
            worker_register_message(model, worker, endpoint, capacity, metrics_url))

    async def report_load(self, model, worker, in_flight, running=0, waiting=0, kv_usage=0.0,
                          seq=None):
        """The worker's own load; seq defaults to the wall clock in microseconds (increasing
        across restarts), as in eldr_client.WorkerClient.report_load."""
        return await self._worker_call(self._load_report_message(
            model, worker, in_flight, running, waiting, kv_usage, seq))

    async def finished(self, model, worker, request_ids):
        """Requests the worker completed or aborted (at most 4,096 per message)."""
        return await self._worker_call(finished_message(model, worker, request_ids))

    async def drain(self, model, worker, drain=True):
        """Stop (drain=True) or resume (False) receiving requests; those in flight finish."""
        return await self._worker_call(worker_drain_message(model, worker, drain))

    async def register_publisher(self, model, endpoint, replay_endpoint=""):
        """A vLLM KV-event publisher (PUB endpoint, optional replay ROUTER) for the cache."""
        return await self._worker_call(
            publisher_register_message(model, endpoint, replay_endpoint))


class AsyncAdminClient(_AsyncClient):
    """An operator's connection to the node's admin endpoint (docs/protocol.md section 5)."""

    def __init__(self, endpoints, timeout_ms=5000, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, ("admin_reply", "error_reply"), context,
                         max_attempts, server_public_key, public_key, secret_key)

    async def call(self, command, /, **args):
        """Runs one command; its result. Raises EldrError when the node refuses it."""
        rid = self.next_id()
        return admin_result(await self._call(rid, admin_request(rid, command, args)))
