#!/usr/bin/python3
"""The operator page (docs/operations.md, "The operator page") in a real headless Chromium against
a live eldr-node under eldr-loadgen traffic.

A node is started on free ports (port 0, endpoints from its --ready-file); eldr-loadgen registers
its emulated decode workers and a KV-event publisher, imports its centroid set and routes a
synthetic workload. Once the node's own /api/status shows the workers and routed requests, and
/api/history has points with traffic, Debian's `chromium --headless=new --dump-dom` loads `GET /`
and the rendered DOM is checked against what the node reports at that moment: one worker row per
registered worker with its live in-flight number and running / waiting (from the load_reports
loadgen's workers push; their scraped cell says "not scraped", with a tooltip), the model's current epoch
among the stored ones,
the routed count, sparkline SVGs with points, the publisher rows. Also: /api/unknown is 404 and a
POST is refused, and the page loads nothing from another origin. Then node 1 of a 2-node loopback
cluster (deploy/local/eldr-cluster): one member row per member, the refit leader and its term as
the node reports them.

With --screenshot PATH, also writes a PNG of the page (docs/img/operator-page.png is made so:
tools/operator-page-screenshot.sh).

Fails (exit 1, not a skip) when chromium is not installed: deploy/install-deps.sh installs it.
Waits are bounded by deadlines on observable conditions.

usage: operator_page_test.py --build-dir BUILD [--screenshot PATH] [--no-cluster] [--keep]
"""
import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support",
                                "py"))
import eldr_testing  # noqa: E402

WORKERS = 6
MODEL = "default"


def fail(msg):
    print("FAILED:", msg, flush=True)
    sys.exit(1)


def http(port, method, path):
    """(status, body bytes) of one request to the node's metrics port."""
    return eldr_testing.http_request("127.0.0.1", port, path, method)


def api(port, path):
    code, body = http(port, "GET", path)
    if code != 200:
        fail("GET %s: %d %r" % (path, code, body[:200]))
    return json.loads(body)


