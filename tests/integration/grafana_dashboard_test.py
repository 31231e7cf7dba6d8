#!/usr/bin/python3
"""Checks the Grafana dashboard (deploy/grafana/eldr.json) against what eldr-node exports.

    /usr/bin/python3 tests/integration/grafana_dashboard_test.py [--build-dir BUILD] [TESTS] [-v]

Without --build-dir only the tests that need no node run (PromqlTest, DashboardShapeTest: the
PromQL reader and the dashboard's structure). With it, a real eldr-node is started on free
ports (port 0), driven the way a deployment drives it (decode workers register, one of them
with a metrics_url the test serves in vLLM's format so that the scrape families exist, routes with
and without counts, a KV-event publisher with a gap and a malformed message, a refit, a
centroid import, an unknown model) so that every labelled family has samples, and every metric
every dashboard query reads must be exported by its /metrics (a family with HELP/TYPE lines
counts even without samples); every label a query filters, groups or names in a legend by must
be a label of those samples. Families only a cluster exports are checked against a node of a
2-node loopback cluster (deploy/local/eldr-cluster). Registered in CTest by
tests/CMakeLists.txt: unit.grafana_dashboard (no node) and integration.grafana_dashboard.
Exit 77 (CTest's skip) when --build-dir holds no eldr-node. Needs Debian's python3-zmq and
python3-msgpack.
"""
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent
DASHBOARD = SRC / "deploy" / "grafana" / "eldr.json"
GENERATOR = SRC / "deploy" / "grafana" / "make_dashboard.py"
BUILD_DIR = None

# ----------------------------------------------------------------------------- PromQL reader
# A tokenizer and a small reader of PromQL as Grafana sends it (its $variables substituted by
# placeholders first). It knows PromQL's functions, aggregations, keywords and binary operators,
# so that a metric name is told from a function, a label or a keyword by its place, not by its
# spelling; anything it does not know is an error, never silently skipped.

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week", "day_of_year",
    "days_in_month", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters",
    "hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time", "ln",
    "log10", "log2", "max_over_time", "min_over_time", "minute", "month", "predict_linear",
    "present_over_time", "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort",
    "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "time",
    "timestamp", "vector", "year", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos",
    "cosh", "sin", "sinh", "tan", "tanh", "deg", "rad", "pi",
}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile"}
SET_OPERATORS = {"and", "or", "unless", "atan2"}
# Grafana's own template functions (variable queries), not PromQL.
GRAFANA_FUNCTIONS = {"label_values", "query_result"}

TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+(?![\w.]))
  | (?P<number>(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0x[0-9a-fA-F]+|[Ii]nf|NaN)(?![\w.]))
  | (?P<variable>\$\{[A-Za-z_][A-Za-z0-9_]*(?::[A-Za-z]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^=<>])
  | (?P<punct>[(){}\[\],:@])
""", re.X)


class PromqlError(ValueError):
    pass


def tokenize(expr):
    """[(kind, text)] of a PromQL expression, whitespace dropped; PromqlError on anything else."""
    out, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise PromqlError("cannot read %r at %d: %r" % (expr, pos, expr[pos:pos + 20]))
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


class Query:
    """What a PromQL expression reads: its selectors (metric name, [(label, op, value)]), the
    labels it groups by (by/without/on/ignoring/group_left/group_right), and whether it
    aggregates."""

    def __init__(self):
        self.selectors = []
        self.grouping = set()
        self.aggregates = False


def read_promql(expr):
    try:
        return _read_promql(expr)
    except IndexError:  # the expression ended inside a construct
        raise PromqlError("%r: ends too early" % expr) from None


def _read_promql(expr):
    toks = tokenize(expr)
    q = Query()
    i = 0
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}

    def expect(j, kind_or_text):
        if j >= len(toks) or kind_or_text not in (toks[j][0], toks[j][1]):
            raise PromqlError("%r: expected %s at token %d, found %r" %
                              (expr, kind_or_text, j, toks[j][1] if j < len(toks) else "end"))

    def label_list(j):
        """Reads '( a, b, ... )' from j; returns the index after ')'."""
        expect(j, "(")
        j += 1
        while toks[j][1] != ")":
            expect(j, "ident")
            q.grouping.add(toks[j][1])
            j += 1
            if toks[j][1] == ",":
                j += 1
        return j + 1

    def matchers(j, name):
        """Reads '{ l op "v", ... }' from j; returns (index after '}', name, [(l, op, v)])."""
        expect(j, "{")
        j += 1
        found = []
        while toks[j][1] != "}":
            expect(j, "ident")
            label = toks[j][1]
            if toks[j + 1][1] not in ("=", "!=", "=~", "!~"):
                raise PromqlError("%r: bad matcher operator after %s" % (expr, label))
            expect(j + 2, "string")
            value = toks[j + 2][1][1:-1]
            if label == "__name__":
                if toks[j + 1][1] != "=":
                    raise PromqlError("%r: a __name__ regex names no metric this test can check"
                                      % expr)
                if name:
                    raise PromqlError("%r: a metric name and __name__ together" % expr)
                name = value
            else:
                found.append((label, toks[j + 1][1], value))
            j += 3
            if toks[j][1] == ",":
                j += 1
            elif toks[j][1] != "}":
                raise PromqlError("%r: expected , or } in matchers" % expr)
        return j + 1, name, found

    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "punct" and text in "([{":
            if text == "{":  # a selector without a metric name
                i, name, found = matchers(i, None)
                if not name:
                    raise PromqlError("%r: a selector without a metric name" % expr)
                q.selectors.append((name, found))
                continue
            if text == "[":
                # A range or subquery: durations, variables, ':' only.
                j = i + 1
                while toks[j][1] != "]":
                    if toks[j][0] not in ("duration", "variable") and toks[j][1] != ":":
                        raise PromqlError("%r: bad range %r" % (expr, toks[j][1]))
                    j += 1
                i = j + 1
                continue
            depth[text] += 1
        elif kind == "punct" and text in ")]}":
            depth[closing[text]] -= 1
            if depth[closing[text]] < 0:
                raise PromqlError("%r: unbalanced %s" % (expr, text))
        elif kind == "ident":
            if text in AGGREGATIONS and nxt in ("(", "by", "without"):
                q.aggregates = True
                if nxt in ("by", "without"):
                    i = label_list(i + 2)
                    continue
            elif text in ("by", "without"):
                # An aggregation's clause after its argument: sum(x) by (l).
                i = label_list(i + 1)
                continue
            elif text in ("on", "ignoring", "group_left", "group_right"):
                if nxt == "(":
                    i = label_list(i + 1)
                    continue
            elif text in SET_OPERATORS or text in ("bool", "offset"):
                pass
            elif nxt == "(":
                if text not in FUNCTIONS:
                    raise PromqlError("%r: unknown function %s" % (expr, text))
            elif text in FUNCTIONS or text in AGGREGATIONS:
                raise PromqlError("%r: %s without its arguments" % (expr, text))
            else:
                name, found = text, []
                if nxt == "{":
                    i, name, found = matchers(i + 1, name)
                else:
                    i += 1
                q.selectors.append((name, found))
                continue
        elif kind not in ("number", "string", "op", "variable", "duration") and text != ",":
            raise PromqlError("%r: unexpected %r" % (expr, text))
        i += 1
    if any(depth.values()):
        raise PromqlError("%r: unbalanced brackets" % expr)
    return q


def read_variable_query(text):
    """A Grafana Prometheus variable query: label_values(selector, label) -> (Query, label);
    label_values(label) -> (None, label); query_result(expr) -> (Query, None)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", text, re.S)
    if m:
        return read_promql(m.group(1)), m.group(2)
    m = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", text)
    if m:
        return None, m.group(1)
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", text, re.S)
    if m:
        return read_promql(m.group(1)), None
    raise PromqlError("unsupported variable query %r" % text)


def legend_labels(legend):
    return set(re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend or ""))


# ----------------------------------------------------------------------------- the dashboard
def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def all_panels(d):
    out = []
    for p in d["panels"]:
        out.append(p)
        out += p.get("panels", [])  # collapsed rows hold their panels
    return out


def dashboard_queries(d):
    """[(where, expr, legendFormat)] of every panel target and every query variable."""
    out = []
    for p in all_panels(d):
        for t in p.get("targets", []):
            out.append(("panel %r target %s" % (p["title"], t.get("refId")), t["expr"],
                        t.get("legendFormat", "")))
    return out


