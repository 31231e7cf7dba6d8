#!/usr/bin/python3
"""eldr_trace: eldr-trace files (recorded expert routing of MoE requests) in Python.

The format is specified in shared/formats/eldr-trace.md; core/formats/trace.cpp is the C++ reader that
eldr-fit, eldr-sim and eldr-loadgen use. This module writes files that reader accepts and reads
them back with the same rules, for Python tools (eldr-record) and tests.

    geometry = Geometry(layers=26, experts=64, top_k=6)
    req = TraceRequest(id="r1", label="law", prompt_tokens=P, output_tokens=O, experts=ids)
    write_trace("my.eldrtrace", "my-model", geometry, "recorded by ...", [req, ...])
    trace = read_trace("my.eldrtrace")      # Trace(model_name, geometry, source, requests)

`experts` is token-major: choice r of token t at MoE layer l is element (t * L + l) * k + r;
tokens 0..P-1 are the prompt, P..P+O-1 the generated tokens. It may be given as bytes (one id per
byte) or as any integer numpy array of (P + O) * L * k elements (any shape).

Versions: version 1 holds one byte per id (E <= 256), version 2 a little-endian uint16 per id
(E <= 4,096, L * E <= 2^20), as docs/trace-format.md of the wide-ids work (branch i13-wide)
defines them. encode_trace writes version 1 whenever E <= 256, so such files stay readable by
every reader, and version 2 only for larger models; decode_trace reads both.

Requirements: Debian's python3-msgpack and python3-numpy.
"""
import dataclasses
import os

import msgpack
import numpy as np

FORMAT = "eldr-trace"
VERSION_1, VERSION_2 = 1, 2
MAX_EXPERTS_V1 = 256       # one byte per id
MAX_EXPERTS = 4096         # core/geometry.hpp's bounds, checked by the C++ reader
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20        # layers * experts
MAX_BIN = (1 << 32) - 1    # the largest MessagePack bin


class TraceError(ValueError):
    """A trace that breaks the format; the message names the request, token and layer at fault."""


