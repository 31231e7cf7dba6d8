#!/usr/bin/python3
"""eldr-proxy's HTTP/1.1 client to the vLLM instances (tools/eldr-proxy/eldr_proxy_upstream.py)
against scripted servers on real sockets (asyncio servers on port 0 that write exact bytes):
keep-alive reuse, chunked answers relayed piece by piece, a kept connection the server closed
(sent again once), refused connections, silence, oversized and malformed answers, a cancelled
call closing its connection, header injection refused, backpressure on a reader that lags.

usage: eldr_proxy_upstream_test.py      exit 0 when every test passes.
"""
import asyncio
import os
import sys
import traceback

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "eldr-proxy"))
import eldr_proxy_upstream as up  # noqa: E402

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Server:
    """A TCP server on 127.0.0.1:0 whose connections run `script(reader, writer, server)`; it
    records each connection's requests (their head and body)."""

    def __init__(self, script):
        self.script = script
        self.connections = 0
        self.requests = []     # (connection number, head bytes, body bytes)
        self.closed_by_peer = asyncio.Event()
        self._server = None

    async def __aenter__(self):
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self.origin = up.Origin("http://127.0.0.1:%d" % self.port)
        return self

    async def __aexit__(self, *exc):
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader, writer):
        self.connections += 1
        conn = self.connections
        try:
            await self.script(Requests(reader, self, conn), writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader, conn):
        head = await reader.readuntil(b"\r\n\r\n")
        n = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                n = int(line.split(b":")[1])
        body = await reader.readexactly(n)
        self.requests.append((conn, head, body))
        return head, body


class Requests:
    def __init__(self, reader, server, conn):
        self.reader, self.server, self.conn = reader, server, conn

    async def next(self):
        return await self.server.read_request(self.reader, self.conn)

    async def eof(self):
        """Waits until the client closes the connection."""
        while await self.reader.read(65536):
            pass
        self.server.closed_by_peer.set()


async def answer_each(req, writer, server):
    while True:
        await req.next()
        writer.write(OK)
        await writer.drain()


async def test_a_connection_is_kept_and_reused():
    async with Server(answer_each) as s:
        c = up.Client(1.0, 5.0)
        for i in range(3):
            r = await c.request(s.origin, "POST", "/v1/completions", b'{"a":%d}' % i,
                                [("Content-Type", "application/json")])
            check(r.status == 200 and r.headers["content-type"] == "application/json",
                  "status and headers: %r %r" % (r.status, r.headers))
            check(await r.read(1024) == b"{}", "body")
            r.close()
        check(s.connections == 1 and c.connections_opened == 1,
              "three requests on one connection: %d server, %d client"
              % (s.connections, c.connections_opened))
        head = s.requests[2][1]
        check(head.startswith(b"POST /v1/completions HTTP/1.1\r\n"), head)
        check(b"\r\nHost: 127.0.0.1:%d\r\n" % s.port in head, head)
        check(s.requests[2][2] == b'{"a":2}', s.requests[2][2])
        c.close()


async def test_a_base_path_prefixes_every_request():
    async with Server(answer_each) as s:
        c = up.Client(1.0, 5.0)
        r = await c.request(up.Origin("http://127.0.0.1:%d/engine/" % s.port), "GET", "/health")
        r.close()
        check(s.requests[0][1].startswith(b"GET /engine/health HTTP/1.1\r\n"), s.requests[0][1])
        c.close()


async def test_a_chunked_answer_arrives_piece_by_piece():
    gate = asyncio.Event()

    async def stream(req, writer, server):
        await req.next()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n")
        await writer.drain()
        await gate.wait()  # the rest only once the client has the first piece
        writer.write(b"6\r\ndata:2\r\n0\r\n\r\n")
        await writer.drain()
        await req.next()  # kept alive afterwards
        writer.write(OK)

    async with Server(stream) as s:
        c = up.Client(1.0, 5.0)
        r = await c.request(s.origin, "POST", "/v1/completions", b"{}")
        check(r.headers["content-type"] == "text/event-stream", r.headers)
        pieces = []
        async for chunk in r.chunks():
            pieces.append(chunk)
            gate.set()
        check(pieces == [b"data:1", b"data:2"], "pieces: %r" % pieces)
        r.close()
        r = await c.request(s.origin, "POST", "/v1/completions", b"{}")
        check(await r.read(10) == b"{}" and s.connections == 1, "reused after a chunked answer")
        r.close()
        c.close()


async def test_a_kept_connection_the_server_closed_is_sent_again_once():
    async def one_then_close(req, writer, server):
        await req.next()
        writer.write(OK)  # no "Connection: close": as a keep-alive timeout closing it later
        await writer.drain()

    async with Server(one_then_close) as s:
        c = up.Client(1.0, 5.0)
        r = await c.request(s.origin, "POST", "/a", b"1")
        await r.read(10)
        r.close()
        check(c.idle_connections() == 1, "kept")
        r = await c.request(s.origin, "POST", "/a", b"2")
        check(await r.read(10) == b"{}", "answered on a new connection")
        r.close()
        check(s.connections == 2, "two connections: %d" % s.connections)
        check(c.resent <= 1, "sent again at most once: %d" % c.resent)
        check([body for _, _, body in s.requests] == [b"1", b"2"],
              "each request reached the server once: %r" % s.requests)
        c.close()


