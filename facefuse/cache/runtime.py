"""ONNX Runtime sessions of the incremental text encoder (numpy + onnxruntime only).

The two graphs and the manifest are written by ``facefuse.export.text_encoder_kv``; their
contract is described there. Missing or inconsistent files fail at load with ModelLoadError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facefuse.core.errors import ModelLoadError
from facefuse.runtime.sessions import SessionOptions, open_session

KV_PREFIX_FILE = "text_encoder_kv_prefix.onnx"
KV_SUFFIX_FILE = "text_encoder_kv_suffix.onnx"
KV_MANIFEST_FILE = "text_encoder_kv.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class KvManifest:
    """What the exporter recorded about the graphs (see ``text_encoder_kv.json``)."""

    model_id: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_length: int
    clip_skip: int
    pooled_rule: str  # "first_eos" or "argmax" (legacy configs with eos_token_id == 2)
    eos_token_id: int
    bos_token_id: int
    has_final: bool  # graphs output final_hidden (clip_skip > 0)
    prefix_path: Path
    suffix_path: Path

    @classmethod
    def load(cls, onnx_dir: str | Path) -> KvManifest:
        folder = Path(onnx_dir)
        path = folder / KV_MANIFEST_FILE
        if not path.is_file():
            raise ModelLoadError(
                f"{path} is missing: run the text-encoder KV export "
                "(facefuse.export.text_encoder_kv.export_kv_encoder)"
            )
        try:
            data = json.loads(path.read_text())
            if data.get("format") != MANIFEST_FORMAT:
                raise ModelLoadError(
                    f"{path}: format {data.get('format')}, expected {MANIFEST_FORMAT}"
                )
            files = {}
            for part in ("prefix", "suffix"):
                entry = data["files"][part]
                file = folder / entry["name"]
                if not file.is_file() or file.stat().st_size != int(entry["bytes"]):
                    raise ModelLoadError(
                        f"{file}: missing or not the file the manifest describes "
                        f"({entry['bytes']} bytes); re-run the export"
                    )
                files[part] = file
            if data["pooled_rule"] not in ("first_eos", "argmax"):
                raise ModelLoadError(f"{path}: unknown pooled_rule {data['pooled_rule']!r}")
            return cls(
                model_id=str(data["model_id"]),
                num_layers=int(data["num_layers"]),
                hidden_size=int(data["hidden_size"]),
                vocab_size=int(data["vocab_size"]),
                max_length=int(data["max_length"]),
                clip_skip=int(data["clip_skip"]),
                pooled_rule=str(data["pooled_rule"]),
                eos_token_id=int(data["eos_token_id"]),
                bos_token_id=int(data["bos_token_id"]),
                has_final="final_hidden" in data["outputs"],
                prefix_path=files["prefix"],
                suffix_path=files["suffix"],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{path}: unreadable manifest ({exc!r})") from exc


@dataclass(frozen=True)
class StepOutput:
    """Outputs for the positions a graph computed (S of them)."""

    kv: np.ndarray  # [B, L, 2, S, D]
    hidden: np.ndarray  # [B, S, D]
    final: np.ndarray  # [B, S, D] (the same array as hidden when clip_skip == 0)


class KvRuntime:
    """The prefix graph (positions 0..P-1) and the suffix graph (P..P+S-1 given past K/V)."""

    def __init__(self, onnx_dir: str | Path, intra_op_threads: int = 0):
        """A missing or corrupt graph is a ModelLoadError naming its file (``open_session``)."""
        self.manifest = KvManifest.load(onnx_dir)
        options = SessionOptions(intra_op_threads=intra_op_threads)
        self._prefix = open_session(self.manifest.prefix_path, options)
        self._suffix = open_session(self.manifest.suffix_path, options)

    def _wrap(self, outputs) -> StepOutput:
        final = outputs[2] if self.manifest.has_final else outputs[1]
        return StepOutput(outputs[0], outputs[1], final)

    def prefix(self, input_ids: np.ndarray) -> StepOutput:
        """Causal forward of ``input_ids`` [B, P] from position 0."""
        return self._wrap(self._prefix.run(None, {"input_ids": input_ids}))

    def suffix(self, input_ids: np.ndarray, past_kv: np.ndarray) -> StepOutput:
        """Positions ``P..P+S-1`` (``input_ids`` [B, S]) given ``past_kv`` [B, L, 2, P, D]."""
        return self._wrap(self._suffix.run(None, {"input_ids": input_ids, "past_kv": past_kv}))
