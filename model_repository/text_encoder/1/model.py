"""text_encoder: CLIP token ids -> conditioning (ONNX Runtime inside, batched).

When the prefix-KV graphs are exported next to ``model.onnx`` (``text_encoder_kv.json`` and two
graphs, see ``facefuse.export.text_encoder_kv``), rows go through
``facefuse.cache.CachedTextEncoder``: an exact prefix-KV cache whose settings are the config's
``cache_*`` parameters and whose health is exported as the ``facefuse_prefix_cache_*`` metrics.
Without them the full graph runs and CACHE_HIT_TOKENS is 0.
"""

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np

from facefuse.cache.encoder import CacheConfig, CachedTextEncoder
from facefuse.cache.health import TritonMetricsSink
from facefuse.cache.runtime import KV_MANIFEST_FILE
from facefuse.core.contract import INPUT_IDS, TEXT_ENCODER
from facefuse.core.errors import InvalidInput, ModelLoadError
from facefuse.prompt.tokenizer import VOCAB_SIZE
from facefuse.serving.triton_io import METRIC_LOCK, pb_utils
from facefuse.serving.triton_onnx import OnnxTritonModel

log = logging.getLogger("facefuse.triton")


def _tokenize(text: str) -> list[int]:
    """Ids of a text warm template without bos/eos (the real CLIP vocabulary)."""
    from facefuse.prompt.tokenizer import embedded_tokenizer

    return embedded_tokenizer()(text, add_special_tokens=False)["input_ids"]


class TritonPythonModel(OnnxTritonModel):
    INPUTS = TEXT_ENCODER.input_names
    OUTPUTS = TEXT_ENCODER.output_names

    def initialize(self, args: dict) -> None:
        super().initialize(args)
        self.cache = None
        version_dir = Path(args["model_repository"]) / args["model_version"]
        if not (version_dir / KV_MANIFEST_FILE).is_file():
            log.warning("%s: no %s, prefix cache off", self.name, KV_MANIFEST_FILE)
            return
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        try:
            cache_config = CacheConfig.from_parameters(params, tokenize=_tokenize)
        except ValueError as exc:
            raise ModelLoadError(f"{self.name}: config.pbtxt parameters: {exc}") from exc
        if "cache_intra_op_threads" not in params:
            threads = int(params.get("intra_op_threads", "0"))
            cache_config = dataclasses.replace(cache_config, intra_op_threads=threads)
        sink = TritonMetricsSink(pb_utils(), {"model": self.name}, lock=METRIC_LOCK)
        self.cache = CachedTextEncoder(version_dir, cache_config, sink)
        # the cache serves every row; the full graph's weights need not stay in memory (its
        # input signature, which requests are checked against, was read by the base class)
        self.session = None

    def _inputs(self, request):
        ids = super()._inputs(request)[INPUT_IDS.name]
        if ids.min() < 0 or ids.max() >= VOCAB_SIZE:
            raise InvalidInput(INPUT_IDS.name, f"token ids must be in 0..{VOCAB_SIZE - 1}")
        return {"input_ids": ids}

    def _forward(self, feeds):
        if self.cache is not None:
            hidden, pooled, hits = self.cache.encode(feeds["input_ids"])
            return hidden, pooled, hits.reshape(-1, 1)
        hidden, pooled = self.session.run(["last_hidden_state", "pooled"], feeds)
        return hidden, pooled, np.zeros((len(hidden), 1), dtype=np.int32)