def variable_queries(d):
    out = []
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"] if isinstance(v["query"], str) else v["query"]["query"]
            out.append((v["name"], q))
    return out


# ----------------------------------------------------------------------------- /metrics
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+\S+(\s+\S+)?$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Exposition:
    """A /metrics page: family types (from TYPE lines) and, per series name, the label names
    its samples carry."""

    def __init__(self, text):
        self.types = {}
        self.labels = {}  # series name -> set of label names over its samples
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                self.types[name] = kind.strip()
            elif line.startswith("#") or not line.strip():
                continue
            else:
                m = SAMPLE.match(line)
                if not m:
                    raise AssertionError("unreadable /metrics line %r" % line)
                self.labels.setdefault(m.group(1), set()).update(
                    k for k, _ in LABEL.findall(m.group(3) or ""))

    def series_names(self):
        """Every name a query may read: a histogram F is read as F_bucket, F_sum, F_count (never
        as F), a summary as F, F_sum, F_count, anything else as F."""
        out = set()
        for name, kind in self.types.items():
            if kind == "histogram":
                out |= {name + "_bucket", name + "_sum", name + "_count"}
            elif kind == "summary":
                out |= {name, name + "_sum", name + "_count"}
            else:
                out.add(name)
        return out

    def family_of(self, series):
        for suffix in ("_bucket", "_sum", "_count"):
            base = series[:-len(suffix)]
            if series.endswith(suffix) and self.types.get(base) in ("histogram", "summary"):
                return base
        return series


def dashboard_metrics():
    """Every series name the dashboard's panel and variable queries read."""
    d = load_dashboard()
    out = {n for _, e, _ in dashboard_queries(d) for n, _ in read_promql(e).selectors}
    for _, text in variable_queries(d):
        q, _ = read_variable_query(text)
        out |= {n for n, _ in q.selectors} if q else set()
    return out


# Families only a node in a cluster exports (membership events need members; a standalone node
# exports no membership or leadership gauges).
CLUSTER_ONLY = {"eldr_cluster_events_total", "eldr_cluster_members", "eldr_cluster_is_leader",
                "eldr_cluster_term"}

# vLLM's /metrics as a decode worker serves it: what the node scrapes for a worker registered
# with a metrics_url (cluster/http/metrics_scraper).
VLLM_METRICS = (b'# TYPE vllm:num_requests_running gauge\n'
                b'vllm:num_requests_running{engine="0",model_name="served"} 3.0\n'
                b'# TYPE vllm:num_requests_waiting gauge\n'
                b'vllm:num_requests_waiting{engine="0",model_name="served"} 1.0\n'
                b'vllm:kv_cache_usage_perc{engine="0",model_name="served"} 0.25\n')


class VllmMetricsHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(VLLM_METRICS)))
        self.end_headers()
        self.wfile.write(VLLM_METRICS)

    def log_message(self, *args):
        pass

# Labels Prometheus adds to every scraped series (the target's), not eldr-node.
TARGET_LABELS = {"instance", "job"}


def check_against(testcase, queries, expo, names):
    """Checks `queries` [(where, Query, legend)] whose metrics are all in `names` against one
    node's exposition: every label used is a label of the samples."""
    for where, q, legend in queries:
        labels = set(TARGET_LABELS)
        for name, found in q.selectors:
            if name not in names:
                continue
            have = expo.labels.get(name)
            testcase.assertTrue(have is not None, "%s: %s has no samples on the node: the test's "
                                "traffic must produce some, to check its labels" % (where, name))
            labels |= have
            for label, _, _ in found:
                testcase.assertIn(label, have | TARGET_LABELS,
                                  "%s: %s has no label %r (it has %s)" %
                                  (where, name, label, sorted(have)))
        if not all(n in names for n, _ in q.selectors):
            continue
        for label in q.grouping:
            testcase.assertIn(label, labels, "%s: groups by %r, a label of none of its series"
                              % (where, label))
        # A legend names labels the result keeps: the grouping labels of an aggregation, the
        # series' labels otherwise.
        keeps = (q.grouping - {"le"}) if q.aggregates else labels
        for label in legend_labels(legend):
            testcase.assertIn(label, keeps, "%s: legend {{%s}} is not a label of the result"
                              % (where, label))


