#!/usr/bin/python3
"""eldr_client: the Python client of an eldr node, for prefill workers, decode workers and operators.

The node binds three ZeroMQ ROUTER sockets (route, worker and admin endpoints). Each client here
connects one DEALER socket to one of them (or one per node when given several endpoints: see
Failover) and speaks eldr's wire protocol version 1
(docs/protocol.md sections 3 to 5): every message is one frame holding one MessagePack map with
"version": 1 and a "type"; the reply comes back on the same connection and is matched to its
request by the "id" key.

Requirements: Python 3.11 with Debian's python3-zmq and python3-msgpack only, so run it with
/usr/bin/python3 (a python3 earlier on PATH may not see Debian's packages). Copy this one file
next to your worker, or put cluster/python on PYTHONPATH.

Every client class takes, besides the arguments shown below:
    endpoints                   one endpoint (str) or a list: the same endpoint on several nodes
    max_attempts=None           attempts of one call over the endpoints (default: one each)
    server_public_key=None      the node's CURVE public key (Z85, 40 characters): turns CURVE on
    public_key=None, secret_key=None
                                the client's own CURVE pair (Z85); absent: an ephemeral pair
    context=None                a shared zmq.Context
and has .failovers (calls resent to another endpoint), .last_endpoint (the endpoint whose answer
was returned last) and .endpoint (the current one). Malformed keys raise ValueError naming the
argument; CURVE on a libzmq without it raises RuntimeError. curve_keypair() and
curve_public_key(secret) make keys for tools.

Failover: a call that gets no answer within timeout_ms is resent, with the same id, to the next
endpoint (round robin); the first answer carrying the id wins, from whichever endpoint it was
sent to, and that endpoint is where the next call starts. Late answers are never taken for the
answer to a later request. Routes are safe to resend (nodes remember a decision per request id),
so are worker messages (a finished event is applied once per id); admin commands are resent too.

Classes
-------
RouteClient(endpoint, timeout_ms=2000)      a prefill worker (or its proxy) asking where to decode
    route(request_id, model, blocks, counts=None, label=None, explain=False,
          cached_blocks=None) -> dict
        the route_reply as a dict: id, worker, endpoint, epoch, covered_blocks, total_blocks,
        fallback (why a locality policy decided by load only, "" when it did not), warnings (a
        list of "code: text", e.g. "counts_geometry: counts are ..., the model is ...; routed by
        load": the node routed, but something to fix made the decision worse; each code is also
        logged on the "eldr_client" logger at most once per 10 s) and, when asked, explain
        {policy, tau, band: [[worker, score], ...]}. Raises EldrError on an error_reply,
        TimeoutError when no answer comes within timeout_ms. .warned_replies and
        .fallback_replies count such replies.
    send(...) / receive(timeout_ms=None)     pipelining: many requests outstanding on one socket;
        receive() returns the next reply dict to arrive (route_reply or error_reply: look at
        reply["type"] and match reply["id"]), raises TimeoutError. Do not mix with route() on one
        client: route() drops replies to other ids.

WorkerClient(endpoint, timeout_ms=2000)     a decode worker (and any vLLM KV-event publisher)
    register(model, worker, endpoint, capacity=0)
    report_load(model, worker, in_flight, running=0, waiting=0, kv_usage=0.0, seq=None)
    finished(model, worker, request_ids)
    drain(model, worker, drain=True)
    register_publisher(model, endpoint, replay_endpoint="")
        each returns the worker_ack as a dict {id, state, epoch}; raises EldrError/TimeoutError.

AdminClient(endpoint, timeout_ms=5000)       operators (eldrctl is the C++ equivalent)
    call(command, **args) -> result          e.g. call("workers", model="m"),
        call("centroids.import", model="m", file=open(path, "rb").read()). Raises EldrError when
        the node answers ok = false.

counts_message(layers, experts, top_k, blocks, seq=None) -> dict
    builds an eldr counts message (docs/protocol.md section 2) to pass as route(counts=...):
    blocks = [(hash, parent, per_layer), ...] where per_layer[l] is either the expert ids the
    block's tokens picked at layer l (a flat list of tokens * top_k ids, or one list of top_k ids
    per token: the rows of the MoE router's top-k output for the block's tokens), or a mapping
    {expert_id: count}. Validated here with the node's rules, so a mistake raises ValueError at
    the prefill worker instead of being skipped (bad_counts) on the node. Writes version 1 (one
    byte per expert id) for models of at most 256 experts, version 2 (little-endian uint16 ids)
    above, as the node's own encoder does.
    blocks may instead be a TopkIds(hashes, parents, ids, block_size): the top-k ids of many
    consecutive tokens as one integer array (numpy) of shape (tokens, layers, top_k), cut into
    blocks of block_size tokens; the same message, built with whole-array operations (a 4,096-
    token prompt of a 48-layer model takes milliseconds, not the list form's seconds). Needs
    numpy (python3-numpy), imported only then.

Block hashes may be given as Python ints (uint64; negative int64 values are taken as their two's
complement) or as bytes (the last 8 bytes, big-endian, as vLLM's newer bytes hashes are
normalised by the node), so vLLM's hashes can be passed as they come.

Examples
--------
A prefill worker (route one request, then hand its KV cache over to the chosen decode worker):

    from eldr_client import RouteClient, EldrError, counts_message
    router = RouteClient(["tcp://eldr-1:5700", "tcp://eldr-2:5700"], timeout_ms=200,
                         server_public_key=open("node.pub").read().strip())
    counts = counts_message(48, 128, 8, blocks=[
        # (block hash, parent hash or None, per layer: the top-k expert ids of each token)
        (block_hashes[i], block_hashes[i - 1] if i else None, topk_ids_of_block(i))
        for i in computed_blocks])
    try:
        reply = router.route(request_id, "qwen3-30b-a3b", block_hashes, counts=counts)
        target = reply["endpoint"]          # the decode worker's KV-transfer endpoint
    except EldrError as e:                  # e.code, e.name ("no_eligible_worker", ...), e.message
        target = fallback_endpoint
    except TimeoutError:
        target = fallback_endpoint

A decode worker (register, report load periodically, report finished requests, drain on exit):

    from eldr_client import WorkerClient
    node = WorkerClient("tcp://eldr-node:5701")
    node.register("qwen3-30b-a3b", worker=3, endpoint="tcp://10.0.0.3:5600", capacity=64)
    node.register_publisher("qwen3-30b-a3b", "tcp://10.0.0.3:5557", "tcp://10.0.0.3:5558")
    while serving:                          # seq defaults to the wall clock (restart-safe)
        node.report_load("qwen3-30b-a3b", 3, in_flight=len(active), running=len(running),
                         waiting=len(waiting), kv_usage=kv_used / kv_total)
        if done_ids:
            node.finished("qwen3-30b-a3b", 3, done_ids)
        time.sleep(0.5)
    node.drain("qwen3-30b-a3b", 3)          # no new requests; those in flight finish

Thread safety: none; a client owns a ZeroMQ socket, which belongs to one thread. Make one client
per thread (they may share one zmq.Context via context=).
"""
import collections
import itertools
import logging
import operator
import os
import struct
import sys
import time

