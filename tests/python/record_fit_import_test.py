#!/usr/bin/python3
"""Integration test of the README's "Record, fit, import, serve" steps 1-3, with the commands the
README shows, as separate real processes: eldr-record against the fake vLLM (serving the REAL
ESFT routing of ../shared/data, DeepSeek-V2-Lite with its dense layer 0), eldr-fit on what it
recorded, then eldrctl importing the centroids into a running eldr-node whose [[models]] name
is the model name used throughout; the node then shows that set as current.

    record_fit_import_test.py --build-dir BUILD     # exit 0 pass, 77 skipped (data missing)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # run from the source tree: leave no __pycache__ in it
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "support", "py"))

import eldr_record_test as rt  # noqa: E402  (its fake vLLM driver, paths and polling)
import eldr_testing  # noqa: E402

MODEL = "deepseek-v2-lite"
BUILD = None


class RecordFitImportTest(unittest.TestCase):
    def setUp(self):
        self.tmpdir = tempfile.TemporaryDirectory(prefix="eldr-rfi-test-")
        self.tmp = self.tmpdir.name
        self.procs = []

    def tearDown(self):
        for p, log in self.procs:
            eldr_testing.stop_process(p, timeout=60)
            log.close()
        self.tmpdir.cleanup()

    def run_ok(self, cmd):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=rt.DEADLINE_S,
                           cwd=self.tmp)
        self.assertEqual(r.returncode, 0, "%s exited %d:\n%s%s"
                         % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
        return r

    def start_node(self):
        data = os.path.join(self.tmp, "node-data")
        config = os.path.join(self.tmp, "eldr.toml")
        with open(config, "w") as f:
            f.write('[node]\nname = "rfi"\ndata_dir = "%s"\n'
                    '[endpoints]\nroute = "tcp://127.0.0.1:0"\nworker = "tcp://127.0.0.1:0"\n'
                    'admin = "tcp://127.0.0.1:0"\nmetrics = ""\n'
                    '[[models]]\nname = "%s"\n' % (data, MODEL))
        ready = os.path.join(self.tmp, "node-ready.json")
        log = open(os.path.join(self.tmp, "node.log"), "w")
        p = subprocess.Popen([os.path.join(BUILD, "tools", "eldr-node", "eldr-node"), "--config",
                              config, "--ready-file", ready], stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((p, log))
        return rt.wait_for(lambda: os.path.exists(ready) and rt.read_json(ready),
                           "eldr-node to be ready", proc=p)["admin"]

    def test_record_fit_import(self):
        esft = rt.eldr_trace.read_trace(rt.ESFT)
        reqs = esft.requests[::4]               # 54 requests of every task
        prompts = os.path.join(self.tmp, "prompts.jsonl")
        with open(prompts, "w") as f:
            f.write(rt.prompts_for(esft, reqs))
        fake = rt.FakeVllm(self.tmp, rt.ESFT, MODEL, dense_layers=1)
        try:
            # 1. Record
            self.run_ok([rt.PY, rt.RECORD, "--vllm", fake.url, "--model", MODEL, "--prompts",
                         prompts, "--out", "my.eldrtrace", "--label-key", "task", "--experts",
                         "64"])
        finally:
            fake.stop()
        trace = rt.eldr_trace.read_trace(os.path.join(self.tmp, "my.eldrtrace"))
        self.assertEqual(len(trace.requests), len(reqs))
        self.assertEqual(trace.geometry, rt.eldr_trace.Geometry(26, 64, 6))
        # 2. Fit
        self.run_ok([os.path.join(BUILD, "tools", "eldr-fit", "eldr-fit"), "--trace",
                     "my.eldrtrace", "--workers", "4", "--model", MODEL, "--out", "my.centroids",
                     "--report", "fit.json"])
        report = rt.read_json(os.path.join(self.tmp, "fit.json"))
        self.assertEqual(report["requests"], len(reqs))
        # 3. Import
        admin = self.start_node()
        eldrctl = os.path.join(BUILD, "tools", "eldrctl", "eldrctl")
        self.run_ok([eldrctl, "--node", admin, "centroids", "import", MODEL, "my.centroids"])
        shown = json.loads(self.run_ok([eldrctl, "--node", admin, "--json", "centroids", "show",
                                        MODEL]).stdout)
        self.assertEqual(shown.get("geometry"), [26, 64, 6], shown)
        self.assertEqual(shown.get("k"), 4, shown)


def main():
    global BUILD
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    args, rest = ap.parse_known_args()
    BUILD = os.path.abspath(args.build_dir)
    if not os.path.exists(rt.ESFT):
        print("SKIPPED: %s is missing (set ELDR_SHARED_DATA to the shared data folder)" % rt.ESFT)
        return 77
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
