"""The shipped deployment files load as a deployment loads them: each instance config with its launcher and executor
(schema and construction without a cluster; the whole instance on PostgreSQL when RAG_TEST_POSTGRES_URL names one),
the Helm values against deploy/k8s/dagster.yaml, the compose file's services, and RAG_EXECUTOR."""

import importlib

import pytest
import yaml
from dagster import in_process_executor, multiprocess_executor

from orchestration.executor import CELERY_BACKEND_ENV, CELERY_BROKER_ENV, EXECUTOR_ENV, executor_from_env
from tests.instance_configs import (
    CELERY_INSTANCE,
    CELERY_WORKER_CONFIG,
    DEPLOY,
    K8S_INSTANCE,
    SHIPPED_INSTANCES,
    dagster_pg_env,
    instance_home,
)
from tests.test_feedback_store import POSTGRES, scratch_postgres

# What a pod's environment holds (dummy values: nothing here connects anywhere).
K8S_ENV = {"DAGSTER_K8S_JOB_NAMESPACE": "rag", "RAG_IMAGE": "registry.example.com/rag:abc1234"}
PG_ENV = dagster_pg_env("postgresql+psycopg://dagster:secret@db.example:5432/dagster")


def load(path):
    return yaml.safe_load(path.read_text())


def processed(data) -> dict:
    """A configurable class's config from dagster.yaml checked against the class's own schema, env resolved: what
    Dagster does before it constructs the class."""
    from dagster._config import process_config, resolve_to_config_type

    klass = getattr(importlib.import_module(data.module_name), data.class_name)
    result = process_config(resolve_to_config_type(klass.config_type()), data.config_dict)
    assert result.success, [e.message for e in result.errors]
    return result.value


def instance_ref(tmp_path, config):
    from dagster._core.instance.ref import InstanceRef

    return InstanceRef.from_dir(str(instance_home(tmp_path, config)))


