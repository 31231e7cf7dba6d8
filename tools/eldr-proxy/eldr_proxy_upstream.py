"""eldr_proxy_upstream: eldr-proxy's HTTP/1.1 client to the vLLM instances.

Every client request costs the proxy two upstream requests (prefill, decode). aiohttp's client
spent about 200 us of CPU on each (its request and response objects, tracing hooks, timers,
URL handling); this client, a keep-alive connection per request in flight over asyncio's
transports with httptools (Debian's python3-httptools: the http-parser C library) parsing the
answers, spends about 60 us, under 40 with uvloop (bench/http_client_bench.py; BENCHMARKS.md,
"eldr-proxy without aiohttp's client and zmq.asyncio").
It does what the proxy needs and no more:

  - POST or GET with a body and a few headers; the answer's status, headers (lower-case names;
    a repeated header keeps the last value), and its body read whole (bounded) or piece by piece
    as it arrives (the SSE relay), with backpressure: reading from the instance pauses while
    more than 256 KiB wait for the proxy.
  - Connections are kept per (scheme, host, port) and reused, newest first; one idle for
    IDLE_S is closed rather than reused, since vLLM's server closes its idle connections after
    VLLM_HTTP_TIMEOUT_KEEP_ALIVE = 5 s (vllm/envs.py, commit 001f69f8). A request that fails on
    a reused connection before any byte of an answer came back (the instance closed it as it was
    sent) is sent once more on a new connection.
  - Errors are UpstreamError subclasses with a short `reason` for the proxy's counters:
    ConnectFailed (nothing was sent: the request may go elsewhere), UpstreamTimeout (connect, or
    silence while answering), UpstreamClosed, UpstreamProtocolError, BodyTooLarge.
  - Cancelling a call (the proxy's client went away) or closing an answer before its end closes
    the connection, which makes vLLM abort the request.

Header names and values are checked for CR, LF and NUL before anything is sent (no header
injection from a client's Authorization header: header_bytes, which eldr-proxy also calls on the
client's headers, to answer 400).
"""
import asyncio
import collections
import ssl as _ssl
import urllib.parse

import httptools

IDLE_S = 2.0               # a connection idle longer is closed, not reused (vLLM closes at 5 s)
MAX_IDLE_PER_ORIGIN = 256  # idle connections kept per instance
_PAUSE_BYTES = 256 << 10   # stop reading an instance while this much waits for the proxy
_RESUME_BYTES = 64 << 10


class UpstreamError(Exception):
    reason = "connection"


class ConnectFailed(UpstreamError):
    """Connecting failed: the instance never saw the request."""
    reason = "connect"


class UpstreamTimeout(UpstreamError):
    reason = "timeout"


class UpstreamClosed(UpstreamError):
    """The instance closed the connection before its answer was complete."""
    reason = "connection"


class UpstreamProtocolError(UpstreamError):
    """The instance's bytes are not an HTTP/1.1 answer."""
    reason = "protocol"


class BodyTooLarge(UpstreamError):
    reason = "too_large"


