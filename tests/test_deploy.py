"""deploy/: the Kubernetes manifests validate offline, every YAML file lints, and the ports, paths,
flags and names in the image, compose file and manifests agree with the worker's CLI and config.
With kubectl (or kustomize) installed, the kustomizations are built too: the ConfigMap generated
from worker.toml, the optional autoscaling component."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml
from workers import worker_process
from yamllint import linter
from yamllint.config import YamlLintConfig

from loadax.client import cli
from loadax.client.prometheus import LoaderCollector
from loadax.iterators.stats import StatsRecorder
from loadax.server.config import WorkerConfig, build_pipelines, load_config
from loadax.server.main import _parser

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
AUTOSCALING = KUBERNETES / "autoscaling"
KEDA = KUBERNETES / "keda"
WORKER_TOML = DEPLOY / "worker.toml"
FACTORIES_EXAMPLE = DEPLOY / "factories-example"
# gRPC probes are GA since 1.27; 1.37 is the newest kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.27", "1.37")
HPA_METRIC = "loadax_worker_in_flight"
CLI_START_S = 5  # how long `loadax ping` may take to start (it imports JAX) on a busy machine


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage of deploy/Dockerfile: its instructions, after those of the stages it builds on."""

    name: str
    instructions: tuple[tuple[str, str], ...]  # (INSTRUCTION, its arguments)

    def last(self, name: str) -> str:
        """The arguments of the stage's last `name` instruction (the one that takes effect)."""
        found = [arguments for instruction, arguments in self.instructions if instruction == name]
        assert found, f"deploy/Dockerfile: stage {self.name} has no {name} instruction"
        return found[-1]

    def entrypoint(self) -> list[str]:
        return exec_form(f"{self.name} ENTRYPOINT", self.last("ENTRYPOINT"))

    def healthcheck(self) -> list[str]:
        _, separator, command = self.last("HEALTHCHECK").partition("CMD ")
        assert separator, f"deploy/Dockerfile: stage {self.name}'s HEALTHCHECK needs a CMD"
        return exec_form(f"{self.name} HEALTHCHECK CMD", command)

    def env(self) -> dict[str, str]:
        return dict(
            pair.split("=", 1)
            for instruction, arguments in self.instructions
            if instruction == "ENV"
            for pair in shlex.split(arguments)
        )

    def user(self) -> str:
        """The uid that runs the stage's ENTRYPOINT."""
        return self.last("USER").split(":")[0]

    def workdir(self) -> PurePosixPath:
        steps = self._steps()
        return steps[-1][0] if steps else PurePosixPath("/")

    def copied(self) -> dict[PurePosixPath, Path]:
        """Each path that COPY creates in the image -> its source in the repository."""
        paths = {}
        for workdir, instruction, arguments in self._steps():
            if instruction == "COPY":
                *sources, destination = arguments.split()
                target = workdir / destination
                for source in sources:
                    within = target / PurePosixPath(source).name if len(sources) > 1 else target
                    paths[within] = ROOT / source
        return paths

    def _steps(self) -> list[tuple[PurePosixPath, str, str]]:
        """(the WORKDIR in effect after it, INSTRUCTION, arguments) for each instruction."""
        workdir, steps = PurePosixPath("/"), []
        for instruction, arguments in self.instructions:
            if instruction == "WORKDIR":
                workdir /= arguments
            steps.append((workdir, instruction, arguments))
        return steps

    def source_of(self, path: str | PurePosixPath) -> Path:
        """The repository file or folder that the image has at `path` (relative: to WORKDIR)."""
        image_path = self.workdir() / path
        for target, source in self.copied().items():
            if image_path == target or target in image_path.parents:
                return source / image_path.relative_to(target)
        raise AssertionError(f"deploy/Dockerfile: stage {self.name} copies nothing to {path}")