async def test_an_answer_to_no_request_drops_the_connection():
    """Bytes after an answer (in the same packet or later, on the idle connection) mean the
    connection no longer lines answers up with requests: it is closed, never reused."""
    async def later(req, writer, server):
        await req.next()
        writer.write(OK)
        await writer.drain()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nold")
        await writer.drain()
        await req.eof()

    async def unsolicited(req, writer, server):
        await req.next()
        writer.write(OK + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")  # one too many
        await writer.drain()
        await req.eof()

    for script in (unsolicited, later):
        async with Server(script) as s:
            c = up.Client(1.0, 5.0)
            r = await c.request(s.origin, "GET", "/health")
            check(await r.read(10) == b"{}", "the answer")
            r.close()
            await asyncio.wait_for(s.closed_by_peer.wait(), 5)
            check(c.idle_connections() == 0, "%s: kept" % script.__name__)
            c.close()


async def test_an_idle_connection_past_idle_s_is_not_reused():
    saved = up.IDLE_S
    up.IDLE_S = 0.0
    try:
        async with Server(answer_each) as s:
            c = up.Client(1.0, 5.0)
            for _ in range(2):
                r = await c.request(s.origin, "GET", "/health")
                await r.read(10)
                r.close()
            check(c.connections_opened == 2 and s.connections == 2,
                  "a new connection each time: %d" % c.connections_opened)
            c.close()
    finally:
        up.IDLE_S = saved


async def test_connection_close_is_honoured():
    async def close_header(req, writer, server):
        await req.next()
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        await req.eof()

    async with Server(close_header) as s:
        c = up.Client(1.0, 5.0)
        r = await c.request(s.origin, "GET", "/health")
        await r.read(10)
        r.close()
        check(c.idle_connections() == 0, "not kept")
        await asyncio.wait_for(s.closed_by_peer.wait(), 5)
        c.close()


async def test_a_refused_connection_is_connect_failed():
    async with Server(answer_each) as s:
        port = s.port
    c = up.Client(1.0, 5.0)
    try:
        await c.request(up.Origin("http://127.0.0.1:%d" % port), "GET", "/health")
        raise AssertionError("no error")
    except up.ConnectFailed as e:
        check(e.reason == "connect" and str(port) in str(e), str(e))


async def test_silence_is_a_timeout():
    async def silent(req, writer, server):
        await req.next()
        await req.eof()

    async with Server(silent) as s:
        c = up.Client(1.0, 0.2)
        try:
            await c.request(s.origin, "POST", "/v1/completions", b"{}")
            raise AssertionError("no error")
        except up.UpstreamTimeout as e:
            check(e.reason == "timeout", str(e))
        await asyncio.wait_for(s.closed_by_peer.wait(), 5)  # the connection is dropped


async def test_a_body_over_the_limit_is_refused_and_the_connection_dropped():
    async def big(req, writer, server):
        await req.next()
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(4):
            writer.write(b"400\r\n" + b"x" * 1024 + b"\r\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await req.eof()

    async def declared(req, writer, server):
        await req.next()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        await req.eof()

    for script, what in ((big, "a chunked body"), (declared, "a declared length")):
        async with Server(script) as s:
            c = up.Client(1.0, 5.0)
            r = await c.request(s.origin, "POST", "/", b"")
            try:
                await r.read(3000)
                raise AssertionError("no error for %s" % what)
            except up.BodyTooLarge as e:
                check(e.reason == "too_large", str(e))
            r.close()
            await asyncio.wait_for(s.closed_by_peer.wait(), 5)
            check(c.idle_connections() == 0, what)


async def test_bytes_that_are_not_http_are_a_protocol_error():
    async def garbage(req, writer, server):
        await req.next()
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await req.eof()

    async with Server(garbage) as s:
        c = up.Client(1.0, 5.0)
        try:
            await c.request(s.origin, "GET", "/health")
            raise AssertionError("no error")
        except up.UpstreamProtocolError as e:
            check(e.reason == "protocol", str(e))


async def test_a_close_mid_answer_is_an_error_for_the_reader():
    async def half(req, writer, server):
        await req.next()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
        await writer.drain()

    async with Server(half) as s:
        c = up.Client(1.0, 5.0)
        r = await c.request(s.origin, "GET", "/")
        try:
            await r.read(100)
            raise AssertionError("no error")
        except up.UpstreamClosed:
            pass
        r.close()


async def test_cancelling_a_call_or_closing_an_unread_answer_drops_the_connection():
    async def slow(req, writer, server):
        await req.next()
        await req.eof()

    async with Server(slow) as s:
        c = up.Client(1.0, 5.0)
        task = asyncio.ensure_future(c.request(s.origin, "POST", "/v1/completions", b"{}"))
        while not s.requests:
            await asyncio.sleep(0.005)  # polls a condition; the test's deadline is ctest's
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await asyncio.wait_for(s.closed_by_peer.wait(), 5)

    async def streaming(req, writer, server):
        await req.next()
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await req.eof()

    async with Server(streaming) as s:
        c = up.Client(1.0, 5.0)
        r = await c.request(s.origin, "POST", "/v1/completions", b"{}")
        async for chunk in r.chunks():
            check(chunk == b"abc", chunk)
            break
        r.close()  # the answer is not complete: the connection goes, vLLM aborts the request
        await asyncio.wait_for(s.closed_by_peer.wait(), 5)
        check(c.idle_connections() == 0, "not kept")


async def test_header_injection_is_refused_before_sending():
    async with Server(answer_each) as s:
        c = up.Client(1.0, 5.0)
        for name, value in (("Authorization", "Bearer x\r\nX-Evil: 1"), ("X\nY", "v"),
                            ("Authorization", "a\0b")):
            try:
                await c.request(s.origin, "POST", "/", b"", [(name, value)])
                raise AssertionError("sent %r" % value)
            except ValueError:
                pass
        check(s.connections == 0, "nothing was sent")


async def test_header_bytes_give_a_clients_bytes_back_and_refuse_injection():
    # aiohttp's server decodes a header that is not UTF-8 with surrogateescape: the same bytes
    # go on to the instance.
    raw = b"Bearer \xff\xfe token"
    check(up.header_bytes(raw.decode("utf-8", "surrogateescape")) == raw, "bytes back")
    check(up.header_bytes("Bearer caf\u00e9") == "Bearer caf\u00e9".encode(), "UTF-8")
    for bad in ("a\rb", "a\nb", "a\0b", "\ud800"):
        try:
            up.header_bytes(bad)
            raise AssertionError("passed %r" % bad)
        except ValueError:
            pass


async def test_a_reader_that_lags_pauses_the_instance():
    total = 4 << 20

    async def flood(req, writer, server):
        await req.next()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // 65536):
            writer.write(b"y" * 65536)
            await writer.drain()
        await req.next()

    async with Server(flood) as s:
        c = up.Client(1.0, 5.0)
        r = await c.request(s.origin, "GET", "/")
        conn = r._conn
        while not conn.paused:  # nobody reads: the buffer fills to the pause mark
            await asyncio.sleep(0.005)  # polls a condition
        check(conn.buffered <= up._PAUSE_BYTES + (1 << 20),
              "buffered %d bytes while paused" % conn.buffered)
        n = 0
        async for chunk in r.chunks():
            n += len(chunk)
        check(n == total, "all %d bytes relayed: %d" % (total, n))
        check(not conn.paused, "reading resumed")
        r.close()
        c.close()


async def test_mangled_answers_end_in_bytes_or_an_upstream_error():
    """A broken instance cannot crash or hang the client: 400 answers, each a valid chunked or
    sized answer with bytes flipped, cut, duplicated or inserted (a fixed seed), written and the
    connection closed; every read ends with a body or an UpstreamError."""
    import random
    rng = random.Random(20261204)
    good = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n6\r\ndata:1\r\n6\r\ndata:2\r\n0\r\n\r\n", OK,
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nerror"]
    answers = []
    for _ in range(400):
        b = bytearray(rng.choice(good))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            op = rng.randrange(4)
            if op == 0:
                b[i] = rng.randrange(256)
            elif op == 1:
                del b[i:]
                if not b:
                    b = bytearray(b"H")
            elif op == 2:
                b[i:i] = b[i:i + rng.randint(1, 8)]
            else:
                b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        answers.append(bytes(b))
    outcomes = {"body": 0, "error": 0}
    queue = list(answers)

    async def mangled(req, writer, server):
        await req.next()
        writer.write(queue.pop(0) if queue else OK)
        await writer.drain()

    async with Server(mangled) as s:
        c = up.Client(1.0, 2.0)
        for _ in answers:
            try:
                r = await c.request(s.origin, "POST", "/v1/completions", b"{}")
                try:
                    await r.read(1 << 20)
                finally:
                    r.close()
                outcomes["body"] += 1
            except up.UpstreamError:
                outcomes["error"] += 1
        c.close()
    check(outcomes["body"] + outcomes["error"] == len(answers), outcomes)
    check(outcomes["error"] > 0 and outcomes["body"] > 0, "both kinds of end: %r" % outcomes)


TESTS = [v for k, v in sorted(globals().items()) if k.startswith("test_")]


def main():
    failed = 0
    for t in TESTS:
        try:
            asyncio.run(asyncio.wait_for(t(), 30))
            print("ok   %s" % t.__name__)
        except Exception:
            failed += 1
            print("FAIL %s" % t.__name__)
            traceback.print_exc()
    print("%d of %d passed" % (len(TESTS) - failed, len(TESTS)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