class Origin:
    """Where an instance is: scheme, host, port and the base path (a URL's parts, parsed once)."""

    __slots__ = ("scheme", "host", "port", "prefix", "host_header", "key")

    def __init__(self, base_url):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("%r is not an http:// or https:// URL with a host" % base_url)
        default = 443 if u.scheme == "https" else 80
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or default
        self.prefix = u.path.rstrip("/").encode("ascii")
        host = self.host if ":" not in self.host else "[%s]" % self.host
        host_header = host if self.port == default else "%s:%d" % (host, self.port)
        try:
            self.host_header = host_header.encode("ascii")
        except UnicodeEncodeError:  # an internationalised name
            self.host_header = host_header.encode("idna")
        self.key = (self.scheme, self.host, self.port)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request at a time; the answer's events from the
    parser land here and wake the reader."""

    def __init__(self, loop, read_timeout_s):
        self.loop = loop
        self.read_timeout_s = read_timeout_s
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False      # served a request before this one
        self.idle_since = 0.0
        self._reset()

    def _reset(self):
        self.status = 0
        self.headers = {}
        self.headers_done = None   # future: the status line and headers are in
        self.body = collections.deque()
        self.buffered = 0
        self.complete = False      # the whole answer is in
        self.answers = 0           # final (not 1xx) answers parsed: more than one is a fault
        self.keep_alive = False
        self.got_bytes = False     # any byte of this request's answer came back
        self.error = None
        self.waiter = None         # future the body reader waits on
        self.paused = False
        self.deadline = 0.0
        self.timer = None

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if self.headers_done is None or self.complete:
            # Bytes nobody asked for (an idle kept connection): whatever they are, the
            # connection no longer lines up answers with requests.
            self.close()
            return
        self.got_bytes = True
        self.deadline = self.loop.time() + self.read_timeout_s
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamProtocolError("the instance switched protocols"))
        except httptools.HttpParserError as e:
            self._fail(UpstreamProtocolError("not an HTTP/1.1 answer: %s" % e))

    def eof_received(self):
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc):
        self.closed = True
        if self.headers_done is None or self.complete:
            return
        try:
            self.parser.feed_data(b"")  # http-parser: a body delimited by the end of the stream
        except httptools.HttpParserError:
            pass
        if not self.complete:
            self._fail(UpstreamClosed("the instance closed the connection%s" %
                                      (": %s" % exc if exc else "")))

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_header(self, name, value):
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self):
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # 100 Continue and friends: the answer comes after
            self.headers = {}
            return
        self.answers += 1
        if self.answers > 1:  # an answer to no request, in the same bytes as this one's end
            return
        f = self.headers_done
        if f is not None and not f.done():
            f.set_result(None)

    def on_body(self, body):
        if self.answers > 1:
            return
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _PAUSE_BYTES and not self.paused and not self.closed:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self):
        if 100 <= self.status < 200 or self.answers > 1:
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._stop_timer()
        self._wake()

    # -- the reader's side -----------------------------------------------------------------------

    def _wake(self):
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, error):
        if self.error is None:
            self.error = error
        self._stop_timer()
        f = self.headers_done
        if f is not None and not f.done():
            f.set_exception(error)
            f.exception()  # retrieved here: a cancelled caller never reads it
        self._wake()
        self.close()

    def _on_timer(self):
        self.timer = None
        if self.complete or self.error is not None:
            return
        now = self.loop.time()
        if now >= self.deadline:
            self._fail(UpstreamTimeout("the instance sent nothing for %.1f s"
                                       % self.read_timeout_s))
        else:  # data came meanwhile: look again at the new deadline (one timer, not one a chunk)
            self.timer = self.loop.call_at(self.deadline, self._on_timer)

    def _stop_timer(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def send(self, head, body):
        """Writes one request; its answer's headers_done future is returned."""
        self._reset()
        self.headers_done = self.loop.create_future()
        self.deadline = self.loop.time() + self.read_timeout_s
        self.timer = self.loop.call_at(self.deadline, self._on_timer)
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        return self.headers_done

    async def next_chunk(self):
        """The next piece of the body, b"" at its end; raises the connection's error."""
        while True:
            if self.body:
                chunk = self.body.popleft()
                self.buffered -= len(chunk)
                if self.paused and self.buffered < _RESUME_BYTES and not self.closed:
                    self.paused = False
                    self.transport.resume_reading()
                return chunk
            if self.error is not None:
                raise self.error
            if self.complete:
                return b""
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    def close(self):
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()


