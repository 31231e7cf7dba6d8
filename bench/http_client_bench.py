#!/usr/bin/python3
"""CPU per request of eldr-proxy's HTTP client to the instances (tools/eldr-proxy/
eldr_proxy_upstream.py) against aiohttp's client, the one it replaced: the same POSTs of a
300-byte JSON body to a loopback aiohttp server in another process, `--callers` at once, after
a warm-up; this process's CPU time (user + system) over the requests.

usage: http_client_bench.py [--requests N] [--callers C] [--rounds R] [--event-loop asyncio|uvloop]
       prints one JSON line per client and round, then the medians.
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "eldr-proxy"))
import aiohttp  # noqa: E402
import eldr_proxy_upstream as upstream  # noqa: E402

SERVER = """
import sys
from aiohttp import web
ANSWER = b'{"id":"x","choices":[{"text":"a","index":0}],"kv_transfer_params":{"a":1}}'
async def answer(request):
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")
app = web.Application()
app.router.add_post("/v1/completions", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""
BODY = json.dumps({"prompt": "hello " * 48, "max_tokens": 1}).encode()


def start_server():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    deadline = time.monotonic() + 10
    while True:  # polls a condition: the server accepts
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the server did not start")
            time.sleep(0.02)


async def measure(kind, port, requests, callers):
    url = "http://127.0.0.1:%d" % port
    if kind == "aiohttp":
        session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(),
                                        connector=aiohttp.TCPConnector(limit=0))

        async def one():
            async with session.post(url + "/v1/completions", data=BODY,
                                    headers={"Content-Type": "application/json"}) as r:
                return await r.read()

        async def close():
            await session.close()
    else:
        client = upstream.Client(2.0, 30.0)
        origin = upstream.Origin(url)

        async def one():
            r = await client.request(origin, "POST", "/v1/completions", BODY,
                                     [("Content-Type", "application/json")])
            try:
                return await r.read(1 << 20)
            finally:
                r.close()

        async def close():
            client.close()

    async def caller(n):
        for _ in range(n):
            await one()
    await asyncio.gather(*(caller(50) for _ in range(callers)))  # connections, caches
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(requests // callers) for _ in range(callers)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await close()
    n = requests // callers * callers
    return {"client": kind, "requests": n, "cpu_us_per_request": round(cpu / n * 1e6, 1),
            "requests_per_s": round(n / wall)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--callers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--event-loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = ap.parse_args()
    if args.event_loop == "uvloop":
        import uvloop
        uvloop.install()
    proc, port = start_server()
    results = {"aiohttp": [], "eldr_proxy_upstream": []}
    try:
        for _ in range(args.rounds):  # alternated, so the machine's moods fall on both
            for kind in results:
                r = asyncio.run(measure(kind, port, args.requests, args.callers))
                r["event_loop"] = args.event_loop
                print(json.dumps(r), flush=True)
                results[kind].append(r["cpu_us_per_request"])
    finally:
        proc.kill()
        proc.wait()
    print(json.dumps({k: {"median_cpu_us_per_request": statistics.median(v)}
                      for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
