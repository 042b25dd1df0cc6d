"""The `serve` service in deploy/: its three forms (compose, Kubernetes, systemd) run the same
command, reach the host's loopback only or a ClusterIP, and take the bearer token from a secret
file, which memq.config reads (MEMQ_SERVE_TOKEN_FILE). Offline; tests/ops validates the files."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from memq.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _without_host(argv: list[str]) -> list[str]:
    out = [Path(argv[0]).name]
    skip = False
    for a in argv[1:]:
        if skip:
            skip = False
            continue
        if a == "--host":
            skip = True
            continue
        out.append(a)
    return out


def _k8s() -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "36-serve.yaml").read_text()) if d]


def test_serve_runs_the_same_command_everywhere_and_takes_the_token_from_a_file():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    svc = compose["services"]["serve"]
    dep = next(d for d in _k8s() if d["kind"] == "Deployment")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    unit = (DEPLOY / "systemd" / "memq-serve.service").read_text()
    exec_start = next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart="))
    cmd = _without_host(svc["command"])
    assert cmd[:2] == ["memq", "serve"]
    assert _without_host(container["command"]) == cmd == _without_host(shlex.split(exec_start))
    # reachable from the host's loopback only (compose), a ClusterIP (k8s), 127.0.0.1 (systemd)
    assert svc["ports"] == ["127.0.0.1:8080:8080"]
    assert next(d for d in _k8s() if d["kind"] == "Service")["spec"]["type"] == "ClusterIP"
    assert "--host 127.0.0.1" in exec_start
    # the token: a secret file in all three, never a value
    assert svc["environment"]["MEMQ_SERVE_TOKEN_FILE"] == "/run/secrets/memq_serve_token"
    assert "memq_serve_token" in svc["secrets"] and "memq_serve_token" in compose["secrets"]
    assert {"name": "MEMQ_SERVE_TOKEN_FILE", "value": "/run/secrets/memq/serve_token"} in container["env"]
    assert "LoadCredential=serve_token:" in unit and "Environment=MEMQ_SERVE_TOKEN_FILE=%d/serve_token" in unit
    assert "serve_token" in (DEPLOY / "k8s" / "02-secret.example.yaml").read_text()
    assert "memq_serve_token" in (DEPLOY / "make-secrets.sh").read_text()
    assert "memq-serve.service" in (DEPLOY / "systemd" / "memq.target").read_text()


def test_serve_token_file_is_read(tmp_path):
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    env = {"MEMQ_DATA_DIR": str(tmp_path), "MEMQ_CONFIG": str(tmp_path / "none.toml")}
    assert load_settings(env | {"MEMQ_SERVE_TOKEN_FILE": str(f)}).serve_token == "s3cret"
    assert load_settings(env | {"MEMQ_SERVE_TOKEN_FILE": str(f), "MEMQ_SERVE_TOKEN": "direct"}).serve_token == "direct"
    assert load_settings(env).serve_token == ""


def test_the_serve_unit_gives_room_for_every_connection_it_allows():
    """Round 4, attack 8: 1,100 slow connections locked every client out at the file limit a systemd unit
    gets by default (1,024). The unit's LimitNOFILE must hold MEMQ_SERVE_MAX_CONNECTIONS for each of its
    --workers processes, with room for database connections and blob files."""
    unit = (DEPLOY / "systemd" / "memq-serve.service").read_text()
    nofile = int(next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("LimitNOFILE=")))
    exec_start = next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start)
    workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 1
    per_process = load_settings({"MEMQ_CONFIG": "/nonexistent.toml"}).serve_max_connections
    assert nofile >= workers * per_process + 1024, (nofile, workers, per_process)