# ----------------------------------------------------------------------------- tests
class PromqlTest(unittest.TestCase):
    def names(self, expr):
        return [n for n, _ in read_promql(expr).selectors]

    def test_functions_aggregations_and_keywords_are_not_names(self):
        q = read_promql('histogram_quantile(0.99, sum by (le, model) '
                        '(rate(eldr_route_latency_seconds_bucket{model=~"$model"}[$__rate_interval]'
                        ')))')
        self.assertEqual([n for n, _ in q.selectors], ["eldr_route_latency_seconds_bucket"])
        self.assertEqual(q.grouping, {"le", "model"})
        self.assertTrue(q.aggregates)
        self.assertEqual(q.selectors[0][1], [("model", "=~", "$model")])
        self.assertEqual(self.names("sum(a) by (x) / on (instance) group_left (model) b or "
                                    "vector(0) and bool c unless count_values(\"v\", d)"),
                         ["a", "b", "c", "d"])

    def test_label_names_and_values_are_not_names(self):
        q = read_promql('rate(m_total{kind="rate(x)",publisher=~"tcp://{a}:1",le!="1"}[5m])')
        self.assertEqual(q.selectors, [("m_total", [("kind", "=", "rate(x)"),
                                                    ("publisher", "=~", "tcp://{a}:1"),
                                                    ("le", "!=", "1")])])

    def test_name_matcher_ranges_and_subqueries(self):
        self.assertEqual(self.names('{__name__="eldr_x", a="b"}'), ["eldr_x"])
        self.assertEqual(self.names("max_over_time(rate(a[1m])[1h:5m]) offset 1d"), ["a"])
        self.assertEqual(self.names("a > bool 0.5e3 * 2 - b ^ Inf"), ["a", "b"])

    def test_a_name_that_is_also_a_function_or_keyword_elsewhere(self):
        # A metric may be named like a label or like a function that is not being called.
        self.assertEqual(self.names("by_total + model"), ["by_total", "model"])
        # Names that begin like a number's spelling (Inf, NaN) or a duration.
        self.assertEqual(self.names("information_total / NaN_x + Inf"),
                         ["information_total", "NaN_x"])

    def test_errors(self):
        for bad in ("rate(a[5m]", "a)", "frobnicate(a)", "sum by model (a)",
                    '{__name__=~"eldr_.*"}', "a{b=1}", "a{b==\"1\"}", "rate", "a[5x]",
                    '{a="b"}', "a ; b"):
            with self.assertRaises(PromqlError, msg=bad):
                read_promql(bad)

    def test_variable_queries(self):
        q, label = read_variable_query("label_values(eldr_store_degraded{a=\"b\"}, model)")
        self.assertEqual(([n for n, _ in q.selectors], label), (["eldr_store_degraded"], "model"))
        self.assertEqual(read_variable_query("label_values(model)"), (None, "model"))
        q, label = read_variable_query("query_result(count by (model) (x or y))")
        self.assertEqual(([n for n, _ in q.selectors], label), (["x", "y"], None))
        with self.assertRaises(PromqlError):
            read_variable_query("metrics(eldr_.*)")

    def test_exposition_histogram_suffixes(self):
        e = Exposition("# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\",m=\"a\"} 1\n"
                       "h_sum{m=\"a\"} 1\nh_count{m=\"a\"} 1\n"
                       "# HELP c_count x\n# TYPE c_count counter\n"
                       "# HELP s x\n# TYPE s summary\n")
        self.assertEqual(e.series_names(), {"h_bucket", "h_sum", "h_count", "c_count", "s",
                                            "s_sum", "s_count"})
        self.assertNotIn("h", e.series_names())  # a histogram is never read as F
        self.assertEqual(e.family_of("h_bucket"), "h")
        self.assertEqual(e.family_of("c_count"), "c_count")  # a counter named *_count
        self.assertEqual(e.labels["h_bucket"], {"le", "m"})
        self.assertEqual(e.labels["h_sum"], {"m"})