def stages(dockerfile: str = "Dockerfile") -> dict[str, Stage]:
    """A Dockerfile's stages by name, in order; the last is what `docker build` builds. The
    instructions before the first FROM (its ARGs) are the stage named ""."""
    text = re.sub(r"\\\n", " ", (DEPLOY / dockerfile).read_text())
    built: dict[str, list[tuple[str, str]]] = {"": []}
    current = built[""]
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, arguments = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            named = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", arguments.strip(), re.IGNORECASE)
            assert named, f"deploy/{dockerfile}: cannot read FROM {arguments}"
            current = built[named[2] or str(len(built))] = list(built.get(named[1], []))
        else:
            current.append((instruction.upper(), arguments.strip()))
    return {
        name: Stage(name, tuple(instructions))
        for name, instructions in built.items()
        if name or instructions
    }


def worker_image() -> Stage:
    """The image the Deployment and compose's workers run: the Dockerfile's default stage."""
    return list(stages().values())[-1]


def exec_form(name: str, arguments: str) -> list[str]:
    """A JSON-array instruction's command: the exec form, so that signals reach the process."""
    try:
        command = json.loads(arguments)
    except json.JSONDecodeError:
        command = None
    if not (isinstance(command, list) and all(isinstance(part, str) for part in command)):
        raise AssertionError(
            f"deploy/Dockerfile: {name} must be a JSON array of strings (exec form), "
            f"got {arguments}"
        )
    return command


def kustomization(folder: Path = DEPLOY) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return document


def listed(folder: Path) -> dict[str, dict[str, Any]]:
    """The resources that `folder`'s kustomization lists, by kind (one of each)."""
    resources: dict[str, dict[str, Any]] = {}
    for name in kustomization(folder).get("resources", []):
        for resource in yaml.safe_load_all((folder / name).read_text()):
            assert resource["kind"] not in resources, f"two {resource['kind']}s in the manifests"
            resources[resource["kind"]] = resource
    return resources


def manifests() -> dict[str, dict[str, Any]]:
    """What deploy/kustomization.yaml applies, by kind (one of each): the resources it lists and
    the ConfigMap it generates (named as the generator is, without kustomize's hash)."""
    resources = listed(DEPLOY)
    (generator,) = kustomization()["configMapGenerator"]
    assert "ConfigMap" not in resources, "the ConfigMap is generated from worker.toml, not listed"
    resources["ConfigMap"] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": generator["name"], "labels": generator["options"]["labels"]},
        "data": {PurePosixPath(f).name: (DEPLOY / f).read_text() for f in generator["files"]},
    }
    return resources


def autoscaler() -> dict[str, Any]:
    """The HorizontalPodAutoscaler of the optional autoscaling component."""
    return listed(AUTOSCALING)["HorizontalPodAutoscaler"]


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return document


def compose_workers() -> dict[str, dict[str, Any]]:
    """compose.yaml's services that run the worker image."""
    services: dict[str, dict[str, Any]] = compose()["services"]
    workers = {
        name: service
        for name, service in services.items()
        if service.get("build", {}).get("target") == worker_image().name
    }
    assert len(workers) == 2, f"compose.yaml must run 2 workers, got {sorted(workers)}"
    return workers


def pod() -> dict[str, Any]:
    template: dict[str, Any] = manifests()["Deployment"]["spec"]["template"]
    return template


def container() -> dict[str, Any]:
    (worker,) = pod()["spec"]["containers"]
    return dict(worker)


def worker_args(argv: list[str]) -> argparse.Namespace:
    """`loadax-worker`'s parse of `argv`; an unknown flag or a bad value fails the test."""
    try:
        return _parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"loadax-worker refuses the arguments {argv}") from None


def image_args(args: list[str]) -> argparse.Namespace:
    """The worker's arguments: the image's ENTRYPOINT, then `args` (a Deployment's or compose's)."""
    command = worker_image().entrypoint()
    assert command[0] == "loadax-worker", f"the image must run loadax-worker, not {command[0]}"
    return worker_args([*command[1:], *args])


def deployment_args() -> argparse.Namespace:
    return image_args(container().get("args", []))


def config_map_toml() -> str:
    text: str = manifests()["ConfigMap"]["data"][PurePosixPath(deployment_args().config).name]
    return text


def port(address: str | None) -> int:
    assert address is not None, "deploy/worker.toml must set every listen address"
    return int(address.rpartition(":")[2])


