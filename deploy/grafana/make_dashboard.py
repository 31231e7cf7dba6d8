#!/usr/bin/python3
"""Writes deploy/grafana/eldr.json, the Grafana dashboard over eldr-node's /metrics.

    /usr/bin/python3 deploy/grafana/make_dashboard.py            # rewrites eldr.json
    /usr/bin/python3 deploy/grafana/make_dashboard.py --check    # exit 1 if eldr.json is stale

The dashboard is written from this file so that its ~40 panels share one layout, one set of
filters and one style; edit here, run it, commit both. The JSON is what operators import
(Grafana 9 or 10, "Dashboards > New > Import", docs/operations.md "Dashboards"): it declares
its Prometheus data source in `__inputs` and uses only Grafana's built-in panels.

Metric names are exactly what eldr-node exports (docs/node.md "Metrics");
tests/integration/grafana_dashboard_test.py checks every one of them, and every label a query
filters or groups by, against a live node's /metrics.
"""
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "eldr.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
# Every selector is narrowed by the dashboard's two filters. INST for families without a model
# label (route errors by code, worker messages, publishers, shard requests, cluster events).
INST = 'instance=~"$instance"'
SEL = 'model=~"$model",instance=~"$instance"'
RATE = "$__rate_interval"

# Legend of event panels (increase over $__rate_interval, a window wider than a step): the most
# and the latest events per window. Never "sum": overlapping windows would count events twice.
EVENTS = ("max", "lastNotNull")

# Starting points, not measured limits: tune them to your workload (docs/operations.md).
GREEN, YELLOW, ORANGE, RED = "green", "yellow", "orange", "red"


def steps(*pairs):
    """Threshold steps: (None, colour) first, then (value, colour) in increasing order."""
    return {"mode": "absolute",
            "steps": [{"color": c, "value": v} for v, c in pairs]}


class Layout:
    """Panels placed left to right in Grafana's 24-column grid, rows stacked downwards."""

    def __init__(self):
        self.panels = []
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_h = 0

    def _id(self):
        self.next_id += 1
        return self.next_id - 1

    def row(self, title):
        self._newline()
        self.panels.append({"type": "row", "title": title, "collapsed": False, "id": self._id(),
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def add(self, panel, w, h):
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(panel)


def target(expr, legend="", ref="A", instant=False):
    # An empty legend is Grafana's default: the series' labels.
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref,
            "range": not instant, "instant": instant}


def refs(exprs):
    """[(expr, legend)] -> targets A, B, C..."""
    return [target(e, lg, chr(ord("A") + i)) for i, (e, lg) in enumerate(exprs)]


def timeseries(title, description, exprs, unit, thresholds=None, stack=False, bars=False,
               min_zero=True, decimals=None, legend_calcs=("mean", "max", "lastNotNull")):
    defaults = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "bars" if bars else "line",
            "lineWidth": 1,
            "fillOpacity": 60 if bars else (25 if stack else 8),
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "line+area" if thresholds else "off"},
            "axisSoftMin": 0 if min_zero else None,
        },
        "thresholds": thresholds or steps((None, GREEN)),
    }
    if not min_zero:
        del defaults["custom"]["axisSoftMin"]
    return panel("timeseries", title, description, defaults, decimals, {
        "legend": {"showLegend": True, "displayMode": "table", "placement": "bottom",
                   "calcs": list(legend_calcs)},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }, refs(exprs))


def stat(title, description, expr, unit, thresholds, legend="", mappings=None, decimals=None,
         graph=True):
    defaults = {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": thresholds,
                "mappings": mappings or []}
    return panel("stat", title, description, defaults, decimals, {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background", "graphMode": "area" if graph else "none",
        "justifyMode": "auto", "orientation": "auto", "textMode": "auto",
    }, [target(expr, legend)])


def state_timeline(title, description, expr, legend, mappings):
    defaults = {"color": {"mode": "thresholds"}, "mappings": mappings,
                "thresholds": steps((None, GREEN), (1, RED)),
                "custom": {"lineWidth": 0, "fillOpacity": 80}}
    return panel("state-timeline", title, description, defaults, None, {
        "mergeValues": True, "showValue": "auto", "alignValue": "left", "rowHeight": 0.9,
        "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"},
        "tooltip": {"mode": "single", "sort": "none"},
    }, [target(expr, legend)])


