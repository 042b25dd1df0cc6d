"""deploy/ validates offline, and its three forms (compose, Kubernetes, systemd) run the same commands.

- compose.yaml: check-jsonschema against the compose-spec schema vendored in deploy/schemas/ (no
  network: `--schemafile`, not `--builtin-schema`, so the result does not depend on the installed
  check-jsonschema either).
- k8s/*.yaml: kubernetes-validate --strict against a Kubernetes version whose schemas the package ships.
- everything: yamllint with deploy/.yamllint.yaml.
- systemd units: systemd-analyze verify (binaries mapped to this machine's memq and celery).
- drift: the dispatcher, worker, beat and migrations commands are the same in all three.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.33.0"
K8S_FILES = sorted((DEPLOY / "k8s").glob("*.yaml"))
UNITS = sorted((DEPLOY / "systemd").glob("*.service")) + [DEPLOY / "systemd" / "memq.target"]


def _offline_env() -> dict:
    """Any HTTP(S) request the validators tried would go to a proxy on a closed port and fail."""
    import os

    dead = f"http://127.0.0.1:{_closed_port()}"
    return {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead,
            "NO_PROXY": "", "no_proxy": ""}


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_offline_env())


def _tool(name: str) -> str:
    exe = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(exe).exists():
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return exe


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def k8s_docs() -> list[dict]:
    docs = []
    for f in K8S_FILES:
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def k8s(kind: str, name: str) -> dict:
    return next(d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name)


def unit(name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


# --------------------------------------------------------------------------- offline validators


def test_compose_validates_against_the_vendored_schema():
    schema = DEPLOY / "schemas" / "compose-spec.json"
    res = _run(_tool("check-jsonschema"), "--schemafile", str(schema), str(DEPLOY / "compose.yaml"))
    assert res.returncode == 0, res.stdout + res.stderr
    # the vendored copy is the one recorded in deploy/schemas/README.md
    recorded = (DEPLOY / "schemas" / "README.md").read_text()
    assert hashlib.sha256(schema.read_bytes()).hexdigest() in recorded


def test_compose_schema_check_catches_mistakes(tmp_path):
    bad = compose()
    bad["services"]["worker"]["comand"] = ["memq", "worker"]  # a typo: not a service property
    f = tmp_path / "compose.yaml"
    f.write_text(yaml.safe_dump(bad))
    res = _run(_tool("check-jsonschema"), "--schemafile", str(DEPLOY / "schemas" / "compose-spec.json"), str(f))
    assert res.returncode != 0


def test_kubernetes_manifests_validate_strictly():
    res = _run(_tool("kubernetes-validate"), "--strict", "-k", K8S_VERSION, *map(str, K8S_FILES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "passed" in res.stdout and "failed" not in res.stdout.lower()


def test_kubernetes_validate_catches_mistakes(tmp_path):
    doc = k8s("Deployment", "memq-beat")
    doc["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    res = _run(_tool("kubernetes-validate"), "--strict", "-k", K8S_VERSION, str(f))
    assert res.returncode != 0


def test_yamllint():
    res = _run(_tool("yamllint"), "-s", "-c", str(DEPLOY / ".yamllint.yaml"), str(DEPLOY))
    assert res.returncode == 0, res.stdout + res.stderr


def test_systemd_units_verify(tmp_path):
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze is not installed: apt-get install -y systemd (tests/run.sh does)")
    memq, celery = _tool("memq"), _tool("celery")
    for u in UNITS:
        text = u.read_text().replace("/usr/local/bin/memq", memq).replace("/usr/local/bin/celery", celery)
        (tmp_path / u.name).write_text(text)
    res = subprocess.run([exe, "verify", "--man=no", *(str(tmp_path / u.name) for u in UNITS)],
                         capture_output=True, text=True, timeout=120, env={"SYSTEMD_LOG_LEVEL": "warning",
                                                                          "PATH": "/usr/bin:/bin"})
    problems = [line for line in res.stderr.splitlines() if str(tmp_path) in line or "memq" in line]
    assert res.returncode == 0 and not problems, res.stdout + res.stderr


# --------------------------------------------------------------------------- the same deployment


def _normal(argv: list[str]) -> list[str]:
    """Drop what legitimately differs: the program's path, a beat schedule file, a worker node name."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("-s", "-n"):
            skip = True
            continue
        out.append(Path(a).name if i == 0 else a)
    return out


def _container(kind: str, name: str) -> dict:
    return k8s(kind, name)["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("service,k8s_kind,k8s_name,unit_name", [
    ("migrate", "Job", "memq-migrate", "memq-migrate.service"),
    ("dispatcher", "Deployment", "memq-dispatcher", "memq-dispatcher.service"),
    ("worker", "Deployment", "memq-worker", "memq-worker@.service"),
    ("beat", "Deployment", "memq-beat", "memq-beat.service"),
])
def test_commands_agree(service, k8s_kind, k8s_name, unit_name):
    c = _normal(compose()["services"][service]["command"])
    assert _normal(_container(k8s_kind, k8s_name)["command"]) == c
    assert _normal(shlex.split(unit(unit_name)["ExecStart"][0])) == c


def test_exactly_one_beat_and_scalable_workers():
    svc = compose()["services"]
    assert svc["beat"]["deploy"]["replicas"] == 1
    beat = k8s("Deployment", "memq-beat")["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    hpa = k8s("HorizontalPodAutoscaler", "memq-worker")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "memq-worker" and hpa["maxReplicas"] > hpa["minReplicas"] >= 1
    assert "%i" in unit("memq-worker@.service")["ExecStart"][0]  # a template: one unit per worker


def test_redis_is_durable_and_never_evicts():
    for argv in (compose()["services"]["redis"]["command"], _container("StatefulSet", "memq-redis")["args"]):
        joined = " ".join(map(str, argv))
        assert "--appendonly yes" in joined and "--maxmemory-policy noeviction" in joined
        assert "--aclfile" in joined


def test_memq_pods_have_resources_probes_and_secret_credentials():
    docs = k8s_docs()
    assert not [d for d in docs if d["kind"] == "ConfigMap" and any("password" in str(v).lower() or "@" in str(v)
                                                                    for v in d["data"].values())]
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"]:
            res = c.get("resources", {})
            assert res.get("requests") and res.get("limits"), d["metadata"]["name"]
            if d["kind"] != "Job":
                assert c.get("livenessProbe"), d["metadata"]["name"]
            for e in c.get("env", []):
                assert "value" not in e or "PASSWORD" not in e["name"], (d["metadata"]["name"], e)
        if d["metadata"]["name"].startswith("memq-") and d["kind"] != "StatefulSet":
            secrets = [v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v]
            assert "memq-credentials" in secrets, d["metadata"]["name"]
            assert pod["securityContext"]["runAsNonRoot"] is True


def test_compose_credentials_come_from_secret_files():
    c = compose()
    env = c["x-memq-env"]
    assert env["MEMQ_REDIS_URL_FILE"].startswith("/run/secrets/")
    assert env["MEMQ_DATABASE_URL_FILE"].startswith("/run/secrets/")
    assert not any(k in env for k in ("MEMQ_REDIS_URL", "MEMQ_DATABASE_URL"))
    assert c["services"]["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"].startswith("/run/secrets/")
    for u in UNITS:
        assert "password" not in u.read_text().lower() or "LoadCredential" in u.read_text()