import msgpack
import zmq

_log = logging.getLogger("eldr_client")
import zmq.utils.z85

PROTOCOL_VERSION = 1
# Counts message versions (docs/protocol.md section 2): 1 holds one byte per expert id (models of
# at most NARROW_EXPERTS experts, and what nodes built before version 2 read), 2 little-endian
# uint16 ids. The bounds are model_geometry's (core/geometry.hpp).
COUNTS_VERSION = 1
COUNTS_VERSION_WIDE = 2
NARROW_EXPERTS = 256
MAX_EXPERTS = 4096
MAX_WIDTH = 1 << 20  # layers * experts

# Error codes of error_reply and admin_reply (docs/protocol.md section 3). A code not listed here
# is treated as internal, as the protocol says.
ERROR_CODES = {
    1: "malformed",
    2: "too_large",
    3: "unknown_type",
    4: "unknown_model",
    5: "no_eligible_worker",
    6: "overloaded",
    7: "internal",
    8: "not_found",
}

_U64 = (1 << 64) - 1


class EldrError(Exception):
    """The node answered with an error: code (int), name (str), message (str), id (str or None)."""

    def __init__(self, code, message, request_id=None):
        self.code = int(code) if isinstance(code, int) else 7
        self.name = ERROR_CODES.get(self.code, "internal")
        self.message = message
        self.id = request_id
        super().__init__("%s (%d): %s" % (self.name, self.code, message))


class ProtocolError(Exception):
    """The node's answer did not decode as a message of this protocol (a broken or foreign peer)."""


