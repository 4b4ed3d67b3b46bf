"""deploy/k8s: every rendered manifest is valid against the Kubernetes schemas (offline, from
kubernetes-validate) and consistent with the code: real settings, real commands, probes on the
health port, resources, disruption budgets, the image's non-root user. The Prometheus Operator's
resources, which those schemas do not know, are checked by tests/deploy/test_monitors.py and
test_rules.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from outbox_cli.main import build_parser
from outbox_cli.settings import is_setting
from tests.deploy.kustomize import Resource, containers, load_all, render

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "k8s" / "base"
OVERLAYS = sorted(p for p in (DEPLOY / "k8s" / "overlays").iterdir() if p.is_dir())
FOLDERS = [BASE, *OVERLAYS]
#: The oldest Kubernetes the manifests are meant for, and the newest the schemas know.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
IMAGE_USER = 10001  # USER in deploy/Containerfile
#: The producer Deployment snippet users copy (no kustomization renders it).
PRODUCER = DEPLOY / "k8s" / "producer" / "deployment.yaml"
#: Custom resources of the Prometheus Operator (deploy/k8s/monitoring), by apiVersion: no
#: Kubernetes schema knows them.
CUSTOM = {"monitoring.coreos.com/v1": {"PodMonitor", "PrometheusRule"}}


def rendered(folder: Path) -> list[Resource]:
    return render(folder)


def key(resource: Resource) -> tuple[str, str]:
    return resource["kind"], resource["metadata"]["name"]


def by_key(folder: Path) -> dict[tuple[str, str], Resource]:
    return {key(r): r for r in rendered(folder)}


def env_of(container: dict[str, Any], config_maps: dict[str, Resource]) -> dict[str, str]:
    """Every variable a container gets: its env, and the keys of the ConfigMaps it loads."""
    found: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        found.update(config_maps[name].get("data", {}))
    for variable in container.get("env", []):
        found[variable["name"]] = variable.get("value", "<from a reference>")
    return found


def config_maps(resources: list[Resource]) -> dict[str, Resource]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == "ConfigMap"}


def workloads(resources: list[Resource]) -> list[Resource]:
    return [r for r in resources if r["kind"] in ("Deployment", "CronJob")]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_manifest_is_valid_for_kubernetes(folder: Path, version: str) -> None:
    resources = rendered(folder)
    assert resources
    for resource in resources:
        if resource["apiVersion"] in CUSTOM:
            assert resource["kind"] in CUSTOM[resource["apiVersion"]], key(resource)
            continue
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = "/".join(str(p) for p in err.path)
            pytest.fail(f"{key(resource)} in {folder.name} is invalid for {version}: {path}: "
                        f"{err.message}")  # fmt: skip


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_variable_the_manifests_set_is_a_real_setting(folder: Path) -> None:
    resources = rendered(folder)
    maps = config_maps(resources)
    for name, config_map in maps.items():
        bad = [v for v in config_map.get("data", {}) if not is_setting(v)]
        assert not bad, f"ConfigMap {name} sets {bad}, which no settings object reads"
    for workload in workloads(resources):
        for container in containers(workload):
            names = [v["name"] for v in container.get("env", [])]
            bad = [n for n in names if n.startswith("OUTBOX_") and not is_setting(n)]
            assert not bad, f"{key(workload)} container {container['name']} sets {bad}"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_container_runs_a_real_command_of_the_image(folder: Path) -> None:
    parser = build_parser()
    for workload in workloads(rendered(folder)):
        for container in containers(workload):
            assert "command" not in container, "the image's ENTRYPOINT is kafka-outbox"
            args = container["args"]
            if args[0] == "audit":  # its arguments are the audit's own
                continue
            try:
                parser.parse_args(args)
            except SystemExit:
                pytest.fail(f"{key(workload)}: `kafka-outbox {' '.join(args)}` is not a command")


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_services_probe_their_health_endpoints_on_the_port_their_settings_open(
    folder: Path,
) -> None:
    resources = rendered(folder)
    maps = config_maps(resources)
    deployments = [r for r in resources if r["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"outbox-relay", "outbox-checker"}
    for deployment in deployments:
        [main] = deployment["spec"]["template"]["spec"]["containers"]
        service = main["args"][0]
        env = env_of(main, maps)
        port = int(env[f"OUTBOX_{service.upper()}_HTTP_PORT"])
        [named] = [p for p in main["ports"] if p["name"] == "http"]
        assert named["containerPort"] == port
        assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_workloads_have_resources_a_disruption_budget_and_run_as_the_image_s_user(
    folder: Path,
) -> None:
    resources = rendered(folder)
    budgets = [r for r in resources if r["kind"] == "PodDisruptionBudget"]
    for workload in workloads(resources):
        template = workload["spec"]["template"] if workload["kind"] == "Deployment" else (
            workload["spec"]["jobTemplate"]["spec"]["template"]
        )  # fmt: skip
        security = template["spec"]["securityContext"]
        assert (security["runAsNonRoot"], security["runAsUser"]) == (True, IMAGE_USER)
        for container in containers(workload):
            limits = container["resources"]
            assert "memory" in limits["requests"] and "memory" in limits["limits"], container
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
        if workload["kind"] == "Deployment":
            labels = template["metadata"]["labels"]
            covering = [
                b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
            ]
            assert len(covering) == 1, f"{key(workload)} has {len(covering)} budgets"


def secret_file(
    workload: Resource, container: dict[str, Any], name: str = "OUTBOX_CHECK_SECRET_FILE"
) -> tuple[str, str]:
    """The Secret and key behind the container's variable ``name``: the file must be where a
    volume of that Secret mounts that key."""
    [variable] = [v for v in container["env"] if v["name"] == name]
    folder, _, filename = variable["value"].rpartition("/")
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    source = volumes[mount["name"]]["secret"]
    [item] = [i for i in source["items"] if i["path"] == filename]
    return source["secretName"], item["key"]


def test_the_checker_s_secret_and_the_audit_s_schedule_are_wired() -> None:
    resources = by_key(BASE)
    checker = resources[("Deployment", "outbox-checker")]
    [container] = checker["spec"]["template"]["spec"]["containers"]
    name, secret_key = secret_file(checker, container)
    assert secret_key in resources[("Secret", name)]["stringData"]
    plain = [v["name"] for v in container["env"] if "SECRET" in v["name"] and "value" in v]
    assert all(n.endswith("_FILE") for n in plain), "the secret itself is never in a manifest"
    audit = resources[("CronJob", "outbox-audit")]
    assert re.fullmatch(r"[\d*/,-]+( [\d*/,-]+){4}", audit["spec"]["schedule"])
    assert audit["spec"]["concurrencyPolicy"] == "Forbid"


def test_the_example_overlay_sets_its_namespace_images_and_autoscaler() -> None:
    resources = by_key(OVERLAYS[0])
    assert {r["metadata"].get("namespace") for r in resources.values()} == {"orders"}
    images = {c["image"] for r in workloads(list(resources.values())) for c in containers(r)}
    assert all(i.startswith("registry.example.com/platform/") for i in images), images
    hpa = resources[("HorizontalPodAutoscaler", "outbox-relay")]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "outbox-relay"
    partitions = int(resources[("ConfigMap", "kafka-outbox-settings")]["data"]["OUTBOX_PARTITIONS"])
    assert hpa["spec"]["maxReplicas"] <= partitions, "a relay beyond the partitions owns nothing"
    [metric] = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "outbox_relay_lag_records"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_the_python_renderer_matches_kubectl_kustomize(folder: Path) -> None:
    """Where kubectl is installed (it is on this project's CI machines) the offline renderer
    must agree with the real kustomize, resource for resource."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the renderer is checked where it is")
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    theirs = {key(r): r for r in yaml.safe_load_all(done.stdout) if r}
    assert theirs == by_key(folder)


