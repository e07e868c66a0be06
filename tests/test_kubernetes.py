"""deploy/kubernetes: the base and each overlay, rendered by `kubectl kustomize` as users render
them, validate strictly against the Kubernetes API's schemas (kubernetes-validate), and hold
what docs/kubernetes.md promises: a Guaranteed pod, probes on the metrics port, a grace period
longer than the drain, non-root on a read-only root, keys from Secrets, a headless Service.
The Prometheus operator's and KEDA's kinds have no schema there: their alert rules are the
shipped ones (which promtool checks in tests/test_prometheus.py), and their fields are checked
here, as are the autoscalers' metric and its series."""

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from numaserve.config.schema import parse_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33.0"  # the oldest release still supported upstream when written
BUILDS = ["base", "overlays/two-socket", "overlays/autoscale-hpa", "overlays/autoscale-keda"]
CUSTOM = ("monitoring.coreos.com/", "keda.sh/")  # no schema in Kubernetes': checked below

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl renders the kustomizations (.ci/run has it)"
)


def render(build: str) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / build)], capture_output=True, text=True, check=True
    )
    return list(yaml.safe_load_all(out.stdout))


@pytest.fixture(scope="module", params=BUILDS)
def rendered(request) -> list[dict]:
    return render(request.param)


@pytest.fixture(scope="module")
def docs(rendered) -> dict[str, dict]:
    """The one manifest of each kind but Service (two: `services`)."""
    return {doc["kind"]: doc for doc in rendered}


@pytest.fixture(scope="module")
def services(rendered) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in rendered if d["kind"] == "Service"}


def pod(docs) -> dict:
    return docs["Deployment"]["spec"]["template"]["spec"]


def container(docs) -> dict:
    (only,) = pod(docs)["containers"]
    return only


def served_config(docs):
    (text,) = docs["ConfigMap"]["data"].values()
    return parse_config(text)


@pytest.mark.parametrize("build", BUILDS)
def test_every_manifest_validates_strictly_against_the_kubernetes_schemas(build):
    for doc in render(build):
        if doc["apiVersion"].startswith(CUSTOM):
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_pod_is_guaranteed_with_whole_cpus(docs):
    resources = container(docs)["resources"]
    assert resources["requests"] == resources["limits"]
    assert set(resources["limits"]) >= {"cpu", "memory"}
    assert str(resources["limits"]["cpu"]).isdigit(), "the static CPU manager pins whole CPUs"


def test_probes_ask_the_servers_own_health_routes(docs):
    c = container(docs)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # a first prepare
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    metrics_port = int(served_config(docs).server.metrics.rsplit(":", 1)[1])
    assert all(c[p]["httpGet"]["port"] == "metrics" for p in ("readinessProbe", "livenessProbe"))
    assert ports["metrics"] == metrics_port


def test_the_grace_period_outlasts_the_drain_and_the_kill(docs):
    supervisor = served_config(docs).supervisor
    grace = pod(docs)["terminationGracePeriodSeconds"]
    assert grace > supervisor.drain_timeout_s + supervisor.kill_timeout_s


def test_the_server_runs_as_non_root_on_a_read_only_root_with_tmp_on_a_volume(docs):
    spec, c = pod(docs), container(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp"}  # sockets and the core ledger (the image's NUMASERVE_LEDGER)
    image_env = (ROOT / "deploy/container/Containerfile").read_text()
    assert "NUMASERVE_LEDGER=/tmp/" in image_env


def test_keys_come_from_secrets_mounted_where_the_config_reads_them(docs):
    server = served_config(docs).server
    c, volumes = container(docs), {v["name"]: v for v in pod(docs)["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    for path in (server.curve.secret_key_file, server.http_api_keys_file):
        volume = mounted[str(Path(path).parent)]
        assert "secret" in volume
        assert volume["secret"]["defaultMode"] & 0o007 == 0, "numaserve refuses keys others read"
    assert "secret" in mounted[server.curve.authorized_keys_dir]


def test_the_config_serves_every_port_the_pod_and_services_name(docs):
    server = served_config(docs).server
    ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    assert ports["zmq"] == int(server.endpoint.rsplit(":", 1)[1])
    assert ports["http"] == int(server.http.rsplit(":", 1)[1])
    assert server.endpoint.startswith("tcp://0.0.0.0:") and server.curve is not None


def test_the_pod_serves_the_model_path_the_image_prepared(docs):
    """The image holds the artifact of its own config's model section alone, read-only: a
    pod's config naming another path would find no artifact and could not build one."""
    image = parse_config((ROOT / "deploy/container/numaserve.yaml").read_text())
    assert served_config(docs).model == image.model


def test_zeromq_clients_get_every_pods_address_from_a_headless_service(services):
    assert services["numaserve-zmq"]["spec"]["clusterIP"] == "None"
    assert {p["targetPort"] for p in services["numaserve"]["spec"]["ports"]} == {"http", "metrics"}


def test_a_disruption_takes_one_pod_at_a_time(docs):
    assert docs["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


def test_the_alert_rules_are_the_shipped_ones(docs):
    shipped = yaml.safe_load((ROOT / "prometheus" / "numaserve-alerts.yml").read_text())
    assert docs["PrometheusRule"]["spec"] == shipped


def test_prometheus_scrapes_each_pods_metrics_port_as_job_numaserve(docs, services):
    monitor = docs["ServiceMonitor"]["spec"]
    (endpoint,) = monitor["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval"}  # the operator's v1 fields
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    selected = monitor["selector"]["matchLabels"]
    assert selected.items() <= services["numaserve"]["metadata"]["labels"].items()
    # The job label is the Service's name; the alert rules expect job="numaserve".
    assert 'job="numaserve"' in yaml.safe_dump(docs["PrometheusRule"]["spec"])


def autoscaled(build: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in render(build)}


def exposed_series() -> set[str]:
    """The series names numaserve's /metrics exposes, as docs/monitoring.md lists them."""
    text = (ROOT / "docs" / "monitoring.md").read_text()
    return set(re.findall(r"^\| `(numaserve_[a-z_]+)`", text, re.M))


def test_the_hpa_scales_the_deployment_on_the_busy_ratio_the_adapter_rule_serves():
    docs = autoscaled("overlays/autoscale-hpa")
    hpa = docs["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    assert "replicas" not in docs["Deployment"]["spec"]  # the autoscaler owns it
    (metric,) = hpa["metrics"]
    assert metric["pods"]["metric"]["name"] == "numaserve_instance_busy_ratio"
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300
    adapter = ROOT / "deploy/kubernetes/overlays/autoscale-hpa/prometheus-adapter.yaml"
    (rule,) = yaml.safe_load(adapter.read_text())["rules"]
    assert rule["name"]["as"] == "numaserve_instance_busy_ratio"
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    used = set(re.findall(r"numaserve_[a-z_]+", rule["metricsQuery"]))
    assert used == {"numaserve_forward_pass_seconds_sum", "numaserve_instance_up"}


def test_the_keda_alternative_scales_on_the_same_signal():
    docs = autoscaled("overlays/autoscale-keda")
    scaled = docs["ScaledObject"]["spec"]
    assert scaled["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    (trigger,) = scaled["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "Value")
    used = set(re.findall(r"numaserve_[a-z_]+", trigger["metadata"]["query"]))
    assert used == {"numaserve_forward_pass_seconds_sum", "numaserve_instance_up"}
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300


def test_the_autoscalers_read_series_numaserve_exposes():
    exposed = exposed_series()
    assert {"numaserve_forward_pass_seconds", "numaserve_instance_up"} <= exposed