def normalize_hash(h):
    """A KV block hash as the uint64 the node uses (int, negative int64, or bytes: last 8 bytes).
    Any integer type works (numpy, torch scalars): they are read through operator.index."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
        if not 1 <= len(b) <= 64:
            raise ValueError("a bytes block hash holds 1..64 bytes, got %d" % len(b))
        return int.from_bytes(b[-8:], "big")
    if isinstance(h, bool):
        raise TypeError("a block hash is an int or bytes, not a bool")
    try:
        v = operator.index(h)
    except TypeError:
        raise TypeError("a block hash is an int or bytes, not %s" % type(h).__name__) from None
    if v < -(1 << 63) or v > _U64:
        raise ValueError("block hash %d does not fit in 64 bits" % v)
    return v & _U64


def _flatten_ids(ids):
    """Expert ids from a flat sequence or from one top-k row per token (lists, numpy, torch)."""
    out = []
    for x in ids:
        if hasattr(x, "__iter__"):  # one token's top-k row
            out.extend(operator.index(y) for y in x)
        else:
            out.append(operator.index(x))
    return out


def _layer_counts(entry, experts, layer):
    """{expert: count} of one layer from a mapping or an iterable of picked expert ids."""
    if hasattr(entry, "items"):
        counts = {operator.index(e): operator.index(c) for e, c in entry.items() if c != 0}
    else:
        counts = {}
        for e in _flatten_ids(entry):
            counts[e] = counts.get(e, 0) + 1
    for e, c in counts.items():
        if not 0 <= e < experts:
            raise ValueError("layer %d: expert id %d is not in 0..%d" % (layer, e, experts - 1))
        if c < 0:
            raise ValueError("layer %d: negative count for expert %d" % (layer, e))
    return counts


def counts_block(layers, experts, top_k, block_hash, parent, per_layer, tokens=None):
    """One block of a counts message: [hash, parent, tokens, sizes, ids bin, counts bin]."""
    if len(per_layer) != layers:
        raise ValueError("a block needs counts for %d layers, got %d" % (layers, len(per_layer)))
    per = [_layer_counts(per_layer[l], experts, l) for l in range(layers)]
    if tokens is None:
        total = sum(per[0].values()) if per else 0
        if total % top_k:
            raise ValueError("layer 0 holds %d expert picks, not a multiple of top_k %d"
                             % (total, top_k))
        tokens = total // top_k
    tokens = operator.index(tokens)
    if not 1 <= tokens <= 255:
        raise ValueError("a block holds 1..255 tokens, got %d" % tokens)
    sizes, ids, cnts = [], [], bytearray()
    for l, c in enumerate(per):
        if sum(c.values()) != tokens * top_k:
            raise ValueError("layer %d sums to %d, expected tokens * top_k = %d"
                             % (l, sum(c.values()), tokens * top_k))
        for e in sorted(c):
            if c[e] > tokens:  # each token picks k DISTINCT experts
                raise ValueError("layer %d: expert %d picked %d times by %d tokens"
                                 % (l, e, c[e], tokens))
            ids.append(e)
            cnts.append(c[e])
        sizes.append(len(c))
    if experts <= NARROW_EXPERTS:
        id_bytes = bytes(ids)
    else:
        id_bytes = struct.pack("<%dH" % len(ids), *ids)
    return [normalize_hash(block_hash), None if parent is None else normalize_hash(parent),
            tokens, sizes, id_bytes, bytes(cnts)]


class TopkIds:
    """The vectorised input of counts_message: the MoE router's top-k expert ids of consecutive
    tokens, as one integer array `ids` of shape (tokens, layers, top_k) (numpy, any integer
    dtype), cut into blocks of `block_size` tokens (the last block may be shorter). `hashes` and
    `parents` hold one entry per block (parents: None for no parent)."""

    def __init__(self, hashes, parents, ids, block_size):
        self.hashes = hashes
        self.parents = parents
        self.ids = ids
        self.block_size = block_size


def _runs(np, rows):
    """(ids, counts, sizes) of each row of `rows` (2-D, each row sorted): the distinct values in
    order, how often each occurs (uint8 when a row has at most 255 values, else uint16), and how
    many distinct values each row has."""
    n_rows, width = rows.shape
    flat = rows.ravel()
    starts = np.empty(flat.size + 1, dtype=bool)
    starts[0] = starts[-1] = True
    np.not_equal(flat[1:], flat[:-1], out=starts[1:-1])
    starts[:-1:width] = True
    pos = np.flatnonzero(starts)  # run starts, then the end
    counts = np.empty(pos.size - 1, dtype=np.uint8 if width <= 255 else np.uint16)
    np.subtract(pos[1:], pos[:-1], out=counts, casting="unsafe")  # a run is <= width long
    return (np.take(flat, pos[:-1]), counts,
            np.count_nonzero(starts[:-1].reshape(n_rows, width), axis=1))


def _topk_blocks(layers, experts, top_k, topk):
    """counts_block's output for every block of a TopkIds, by whole-array operations: each
    (block, layer) group of tokens * top_k ids is sorted (radix sort on one byte) and its runs
    counted, so ids come out strictly increasing with their counts, as section 2 requires."""
    import numpy as np
    ids = np.asarray(topk.ids)
    bs = operator.index(topk.block_size)
    if not 1 <= bs <= 255:
        raise ValueError("block_size: a block holds 1..255 tokens, got %d" % bs)
    if ids.ndim != 3 or ids.shape[1:] != (layers, top_k):
        raise ValueError("ids: shape %s, expected (tokens, %d, %d)" % (ids.shape, layers, top_k))
    if ids.dtype.kind not in "iu":
        raise ValueError("ids: integer expert ids expected, got dtype %s" % ids.dtype)
    n_tokens = ids.shape[0]
    n_blocks = -(-n_tokens // bs)
    if len(topk.hashes) != n_blocks or len(topk.parents) != n_blocks:
        raise ValueError("%d tokens in blocks of %d make %d blocks; got %d hashes, %d parents"
                         % (n_tokens, bs, n_blocks, len(topk.hashes), len(topk.parents)))
    if n_tokens == 0:
        return []
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= experts:
        raise ValueError("ids: expert id %d is not in 0..%d" % (lo if lo < 0 else hi, experts - 1))
    # The wire's id width (docs/protocol.md section 2): one byte up to 256 experts (version 1),
    # little-endian uint16 above (version 2).
    ids = ids.astype(np.uint8 if experts <= NARROW_EXPERTS else np.dtype("<u2"), copy=False)
    full = n_tokens // bs
    parts = []  # (ids, counts, sizes, tokens per block, number of blocks)
    if full:
        rows = np.array(ids[:full * bs].reshape(full, bs, layers, top_k).transpose(0, 2, 1, 3),
                        order="C").reshape(full * layers, bs * top_k)  # (block, layer) rows
        rows.sort(axis=1, kind="stable")
        parts.append(_runs(np, rows) + (bs, full))
    tail = n_tokens - full * bs
    if tail:
        rows = np.array(ids[full * bs:].transpose(1, 0, 2), order="C").reshape(layers,
                                                                             tail * top_k)
        rows.sort(axis=1, kind="stable")
        parts.append(_runs(np, rows) + (tail, 1))
    out = []
    b = 0
    for part_ids, part_counts, sizes, tokens, n in parts:
        if int(part_counts.max()) > tokens:  # each token picks k DISTINCT experts
            raise ValueError("ids: a block's %d tokens pick one expert %d times at one layer "
                             "(repeated ids in a token's top-k row)"
                             % (tokens, int(part_counts.max())))
        id_bytes = part_ids.tobytes()
        id_width = part_ids.itemsize  # 1 (version 1) or 2 (version 2) bytes per id
        count_bytes = part_counts.astype(np.uint8, copy=False).tobytes()  # <= tokens <= 255
        per_block = sizes.reshape(n, layers)
        ends = np.cumsum(per_block.sum(axis=1)).tolist()
        start = 0
        for i, block_sizes in enumerate(per_block.tolist()):
            parent = topk.parents[b]
            out.append([normalize_hash(topk.hashes[b]),
                        None if parent is None else normalize_hash(parent), tokens, block_sizes,
                        id_bytes[start * id_width:ends[i] * id_width],
                        count_bytes[start:ends[i]]])
            start = ends[i]
            b += 1
    return out


def counts_message(layers, experts, top_k, blocks, seq=None):
    """An eldr counts message (docs/protocol.md section 2) as a dict ready for msgpack.

    blocks: iterable of (hash, parent, per_layer) or (hash, parent, per_layer, tokens); see the
    module docstring for per_layer. Or a TopkIds. Raises ValueError on anything the node would
    refuse.
    """
    if not (1 <= layers <= 1024 and 1 <= experts <= MAX_EXPERTS and 1 <= top_k <= experts
            and layers * experts <= MAX_WIDTH):
        raise ValueError("geometry [%d, %d, %d]: need 1 <= L <= 1024, 1 <= E <= %d, "
                         "1 <= k <= E, L * E <= %d"
                         % (layers, experts, top_k, MAX_EXPERTS, MAX_WIDTH))
    if isinstance(blocks, TopkIds):
        out_blocks = _topk_blocks(layers, experts, top_k, blocks)
    else:
        out_blocks = []
        for b in blocks:
            if len(b) not in (3, 4):
                raise ValueError("a block is (hash, parent, per_layer[, tokens])")
            out_blocks.append(counts_block(layers, experts, top_k, *b))
    if len(out_blocks) > 4096:
        raise ValueError("a counts message holds at most 4096 blocks, got %d" % len(out_blocks))
    version = COUNTS_VERSION if experts <= NARROW_EXPERTS else COUNTS_VERSION_WIDE
    msg = {"v": version, "model": [layers, experts, top_k]}
    if seq is not None:
        msg["seq"] = int(seq)
    msg["blocks"] = out_blocks
    return msg


class Packed:
    """A field value already packed as one MessagePack value (`data`: bytes, or a memoryview of
    them), placed in the message as it is: a counts message made by eldr-proxy's compiled
    conversion (eldr_proxy_native) is one, its data equal to msgpack.packb of counts_message's
    dict. Nothing checks that the bytes are one value: only wrap what a packer made."""

    __slots__ = ("data",)

    def __init__(self, data):
        # bytes, or a memoryview of bytes valid while referenced (eldr_proxy_native's message
        # in the library's buffer): neither is copied.
        self.data = data if isinstance(data, (bytes, memoryview)) else bytes(data)


def encode(msg_type, fields):
    """One wire message: the envelope plus `fields` (None values are left out: optional). A
    Packed value goes in as its bytes; the message is byte for byte what msgpack.packb makes of
    the unpacked values."""
    m = {"version": PROTOCOL_VERSION, "type": msg_type}
    for k, v in fields.items():
        if v is not None:
            m[k] = v
    if not any(isinstance(v, Packed) for v in m.values()):
        return msgpack.packb(m, use_bin_type=True)
    n = len(m)  # a map header as msgpack writes it: fixmap, map16, map32
    if n < 16:
        parts = [bytes([0x80 | n])]
    elif n < 1 << 16:
        parts = [b"\xde" + n.to_bytes(2, "big")]
    else:
        parts = [b"\xdf" + n.to_bytes(4, "big")]
    for k, v in m.items():
        parts.append(msgpack.packb(k, use_bin_type=True))
        parts.append(v.data if isinstance(v, Packed) else msgpack.packb(v, use_bin_type=True))
    return b"".join(parts)


def decode(payload, expected_types):
    """A reply payload as a dict; ProtocolError when it is not a version-1 map of those types."""
    try:
        # A string that is not UTF-8 (a node before 0.2.1 passed worker endpoints through
        # unchecked) is shown with U+FFFD rather than failing the whole reply.
        m = msgpack.unpackb(payload, raw=False, strict_map_key=False, unicode_errors="replace")
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise ProtocolError("reply does not decode as MessagePack: %s" % e) from None
    if not isinstance(m, dict):
        raise ProtocolError("reply is a %s, not a map" % type(m).__name__)
    if m.get("version") != PROTOCOL_VERSION:
        raise ProtocolError("reply of version %r, this client reads %d"
                            % (m.get("version"), PROTOCOL_VERSION))
    if m.get("type") not in expected_types:
        raise ProtocolError("reply of type %r, expected one of %s"
                            % (m.get("type"), ", ".join(expected_types)))
    return m


def checked_endpoint(field, value, zmq_connect):
    """value as the node accepts it for `field` (docs/protocol.md section 4), else ValueError
    naming the field: 1..256 bytes of printable ASCII without whitespace, quotes or backslashes;
    an endpoint the node connects to (zmq_connect) is tcp://... or ipc://..."""
    value = str(value)
    for i, ch in enumerate(value):
        if not ("\x21" <= ch <= "\x7e") or ch in "\"'`\\":
            raise ValueError("%s: contains %r at %d; an endpoint is printable ASCII without "
                             "whitespace, quotes or backslashes" % (field, ch, i))
    if not 1 <= len(value) <= 256:
        raise ValueError("%s: %d bytes, must be 1..256" % (field, len(value)))
    if zmq_connect and not (value.startswith(("tcp://", "ipc://")) and len(value) > 6):
        raise ValueError("%s: %r is not tcp://HOST:PORT or ipc://PATH" % (field, value))
    return value