@dataclasses.dataclass(frozen=True)
class Geometry:
    layers: int    # MoE layers only (dense layers are not recorded)
    experts: int   # routed experts per layer (shared experts are not recorded)
    top_k: int     # experts each token picks per layer

    def check(self, version=None):
        """Raises TraceError unless the geometry is valid (for `version` when given)."""
        for name in ("layers", "experts", "top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise TraceError("model.%s must be an integer, got %r" % (name, v))
        if not 1 <= self.layers <= MAX_LAYERS:
            raise TraceError("model.layers must be in 1..%d, got %d" % (MAX_LAYERS, self.layers))
        if not 1 <= self.top_k <= self.experts:
            raise TraceError("need 1 <= top_k <= experts, got top_k %d, experts %d"
                             % (self.top_k, self.experts))
        if self.experts > MAX_EXPERTS or self.layers * self.experts > MAX_WIDTH:
            raise TraceError("model.experts %d: at most %d experts and layers * experts <= %d"
                             % (self.experts, MAX_EXPERTS, MAX_WIDTH))
        if version == VERSION_1 and self.experts > MAX_EXPERTS_V1:
            raise TraceError("%d experts in a version 1 file, whose one-byte ids name at most "
                             "%d" % (self.experts, MAX_EXPERTS_V1))

    @property
    def version(self):
        """The version a writer uses for this model: 1 when every id fits a byte."""
        return VERSION_1 if self.experts <= MAX_EXPERTS_V1 else VERSION_2


@dataclasses.dataclass
class TraceRequest:
    id: str
    label: str
    prompt_tokens: int
    output_tokens: int
    experts: object          # bytes or an integer numpy array, token-major
    arrival_s: float = None  # optional

    def ids(self):
        """The expert ids as a flat numpy array (a view when experts is bytes)."""
        if isinstance(self.experts, (bytes, bytearray, memoryview)):
            return np.frombuffer(self.experts, dtype=np.uint8)
        return np.asarray(self.experts).reshape(-1)


@dataclasses.dataclass
class Trace:
    model_name: str
    geometry: Geometry
    source: str
    requests: list


def _name(index, req_id):
    return "request %d (id %r)" % (index, req_id)


def validate_request(geometry, req, index=0):
    """Raises TraceError unless req fits geometry: prompt_tokens >= 1, exactly (P + O) * L * k
    ids, every id < E, the k ids of one token at one layer distinct."""
    where = _name(index, req.id)
    if not isinstance(req.id, str) or not req.id:
        raise TraceError("%s: id must be a non-empty string" % where)
    if not isinstance(req.label, str):
        raise TraceError("%s: label must be a string" % where)
    for key in ("prompt_tokens", "output_tokens"):
        v = getattr(req, key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v >= 1 << 32:
            raise TraceError("%s: %s must be an integer in 0..2^32-1, got %r" % (where, key, v))
    if req.prompt_tokens < 1:
        raise TraceError("%s: prompt_tokens must be >= 1, got 0" % where)
    if req.arrival_s is not None:
        a = req.arrival_s
        if not isinstance(a, (int, float)) or isinstance(a, bool) or not (0 <= a < float("inf")):
            raise TraceError("%s: arrival_s must be a finite number >= 0, got %r" % (where, a))
    g = geometry
    tokens = req.prompt_tokens + req.output_tokens
    expected = tokens * g.layers * g.top_k
    if expected * (1 if g.version == VERSION_1 else 2) > MAX_BIN:
        raise TraceError("%s: experts would need %d bytes, more than a MessagePack bin holds"
                         % (where, expected))
    ids = req.ids()
    if not np.issubdtype(ids.dtype, np.integer):
        raise TraceError("%s: expert ids must be integers, got %s" % (where, ids.dtype))
    if ids.size != expected:
        raise TraceError("%s: experts has %d ids, expected (prompt_tokens + output_tokens) * "
                         "layers * top_k = (%d + %d) * %d * %d = %d"
                         % (where, ids.size, req.prompt_tokens, req.output_tokens, g.layers,
                            g.top_k, expected))
    if ids.size == 0:
        return
    grid = ids.reshape(tokens, g.layers, g.top_k)
    bad = np.argwhere((grid < 0) | (grid >= g.experts))
    if bad.size:
        t, l, r = (int(x) for x in bad[0])
        raise TraceError("%s: %s: expert id %d is outside 0..%d"
                         % (where, _token_name(req, t, l), int(grid[t, l, r]), g.experts - 1))
    if g.top_k > 1:
        ordered = np.sort(grid, axis=2)
        dup = np.argwhere(ordered[:, :, 1:] == ordered[:, :, :-1])
        if dup.size:
            t, l, r = (int(x) for x in dup[0])
            raise TraceError("%s: %s: expert id %d chosen twice among its top_k"
                             % (where, _token_name(req, t, l), int(ordered[t, l, r])))


def _token_name(req, t, l):
    kind = ("prompt token %d" % t if t < req.prompt_tokens
            else "output token %d" % (t - req.prompt_tokens))
    return "token %d (%s), layer %d" % (t, kind, l)


def encode_trace(model_name, geometry, source, requests):
    """The bytes of one eldr-trace file: version 1 when E <= 256, else version 2. Validates
    everything first (TraceError)."""
    if not isinstance(model_name, str):
        raise TraceError("model name must be a string")
    geometry.check()
    version = geometry.version
    id_type = np.uint8 if version == VERSION_1 else np.dtype("<u2")
    seen = {}
    out_requests = []
    for i, req in enumerate(requests):
        validate_request(geometry, req, i)
        if req.id in seen:
            raise TraceError("%s: id also used by request %d" % (_name(i, req.id), seen[req.id]))
        seen[req.id] = i
        m = {"id": req.id, "label": req.label, "prompt_tokens": req.prompt_tokens,
             "output_tokens": req.output_tokens}
        if req.arrival_s is not None:
            m["arrival_s"] = float(req.arrival_s)
        m["experts"] = req.ids().astype(id_type, copy=False).tobytes()
        out_requests.append(m)
    doc = {
        "format": FORMAT,
        "version": version,
        "model": {"name": model_name, "layers": geometry.layers, "experts": geometry.experts,
                  "top_k": geometry.top_k},
        "source": source,
        "requests": out_requests,
    }
    return msgpack.packb(doc, use_bin_type=True)


def write_atomically(path, data):
    """Writes data to path so that a reader sees either the old file or the whole new one: a
    temporary file in the same folder, fsync, rename over path, fsync of the folder."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_trace(path, model_name, geometry, source, requests):
    """Encodes (validating) and writes one trace atomically."""
    write_atomically(path, encode_trace(model_name, geometry, source, requests))


def decode_trace(data, name="trace"):
    """Parses and validates the bytes of one eldr-trace file (version 1 or 2); TraceError names
    what is wrong."""
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated exception types
        raise TraceError("%s: not a MessagePack document: %s" % (name, e)) from None
    if not isinstance(doc, dict):
        raise TraceError("%s: not a map" % name)
    if doc.get("format") != FORMAT:
        raise TraceError("%s: format must be %r, got %r" % (name, FORMAT, doc.get("format")))
    version = doc.get("version")
    if version not in (VERSION_1, VERSION_2) or isinstance(version, bool):
        raise TraceError("%s: unsupported version %r (this reader supports versions 1 and 2)"
                         % (name, version))
    model = doc.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        raise TraceError("%s: model must be a map with a string name" % name)
    geometry = Geometry(model.get("layers"), model.get("experts"), model.get("top_k"))
    try:
        geometry.check(version)
    except TraceError as e:
        raise TraceError("%s: %s" % (name, e)) from None
    source = doc.get("source", "")
    if not isinstance(source, str):
        raise TraceError("%s: source must be a string" % name)
    raw_requests = doc.get("requests")
    if not isinstance(raw_requests, list):
        raise TraceError("%s: requests must be an array" % name)
    requests, seen = [], set()
    for i, r in enumerate(raw_requests):
        if not isinstance(r, dict):
            raise TraceError("%s: request %d is not a map" % (name, i))
        experts = r.get("experts")
        if not isinstance(experts, bytes):
            raise TraceError("%s: request %d: experts must be a bin" % (name, i))
        if version == VERSION_2:
            if len(experts) % 2:
                raise TraceError("%s: request %d: a version 2 experts bin of odd length %d"
                                 % (name, i, len(experts)))
            experts = np.frombuffer(experts, dtype="<u2")
        req = TraceRequest(r.get("id"), r.get("label", ""), r.get("prompt_tokens"),
                           r.get("output_tokens"), experts, r.get("arrival_s"))
        try:
            validate_request(geometry, req, i)
        except TraceError as e:
            raise TraceError("%s: %s" % (name, e)) from None
        if req.id in seen:
            raise TraceError("%s: %s: duplicate id" % (name, _name(i, req.id)))
        seen.add(req.id)
        requests.append(req)
    return Trace(model["name"], geometry, source, requests)


def read_trace(path):
    with open(path, "rb") as f:
        return decode_trace(f.read(), os.fspath(path))
