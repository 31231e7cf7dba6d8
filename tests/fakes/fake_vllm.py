#!/usr/bin/python3
"""fake_vllm: a stand-in for one vLLM instance in eldr's tests (vLLM cannot run without GPUs).

It follows vLLM's public interfaces as docs/vllm.md records them from vLLM's source: the
OpenAI-compatible HTTP API (completions and chat completions, streaming or not), the NIXL
prefill/decode `kv_transfer_params` handshake, `--enable-return-routed-experts` (base64 `.npy`),
`/metrics` with vLLM's metric names, and the KV-event publisher (ZeroMQ, msgpack, sha256_cbor block
hashes). What it computes is fake: no model runs. Expert ids come from a REAL recorded eldr-trace
(see `prompt_expert_ids`), decode steps last as long as eldr's decode cost model says
(`decode_step_ms`, the formula of core/cost_model.hpp), and text is made up.

Tokenizer (fake, documented so tests can predict everything):
- a string prompt is split on whitespace; word w has token id crc32(utf-8 w) & 0x7fffffff;
- a prompt may also be a list of token ids (ints in [0, 2**31)), as vLLM accepts;
- a chat request's prompt is the whitespace words of its messages' text contents, in order;
- generated token j (0-based) is the word "o<j>", emitted as " o<j>".

Which trace request a prompt's experts come from: if the first word is `req:<id>`, the trace
request with that id (400 if there is none); else request number (first token id mod the number
of requests). Prompt token t gets that request's routing of prompt token (t mod P); generated token
j gets its output token (j mod O) (prompt token (j mod P) when O = 0). So prompts that share their
first token share the trace request, and prompts that share a prefix get the same ids for it, as
the real model would (routing is causal).

Run with Debian's /usr/bin/python3 (python3-aiohttp, python3-zmq, python3-msgpack, python3-numpy).
"""
import argparse
import asyncio
import base64
import collections
import hashlib
import io
import json
import os
import signal
import struct
import sys
import time
import uuid
import zlib

import msgpack
import numpy as np
from aiohttp import web

# ---------------------------------------------------------------------------------------------
# The decode cost model: ONE function, the formula and defaults of core/cost_model.hpp
# (decode_cost_params). tests/fakes/fake_vllm_logic_test.py reads the C++ header's defaults and
# checks these equal them.
DECODE_COST = {
    "base_ms": 6.5,
    "per_distinct_expert_ms": 0.0035,
    "per_sequence_ms": 0.01,
    "per_context_kilotoken_ms": 0.004,
}
# A prefill's duration: core/sim/simulator.hpp's sim_config prefill_base_ms / prefill_per_token_ms.
PREFILL_COST = {"prefill_base_ms": 20.0, "prefill_per_token_ms": 0.1}


def decode_step_ms(sequences, distinct_experts, context_tokens, cost=DECODE_COST):
    """Latency of one continuous-batching decode step (decode_cost_model::step_latency_ms)."""
    return (cost["base_ms"] + cost["per_distinct_expert_ms"] * distinct_experts +
            cost["per_sequence_ms"] * sequences +
            cost["per_context_kilotoken_ms"] * (context_tokens / 1000.0))


def prefill_ms(uncached_tokens, cost=PREFILL_COST):
    return cost["prefill_base_ms"] + cost["prefill_per_token_ms"] * uncached_tokens


def distinct_experts(step_ids):
    """Distinct (layer, expert) pairs summed over layers; step_ids: (batch, layers, top_k)."""
    if step_ids.shape[0] == 0:
        return 0
    total = 0
    for layer in range(step_ids.shape[1]):
        total += len(np.unique(step_ids[:, layer, :]))
    return total


# ---------------------------------------------------------------------------------------------
# The eldr-trace (../shared/formats/eldr-trace.md).
class TraceError(Exception):
    pass


class Trace:
    def __init__(self, name, layers, experts, top_k, requests):
        self.name, self.layers, self.experts, self.top_k = name, layers, experts, top_k
        self.requests = requests  # list of (id, prompt_tokens, output_tokens, ids (P+O, L, k))
        self.index = {r[0]: i for i, r in enumerate(requests)}

    @staticmethod
    def load(path):
        with open(path, "rb") as f:
            data = f.read()
        try:
            top = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as e:
            raise TraceError("%s: not a MessagePack map (%s)" % (path, e))
        return Trace.from_map(top, path)

    @staticmethod
    def from_map(top, path="<trace>"):
        def need(cond, what):
            if not cond:
                raise TraceError("%s: %s" % (path, what))
        need(isinstance(top, dict), "not a map")
        need(top.get("format") == "eldr-trace", "format is not \"eldr-trace\"")
        need(top.get("version") == 1, "version is not 1")
        m = top.get("model")
        need(isinstance(m, dict), "model is not a map")
        L, E, k = m.get("layers"), m.get("experts"), m.get("top_k")
        need(all(isinstance(v, int) for v in (L, E, k)), "model.layers/experts/top_k not ints")
        need(L >= 1 and 1 <= k <= E <= 256, "model geometry out of range")
        reqs = top.get("requests")
        need(isinstance(reqs, list) and reqs, "requests is not a non-empty list")
        out, seen = [], set()
        for i, r in enumerate(reqs):
            need(isinstance(r, dict), "request %d is not a map" % i)
            rid, P, O, ex = r.get("id"), r.get("prompt_tokens"), r.get("output_tokens"), r.get(
                "experts")
            need(isinstance(rid, str) and rid not in seen, "request %d: id missing or repeated" % i)
            need(isinstance(P, int) and P >= 1, "request %s: prompt_tokens" % rid)
            need(isinstance(O, int) and O >= 0, "request %s: output_tokens" % rid)
            need(isinstance(ex, bytes) and len(ex) == (P + O) * L * k,
                 "request %s: experts is not (P+O)*L*k bytes" % rid)
            ids = np.frombuffer(ex, dtype=np.uint8).reshape(P + O, L, k)
            need(int(ids.max()) < E, "request %s: an expert id >= experts" % rid)
            seen.add(rid)
            out.append((rid, P, O, ids))
        return Trace(str(m.get("name", "")), L, E, k, out)


