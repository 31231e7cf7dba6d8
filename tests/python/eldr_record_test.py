#!/usr/bin/python3
"""Integration tests of eldr-record with real processes: the fake vLLM (tests/fakes/fake_vllm.py,
serving the expert ids of the REAL traces in ../shared/data), the recorder as a user runs it
(tools/eldr-record/eldr-record), and the C++ trace reader through eldr-fit.

    eldr_record_test.py --eldr-fit build/tools/eldr-fit/eldr-fit [-k NAME]

Exit 0 when all pass, 77 when the shared data is missing (skipped, with a message).
Data: $ELDR_SHARED_DATA or ../shared/data beside the checkout. No sleeps: every wait polls a
condition (a ready file, journal records, process exit) with a deadline.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True  # run from the source tree: leave no __pycache__ in it
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "cluster", "python"), os.path.join(ROOT, "tools", "eldr-record"),
                os.path.join(ROOT, "tests", "support", "py")]

import numpy as np  # noqa: E402

import eldr_testing  # noqa: E402
import eldr_trace  # noqa: E402
from eldr_record import journal as jr  # noqa: E402

PY = "/usr/bin/python3"
FAKE = os.path.join(ROOT, "tests", "fakes", "fake_vllm.py")
RECORD = os.path.join(ROOT, "tools", "eldr-record", "eldr-record")
DATA = os.environ.get("ELDR_SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")
ESFT = os.path.join(DATA, "esft-deepseek-v2-lite.eldrtrace")
GRANITE = os.path.join(DATA, "granite-3.0-1b-a400m.eldrtrace")
ELDR_FIT = None
DEADLINE_S = 120


def wait_for(cond, what, timeout=DEADLINE_S, proc=None):
    """Polls cond() until true; fails naming `what` at the deadline or when proc exits first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError("%s: the process exited (%d) first" % (what, proc.returncode))
        time.sleep(0.02)  # polling interval of a condition, not synchronisation by time
    raise AssertionError("timed out waiting for " + what)


class FakeVllm:
    """One fake vLLM process on a free loopback port."""

    def __init__(self, tmp, trace, model, dense_layers=0, routed=True, time_scale=0.0):
        self.ready = os.path.join(tmp, "fake-%d.json" % time.monotonic_ns())
        cmd = [PY, FAKE, "--model", model, "--trace", trace, "--ready-file", self.ready,
               "--time-scale", str(time_scale), "--dense-layers", str(dense_layers)]
        if routed:
            cmd.append("--enable-return-routed-experts")
        self.log = open(self.ready + ".log", "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        info = wait_for(lambda: os.path.exists(self.ready) and read_json(self.ready),
                        "the fake vLLM to be ready", proc=self.proc)
        self.url = info["url"]

    def stats(self):
        import urllib.request
        with urllib.request.urlopen(self.url + "/fake/stats", timeout=10) as r:
            return json.load(r)

    def stop(self):
        eldr_testing.stop_process(self.proc, timeout=30)
        self.log.close()


def prompts_for(trace, requests, chat=False):
    """JSONL lines that make the fake serve exactly the trace's routing of each request: the first
    word names the request, one word per prompt token, max_tokens = O + 1 (vLLM returns no row for
    the last generated token)."""
    lines = []
    for r in requests:
        text = " ".join(["req:" + r.id] + ["w"] * (r.prompt_tokens - 1))
        line = {"id": r.id, "task": r.label, "max_tokens": r.output_tokens + 1}
        if chat:
            line["messages"] = [{"role": "user", "content": text}]
        else:
            line["prompt"] = text
        lines.append(json.dumps(line))
    return "\n".join(lines) + "\n"


