#!/usr/bin/python3
"""Routes requests of a 512-expert model through a running eldr-node with the Python client, whose
counts_message must encode them as eldr-counts version 2 (two-byte ids). The node is set up by
tests/integration/node_wide_test.cpp (model "wide", L=4 E=512 k=10, worker w's home experts
128 * w + 60 .. 128 * w + 69, centroid set imported). Exit 0 when every check holds.

usage: node_wide_e2e.py ROUTE
"""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "cluster", "python"))
from eldr_client import RouteClient, counts_message  # noqa: E402

LAYERS, EXPERTS, TOP_K = 4, 512, 10


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def home(w):
    return [128 * w + 60 + j for j in range(TOP_K)]


router = RouteClient(sys.argv[1], timeout_ms=5000)
for w in range(4):
    # Two blocks of 8 tokens, every token picking worker w's home experts at every layer.
    hashes = [9000 + 10 * w, 9001 + 10 * w]
    blocks = [(h, hashes[i - 1] if i else None, [[home(w)] * 8] * LAYERS)
              for i, h in enumerate(hashes)]
    msg = counts_message(LAYERS, EXPERTS, TOP_K, blocks)
    check(msg["v"] == 2, "a 512-expert model needs version 2: %r" % msg["v"])
    ids = msg["blocks"][0][4]
    check(ids == struct.pack("<%dH" % (LAYERS * TOP_K), *(home(w) * LAYERS)),
          "ids are little-endian uint16: %r" % ids)
    reply = router.route("py-wide-%d" % w, "wide", hashes, counts=msg)
    check(reply["worker"] == w, "locality: %r" % reply)
    check(reply["covered_blocks"] == 2, "coverage: %r" % reply)
    check(not reply.get("warnings"), "warnings: %r" % reply)

# A narrow model still gets version 1, one byte per id.
narrow = counts_message(2, 8, 2, [(1, None, [[[0, 7]], [[3, 5]]])])
check(narrow["v"] == 1 and narrow["blocks"][0][4] == b"\x00\x07\x03\x05", "narrow: %r" % narrow)
# Ids are checked against E before anything is sent.
try:
    counts_message(LAYERS, EXPERTS, TOP_K, [(1, None, [[list(range(502, 512)) + [0]]] * LAYERS)])
    check(False, "11 ids for top-10 accepted")
except ValueError:
    pass
try:
    counts_message(1, EXPERTS, 2, [(1, None, [[[3, 512]]])])
    check(False, "expert id 512 accepted")
except ValueError as e:
    check("512" in str(e), "message names the id: %s" % e)
print("ok")