# ---------------------------------------------------------------------------------------------
# The fake tokenizer and the prompt -> trace request mapping.
def word_token(word):
    return zlib.crc32(word.encode("utf-8")) & 0x7FFFFFFF


def output_word(j):
    return "o%d" % j


def tokenize(text):
    words = text.split()
    return words, [word_token(w) for w in words]


def pick_request(trace, words, token_ids):
    """Index of the trace request whose routing a prompt gets (see the module docstring)."""
    if words and words[0].startswith("req:"):
        rid = words[0][4:]
        if rid not in trace.index:
            raise ValueError("no trace request with id %r" % rid)
        return trace.index[rid]
    return token_ids[0] % len(trace.requests)


def prompt_expert_ids(trace, req, n):
    """(n, L, k) uint8: the routing of prompt tokens 0..n-1 (wrapping over the trace's prompt)."""
    _, P, _, ids = trace.requests[req]
    return ids[np.arange(n) % P]


def output_expert_ids(trace, req, j):
    """(L, k) uint8: the routing of generated token j."""
    _, P, O, ids = trace.requests[req]
    return ids[P + j % O] if O > 0 else ids[j % P]


def encode_routed_experts(rows, dense_layers=0):
    """vLLM's `routed_experts` string: base64 of a .npy of shape (tokens, layers, top_k), uint8.

    Leading dense layers (DeepSeek's first_k_dense_replace) are rows vLLM never writes: zeros.
    """
    rows = np.asarray(rows, dtype=np.uint8)
    if dense_layers:
        pad = np.zeros((rows.shape[0], dense_layers, rows.shape[2]), dtype=np.uint8)
        rows = np.concatenate([pad, rows], axis=1)
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(rows), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# ---------------------------------------------------------------------------------------------
# vLLM's sha256_cbor prefix-caching hash (vllm/utils/hashing.py, vllm/v1/core/kv_cache_utils.py):
# sha256(cbor2.dumps((parent_hash, tuple(tokens), extra_keys), canonical=True)). The values hashed
# are arrays, byte strings, unsigned ints, text strings and null; their canonical CBOR (RFC 8949
# section 4.2.1: shortest argument encoding, definite lengths) is encoded here.
def _cbor_head(major, n):
    if n < 24:
        return bytes([major << 5 | n])
    for info, fmt, limit in ((24, ">B", 1 << 8), (25, ">H", 1 << 16), (26, ">I", 1 << 32),
                             (27, ">Q", 1 << 64)):
        if n < limit:
            return bytes([major << 5 | info]) + struct.pack(fmt, n)
    raise ValueError("CBOR argument too large")


def cbor_encode(x):
    if x is None:
        return b"\xf6"
    if isinstance(x, bool):
        return b"\xf5" if x else b"\xf4"
    if isinstance(x, int):
        return _cbor_head(0, x) if x >= 0 else _cbor_head(1, -1 - x)
    if isinstance(x, bytes):
        return _cbor_head(2, len(x)) + x
    if isinstance(x, str):
        b = x.encode("utf-8")
        return _cbor_head(3, len(b)) + b
    if isinstance(x, (list, tuple)):
        return _cbor_head(4, len(x)) + b"".join(cbor_encode(v) for v in x)
    raise TypeError("cbor_encode: unsupported type %s" % type(x).__name__)


def sha256_cbor(x):
    return hashlib.sha256(cbor_encode(x)).digest()


def none_hash(seed):
    """vLLM's NONE_HASH: sha256_cbor(PYTHONHASHSEED) when the seed is set, else 32 random bytes."""
    return sha256_cbor(seed) if seed is not None else os.urandom(32)


def block_hashes(token_ids, block_size, root):
    """The sha256_cbor hashes (32-byte digests) of a sequence's full blocks."""
    out, parent = [], root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = sha256_cbor((parent, tuple(token_ids[start:start + block_size]), None))
        out.append(parent)
    return out


def external_hash(digest):
    """The form published in KV events by default: the digest's low 64 bits, big-endian."""
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


# ---------------------------------------------------------------------------------------------
# KV events in the shape of vLLM's newest golden payloads (../shared/reference/vllm-kv-vectors,
# "latest"): the batch an array [ts (float64), events, dp_rank], each event a map whose first key
# is "type", fields in declaration order, defaulted fields omitted while at their default.
def block_stored_event(hashes, parent, token_ids, block_size, group_idx=0,
                       kind="full_attention"):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": token_ids, "block_size": block_size, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [None] * len(hashes), "group_idx": group_idx,
            "kv_cache_spec_kind": kind}


def block_removed_event(hashes, group_idx=0):
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU",
            "group_idx": group_idx}


def encode_kv_batch(ts, events, dp_rank=0):
    return msgpack.packb([float(ts), events, dp_rank], use_bin_type=True, use_single_float=False)