def poll(what, cond, timeout):
    """cond()'s first truthy value; fails naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.2)  # polling interval of a condition with a deadline
    fail("%s: not within %.0f s" % (what, timeout))


class Dom(html.parser.HTMLParser):
    """The elements of a dumped DOM: (tag, attrs dict, text inside, until the element ends)."""

    def __init__(self):
        super().__init__()
        self.elements, self.open = [], []

    def handle_starttag(self, tag, attrs):
        e = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(e)
        if tag not in ("meta", "link", "br", "img", "input", "polyline"):
            self.open.append(e)

    def handle_endtag(self, tag):
        for i in range(len(self.open) - 1, -1, -1):
            if self.open[i]["tag"] == tag:
                del self.open[i:]
                break

    def handle_data(self, data):
        for e in self.open:
            e["text"] += data

    def find(self, tag=None, **attrs):
        out = []
        for e in self.elements:
            if tag and e["tag"] != tag:
                continue
            if all(v in classes(e) if k == "class_" else e["attrs"].get(k.replace("_", "-")) == v
                   for k, v in attrs.items()):
                out.append(e)
        return out


def classes(e):
    return (e["attrs"].get("class") or "").split()


def chromium_cmd(chromium, profile, extra, url):
    return [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", "--user-data-dir=" + profile, "--virtual-time-budget=8000"] + \
        extra + [url]


def stop(*procs):
    """SIGTERM to each of our processes still running, SIGKILL after 30 s."""
    for p in procs:
        if p is not None:
            eldr_testing.stop_process(p, timeout=30)


def dump_dom(chromium, profile, url, tmp, name):
    r = subprocess.run(chromium_cmd(chromium, profile, ["--dump-dom"], url),
                       capture_output=True, text=True, timeout=180)
    if r.returncode != 0 or "<html" not in r.stdout:
        fail("chromium --dump-dom %s: exit %d\n%s" % (url, r.returncode, r.stderr[-2000:]))
    with open(os.path.join(tmp, name), "w") as f:
        f.write(r.stdout)
    dom = Dom()
    dom.feed(r.stdout)
    body = dom.find("body")[0]
    if int(body["attrs"].get("data-rendered", "0")) < 1:
        fail("the page at %s never rendered a snapshot; error line: %r" %
             (url, [e["text"] for e in dom.find(id="error")]))
    if dom.find(id="error")[0]["text"].strip():
        fail("the page shows an error: %r" % dom.find(id="error")[0]["text"])
    return dom, r.stdout


def check_cluster(chromium, profile, tmp, src, build_dir):
    """Node 1 of a 2-node loopback cluster (deploy/local/eldr-cluster): the members, the refit
    leader and its term as the node reports them."""
    script = os.path.join(src, "deploy", "local", "eldr-cluster")
    cdir = os.path.join(tmp, "cluster")
    r = subprocess.run(["bash", script, "start", "2", "--dir", cdir, "--bin",
                        os.path.join(build_dir, "tools", "eldr-node"), "--timeout", "60"],
                       capture_output=True, text=True, timeout=180)
    try:
        if r.returncode != 0:
            fail("eldr-cluster start 2: %s%s" % (r.stdout, r.stderr))
        n1 = json.loads(r.stdout.splitlines()[0])
        port = int(n1["metrics"].split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])

        def settled():
            st = api(port, "/api/status")
            c = st.get("cluster")
            if (c and len(c["members"]) == 2 and all(m["alive"] for m in c["members"]) and
                    c.get("refit", {}).get("leader") and c["refit"].get("term", 0) > 0):
                return st
            return None
        poll("a 2-node cluster with a refit leader in /api/status", settled, 90)
        dom, _ = dump_dom(chromium, profile, "http://127.0.0.1:%d/" % port, tmp, "cluster.html")
        after = api(port, "/api/status")["cluster"]
        section = dom.find("section", id="cluster")[0]
        if "hidden" in section["attrs"]:
            fail("the cluster section is hidden on a clustered node")
        members = dom.find("tr", class_="member-row")
        if len(members) != len(after["members"]):
            fail("member rows: page %d, node %d" % (len(members), len(after["members"])))
        for m in after["members"]:
            if not any(m["name"] in row["text"] and m["address"] in row["text"] for row in members):
                fail("member %s (%s) not shown" % (m["name"], m["address"]))
        leader = [e for e in dom.find("div") if "cluster-leader" in classes(e)]
        term = [e for e in dom.find("div") if "cluster-term" in classes(e)]
        if not leader or leader[0]["text"].split()[-1] != after["refit"]["leader"]:
            fail("leader: page %r, node %r" % (leader and leader[0]["text"],
                                              after["refit"]["leader"]))
        if not term or term[0]["text"].split()[-1] != str(after["refit"]["term"]):
            fail("term: page %r, node %r" % (term and term[0]["text"], after["refit"]["term"]))
        print("ok: cluster of %d, leader %s, term %d" %
              (len(members), after["refit"]["leader"], after["refit"]["term"]), flush=True)
    finally:
        subprocess.run(["bash", script, "stop", "--dir", cdir], capture_output=True, timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--screenshot", help="also write a PNG of the page here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--no-cluster", action="store_true", help="skip the 2-node cluster part")
    ap.add_argument("--source-dir",
                    default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                         ".."))
    args = ap.parse_args()

    chromium = shutil.which("chromium")
    if chromium is None:
        fail("chromium is not installed (Debian's `chromium` package; deploy/install-deps.sh "
             "installs it): the operator page cannot be checked")
    node_bin = os.path.join(args.build_dir, "tools/eldr-node/eldr-node")
    loadgen_bin = os.path.join(args.build_dir, "tools/eldr-loadgen/eldr-loadgen")
    for b in (node_bin, loadgen_bin):
        if not os.access(b, os.X_OK):
            fail("%s is not built" % b)

    tmp = tempfile.mkdtemp(prefix="eldr-operator-page-")
    node = loadgen = None
    try:
        ready = os.path.join(tmp, "ready.json")
        node = subprocess.Popen(
            eldr_testing.loopback_node_argv(node_bin, os.path.join(tmp, "db"))
            + ["--ready-file", ready],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "node.log"), "w"))
        ep = eldr_testing.wait_ready_file(ready, node, 60, interval=0.2)
        if ep is None:
            if node.poll() is not None:
                fail("eldr-node exited (%s); see %s" % (node.returncode, tmp))
            fail("eldr-node ready: not within 60 s")
        port = int(ep["metrics"].split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])

        # Read-only, and nothing under /api but what exists.
        if http(port, "GET", "/api/unknown")[0] != 404:
            fail("/api/unknown is not 404")
        if http(port, "POST", "/api/status")[0] != 405:
            fail("POST /api/status is not refused with 405")
        code, page = http(port, "GET", "/")
        if code != 200 or b"<!DOCTYPE html>" not in page:
            fail("GET / did not serve the page: %d" % code)
        for needle in (b"src=\"http", b"href=\"http", b"@import", b"//cdn"):
            if needle in page:
                fail("the page loads something from elsewhere (%r)" % needle)

        # Traffic: emulated decode workers (live in-flight counts) and prefill workers with a
        # KV-event publisher, for longer than the checks take; stopped once they are done.
        loadgen = subprocess.Popen(
            [loadgen_bin, "--node", ep["admin"], "--synthetic", "qwen-task", "--rate", "60",
             "--duration", "120", "--decode-workers", str(WORKERS), "--policies", "eldr",
             "--json", "--quiet"],
            stdout=open(os.path.join(tmp, "loadgen.json"), "w"),
            stderr=open(os.path.join(tmp, "loadgen.log"), "w"))

        def traffic():
            if loadgen.poll() is not None:
                fail("eldr-loadgen exited early (%s); see %s" % (loadgen.returncode, tmp))
            s = api(port, "/api/status")
            if s.get("starting"):
                return None
            m = [x for x in s["models"] if x["name"] == MODEL]
            page_m = s.get("page", {}).get("models", {}).get(MODEL, {})
            h = [x for x in api(port, "/api/history")["models"] if x["name"] == MODEL]
            busy = [r for r in h[0]["routes_per_s"] if r > 0] if h else []
            if (m and m[0]["routed"] > 0 and m[0]["epoch"] >= 1 and
                    len(page_m.get("workers", [])) == WORKERS and len(busy) >= 2 and
                    any(w["load"] > 0 for w in page_m["workers"])):
                return s
            return None
        poll("traffic visible in /api/status and /api/history", traffic, 90)

        profile = os.path.join(tmp, "chromium-profile")
        url = "http://127.0.0.1:%d/" % port
        dom, text = dump_dom(chromium, profile, url, tmp, "dom.html")
        # What the node reports now (a snapshot at most one interval newer than the page's).
        after = api(port, "/api/status")
        if after["node"]["name"] not in dom.find(id="node-name")[0]["text"]:
            fail("node name not shown")
        sections = dom.find("section", data_model=MODEL)
        if len(sections) != 1:
            fail("expected one section for model %s, got %d" % (MODEL, len(sections)))

        rows = dom.find("tr", class_="worker-row")
        reported = after["page"]["models"][MODEL]["workers"]
        if len(rows) != len(reported) or len(rows) != WORKERS:
            fail("worker rows: page %d, node %d, registered %d" % (len(rows), len(reported),
                                                                   WORKERS))
        shown = sorted(int(x["attrs"]["data-worker"]) for x in rows)
        if shown != sorted(w["worker"] for w in reported):
            fail("worker indices: page %r, node %r" % (shown, [w["worker"] for w in reported]))
        in_flight = [int(x["attrs"]["data-in-flight"]) for x in rows]
        if sum(in_flight) == 0:
            fail("no worker shows a request in flight under load: %r" % in_flight)
        for x in rows:
            if "active" not in x["text"] and "full" not in x["text"]:
                fail("worker row without a live state: %r" % x["text"])
        # loadgen's workers push load_reports with running / waiting: the node lists those
        # (load_source "report"), the page shows them, and only the scraped cell says
        # "not scraped", with a tooltip, instead of a bare "-".
        unscraped = [w for w in reported if "scrapes" not in w]
        if not unscraped or any(w.get("load_source") != "report" or w.get("running") is None
                                for w in unscraped):
            fail("workers that push load_reports should list load_source 'report' and running: %r"
                 % unscraped)
        marked = [e for e in dom.find("td", class_="not-scraped") if e["attrs"].get("title")]
        if len(marked) != len(unscraped):
            fail("not-scraped cells with a tooltip: %d, expected 1 for each of %d workers that "
                 "push load_reports" % (len(marked), len(unscraped)))
        if not any(re.search(r"\d+ / \d+", x["text"]) for x in rows):
            fail("no worker row shows running / waiting from its reports: %r"
                 % [x["text"] for x in rows])

        model = [m for m in after["models"] if m["name"] == MODEL][0]
        epoch_fact = [e for e in dom.find("div") if "model-epoch" in classes(e)]
        if not epoch_fact or epoch_fact[0]["text"].split()[-1] != str(model["epoch"]):
            fail("epoch: page %r, node %d" % (epoch_fact and epoch_fact[0]["text"],
                                             model["epoch"]))
        current = [e for e in dom.find("span") if "current" in classes(e)]
        if not current or current[0]["text"].strip() != str(model["epoch"]):
            fail("the current epoch is not marked among the stored ones")
        routed_fact = [e for e in dom.find("div") if "model-routed" in classes(e)]
        routed_shown = int(routed_fact[0]["text"].split()[-1])
        if not 0 < routed_shown <= model["routed"]:
            fail("routed: page %d, node %d" % (routed_shown, model["routed"]))

        for series in ("routes_per_s", "p50_ms", "p99_ms", "band_mean"):
            sv = [e for e in dom.find("svg", data_series=series) if "mini" not in classes(e)]
            if len(sv) != 1 or int(sv[0]["attrs"]["data-points"]) < 2:
                fail("sparkline %s: %r" % (series, [e["attrs"] for e in sv]))
        polylines = [e for e in dom.find("polyline") if e["attrs"].get("points")]
        if len(polylines) < 4 + 1:
            fail("sparklines without points: %d drawn" % len(polylines))
        minis = dom.find("svg", data_series="in_flight")
        if len(minis) != WORKERS:
            fail("per-worker in-flight sparklines: %d" % len(minis))

        publishers = dom.find("tr", class_="publisher-row")
        if not publishers:
            fail("no publisher row (eldr-loadgen registers one)")
        if "refit" not in text.lower():
            fail("no refit part")
        print("ok: %d worker rows (in flight %r, %d marked not scraped), epoch %d, %d routed "
              "shown, %d publisher rows" % (len(rows), in_flight, len(unscraped), model["epoch"],
                                            routed_shown, len(publishers)), flush=True)

        if args.screenshot:
            out = os.path.abspath(args.screenshot)
            r = subprocess.run(chromium_cmd(chromium, profile,
                                            ["--screenshot=" + out, "--window-size=1400,1000",
                                             "--hide-scrollbars"], url),
                               capture_output=True, text=True, timeout=180)
            if r.returncode != 0 or not os.path.exists(out):
                fail("chromium --screenshot: exit %d\n%s" % (r.returncode, r.stderr[-2000:]))
            print("screenshot:", out)
        stop(loadgen, node)
        if not args.no_cluster:
            check_cluster(chromium, profile, tmp, args.source_dir, args.build_dir)
    finally:
        stop(loadgen, node)
        if args.keep:
            print("kept:", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