def panel(kind, title, description, defaults, decimals, options, targets):
    """The panel every kind above makes: its field defaults (with "decimals" last, when given),
    its options and its queries, on the dashboard's data source."""
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": kind, "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
    }


def rate_by(family, label):
    """The per-second rate of a counter family summed by one label, one line per value."""
    return [(f"sum by ({label}) (rate({family}{{{INST}}}[{RATE}]))", "{{%s}}" % label)]


def quantiles(family, by, legend_prefix, qs=(0.5, 0.99)):
    """histogram_quantile over a histogram family's buckets, one query per quantile."""
    by_le = ", ".join(["le", *by])
    sel = INST if family == "eldr_shard_request_seconds" else SEL
    return [(f"histogram_quantile({q}, sum by ({by_le}) "
             f"(rate({family}_bucket{{{sel}}}[{RATE}])))",
             f"p{int(q * 100)} {legend_prefix}") for q in qs]


def ok_degraded():
    return [{"type": "value", "options": {
        "0": {"text": "ok", "color": GREEN, "index": 0},
        "1": {"text": "DEGRADED", "color": RED, "index": 1}}}]


def build():
    L = Layout()

    # ------------------------------------------------------------------------------ overview
    L.row("Overview")
    L.add(stat("Route rate", "Route decisions per second over the selected models and "
               "instances (eldr_route_decisions_total).",
               f"sum(rate(eldr_route_decisions_total{{{SEL}}}[{RATE}]))", "reqps",
               steps((None, GREEN))), 4, 5)
    L.add(stat("Route latency p99", "Node-side route latency, request received on the "
               "frontend to answer queued (eldr_route_latency_seconds). Thresholds are starting "
               "points: the decision itself takes tens of microseconds.",
               "histogram_quantile(0.99, sum by (le) "
               f"(rate(eldr_route_latency_seconds_bucket{{{SEL}}}[{RATE}])))", "s",
               steps((None, GREEN), (0.001, YELLOW), (0.01, RED))), 4, 5)
    L.add(stat("Route errors", "Route requests answered with an error_reply, per second "
               "(eldr_route_errors_total; no model label: the model may be the error).",
               f"sum(rate(eldr_route_errors_total{{{INST}}}[{RATE}])) or vector(0)", "reqps",
               steps((None, GREEN), (0.001, YELLOW), (1, RED))), 4, 5)
    L.add(stat("Signature coverage", "Route request blocks whose expert counts were known "
               "(eldr_signature_covered_blocks_total / eldr_signature_blocks_total). Low "
               "coverage means routing by load, not by expert locality.",
               f"sum(rate(eldr_signature_covered_blocks_total{{{SEL}}}[{RATE}])) / "
               f"sum(rate(eldr_signature_blocks_total{{{SEL}}}[{RATE}]))", "percentunit",
               steps((None, RED), (0.5, ORANGE), (0.8, GREEN)), decimals=1), 4, 5)
    L.add(stat("Centroid epoch", "Epoch of the current centroid set, per model: the highest any "
               "selected router holds (eldr_centroid_epoch). 'Centroid epoch per router' below "
               "shows routers that disagree.",
               f"max by (model) (eldr_centroid_epoch{{{SEL}}})", "none",
               steps((None, "blue")), legend="{{model}}", decimals=0, graph=False), 4, 5)
    L.add(stat("Signature store", "1 while a model's signature store cannot write "
               "(eldr_store_degraded): routing goes on from memory, changes wait in memory and "
               "are lost if the node stops first (docs/signature-cache.md, Faults).",
               f"max(eldr_store_degraded{{{SEL}}})", "none",
               steps((None, GREEN), (1, RED)), mappings=ok_degraded(), graph=False), 4, 5)

    # ------------------------------------------------------------------------------ routing
    L.row("Routing")
    L.add(timeseries("Route rate by model", "Route decisions per second "
                     "(eldr_route_decisions_total).",
                     [(f"sum by (model) (rate(eldr_route_decisions_total{{{SEL}}}[{RATE}]))",
                       "{{model}}")], "reqps"), 8, 8)
    L.add(timeseries("Route latency (node side)", "Request received on the frontend to answer "
                     "queued, p50 and p99 (eldr_route_latency_seconds).",
                     quantiles("eldr_route_latency_seconds", ["model"], "{{model}}"), "s",
                     thresholds=steps((None, GREEN), (0.001, YELLOW), (0.01, RED))), 8, 8)
    L.add(timeseries("Decision time", "The routing decision itself, policy and load view, p50 "
                     "and p99 (eldr_route_decision_seconds).",
                     quantiles("eldr_route_decision_seconds", ["model"], "{{model}}"), "s"),
          8, 8)
    L.add(timeseries("Decisions per decode worker", "Route decisions per second by the decode "
                     "worker chosen (eldr_route_decisions_total). A balanced pool shows similar "
                     "bands; one worker far above the rest is a hot expert domain.",
                     [(f"sum by (model, worker) (rate(eldr_route_decisions_total{{{SEL}}}"
                       f"[{RATE}]))", "{{model}} worker {{worker}}")], "reqps", stack=True),
          12, 9)
    L.add(timeseries("Locality band size", "Workers the pick was made among "
                     "(eldr_route_band_size): p50, p99 and mean. 1 means the locality decision "
                     "alone chose; the whole pool means load alone chose.",
                     quantiles("eldr_route_band_size", ["model"], "{{model}}") +
                     [(f"sum by (model) (rate(eldr_route_band_size_sum{{{SEL}}}[{RATE}])) / "
                       f"sum by (model) (rate(eldr_route_band_size_count{{{SEL}}}[{RATE}]))",
                       "mean {{model}}")], "none", decimals=1), 12, 9)
    L.add(timeseries("Route errors by code", "Route requests answered with an error_reply, by "
                     "code (eldr_route_errors_total, docs/protocol.md).",
                     rate_by("eldr_route_errors_total", "code"), "reqps"), 12, 8)
    L.add(timeseries("Decode-worker messages", "Messages from decode workers per second, by "
                     "type (eldr_worker_messages_total): registrations, load reports, finished "
                     "requests, drains, publisher registrations.",
                     rate_by("eldr_worker_messages_total", "type"), "ops"), 12, 8)
    L.add(timeseries("Frontend refusals", "Messages the ZeroMQ frontend answered with an error "
                     "or dropped before any actor saw them, by reason "
                     "(eldr_frontend_refused_total): malformed, too_large and unknown_type point "
                     "at a client; overloaded at the node (limits.max_pending); bad_frames at a "
                     "peer using the wrong socket pattern.",
                     rate_by("eldr_frontend_refused_total", "reason"), "ops"), 12, 8)
    L.add(timeseries("Replies lost to slow or gone peers", "Replies dropped per second "
                     "(eldr_frontend_replies_total, outcome dropped: the peer is gone, or its "
                     "backlog is at max_queued_reply_bytes -- eldr_frontend_replies_over_cap_total) "
                     "and route requests pending in the actors (eldr_frontend_pending).",
                     [(f"sum(rate(eldr_frontend_replies_total{{outcome=\"dropped\",{INST}}}"
                       f"[{RATE}]))", "dropped"),
                      (f"sum(rate(eldr_frontend_replies_over_cap_total{{{INST}}}[{RATE}]))",
                       "of which backlog full"),
                      (f"sum(eldr_frontend_pending{{{INST}}})", "pending")], "short"), 12, 8)

    # ------------------------------------------------------------------------------ workers
    L.row("Decode workers: vLLM /metrics scrapes")
    # Only workers registered with a metrics_url are scraped; the others push load_reports and
    # have none of these series.
    L.add(timeseries("Scraped load per worker", "Running + waiting requests in each decode "
                     "worker's last good scrape of its vLLM /metrics (eldr_worker_scraped_load): "
                     "the load the router balances on for workers registered with a "
                     "metrics_url. Workers that push load_reports instead have no series here.",
                     [(f"max by (model, worker) (eldr_worker_scraped_load{{{SEL}}})",
                       "{{model}} worker {{worker}}")], "short", decimals=0,
                     legend_calcs=("mean", "max", "lastNotNull")), 12, 8)
    L.add(timeseries("KV-cache usage per worker", "KV-cache usage (0..1) in each worker's last "
                     "good scrape (eldr_worker_kv_cache_usage, vLLM's kv_cache_usage_perc).",
                     [(f"max by (model, worker) (eldr_worker_kv_cache_usage{{{SEL}}})",
                       "{{model}} worker {{worker}}")], "percentunit",
                     thresholds=steps((None, GREEN), (0.8, YELLOW), (0.95, RED)), decimals=0),
          12, 8)
    L.add(timeseries("Scrapes by result", "Scrapes of the workers' vLLM /metrics per second, by "
                     "worker and result (eldr_worker_scrapes_total): failed ones keep the last "
                     "good values, and a worker whose scrapes fail for worker_timeout_ms is dead.",
                     [(f"sum by (model, worker, result) (rate(eldr_worker_scrapes_total{{{SEL}}}"
                       f"[{RATE}]))", "{{model}} worker {{worker}} {{result}}")], "ops",
                     stack=True), 12, 8)
    L.add(timeseries("Scrape age per worker", "Age of each worker's last good scrape as of the "
                     "last scrape round (eldr_worker_scrape_age_seconds): it climbs while "
                     "scrapes fail; near scrape_interval_ms when all is well. eldr exports no "
                     "per-scrape latency: a slow endpoint shows here as a higher age.",
                     [(f"max by (model, worker) (eldr_worker_scrape_age_seconds{{{SEL}}})",
                       "{{model}} worker {{worker}}")], "s",
                     thresholds=steps((None, GREEN), (5, YELLOW), (30, RED)),
                     legend_calcs=("lastNotNull", "max")), 12, 8)

    # ------------------------------------------------------------------------------ locality
    L.row("Locality: coverage, fallbacks, warnings")
    L.add(timeseries("Signature coverage by model", "Share of route request blocks whose "
                     "counts were known (sent with the request or held by the signature cache).",
                     [(f"sum by (model) (rate(eldr_signature_covered_blocks_total{{{SEL}}}"
                       f"[{RATE}])) / sum by (model) (rate(eldr_signature_blocks_total{{{SEL}}}"
                       f"[{RATE}]))", "{{model}}")], "percentunit",
                     thresholds=steps((None, RED), (0.5, ORANGE), (0.8, GREEN)), decimals=1),
          8, 8)
    L.add(timeseries("Fallbacks by reason", "Decisions of the eldr policy made by load only, "
                     "per second, by reason (eldr_route_fallbacks_total): no_centroid_set, "
                     "no_signature_cache, no_counts, counts_geometry, signature_unusable.",
                     [(f"sum by (model, reason) (rate(eldr_route_fallbacks_total{{{SEL}}}"
                       f"[{RATE}]))", "{{model}} {{reason}}")], "reqps", stack=True), 8, 8)
    L.add(timeseries("Warnings by code", "Warnings route replies carried, per second "
                     "(eldr_route_warnings_total), e.g. counts_geometry: a client sends counts "
                     "of another model's shape.",
                     [(f"sum by (model, warning) (rate(eldr_route_warnings_total{{{SEL}}}"
                       f"[{RATE}]))", "{{model}} {{warning}}")], "reqps", stack=True), 8, 8)
    L.add(timeseries("Share routed by load only", "Fallbacks over decisions: the share of "
                     "routes that had no usable signature.",
                     [(f"sum by (model) (rate(eldr_route_fallbacks_total{{{SEL}}}[{RATE}])) / "
                       f"sum by (model) (rate(eldr_route_decisions_total{{{SEL}}}[{RATE}]))",
                       "{{model}}")], "percentunit",
                     thresholds=steps((None, GREEN), (0.05, YELLOW), (0.2, RED)), decimals=1),
          24, 7)

    # ------------------------------------------------------------------------------ centroids
    L.row("Centroid sets and refit")
    L.add(timeseries("Centroid epoch per router", "Epoch of the current centroid set on each "
                     "router (eldr_centroid_epoch). After a swap or an accepted refit every "
                     "router should step to the same epoch.",
                     [(f"max by (model, instance) (eldr_centroid_epoch{{{SEL}}})",
                       "{{model}} {{instance}}")], "none", decimals=0,
                     legend_calcs=("lastNotNull",)), 8, 8)
    L.add(timeseries("Centroid swaps", "Centroid sets installed (eldr_centroid_swaps_total): "
                     "imports, swaps, rollbacks and accepted refits, summed over routers.",
                     [(f"sum by (model) (increase(eldr_centroid_swaps_total{{{SEL}}}[{RATE}]))",
                       "{{model}}")], "none", bars=True, decimals=0,
                     legend_calcs=EVENTS), 8, 8)
    L.add(timeseries("Refits by outcome", "Refits run (eldr_refits_total): accepted ones install "
                     "a new epoch, rejected ones keep the current set (the reason is in the "
                     "node's log and in eldrctl refit's answer).",
                     [(f"sum by (model, outcome) (increase(eldr_refits_total{{{SEL}}}[{RATE}]))",
                       "{{model}} {{outcome}}")], "none", bars=True, decimals=0,
                     legend_calcs=EVENTS), 8, 8)

    # ------------------------------------------------------------------------------ ingest
    L.row("Signature cache: ingest from publishers")
    L.add(timeseries("Ingest per publisher", "Publisher messages applied to the signature "
                     "cache per second (eldr_ingest_messages_total); kind kv = vLLM KV events, "
                     "counts = eldr counts messages.",
                     [(f"sum by (model, publisher, kind) (rate(eldr_ingest_messages_total"
                       f"{{{SEL}}}[{RATE}]))", "{{publisher}} {{kind}}")], "ops"), 8, 8)
    L.add(timeseries("Sequence gaps per publisher", "Sequence gaps seen per publisher "
                     "(eldr_ingest_gaps_total), the replayed batches and the gaps no replay "
                     "filled (the worker's blocks were resynchronised).",
                     [(f"sum by (model, publisher) (increase(eldr_ingest_gaps_total{{{SEL}}}"
                       f"[{RATE}]))", "gaps {{publisher}}"),
                      (f"sum(increase(eldr_ingest_replayed_total{{{INST}}}[{RATE}]))",
                       "batches replayed"),
                      (f"sum(increase(eldr_ingest_gaps_unfilled_total{{{INST}}}[{RATE}]))",
                       "gaps unfilled")], "none", bars=True, decimals=0, legend_calcs=EVENTS),
          8, 8)
    L.add(timeseries("Dropped messages per publisher", "Publisher messages dropped per second, "
                     "by cause (eldr_ingest_dropped_total).",
                     [(f"sum by (model, publisher, cause) (rate(eldr_ingest_dropped_total"
                       f"{{{SEL}}}[{RATE}]))", "{{publisher}} {{cause}}")], "ops",
                     thresholds=steps((None, GREEN), (0.001, RED)), stack=True), 8, 8)
    L.add(timeseries("Publishers followed", "Publishers each signature-cache node follows "
                     "(eldr_publishers) against signature_cache.max_publishers "
                     "(eldr_publishers_max).",
                     [(f"sum by (instance) (eldr_publishers{{{INST}}})", "{{instance}}"),
                      (f"max(eldr_publishers_max{{{INST}}})", "max_publishers")], "none",
                     decimals=0, legend_calcs=("lastNotNull", "max")), 8, 8)
    L.add(timeseries("Publisher problems", "Registrations refused (at max_publishers, or an "
                     "endpoint followed for another model), subscriptions ZeroMQ refused, "
                     "publishers forgotten after publisher_forget_ms of silence, replays that "
                     "failed; and replays asked.",
                     [(f"sum(increase(eldr_publisher_registrations_refused_total{{{INST}}}"
                       f"[{RATE}]))", "registrations refused"),
                      (f"sum(increase(eldr_publisher_subscribe_failed_total{{{INST}}}[{RATE}]))",
                       "subscriptions failed"),
                      (f"sum(increase(eldr_publishers_forgotten_total{{{INST}}}[{RATE}]))",
                       "forgotten"),
                      (f"sum(increase(eldr_publisher_replays_failed_total{{{INST}}}[{RATE}]))",
                       "replays failed"),
                      (f"sum(increase(eldr_publisher_replays_total{{{INST}}}[{RATE}]))",
                       "replays asked")], "none", bars=True, decimals=0, legend_calcs=EVENTS),
          8, 8)
    L.add(timeseries("Blocks held and commit time", "Blocks the signature cache holds "
                     "(eldr_sigcache_blocks, left axis) and the p99 of its group commits on the "
                     "route path (eldr_sigcache_commit_seconds): time route requests wait.",
                     [(f"sum by (model) (eldr_sigcache_blocks{{{SEL}}})", "blocks {{model}}")] +
                     quantiles("eldr_sigcache_commit_seconds", ["model"], "commit {{model}}",
                               qs=(0.99,)), "short", legend_calcs=("lastNotNull", "max")), 8, 8)
    # The commit-time series are seconds: a second axis in seconds.
    L.panels[-1]["fieldConfig"]["overrides"] = [{
        "matcher": {"id": "byRegexp", "options": "p99 commit.*"},
        "properties": [{"id": "unit", "value": "s"},
                       {"id": "custom.axisPlacement", "value": "right"}]}]

    # ------------------------------------------------------------------------------ store
    L.row("Signature store (RocksDB)")
    L.add(state_timeline("Store state", "Each model's signature store on each node: ok, or "
                         "DEGRADED while it cannot write (eldr_store_degraded).",
                         f"max by (model, instance) (eldr_store_degraded{{{SEL}}})",
                         "{{model}} {{instance}}", ok_degraded()), 12, 8)
    L.add(timeseries("Pending changes", "Changes in memory not yet written to the store "
                     "(eldr_store_pending_changes); they grow while degraded and are lost if "
                     "the node stops first.",
                     [(f"sum by (model, instance) (eldr_store_pending_changes{{{SEL}}})",
                       "{{model}} {{instance}}")], "short",
                     legend_calcs=("lastNotNull", "max")), 12, 8)
    L.add(timeseries("Store errors and recoveries", "Failed writes, unreadable stored counts, "
                     "commits made while degraded, recoveries from degraded, and data RocksDB "
                     "reported dropping while replaying its WAL at open.",
                     [(f"sum by (model) (increase(eldr_store_write_errors_total{{{SEL}}}"
                       f"[{RATE}]))", "write errors {{model}}"),
                      (f"sum by (model) (increase(eldr_store_read_errors_total{{{SEL}}}"
                       f"[{RATE}]))", "read errors {{model}}"),
                      (f"sum by (model) (increase(eldr_store_unpersisted_commits_total{{{SEL}}}"
                       f"[{RATE}]))", "unpersisted commits {{model}}"),
                      (f"sum by (model) (increase(eldr_store_recoveries_total{{{SEL}}}"
                       f"[{RATE}]))", "recoveries {{model}}"),
                      (f"sum by (model) (increase(eldr_store_recovery_events_total{{{SEL}}}"
                       f"[{RATE}]))", "WAL recovery events {{model}}")], "none", bars=True,
                     decimals=0, legend_calcs=EVENTS), 24, 8)

    # ------------------------------------------------------------------------------ cluster
    L.row("Cluster")
    L.add(stat("eldr nodes scraped", "eldr nodes whose /metrics the data source scraped "
               "last (every node exports eldr_shard_request_seconds from start-up).",
               f'count(eldr_shard_request_seconds_count{{{INST},shard="local"}})', "none",
               steps((None, "blue")), decimals=0), 4, 8)
    L.add(timeseries("Shard request latency", "A router's signature shard requests, sent to "
                     "answered, p50 and p99, by where the shard is (eldr_shard_request_seconds): "
                     "remote is the cross-node part of a route in a cluster.",
                     quantiles("eldr_shard_request_seconds", ["shard"], "{{shard}}"), "s"),
          10, 8)
    L.add(timeseries("Shard requests", "Shard requests per second, local and remote.",
                     [(f"sum by (shard) (rate(eldr_shard_request_seconds_count{{{INST}}}"
                       f"[{RATE}]))", "{{shard}}")], "reqps", stack=True), 10, 8)
    L.add(stat("Members up", "The fewest cluster members any selected node sees up, itself "
               "included (eldr_cluster_members). Below the cluster's size: a node is down or "
               "cut off; 'Members seen per node' shows which.",
               f"min(eldr_cluster_members{{{INST}}})", "none", steps((None, "blue")),
               decimals=0), 6, 5)
    L.add(stat("Refit leaders", "Nodes that lead refits (eldr_cluster_is_leader): exactly 1 in a "
               "healthy cluster; 0 while none has a majority of the members.",
               f"sum(eldr_cluster_is_leader{{{INST}}})", "none",
               steps((None, RED), (1, GREEN), (2, RED)), decimals=0), 6, 5)
    L.add(stat("Leader's term", "The refit leader's term, the highest any selected node knows "
               "(eldr_cluster_term). It rises at every change of leader; epochs are numbered "
               "inside it.", f"max(eldr_cluster_term{{{INST}}})", "none", steps((None, "blue")),
               decimals=0), 6, 5)
    L.add(stat("eldr versions", "eldr-node instances per version and cluster protocol "
               "(eldr_build_info): more than one version during a rolling upgrade; nodes of two "
               "cluster protocols do not join each other (docs/cluster.md, \"Upgrades\").",
               f"count by (version, cluster_protocol) (eldr_build_info{{{INST}}})", "none",
               steps((None, "blue")), legend="{{version}} (protocol {{cluster_protocol}})",
               decimals=0, graph=False), 6, 5)
    L.add(state_timeline("Refit leader", "Which node leads refits over time "
                         "(eldr_cluster_is_leader): leader or follower, per instance.",
                         f"max by (instance) (eldr_cluster_is_leader{{{INST}}})", "{{instance}}",
                         [{"type": "value", "options": {
                             "0": {"text": "follower", "color": "transparent", "index": 0},
                             "1": {"text": "leader", "color": GREEN, "index": 1}}}]), 8, 8)
    L.add(timeseries("Members seen per node", "Cluster members each node sees up, itself "
                     "included (eldr_cluster_members): nodes that disagree are partitioned.",
                     [(f"max by (instance) (eldr_cluster_members{{{INST}}})", "{{instance}}")],
                     "none", decimals=0, legend_calcs=("lastNotNull", "min")), 8, 8)
    L.add(timeseries("Term per node", "The refit leader's term as each node knows it "
                     "(eldr_cluster_term; 0 while a node knows no leader).",
                     [(f"max by (instance) (eldr_cluster_term{{{INST}}})", "{{instance}}")],
                     "none", decimals=0, legend_calcs=("lastNotNull",)), 8, 8)
    L.add(timeseries("Membership events", "Cluster membership events (eldr_cluster_events_total)"
                     ": join, down, refused (a join without the cluster secret), protocol (a "
                     "node of another cluster protocol: another build's layouts), untrusted (a "
                     "message from a node that never proved it), leader (this node won refit "
                     "leadership for a new term). `eldrctl status` names the members and the "
                     "leader.",
                     [(f"sum by (event) (increase(eldr_cluster_events_total{{{INST}}}[{RATE}]))",
                       "{{event}}")], "none", bars=True, decimals=0, legend_calcs=EVENTS),
          24, 8)

    return L.panels