class KvEventPublisher:
    """vLLM's ZmqEventPublisher wire behaviour: bind or connect as vLLM decides, frames
    (topic, seq 8-byte big-endian, payload), optional replay ROUTER with a bounded buffer."""

    def __init__(self, endpoint, topic, replay_endpoint, buffer_steps=10000):
        import zmq
        import zmq.asyncio
        self.zmq = zmq
        # A plain socket for PUB: a NOBLOCK send completes (or fails with Again) on the spot, so
        # the event loop never waits on it; the replay ROUTER is served by an asyncio task.
        self.ctx = zmq.Context()
        self.actx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 100000)
        self.pub.setsockopt(zmq.LINGER, 0)
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self.pub.bind(endpoint)
        else:
            self.pub.connect(endpoint)
        self.topic = topic.encode("utf-8")
        self.seq = 0
        self.buffer = collections.deque(maxlen=buffer_steps)
        self.dropped = 0
        self.replay = None
        if replay_endpoint:
            self.replay = self.actx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(replay_endpoint)

    def publish(self, events):
        payload = encode_kv_batch(time.time(), events, 0)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        try:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload],
                                    flags=self.zmq.NOBLOCK)
        except self.zmq.Again:
            self.dropped += 1

    async def serve_replay(self):
        while self.replay is not None:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM logs "Invalid replay request" and ignores it
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= start_seq:
                    await self.replay.send_multipart([client, b"", seq.to_bytes(8, "big"),
                                                      payload])
            await self.replay.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True),
                                              b""])

    def close(self):
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)
        self.actx.term()
        self.ctx.term()


# ---------------------------------------------------------------------------------------------
# A bounded paged KV cache with prefix caching, publishing BlockStored / BlockRemoved.
class KvCache:
    def __init__(self, num_blocks, block_size, root_hash, publisher):
        self.num_blocks, self.block_size, self.root = num_blocks, block_size, root_hash
        self.free = num_blocks            # blocks neither used nor cached
        self.cached = collections.OrderedDict()  # digest -> ref count (LRU order when ref == 0)
        self.used_private = 0             # blocks held by requests, not in the prefix cache
        self.publisher = publisher
        self.evictions = 0

    def usage(self):
        in_use = self.used_private + sum(1 for r in self.cached.values() if r > 0)
        return in_use / self.num_blocks if self.num_blocks else 0.0

    def _available(self):
        return self.free + sum(1 for r in self.cached.values() if r == 0)

    def _take(self, n):
        """Take n blocks, evicting least recently used unreferenced cached blocks first."""
        removed = []
        while self.free < n:
            victim = next((h for h, r in self.cached.items() if r == 0), None)
            if victim is None:
                break
            del self.cached[victim]
            self.free += 1
            self.evictions += 1
            removed.append(victim)
        if removed and self.publisher:
            self.publisher.publish([block_removed_event([external_hash(h) for h in removed])])
        self.free -= n

    def allocate(self, prompt_ids, total_tokens):
        """Reserve blocks for a sequence; returns (allocation, cached prompt tokens) or None when the
        cache cannot hold it now. Prompt blocks already cached are shared (a prefix-cache hit)."""
        hashes = block_hashes(prompt_ids, self.block_size, self.root)
        hits = 0
        for h in hashes:
            if h not in self.cached:
                break
            hits += 1
        need = -(-total_tokens // self.block_size) - hits
        if need > self._available() - 0:
            return None
        for h in hashes[:hits]:
            self.cached[h] += 1
            self.cached.move_to_end(h)
        self._take(need)
        self.used_private += need
        return {"hashes": hashes, "shared": hashes[:hits], "private": need,
                "tokens": prompt_ids}, hits * self.block_size

    def prefill_done(self, alloc):
        """The prompt's full blocks become cached (BlockStored for the new ones)."""
        new = alloc["hashes"][len(alloc["shared"]):]
        if not new:
            return
        bs = self.block_size
        first = len(alloc["shared"])
        stored = []
        for h in new:
            if h in self.cached:  # another sequence stored it meanwhile: keep our private copy
                continue
            self.cached[h] = 1
            stored.append(h)
        moved = len(stored)
        self.used_private -= moved
        alloc["shared"] = alloc["shared"] + stored
        alloc["private"] -= moved
        if not stored or not self.publisher:
            return
        # One BlockStored per run of consecutive newly stored blocks, as vLLM batches them: the
        # event's parent is the block before the run, each next block's parent the previous one.
        stored_set, events, run = set(stored), [], []
        for i in range(first, len(alloc["hashes"]) + 1):
            h = alloc["hashes"][i] if i < len(alloc["hashes"]) else None
            if h is not None and h in stored_set:
                run.append(i)
                continue
            if run:
                parent = alloc["hashes"][run[0] - 1] if run[0] > 0 else None
                events.append(block_stored_event(
                    [external_hash(alloc["hashes"][j]) for j in run],
                    None if parent is None else external_hash(parent),
                    alloc["tokens"][run[0] * bs:(run[-1] + 1) * bs], bs))
                run = []
        self.publisher.publish(events)

    def release(self, alloc):
        for h in alloc["shared"]:
            if h in self.cached:
                self.cached[h] -= 1
                self.cached.move_to_end(h)
        self.used_private -= alloc["private"]
        self.free += alloc["private"]
        alloc["shared"], alloc["private"] = [], 0


# ---------------------------------------------------------------------------------------------
class ApiError(Exception):
    def __init__(self, status, message, err_type="BadRequestError", param=None):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param

    def body(self):
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}


class Sequence:
    def __init__(self, rid, prompt_ids, req, max_tokens, remote_kv):
        self.rid, self.prompt_ids, self.req, self.max_tokens = rid, prompt_ids, req, max_tokens
        self.remote_kv = remote_kv        # prompt KV arrived from a prefill instance
        self.generated = 0
        self.out = asyncio.Queue()        # one item per generated token, then None
        self.alloc = None
        self.cached_tokens = 0
        self.aborted = False
        self.hold_blocks = False          # a prefill whose KV a decode will read


