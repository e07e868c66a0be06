"""The metrics and health endpoint of a real `numaserve start`: what it serves agrees with
`status`; and (slow) a real Prometheus server scrapes it, evaluates the shipped alert rules and
answers every query of the shipped Grafana dashboard; promtool accepts all three."""

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from numaserve.client import BadRequest, Client
from numaserve.testing.ports import free_port
from tests.harness import server as server_
from tests.harness.http import http_get
from tests.harness.waiting import eventually

ROOT = Path(__file__).parents[1]
RULES = ROOT / "prometheus/numaserve-alerts.yml"
DASHBOARD = ROOT / "grafana/numaserve.json"
CONFIG = """
model: {backend: onnxruntime, quantize: int8}
server: {endpoint: "@ENDPOINT@", heartbeat_ms: 200, heartbeat_liveness: 3}
supervisor: {backoff_initial_s: 0.2}
placement:
  pools: [{name: main, max_tokens: 256, instances: 1}]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = server_.Server(tmp_path_factory.mktemp("metrics"), CONFIG)
    s.wait_ready()
    with Client(s.endpoint, timeout=10) as client:
        for i in range(30):
            client.embed(f"a text to count, number {i % 20}")  # 20 misses, then 10 hits
    try:
        yield s
    finally:
        s.stop()


def http(url: str) -> tuple[int, str]:
    status, _, body = http_get(url)
    return status, body


def scrape(server) -> dict:
    """{(name, sorted labels): value} of every sample /metrics serves now."""
    status, text = http(f"http://{server.metrics}/metrics")
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def agreeing(server, timeout: float = 10.0) -> tuple[dict, dict]:
    """A status and a scrape that agree on the embed requests answered: the endpoint serves
    the shards' latest reports to the supervisor (a second old at most)."""
    deadline = time.monotonic() + timeout
    while True:
        status, samples = server.status(), scrape(server)
        ok = value(samples, "numaserve_requests_total", op="embed", code="ok")
        if ok == status["requests"]["replies_ok"] or time.monotonic() > deadline:
            return status, samples
        time.sleep(0.2)


def test_the_served_metrics_agree_with_status(server):
    status, samples = agreeing(server)
    assert value(samples, "numaserve_requests_total", op="embed", code="ok") == 30
    assert status["requests"]["replies_ok"] == 30
    cache = status["cache"]
    assert value(samples, "numaserve_cache_hits_total") == cache["hits"] == 10
    assert value(samples, "numaserve_cache_misses_total") == cache["misses"] == 20
    assert value(samples, "numaserve_cache_entries") == cache["entries"]
    assert value(samples, "numaserve_request_duration_seconds_count", op="embed") == 30
    assert value(samples, "numaserve_texts_total", pool="main") == 20
    for instance in status["instances"]:
        slot = {"slot": instance["name"], "pool": instance["pool"]}
        assert value(samples, "numaserve_instance_up", **slot) == 1
        assert value(samples, "numaserve_instance_restarts_total", **slot) == instance["restarts"]
        assert value(samples, "numaserve_forward_pass_seconds_count", **slot) == instance["served"]
        assert value(samples, "numaserve_instance_affinity_as_planned", **slot) == 1
        assert instance["affinity_ok"] is True
        rss = value(samples, "numaserve_instance_resident_memory_bytes", **slot)
        assert 50 << 20 < rss < 4 << 30
    assert value(samples, "numaserve_numastat_numa_hit_pages_total", node="0") > 0


def test_a_request_refused_is_counted_under_its_error_code(server):
    before = value(scrape(server), "numaserve_requests_total", op="classify", code="bad_request")
    with Client(server.endpoint, timeout=10, retries=0) as client, pytest.raises(BadRequest):
        client.classify("this server embeds")

    def counted():  # once the shard's next report reaches the supervisor: a second at most
        samples = scrape(server)
        return value(samples, "numaserve_requests_total", op="classify", code="bad_request")

    assert eventually(lambda: counted() == before + 1, timeout=5, every=0.2)


def test_the_probes_say_alive_and_ready(server):
    assert http(f"http://{server.metrics}/healthz") == (200, "ok\n")
    assert http(f"http://{server.metrics}/readyz") == (200, "ok\n")


@pytest.mark.slow
def test_readyz_fails_while_the_only_instance_is_restarted_and_healthz_does_not(server):
    pid = server.instances()["main-0"]["pid"]
    os.kill(pid, signal.SIGKILL)
    probes = []  # (readyz, healthz) until readyz says ok again
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        probes.append(
            (http(f"http://{server.metrics}/readyz"), http(f"http://{server.metrics}/healthz"))
        )
        if len(probes) > 1 and probes[-1][0] == (200, "ok\n") and probes[-2][0] != (200, "ok\n"):
            break
        time.sleep(0.02)
    assert ((503, "pool main has no ready instance\n"), (200, "ok\n")) in probes
    assert {healthz for _, healthz in probes} == {(200, "ok\n")}
    server.wait_replaced("main-0", pid)
    samples = scrape(server)
    assert value(samples, "numaserve_instance_restarts_total", slot="main-0") == 1


