"""deploy/monitoring: the alert rules pass `promtool check rules` and their unit tests, Prometheus'
config checks, and the dashboard and the rules name only metrics (and labels) the exporter exports;
compose and Kubernetes run the same exporter and ship the same rules and dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "deploy" / "monitoring"
RULES = MON / "memq-rules.yml"
DASHBOARD = MON / "grafana" / "dashboards" / "memq.json"

FUNCTIONS = {"sum", "min", "max", "avg", "count", "rate", "irate", "increase", "delta", "deriv", "absent",
             "histogram_quantile", "min_over_time", "max_over_time", "avg_over_time", "label_values", "topk",
             "bottomk", "clamp_min", "clamp_max", "time", "vector", "scalar", "abs"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
EXTRA_LABELS = {"instance", "le", "job"}  # added by Prometheus itself (job: the scrape job)


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not installed: apt-get install -y prometheus (tests/run.sh does)")
    return exe


def exported(tmp_path) -> tuple[set[str], set[str]]:
    """(sample names, label names) of a real scrape of the collector (empty SQLite history; Redis
    unreachable: families are declared whatever answers)."""
    from memq.config import load_settings
    from memq.metrics.collector import METRICS
    from memq.metrics.exporter import registry_for
    from tests.conftest import memq_environ

    env = memq_environ(f"sqlite:///{tmp_path / 'm.db'}", tmp_path) | {"MEMQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    text = generate_latest(registry_for(load_settings(env))).decode()
    names = set()
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_count", "_sum"]}
    for fam in text_string_to_metric_families(text):
        names |= {fam.name + s for s in suffixes[fam.type]}
    assert {n.removesuffix("_total") for n in names if not n.endswith(("_bucket", "_count", "_sum"))} \
        | {"memq_analysis_latency_seconds"} == set(METRICS)
    labels = {lab for _, _, labs in METRICS.values() for lab in labs}
    return names, labels


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses."""
    labels: set[str] = set()
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    for block in re.findall(r"\{([^}]*)\}", e):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", block))
    e = re.sub(r"\{[^}]*\}", " ", e)
    for grp in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", e):
        labels |= {x.strip() for x in grp.split(",") if x.strip()}
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    m = re.match(r"\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)[^,]*,\s*([a-zA-Z_]+)\s*\)", expr)
    if m:
        return {m.group(1)}, labels | {m.group(2)}
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges
    idents = set(re.findall(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)", e))
    return {i for i in idents if i not in FUNCTIONS and i not in KEYWORDS and not re.fullmatch(r"\d.*", i)}, labels


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(doc["panels"])
    for v in doc["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict) and q.get("query"):
            out.append(q["query"])
    return out


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def test_the_extractor_sees_names_and_labels():
    names, labels = promql_names('sum by (cluster, job_name) (max without (instance) '
                                 '(increase(memq_oom_snapshots_total{cluster=~"$cluster"}[1h]))) >= 3')
    assert names == {"memq_oom_snapshots_total"} and labels == {"cluster", "job_name", "instance"}
    assert promql_names("label_values(memq_runs, cluster)") == ({"memq_runs"}, {"cluster"})
    assert promql_names("up == 0 and node_load1 > 2")[0] == {"up", "node_load1"}


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_queries_name_only_exported_metrics_and_labels(source, tmp_path):
    names, labels = exported(tmp_path)
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    assert len(exprs) >= (20 if source == "dashboard" else 8)
    used_names, used_labels = set(), set()
    for e in exprs:
        n, lab = promql_names(e)
        assert n, e
        used_names |= n
        used_labels |= lab
    assert used_names <= names, used_names - names
    assert used_labels <= labels | EXTRA_LABELS, used_labels - labels - EXTRA_LABELS
    if source == "rules":
        for want in ("memq_stream_lag", "memq_dead_lettered_total", "memq_workers", "memq_oom_snapshots_total"):
            assert want in used_names


def test_alert_rules_pass_promtool(tmp_path):
    exe = _promtool()
    res = subprocess.run([exe, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr
    res = subprocess.run([exe, "test", "rules", "memq-rules.test.yml"], capture_output=True, text=True,
                         timeout=60, cwd=MON)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr
    # a broken rule is caught (the check is not a no-op)
    bad = tmp_path / "bad.yml"
    bad.write_text(RULES.read_text().replace("memq_workers) == 0", "memq_workers) == ", 1))
    assert subprocess.run([exe, "check", "rules", str(bad)], capture_output=True, timeout=60).returncode != 0


def test_prometheus_config_passes_promtool(tmp_path):
    exe = _promtool()
    shutil.copy(RULES, tmp_path / "memq-rules.yml")
    cfg = (MON / "prometheus.yml").read_text().replace("/etc/prometheus/memq-rules.yml",
                                                       str(tmp_path / "memq-rules.yml"))
    (tmp_path / "prometheus.yml").write_text(cfg)
    res = subprocess.run([exe, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_kubernetes_configmaps_are_the_files(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "deploy" / "gen_monitoring.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    docs = {}
    for f in ("34-prometheus-rules.yaml", "35-grafana-dashboard.yaml", "33-exporter.yaml"):
        for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / f).read_text()):
            docs[(d["kind"], d["metadata"]["name"])] = d
    rules = docs[("ConfigMap", "memq-prometheus-rules")]["data"]["memq-rules.yml"]
    assert yaml.safe_load(rules) == yaml.safe_load(RULES.read_text())
    (tmp_path / "r.yml").write_text(rules)
    assert subprocess.run([_promtool(), "check", "rules", str(tmp_path / "r.yml")], capture_output=True,
                          timeout=60).returncode == 0
    dash = docs[("ConfigMap", "memq-grafana-dashboard")]
    assert json.loads(dash["data"]["memq.json"]) == json.loads(DASHBOARD.read_text())
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    # compose and Kubernetes run the same exporter command
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    k8s_cmd = docs[("Deployment", "memq-exporter")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert compose["services"]["exporter"]["command"] == k8s_cmd == [
        "memq", "exporter", "--host", "0.0.0.0", "--port", "9464"]
    svc = docs[("Service", "memq-exporter")]
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == "9464"
    prom = yaml.safe_load((MON / "prometheus.yml").read_text())
    assert prom["scrape_configs"][0]["static_configs"][0]["targets"] == ["exporter:9464"]
