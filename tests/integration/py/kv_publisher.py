#!/usr/bin/python3
"""A scripted stand-in for vLLM's KV-event publisher (and for a prefill-side counts publisher).

It speaks vLLM's wire format as vllm/distributed/kv_events.py does (see
../shared/reference/vllm-kv-events.md): three frames (topic, 8-byte big-endian seq, payload), the
batch [ts, events, dp_rank], events in the tagged-array form (every declared field written) or
the tagged-map form (defaults omitted), hashes as uint64, int64 or 32-byte bin; and a replay
ROUTER that answers [empty, seq8] with one message per buffered batch and an end marker, in the
old [empty, seq, payload] or the new [empty, topic, seq, payload] shape -- or, with the shape
"mute", reads the requests (they are counted) and never answers.

The live socket is an XPUB (identical frames to a PUB for subscribers) so that the script can
wait for the subscription instead of sleeping. Driven by JSON lines on stdin, one reply line each
on stdout. Needs Debian's python3-zmq and python3-msgpack (/usr/bin/python3).
"""
import json
import struct
import sys
import threading

import msgpack
import zmq

END_SEQ = (2**64 - 1).to_bytes(8, "big")


def wire_hash(h, form):
    if form == "bin":
        return bytes(range(24)) + h.to_bytes(8, "big")  # last 8 bytes = the integer form
    if form == "int64" and h >= 2**63:
        return h - 2**64
    return h


def encode_event(e, form, hash_form):
    hashes = [wire_hash(h, hash_form) for h in e.get("hashes", [])]
    kind = e["type"]
    if kind == "BlockStored":
        parent = e.get("parent")
        parent = None if parent is None else wire_hash(parent, hash_form)
        block_size = e.get("block_size", 16)
        tokens = list(range(block_size * len(hashes)))
        fields = [("block_hashes", hashes, False), ("parent_block_hash", parent, False),
                  ("token_ids", tokens, False), ("block_size", block_size, False),
                  ("lora_id", None, False), ("medium", e.get("medium", "GPU"), False),
                  ("lora_name", None, False), ("extra_keys", None, True),
                  ("group_idx", e.get("group"), True), ("kv_cache_spec_kind", None, True),
                  ("kv_cache_spec_sliding_window", None, True)]
    elif kind == "BlockRemoved":
        fields = [("block_hashes", hashes, False), ("medium", e.get("medium", "GPU"), False),
                  ("group_idx", e.get("group"), True)]
    elif kind == "AllBlocksCleared":
        fields = []
    else:  # an event type from the future: both forms carry its tag first
        fields = [("whatever", 1, False)]
    if form == "array":
        return [kind] + [v for _, v, _ in fields]
    out = {"type": kind}
    for name, value, has_default in fields:
        if has_default and value is None:
            continue  # msgspec omit_defaults
        out[name] = value
    return out