class Response:
    """An instance's answer: status and headers now, the body by read() or chunks(). close() it
    (also after reading it: that returns the connection for reuse)."""

    __slots__ = ("status", "headers", "_conn", "_client", "_origin")

    def __init__(self, conn, client, origin):
        self.status = conn.status
        self.headers = conn.headers
        self._conn = conn
        self._client = client
        self._origin = origin

    @property
    def content_length(self):
        v = self.headers.get("content-length")
        return int(v) if v is not None and v.isdigit() else None

    async def chunks(self):
        """The body's pieces as they arrive (chunked transfer decoding done)."""
        conn = self._conn
        while chunk := await conn.next_chunk():
            yield chunk

    async def read(self, limit):
        """The whole body, at most limit bytes (else BodyTooLarge, and the connection closes)."""
        n = self.content_length
        if n is not None and n > limit:
            self._drop()
            raise BodyTooLarge("a body of %d bytes (over %d)" % (n, limit))
        parts, n = [], 0
        conn = self._conn
        while True:
            chunk = await conn.next_chunk()
            if not chunk:
                break
            n += len(chunk)
            if n > limit:
                self._drop()
                raise BodyTooLarge("a body over %d bytes" % limit)
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _drop(self):
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self):
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if (conn.complete and conn.keep_alive and conn.answers == 1 and not conn.closed and
                conn.error is None):
            self._client._release(self._origin, conn)
        else:
            conn.close()


class Client:
    """Connections to the instances, kept and reused (module docstring)."""

    def __init__(self, connect_timeout_s, read_timeout_s, ssl_context=None):
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._ssl = ssl_context
        self._idle = {}  # Origin.key -> [connection, ...] (newest last)
        self.connections_opened = 0
        self.resent = 0  # requests sent again after a reused connection closed under them

    async def request(self, origin, method, path, body=b"", headers=()):
        """Sends method origin.prefix+path with body and headers ((name, value) str pairs) and
        returns the Response once its headers are in. Raises UpstreamError."""
        head = self._head(origin, method, path, body, headers)
        for attempt in (0, 1):
            conn = self._take(origin)
            if conn is None:
                conn = await self._connect(origin)
            headers_done = conn.send(head, body)
            try:
                await headers_done
            except UpstreamClosed:
                # A kept connection the instance closed as the request went out: it saw nothing
                # of it (no byte came back), so it goes once more on a new connection.
                if attempt == 0 and conn.reused and not conn.got_bytes:
                    self.resent += 1
                    continue
                raise
            except BaseException:  # cancelled (the client left) or failed: the request is off
                conn.close()
                raise
            return Response(conn, self, origin)

    @staticmethod
    def _head(origin, method, path, body, headers):
        lines = [b"%s %s%s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n"
                 % (method.encode("ascii"), origin.prefix, path.encode("ascii"),
                    origin.host_header, len(body))]
        for name, value in headers:
            lines.append(b"%s: %s\r\n" % (header_bytes(name), header_bytes(value)))
        lines.append(b"\r\n")
        return b"".join(lines)

    def _take(self, origin):
        idle = self._idle.get(origin.key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_S:
                conn.reused = True
                return conn
            conn.close()
        return None

    def _release(self, origin, conn):
        idle = self._idle.setdefault(origin.key, [])
        if len(idle) >= MAX_IDLE_PER_ORIGIN:
            conn.close()
            return
        conn.idle_since = conn.loop.time()
        idle.append(conn)

    async def _connect(self, origin):
        loop = asyncio.get_running_loop()
        ssl = None
        if origin.scheme == "https":
            if self._ssl is None:
                self._ssl = _ssl.create_default_context()
            ssl = self._ssl
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop, self.read_timeout_s),
                                       origin.host, origin.port, ssl=ssl),
                self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise ConnectFailed("connecting to %s:%d timed out after %.1f s"
                                % (origin.host, origin.port, self.connect_timeout_s)) from None
        except OSError as e:  # refused, unreachable, name not found, TLS handshake
            raise ConnectFailed("cannot connect to %s:%d: %s"
                                % (origin.host, origin.port, e)) from None
        self.connections_opened += 1
        return conn

    def idle_connections(self):
        return sum(len(v) for v in self._idle.values())

    def close(self):
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def header_bytes(s):
    """A header name or value as the bytes to send: UTF-8, with the bytes a server decoded with
    surrogateescape (aiohttp's, for a client's header that is not UTF-8) given back as they came.
    ValueError for CR, LF or NUL (header injection) or a string no bytes stand for."""
    if "\r" in s or "\n" in s or "\0" in s:
        raise ValueError("CR, LF or NUL in a header")
    try:
        return s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ValueError("a header that is not text") from None