class DashboardShapeTest(unittest.TestCase):
    """What makes the JSON importable into Grafana 9/10 with no plugin, and consistent."""

    @classmethod
    def setUpClass(cls):
        cls.d = load_dashboard()

    def test_generator_wrote_this_file(self):
        r = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_inputs_and_requires(self):
        inputs = self.d["__inputs"]
        self.assertEqual([(i["type"], i["pluginId"]) for i in inputs],
                         [("datasource", "prometheus")])
        placeholder = "${%s}" % inputs[0]["name"]
        ds = {v["name"]: v for v in self.d["templating"]["list"]}["datasource"]
        self.assertEqual((ds["type"], ds["query"]), ("datasource", "prometheus"))
        self.assertEqual(ds["current"]["value"], placeholder)
        self.assertIsNone(self.d["id"])
        self.assertTrue(self.d["uid"])
        req = {(r["type"], r["id"]) for r in self.d["__requires"]}
        used = {("panel", p["type"]) for p in all_panels(self.d) if p["type"] != "row"}
        self.assertEqual(req - used, {("grafana", "grafana"), ("datasource", "prometheus")})
        self.assertEqual(used - req, set(), "panel types missing from __requires")

    def test_only_builtin_panels(self):
        builtin = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "state-timeline",
                   "status-history", "barchart", "heatmap", "text", "piechart", "histogram"}
        for p in all_panels(self.d):
            self.assertIn(p["type"], builtin, p.get("title"))

    def test_variables(self):
        v = {x["name"]: x for x in self.d["templating"]["list"]}
        for name in ("model", "instance"):
            self.assertEqual(v[name]["type"], "query")
            self.assertTrue(v[name]["multi"] and v[name]["includeAll"])
            self.assertEqual(v[name]["allValue"], ".*")
            self.assertEqual(v[name]["datasource"]["uid"], "${datasource}")
            _, label = read_variable_query(v[name]["query"])
            self.assertEqual(label, name)

    def test_panels_are_readable_and_placed(self):
        ids = [p["id"] for p in all_panels(self.d)]
        self.assertEqual(len(ids), len(set(ids)), "panel ids must be unique")
        cells = set()
        for p in all_panels(self.d):
            g = p["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    self.assertNotIn((x, y), cells, "%s overlaps another panel" % p["title"])
                    cells.add((x, y))
            if p["type"] == "row":
                continue
            self.assertTrue(p["title"] and p.get("description"), p["title"])
            self.assertEqual(p["datasource"], {"type": "prometheus", "uid": "${datasource}"})
            # A unit, or value mappings that name the states (ok / DEGRADED).
            defaults = p["fieldConfig"]["defaults"]
            self.assertTrue("unit" in defaults or defaults.get("mappings"), p["title"])
            self.assertTrue(p["targets"], p["title"])
            for t in p["targets"]:
                self.assertEqual(t["datasource"], p["datasource"])
            refs = [t["refId"] for t in p["targets"]]
            self.assertEqual(len(refs), len(set(refs)), p["title"])
        titles = [p["title"] for p in self.d["panels"] if p["type"] == "row"]
        self.assertEqual(titles[0], "Overview")

    def test_every_query_reads_and_is_filtered(self):
        for where, expr, _ in dashboard_queries(self.d):
            q = read_promql(expr)
            self.assertTrue(q.selectors, "%s reads no metric" % where)
            for name, found in q.selectors:
                self.assertTrue(name.startswith("eldr_"), "%s: %s" % (where, name))
                # Every selector follows the instance filter; rate windows follow the panel's.
                self.assertIn(("instance", "=~", "$instance"), found, "%s: %s" % (where, name))
            self.assertNotRegex(expr, r"\[\d", "%s: use $__rate_interval, not a fixed window"
                                % where)
        for name, text in variable_queries(self.d):
            read_variable_query(text)


class LiveNodeTest(unittest.TestCase):
    """Every metric and label the dashboard reads, against a real eldr-node's /metrics."""

    @classmethod
    def setUpClass(cls):
        if BUILD_DIR is None:
            raise unittest.SkipTest("no --build-dir")
        sys.path.insert(0, str(SRC / "tests" / "adversarial"))
        global live
        import eldr_live as live  # noqa: F401  (python3-zmq, python3-msgpack)
        import zmq
        cls.tmp = Path(tempfile.mkdtemp(prefix="eldr-grafana-"))
        cls.ctx = zmq.Context()
        cls.node = None
        cls.vllm = None
        cls.cluster_dir = None
        try:
            cls.single = cls.drive_single_node()
            cls.clustered = cls.clustered_node()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.node is not None:
            cls.node.stop()
        if cls.vllm is not None:
            cls.vllm.shutdown()
            cls.vllm.server_close()
        if getattr(cls, "pub", None) is not None:
            cls.pub.close()
        if cls.cluster_dir is not None:
            subprocess.run(["bash", str(SRC / "deploy" / "local" / "eldr-cluster"), "stop",
                            "--dir", str(cls.cluster_dir)], capture_output=True, timeout=120)
        cls.ctx.term()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @staticmethod
    def scrape(endpoint):
        status, body = live.http_get(endpoint, "/metrics")
        assert status == 200, "GET /metrics: %d" % status
        return body.decode("utf-8")

    @classmethod
    def wait_for(cls, endpoint, sampled, exported=(), timeout=60.0):
        """The exposition once every series name in `sampled` has a sample and every one in
        `exported` is exported (some sections appear at the node's first tick after start-up);
        the last one seen (for the assertions' messages) when the deadline passes first."""
        deadline = time.monotonic() + timeout
        while True:
            e = Exposition(cls.scrape(endpoint))
            if (all(f in e.labels for f in sampled) and set(exported) <= e.series_names() or
                    time.monotonic() > deadline):
                return e
            time.sleep(0.05)  # polling interval of a condition with a deadline

    @classmethod
    def drive_single_node(cls):
        node_bin = live.find_binary(BUILD_DIR, "eldr-node")
        centroids = cls.tmp / "toy.centroids"
        centroids.write_bytes(live.toy_centroid_file())
        config = cls.tmp / "node.toml"
        config.write_text(live.node_toml(str(cls.tmp / "data"), str(centroids),
                                         extra="[signature_cache]\ncommit_interval_ms = 10\n"))
        cls.node = live.Node(node_bin, str(config), str(cls.tmp / "node.log")).start()
        ep = cls.node.endpoint
        worker = live.Client(cls.ctx, ep("worker"))
        route = live.Client(cls.ctx, ep("route"))
        admin = live.Admin(cls.ctx, ep("admin"))
        # Worker 0 is scraped (its vLLM /metrics, served here), the others push load_reports.
        cls.vllm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), VllmMetricsHandler)
        threading.Thread(target=cls.vllm.serve_forever, daemon=True).start()
        metrics_url = "http://127.0.0.1:%d/metrics" % cls.vllm.server_address[1]
        try:
            for w in range(live.K):
                scraped = {"metrics_url": metrics_url} if w == 0 else {}
                ack = worker.call(live.worker_msg("worker_register", worker=w,
                                                  endpoint="tcp://10.9.0.%d:9" % w, capacity=0,
                                                  **scraped))
                assert ack and ack.get("type") == "worker_ack", ack
            # A publisher of KV events: one batch, one gap (replayed), one malformed message.
            cls.pub = live.Publisher(cls.ctx)
            ack = worker.call(live.worker_msg("publisher_register", endpoint=cls.pub.endpoint,
                                              replay_endpoint=cls.pub.replay_endpoint))
            assert ack and ack.get("state") == "subscribed", ack
            assert cls.pub.wait_subscriber(10), "the node did not subscribe to the publisher"
            cls.pub.send_batch([live.stored([11], group=0)])
            cls.pub.send_batch([live.stored([12], group=0)], lose=True)
            cls.pub.send_batch([live.stored([13], group=0)])
            cls.pub.send_raw([b"kv", (cls.pub.seq + 1).to_bytes(8, "big"), b"\xc1"])
            # Routes: with counts (locality decisions), without (no_counts fallback), with
            # counts of another model's shape (counts_geometry warning), an unknown model.
            for d in range(live.K):
                blocks = [1000 * (d + 1) + i for i in range(3)]
                r = route.call(live.route_request(route.next_id(), blocks,
                                                  live.counts_message(blocks, d)))
                assert r and r.get("type") == "route_reply", r
            r = route.call(live.route_request(route.next_id(), [777001, 777002]))
            assert r and r.get("type") == "route_reply", r
            other = live.counts_message([888001], 1)
            other["model"] = [2, 16, 2]
            r = route.call(live.route_request(route.next_id(), [888001], other))
            assert r and r.get("type") == "route_reply", r
            bad = live.route_request(route.next_id(), [1])
            bad["model"] = "no-such-model"
            r = route.call(bad)
            assert r and r.get("type") == "error_reply", r
            # A refit (rejected: too small a sample) and a centroid import (a swap).
            admin.call("refit", model=live.MODEL)
            admin.ok("centroids.import", model=live.MODEL,
                     file=live.toy_centroid_file(epoch=2, shift=1))
        finally:
            worker.close()
            route.close()
            admin.close()
        return cls.wait_for(ep("metrics"), [
            "eldr_route_decisions_total", "eldr_route_errors_total", "eldr_route_fallbacks_total",
            "eldr_route_warnings_total", "eldr_refits_total", "eldr_centroid_swaps_total",
            "eldr_ingest_messages_total", "eldr_ingest_gaps_total", "eldr_ingest_dropped_total",
            "eldr_worker_messages_total", "eldr_sigcache_commit_seconds_bucket",
            "eldr_worker_scrapes_total", "eldr_worker_scraped_load", "eldr_worker_kv_cache_usage",
            "eldr_worker_scrape_age_seconds"],
            exported=dashboard_metrics() - CLUSTER_ONLY)

    @classmethod
    def clustered_node(cls):
        """Node 1 of a 2-node loopback cluster, once it has seen the other join."""
        script = SRC / "deploy" / "local" / "eldr-cluster"
        cls.cluster_dir = cls.tmp / "cluster"
        r = subprocess.run(["bash", str(script), "start", "2", "--dir", str(cls.cluster_dir),
                            "--bin", str(Path(live.find_binary(BUILD_DIR, "eldr-node")).parent),
                            "--timeout", "60"], capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, "eldr-cluster start 2: %s%s" % (r.stdout, r.stderr)
        n1 = json.loads(r.stdout.splitlines()[0])
        return cls.wait_for(n1["metrics"], sorted(CLUSTER_ONLY))

    def test_the_node_exports_what_the_docs_list(self):
        # If the node's families were not read (an empty or changed page), every check below
        # would pass for the wrong reason.
        for f in ("eldr_route_latency_seconds", "eldr_store_degraded", "eldr_sigcache_blocks",
                  "eldr_shard_request_seconds"):
            self.assertIn(f, self.single.types)

    def test_every_dashboard_metric_is_exported(self):
        d = load_dashboard()
        single, clustered = self.single.series_names(), self.clustered.series_names()
        queries = [(w, read_promql(e), lg) for w, e, lg in dashboard_queries(d)]
        queries += [("variable $" + n, q, "") for n, (q, _) in
                    ((n, read_variable_query(t)) for n, t in variable_queries(d)) if q]
        used = {n for _, q, _ in queries for n, _ in q.selectors}
        self.assertGreater(len(used), 30)  # the reader found the dashboard's metrics
        missing = sorted(n for n in used if n not in single | clustered)
        self.assertEqual(missing, [], "the dashboard queries metrics eldr-node does not export")
        # What only a cluster exports is exactly what a single node lacks.
        cluster_only = sorted(n for n in used if n not in single)
        self.assertEqual(set(cluster_only), CLUSTER_ONLY)
        check_against(self, queries, self.single, single)
        check_against(self, queries, self.clustered, set(cluster_only))
        # $model filters every family that has a model label, and only those.
        for where, q, _ in queries:
            if where.startswith("variable"):
                continue
            for name, found in q.selectors:
                labels = (self.single.labels.get(name) or self.clustered.labels.get(name) or
                          set())
                has = ("model", "=~", "$model") in found
                self.assertEqual(has, "model" in labels, "%s: %s and $model" % (where, name))

    def test_variables_find_values(self):
        d = load_dashboard()
        for name, text in variable_queries(d):
            q, label = read_variable_query(text)
            for series, _ in q.selectors:
                self.assertIn(label, self.single.labels.get(series, set()) | TARGET_LABELS,
                              "variable $%s: %s has no label %s" % (name, series, label))


def main():
    global BUILD_DIR
    args = sys.argv[1:]
    if "--build-dir" in args:
        i = args.index("--build-dir")
        BUILD_DIR = os.path.abspath(args[i + 1])
        del args[i:i + 2]
        node = [p for p in ("tools/eldr-node/eldr-node", "eldr-node")
                if os.access(os.path.join(BUILD_DIR, p), os.X_OK)]
        if not node:
            print("SKIP: no eldr-node under %s" % BUILD_DIR)
            return 77
    prog = unittest.main(argv=[sys.argv[0], *args], exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