def dashboard():
    panels = build()
    kinds = sorted({p["type"] for p in panels if p["type"] != "row"})
    names = {"timeseries": "Time series", "stat": "Stat", "state-timeline": "State timeline"}
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus",
                      "description": "The Prometheus that scrapes eldr-node's /metrics",
                      "type": "datasource", "pluginId": "prometheus",
                      "pluginName": "Prometheus"}],
        "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana",
                        "version": "9.0.0"},
                       {"type": "datasource", "id": "prometheus", "name": "Prometheus",
                        "version": "1.0.0"}] +
                      [{"type": "panel", "id": k, "name": names[k], "version": ""}
                       for k in kinds],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": "eldr: expert-locality routing for disaggregated MoE serving. Metrics of "
                       "eldr-node (docs/node.md, Metrics); rows are described in "
                       "docs/operations.md, Dashboards.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "liveNow": False,
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": 37,
        "style": "dark",
        "tags": ["eldr", "llm", "routing"],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {"selected": False, "text": "${DS_PROMETHEUS}",
                                                "value": "${DS_PROMETHEUS}"},
             "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
             "regex": "", "skipUrlSync": False},
            {"name": "model", "label": "Model", "type": "query", "datasource": DS,
             # Every signature-cache node renders this for each configured model from start-up.
             "definition": "label_values(eldr_store_degraded, model)",
             "query": "label_values(eldr_store_degraded, model)",
             "current": {}, "hide": 0, "includeAll": True, "multi": True, "allValue": ".*",
             "options": [], "refresh": 2, "regex": "", "skipUrlSync": False, "sort": 1},
            {"name": "instance", "label": "Instance", "type": "query", "datasource": DS,
             # Every eldr-node renders this from start-up, whatever its roles.
             "definition": "label_values(eldr_shard_request_seconds_count, instance)",
             "query": "label_values(eldr_shard_request_seconds_count, instance)",
             "current": {}, "hide": 0, "includeAll": True, "multi": True, "allValue": ".*",
             "options": [], "refresh": 2, "regex": "", "skipUrlSync": False, "sort": 1},
        ]},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "eldr",
        "uid": "eldr-overview",
        "version": 1,
        "weekStart": "",
    }


def render():
    return json.dumps(dashboard(), indent=2) + "\n"


def main():
    text = render()
    if sys.argv[1:] == ["--check"]:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is not what {Path(__file__).name} writes: run it and commit both",
                  file=sys.stderr)
            return 1
        return 0
    if sys.argv[1:]:
        sys.exit(__doc__)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