def checked_metrics_url(value, field="worker_register.metrics_url"):
    """value as the node accepts it for worker_register.metrics_url (docs/protocol.md section 4,
    cluster/http/http_url.hpp), else ValueError naming the field: an endpoint (checked_endpoint) that
    is http://HOST[:PORT][/PATH] -- HOST a DNS name, an IPv4 address or a bracketed IPv6 address,
    PORT 1..65535 -- without https, user info or a fragment."""
    value = checked_endpoint(field, value, False)
    bad = ValueError("%s: %r is not http://HOST[:PORT][/PATH] without user info or fragment "
                     "(the node scrapes over http only)" % (field, value))
    if not value.startswith("http://") or "#" in value:
        raise bad
    authority = value[len("http://"):].split("/", 1)[0]
    if not authority or "@" in authority:
        raise bad
    if authority.startswith("["):
        host, close, rest = authority[1:].partition("]")
        if not close:
            raise bad
        if not host or any(c not in "0123456789abcdefABCDEF:." for c in host):
            raise bad
        if rest and not rest.startswith(":"):
            raise bad
        port = rest[1:] if rest else None
    else:
        host, colon, port = authority.partition(":")
        if not host or any(not (c.isascii() and (c.isalnum() or c in "-._")) for c in host):
            raise bad
        port = port if colon else None
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise bad
    return value


