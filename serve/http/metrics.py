"""Prometheus metrics of one app, kept in the app's own registry (no process-global state)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# the methods the service answers, as labels; any other (a made-up one) is "other": labels from a closed set, so no
# client can grow the registry (and each scrape) with requests of its own invention
METHOD_LABELS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)


class ServiceMetrics:
    """HTTP, queue, memory, batch and condition-cache metrics: the Batch-, Pixel- and CacheObserver of those modules."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "stylevar_http_requests", "HTTP requests by route, method and status", ("route", "method", "status"),
            registry=r,
        )
        self.latency = Histogram(
            "stylevar_http_request_duration_seconds", "HTTP request latency by route", ("route", "method"),
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.queue = Gauge("stylevar_queue_depth", "Jobs waiting for a model worker", registry=r)
        self.batch_rows = Histogram(
            "stylevar_batch_size_rows", "Rows (samples) per model call", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_jobs = Histogram(
            "stylevar_batch_size_jobs", "Requests per model call", buckets=BATCH_BUCKETS, registry=r
        )
        self.inference = Histogram(
            "stylevar_inference_seconds", "Duration of one model call", ("outcome",), buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.dropped = Counter("stylevar_jobs_dropped", "Jobs dropped before running", ("reason",), registry=r)
        self.oom_splits = Counter("stylevar_oom_splits", "Batches split after running out of memory", registry=r)
        self.rejected = Counter("stylevar_jobs_rejected", "Jobs refused at the queue or for memory", ("reason",),
                                registry=r)
        self.pixels_held = Gauge("stylevar_pixels_in_flight", "Pixels of full-size images held by requests "
                                 "(decoded inputs and results, serve.http.memory)", registry=r)
        self.pixels_waiting = Gauge("stylevar_pixels_waiting", "Pixels of requests waiting for memory", registry=r)
        self.ready = Gauge("stylevar_ready", "1 when the model is loaded and warmed up", registry=r)
        self.cache_hits = Counter("stylevar_condition_cache_hits", "Reference images whose condition came from "
                                  "the cache, by kind (style, content)", ("kind",), registry=r)
        self.cache_misses = Counter("stylevar_condition_cache_misses", "Reference images encoded (not in the "
                                    "cache), by kind", ("kind",), registry=r)
        self.cache_entries = Gauge("stylevar_condition_cache_entries", "Conditions held in the cache", registry=r)
        self.cache_bytes = Gauge("stylevar_condition_cache_bytes", "Bytes of tensors held in the cache", registry=r)

    # -- HTTP --------------------------------------------------------------------------------------
    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """`route`: a route's template or one fixed word (serve.http.middleware.route_label); `method`: any."""
        method = method if method in METHOD_LABELS else OTHER_METHOD
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)

    def connection_refused(self) -> None:
        """A connection over a limit (serve.http.connections)."""
        self.rejected.labels("too_many_connections").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- BatchObserver -----------------------------------------------------------------------------
    def queue_depth(self, depth: int) -> None:
        self.queue.set(depth)

    def batch_done(self, jobs: int, rows: int, seconds: float, ok: bool) -> None:
        self.batch_jobs.observe(jobs)
        self.batch_rows.observe(rows)
        self.inference.labels("ok" if ok else "error").observe(seconds)

    def job_dropped(self, reason: str) -> None:
        self.dropped.labels(reason).inc()

    def oom_split(self) -> None:
        self.oom_splits.inc()

    # -- PixelObserver (serve.http.memory) ---------------------------------------------------------
    def pixels(self, held: int, waiting: int) -> None:
        self.pixels_held.set(held)
        self.pixels_waiting.set(waiting)

    # -- CacheObserver -----------------------------------------------------------------------------
    def cache_lookup(self, kind: str, hits: int, misses: int) -> None:
        if hits:
            self.cache_hits.labels(kind).inc(hits)
        if misses:
            self.cache_misses.labels(kind).inc(misses)

    def cache_size(self, entries: int, nbytes: int) -> None:
        self.cache_entries.set(entries)
        self.cache_bytes.set(nbytes)
