"""The Kubernetes deployment under ops/deploy/: the base and both overlays render, every object
is valid against the API types, the RBAC covers every API call the adapters make, and the pieces
refer to each other correctly (arguments, ports, names, secrets, the scheduler's extender)."""

from __future__ import annotations

import functools
import inspect
import re
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetledger.adapters.cli.main import build_parser
from fleetledger.adapters.kubernetes.lease import DEFAULT_LEASE_NAME
from fleetledger.adapters.testbeds.manifests import APPLICATION_RESOURCES
from fleetledger.adapters.testbeds.reconciler import GHOST_PRIORITY, GHOST_PRIORITY_CLASS
from fleetledger.adapters.testbeds.runtime import (
    JOB_PRIORITY,
    JOB_PRIORITY_CLASS,
    TestbedsRuntime,
)
from tests.ops import kustomize
from tests.ops.api_calls import (
    ApiCall,
    Grant,
    Permission,
    api_calls,
    grants,
    permissions,
    scan,
    uncovered,
)
from tests.ops.kube_types import (
    is_namespaced,
    problems,
    required_attributes,
    service_monitor_problems,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "ops" / "deploy"
TARGETS = {
    "base": DEPLOY / "base",
    "dev": DEPLOY / "overlays" / "dev",
    "prod": DEPLOY / "overlays" / "prod",
}
KUBECTL = shutil.which("kubectl")
CONTROLLER_NAMESPACE = "fleetledger"
CUSTOM_RESOURCES = [(r.group, r.plural) for r in APPLICATION_RESOURCES]

Manifest = dict[str, Any]


@functools.cache
def _rendered(target: str) -> tuple[Manifest, ...]:
    # kubectl's kustomize where installed (what a platform team runs), else the Python renderer
    # of the same subset, which TestRendering compares with kubectl wherever both exist.
    if KUBECTL is not None:
        return tuple(kustomize.kubectl_kustomize(KUBECTL, TARGETS[target]))
    return tuple(kustomize.render(TARGETS[target]))


@functools.cache
def adapter_calls() -> tuple[ApiCall, ...]:
    return tuple(scan(ROOT / "adapters"))


def rendered(target: str) -> list[Manifest]:
    return [yaml.safe_load(yaml.safe_dump(obj)) for obj in _rendered(target)]


def find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_templates(objects: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]


def container(objects: list[Manifest], deployment: str, name: str) -> Manifest:
    spec = find(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    [found] = [c for c in spec["containers"] if c["name"] == name]
    assert isinstance(found, dict)
    return found


def expanded_args(objects: list[Manifest], c: Manifest) -> list[str]:
    """The container's arguments as the kubelet passes them: ``$(VAR)`` replaced from the
    container's environment (its ConfigMaps and literal values)."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})

    def expand(arg: str) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg)

    return [expand(arg) for arg in c.get("args", [])]


def option(args: list[str], flag: str) -> str | None:
    values = [a.partition("=")[2] for a in args if a.startswith(flag + "=")]
    return values[-1] if values else None


def scheduler_config(objects: list[Manifest]) -> Manifest:
    data = find(objects, "ConfigMap", "fleetledger-scheduler-config")["data"]
    loaded = yaml.safe_load(data["kube-scheduler-config.yaml"])
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(params=sorted(TARGETS))
def target(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class TestRendering:
    @pytest.mark.skipif(
        KUBECTL is None, reason="kubectl is not on PATH: there is no kustomize to compare with"
    )
    def test_the_python_renderer_agrees_with_kubectl(self, target: str) -> None:
        """The Python renderer produces the very objects ``kubectl kustomize`` does, so the
        checks below mean the same without kubectl."""
        assert KUBECTL is not None
        ours = {kustomize.identity(o): _normalized(o) for o in kustomize.render(TARGETS[target])}
        theirs = {
            kustomize.identity(o): _normalized(o)
            for o in kustomize.kubectl_kustomize(KUBECTL, TARGETS[target])
        }
        assert sorted(ours) == sorted(theirs)
        for key, obj in ours.items():
            assert obj == theirs[key], key

    def test_the_renderer_refuses_a_feature_outside_its_subset(self, tmp_path: Path) -> None:
        """A kustomization field the renderer does not implement fails the render, instead of
        being ignored."""
        (tmp_path / "kustomization.yaml").write_text("namespace: elsewhere\nresources: []\n")
        with pytest.raises(kustomize.UnsupportedKustomization, match="namespace"):
            kustomize.render(tmp_path)

    def test_a_strategic_merge_merges_keyed_lists_and_deletes_nulls(self) -> None:
        """Containers and volumes merge by name, env by name; ``null`` removes a field; other
        lists are replaced."""
        base = {
            "containers": [{"name": "a", "args": ["x"], "env": [{"name": "E", "value": "1"}]}],
            "volumes": [{"name": "v", "emptyDir": {}}],
        }
        kustomize.strategic_merge(
            base,
            {
                "containers": [{"name": "a", "args": ["y"], "env": [{"name": "F", "value": "2"}]}],
                "volumes": [{"name": "v", "emptyDir": None, "secret": {"secretName": "s"}}],
            },
        )
        assert base == {
            "containers": [
                {
                    "name": "a",
                    "args": ["y"],
                    "env": [{"name": "E", "value": "1"}, {"name": "F", "value": "2"}],
                }
            ],
            "volumes": [{"name": "v", "secret": {"secretName": "s"}}],
        }


def _normalized(obj: Any) -> Any:
    """``obj`` with the keyed lists in key order: kustomize may reorder them while merging,
    which changes nothing the API server sees."""
    if isinstance(obj, list):
        return [_normalized(item) for item in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        keyed = key in kustomize.MERGE_KEYS and isinstance(value, list)
        merge_key = kustomize.MERGE_KEYS.get(key, "")
        ordered = sorted(value, key=lambda item: str(item.get(merge_key))) if keyed else value
        out[key] = _normalized(ordered)
    return out


class TestKubernetesTypes:
    def test_every_object_is_valid_against_its_api_type(self, target: str) -> None:
        """No unknown field, no missing required field, no value of the wrong type, in any
        object of any kind (custom kinds against the schemas written from their CRDs)."""
        found = []
        for obj in rendered(target):
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            check = service_monitor_problems if obj["kind"] == "ServiceMonitor" else problems
            found += [f"{where}: {p}" for p in check(obj)]
        assert found == []

    def test_namespaced_kinds_name_their_namespace_and_others_do_not(self, target: str) -> None:
        """No object relies on the namespace ``kubectl`` happens to default to."""
        for obj in rendered(target):
            if obj["kind"] == "ServiceMonitor":
                assert obj["metadata"].get("namespace") == CONTROLLER_NAMESPACE
                continue
            namespaced = is_namespaced(obj["apiVersion"], obj["kind"])
            assert ("namespace" in obj["metadata"]) == namespaced, obj["metadata"]["name"]

    def test_the_check_reports_unknown_missing_and_mistyped_fields(self) -> None:
        """The validator can fail: a misspelt field, a container without its required name and
        a string where an integer belongs are each reported."""
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "x"},
            "spec": {
                "replicas": "2",
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"spec": {"containers": [{"image": "i", "imagePullPolicyy": "x"}]}},
            },
        }
        assert problems(deployment) == [
            "Deployment.spec.replicas: int expected, got '2'",
            "Deployment.spec.template.spec.containers[0].imagePullPolicyy: unknown field of "
            "V1Container",
            "Deployment.spec.template.spec.containers[0]: V1Container requires name",
        ]

    def test_required_fields_are_the_models_own(self) -> None:
        """Required is what the generated model declares: a container needs its name, a pod
        spec its containers, a role binding its roleRef; nothing optional is required."""
        from kubernetes import client

        assert required_attributes(client.V1Container) == {"name"}
        assert "containers" in required_attributes(client.V1PodSpec)
        assert required_attributes(client.V1RoleBinding) == {"role_ref"}
        assert required_attributes(client.V1ObjectMeta) == frozenset()

    def test_a_service_monitor_without_a_selector_is_refused(self) -> None:
        """The CRD requires spec.selector and spec.endpoints."""
        monitor = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "m"},
            "spec": {"endpoints": [{"port": "http"}]},
        }
        assert service_monitor_problems(monitor) == ["spec: 'selector' is a required property"]


SNIPPET = """
from kubernetes import client

class Widgets:
    def __init__(self, api_client):
        self._core = client.CoreV1Api(api_client)
        self._objects = client.CustomObjectsApi(api_client)

    def run(self):
        self._core.patch_namespaced_config_map("settings", "ns", {})
        self._objects.create_namespaced_custom_object("example.com", "v1", "ns", "widgets", {})
        self._objects.list_cluster_custom_object(
            group="example.com", version="v1", plural="gadgets"
        )
        watched = self._core.list_namespaced_service
        client.AppsV1Api().read_namespaced_deployment_with_http_info("d", "ns")
        self._core.not_an_api_call()
"""


class TestRbac:
    def test_the_controller_is_granted_every_call_the_adapters_make(self, target: str) -> None:
        """Each Kubernetes API call in adapters/ (found in the source, mapped to RBAC by the
        client's conventions) is allowed to the controller's ServiceAccount."""
        calls = list(adapter_calls())
        required = {p for call in calls for p in permissions(call, CUSTOM_RESOURCES)}
        # The scanner sees the adapters at all (else this test would pass on nothing).
        assert Permission("", "nodes", "list", namespaced=False) in required
        granted = grants(rendered(target), CONTROLLER_NAMESPACE, "fleetledger")
        missing = uncovered(required, granted)
        assert missing == set(), _where(missing, calls)

    def test_a_new_call_without_rbac_is_caught(self, target: str) -> None:
        """Calls in new code — on an attribute, a variable or a fresh client, called or handed
        on, custom objects by literal group and plural — are found, and the deployment's RBAC
        does not grant them, so adding such a call to adapters/ fails the test above."""
        calls = api_calls(SNIPPET)
        assert [(c.api, c.method) for c in calls] == [
            ("CoreV1Api", "patch_namespaced_config_map"),
            ("CustomObjectsApi", "create_namespaced_custom_object"),
            ("CustomObjectsApi", "list_cluster_custom_object"),
            ("CoreV1Api", "list_namespaced_service"),
            ("AppsV1Api", "read_namespaced_deployment"),
        ]
        required = {p for call in calls for p in permissions(call)}
        assert required == {
            Permission("", "configmaps", "patch", namespaced=True),
            Permission("example.com", "widgets", "create", namespaced=True),
            Permission("example.com", "gadgets", "list", namespaced=False),
            Permission("example.com", "gadgets", "watch", namespaced=False),
            Permission("", "services", "list", namespaced=True),
            Permission("", "services", "watch", namespaced=True),
            Permission("apps", "deployments", "get", namespaced=True),
        }
        granted = grants(rendered(target), CONTROLLER_NAMESPACE, "fleetledger")
        assert uncovered(required, granted) == required

    def test_resource_names_narrow_only_what_rbac_lets_them(self) -> None:
        """A rule with resourceNames allows get/update on those objects, never list, watch or
        create; a Role's grant never covers a cluster-wide call."""
        named = Grant(
            {"apiGroups": [""], "resources": ["pods"], "resourceNames": ["p"], "verbs": ["*"]},
            None,
        )
        assert named.allows(Permission("", "pods", "get", namespaced=True))
        assert not named.allows(Permission("", "pods", "list", namespaced=True))
        assert not named.allows(Permission("", "pods", "create", namespaced=True))
        in_namespace = Grant({"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}, "ns")
        cluster_wide = Permission("", "pods", "list", namespaced=False)
        assert uncovered({cluster_wide}, [in_namespace]) == {cluster_wide}

    def test_namespaced_rights_are_where_the_controller_uses_them(self, target: str) -> None:
        """Pods and applications are granted in ``--testbeds-namespace``; the Lease's rights in
        ``--lease-namespace`` (default: the pod's own) for ``--lease-name``."""
        objects = rendered(target)
        args = expanded_args(objects, container(objects, "fleetledger", "fleetledger"))
        granted = grants(objects, CONTROLLER_NAMESPACE, "fleetledger")
        testbeds = option(args, "--testbeds-namespace")
        for group, resource in [("", "pods"), *CUSTOM_RESOURCES]:
            for verb in ("create", "get", "delete"):
                wanted = Permission(group, resource, verb, namespaced=True)
                assert {g.namespace for g in granted if g.allows(wanted)} == {testbeds}
        lease_namespace = option(args, "--lease-namespace") or CONTROLLER_NAMESPACE
        lease_name = option(args, "--lease-name") or DEFAULT_LEASE_NAME
        for verb in ("get", "update"):
            rules = [
                g
                for g in granted
                if g.allows(Permission("coordination.k8s.io", "leases", verb, namespaced=True))
            ]
            assert {g.namespace for g in rules} == {lease_namespace}
            assert all(lease_name in g.rule["resourceNames"] for g in rules)

    def test_the_scheduler_holds_the_stock_roles_and_its_own_lease(self, target: str) -> None:
        """The second scheduler is bound to system:kube-scheduler and system:volume-scheduler,
        and may take the Lease its configuration names (which the stock role may not)."""
        objects = rendered(target)
        election = scheduler_config(objects)["leaderElection"]
        assert election["leaderElect"] is True
        subject = {"kind": "ServiceAccount", "name": "fleetledger-scheduler"}
        subject["namespace"] = CONTROLLER_NAMESPACE
        cluster_roles = {
            o["roleRef"]["name"]
            for o in objects
            if o["kind"] == "ClusterRoleBinding" and subject in o["subjects"]
        }
        assert cluster_roles == {"system:kube-scheduler", "system:volume-scheduler"}
        granted = grants(objects, CONTROLLER_NAMESPACE, "fleetledger-scheduler")
        for verb in ("create", "get", "update"):
            wanted = Permission("coordination.k8s.io", "leases", verb, namespaced=True)
            rules = [g for g in granted if g.allows(wanted)]
            assert {g.namespace for g in rules} == {election["resourceNamespace"]}
            if verb != "create":
                assert all(election["resourceName"] in g.rule["resourceNames"] for g in rules)


def _where(missing: set[Permission], calls: list[ApiCall]) -> str:
    lines = []
    for p in sorted(missing):
        sources = [c.where for c in calls if p in permissions(c, CUSTOM_RESOURCES)]
        lines.append(f"{p} needed by {', '.join(sources)}")
    return "RBAC does not grant:\n" + "\n".join(lines)


class TestWiring:
    def test_the_controller_arguments_are_ones_serve_accepts(
        self, target: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`fleetledger serve` and `fleetledger db upgrade` parse the containers' arguments
        (after the kubelet's ``$(VAR)`` expansion) without an error."""
        objects = rendered(target)
        controller = container(objects, "fleetledger", "fleetledger")
        job = find(objects, "Job", "fleetledger-migrate")["spec"]["template"]["spec"]
        for args in (expanded_args(objects, controller), job["containers"][0]["args"]):
            assert not any("$(" in a for a in args), args
            try:
                build_parser().parse_args(args)
            except SystemExit:
                pytest.fail(f"{args}: {capsys.readouterr().err}")

    def test_the_scheduler_reaches_the_extender(self, target: str) -> None:
        """The scheduler's urlPrefix is the proxy's listener; the proxy forwards to the extender
        Service, whose port leads to the controller's --extender-port, which listens beyond
        loopback with tokens (the proxy sends one)."""
        objects = rendered(target)
        [extender] = scheduler_config(objects)["extenders"]
        template = find(objects, "ConfigMap", "fleetledger-extender-proxy")["data"][
            "extender-proxy.conf.template"
        ]
        listen = re.search(r"listen\s+([\d.]+:\d+);", template)
        upstream = re.search(
            r"proxy_pass\s+http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+);", template
        )
        assert listen is not None and upstream is not None
        assert extender["urlPrefix"] == f"http://{listen[1]}"
        service = find(objects, "Service", upstream[1])
        assert service["metadata"]["namespace"] == upstream[2]
        [port] = [p for p in service["spec"]["ports"] if p["port"] == int(upstream[3])]
        controller = container(objects, "fleetledger", "fleetledger")
        [target_port] = [p for p in controller["ports"] if p["name"] == port["targetPort"]]
        args = expanded_args(objects, controller)
        assert option(args, "--extender-port") == str(target_port["containerPort"])
        assert option(args, "--extender-host") == "0.0.0.0"
        assert "--insecure-no-auth" not in args
        env = {e["name"]: e for e in controller["env"]}
        proxy = container(objects, "fleetledger-scheduler", "extender-proxy")
        proxy_env = {e["name"]: e for e in proxy["env"]}
        assert "secretKeyRef" in env["FLEETLEDGER_EXTENDER_TOKENS"]["valueFrom"]
        assert "${FLEETLEDGER_EXTENDER_TOKEN}" in template
        assert "secretKeyRef" in proxy_env["FLEETLEDGER_EXTENDER_TOKEN"]["valueFrom"]

    def test_the_scheduler_is_the_one_jobs_name(self, target: str) -> None:
        """The scheduler's profile is the schedulerName the testbeds give their jobs' pods, and
        it reads the configuration from where the ConfigMap is mounted."""
        objects = rendered(target)
        jobs_scheduler = inspect.signature(TestbedsRuntime).parameters["scheduler_name"].default
        assert [p["schedulerName"] for p in scheduler_config(objects)["profiles"]] == [
            jobs_scheduler
        ]
        scheduler = container(objects, "fleetledger-scheduler", "kube-scheduler")
        [config] = [a.partition("=")[2] for a in scheduler["command"] if a.startswith("--config=")]
        [mount] = [m for m in scheduler["volumeMounts"] if m["name"] == "config"]
        assert config == f"{mount['mountPath']}/kube-scheduler-config.yaml"

    def test_priority_classes_are_the_ones_the_code_ensures(self, target: str) -> None:
        """Same names and values as the runtime creates (a class's value cannot change, and the
        controller refuses a class of another value)."""
        classes = {
            o["metadata"]["name"]: o for o in rendered(target) if o["kind"] == "PriorityClass"
        }
        assert {name: c["value"] for name, c in classes.items()} == {
            GHOST_PRIORITY_CLASS: GHOST_PRIORITY,
            JOB_PRIORITY_CLASS: JOB_PRIORITY,
        }
        assert all(c["globalDefault"] is False for c in classes.values())

    def test_services_and_the_monitor_select_what_they_should(self, target: str) -> None:
        """Both Services select the controller's pods by ports it has; the ServiceMonitor
        scrapes /metrics on a port of the API Service it selects."""
        objects = rendered(target)
        pod = find(objects, "Deployment", "fleetledger")["spec"]["template"]
        ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
        for name in ("fleetledger-api", "fleetledger-extender"):
            service = find(objects, "Service", name)
            assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
            assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
        monitor = find(objects, "ServiceMonitor", "fleetledger")["spec"]
        api = find(objects, "Service", "fleetledger-api")
        assert monitor["selector"]["matchLabels"].items() <= api["metadata"]["labels"].items()
        assert [(e["port"], e["path"]) for e in monitor["endpoints"]] == [("http", "/metrics")]
        assert "http" in {p["name"] for p in api["spec"]["ports"]}

    def test_the_controller_is_probed_on_healthz_and_readyz(self, target: str) -> None:
        controller = container(rendered(target), "fleetledger", "fleetledger")
        assert controller["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert controller["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert controller["startupProbe"]["httpGet"]["path"] == "/healthz"

    def test_every_reference_resolves(self, target: str) -> None:
        """ConfigMaps, ServiceAccounts and claims the pods name are all rendered; the only
        Secret is `fleetledger`, created by hand as the runbook says, with the keys it lists."""
        objects = rendered(target)
        names = {(o["kind"], o["metadata"]["name"]) for o in objects}
        secret_keys = set()
        for where, template in pod_templates(objects):
            spec = template["spec"]
            assert ("ServiceAccount", spec["serviceAccountName"]) in names, where
            for volume in spec.get("volumes", []):
                if "configMap" in volume:
                    assert ("ConfigMap", volume["configMap"]["name"]) in names, where
                if "persistentVolumeClaim" in volume:
                    claim = volume["persistentVolumeClaim"]["claimName"]
                    assert ("PersistentVolumeClaim", claim) in names, where
            for c in spec["containers"]:
                for source in c.get("envFrom", []):
                    assert ("ConfigMap", source["configMapRef"]["name"]) in names, where
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref is not None:
                        assert ref["name"] == "fleetledger", where
                        secret_keys.add(ref["key"])
        runbook = (ROOT / "ops" / "runbooks" / "deploy.md").read_text(encoding="utf-8")
        assert secret_keys == set(re.findall(r"--from-literal=([a-z-]+)=", runbook))


class TestHardening:
    def test_every_pod_runs_restricted_with_resources(self, target: str) -> None:
        """Non-root, read-only root filesystem, no privilege escalation, all capabilities
        dropped, the runtime's seccomp profile, and CPU and memory requests and limits."""
        for where, template in pod_templates(rendered(target)):
            spec = template["spec"]
            pod = spec.get("securityContext", {})
            assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, where
            for c in spec["containers"]:
                context = c["securityContext"]
                name = f"{where}/{c['name']}"
                assert context.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, name
                assert context["readOnlyRootFilesystem"] is True, name
                assert context["allowPrivilegeEscalation"] is False, name
                assert context["capabilities"] == {"drop": ["ALL"]}, name
                for kind in ("requests", "limits"):
                    assert set(c["resources"][kind]) == {"cpu", "memory"}, name

    def test_only_the_controller_gets_an_api_token(self, target: str) -> None:
        """The migration Job talks to the database only: no ServiceAccount token is mounted."""
        job = find(rendered(target), "Job", "fleetledger-migrate")["spec"]["template"]["spec"]
        assert job["automountServiceAccountToken"] is False


def _images(objects: list[Manifest]) -> list[str]:
    return [c["image"] for _, t in pod_templates(objects) for c in t["spec"]["containers"]]


def _args(target: str) -> list[str]:
    objects = rendered(target)
    return expanded_args(objects, container(objects, "fleetledger", "fleetledger"))


class TestOverlays:
    def test_prod_pins_every_image_and_deploys_the_projects_version(self) -> None:
        """Every image has an explicit tag, never latest, and the controller's is the version
        in pyproject.toml (bump both together)."""
        version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
            "version"
        ]
        images = _images(rendered("prod"))
        for image in images:
            name, _, tag = image.rpartition(":")
            assert name and "/" not in tag and tag not in ("", "latest"), image
        assert f"registry.example.com/fleetledger:{version}" in images

    def test_prod_elects_on_a_lease_and_dev_on_the_database(self) -> None:
        assert option(_args("prod"), "--leader-election") == "kubernetes"
        assert option(_args("dev"), "--leader-election") is None

    def test_prod_budgets_disruptions_for_both_deployments(self) -> None:
        """A drain leaves one controller and one scheduler: each Deployment's pods are covered by
        a PodDisruptionBudget with minAvailable 1 and run two replicas."""
        objects = rendered("prod")
        budgets = [o["spec"] for o in objects if o["kind"] == "PodDisruptionBudget"]
        for name in ("fleetledger", "fleetledger-scheduler"):
            deployment = find(objects, "Deployment", name)
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert deployment["spec"]["replicas"] == 2
            assert [
                b["minAvailable"]
                for b in budgets
                if b["selector"]["matchLabels"].items() <= labels.items()
            ] == [1]

    def test_prod_gives_the_controller_more_than_the_base(self) -> None:
        base = container(rendered("base"), "fleetledger", "fleetledger")["resources"]
        prod = container(rendered("prod"), "fleetledger", "fleetledger")["resources"]
        assert prod != base
        assert prod["requests"]["memory"] == "512Mi" and base["requests"]["memory"] == "256Mi"

    def test_prod_keeps_anchors_on_a_shared_volume(self) -> None:
        """Both replicas mount one ReadWriteMany claim, so the next leader continues the series."""
        objects = rendered("prod")
        spec = find(objects, "Deployment", "fleetledger")["spec"]["template"]["spec"]
        [anchors] = [v for v in spec["volumes"] if v["name"] == "anchors"]
        claim_name = anchors["persistentVolumeClaim"]["claimName"]
        claim = find(objects, "PersistentVolumeClaim", claim_name)
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        assert "emptyDir" not in anchors

    def test_dev_runs_one_of_each(self) -> None:
        objects = rendered("dev")
        assert [
            find(objects, "Deployment", n)["spec"]["replicas"]
            for n in (
                "fleetledger",
                "fleetledger-scheduler",
            )
        ] == [1, 1]


class TestImage:
    def test_the_dockerfile_copies_what_the_wheel_is_built_from(self) -> None:
        """The build stage copies pyproject.toml, its readme and every folder pyproject maps a
        package to (the build fails on a missing one), and nothing that does not exist."""
        sources = []
        for line in (ROOT / "ops" / "Dockerfile").read_text(encoding="utf-8").splitlines():
            words = line.split()
            if words[:1] == ["COPY"] and not words[1].startswith("--from"):
                sources += words[1:-1]
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        needed = {"pyproject.toml", project["project"]["readme"]}
        needed |= set(project["tool"]["setuptools"]["package-dir"].values())
        assert needed <= set(sources)
        assert [s for s in sources if not (ROOT / s).exists()] == []
