"""The Grafana dashboard, the alert rules and the autoscaling rule reference only metrics that a
real tritonserver running this repository exports (checked against its /metrics scrape)."""

from __future__ import annotations

import urllib.request

import pytest
from facefuse.client import Client

from facefuse.core import metrics
from tests.unit.docker import deploy_helpers

pytestmark = pytest.mark.integration


def test_dashboard_alerts_and_adapter_use_only_exported_metrics(server, sample_images):
    source, target = sample_images
    with Client(server.grpc_url, "grpc") as client:  # counters and summaries need traffic
        client.fuse(source, target, "make her smile", steps=2)
    with urllib.request.urlopen(server.metrics_url) as response:
        scrape = response.read().decode()
    referenced = (
        deploy_helpers.dashboard_metric_names()
        | deploy_helpers.alert_metric_names()
        | deploy_helpers.adapter_metric_names()
    )
    assert referenced, "the dashboard references no metric"
    # a fallback to FP32 never happens on CPU, so its counter has no sample to scrape
    never_on_cpu = {metrics.PIPELINE_FALLBACKS}
    # the supervisor's metrics come from its own port: tests/integration/test_self_healing.py
    supervisor = set(metrics.SUPERVISOR_METRICS)
    missing = deploy_helpers.missing_from_scrape(referenced - never_on_cpu - supervisor, scrape)
    assert not missing, f"referenced but not exported: {sorted(missing)}"