@pytest.fixture
def no_cluster(monkeypatch):
    """K8sRunLauncher reads the cluster's credentials when constructed; everything else it checks needs none."""
    import dagster_k8s.launcher

    monkeypatch.setattr(dagster_k8s.launcher, "load_kubernetes_config", lambda **_: None)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, in_process_executor),
        ({"QDRANT_URL": "http://qdrant:6333"}, multiprocess_executor),
        ({EXECUTOR_ENV: "in_process", "QDRANT_URL": "http://qdrant:6333"}, in_process_executor),
        ({EXECUTOR_ENV: "multiprocess"}, multiprocess_executor),
    ],
)
def test_rag_executor_picks_dagsters_executors(monkeypatch, env, expected):
    for name in (EXECUTOR_ENV, "QDRANT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert executor_from_env() is expected


def test_an_unknown_executor_names_the_choices(monkeypatch):
    monkeypatch.setenv(EXECUTOR_ENV, "kubernetes")
    with pytest.raises(ValueError, match="auto, in_process, multiprocess, celery"):
        executor_from_env()


def test_celery_runs_and_workers_meet_on_the_broker_the_environment_names(monkeypatch):
    from dagster_celery.cli import get_validated_config

    monkeypatch.setenv(EXECUTOR_ENV, "celery")
    monkeypatch.setenv(CELERY_BROKER_ENV, "redis://redis:6379/0")
    monkeypatch.setenv(CELERY_BACKEND_ENV, "redis://redis:6379/1")
    executor = executor_from_env()
    run_side = executor.apply_config_mapping({}).value["config"]
    worker_side = get_validated_config(str(CELERY_WORKER_CONFIG))
    assert executor.name == "celery"
    assert (run_side["broker"], run_side["backend"]) == ("redis://redis:6379/0", "redis://redis:6379/1")
    assert (worker_side["broker"], worker_side["backend"]) == (run_side["broker"], run_side["backend"])


@pytest.mark.parametrize("config", SHIPPED_INSTANCES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_shipped_instance_lets_one_embedded_qdrant_run_at_a_time(config, monkeypatch):
    """The `qdrant` pool with run granularity and limit 1: two runs never open the embedded folder at once
    (QdrantLockedError); with a Qdrant server its writers take no pool, so runs go in parallel."""
    from resources.qdrant import qdrant_pool

    pools = load(config)["concurrency"]["pools"]
    assert (pools["granularity"], pools["default_limit"]) == ("run", 1)
    monkeypatch.delenv("QDRANT_URL", raising=False)
    assert qdrant_pool() == "qdrant"
    monkeypatch.setenv("QDRANT_URL", "http://qdrant:6333")
    assert qdrant_pool() is None


def test_the_celery_instance_config_loads_its_storage_and_queue(tmp_path, monkeypatch):
    for name, value in PG_ENV.items():
        monkeypatch.setenv(name, value)
    ref = instance_ref(tmp_path, CELERY_INSTANCE)
    storage = processed(ref.storage_data)
    assert storage["postgres_db"]["scheme"] == "postgresql+psycopg2"
    assert storage["postgres_db"]["hostname"] == "db.example" and storage["postgres_db"]["port"] == 5432
    assert ref.run_coordinator_data.class_name == "QueuedRunCoordinator"
    processed(ref.run_coordinator_data)
    # The default launcher: a run's orchestrator runs beside the code server and sends its steps to the workers.
    assert ref.run_launcher_data.class_name == "DefaultRunLauncher"


def test_the_kubernetes_instance_config_builds_its_launcher_with_every_entry_a_launch_needs(
    tmp_path, monkeypatch, no_cluster
):
    from dagster_k8s import K8sRunLauncher

    for name, value in {**PG_ENV, **K8S_ENV}.items():
        monkeypatch.setenv(name, value)
    ref = instance_ref(tmp_path, K8S_INSTANCE)
    processed(ref.storage_data)
    config = processed(ref.run_launcher_data)
    launcher = K8sRunLauncher.from_config_value(ref.run_launcher_data, config)
    assert launcher.instance_config_map == "dagster-instance"
    assert launcher.service_account_name == "dagster"
    assert launcher.job_image == K8S_ENV["RAG_IMAGE"] and launcher.job_namespace == "rag"
    assert launcher.postgres_password_secret == "dagster-postgresql-secret"
    assert launcher.resources["limits"]["memory"] == "8Gi"
    assert [m["mountPath"] for m in launcher.volume_mounts] == ["/data"]


def test_the_kubernetes_config_without_a_required_entry_is_refused(tmp_path, monkeypatch):
    """The shipped example failed this way: `Missing required config entry "instance_config_map"`."""
    from dagster._core.instance.ref import InstanceRef

    for name, value in {**PG_ENV, **K8S_ENV}.items():
        monkeypatch.setenv(name, value)
    broken = load(K8S_INSTANCE)
    del broken["run_launcher"]["config"]["instance_config_map"]
    home = tmp_path / "broken"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(broken))
    with pytest.raises(AssertionError, match="instance_config_map"):
        processed(InstanceRef.from_dir(str(home)).run_launcher_data)


def test_the_helm_values_launch_runs_as_deploy_k8s_does():
    """What the chart renders for a run (its K8sRunLauncher config plus the user deployment's env and volumes,
    includeConfigInLaunchedRuns) matches deploy/k8s/dagster.yaml, and both queue embedded-Qdrant runs alike."""
    from dagster._config import process_config, resolve_to_config_type
    from dagster_k8s import K8sRunLauncher

    values = load(DEPLOY / "helm" / "values.yaml")
    shipped = load(K8S_INSTANCE)
    launcher = shipped["run_launcher"]["config"]
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    chart_launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "orchestration.definitions"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"]
    assert [m["name"] for m in deployment["envConfigMaps"]] == launcher["env_config_maps"]
    assert [s["name"] for s in deployment["envSecrets"]] == launcher["env_secrets"]
    assert deployment["volumes"] == [
        {"name": "rag-data", "persistentVolumeClaim": launcher["volumes"][0]["persistentVolumeClaim"]}
    ]
    assert deployment["volumeMounts"] == launcher["volume_mounts"]
    assert chart_launcher["resources"] == launcher["resources"]
    assert chart_launcher["runK8sConfig"]["jobSpecConfig"]["ttlSecondsAfterFinished"] == (
        launcher["run_k8s_config"]["job_spec_config"]["ttl_seconds_after_finished"]
    )
    assert values["postgresql"]["postgresqlScheme"] == shipped["storage"]["postgres"]["postgres_db"]["scheme"]
    pools, runs = values["concurrency"]["pools"], values["concurrency"]["runs"]
    assert values["concurrency"]["enabled"]
    assert (pools["granularity"], pools["defaultLimit"]) == ("run", shipped["concurrency"]["pools"]["default_limit"])
    assert runs["maxConcurrentRuns"] == shipped["concurrency"]["runs"]["max_concurrent_runs"]
    # The launcher config the chart's template writes from these values is valid for dagster-k8s.
    rendered = {
        "load_incluster_config": chart_launcher["loadInclusterConfig"],
        "job_namespace": chart_launcher["jobNamespace"] or "rag",
        "image_pull_policy": chart_launcher["imagePullPolicy"],
        "service_account_name": values["global"]["serviceAccountName"],
        "dagster_home": "/opt/dagster/dagster_home",
        "instance_config_map": "dagster-instance",
        "postgres_password_secret": "dagster-postgresql-secret",
        "resources": chart_launcher["resources"],
        "run_k8s_config": {"job_spec_config": chart_launcher["runK8sConfig"]["jobSpecConfig"]},
    }
    result = process_config(resolve_to_config_type(K8sRunLauncher.config_type()), rendered)
    assert result.success, [e.message for e in result.errors]


def test_the_compose_file_runs_every_part_from_one_image_behind_one_address():
    compose = load(DEPLOY / "compose.yaml")
    services = compose["services"]
    python_services = {"mlflow", "code-server", "webserver", "daemon", "bootstrap-index", "serve-1", "serve-2"}
    assert python_services | {"postgres", "proxy"} <= set(services)
    assert {services[s]["build"]["dockerfile"] for s in python_services} == {"Dockerfile"}
    assert len({services[s]["image"] for s in python_services}) == 1
    assert services["code-server"]["command"].startswith('sh -c "rag instance-config && exec dagster api grpc')
    assert services["code-server"]["command"].endswith('-m orchestration.definitions"')
    replicas = [s for s, spec in services.items() if str(spec.get("command", "")).startswith("rag serve")]
    assert sorted(replicas) == ["serve-1", "serve-2"]
    # Both replicas share the data dir, the tokens and the stores; the proxy sends requests to both.
    assert services["serve-1"]["environment"] == services["serve-2"]["environment"]
    assert "rag-data:/data" in services["serve-1"]["volumes"]
    nginx = (DEPLOY / "compose" / "nginx.conf").read_text()
    assert "server serve-1:8000" in nginx and "server serve-2:8000" in nginx
    # Dagster's processes load the shipped Postgres instance and the code server's gRPC address.
    assert "./celery/dagster.yaml:/opt/dagster/dagster_home/dagster.yaml:ro" in services["daemon"]["volumes"]
    workspace = load(DEPLOY / "compose" / "workspace.yaml")
    assert workspace["load_from"][0]["grpc_server"]["host"] == "code-server"


@pytest.mark.skipif(not POSTGRES, reason="set RAG_TEST_POSTGRES_URL to load the shipped instances on PostgreSQL")
@pytest.mark.parametrize("config", [CELERY_INSTANCE, K8S_INSTANCE], ids=["celery", "k8s"])
def test_each_shipped_instance_loads_whole_on_postgres(tmp_path, monkeypatch, no_cluster, config):
    """What `dagster instance info` loads: storage (tables created in a fresh database), run coordinator, launcher,
    concurrency; a dynamic partition written through it reads back."""
    from dagster import DagsterInstance
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    with scratch_postgres(POSTGRES) as url:
        for name, value in {**dagster_pg_env(url), **K8S_ENV}.items():
            monkeypatch.setenv(name, value)
        instance = DagsterInstance.from_config(str(instance_home(tmp_path, config)))
        try:
            assert isinstance(instance.run_storage, PostgresRunStorage)
            assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
            assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
            expected_launcher = "K8sRunLauncher" if config == K8S_INSTANCE else "DefaultRunLauncher"
            assert type(instance.run_launcher).__name__ == expected_launcher
            pools = instance.get_concurrency_config().pool_config
            assert (pools.pool_granularity.value, pools.default_pool_limit) == ("run", 1)
            instance.add_dynamic_partitions("chunking_strategy", ["paragraph"])
            assert instance.get_dynamic_partitions("chunking_strategy") == ["paragraph"]
            assert "PostgresRunStorage" in instance.info_str()
        finally:
            instance.dispose()


def test_the_kubernetes_replicas_share_the_runs_env_and_data_dir():
    """`rag serve` pods read what the runs write: the same ConfigMap, Secret and data volume as the run Jobs."""
    deployment, service = yaml.safe_load_all((DEPLOY / "k8s" / "serve.yaml").read_text())
    launcher = load(K8S_INSTANCE)["run_launcher"]["config"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 2 and container["command"][:2] == ["rag", "serve"]
    sources = container["envFrom"]
    assert [s["configMapRef"]["name"] for s in sources if "configMapRef" in s] == launcher["env_config_maps"]
    assert [s["secretRef"]["name"] for s in sources if "secretRef" in s] == launcher["env_secrets"]
    assert container["volumeMounts"] == launcher["volume_mounts"] and pod["volumes"] == launcher["volumes"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
