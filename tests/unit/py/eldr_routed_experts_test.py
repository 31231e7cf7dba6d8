#!/usr/bin/python3
"""Unit tests of cluster/python/eldr_routed_experts.py's answer parser, which eldr-proxy and
eldr-record both use on vLLM's answers: load_answer must give exactly what json.loads gives (the
value, or a ValueError) on every body, while skipping the parse of the routed experts' long
base64 string where that is safe. (Its decoding and dense-layer map are tested with eldr-record's
logic, tests/python/eldr_record_logic_test.py, and through eldr-proxy's conversion,
eldr_proxy_units_test.py.) No sockets, no processes, no files.

usage: eldr_routed_experts_test.py     exit 0 when every test passes
"""
import base64
import json
import os
import random
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "cluster", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "support", "py"))
import eldr_testing  # noqa: E402
import eldr_routed_experts as rex  # noqa: E402

check = eldr_testing.check


def test_load_answer_is_json_loads():
    """load_answer gives json.loads' value, or a ValueError where json.loads raises one, on
    answers that take its fast path (the routed experts cut out) and on every one that must not:
    the key elsewhere or twice, escapes, control or non-ASCII bytes in the value, a key that
    only looks like it inside another, truncated and mutated bodies. The plain answer is parsed
    without its routed experts' string (so the fast path is the one tested there)."""
    def outcome(f, raw):
        try:
            return ("value", f(raw))
        except ValueError:
            return ("error", None)

    def same(raw, what):
        check(outcome(rex.load_answer, raw) == outcome(json.loads, raw),
              "%s: %r" % (what, raw[:80]))

    b64 = base64.b64encode(bytes(range(256)) * 40).decode()
    answer = {"id": "cmpl-1", "choices": [{"index": 0, "text": "x", "routed_experts": b64,
                                           "prompt_token_ids": [1, 2, 3]}],
              "kv_transfer_params": {"remote_block_ids": [4, 5]}}
    plain = json.dumps(answer).encode()
    parsed = []
    real_loads = rex.json.loads
    rex.json.loads = lambda raw: (parsed.append(len(raw)), real_loads(raw))[1]
    try:
        check(rex.load_answer(plain) == answer, "the plain answer")
    finally:
        rex.json.loads = real_loads
    check(parsed == [len(plain) - len(b64)], "the plain answer was parsed whole: %s" % parsed)
    cases = {
        "plain": plain,
        "spaces": plain.replace(b'"routed_experts": "', b'"routed_experts" \n:\t "'),
        "compact": json.dumps(answer, separators=(",", ":")).encode(),
        "empty value": plain.replace(b64.encode(), b""),
        "no key": json.dumps({"choices": [{"text": "x"}]}).encode(),
        "top level": json.dumps({"routed_experts": b64, "choices": [{}]}).encode(),
        "second choice": json.dumps({"choices": [{}, {"routed_experts": b64}]}).encode(),
        "twice": json.dumps({"choices": [{"routed_experts": b64}, {"routed_experts": b64}]}).encode(),
        "escaped slash": plain.replace(b"/", b"\\/"),
        "unicode escape": plain.replace(b"AAAA", b"\\u0041AAA", 1),
        "control byte": plain.replace(b"AAAA", b"AA\x01A", 1),
        "tab byte": plain.replace(b"AAAA", b"AA\tA", 1),
        "non-ASCII": plain.replace(b"AAAA", "AAé".encode(), 1),
        "key inside a key": json.dumps({"x\"routed_experts": b64, "choices": [{}]}).encode(),
        "lookalike first": json.dumps({"choices": [{"x\"routed_experts": b64,
                                                    "routed_experts": ""}]}).encode(),
        "a list": json.dumps([{"routed_experts": b64}]).encode(),
        "choices not a list": json.dumps({"choices": {"0": {"routed_experts": b64}},
                                          "routed_experts": 1}).encode(),
        "not JSON": b"<html>502</html>",
        "empty": b"",
    }
    for what, raw in cases.items():
        same(raw, what)
    rng = random.Random(43)
    at = plain.index(b'"routed_experts"')
    for cut in range(0, len(plain), 97):  # truncated anywhere
        same(plain[:cut], "cut at %d" % cut)
    for _ in range(3000):  # one byte changed, mostly around the key and in the value
        i = rng.randrange(at - 8, at + 60) if rng.random() < 0.7 else rng.randrange(len(plain))
        raw = plain[:i] + bytes([rng.randrange(256)]) + plain[i + 1:]
        same(raw, "byte %d" % i)


def main():
    return eldr_testing.run_test_functions(globals())


if __name__ == "__main__":
    sys.exit(main())