def test_every_yaml_file_under_deploy_k8s_parses_and_is_used() -> None:
    """Each manifest is listed by a kustomization (the base, an overlay or a component), and
    each component by an overlay that renders it."""
    used: set[Path] = set()
    folders = [p.parent for p in (DEPLOY / "k8s").rglob("kustomization.yaml")]
    for folder in folders:
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        used |= {(folder / r).resolve() for r in kustomization.get("resources", [])}
        used |= {(folder / p["path"]).resolve() for p in kustomization.get("patches", [])}
        used |= {(folder / c).resolve() for c in kustomization.get("components", [])}
    components = {f.resolve() for f in folders if f.resolve() not in {g.resolve() for g in FOLDERS}}
    assert components - used == set(), "components no overlay includes"
    files = {p.resolve() for p in (DEPLOY / "k8s").rglob("*.yaml")}
    files -= {(f / "kustomization.yaml").resolve() for f in folders}
    files -= {PRODUCER.resolve()}  # a snippet for the application's own manifests: tested below
    for path in files:
        assert load_all(path), f"{path} is empty"
    assert files - used == set(), "manifests no kustomization uses"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_producer_snippet_is_valid_and_advertises_the_pod_ip(version: str) -> None:
    """The producer Deployment users copy: valid, every OUTBOX_* variable a real setting, the
    endpoint on all interfaces at the port the container opens, advertising status.podIP
    (defined before the variable that expands it), the checker's secret from the same Secret."""
    [deployment] = list(yaml.safe_load_all(PRODUCER.read_text()))
    kubernetes_validate.validate(deployment, version, strict=True)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = [v["name"] for v in container["env"]]
    assert [n for n in env if n.startswith("OUTBOX_") and not is_setting(n)] == []
    values = {v["name"]: v for v in container["env"]}
    assert values["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env.index("POD_IP") < env.index("OUTBOX_CHECK_ADVERTISE_URL")
    port = int(values["OUTBOX_CHECK_PORT"]["value"])
    assert values["OUTBOX_CHECK_ADVERTISE_URL"]["value"] == f"http://$(POD_IP):{port}"
    assert values["OUTBOX_CHECK_HOST"]["value"] == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [port]
    checker = by_key(BASE)[("Deployment", "outbox-checker")]
    [checker_container] = checker["spec"]["template"]["spec"]["containers"]
    assert secret_file(deployment, container) == secret_file(checker, checker_container)
    # the key being replaced while rotating is mounted too, from a key the Secret has
    name, previous = secret_file(deployment, container, "OUTBOX_CHECK_PREVIOUS_SECRET_FILE")
    assert previous in by_key(BASE)[("Secret", name)]["stringData"]