def error_from(reply):
    """The EldrError an error_reply (or a failed admin_reply) stands for."""
    if reply.get("type") == "admin_reply":
        return EldrError(reply.get("code", 7), reply.get("error", ""), reply.get("id"))
    return EldrError(reply.get("code", 7), reply.get("message", ""), reply.get("id"))


def _block_keys(blocks):
    """The route request's blocks as uint64 ints: a numpy uint64 array (eldr-proxy makes its
    keys once per request, for the counts too) as its ints, without a call per block; anything
    else through normalize_hash."""
    dtype = getattr(blocks, "dtype", None)
    if dtype is not None and str(dtype) == "uint64" and getattr(blocks, "ndim", 0) == 1:
        return blocks.tolist()
    return [normalize_hash(h) for h in blocks]


def route_request(request_id, model, blocks, counts=None, label=None, explain=False,
                  cached_blocks=None, retry=False):
    """The encoded route_request (docs/protocol.md section 3). cached_blocks: how many leading
    blocks the prefill served from its prefix cache, when counts hold those blocks too. retry:
    a resend of an id already sent to another router (the clients mark their failovers)."""
    if cached_blocks is not None and not 0 <= int(cached_blocks) <= len(blocks):
        raise ValueError("cached_blocks %r: 0..%d (the blocks)" % (cached_blocks, len(blocks)))
    return encode("route_request", {
        "id": str(request_id),
        "model": str(model),
        "blocks": _block_keys(blocks),
        "counts": counts,
        "cached_blocks": None if cached_blocks is None else int(cached_blocks),
        "label": None if label is None else int(label),
        "explain": True if explain else None,
        "retry": True if retry else None,
    })


# The worker endpoint's requests (docs/protocol.md section 4) as (type, fields without "id"), and
# the admin request and the replies' meaning: the message logic of both clients (this module's
# and eldr_client_aio's), which only send and receive.

def worker_register_message(model, worker, endpoint, capacity=0, metrics_url=None):
    """worker_register: decode worker `worker` (its index in the model's pool), the endpoint
    route replies name and, when not None, vLLM's /metrics URL (http://) the node scrapes."""
    fields = {"model": str(model), "worker": int(worker),
              "endpoint": checked_endpoint("worker_register.endpoint", endpoint, False),
              "capacity": int(capacity)}
    if metrics_url is not None:
        fields["metrics_url"] = checked_metrics_url(metrics_url)
    return "worker_register", fields


class LoadReports:
    """The load_report both worker clients send (this module's and eldr_client_aio's): seq
    defaults to the wall clock in microseconds, kept strictly increasing within the client (the
    node ignores a report older than one it applied, also across worker restarts). Needs
    self._seq (0 at first)."""

    def _load_report_message(self, model, worker, in_flight, running, waiting, kv_usage, seq):
        if not 0.0 <= float(kv_usage) <= 1.0:  # the node refuses it (malformed) otherwise
            raise ValueError("kv_usage %r is outside 0..1" % (kv_usage,))
        if seq is None:
            self._seq = max(self._seq + 1, time.time_ns() // 1000)
            seq = self._seq
        return "load_report", {
            "model": str(model), "worker": int(worker), "in_flight": int(in_flight),
            "running": int(running), "waiting": int(waiting), "kv_usage": float(kv_usage),
            "seq": int(seq)}


def finished_message(model, worker, request_ids):
    return "finished", {"model": str(model), "worker": int(worker),
                        "requests": [str(r) for r in request_ids]}


def worker_drain_message(model, worker, drain=True):
    return "worker_drain", {"model": str(model), "worker": int(worker), "drain": bool(drain)}


def publisher_register_message(model, endpoint, replay_endpoint=""):
    return "publisher_register", {
        "model": str(model),
        "endpoint": checked_endpoint("publisher_register.endpoint", endpoint, True),
        "replay_endpoint": checked_endpoint("publisher_register.replay_endpoint",
                                            replay_endpoint, True) if replay_endpoint else ""}


def worker_request(request_id, message):
    """The encoded worker request: message is one of the (type, fields) above."""
    msg_type, fields = message
    return encode(msg_type, dict({"id": request_id}, **fields))


def worker_ack(reply):
    """The worker_ack; raises the EldrError an error_reply stands for."""
    if reply["type"] == "error_reply":
        raise error_from(reply)
    return reply


def admin_request(request_id, command, args):
    """The encoded admin_request (docs/protocol.md section 5)."""
    return encode("admin_request", {"id": request_id, "command": str(command), "args": args})


def admin_result(reply):
    """The result of an admin_reply; raises EldrError when the node refused the command."""
    if reply["type"] == "error_reply" or not reply.get("ok", False):
        raise error_from(reply)
    return reply.get("result")


def curve_keypair():
    """A fresh CURVE key pair (public, secret), Z85 text (40 characters each), as str."""
    _require_curve()
    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


def curve_public_key(secret_key):
    """The Z85 public key (str) of a Z85 secret key. Raises ValueError when it is not a key."""
    _require_curve()
    return zmq.curve_public(_z85_key(secret_key, "secret_key")).decode("ascii")


_Z85_CHARS = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                       b".-:+=^!/*?&<>()[]{}@%$#")


