"""eldr-proxy's metrics, declared once here and exported in Prometheus' text format (0.0.4).

Label values come from the proxy's own vocabulary (reasons, endpoints, instance indices) or from
eldr's replies (fallback reasons, warning codes: at most 64 bytes by protocol, escaped here), and
each labelled family holds at most MAX_SERIES series, so nothing a peer sends grows memory
without bound.
"""
import bisect
import math

MAX_SERIES = 256


def _escape(v):
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')[:128]


class _Family:
    def __init__(self, registry, name, help_text, kind, labels):
        self.name, self.help, self.kind, self.labels = name, help_text, kind, tuple(labels)
        self.series = {}
        self.dropped = 0
        registry.append(self)

    def _key(self, values):
        if len(values) != len(self.labels):
            raise ValueError("%s takes labels %s" % (self.name, self.labels))
        key = tuple(map(str, values))  # no generator frame: every request observes several
        if key not in self.series and len(self.series) >= MAX_SERIES:
            self.dropped += 1
            return None
        return key

    def _label_text(self, key, extra=()):
        pairs = list(zip(self.labels, key)) + list(extra)
        if not pairs:
            return ""
        return "{" + ",".join('%s="%s"' % (k, _escape(v)) for k, v in pairs) + "}"


class Counter(_Family):
    def __init__(self, registry, name, help_text, labels=()):
        super().__init__(registry, name, help_text, "counter", labels)

    def inc(self, *values, by=1):
        key = self._key(values)
        if key is not None:
            self.series[key] = self.series.get(key, 0) + by

    def value(self, *values):
        return self.series.get(tuple(str(v) for v in values), 0)

    def total(self):
        return sum(self.series.values())

    def render(self, out):
        for key, v in sorted(self.series.items()):
            out.append("%s%s %s" % (self.name, self._label_text(key), _num(v)))


class Gauge(_Family):
    """A gauge whose value is read from a function when rendered (no stale copies)."""

    def __init__(self, registry, name, help_text, labels=(), read=None, kind="gauge"):
        # kind "counter": a total kept elsewhere (e.g. by the HTTP client), read when rendered.
        super().__init__(registry, name, help_text, kind, labels)
        self.read = read  # () -> {label tuple: value} or a number when unlabelled

    def render(self, out):
        values = self.read()
        if not self.labels:
            out.append("%s %s" % (self.name, _num(values)))
            return
        for key, v in sorted(values.items()):
            out.append("%s%s %s" % (self.name, self._label_text(tuple(str(x) for x in key)),
                                    _num(v)))


class Histogram(_Family):
    def __init__(self, registry, name, help_text, buckets, labels=()):
        super().__init__(registry, name, help_text, "histogram", labels)
        self.buckets = sorted(buckets)

    def observe(self, seconds, *values):
        key = self._key(values)
        if key is None:
            return
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = [[0] * len(self.buckets), 0, 0.0]
        i = bisect.bisect_left(self.buckets, seconds)
        if i < len(self.buckets):
            s[0][i] += 1
        s[1] += 1
        s[2] += seconds

    def count(self, *values):
        s = self.series.get(tuple(str(v) for v in values))
        return s[1] if s else 0

    def render(self, out):
        for key, (per_bucket, count, total) in sorted(self.series.items()):
            running = 0
            for le, n in zip(self.buckets, per_bucket):
                running += n
                out.append("%s_bucket%s %d" % (self.name,
                                               self._label_text(key, [("le", _num(le))]), running))
            out.append("%s_bucket%s %d" % (self.name, self._label_text(key, [("le", "+Inf")]),
                                           count))
            out.append("%s_sum%s %s" % (self.name, self._label_text(key), _num(total)))
            out.append("%s_count%s %d" % (self.name, self._label_text(key), count))


def _num(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "+Inf" if v > 0 else "-Inf"
        return repr(v)
    return str(v)


def render(registry):
    out = []
    for f in registry:
        out.append("# HELP %s %s" % (f.name, f.help))
        out.append("# TYPE %s %s" % (f.name, f.kind))
        f.render(out)
    dropped = sum(f.dropped for f in registry)
    out.append("# HELP eldr_proxy_metric_series_dropped_total observations dropped because a "
               "labelled family held %d series" % MAX_SERIES)
    out.append("# TYPE eldr_proxy_metric_series_dropped_total counter")
    out.append("eldr_proxy_metric_series_dropped_total %d" % dropped)
    return "\n".join(out) + "\n"


LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0)