@pytest.fixture
def image_path(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The image's PYTHONPATH, as the folders of the repository it copies, importable here."""
    entries = [
        str(worker_image().source_of(entry))
        for entry in worker_image().env()["PYTHONPATH"].split(":")
    ]
    for entry in entries:
        monkeypatch.syspath_prepend(entry)
    return entries


@pytest.fixture
def config(image_path: list[str]) -> WorkerConfig:
    """deploy/worker.toml, its factories importable as in the image."""
    return load_config(WORKER_TOML)


def yaml_files() -> Iterator[Path]:
    return (path for path in sorted(DEPLOY.rglob("*")) if path.suffix in (".yaml", ".yml"))


@pytest.mark.parametrize(
    "path", list(yaml_files()), ids=lambda path: path.relative_to(DEPLOY).as_posix()
)
def test_yaml_passes_yamllint(path: Path) -> None:
    lint_config = YamlLintConfig(file=str(DEPLOY / ".yamllint.yaml"))
    problems = list(linter.run(path.read_text(), lint_config, str(path)))
    assert not problems, "\n".join(
        f"{path}:{p.line}:{p.column}: {p.desc} ({p.rule})" for p in problems
    )


def validate(resources: Iterable[dict[str, Any]], version: str) -> None:
    for resource in resources:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            raise AssertionError(
                f"{resource['kind']} is invalid for Kubernetes {version}: {path}: {error.message}"
            ) from None


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(version: str) -> None:
    validate([*manifests().values(), autoscaler()], version)


def test_kustomizations_list_every_manifest() -> None:
    default = kustomization()["resources"]
    assert sorted(default) == sorted(f"kubernetes/{p.name}" for p in KUBERNETES.glob("*.yaml"))
    for folder in (AUTOSCALING, KEDA):
        component = kustomization(folder)
        assert component["kind"] == "Component"
        assert component["resources"] == [
            p.name for p in folder.glob("*.yaml") if p.stem != "kustomization"
        ]


def test_the_default_kustomization_leaves_autoscaling_out() -> None:
    assert "components" not in kustomization()
    assert "HorizontalPodAutoscaler" not in manifests()
    mentioned = (DEPLOY / "kustomization.yaml").read_text()
    assert "#   - kubernetes/autoscaling\n" in mentioned, "show how to add the component"
    for documented in (AUTOSCALING / "README.md", AUTOSCALING / "kustomization.yaml"):
        text = documented.read_text()
        assert "metrics adapter" in text, documented
        assert "prometheus-adapter" in text, documented


def test_both_worker_configs_load_and_build_their_pipelines(
    config: WorkerConfig, tmp_path: Path
) -> None:
    mounted = tmp_path / "worker.toml"
    mounted.write_text(config_map_toml())
    for loaded in (config, load_config(mounted)):
        assert set(build_pipelines(loaded)) == {"images", "regression"}


def test_the_config_map_is_generated_from_the_image_config() -> None:
    (generator,) = kustomization()["configMapGenerator"]
    assert [DEPLOY / path for path in generator["files"]] == [WORKER_TOML]
    assert generator.get("behavior", "create") == "create"
    assert not kustomization().get("generatorOptions", {}).get("disableNameSuffixHash", False)
    assert not generator.get("options", {}).get("disableNameSuffixHash", False)
    assert config_map_toml() == WORKER_TOML.read_text()


def test_the_image_runs_the_worker_on_the_mounted_config_as_a_non_root_user() -> None:
    config_path = PurePosixPath(deployment_args().config)
    assert worker_image().source_of(config_path) == WORKER_TOML
    for stage in (s for s in stages().values() if "ENTRYPOINT" in dict(s.instructions)):
        user = stage.user()
        assert user.isdigit(), f"{stage.name}: USER must be a numeric uid (runAsNonRoot): {user}"
        assert int(user) != 0, f"{stage.name}: USER must not be root"
    assert pod()["spec"]["securityContext"]["runAsUser"] == int(worker_image().user())
    (volume,) = (
        m for m in container()["volumeMounts"] if m["mountPath"] == str(config_path.parent)
    )
    (source,) = (v for v in pod()["spec"]["volumes"] if v["name"] == volume["name"])
    assert source["configMap"]["name"] == manifests()["ConfigMap"]["metadata"]["name"]
    for name, worker in compose_workers().items():
        assert f"./worker.toml:{config_path}:ro" in worker["volumes"], name


def test_the_build_context_holds_everything_the_image_copies() -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for stage in stages().values():
        for source in stage.copied().values():
            relative = source.relative_to(ROOT).as_posix()
            assert source.exists(), f"deploy/Dockerfile copies {relative}, which does not exist"
            excluded = [pattern for pattern in ignored if fnmatch.fnmatch(relative, pattern)]
            assert not excluded, f".dockerignore's {excluded} leaves {relative} out of the image"


def test_the_image_commands_are_the_package_console_scripts() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[worker_image().entrypoint()[0]] == "loadax.server.main:main"
    assert scripts[worker_image().healthcheck()[0]] == "loadax.client.cli:main"


def test_the_healthcheck_gives_the_ping_time_to_start_and_wait() -> None:
    options, _, _ = worker_image().last("HEALTHCHECK").partition("CMD ")
    timeout = re.search(r"--timeout=(\d+)s", options)
    assert timeout, f"HEALTHCHECK needs a --timeout in seconds, like --timeout=10s: {options}"
    command = worker_image().healthcheck()
    ping_timeout = float(command[command.index("--timeout") + 1])
    assert int(timeout[1]) >= ping_timeout + CLI_START_S


def test_every_worker_flag_is_one_the_worker_accepts() -> None:
    deployment_args()
    for worker in compose_workers().values():
        image_args(worker["command"])


def test_ports_match_the_worker_config(config: WorkerConfig) -> None:
    ports = {"grpc": port(config.grpc), "zmq": port(config.zmq), "metrics": port(config.metrics)}
    ports["zmq-data"], ports["grpc-data"] = config.zmq_data_port, config.grpc_data_port
    assert {p["name"]: p["containerPort"] for p in container()["ports"]} == ports
    assert {int(p) for p in worker_image().last("EXPOSE").split()} == set(ports.values())
    service_ports = manifests()["Service"]["spec"]["ports"]
    assert {p["targetPort"]: p["port"] for p in service_ports} == ports
    assert worker_image().healthcheck()[2] == f"grpc://127.0.0.1:{ports['grpc']}"
    for name, worker in compose_workers().items():
        published = [int(p.rpartition(":")[2]) for p in worker["ports"]]
        assert published == [ports["metrics"]], f"{name} publishes container ports {published}"


def test_probes_ask_the_overall_grpc_health_on_the_grpc_port(config: WorkerConfig) -> None:
    for probe in ("readinessProbe", "livenessProbe"):
        grpc_probe = container()[probe]["grpc"]
        assert grpc_probe["port"] == port(config.grpc), probe
        assert grpc_probe.get("service", "") == "", f"{probe} must check the whole worker"


def test_prometheus_scrapes_the_metrics_port(config: WorkerConfig) -> None:
    annotations = pod()["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port(config.metrics))
    assert annotations["prometheus.io/path"] == "/metrics"


def test_termination_outlasts_the_pre_stop_sleep_and_the_drain() -> None:
    grace = deployment_args().grace
    sleep, seconds = container()["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == "sleep"
    period = pod()["spec"]["terminationGracePeriodSeconds"]
    assert period > grace + float(seconds), f"{period} s cannot fit {seconds} s + --grace {grace}"
    for name, worker in compose_workers().items():
        stop_period = re.fullmatch(r"(\d+)s", worker["stop_grace_period"])
        assert stop_period, f"{name}: write stop_grace_period in seconds, like 40s"
        assert int(stop_period[1]) > image_args(worker["command"]).grace, name


def test_memory_limit_exceeds_the_memory_budget(config: WorkerConfig) -> None:
    limit = container()["resources"]["limits"]["memory"]
    units = {"Mi": 1 << 20, "Gi": 1 << 30}
    assert limit[-2:] in units, f"write the memory limit in Mi or Gi, got {limit}"
    assert config.memory_budget_bytes is not None
    assert int(limit[:-2]) * units[limit[-2:]] > config.memory_budget_bytes


def test_selectors_pick_the_worker_pods() -> None:
    labels = pod()["metadata"]["labels"]
    resources = manifests()
    (spread,) = pod()["spec"]["topologySpreadConstraints"]
    selectors: Mapping[str, Mapping[str, str]] = {
        "Deployment": resources["Deployment"]["spec"]["selector"]["matchLabels"],
        "Service": resources["Service"]["spec"]["selector"],
        "PodDisruptionBudget": resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        "topologySpreadConstraints": spread["labelSelector"]["matchLabels"],
    }
    for owner, selector in selectors.items():
        assert selector, f"{owner} selects nothing"
        assert dict(selector).items() <= labels.items(), f"{owner}'s {selector} misses {labels}"


def test_service_is_headless_and_lists_only_ready_workers() -> None:
    spec = manifests()["Service"]["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is False


def test_autoscaler_scales_the_deployment_on_requests_in_flight(config: WorkerConfig) -> None:
    hpa, deployment = autoscaler()["spec"], manifests()["Deployment"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["maxReplicas"]
    (metric,) = hpa["metrics"]
    assert metric["pods"]["metric"]["name"] == HPA_METRIC
    # Above `threads` requests in flight, requests queue: scale before that.
    assert float(metric["pods"]["target"]["averageValue"]) < config.threads


def test_images_are_tagged_with_the_package_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    image = f"loadax-worker:{version}"
    assert container()["image"] == image
    for name, worker in compose_workers().items():
        assert worker["image"] == image, name
    assert compose()["services"]["trainer"]["image"] == f"loadax-trainer:{version}"
    assert f"-t {image} " in (DEPLOY / "Dockerfile").read_text()


def test_the_compose_trainer_trains_on_a_pipeline_the_workers_serve(config: WorkerConfig) -> None:
    trainer = compose()["services"]["trainer"]
    stage = stages()[trainer["build"]["target"]]
    python, script = stage.entrypoint()
    assert python == "python"
    source = stage.source_of(script)
    assert source.is_file(), f"the trainer runs {script}, which the image does not have"
    example = importlib.import_module(source.stem)  # on the image's PYTHONPATH
    targets = [f"grpc://{name}:{port(config.grpc)}" for name in compose_workers()]
    assert example.parse_args(trainer["command"]).workers == targets
    served = {pipeline.name: pipeline.factory for pipeline in config.pipelines}
    assert served.get(example.PIPELINE) == example.FACTORY


def test_a_worker_on_the_image_config_passes_the_healthcheck_and_exports_the_hpa_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image_path: list[str]
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(image_path))
    loopback = ["--grpc", "127.0.0.1:0", "--zmq", "tcp://127.0.0.1:0", "--metrics", "127.0.0.1:0"]
    with worker_process(tmp_path, config=WORKER_TOML, args=loopback) as worker:
        _, *ping = worker_image().healthcheck()
        assert worker.grpc is not None
        assert cli.main([worker.grpc if arg.startswith("grpc://") else arg for arg in ping]) == 0
        with urllib.request.urlopen(f"http://{worker.metrics}/metrics", timeout=10) as response:
            exported = response.read().decode()
        assert f"# TYPE {HPA_METRIC} gauge" in exported
        assert worker.terminate() == 0


# --- kustomize builds (with kubectl or kustomize installed) ------------------------------------


def built(folder: Path) -> dict[str, dict[str, Any]]:
    """What `kustomize build folder` makes, by kind (one of each)."""
    if shutil.which("kustomize"):
        command = ["kustomize", "build"]
    elif shutil.which("kubectl"):
        command = ["kubectl", "kustomize"]
    else:
        pytest.skip("neither kustomize nor kubectl is installed")
    result = subprocess.run(
        [*command, str(folder)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"{' '.join(command)} {folder}: {result.stderr}"
    resources = {}
    for resource in yaml.safe_load_all(result.stdout):
        assert resource["kind"] not in resources, f"two {resource['kind']}s in the build"
        resources[resource["kind"]] = resource
    return resources


def config_volume(resources: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    (volume,) = (
        volume
        for volume in resources["Deployment"]["spec"]["template"]["spec"]["volumes"]
        if "configMap" in volume
    )
    reference: dict[str, str] = volume["configMap"]
    return reference


def deploy_copy(tmp_path: Path) -> Path:
    """deploy/'s kustomization, manifests and config, copied where a test may change them."""
    copy = tmp_path / "deploy"
    copy.mkdir()
    shutil.copy(DEPLOY / "kustomization.yaml", copy)
    shutil.copy(WORKER_TOML, copy)
    shutil.copytree(KUBERNETES, copy / "kubernetes")
    return copy


def test_kustomize_builds_the_manifests_with_a_config_map_of_worker_toml() -> None:
    resources = built(DEPLOY)
    assert sorted(resources) == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    name = resources["ConfigMap"]["metadata"]["name"]
    assert re.fullmatch(r"loadax-worker-config-[a-z0-9]{10}", name), name
    assert resources["ConfigMap"]["data"] == {"worker.toml": WORKER_TOML.read_text()}
    assert config_volume(resources)["name"] == name
    # Apart from the hash in the ConfigMap's name, the build is what the other tests check.
    generator_name = manifests()["ConfigMap"]["metadata"]["name"]
    resources["ConfigMap"]["metadata"]["name"] = config_volume(resources)["name"] = generator_name
    assert resources == manifests()
    for version in KUBERNETES_VERSIONS:
        validate(resources.values(), version)


def test_a_changed_config_renames_the_config_map_and_so_rolls_the_workers(
    tmp_path: Path,
) -> None:
    copy = deploy_copy(tmp_path)
    before = built(copy)
    assert "\nthreads = 4\n" in WORKER_TOML.read_text()
    (copy / "worker.toml").write_text(WORKER_TOML.read_text().replace("threads = 4", "threads = 6"))
    after = built(copy)
    old, new = (resources["ConfigMap"]["metadata"]["name"] for resources in (before, after))
    assert old != new
    assert config_volume(after)["name"] == new
    # A new pod template: the Deployment rolls its pods, one surge at a time.
    template = before["Deployment"]["spec"]["template"]
    assert template != after["Deployment"]["spec"]["template"]
    assert after["Deployment"]["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def overlay_of(tmp_path: Path, component: Path) -> Path:
    """An overlay outside deploy/ that adds `component` to deploy/'s kustomization."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY, overlay)],
                "components": [os.path.relpath(component, overlay)],
            }
        )
    )
    return overlay


def test_the_autoscaling_component_adds_the_autoscaler_and_leaves_it_the_replicas(
    tmp_path: Path,
) -> None:
    overlay = overlay_of(tmp_path, AUTOSCALING)
    # The other way: the lines deploy/kustomization.yaml has commented out, uncommented.
    in_place = deploy_copy(tmp_path)
    text = (in_place / "kustomization.yaml").read_text()
    (in_place / "kustomization.yaml").write_text(
        text.replace(
            "# components:\n#   - kubernetes/autoscaling", "components:\n  - kubernetes/autoscaling"
        )
    )
    default = built(DEPLOY)
    del default["Deployment"]["spec"]["replicas"]
    for scaled in (built(overlay), built(in_place)):
        for version in KUBERNETES_VERSIONS:
            validate(scaled.values(), version)
        assert "replicas" not in scaled["Deployment"]["spec"]
        assert scaled.pop("HorizontalPodAutoscaler") == autoscaler()
        assert scaled == default


# --- your own factories -------------------------------------------------------------------


def test_the_factories_image_installs_a_project_on_the_worker_image() -> None:
    text = (DEPLOY / "Dockerfile.factories").read_text()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    arguments, image = stages("Dockerfile.factories").values()
    assert arguments.last("ARG") == f"LOADAX_IMAGE=loadax-worker:{version}"
    assert re.search(r"^FROM \$\{LOADAX_IMAGE\}$", text, re.MULTILINE)
    # The worker image's entrypoint, healthcheck and ports stay; so does its user.
    instructions = {instruction for instruction, _ in image.instructions}
    assert not instructions & {"ENTRYPOINT", "CMD", "HEALTHCHECK", "EXPOSE"}, instructions
    assert image.user() == worker_image().user()
    assert ("COPY", ". /opt/factories/") in image.instructions
    assert ("RUN", "pip install /opt/factories") in image.instructions
    assert f"-t loadax-worker:{version} ." in text
    assert "deploy/Dockerfile.factories" in text
    assert str(FACTORIES_EXAMPLE.relative_to(ROOT)) in text


def test_the_factories_example_installs_the_package_its_config_names() -> None:
    project = tomllib.loads((FACTORIES_EXAMPLE / "pyproject.toml").read_text())
    (where,) = project["tool"]["setuptools"]["packages"]["find"]["where"]
    example = tomllib.loads((FACTORIES_EXAMPLE / "worker.toml").read_text())
    assert example["server"]["python_path"] == [where]
    for pipeline in example["pipelines"].values():
        package = pipeline["factory"].split(".")[0].split(":")[0]
        assert (FACTORIES_EXAMPLE / where / package / "__init__.py").is_file(), package


def test_the_factories_example_is_served_from_python_path_without_pythonpath(
    tmp_path: Path,
) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into deploy/
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadax.server.main",
            "--config",
            str(FACTORIES_EXAMPLE / "worker.toml"),
            "--check",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        'squares: mypipe.pipelines:squares(**{"records": 1024}) -> 1024 records'
    ), result.stdout


# --- sizing from the trainers' demand (KEDA) ---------------------------------------------


def test_the_keda_component_sizes_the_workers_from_the_sum_of_workers_wanted(
    tmp_path: Path,
) -> None:
    scaled = built(overlay_of(tmp_path, KEDA))
    scaler = scaled.pop("ScaledObject")
    # A CRD, which kubernetes-validate does not know: its fields as KEDA's v1alpha1 has them.
    assert scaler["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaler["spec"]
    assert set(spec) <= {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "advanced",
        "triggers",
    }
    deployment = scaled["Deployment"]
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
    assert target["name"] == deployment["metadata"]["name"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert set(trigger["metadata"]) == {"serverAddress", "query", "threshold", "metricType"}
    # desired = ceil(sum over trainers of workers_wanted / 1)
    assert trigger["metadata"]["query"] == "sum(loadax_client_workers_wanted)"
    assert (trigger["metadata"]["threshold"], trigger["metadata"]["metricType"]) == (
        "1",
        "AverageValue",
    )
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    validate([_hpa_with(behavior)], KUBERNETES_VERSIONS[-1])
    # The rest is deploy/'s, less the replicas that KEDA now owns.
    for version in KUBERNETES_VERSIONS:
        validate(scaled.values(), version)
    default = built(DEPLOY)
    del default["Deployment"]["spec"]["replicas"]
    assert scaled == default
    assert "loadax_client_workers_wanted" in (KEDA / "README.md").read_text()
    assert "external.metrics.k8s.io" in (KEDA / "README.md").read_text()


def _hpa_with(behavior: dict[str, Any]) -> dict[str, Any]:
    """An HPA with the `behavior` KEDA passes on to the one it makes, to validate it."""
    hpa = dict(autoscaler())
    hpa["spec"] = {**hpa["spec"], "behavior": behavior}
    return hpa


def test_the_clients_export_the_metric_the_keda_query_sums() -> None:
    query = yaml.safe_load((KEDA / "scaledobject.yaml").read_text())["spec"]["triggers"][0]
    metric = re.fullmatch(r"sum\((\w+)\)", query["metadata"]["query"])
    assert metric is not None
    stats = dataclasses.replace(StatsRecorder().snapshot(), workers_wanted=3)
    exported = {family.name: family for family in LoaderCollector(lambda: stats).collect()}
    assert exported[metric[1]].samples[0].value == 3