def _require_curve():
    if not zmq.has("curve"):
        raise RuntimeError("CURVE requested but this libzmq has no CURVE support "
                           "(zmq.has('curve') is False; libzmq needs libsodium)")


def _z85_key(key, field):
    """key (str or bytes) as 40 Z85 bytes; ValueError naming the field (never the key)."""
    if isinstance(key, str):
        try:
            key = key.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError("%s: not a Z85 CURVE key (non-ASCII characters)" % field) from None
    if not isinstance(key, (bytes, bytearray)):
        raise ValueError("%s: a Z85 CURVE key is a str, not %s" % (field, type(key).__name__))
    key = bytes(key)
    if len(key) != 40 or not set(key) <= _Z85_CHARS:
        raise ValueError("%s: not a Z85 CURVE key (40 characters of the Z85 alphabet)" % field)
    try:
        raw = zmq.utils.z85.decode(key)
    except Exception:  # a group over 32 bits
        raise ValueError("%s: not a Z85 CURVE key (does not decode)" % field) from None
    if zmq.utils.z85.encode(raw) != key:
        raise ValueError("%s: not a Z85 CURVE key (not canonical)" % field)
    return key


def connect_dealers(ctx, endpoints, keys, socks):
    """One DEALER socket of `ctx` per endpoint, connected, appended to `socks` as it is made (so
    a caller can close the ones made before an error). keys: _curve_keys' (server, public,
    secret) or None. Shared by the synchronous and the asyncio clients (both plain zmq.Context
    sockets; eldr_client_aio drives its own from the event loop)."""
    for e in endpoints:
        s = ctx.socket(zmq.DEALER)
        socks.append(s)
        # Closing must never hang on messages a dead node will not take.
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IMMEDIATE, 1)
        if keys is not None:
            s.setsockopt(zmq.CURVE_SERVERKEY, keys[0])
            s.setsockopt(zmq.CURVE_PUBLICKEY, keys[1])
            s.setsockopt(zmq.CURVE_SECRETKEY, keys[2])
        s.connect(e)


class ClientSettings:
    """The settings both clients (synchronous and asyncio) check the same way: endpoints (one
    str or bytes, or a list of them; at least one), timeout_ms >= 1, max_attempts >= 1 (default:
    one attempt per endpoint), and the CURVE keys (_curve_keys)."""

    def __init__(self, endpoints, timeout_ms, max_attempts, server_public_key, public_key,
                 secret_key):
        if isinstance(endpoints, (str, bytes)):
            endpoints = [endpoints]
        endpoints = [e.decode() if isinstance(e, bytes) else str(e) for e in endpoints]
        if not endpoints:
            raise ValueError("endpoints: at least one is needed")
        if int(timeout_ms) < 1:
            raise ValueError("timeout_ms: must be >= 1, got %r" % (timeout_ms,))
        if max_attempts is not None and int(max_attempts) < 1:
            raise ValueError("max_attempts: must be >= 1, got %r" % (max_attempts,))
        self.keys = _curve_keys(server_public_key, public_key, secret_key)
        self.endpoints = endpoints
        self.timeout_ms = int(timeout_ms)
        self.max_attempts = len(endpoints) if max_attempts is None else int(max_attempts)


class DealerClientBase:
    """What both clients (_Client here, eldr_client_aio._AsyncClient) keep the same way: the
    checked settings, the failover state and the context; the subclass connects its DEALERs
    (connect_dealers, with self._keys) once its own state is set up."""

    def __init__(self, endpoints, timeout_ms, reply_types, context, max_attempts,
                 server_public_key, public_key, secret_key, new_context):
        settings = ClientSettings(endpoints, timeout_ms, max_attempts, server_public_key,
                                  public_key, secret_key)
        self.endpoints = settings.endpoints
        self.timeout_ms = settings.timeout_ms
        self.max_attempts = settings.max_attempts
        self.failovers = 0           # attempts resent to another endpoint after a timeout
        self.last_endpoint = None    # the endpoint whose answer was returned last
        self._keys = settings.keys
        self._current = 0
        self._reply_types = reply_types
        self._own_context = context is None
        self._ctx = context if context is not None else new_context()
        self._socks = []

    @property
    def endpoint(self):
        """The current endpoint (where the next call starts and, in the synchronous client,
        pipelined messages go)."""
        return self.endpoints[self._current]

    def _no_reply(self):
        """The TimeoutError of a call whose every attempt went unanswered."""
        return TimeoutError("%s: no reply within %d ms (%d attempt%s)"
                            % (", ".join(self.endpoints), self.timeout_ms, self.max_attempts,
                               "" if self.max_attempts == 1 else "s"))