class Engine:
    """Continuous batching over an injected time scale: prefill steps for newly admitted
    sequences, then decode steps costed by decode_step_ms over the batch's trace expert ids."""

    def __init__(self, trace, kv, max_batch, time_scale, max_waiting):
        self.trace, self.kv, self.max_batch, self.time_scale = trace, kv, max_batch, time_scale
        self.max_waiting = max_waiting
        self.waiting = collections.deque()
        self.running = []
        self.wake = asyncio.Event()
        self.counters = collections.Counter()
        self.step_log = collections.deque(maxlen=1000)  # (batch, distinct, step_ms) per step

    def submit(self, seq):
        if len(self.waiting) >= self.max_waiting:
            self.counters["rejected_queue_full"] += 1
            raise ApiError(503, "the fake's waiting queue is full (%d)" % self.max_waiting,
                           "ServiceUnavailableError")
        self.waiting.append(seq)
        self.wake.set()

    def abort(self, seq):
        if seq.aborted:
            return
        seq.aborted = True
        self.counters["aborted"] += 1
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        if seq.alloc:
            self.kv.release(seq.alloc)
            seq.alloc = None

    async def sleep_ms(self, ms):
        await asyncio.sleep(ms * self.time_scale / 1000.0)

    async def run(self):
        while True:
            if not self.waiting and not self.running:
                self.wake.clear()
                await self.wake.wait()
            admitted = []
            while self.waiting and len(self.running) < self.max_batch:
                seq = self.waiting[0]
                total = len(seq.prompt_ids) + seq.max_tokens
                got = self.kv.allocate(seq.prompt_ids, total)
                if got is None:
                    if self.running:
                        break
                    self.waiting.popleft()  # larger than the whole cache: vLLM rejects it
                    self.counters["rejected_too_large"] += 1
                    seq.out.put_nowait(ApiError(400, "prompt + max_tokens exceed the KV cache"))
                    continue
                self.waiting.popleft()
                seq.alloc, seq.cached_tokens = got
                admitted.append(seq)
            if admitted:
                uncached = sum(0 if s.remote_kv else len(s.prompt_ids) - s.cached_tokens
                               for s in admitted)
                await self.sleep_ms(prefill_ms(uncached) if uncached else 0.0)
                for s in admitted:
                    if s.aborted:
                        continue
                    self.kv.prefill_done(s.alloc)
                    self.counters["prompt_tokens"] += len(s.prompt_ids)
                    if s.remote_kv:
                        self.running.append(s)  # its first token comes from a decode step
                    else:
                        self._emit(s)            # the prefill step samples the first token
                        if s.generated < s.max_tokens:
                            self.running.append(s)
                continue
            if not self.running:
                continue
            batch = self.running
            step = np.stack([output_expert_ids(self.trace, s.req, s.generated) for s in batch])
            d = distinct_experts(step)
            ctx = sum(len(s.prompt_ids) + s.generated for s in batch)
            ms = decode_step_ms(len(batch), d, ctx)
            self.step_log.append((len(batch), d, ms))
            # Token-weighted step time, for TPOT in model time: each sequence in the batch waits
            # the whole step for its token (integer microseconds, so the counters stay ints).
            self.counters["decode_seq_steps"] += len(batch)
            self.counters["decode_seq_step_us"] += int(round(ms * 1000)) * len(batch)
            await self.sleep_ms(ms)
            for s in list(self.running):
                self._emit(s)
                if s.generated >= s.max_tokens:
                    self.running.remove(s)

    def _emit(self, s):
        j = s.generated
        s.generated += 1
        self.counters["generation_tokens"] += 1
        s.out.put_nowait(j)
        if s.generated >= s.max_tokens:
            if not s.hold_blocks:
                self.kv.release(s.alloc)
                s.alloc = None
            s.out.put_nowait(None)


