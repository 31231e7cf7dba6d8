#!/usr/bin/python3
"""The floor of eldr-proxy's design: the same hops per request with none of the proxy's own logic.

A client request arrives on aiohttp's server; the prefill is sent with eldr-proxy's HTTP client
(tools/eldr-proxy/eldr_proxy_upstream.py) and its answer read with the same parser
(eldr_routed_experts.load_answer); one route call goes to eldr-node with the asyncio client
(cluster/python/eldr_client_aio.py), carrying one block and no counts, so the node decides by
load; the decode goes to the worker eldr chose with the prefill's kv_transfer_params, and its
body is the answer. Finished ids are sent to the node every 20 ms. Nothing else: no routed
experts decoded, no block hashes, no counts, no metrics, no checks of the client's body, no
fallback when eldr or an instance fails (the exception leaves the handler: aiohttp's server
answers 500, the bare server does not answer).

What one request costs here is what any proxy written this way (Python, asyncio, aiohttp's
server, two upstream HTTP requests and a ZeroMQ round trip) costs on this machine before it does
any work of its own: bench/eldr_proxy_bench.py --proxy bench/proxy_floor.py runs it in the
throughput case in eldr-proxy's place (BENCHMARKS.md, "The floor of a Python proxy").

It takes eldr-proxy's command line (--listen, --eldr, --eldr-worker, --model, --prefill,
--decode; the other flags are accepted and ignored) and prints the same ready line.
"""
import argparse
import asyncio
import json
import os
import random
import sys

import httptools
from aiohttp import web

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "cluster", "python"))
sys.path.insert(0, os.path.join(_ROOT, "tools", "eldr-proxy"))

from eldr_client_aio import AsyncRouteClient, AsyncWorkerClient  # noqa: E402
from eldr_proxy import _PREFILL_KV_PARAMS  # noqa: E402 -- the prefill's P/D parameters
from eldr_proxy_upstream import Client, Origin  # noqa: E402
from eldr_routed_experts import load_answer  # noqa: E402


class Floor:
    def __init__(self, a):
        self.model = a.model
        self.decode_urls = [u.rstrip("/") for u in a.decode]
        self.prefill = [Origin(u) for u in a.prefill]
        self.decode = [Origin(u) for u in a.decode]
        self.client = Client(connect_timeout_s=5, read_timeout_s=120)
        self.router = AsyncRouteClient(a.eldr, timeout_ms=2000)
        self.worker = AsyncWorkerClient([a.eldr_worker], timeout_ms=5000)
        self.next_prefill = 0
        self.no_eldr = a.floor_no_eldr
        self.done = {}  # worker -> [request id]

    async def start(self):
        for i, u in enumerate(self.decode_urls):
            # Load scraped from the instance's /metrics, as eldr-proxy registers it.
            await self.worker.register(self.model, i, u, metrics_url=u + "/metrics")
        self.flusher = asyncio.ensure_future(self.flush())  # held: the loop keeps weak refs

    async def flush(self):
        while True:
            await asyncio.sleep(0.02)
            done, self.done = self.done, {}
            for w, ids in done.items():
                await self.worker.finished(self.model, w, ids)

    async def completions(self, request):
        return await self.answer(await request.read())

    async def answer(self, raw_body):
        """The client's body -> a web.Response (the decode instance's answer)."""
        body = json.loads(raw_body)
        pre = self.prefill[self.next_prefill % len(self.prefill)]
        self.next_prefill += 1
        pre_body = dict(body, kv_transfer_params=dict(_PREFILL_KV_PARAMS), stream=False,
                        max_tokens=1)
        r = await self.client.request(pre, "POST", "/v1/completions",
                                      json.dumps(pre_body).encode(), ())
        try:
            raw = await r.read(64 << 20)
        finally:
            r.close()
        answer = load_answer(raw)
        rid = "floor-%016x" % random.getrandbits(64)
        if self.no_eldr:
            w = self.next_prefill % len(self.decode)
        else:
            w = (await self.router.route(rid, self.model, [random.getrandbits(63)]))["worker"]
        dec_body = dict(body, kv_transfer_params=answer.get("kv_transfer_params"))
        r = await self.client.request(self.decode[w], "POST", "/v1/completions",
                                      json.dumps(dec_body).encode(), ())
        try:
            out = await r.read(64 << 20)
        finally:
            r.close()
        if not self.no_eldr:  # eldr counted it on w
            self.done.setdefault(w, []).append(rid)
        return web.Response(body=out, status=r.status, content_type="application/json")


class _Bare(asyncio.Protocol):
    """HTTP/1.1 keep-alive requests, one at a time per connection, each a POST whose body goes to
    Floor.answer; no routing by path, no checks (a measurement, not a server)."""

    def __init__(self, floor):
        self.floor = floor
        self.parser = httptools.HttpRequestParser(self)
        self.body = []

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.parser.feed_data(data)

    def on_body(self, b):
        self.body.append(b)

    def on_message_complete(self):
        raw, self.body = b"".join(self.body), []
        asyncio.ensure_future(self.respond(raw))

    async def respond(self, raw):
        # A request without a body (the benchmark's health checks) gets an empty object.
        status, body = (200, b"{}") if not raw else await self._answer(raw)
        self.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body))

    async def _answer(self, raw):
        r = await self.floor.answer(raw)
        return r.status, r.body


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--eldr", action="append", required=True)
    ap.add_argument("--eldr-worker", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefill", action="append", required=True)
    ap.add_argument("--decode", action="append", required=True)
    ap.add_argument("--floor-server", choices=("aiohttp", "httptools"), default="aiohttp",
                    help="the client side: aiohttp's server (as eldr-proxy), or a bare asyncio "
                         "protocol with httptools' parser, to see what aiohttp's server costs")
    ap.add_argument("--floor-no-eldr", action="store_true",
                    help="no route call: decode instances in turn, to see what the call costs")
    a, _ = ap.parse_known_args()
    f = Floor(a)
    await f.start()
    host, port = a.listen.rsplit(":", 1)
    if a.floor_server == "httptools":
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Bare(f), host, int(port), backlog=1024)
        bound = server.sockets[0].getsockname()[1]
        print("eldr-proxy ready " + json.dumps({"listen": "http://%s:%d" % (host, bound),
                                                "pid": os.getpid()}), flush=True)
        await asyncio.Event().wait()
    app = web.Application()
    app.router.add_post("/v1/completions", f.completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, int(port), backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    print("eldr-proxy ready " + json.dumps({"listen": "http://%s:%d" % (host, bound),
                                            "pid": os.getpid()}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
