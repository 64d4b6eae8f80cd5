"""The real CLIP BPE tokenizer, built offline from the vocabulary that ships with facefuse.

``bpe_simple_vocab_16e6.txt.gz`` is OpenAI CLIP's BPE merge list as shipped in the
``open-clip-torch`` wheel (MIT licence, see ``THIRD_PARTY_LICENSES.md``). From it we build the
same 49,408-token vocabulary that SD 1.x checkpoints carry as ``tokenizer/vocab.json``:
bos ``<|startoftext|>`` = 49406, eos ``<|endoftext|>`` = 49407, 77 positions.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

VOCAB_FILE = Path(__file__).with_name("bpe_simple_vocab_16e6.txt.gz")
VOCAB_SIZE = 49408
BOS_ID = 49406
EOS_ID = 49407
MAX_LENGTH = 77


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP byte-to-printable-character table."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


@functools.lru_cache(maxsize=1)
def clip_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Return CLIP's vocabulary (token -> id) and BPE merges, exactly as open_clip builds them."""
    lines = gzip.open(VOCAB_FILE).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    byte_chars = list(_bytes_to_unicode().values())
    tokens = byte_chars + [c + "</w>" for c in byte_chars] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    if len(tokens) != VOCAB_SIZE:
        raise RuntimeError(f"CLIP vocabulary has {len(tokens)} tokens, expected {VOCAB_SIZE}")
    return {tok: i for i, tok in enumerate(tokens)}, merges


def build_clip_tokenizer(pad_token: str = "<|endoftext|>"):  # noqa: S107 (a token, not a secret)
    """A transformers ``CLIPTokenizer`` with the real CLIP vocabulary (SD 1.x pads with eos)."""
    from transformers import CLIPTokenizer

    vocab, merges = clip_vocab_and_merges()
    tokenizer = CLIPTokenizer(vocab=dict(vocab), merges=list(merges), pad_token=pad_token)
    tokenizer.model_max_length = MAX_LENGTH
    return tokenizer


@functools.lru_cache(maxsize=1)
def embedded_tokenizer():
    """The embedded CLIP tokenizer, built once per process (for token counts in library code)."""
    return build_clip_tokenizer()


def load_tokenizer(model_dir: str | Path | None = None):
    """Load ``model_dir/tokenizer`` (a diffusers folder), or the embedded CLIP tokenizer if None."""
    if model_dir is None:
        return build_clip_tokenizer()
    from transformers import CLIPTokenizer

    return CLIPTokenizer.from_pretrained(str(Path(model_dir) / "tokenizer"))


def save_tokenizer_files(folder: str | Path) -> Path:
    """Write the embedded tokenizer as ``vocab.json`` + ``merges.txt`` (1.4 MB, not the 3.6 MB
    ``tokenizer.json``); ``CLIPTokenizer.from_pretrained(folder)`` loads the same ids."""
    import json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = clip_vocab_and_merges()
    (folder / "vocab.json").write_text(
        json.dumps(dict(vocab), ensure_ascii=False, separators=(",", ":")), encoding="utf-8"
    )
    lines = ["#version: 0.2", *(" ".join(pair) for pair in merges)]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>"}
    config = {**special, "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "model_max_length": MAX_LENGTH, "tokenizer_class": "CLIPTokenizer"}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return folder


def count_tokens(tokenizer, text: str) -> int:
    """Number of CLIP tokens in ``text`` without bos/eos and without truncation."""
    return len(tokenizer(text, add_special_tokens=False, truncation=False)["input_ids"])