# ---------------------------------------------------------------------------------------------
class FakeVllm:
    def __init__(self, args, trace):
        self.args, self.trace = args, trace
        self.model = args.model
        self.engine_id = args.engine_id or str(uuid.uuid4())
        seed = args.python_hash_seed if args.python_hash_seed is not None else os.environ.get(
            "PYTHONHASHSEED")
        self.publisher = None
        if args.kv_events_endpoint:
            self.publisher = KvEventPublisher(args.kv_events_endpoint, args.kv_events_topic,
                                              args.kv_events_replay_endpoint)
        self.kv = KvCache(args.num_gpu_blocks, args.block_size, none_hash(seed), self.publisher)
        self.engine = Engine(trace, self.kv, args.max_num_seqs, args.time_scale,
                             args.max_waiting)
        self.pending = collections.OrderedDict()  # prefill request id -> (seq, expiry)
        self.records = collections.deque(maxlen=10000)  # what was served, for tests
        self.port = None
        self.created = int(time.time())

    # -- helpers ------------------------------------------------------------------------------
    def counters(self):
        return self.engine.counters

    def _prompt(self, body, chat):
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ApiError(400, "messages must be a non-empty list", param="messages")
            words = []
            for m in msgs:
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise ApiError(400, "each message must be an object with a role",
                                   param="messages")
                c = m.get("content")
                if isinstance(c, str):
                    words += c.split()
                elif isinstance(c, list):
                    for part in c:
                        if not (isinstance(part, dict) and part.get("type") == "text" and
                                isinstance(part.get("text"), str)):
                            raise ApiError(400, "the fake supports text content parts only",
                                           param="messages")
                        words += part["text"].split()
                elif c is not None:
                    raise ApiError(400, "message content must be a string or a list",
                                   param="messages")
            return words, [word_token(w) for w in words]
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]
        if isinstance(p, str):
            words, ids = tokenize(p)
        elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) and
                                         0 <= t < 2**31 for t in p):
            words, ids = [], list(p)
        else:
            raise ApiError(400, "prompt must be a string or a list of token ids in [0, 2**31)",
                           param="prompt")
        return words, ids

    def _check_common(self, body, chat):
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        model = body.get("model")
        if model is not None:
            if not isinstance(model, str):
                raise ApiError(400, "model must be a string", param="model")
            if model != self.model:
                raise ApiError(404, "The model `%s` does not exist." % model, "NotFoundError",
                               param="model")
        stream = body.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            raise ApiError(400, "stream must be a boolean", param="stream")
        if body.get("stream_options") is not None:
            if not stream:
                raise ApiError(400, "Stream options can only be defined when `stream=True`.",
                               param="stream_options")
            if not isinstance(body["stream_options"], dict):
                raise ApiError(400, "stream_options must be an object", param="stream_options")
        key = "max_completion_tokens" if chat and body.get(
            "max_completion_tokens") is not None else "max_tokens"
        mt = body.get(key)
        if mt is None and not chat:
            mt = 16  # CompletionRequest.max_tokens default; chat: what the context leaves
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            raise ApiError(400, "%s must be an integer >= 1" % key, param=key)
        n = body.get("n", 1)
        if n not in (1, None):
            raise ApiError(400, "the fake supports n = 1 only", param="n")
        if body.get("echo"):
            raise ApiError(400, "the fake does not support echo", param="echo")
        ktp = body.get("kv_transfer_params")
        if ktp is not None and not isinstance(ktp, dict):
            raise ApiError(400, "kv_transfer_params must be an object or null",
                           param="kv_transfer_params")
        rtk = body.get("return_token_ids")
        if rtk is not None and not isinstance(rtk, bool):
            raise ApiError(400, "return_token_ids must be a boolean", param="return_token_ids")
        return stream, mt, ktp

    @staticmethod
    def _valid_remote(ktp):
        return (isinstance(ktp, dict) and ktp.get("do_remote_prefill") is True and
                bool(ktp.get("remote_block_ids")) and
                all(k in ktp for k in ("remote_engine_id", "remote_request_id", "remote_host",
                                       "remote_port")))

    async def _pull_kv(self, ktp, prompt_ids):
        """The NIXL read: fetch the prefill's record from its side channel (the prefill fake's
        HTTP port) and let it free the blocks. Returns an error string or None."""
        import aiohttp
        host, port = ktp["remote_host"], ktp["remote_port"]
        if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536:
            return "remote_host/remote_port invalid"
        url = "http://%s:%d/fake/nixl/pull" % (host, port)
        try:
            timeout = aiohttp.ClientTimeout(total=self.args.kv_pull_timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                async with s.post(url, json={"engine_id": ktp["remote_engine_id"],
                                             "request_id": ktp["remote_request_id"]}) as r:
                    got = await r.json(content_type=None)
                    if r.status != 200:
                        return "prefill %s:%d refused the transfer: %s" % (
                            host, port, got.get("error", got))
        except Exception as e:  # unreachable prefill: the NIXL handshake fails
            return "prefill %s:%d unreachable: %s" % (host, port, e)
        if got.get("prompt_token_ids") != prompt_ids:
            return "the prefill's prompt (%d tokens) is not this request's (%d tokens)" % (
                len(got.get("prompt_token_ids") or []), len(prompt_ids))
        return None

    def _expire_pending(self):
        now = time.monotonic()
        while self.pending:
            rid, (seq, expiry) = next(iter(self.pending.items()))
            if expiry > now and len(self.pending) <= self.args.max_pending_transfers:
                break
            self.pending.popitem(last=False)
            self.counters()["kv_transfers_expired"] += 1
            if seq.alloc:
                self.kv.release(seq.alloc)
                seq.alloc = None

    # -- handlers -----------------------------------------------------------------------------
    async def completions(self, request):
        return await self._generate(request, chat=False)

    async def chat_completions(self, request):
        return await self._generate(request, chat=True)

    async def _generate(self, request, chat):
        try:
            try:
                body = await request.json()
            except Exception:
                raise ApiError(400, "the request body is not valid JSON")
            stream, max_tokens, ktp = self._check_common(body, chat)
            words, prompt_ids = self._prompt(body, chat)
            if not prompt_ids:
                raise ApiError(400, "Either prompt or prompt_embeds must be provided and "
                               "non-empty.", param="prompt")
            if max_tokens is None:
                max_tokens = max(1, self.args.max_model_len - len(prompt_ids))
            if len(prompt_ids) + max_tokens > self.args.max_model_len:
                raise ApiError(400, "This model's maximum context length is %d tokens. However, "
                               "you requested %d tokens (%d in the messages, %d in the "
                               "completion)." % (self.args.max_model_len,
                                                 len(prompt_ids) + max_tokens, len(prompt_ids),
                                                 max_tokens))
            try:
                req = pick_request(self.trace, words, prompt_ids)
            except ValueError as e:
                raise ApiError(400, str(e), param="prompt")
            base = request.headers.get("X-Request-Id") or body.get("request_id") or \
                uuid.uuid4().hex
            if not isinstance(base, str) or len(base) > 256:
                raise ApiError(400, "request id must be a string of at most 256 characters")
            rid = ("chatcmpl-%s" if chat else "cmpl-%s-0") % base
            role = self.args.role
            is_prefill = bool(ktp and ktp.get("do_remote_decode"))
            remote_kv = False
            kv_error = None
            if is_prefill:
                if role == "decode":
                    raise ApiError(400, "this instance is a decode instance (kv_consumer): it "
                                   "does not serve do_remote_decode requests")
                self.counters()["prefill_requests"] += 1
            elif role in ("decode", "both"):
                if self._valid_remote(ktp):
                    kv_error = await self._pull_kv(ktp, prompt_ids)
                    if kv_error:
                        self.counters()["kv_load_failures"] += 1
                    else:
                        remote_kv = True
                        self.counters()["decode_requests_with_kv_transfer"] += 1
                elif role == "decode":
                    self.counters()["decode_requests_without_kv_transfer"] += 1
                    if self.args.missing_kv_params == "refuse":
                        raise ApiError(400, "kv_transfer_params missing or invalid (%s): this "
                                       "fake decode instance refuses to recompute the prefill "
                                       "(vLLM would recompute it silently)" % (
                                           json.dumps(ktp)[:200]), param="kv_transfer_params")
            elif role == "prefill":
                self.counters()["prefill_requests_without_do_remote_decode"] += 1
            if kv_error and not stream:
                raise ApiError(500, "KV transfer failed: " + kv_error, "InternalServerError")
            self.records.append({"request_id": base, "role": "prefill" if is_prefill else
                                 ("decode" if remote_kv else "full"),
                                 "remote_engine_id": ktp.get("remote_engine_id") if ktp else None,
                                 "prompt_tokens": len(prompt_ids), "max_tokens": max_tokens,
                                 "trace_request": self.trace.requests[req][0],
                                 "kv_error": kv_error})
        except ApiError as e:
            self.counters()["errors_%d" % e.status] += 1
            return web.json_response(e.body(), status=e.status, dumps=_dumps)
        seq = Sequence(rid, prompt_ids, req, max_tokens, remote_kv)
        # NIXL keeps a finished prefill's blocks for the decode to read (delay_free_blocks); the
        # params only reach the proxy in a non-streaming response.
        seq.hold_blocks = is_prefill and not stream
        ctx = {"chat": chat, "rid": rid, "created": int(time.time()), "body": body,
               "prompt_ids": prompt_ids, "is_prefill": is_prefill, "kv_error": kv_error}
        if kv_error:  # streaming: vLLM's error arrives in-band, then [DONE]
            return await self._stream(request, None, ctx)
        try:
            self.engine.submit(seq)
        except ApiError as e:
            return web.json_response(e.body(), status=e.status, dumps=_dumps)
        try:
            if stream:
                return await self._stream(request, seq, ctx)
            return await self._whole(seq, ctx)
        except asyncio.CancelledError:
            self.engine.abort(seq)  # the client went away: abort upstream, free the KV
            raise

    def _routed_experts(self, seq):
        if not self.args.enable_return_routed_experts:
            return None
        n_prompt = len(seq.prompt_ids)
        rows = prompt_expert_ids(self.trace, seq.req, n_prompt)
        if seq.remote_kv:  # KV came over NIXL, the capture buffer rows did not: not routing data
            rows = np.zeros_like(rows)
        outs = [output_expert_ids(self.trace, seq.req, j) for j in range(seq.generated - 1)]
        if outs:
            rows = np.concatenate([rows, np.stack(outs)])
        return encode_routed_experts(rows, self.args.dense_layers)

    async def _collect(self, seq):
        tokens = []
        while True:
            item = await seq.out.get()
            if item is None:
                return tokens
            if isinstance(item, ApiError):
                raise item
            tokens.append(item)

    def _usage(self, seq, completion):
        # vLLM (completion/serving.py, cc139d8e): prompt_tokens_details is set only with
        # --enable-prompt-tokens-details and a nonzero num_cached_tokens, as
        # PromptTokenUsageInfo(cached_tokens=...) (engine/protocol.py, 040a2cc2).
        p = len(seq.prompt_ids)
        details = None
        if self.args.enable_prompt_tokens_details and seq.cached_tokens:
            details = {"cached_tokens": seq.cached_tokens}
        return {"prompt_tokens": p, "total_tokens": p + completion, "completion_tokens": completion,
                "prompt_tokens_details": details}

    async def _whole(self, seq, ctx):
        try:
            tokens = await self._collect(seq)
        except ApiError as e:
            return web.json_response(e.body(), status=e.status, dumps=_dumps)
        text = "".join(" " + output_word(j) for j in tokens)
        body = ctx["body"]
        rtk = bool(body.get("return_token_ids"))
        out_ids = [word_token(output_word(j)) for j in tokens]
        ktp_out = None
        if ctx["is_prefill"] and seq.hold_blocks:
            blocks = list(range(len(seq.alloc["hashes"]) + seq.alloc["private"])) if seq.alloc \
                else []
            ktp_out = {"do_remote_prefill": True, "do_remote_decode": False,
                       "remote_block_ids": [blocks], "remote_engine_id": self.engine_id,
                       "remote_request_id": seq.rid, "remote_host": self.args.host,
                       "remote_port": self.port, "tp_size": 1}
            self.pending[seq.rid] = (seq, time.monotonic() + self.args.kv_hold_s)
            self._expire_pending()
        routed = self._routed_experts(seq)
        if ctx["chat"]:
            resp = {"id": seq.rid, "object": "chat.completion", "created": ctx["created"],
                    "model": self.model,
                    "choices": [{"index": 0,
                                 "message": {"role": "assistant", "content": text,
                                             "refusal": None, "annotations": None,
                                             "audio": None, "function_call": None,
                                             "reasoning": None},
                                 "logprobs": None, "finish_reason": "length",
                                 "stop_reason": None,
                                 "token_ids": out_ids if rtk else None,
                                 "routed_experts": routed}],
                    "service_tier": None, "system_fingerprint": None,
                    "usage": self._usage(seq, len(tokens)), "prompt_logprobs": None,
                    "prompt_token_ids": ctx["prompt_ids"] if rtk else None,
                    "prompt_text": None, "kv_transfer_params": ktp_out,
                    "ec_transfer_params": None, "metrics": None}
        else:
            resp = {"id": seq.rid, "object": "text_completion", "created": ctx["created"],
                    "model": self.model,
                    "choices": [{"index": 0, "text": text, "logprobs": None,
                                 "finish_reason": "length", "stop_reason": None,
                                 "token_ids": out_ids if rtk else None,
                                 "prompt_logprobs": None,
                                 "prompt_token_ids": ctx["prompt_ids"] if rtk else None,
                                 "routed_experts": routed}],
                    "service_tier": None, "system_fingerprint": None,
                    "usage": self._usage(seq, len(tokens)), "kv_transfer_params": ktp_out,
                    "ec_transfer_params": None, "metrics": None}
        return web.json_response(resp, dumps=_dumps)

    async def _stream(self, request, seq, ctx):
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj):
            await resp.write(b"data: " + _dumps(obj).encode("utf-8") + b"\n\n")

        body, chat = ctx["body"], ctx["chat"]
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        rtk = bool(body.get("return_token_ids"))
        head = {"id": ctx["rid"], "object": "chat.completion.chunk" if chat else
                "text_completion", "created": ctx["created"], "model": self.model}
        if ctx["kv_error"]:
            await send({"error": {"message": "KV transfer failed: " + ctx["kv_error"],
                                  "type": "InternalServerError", "param": None, "code": 500}})
            await resp.write(b"data: [DONE]\n\n")
            return resp
        n = 0
        first = True
        try:
            if chat:
                await send(dict(head, choices=[{"index": 0, "delta": {"role": "assistant",
                                                                      "content": ""},
                                                "logprobs": None, "finish_reason": None}]))
            while True:
                item = await seq.out.get()
                if item is None:
                    break
                if isinstance(item, ApiError):
                    await send(item.body())
                    break
                n += 1
                last = n == seq.max_tokens
                word = " " + output_word(item)
                tid = word_token(output_word(item))
                if chat:
                    choice = {"index": 0, "delta": {"content": word}, "logprobs": None,
                              "finish_reason": "length" if last else None,
                              "stop_reason": None,
                              "token_ids": [tid] if rtk else None}
                    chunk = dict(head, choices=[choice])
                    if first and rtk:
                        chunk["prompt_token_ids"] = ctx["prompt_ids"]
                else:
                    choice = {"index": 0, "text": word, "logprobs": None,
                              "finish_reason": "length" if last else None, "stop_reason": None,
                              "prompt_token_ids": ctx["prompt_ids"] if (first and rtk) else None,
                              "token_ids": [tid] if rtk else None}
                    chunk = dict(head, choices=[choice])
                first = False
                await send(chunk)
            if include_usage:
                usage = self._usage(seq, n)
                if usage["prompt_tokens_details"] is None:  # the chunk is dumped with exclude_none
                    del usage["prompt_tokens_details"]
                await send(dict(head, choices=[], usage=usage))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.abort(seq)
            raise
        return resp

    async def nixl_pull(self, request):
        """The fake's NIXL side channel: a decode reads a held prefill and frees its blocks."""
        try:
            b = await request.json()
        except Exception:
            b = None
        if not isinstance(b, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        self._expire_pending()
        if b.get("engine_id") != self.engine_id:
            self.counters()["kv_pull_unknown_engine"] += 1
            return web.json_response({"error": "unknown engine id %r" % b.get("engine_id")},
                                     status=404)
        got = self.pending.pop(b.get("request_id"), None) if isinstance(
            b.get("request_id"), str) else None
        if got is None:
            self.counters()["kv_pull_unknown_request"] += 1
            return web.json_response({"error": "no held prefill %r (unknown, already read or "
                                      "expired)" % b.get("request_id")}, status=404)
        seq = got[0]
        if seq.alloc:
            self.kv.release(seq.alloc)
            seq.alloc = None
        self.counters()["kv_pulls"] += 1
        return web.json_response({"prompt_token_ids": seq.prompt_ids})

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.model, "parent": None, "max_model_len": self.args.max_model_len,
            "permission": [{"id": "modelperm-%s" % self.engine_id.replace("-", ""),
                            "object": "model_permission", "created": self.created,
                            "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False,
                            "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}]},
            dumps=_dumps)

    async def health(self, request):
        return web.Response(status=200)

    async def metrics(self, request):
        lab = '{model_name="%s",engine="0"}' % self.model.replace("\\", "\\\\").replace('"', '\\"')
        c = self.counters()
        waiting = len(self.engine.waiting)
        rows = [
            ("vllm:num_requests_running", "gauge", "Number of requests in model execution "
             "batches.", len(self.engine.running)),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
             waiting),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             self.kv.usage()),
            ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
             c["prompt_tokens"]),
            ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
             c["generation_tokens"]),
            ("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from "
             "the engine.", 0),
            ("fake_vllm:decode_requests_without_kv_transfer_total", "counter", "Decode requests "
             "that came without valid kv_transfer_params (vLLM would recompute them).",
             c["decode_requests_without_kv_transfer"]),
            ("fake_vllm:kv_load_failures_total", "counter", "Decode requests whose KV transfer "
             "failed (unknown, expired or unreachable prefill).", c["kv_load_failures"]),
        ]
        out = []
        for name, kind, doc, value in rows:
            base = name[:-6] if kind == "counter" else name
            out.append("# HELP %s %s\n# TYPE %s %s\n%s%s %s\n" % (base, doc, base, kind, name,
                                                                 lab, float(value)))
        return web.Response(text="".join(out), content_type="text/plain",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def stats(self, request):
        return web.json_response({"engine_id": self.engine_id, "role": self.args.role,
                                  "counters": dict(self.counters()),
                                  "running": len(self.engine.running),
                                  "waiting": len(self.engine.waiting),
                                  "pending_transfers": len(self.pending),
                                  "kv_usage": self.kv.usage(), "evictions": self.kv.evictions,
                                  "kv_events_published": self.publisher.seq if self.publisher
                                  else 0,
                                  "steps": list(self.engine.step_log)[-50:],
                                  "records": list(self.records)}, dumps=_dumps)


def _dumps(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@web.middleware
async def _json_errors(request, handler):
    """Every refused request gets vLLM's error shape, also 404/405/413 from the router."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        types = {404: "NotFoundError", 405: "MethodNotAllowed", 413: "BadRequestError"}
        body = {"error": {"message": e.reason, "type": types.get(e.status, "BadRequestError"),
                          "param": None, "code": e.status}}
        return web.json_response(body, status=e.status, dumps=_dumps)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --ready-file)")
    p.add_argument("--ready-file", help="written once serving: JSON with host, port, url, ...")
    p.add_argument("--role", choices=["prefill", "decode", "both"], default="both")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--trace", required=True, help="an eldr-trace whose routing the fake returns")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=64, help="max running sequences")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--max-waiting", type=int, default=1024, help="queue bound (503 beyond)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="wall seconds per model second (0 = steps take no time)")
    p.add_argument("--enable-return-routed-experts", action="store_true")
    p.add_argument("--dense-layers", type=int, default=0,
                   help="leading dense layers vLLM's routed_experts array also has (zeros)")
    p.add_argument("--kv-events-endpoint", help="vLLM's KVEventsConfig.endpoint (bind if it "
                   "holds * or ::, else connect)")
    p.add_argument("--kv-events-topic", default="")
    p.add_argument("--kv-events-replay-endpoint")
    p.add_argument("--python-hash-seed", help="the PYTHONHASHSEED of the vLLM instances "
                   "(default: this process's PYTHONHASHSEED; unset = random, as vLLM)")
    p.add_argument("--prefix-caching-hash-algo", default="sha256_cbor",
                   help="only sha256_cbor is implemented")
    p.add_argument("--engine-id", help="NIXL engine id (default: a random uuid)")
    p.add_argument("--kv-hold-s", type=float, default=480.0,
                   help="how long a prefill holds KV for its decode (VLLM_NIXL_ABORT_REQUEST_"
                   "TIMEOUT)")
    p.add_argument("--max-pending-transfers", type=int, default=10000)
    p.add_argument("--kv-pull-timeout-s", type=float, default=5.0)
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="report usage.prompt_tokens_details.cached_tokens, as vLLM's flag")
    p.add_argument("--missing-kv-params", choices=["refuse", "recompute"], default="refuse",
                   help="a decode request without valid kv_transfer_params: refuse (400) or "
                   "recompute like vLLM; counted either way")
    a = p.parse_args(argv)
    if a.prefix_caching_hash_algo != "sha256_cbor":
        p.error("the fake implements --prefix-caching-hash-algo sha256_cbor only")
    for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_model_len", "max_waiting",
                 "max_pending_transfers"):
        if getattr(a, name) < 1:
            p.error("--%s must be >= 1" % name.replace("_", "-"))
    if a.time_scale < 0 or a.dense_layers < 0 or not 0 <= a.port < 65536:
        p.error("--time-scale and --dense-layers must be >= 0, --port in [0, 65535]")
    return a


async def serve(args):
    trace = Trace.load(args.trace)
    fake = FakeVllm(args, trace)
    app = web.Application(middlewares=[_json_errors], client_max_size=4 * 1024 * 1024)
    app.router.add_post("/v1/completions", fake.completions)
    app.router.add_post("/v1/chat/completions", fake.chat_completions)
    app.router.add_get("/v1/models", fake.models)
    app.router.add_get("/health", fake.health)
    app.router.add_get("/metrics", fake.metrics)
    app.router.add_post("/fake/nixl/pull", fake.nixl_pull)
    app.router.add_get("/fake/stats", fake.stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    fake.port = runner.addresses[0][1]
    tasks = [asyncio.ensure_future(fake.engine.run())]
    if fake.publisher and fake.publisher.replay is not None:
        tasks.append(asyncio.ensure_future(fake.publisher.serve_replay()))
    ready = {"host": args.host, "port": fake.port, "url": "http://%s:%d" % (args.host, fake.port),
             "role": args.role, "engine_id": fake.engine_id, "model": args.model,
             "pid": os.getpid(), "trace_layers": trace.layers, "trace_experts": trace.experts,
             "trace_top_k": trace.top_k}
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ready, f)
        os.replace(tmp, args.ready_file)
    print("fake-vllm ready " + json.dumps(ready), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for t in tasks:
        t.cancel()
    await runner.cleanup()
    if fake.publisher:
        fake.publisher.close()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        asyncio.run(serve(args))
    except TraceError as e:
        print("fake-vllm: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
