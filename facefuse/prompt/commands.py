"""``facefuse prompt`` and ``facefuse prompt-eval``: the prompt engine from the command line."""

from __future__ import annotations

import functools
import json
import sys

from facefuse.core.errors import InvalidInput


def register(subparsers) -> None:
    """Add the ``prompt`` and ``prompt-eval`` sub-commands."""
    p = subparsers.add_parser(
        "prompt",
        help="compress a prompt or instruction and print both CLIP token counts",
        description="Compress a prompt or facefusion instruction into a compact CLIP prompt.",
    )
    p.add_argument("text", nargs="?", default="", help="prompt or instruction text")
    p.add_argument(
        "--attributes",
        metavar="JSON",
        help='structured mode: a JSON object, e.g. \'{"identity": "Asian man", "age": 35}\'',
    )
    p.add_argument(
        "--overflow",
        choices=("truncate", "chunk"),
        default="truncate",
        help="past 75 tokens: truncate with a warning (diffusers) or 75-token chunks (A1111)",
    )
    p.add_argument("--negative", help="negative prompt (default: the face negative prompt)")
    p.add_argument(
        "--style", choices=("compact", "kv"), default="compact", help="attribute rendering style"
    )
    p.add_argument("--json", action="store_true", help="print the full INFO object as JSON")
    p.set_defaults(func=_prompt)

    e = subparsers.add_parser(
        "prompt-eval",
        help="measure token reduction, over-77 share, meaning and retention on a prompt file; "
        "with --instructions, instruction understanding per language on labelled files",
        description="Evaluate the prompt engine on a UTF-8 file with one prompt per line, or "
        "(--instructions) on JSONL files of labelled instructions "
        '({"text": ..., "lang": "en", "attributes": {...}} per line).',
    )
    e.add_argument(
        "file",
        nargs="*",
        help="UTF-8 text file, one prompt per line; with --instructions, labelled JSONL files "
        "(default: the packaged dev set and the three held-out sets)",
    )
    e.add_argument(
        "--instructions",
        action="store_true",
        help="score instruction understanding: share of attributes right and of instructions "
        "fully right, per language",
    )
    e.add_argument("--json", action="store_true", help="print the summary as JSON")
    e.add_argument(
        "--no-similarity",
        action="store_true",
        help="skip the sentence-embedding cosine (needs the 'eval' extra otherwise)",
    )
    e.add_argument(
        "--worst", type=int, default=0, metavar="N", help="also list the N least similar prompts"
    )
    e.set_defaults(func=_prompt_eval)


@functools.lru_cache(maxsize=1)
def _tokenizer():
    """The embedded CLIP tokenizer, built once per process and shared with the compressor."""
    from transformers.utils import logging as hf_logging

    from facefuse.prompt.tokenizer import embedded_tokenizer

    hf_logging.set_verbosity_error()  # counting past 77 is the point; no "indexing" warning
    return embedded_tokenizer()


def _prompt(args) -> int:
    from facefuse.prompt.optimizer import optimize

    attributes = None
    if args.attributes:
        try:
            attributes = json.loads(args.attributes)
        except json.JSONDecodeError as exc:
            raise InvalidInput("--attributes", f"must be a JSON object ({exc.msg})") from exc
    result = optimize(
        args.text,
        _tokenizer(),
        overflow=args.overflow,
        negative_prompt=args.negative,
        attributes=attributes,
        style=args.style,
    )
    if args.json:
        print(json.dumps(result.info(), ensure_ascii=False, indent=2))
        return 0
    print(result.prompt)
    print(f"negative: {result.negative_prompt}")
    saved = 1 - result.tokens_after / result.tokens_before if result.tokens_before else 0.0
    print(
        f"tokens: {result.tokens_before} -> {result.tokens_after} ({saved:.0%} fewer), "
        f"{len(result.prompt_ids)} chunk(s)"
    )
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _prompt_eval(args) -> int:
    from facefuse.prompt.evaluate import evaluate, load_prompts

    if args.instructions:
        return _instruction_eval(args)
    if len(args.file) != 1:
        raise InvalidInput("FILE", "give one prompt file (several only with --instructions)")
    prompts = load_prompts(args.file[0])
    summary, results = evaluate(prompts, _tokenizer(), similarity=not args.no_similarity)
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2))
    else:
        rows = [
            ("prompts (refused)", f"{summary.prompts} ({summary.errors})"),
            ("mean token reduction", f"{summary.mean_reduction:.1%}"),
            ("median token reduction", f"{summary.median_reduction:.1%}"),
            ("over 77 tokens before", f"{summary.over_77_before:.1%}"),
            ("over 77 tokens after", f"{summary.over_77_after:.1%}"),
            ("content-word retention mean", f"{summary.mean_retention:.2%}"),
            ("content-word retention min", f"{summary.min_retention:.2%}"),
            ("cosine similarity mean", _fmt(summary.mean_cosine)),
            ("cosine similarity min", _fmt(summary.min_cosine)),
            ("CPU ms per prompt (optimise)", f"{summary.ms_per_prompt:.3f}"),
            (
                "CLIP tokens before / after",
                f"{summary.tokens_before_total} / {summary.tokens_after_total}",
            ),
        ]
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}}  {value}")
    if args.worst and summary.mean_cosine is not None:
        for r in sorted(results, key=lambda r: r.cosine)[: args.worst]:
            print(f"{r.cosine:.3f}  {r.original}\n       -> {r.optimised}", file=sys.stderr)
    return 0


def _fmt(value: float | None) -> str:
    return "n/a (--no-similarity)" if value is None else f"{value:.3f}"


def _instruction_eval(args) -> int:
    from pathlib import Path

    from facefuse.prompt.evaluate import INSTRUCTION_SETS, load_labelled, score_instructions

    files = [Path(f) for f in args.file] or list(INSTRUCTION_SETS)
    report: dict = {}
    misses_all = []
    for path in files:
        scores, misses = score_instructions(load_labelled(path))
        report[path.name] = {lang: score.as_dict() for lang, score in scores.items()}
        misses_all += [(path.name, m) for m in misses]
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    else:
        print(f"{'set':<28}{'lang':<7}{'n':>4}  {'attributes right':<22}instructions fully right")
        for name, langs in report.items():
            for lang, s in langs.items():
                right = f"{s['attributes_right']}/{s['attributes_total']} {s['attributes']:.1%}"
                print(f"{name:<28}{lang:<7}{s['count']:>4}  {right:<22}{s['instructions']:.1%}")
    for name, miss in misses_all[: args.worst]:
        print(f"{name}: {miss.text!r} expected {miss.expected} got {miss.found}", file=sys.stderr)
    return 0
