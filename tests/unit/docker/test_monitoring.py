"""Dashboard, alert rules and the autoscaling rule: they parse as PromQL and query only
metrics the server exports (facefuse/core/metrics.py and Triton's standard set)."""

from __future__ import annotations

import json

import pytest
import yaml

from facefuse.core import metrics
from tests.unit.docker.deploy_helpers import (
    ADAPTER_VALUES,
    ALERTS,
    DASHBOARD,
    K8S,
    KNOWN_METRICS,
    TRITON_251_SCRAPED,
    TRITON_SUMMARY_METRICS,
    adapter_metric_names,
    adapter_query,
    adapter_rules,
    alert_metric_names,
    alert_rules,
    dashboard_expressions,
    dashboard_metric_names,
    missing_from_scrape,
    promql_metric_names,
    scrape_metric_names,
)

pytest.importorskip("promql_parser", reason="pip install -e '.[dev]' (promql-parser)")


def test_promql_names_come_from_a_real_parser():
    expr = (
        'sum by (m) (rate(a_total{x="1"}[5m])) / clamp_min(sum(rate(b[5m])), 1) > 2 and absent(c)'
    )
    assert promql_metric_names(expr) == {"a_total", "b", "c"}
    assert promql_metric_names('{__name__="d"}') == {"d"}
    with pytest.raises(ValueError):
        promql_metric_names("sum(rate(a[5m])")  # unbalanced
    with pytest.raises(ValueError):
        promql_metric_names("-(a[5m])")  # type error: unary minus on a range vector


def test_dashboard_loads_with_a_stable_uid_and_datasource():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "facefuse"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, panel[
                "title"
            ]
            assert panel["targets"], panel["title"]
    provisioned = yaml.safe_load(
        (DASHBOARD.parents[1] / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )
    assert provisioned["datasources"][0]["uid"] == "prometheus"


def test_dashboard_covers_what_the_issue_asks():
    expressions = dashboard_expressions()
    titles = {title.lower() for title, _ in expressions}
    for needle in (
        "request rate",
        "p50 / p95",
        "queue time",
        "unet batch",
        "cache hit",
        "tokens saved",
        "a/b variant",
    ):
        assert any(needle in t for t in titles), needle
    text = " ".join(expr for _, expr in expressions)
    assert 'quantile="0.5"' in text and 'quantile="0.95"' in text
    for name in (
        metrics.ONNX_SAMPLES,
        metrics.ONNX_FORWARDS,
        metrics.PREFIX_CACHE_HITS,
        metrics.PROMPT_TOKENS_BEFORE,
        metrics.PROMPT_TOKENS_AFTER,
        metrics.PIPELINE_REQUESTS,
    ):
        assert name in text, name


def test_dashboard_queries_only_exported_metrics():
    names = dashboard_metric_names()
    assert names, "no metric found: the walker is broken"
    assert names <= KNOWN_METRICS, names - KNOWN_METRICS


def test_alerts_parse_and_query_only_exported_metrics():
    rules = alert_rules()
    assert len(rules) >= 6
    for rule in rules:
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
    names = alert_metric_names()
    assert names <= KNOWN_METRICS, names - KNOWN_METRICS


def test_prometheusrule_holds_the_same_groups_as_the_compose_rules():
    crd = yaml.safe_load((K8S / "base" / "prometheusrule.yaml").read_text())
    assert crd["apiVersion"] == "monitoring.coreos.com/v1" and crd["kind"] == "PrometheusRule"
    assert crd["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_adapter_rules_are_queue_time_and_open_streams_and_feed_the_hpa():
    rule, streams = adapter_rules()
    query = adapter_query(rule)
    names = promql_metric_names(query)
    assert names == {"nv_inference_queue_duration_us", "nv_inference_request_success"}
    lhs, rhs = query.split("/ clamp_min(")  # queue time divided by the request count
    assert "nv_inference_queue_duration_us" in lhs and "nv_inference_request_success" in rhs
    assert adapter_metric_names() <= KNOWN_METRICS
    assert promql_metric_names(adapter_query(streams)) == {"facefuse_streams_open"}
    hpa = yaml.safe_load((K8S / "base" / "hpa.yaml").read_text())
    metric, stream_metric = hpa["spec"]["metrics"]
    assert metric["type"] == stream_metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    assert stream_metric["pods"]["metric"]["name"] == streams["name"]["as"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert '{namespace!="",pod!=""}' in rule["seriesQuery"]
    assert ADAPTER_VALUES.exists()


def test_triton_metrics_used_exist_in_a_real_251_scrape():
    used = dashboard_metric_names() | alert_metric_names() | adapter_metric_names()
    triton_used = {n for n in used if n.startswith("nv_")}
    assert triton_used <= TRITON_251_SCRAPED, triton_used - TRITON_251_SCRAPED
    assert set(TRITON_SUMMARY_METRICS) <= TRITON_251_SCRAPED
    assert set(metrics.TRITON_METRICS) <= TRITON_251_SCRAPED


def test_scrape_helper_reads_type_lines_and_samples():
    text = (
        "# HELP nv_inference_count x\n# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="unet",version="1"} 3\n'
        "# TYPE nv_inference_request_summary_us summary\n"
        'nv_inference_request_summary_us_count{model="unet"} 3\n'
        'facefuse_onnx_forwards_total{model="unet"} 2\n'
    )
    names = scrape_metric_names(text)
    assert {"nv_inference_count", "nv_inference_request_summary_us", metrics.ONNX_FORWARDS} <= names
    assert missing_from_scrape({"nv_inference_count", metrics.ONNX_SAMPLES}, text) == {
        metrics.ONNX_SAMPLES
    }