def without_timings(x):
    """An eldr-fit report without its "seconds" (wall-clock) entries, at any depth."""
    if isinstance(x, dict):
        return {k: without_timings(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, list):
        return [without_timings(v) for v in x]
    return x


def read_json(path):
    with open(path) as f:
        return json.load(f)


def journal_requests(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0
    if not data.startswith(jr.MAGIC):
        return 0
    objs, _, _ = jr.decode_frames(data)
    return sum(1 for o in objs if o["kind"] == "request")


class RecordTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.esft = eldr_trace.read_trace(ESFT)
        cls.granite = eldr_trace.read_trace(GRANITE)
        cls.tmpdir = tempfile.TemporaryDirectory(prefix="eldr-record-test-")
        cls.tmp = cls.tmpdir.name
        # DeepSeek-V2-Lite: vLLM returns 27 layers, layer 0 dense (first_k_dense_replace = 1).
        cls.fake = FakeVllm(cls.tmp, ESFT, "deepseek-v2-lite", dense_layers=1)

    @classmethod
    def tearDownClass(cls):
        cls.fake.stop()
        cls.tmpdir.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, "%s-%s" % (self._testMethodName, name))

    def write(self, name, text):
        p = self.path(name)
        with open(p, "w") as f:
            f.write(text)
        return p

    def record(self, url, prompts, out, *extra, model="deepseek-v2-lite", check=None):
        cmd = [PY, RECORD, "--vllm", url, "--model", model, "--prompts", prompts, "--out", out,
               "--label-key", "task", "--retry-delay", "0"] + list(extra)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE_S)
        if check is not None:
            self.assertEqual(r.returncode, check, "eldr-record exited %d:\n%s"
                             % (r.returncode, r.stderr))
        return r

    def assertTraceEquals(self, path, source, requests, model, experts):
        t = eldr_trace.read_trace(path)
        self.assertEqual(t.model_name, model)
        self.assertEqual(t.geometry, eldr_trace.Geometry(source.geometry.layers, experts,
                                                         source.geometry.top_k))
        self.assertEqual([r.id for r in t.requests], [r.id for r in requests])
        for got, want in zip(t.requests, requests):
            self.assertEqual((got.label, got.prompt_tokens, got.output_tokens),
                             (want.label, want.prompt_tokens, want.output_tokens), want.id)
            np.testing.assert_array_equal(got.ids(), want.ids(), err_msg=want.id)
        return t

    def fit_report(self, trace, model):
        out = trace + ".centroids"
        report = trace + ".report.json"
        r = subprocess.run([ELDR_FIT, "--trace", trace, "--workers", "4", "--out", out,
                            "--model", model, "--report", report, "--seed", "7"],
                           capture_output=True, text=True, timeout=DEADLINE_S)
        self.assertEqual(r.returncode, 0, "eldr-fit refused %s:\n%s%s"
                         % (trace, r.stdout, r.stderr))
        with open(report) as f:
            return json.load(f)

    # -- the trace writer against the C++ reader ----------------------------------------------
    def test_writer_matches_the_cpp_reader(self):
        """The real ESFT trace, read and written again by eldr_trace, fits to the same result as
        the original in eldr-fit: the C++ reader sees the same requests and ids."""
        again = self.path("esft.eldrtrace")
        t = self.esft
        eldr_trace.write_trace(again, t.model_name, t.geometry, t.source, t.requests)
        with open(again, "rb") as f1, open(ESFT, "rb") as f2:   # and, as it happens, the bytes
            self.assertEqual(f1.read(), f2.read())
        a, b = self.fit_report(ESFT, "m"), self.fit_report(again, "m")
        for key in ("centroids", "source"):        # the output and input paths
            a.pop(key), b.pop(key)
        a, b = without_timings(a), without_timings(b)
        self.assertEqual(a["requests"], 213)
        self.assertEqual(a, b)

    # -- recording ------------------------------------------------------------------------------
    def test_records_what_vllm_served(self):
        """40 ESFT prompts through /v1/completions: the trace holds, per prompt, exactly the ids
        the fake served (the real trace's), with the dense layer dropped, labels from the JSONL;
        eldr-fit reads it."""
        reqs = self.esft.requests[:40]
        prompts = self.write("p.jsonl", prompts_for(self.esft, reqs))
        out = self.path("out.eldrtrace")
        r = self.record(self.fake.url, prompts, out, "--concurrency", "4", "--progress", "lines",
                        check=0)
        experts = max(int(q.ids().max()) for q in reqs) + 1   # inferred: no --experts given
        self.assertIn("experts per layer taken as %d" % experts, r.stderr)
        self.assertIn("40/40 prompts 100.0%", r.stderr)
        self.assertIn("26 MoE layers (of 27; dense [0])", r.stderr)
        self.assertFalse(os.path.exists(out + ".journal"))
        self.assertTraceEquals(out, self.esft, reqs, "deepseek-v2-lite", experts)
        served = {rec["trace_request"] for rec in self.fake.stats().get("records", [])}
        self.assertTrue({q.id for q in reqs} <= served)
        report = self.fit_report(out, "deepseek-v2-lite")
        self.assertEqual(report["requests"], 40)
        self.assertEqual((report["model"]["layers"], report["model"]["experts"],
                          report["model"]["top_k"]), (26, experts, 6))

    def test_records_chat_prompts(self):
        """granite (24 layers, no dense layer, 32 experts, top-8) through /v1/chat/completions."""
        fake = FakeVllm(self.tmp, GRANITE, "granite")
        try:
            prompts = self.write("p.jsonl", prompts_for(self.granite, self.granite.requests,
                                                        chat=True))
            out = self.path("out.eldrtrace")
            r = self.record(fake.url, prompts, out, "--experts", "32", "--progress", "none",
                            model="granite", check=0)
            self.assertIn("24 MoE layers (of 24; dense none)", r.stderr)
            self.assertTraceEquals(out, self.granite, self.granite.requests, "granite", 32)
        finally:
            fake.stop()

    # -- interruption and resume ----------------------------------------------------------------
    def interrupted_then_resumed(self, sig):
        reqs = self.esft.requests[100:130]
        prompts = self.write("p.jsonl", prompts_for(self.esft, reqs))
        out = self.path("out.eldrtrace")
        journal = out + ".journal"
        slow = FakeVllm(self.tmp, ESFT, "deepseek-v2-lite", dense_layers=1, time_scale=1.0)
        try:
            cmd = [PY, RECORD, "--vllm", slow.url, "--model", "deepseek-v2-lite", "--prompts",
                   prompts, "--out", out, "--label-key", "task", "--concurrency", "3",
                   "--experts", "64"]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            wait_for(lambda: journal_requests(journal) >= 3, "3 recorded prompts", proc=proc)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=DEADLINE_S)
        finally:
            slow.stop()
        kept = journal_requests(journal)
        self.assertLess(kept, len(reqs), "the run ended before the signal: nothing was resumed")
        self.assertFalse(os.path.exists(out))
        return reqs, prompts, out, journal, proc.returncode, err, kept

    def test_killed_then_resumed(self):
        """SIGKILL mid-run (and a record torn by it): the rerun continues and the trace holds
        every prompt exactly once."""
        reqs, prompts, out, journal, code, _, kept = self.interrupted_then_resumed(signal.SIGKILL)
        self.assertEqual(code, -signal.SIGKILL)
        with open(journal, "ab") as f:        # what a kill during an append leaves behind
            f.write(jr.encode_frame({"kind": "request", "id": reqs[-1].id})[:-5])
        r = self.record(self.fake.url, prompts, out, "--concurrency", "3", "--experts", "64",
                        check=0)
        self.assertIn("continuing %s: %d of %d prompts already recorded" % (out, kept, len(reqs)),
                      r.stderr)
        self.assertIn("discarded a torn record", r.stderr)
        self.assertTraceEquals(out, self.esft, reqs, "deepseek-v2-lite", 64)
        self.assertFalse(os.path.exists(journal))

    def test_sigint_then_resumed(self):
        reqs, prompts, out, journal, code, err, kept = self.interrupted_then_resumed(
            signal.SIGINT)
        self.assertEqual(code, 130, err)
        self.assertIn("interrupted by SIGINT; %d of %d prompts are recorded" % (kept, len(reqs)),
                      err)
        self.assertIn("rerun the same command to continue", err)
        self.record(self.fake.url, prompts, out, "--concurrency", "3", "--experts", "64",
                    check=0)
        self.assertTraceEquals(out, self.esft, reqs, "deepseek-v2-lite", 64)

    def test_more_than_256_experts_written_as_version_2(self):
        """The fake serves traces of at most 256 experts, so a 384-expert recording (Kimi K2's
        width) is journalled here directly and finished by the recorder's own finalize."""
        import argparse as ap
        import msgpack
        from eldr_record import recorder
        from eldr_record.prompts import parse_prompts
        prompts, _ = parse_prompts(['{"prompt": "a"}', '{"prompt": "b"}'], "p.jsonl")
        out = self.path("wide.eldrtrace")
        journal = jr.Journal.open(out + ".journal", {"model": "kimi"})
        journal.set_layers({"response_layers": 3, "top_k": 8, "moe_layers": [1, 2]})
        rng = np.random.default_rng(5)
        want = []
        for p in prompts:
            ids = np.stack([rng.choice(384, 8, replace=False) for _ in range(5 * 2)])
            want.append(ids.reshape(-1))
            journal.append_request({"id": p.id, "digest": p.digest, "label": "", "width": 2,
                                    "prompt_tokens": 3, "output_tokens": 2,
                                    "max_id": int(ids.max()),
                                    "experts": ids.astype("<u2").tobytes()})
        args = ap.Namespace(experts=384, vllm="http://v", model="kimi", prompts="p.jsonl",
                            max_tokens=3, out=out)
        recorder.finalize(args, prompts, journal, set())
        with open(out, "rb") as f:
            self.assertEqual(msgpack.unpackb(f.read(), raw=False)["version"], 2)
        t = eldr_trace.read_trace(out)
        self.assertEqual(t.geometry, eldr_trace.Geometry(2, 384, 8))
        for got, ids in zip(t.requests, want):
            np.testing.assert_array_equal(got.ids(), ids)
        self.assertFalse(os.path.exists(out + ".journal"))

    # -- clear errors ---------------------------------------------------------------------------
    def test_vllm_without_routed_experts(self):
        fake = FakeVllm(self.tmp, ESFT, "deepseek-v2-lite", routed=False)
        try:
            prompts = self.write("p.jsonl", prompts_for(self.esft, self.esft.requests[:3]))
            out = self.path("out.eldrtrace")
            r = self.record(fake.url, prompts, out, check=3)
            self.assertIn("start it with --enable-return-routed-experts", r.stderr)
            self.assertFalse(os.path.exists(out))
        finally:
            fake.stop()

    def test_bad_line_is_named(self):
        good = prompts_for(self.esft, self.esft.requests[:2])
        prompts = self.write("p.jsonl", good + '{"prompt": "x", "max_tokens": -1}\n')
        r = self.record(self.fake.url, prompts, self.path("out"), check=2)
        self.assertIn("p.jsonl:3: \"max_tokens\" must be a positive integer", r.stderr)

    def test_unknown_model_and_unreachable_vllm(self):
        prompts = self.write("p.jsonl", prompts_for(self.esft, self.esft.requests[:2]))
        r = self.record(self.fake.url, prompts, self.path("a"), model="other", check=3)
        self.assertIn("does not serve model 'other' (it serves 'deepseek-v2-lite')", r.stderr)
        port = eldr_testing.free_port()  # nothing listens there now
        r = self.record("http://127.0.0.1:%d" % port, prompts, self.path("b"), check=3)
        self.assertIn("cannot reach vLLM at http://127.0.0.1:%d" % port, r.stderr)

    def test_failed_prompt_then_skip_failed(self):
        reqs = self.esft.requests[:4]
        text = prompts_for(self.esft, reqs) + json.dumps({"id": "bad", "prompt": "req:nope w"}) \
            + "\n"
        prompts = self.write("p.jsonl", text)
        out = self.path("out.eldrtrace")
        r = self.record(self.fake.url, prompts, out, "--experts", "64", "--moe-layers", "1-26",
                        check=1)
        self.assertIn("prompt 'bad' (line 5) failed: vLLM answered 400", r.stderr)
        self.assertIn("4 of 5 are recorded", r.stderr)
        self.assertFalse(os.path.exists(out))
        r = self.record(self.fake.url, prompts, out, "--experts", "64", "--moe-layers", "1-26",
                        "--skip-failed", check=0)
        self.assertIn("skipped 1 failed prompts", r.stderr)
        self.assertIn("26 MoE layers (of 27; dense [0])", r.stderr)
        self.assertTraceEquals(out, self.esft, reqs, "deepseek-v2-lite", 64)

    def test_refuses_to_mix_or_overwrite(self):
        reqs = self.esft.requests[:2]
        prompts = self.write("p.jsonl", prompts_for(self.esft, reqs))
        out = self.path("out.eldrtrace")
        self.record(self.fake.url, prompts, out, "--experts", "64", check=0)
        r = self.record(self.fake.url, prompts, out, "--experts", "64", check=2)
        self.assertIn("pass --force", r.stderr)
        self.record(self.fake.url, prompts, out, "--experts", "64", "--force", check=0)
        # a journal recorded with other settings is not continued with these
        with open(out + ".journal", "wb") as f:
            f.write(jr.MAGIC + jr.encode_frame({"kind": "header", "model": "deepseek-v2-lite",
                                                "max_tokens": 99, "label_key": "task",
                                                "moe_layers": "auto"}))
        r = self.record(self.fake.url, prompts, out, "--experts", "64", check=2)
        self.assertIn("max_tokens: journal 99, now 128", r.stderr)
        self.record(self.fake.url, prompts, out, "--experts", "64", "--restart", check=0)
        self.assertTraceEquals(out, self.esft, reqs, "deepseek-v2-lite", 64)


def main():
    global ELDR_FIT
    ap = argparse.ArgumentParser()
    ap.add_argument("--eldr-fit", required=True, help="the eldr-fit binary of this build")
    args, rest = ap.parse_known_args()
    ELDR_FIT = os.path.abspath(args.eldr_fit)
    for f in (ESFT, GRANITE):
        if not os.path.exists(f):
            print("SKIPPED: %s is missing (set ELDR_SHARED_DATA to the shared data folder)" % f)
            return 77
    if not os.access(ELDR_FIT, os.X_OK):
        print("eldr-fit not found at %s" % ELDR_FIT)
        return 1
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