def _curve_keys(server_public_key, public_key, secret_key):
    """The (server, public, secret) keys a socket gets, checked and completed, or None (no
    CURVE). An absent client pair is made up (ephemeral); an absent public key is derived."""
    if server_public_key is None:
        if public_key is not None or secret_key is not None:
            raise ValueError("server_public_key: required when a client key is given")
        return None
    _require_curve()
    server = _z85_key(server_public_key, "server_public_key")
    if secret_key is None:
        if public_key is not None:
            raise ValueError("secret_key: missing (public_key is set without its secret key)")
        public, secret = zmq.curve_keypair()
        return server, public, secret
    secret = _z85_key(secret_key, "secret_key")
    derived = zmq.curve_public(secret)
    if public_key is None:
        return server, derived, secret
    public = _z85_key(public_key, "public_key")
    if public != derived:
        raise ValueError("public_key: does not belong to secret_key")
    return server, public, secret


class _Client(DealerClientBase):
    """DEALERs connected to one or more node endpoints, with id correlation, timeouts and
    failover.

    endpoints: one endpoint (str) or a list of them (the same protocol on several nodes). One
    DEALER per endpoint, all connected at once, with LINGER 0 and IMMEDIATE (a message is only
    queued for an endpoint whose connection, and CURVE handshake, is complete). A synchronous call
    goes to the current endpoint; when no answer comes within timeout_ms it is resent with the
    same id to the next endpoint (round robin, max_attempts attempts in all, default one per
    endpoint), while answers from the endpoints tried before are still accepted; the first answer
    with the call's id wins and its endpoint becomes the current one. Replies to other ids are
    dropped; ids given up on an endpoint are remembered (bounded) so that receive() drops their
    late replies too. Pipelined send()/receive() use the current endpoint only.
    """

    _ids = itertools.count(1)
    _max_abandoned = 4096

    def __init__(self, endpoints, timeout_ms, reply_types, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, reply_types, context, max_attempts,
                         server_public_key, public_key, secret_key, zmq.Context)
        self._abandoned = [collections.OrderedDict() for _ in self.endpoints]
        try:
            connect_dealers(self._ctx, self.endpoints, self._keys, self._socks)
        except Exception:
            self.close()
            raise
        self._prefix = "py-%d-%x-" % (os.getpid(), id(self))

    @property
    def _sock(self):
        return self._socks[self._current] if self._socks else None

    def next_id(self):
        return self._prefix + str(next(_Client._ids))

    def close(self):
        if self._socks:
            for s in self._socks:
                s.close(0)
            self._socks = []
            if self._own_context:
                self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send_on(self, i, payload, timeout_ms):
        # A DEALER with no completed connection blocks in send; bound that by the timeout.
        if not self._socks[i].poll(timeout_ms, zmq.POLLOUT):
            raise TimeoutError("%s: cannot send within %d ms" % (self.endpoints[i], timeout_ms))
        self._socks[i].send(payload, zmq.NOBLOCK)

    def _send(self, payload):
        self._send_on(self._current, payload, self.timeout_ms)

    def _read(self, i):
        # One frame from a node talking to a DEALER; the last one is the message in any case (a
        # node that adds a REQ-style empty delimiter is understood too, as by the C++ client).
        return decode(self._socks[i].recv_multipart()[-1], self._reply_types)

    def _abandon(self, i, rid):
        a = self._abandoned[i]
        a[rid] = True
        while len(a) > self._max_abandoned:
            a.popitem(last=False)

    def _receive(self, timeout_ms):
        timeout_ms = self.timeout_ms if timeout_ms is None else int(timeout_ms)
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        i = self._current
        while True:
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._socks[i].poll(left, zmq.POLLIN):
                raise TimeoutError("%s: no reply within %d ms" % (self.endpoints[i], timeout_ms))
            reply = self._read(i)
            rid = reply.get("id")
            if rid and self._abandoned[i].pop(rid, None):
                continue  # a late answer to a call given up on this endpoint
            self.last_endpoint = self.endpoints[i]
            return reply

    def _call(self, request_id, payload, resend=None):
        """Sends and waits for the reply to request_id, failing over on a timeout (see the class
        comment); replies to other ids (late answers to calls that timed out earlier) are
        dropped. A reply without an id answers this call: the node could not read the id of the
        one request outstanding. resend: makes the payload of the attempts after the first (a
        route request marked retry), called at the first failover only; else payload again."""
        n = len(self._socks)
        start = self._current
        sent = []
        poller = zmq.Poller()
        for attempt in range(self.max_attempts):
            i = (start + attempt) % n
            if attempt:
                self.failovers += 1
            deadline = time.monotonic() + self.timeout_ms / 1000.0
            try:
                if attempt and callable(resend):
                    resend = resend()  # made once, at the first failover
                self._send_on(i, resend if attempt and resend is not None else payload,
                              self.timeout_ms)
                if i not in sent:
                    sent.append(i)
                    poller.register(self._socks[i], zmq.POLLIN)
            except TimeoutError:
                pass
            while sent:
                left = int((deadline - time.monotonic()) * 1000)
                if left <= 0:
                    break
                ready = dict(poller.poll(left))
                if not ready:
                    break
                for j in sent:
                    if self._socks[j] not in ready:
                        continue
                    reply = self._read(j)
                    rid = reply.get("id")
                    if rid == request_id or not rid:
                        for k in sent:
                            if k != j:
                                self._abandon(k, request_id)
                        self._current = j
                        self.last_endpoint = self.endpoints[j]
                        return reply
                    self._abandoned[j].pop(rid, None)
        for k in sent:
            self._abandon(k, request_id)
        self._current = (start + self.max_attempts) % n
        raise self._no_reply()


