"""``facefuse bench report``: every measured ratio in one table (Markdown, JSON and a PNG chart).

Reads the JSON reports the other benchmarks write into ``--reports`` and lists each ratio with
its baseline, the model, the target where an issue set one, and the command that measured it:

- ``e2e-<model>.json`` (``facefuse bench e2e``): p50 vs a plain diffusers fp32 DDIM 50 pipeline
  at concurrency 1, requests/s vs the naive Triton deployment at 4 clients, UNet rows per
  execution at 4 clients;
- ``bench-unet*.json`` (``facefuse bench unet --json``): the per-call ratios of its verdict;
- ``text-encoder*.json`` (``facefuse bench text-encoder --json``): the same.

Nothing is measured here: a ratio appears only if a report holds it, and the file it came from
is named in every row.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from facefuse.core.errors import InvalidInput

# e2e ratio key -> (figure, baseline, target)
E2E_RATIOS = {
    "p50 speed-up vs baseline A, c=1": (
        "end-to-end p50 speed-up, 1 client",
        "plain diffusers fp32 DDIM 50",
        6.0,
    ),
    "requests/s vs baseline B, c=4": (
        "requests/s, 4 clients",
        "naive Triton deployment (no batching, fp32, DDIM 50)",
        4.0,
    ),
}
ROWS_TARGET = 2.0
# "[sd15 unet] ort-int8 vs ORT fp32: x1.35 (target x1.2: yes)"
VERDICT = re.compile(r"^\[(?P<model>[^\]]+)\] (?P<what>.+?) vs (?P<base>[^:]+): x(?P<ratio>[\d.]+)")


@dataclass(frozen=True)
class Ratio:
    figure: str
    value: float
    baseline: str
    model: str
    command: str
    source: str
    target: float | None = None

    @property
    def met(self) -> str:
        return "" if self.target is None else ("yes" if self.value >= self.target else "no")


def e2e_ratios(path: Path) -> list[Ratio]:
    report = json.loads(path.read_text())
    model = str(report.get("model", path.stem.removeprefix("e2e-")))
    command = f"facefuse bench e2e --model {model}"
    rows = [
        Ratio(figure, float(report["ratios"][key]), base, model, command, path.name, target)
        for key, (figure, base, target) in E2E_RATIOS.items()
        if key in report.get("ratios", {})
    ]
    per_level = report.get("results", {}).get("facefuse", {})
    level = per_level.get("4") or per_level.get(4)
    if level and "unet_rows_per_exec" in level:
        rows.append(
            Ratio(
                "UNet rows per execution, 4 clients",
                float(level["unet_rows_per_exec"]),
                "1 row per call without batching",
                model,
                command,
                path.name,
                ROWS_TARGET,
            )
        )
    return rows


def verdict_ratios(path: Path, command: str) -> list[Ratio]:
    rows = []
    for line in json.loads(path.read_text()).get("verdict", []):
        match = VERDICT.match(line)
        if match is None:
            continue
        target = re.search(r"target x([\d.]+)", line)
        rows.append(
            Ratio(
                match["what"],
                float(match["ratio"]),
                match["base"],
                match["model"],
                command,
                path.name,
                float(target[1]) if target else None,
            )
        )
    return rows


def collect(folder: Path) -> list[Ratio]:
    if not folder.is_dir():
        raise InvalidInput("--reports", f"must be a folder of benchmark reports: {folder}")
    rows: list[Ratio] = []
    for path in sorted(folder.glob("e2e-*.json")):
        rows += e2e_ratios(path)
    for path in sorted(folder.glob("bench-unet*.json")):
        rows += verdict_ratios(path, "facefuse bench unet --json")
    for path in sorted(folder.glob("text-encoder*.json")):
        rows += verdict_ratios(path, "facefuse bench text-encoder --json")
    return rows


def markdown(rows: list[Ratio]) -> str:
    lines = [
        "| figure | model | ratio | baseline | target | met | command | report |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        target = "" if r.target is None else f"{r.target:g}"
        lines.append(
            f"| {r.figure} | {r.model} | {r.value:.2f} | {r.baseline} | {target} | {r.met} | "
            f"`{r.command}` | {r.source} |"
        )
    return "\n".join(lines) + "\n"


def chart(rows: list[Ratio], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.figure} ({r.model})" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    y = range(len(rows))
    colours = ["tab:green" if r.met == "yes" else "tab:red" if r.met else "tab:blue" for r in rows]
    ax.barh(list(y), [r.value for r in rows], color=colours)
    for i, r in enumerate(rows):
        if r.target is not None:
            ax.plot([r.target, r.target], [i - 0.4, i + 0.4], color="black", linewidth=2)
        ax.text(r.value, i, f" {r.value:.2f}x", va="center", fontsize=8)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (higher is better); black tick: target; green met, red missed")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="every measured ratio in one table (Markdown + JSON + PNG)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--reports", type=Path, default=Path("reports"), help="JSON reports")
    parser.add_argument("--out", type=Path, default=Path("reports/summary"), help="output stem")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = collect(args.reports)
    if not rows:
        raise InvalidInput("--reports", f"{args.reports}: no benchmark report with ratios in it")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table = markdown(rows)
    args.out.with_suffix(".md").write_text(table)
    args.out.with_suffix(".json").write_text(
        json.dumps([{**asdict(r), "met": r.met} for r in rows], indent=2) + "\n"
    )
    chart(rows, args.out.with_suffix(".png"))
    print(table)
    print(f"wrote {args.out.with_suffix('.md')}, .json, .png")
    return 0
