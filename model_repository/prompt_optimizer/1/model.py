"""prompt_optimizer: thin adapter over facefuse.prompt.optimizer."""

import json
from pathlib import Path

import numpy as np

from facefuse.core import metrics
from facefuse.core.contract import (
    INFO,
    INSTRUCTION,
    NEGATIVE_IDS,
    NEGATIVE_PROMPT,
    OVERFLOW,
    PROMPT_IDS,
)
from facefuse.core.errors import InvalidInput
from facefuse.core.limits import check_optional_text
from facefuse.prompt.optimizer import OVERFLOW_MODES, optimize
from facefuse.prompt.tokenizer import embedded_tokenizer, load_tokenizer
from facefuse.serving.triton_io import (
    TritonMetric,
    exit_with_parent,
    get_text,
    json_tensor,
    pb_utils,
    respond_each,
)


class TritonPythonModel:
    def initialize(self, args):
        exit_with_parent()
        config = json.loads(args["model_config"])
        self.name = config["name"]
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.template = params.get("prompt_template", "")
        self.compress = params.get("compress", "true").lower() != "false"
        version_dir = Path(args["model_repository"]) / args["model_version"]
        # the exported model's own tokenizer; the embedded CLIP vocabulary otherwise
        has_own = (version_dir / "tokenizer").is_dir()
        embedded = embedded_tokenizer()  # built now: the compressor counts boilerplate with it
        self.tokenizer = load_tokenizer(version_dir) if has_own else embedded
        labels = {"model": self.name}
        self.tokens_before = TritonMetric(
            metrics.PROMPT_TOKENS_BEFORE, "CLIP tokens in instructions received", **labels
        )
        self.tokens_after = TritonMetric(
            metrics.PROMPT_TOKENS_AFTER, "CLIP tokens in the optimised prompts sent on", **labels
        )

    def _handle(self, request):
        pb = pb_utils()
        instruction = get_text(request, INSTRUCTION.name)
        overflow = get_text(request, OVERFLOW.name, required=False) or "truncate"
        if overflow not in OVERFLOW_MODES:
            raise InvalidInput(OVERFLOW.name, f"must be one of {', '.join(OVERFLOW_MODES)}")
        negative = check_optional_text(
            get_text(request, NEGATIVE_PROMPT.name, required=False), NEGATIVE_PROMPT.name
        )
        result = optimize(
            instruction,
            self.tokenizer,
            overflow=overflow,
            negative_prompt=negative,
            template=self.template,
            compress_text=self.compress,
        )
        self.tokens_before.increment(result.tokens_before)
        self.tokens_after.increment(result.tokens_after)
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor(PROMPT_IDS.name, np.asarray(result.prompt_ids, dtype=np.int64)),
                pb.Tensor(NEGATIVE_IDS.name, np.asarray(result.negative_ids, dtype=np.int64)),
                json_tensor(INFO.name, result.info()),
            ]
        )

    def execute(self, requests):
        return respond_each(requests, self._handle, self.name)