class publisher:
    def __init__(self, replay_shape, topic, connect=None):
        self.ctx = zmq.Context()
        self.topic = topic.encode()
        self.replay_shape = replay_shape
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.setsockopt(zmq.SNDHWM, 100000)
        if connect:  # as vLLM's publisher with a "tcp://host:port" endpoint: to a bound SUB
            self.pub.connect(connect)
            self.pub_endpoint = connect
        else:
            port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            self.pub_endpoint = "tcp://127.0.0.1:%d" % port
        self.counts = self.ctx.socket(zmq.XPUB)
        self.counts.setsockopt(zmq.XPUB_VERBOSE, 1)
        port = self.counts.bind_to_random_port("tcp://127.0.0.1")
        self.counts_endpoint = "tcp://127.0.0.1:%d" % port
        self.buffer = []  # (seq, payload) as vLLM's replay buffer keeps them
        self.lock = threading.Lock()
        router = self.ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = "tcp://127.0.0.1:%d" % port
        self.replays = 0
        threading.Thread(target=self.serve_replay, args=(router,), daemon=True).start()

    def serve_replay(self, router):
        while True:
            frames = router.recv_multipart()
            client, start = frames[0], int.from_bytes(frames[-1], "big")
            with self.lock:
                batches = [(s, p) for s, p in self.buffer if s >= start]
                self.replays += 1
            if self.replay_shape == "mute":
                continue
            for s, p in batches:
                if self.replay_shape == "new":
                    router.send_multipart([client, b"", self.topic, s.to_bytes(8, "big"), p])
                else:
                    router.send_multipart([client, b"", s.to_bytes(8, "big"), p])
            if self.replay_shape == "new":
                router.send_multipart([client, b"", self.topic, END_SEQ, b""])
            else:
                router.send_multipart([client, b"", END_SEQ, b""])

    @staticmethod
    def wait_subscriber(sock, timeout_ms):
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while poller.poll(timeout_ms):
            if sock.recv()[:1] == b"\x01":
                return True
        return False

    def handle(self, cmd):
        op = cmd["cmd"]
        if op == "wait_subscriber":
            sock = self.counts if cmd.get("counts") else self.pub
            return {"ok": self.wait_subscriber(sock, cmd.get("timeout_ms", 10000))}
        if op == "send":
            form = cmd.get("form", "array")
            events = [encode_event(e, form, cmd.get("hash_form", "u64")) for e in cmd["events"]]
            batch = [float(cmd.get("ts", 1.0)), events, cmd.get("dp", 0)]
            payload = msgpack.packb(batch, use_bin_type=True, use_single_float=False)
            seq = cmd["seq"]
            with self.lock:
                self.buffer.append((seq, payload))
            if not cmd.get("lose", False):
                self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
            return {"ok": True}
        if op == "burst":  # many batches back to back, one reply at the end
            for b in cmd["batches"]:
                self.handle(dict(b, cmd="send"))
            return {"ok": True}
        if op == "send_raw":
            self.pub.send_multipart([bytes.fromhex(f) for f in cmd["frames_hex"]])
            return {"ok": True}
        if op == "send_counts":
            v = cmd.get("v", 1)
            # Version 1: one byte per expert id; version 2: little-endian uint16 (docs/protocol.md).
            ids = (lambda x: bytes(x)) if v != 2 else (lambda x: struct.pack("<%dH" % len(x), *x))
            blocks = [[b["hash"], b.get("parent"), b["tokens"], b["sizes"], ids(b["ids"]),
                       bytes(b["counts"])] for b in cmd["blocks"]]
            msg = {"v": v, "model": cmd["model"], "blocks": blocks}
            if "seq" in cmd:
                msg["seq"] = cmd["seq"]
            self.counts.send_multipart([b"eldr-counts", msgpack.packb(msg, use_bin_type=True)])
            return {"ok": True}
        if op == "reset_buffer":  # the engine restarted: its replay buffer starts empty
            with self.lock:
                self.buffer = []
            return {"ok": True}
        if op == "stats":
            with self.lock:
                return {"ok": True, "replays": self.replays}
        if op == "exit":
            return {"ok": True, "exit": True}
        return {"ok": False, "error": "unknown command " + op}


def main():
    """kv_publisher.py [SHAPE] [--connect ENDPOINT] [--topic TOPIC]: the live socket connects to
    ENDPOINT (a node's models[].kv_events.bind) instead of binding, with frames under TOPIC."""
    args = sys.argv[1:]
    shape, topic, connect = "new", "kv", None
    while args:
        a = args.pop(0)
        if a == "--connect":
            connect = args.pop(0)
        elif a == "--topic":
            topic = args.pop(0)
        else:
            shape = a
    p = publisher(shape, topic=topic, connect=connect)
    print(json.dumps({"pub": p.pub_endpoint, "replay": p.replay_endpoint,
                      "counts": p.counts_endpoint}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = p.handle(json.loads(line))
        print(json.dumps(reply), flush=True)
        if reply.get("exit"):
            break


if __name__ == "__main__":
    main()
