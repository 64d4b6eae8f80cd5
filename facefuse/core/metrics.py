"""Names of the custom Prometheus metrics that facefuse's Triton models export.

One list, so that the Grafana dashboard, the alert rules and the tests that scrape a real
``/metrics`` endpoint agree with the models. Triton's own metrics (``nv_inference_*``) are
listed in ``TRITON_METRICS``.
"""

# text_encoder: exact prefix-KV cache
PREFIX_CACHE_REQUESTS = "facefuse_prefix_cache_requests_total"  # counter: prompts looked up
PREFIX_CACHE_HITS = "facefuse_prefix_cache_hits_total"  # counter: prompts with a cached prefix
PREFIX_CACHE_FULL_HITS = "facefuse_prefix_cache_full_hits_total"  # counter: exact repeats
PREFIX_CACHE_HIT_TOKENS = "facefuse_prefix_cache_hit_tokens_total"  # counter: tokens reused
PREFIX_CACHE_BYTES = "facefuse_prefix_cache_bytes"  # gauge: bytes held
PREFIX_CACHE_EVICTIONS = "facefuse_prefix_cache_evictions_total"  # counter
PREFIX_CACHE_REBUILDS = "facefuse_prefix_cache_rebuilds_total"  # counter
PREFIX_CACHE_HIT_RATE = "facefuse_prefix_cache_hit_rate"  # gauge: sliding-window hit rate

# prompt_optimizer
PROMPT_TOKENS_BEFORE = "facefuse_prompt_tokens_before_total"  # counter: CLIP tokens received
PROMPT_TOKENS_AFTER = "facefuse_prompt_tokens_after_total"  # counter: CLIP tokens sent on

# unet, vae_encoder, vae_decoder: real batching inside the Python model (label: model)
ONNX_FORWARDS = "facefuse_onnx_forwards_total"  # counter: ONNX forwards run
ONNX_SAMPLES = "facefuse_onnx_samples_total"  # counter: samples (rows) in those forwards
ONNX_REQUESTS = "facefuse_onnx_requests_total"  # counter: Triton requests served

# facefusion / txt2img
PIPELINE_REQUESTS = "facefuse_pipeline_requests_total"  # counter, labels: model, variant, outcome
PIPELINE_FALLBACKS = "facefuse_precision_fallbacks_total"  # counter: switches to FP32

# facefusion_stream (video and live fusion)
STREAMS_OPEN = "facefuse_streams_open"  # gauge, label: model (the autoscaling signal)
STREAM_FRAMES = "facefuse_stream_frames_total"  # counter, labels: model, outcome
STREAMS_CLOSED = "facefuse_streams_closed_total"  # counter, labels: model, reason

CUSTOM_METRICS = (
    PREFIX_CACHE_REQUESTS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_FULL_HITS,
    PREFIX_CACHE_HIT_TOKENS,
    PREFIX_CACHE_BYTES,
    PREFIX_CACHE_EVICTIONS,
    PREFIX_CACHE_REBUILDS,
    PREFIX_CACHE_HIT_RATE,
    PROMPT_TOKENS_BEFORE,
    PROMPT_TOKENS_AFTER,
    ONNX_FORWARDS,
    ONNX_SAMPLES,
    ONNX_REQUESTS,
    PIPELINE_REQUESTS,
    PIPELINE_FALLBACKS,
    STREAMS_OPEN,
    STREAM_FRAMES,
    STREAMS_CLOSED,
)

# the supervisor (facefuse.serving.supervisor), on its own port (8003) beside Triton's: the
# names are repeated there (that module imports nothing from facefuse); a test keeps them equal
SUPERVISOR_FAILURES = "facefuse_supervisor_failures_total"  # counter, labels: model, kind
SUPERVISOR_RELOADS = "facefuse_supervisor_reloads_total"  # counter, labels: model, outcome
SUPERVISOR_RECOVERY = "facefuse_supervisor_recovery_seconds"  # histogram, label: model
SUPERVISOR_MODEL_UP = "facefuse_supervisor_model_up"  # gauge, label: model
SUPERVISOR_GAVE_UP = "facefuse_supervisor_gave_up"  # gauge, label: model
SUPERVISOR_READY = "facefuse_supervisor_ready"  # gauge
SUPERVISOR_LIVE = "facefuse_supervisor_live"  # gauge

SUPERVISOR_METRICS = (
    SUPERVISOR_FAILURES,
    SUPERVISOR_RELOADS,
    SUPERVISOR_RECOVERY + "_bucket",
    SUPERVISOR_RECOVERY + "_sum",
    SUPERVISOR_RECOVERY + "_count",
    SUPERVISOR_MODEL_UP,
    SUPERVISOR_GAVE_UP,
    SUPERVISOR_READY,
    SUPERVISOR_LIVE,
)

TRITON_METRICS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_pending_request_count",
)


def sample_total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of metric ``name`` in a Prometheus text scrape whose labels include
    every ``key="value"`` of ``labels`` (0.0 when there is none)."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        series, _, value = line.rpartition(" ")
        if all(label in series for label in wanted):
            total += float(value)
    return total


def scrape(metrics_url: str, timeout_s: float = 10.0) -> str:
    """The text of a ``/metrics`` endpoint (a loopback Triton metrics port)."""
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:  # noqa: S310
        return response.read().decode()