class RouteReplySurfacing:
    """What a route client does with every route_reply, shared with the asyncio client
    (eldr_client_aio.py): the reply always has `fallback` and `warnings` keys, they are counted
    (.fallback_replies, .warned_replies), and each warning code is logged on the "eldr_client"
    logger at most once per 10 s. Needs self.last_endpoint."""

    def _init_surfacing(self):
        self.warned_replies = 0     # route replies that carried warnings
        self.fallback_replies = 0   # decisions a locality policy made by load only
        self._warned_at = {}        # warning code -> time.monotonic() of its last log line

    def _surface(self, reply):
        # The node's warnings are never silent: the reply always has both keys, and each warning
        # code is logged at most once per 10 s (a misconfigured prefill sends many requests).
        if reply.get("type") != "route_reply":
            return reply
        reply.setdefault("fallback", "")
        reply.setdefault("warnings", [])
        if reply["fallback"] is None:
            reply["fallback"] = ""
        if reply["warnings"] is None:
            reply["warnings"] = []
        if reply["fallback"]:
            self.fallback_replies += 1
        if reply["warnings"]:
            self.warned_replies += 1
            now = time.monotonic()
            for w in reply["warnings"]:
                code = str(w).split(":", 1)[0]
                last = self._warned_at.get(code)
                if last is not None and now - last < 10.0:
                    continue
                if last is not None or len(self._warned_at) < 64:
                    self._warned_at[code] = now
                _log.warning("eldr node %s: %s", self.last_endpoint, w)
        return reply


class RouteClient(RouteReplySurfacing, _Client):
    """A prefill worker's connection to the node's route endpoint."""

    def __init__(self, endpoints, timeout_ms=2000, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, ("route_reply", "error_reply"), context,
                         max_attempts, server_public_key, public_key, secret_key)
        self._init_surfacing()

    def route(self, request_id, model, blocks, counts=None, label=None, explain=False,
              cached_blocks=None):
        """Where to decode this request: the route_reply dict. Raises EldrError, TimeoutError.
        A failover's resend is marked retry (docs/cluster.md, "Retries: ask, don't broadcast")."""
        def resend():  # encoded only if a failover happens: counts can be megabytes
            return route_request(request_id, model, blocks, counts, label, explain,
                                 cached_blocks, retry=True)
        reply = self._call(str(request_id), route_request(request_id, model, blocks, counts, label,
                                                          explain, cached_blocks), resend)
        if reply["type"] == "error_reply":
            raise error_from(reply)
        return self._surface(reply)

    def send(self, request_id, model, blocks, counts=None, label=None, explain=False,
             cached_blocks=None):
        """Pipelined: sends the request and returns at once; the answer comes from receive()."""
        self._send(route_request(request_id, model, blocks, counts, label, explain, cached_blocks))

    def receive(self, timeout_ms=None):
        """The next reply to arrive, route_reply or error_reply (not raised; see reply["type"])."""
        return self._surface(self._receive(timeout_ms))


class WorkerClient(LoadReports, _Client):
    """A decode worker's (or publisher's) connection to the node's worker endpoint."""

    def __init__(self, endpoints, timeout_ms=2000, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, ("worker_ack", "error_reply"), context,
                         max_attempts, server_public_key, public_key, secret_key)
        self._seq = 0

    def _worker_call(self, message):
        rid = self.next_id()
        return worker_ack(self._call(rid, worker_request(rid, message)))

    def register(self, model, worker, endpoint, capacity=0, metrics_url=None):
        """Announces decode worker `worker` (its index in the model's pool) and its KV endpoint;
        metrics_url (vLLM's /metrics, http://) makes the node scrape the worker's load instead of
        waiting for report_load (docs/vllm.md, "Load from vLLM's /metrics")."""
        return self._worker_call(
            worker_register_message(model, worker, endpoint, capacity, metrics_url))

    def report_load(self, model, worker, in_flight, running=0, waiting=0, kv_usage=0.0, seq=None):
        """The worker's own load. The node ignores a report older than one it applied, so seq
        must increase per worker, also across restarts of the worker: the default is the wall
        clock in microseconds (kept strictly increasing within this client)."""
        return self._worker_call(self._load_report_message(model, worker, in_flight, running,
                                                           waiting, kv_usage, seq))

    def finished(self, model, worker, request_ids):
        """Requests the worker completed or aborted."""
        return self._worker_call(finished_message(model, worker, request_ids))

    def drain(self, model, worker, drain=True):
        """Stop (drain=True) or resume (False) receiving requests; those in flight finish."""
        return self._worker_call(worker_drain_message(model, worker, drain))

    def register_publisher(self, model, endpoint, replay_endpoint=""):
        """A vLLM KV-event publisher (PUB endpoint, optional replay ROUTER) for the cache."""
        return self._worker_call(publisher_register_message(model, endpoint, replay_endpoint))


class AdminClient(_Client):
    """An operator's connection to the node's admin endpoint (docs/protocol.md section 5)."""

    def __init__(self, endpoints, timeout_ms=5000, context=None, max_attempts=None,
                 server_public_key=None, public_key=None, secret_key=None):
        super().__init__(endpoints, timeout_ms, ("admin_reply", "error_reply"), context,
                         max_attempts, server_public_key, public_key, secret_key)

    def call(self, command, /, **args):
        """Runs one command; its result (any value; bytes for centroids.export). Raises
        EldrError when the node refuses it, TimeoutError when it does not answer."""
        rid = self.next_id()
        return admin_result(self._call(rid, admin_request(rid, command, args)))


if __name__ == "__main__":
    sys.stderr.write(__doc__)
    sys.exit(2)