# -- a real Prometheus ---------------------------------------------------------------------


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: apt-get install prometheus (it ships {name})")
    return path


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary("promtool"), *args], input=stdin, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    """A Prometheus server scraping `server` every second, with the shipped alert rules."""
    directory = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "numaserve", "static_configs": [{"targets": [server.metrics]}]}
        ],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address={address}",
        ],
        stdout=(directory / "prometheus.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://{address}"
    try:
        deadline = time.monotonic() + 60
        while http_or_none(f"{url}/-/ready") != 200:
            assert proc.poll() is None, (directory / "prometheus.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "Prometheus did not become ready"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def http_or_none(url: str) -> int | None:
    try:
        return http(url)[0]
    except OSError:
        return None


def query(url: str, expr: str) -> list[dict]:
    status, body = http(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", (expr, body)
    return answer["data"]["result"]


EVERY_SERIES = {
    "numaserve_build_info",
    "numaserve_process_resident_memory_bytes",
    "numaserve_router_up",
    "numaserve_stopping",
    "numaserve_instance_up",
    "numaserve_instance_state",
    "numaserve_instance_restarts_total",
    "numaserve_instance_affinity_as_planned",
    "numaserve_instance_resident_memory_bytes",
    "numaserve_requests_total",
    "numaserve_request_duration_seconds_bucket",
    "numaserve_router_client_disconnects_total",
    "numaserve_router_refused_handshakes_total",
    "numaserve_router_dropped_frames_total",
    "numaserve_router_handed_over_total",
    "numaserve_router_internal_errors_total",
    "numaserve_queue_texts",
    "numaserve_pool_ready_instances",
    "numaserve_queue_wait_seconds_bucket",
    "numaserve_batch_texts_bucket",
    "numaserve_texts_total",
    "numaserve_tokens_total",
    "numaserve_cache_hits_total",
    "numaserve_cache_misses_total",
    "numaserve_cache_entries",
    "numaserve_cache_capacity_entries",
    "numaserve_forward_pass_seconds_bucket",
    *(
        f"numaserve_numastat_{c}_pages_total"
        for c in ("numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node")
    ),
    "numaserve_numastat_other_node_pages_total",
}


@pytest.mark.slow
def test_promtool_accepts_the_served_metrics(server):
    out = promtool("check", "metrics", stdin=http(f"http://{server.metrics}/metrics")[1])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_promtool_accepts_the_alert_rules():
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_prometheus_scrapes_every_series_and_its_values_agree_with_status(server, prometheus):
    names = eventually(
        lambda: (
            (
                {r["metric"]["__name__"] for r in query(prometheus, '{__name__=~"numaserve_.+"}')}
                >= EVERY_SERIES
            )
            and {r["metric"]["__name__"] for r in query(prometheus, '{__name__=~"numaserve_.+"}')}
        )
    )
    assert names >= EVERY_SERIES
    status = server.status()
    ok = status["requests"]["replies_ok"]
    scraped = eventually(
        lambda: query(
            prometheus, 'sum(numaserve_requests_total{op="embed",code="ok"}) == ' + str(ok)
        )
    )
    assert float(scraped[0]["value"][1]) == ok
    (hits,) = query(prometheus, "sum(numaserve_cache_hits_total)")
    assert float(hits["value"][1]) == status["cache"]["hits"]
    (up,) = query(prometheus, 'up{job="numaserve"}')
    assert up["value"][1] == "1"


@pytest.mark.slow
def test_the_alert_rules_evaluate_on_the_live_series(prometheus):
    def evaluated():
        body = http(f"{prometheus}/api/v1/rules")[1]
        rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
        return (
            rules
            if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules)
            else None
        )

    rules = eventually(evaluated)
    assert [r["name"] for r in rules if r["health"] != "ok"] == []
    firing = [r["name"] for r in rules if r["state"] == "firing"]
    assert firing == []  # a healthy server raises none


@pytest.mark.slow
def test_every_dashboard_query_returns_data(server, prometheus):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    assert len(exprs) >= 8
    with Client(server.endpoint, timeout=10) as client:  # traffic for the rate() windows
        for i in range(50):
            client.embed(f"dashboard traffic {i % 10}")
    deadline = time.monotonic() + 30  # rate() needs two scrapes of the traffic
    empty = [expr.replace("$__rate_interval", "1m").replace("$job", "numaserve") for expr in exprs]
    while empty and time.monotonic() < deadline:
        empty = [expr for expr in empty if not query(prometheus, expr)]
        time.sleep(0.5)
    assert empty == []


@pytest.mark.slow
def test_the_autoscalers_query_gives_the_busy_ratio_on_the_live_series(server, prometheus):
    """KEDA's query as shipped (deploy/kubernetes/overlays/autoscale-keda), and the
    prometheus-adapter rule's with its templates filled in as the adapter fills them: a share
    of the instances' time, between 0 and 1, once traffic has run."""
    overlays = ROOT / "deploy" / "kubernetes" / "overlays"
    keda = yaml.safe_load((overlays / "autoscale-keda/scaledobject.yaml").read_text())
    (rule,) = yaml.safe_load((overlays / "autoscale-hpa/prometheus-adapter.yaml").read_text())[
        "rules"
    ]
    adapter = rule["metricsQuery"].replace("<<.LabelMatchers>>", 'job="numaserve"')
    exprs = [
        keda["spec"]["triggers"][0]["metadata"]["query"],
        adapter.replace("<<.GroupBy>>", "job"),
    ]
    deadline = time.monotonic() + 60  # rate() needs two scrapes with passes between them
    ratios: list[float] = []
    with Client(server.endpoint, timeout=10) as client:
        for i in itertools.count():
            client.embed([f"autoscaler traffic {i}.{j}" for j in range(4)])  # no cache hits
            found = [query(prometheus, expr) for expr in exprs]
            ratios = [float(v[0]["value"][1]) for v in found if v]
            if (len(ratios) == 2 and all(ratios)) or time.monotonic() > deadline:
                break
    assert len(ratios) == 2 and all(0 < r <= 1 for r in ratios), ratios
