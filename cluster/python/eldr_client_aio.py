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

Requirements: Python 3.11 with Debian's python3-zmq (zmq.asyncio) and python3-msgpack; run with
/usr/bin/python3. Put cluster/python on PYTHONPATH (this module imports eldr_client).

Classes (each also takes max_attempts=None, server_public_key=None, public_key=None,
secret_key=None, context=None (a zmq.asyncio.Context); has .failovers, .last_endpoint, .endpoint,
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


def _time_out(fut):
    if not fut.done():
        fut.set_result(_TIMED_OUT)


class _AsyncClient(DealerClientBase):
    """DEALERs to one or more node endpoints, a reader task per socket, and calls matched to
    replies by id, with timeouts and failover (module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, endpoints, timeout_ms, reply_types, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, reply_types, context, max_attempts,
                         server_public_key, public_key, secret_key, zmq.asyncio.Context)
        self.late_replies = 0    # answers that came after their call had given up
        self.bad_replies = 0     # replies that did not decode (logged, dropped)
        self._readers = []
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
        # Started on the first call, inside the running loop (the constructor may run outside).
        if not self._readers and not self._closed:
            self._readers = [asyncio.ensure_future(self._read_loop(i))
                             for i in range(len(self._socks))]

    async def _read_loop(self, i):
        sock = self._socks[i]
        while True:
            frames = await sock.recv_multipart()
            try:
                # The last frame is the message (a node adding an empty delimiter is understood).
                reply = decode(frames[-1], self._reply_types)
            except ProtocolError as e:
                self.bad_replies += 1
                self._log_bad("%s: %s" % (self.endpoints[i], e))
                continue
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
                    continue
            if entry is None or entry[0].done():
                self.late_replies += 1
                continue
            entry[0].set_result((i, reply))

    def _log_bad(self, what):
        now = time.monotonic()
        if self._bad_logged_at is None or now - self._bad_logged_at >= 10.0:
            self._bad_logged_at = now
            _log.warning("eldr node reply dropped (%d so far): %s", self.bad_replies, what)

    async def _send_on(self, i, payload, timeout_s):
        sent = self._socks[i].send(payload)
        if sent.done():
            # zmq.asyncio tries a non-blocking send first: queued, no timer or wait_for task
            # (which cost a loop turn and a timer per route call in eldr-proxy's profile).
            sent.result()
            return
        # With IMMEDIATE, a DEALER whose connection is not up blocks in send; bound that.
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
        for r in self._readers:
            r.cancel()
        if self._readers:
            await asyncio.gather(*self._readers, return_exceptions=True)
        self._readers = []
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