class ProxyMetrics:
    """Every metric eldr-proxy exports (docs/eldr-proxy.md, "Metrics")."""

    def __init__(self, in_flight, upstream_health, counts_native=lambda: 0,
                 upstream_client=lambda: None):
        r = self.registry = []
        self.requests = Counter(
            r, "eldr_proxy_requests_total",
            "client requests by API endpoint and outcome (ok, client_error: the client's request "
            "was refused by the proxy or a prefill instance, prefill_error, decode_error, "
            "rejected: over --max-concurrent, disconnected: the client went away, "
            "internal_error: a bug in the proxy, logged)",
            ("endpoint", "outcome"))
        self.in_flight = Gauge(r, "eldr_proxy_in_flight", "client requests being served",
                               read=in_flight)
        self.eldr_errors = Counter(
            r, "eldr_proxy_eldr_errors_total",
            "route calls eldr did not answer with a decision (timeout, an error_reply code name, "
            "bad_reply); the proxy then picked the decode instance itself", ("reason",))
        self.own_picks = Counter(
            r, "eldr_proxy_fallback_picks_total",
            "decode instances the proxy picked itself (least loaded by its own in-flight count), "
            "by why eldr's decision was not used (decode_down: the chosen instance refused the "
            "connection, and the request went to another)", ("reason",))
        self.route_fallbacks = Counter(
            r, "eldr_proxy_route_fallbacks_total",
            "eldr decisions made by load only (the route reply's fallback reason)", ("reason",))
        self.route_warnings = Counter(
            r, "eldr_proxy_route_warnings_total",
            "warnings in eldr's route replies, by code", ("code",))
        self.routed = Counter(r, "eldr_proxy_routed_total",
                              "requests sent to each decode instance, by who decided",
                              ("decode", "decided_by"))
        self.prefill_failures = Counter(
            r, "eldr_proxy_prefill_failures_total",
            "prefill calls that failed (connect, connection, timeout, protocol, status, "
            "bad_response, too_large)",
            ("prefill", "reason"))
        self.decode_failures = Counter(
            r, "eldr_proxy_decode_failures_total",
            "decode calls that failed before or while relaying", ("decode", "reason"))
        self.counts_errors = Counter(
            r, "eldr_proxy_counts_errors_total",
            "requests routed without counts because the prefill's routed experts could not "
            "become counts", ("reason",))
        self.block_hashes = Counter(
            r, "eldr_proxy_block_hashes_total",
            "requests by the source of their block hashes (vllm, proxy, request)", ("source",))
        self.missing_kv_params = Counter(
            r, "eldr_proxy_missing_kv_transfer_params_total",
            "prefill responses without kv_transfer_params (the decode instance then recomputes "
            "the prompt)")
        self.finished = Counter(r, "eldr_proxy_finished_reported_total",
                                "request ids reported finished to eldr (acknowledged)")
        self.finished_lost = Counter(
            r, "eldr_proxy_finished_lost_total",
            "finished reports given up (eldr unreachable after retries, or the queue full)")
        self.registrations = Counter(r, "eldr_proxy_registrations_total",
                                     "decode-instance registrations with eldr by outcome",
                                     ("outcome",))
        self.upstream_healthy = Gauge(
            r, "eldr_proxy_upstream_healthy",
            "1 when the proxy sends to the instance, 0 while it is marked down", ("role", "index"),
            read=upstream_health)
        self.counts_native = Gauge(
            r, "eldr_proxy_counts_native",
            "1 when routed experts become counts with the compiled library "
            "(libeldr_counts_native.so), 0 when with numpy (slower: the library "
            "was not found, see the start-up log)", read=counts_native)
        def client_value(attr):
            return lambda: getattr(upstream_client(), attr, 0)
        self.upstream_connections = Gauge(
            r, "eldr_proxy_upstream_connections_opened_total",
            "connections opened to the vLLM instances (kept and reused: far fewer than the "
            "requests)", read=client_value("connections_opened"), kind="counter")
        self.upstream_resent = Gauge(
            r, "eldr_proxy_upstream_resent_total",
            "requests sent again on a new connection because the instance had closed the kept "
            "one as they went out (nothing of them was answered)",
            read=client_value("resent"), kind="counter")
        self.upstream_idle = Gauge(
            r, "eldr_proxy_upstream_idle_connections",
            "kept connections to the instances waiting for a request",
            read=lambda: (upstream_client().idle_connections()
                          if upstream_client() is not None else 0))
        self.latency = Histogram(
            r, "eldr_proxy_stage_seconds",
            "time of each stage of a request: prefill, conversion (routed experts to hashes and "
            "counts), route (eldr), first_byte (decode call to its first byte), total",
            LATENCY_BUCKETS, ("stage",))

    def render(self):
        return render(self.registry)
