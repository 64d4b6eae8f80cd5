"""The ``facefuse`` command: one sub-command per job, each defined next to the code it drives.

Every module in ``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its
sub-commands with ``set_defaults(func=...)``; ``func(args)`` returns the exit code.
Modules are imported lazily only as far as their ``register`` needs, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from facefuse.core.errors import FacefuseError

COMMAND_MODULES = (
    "facefuse.export.commands",  # export
    "facefuse.serving.commands",  # serve
    "facefuse.serving.demo",  # demo
    "facefuse.client.commands",  # fuse, txt2img
    "facefuse.prompt.commands",  # prompt, prompt-eval
    "facefuse.bench",  # bench ...
    "facefuse.quality.commands",  # quality
    "facefuse.bench.fusion_eval_commands",  # fusion-eval
    "facefuse.bench.txt2img_eval_commands",  # txt2img-eval
    "facefuse.bench.video_eval_commands",  # video-eval
    "facefuse.face.commands",  # face-eval
    "facefuse.train.commands",  # train
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="facefuse",
        description="Stable-Diffusion face fusion served by NVIDIA Triton, fast and cheap.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency inside the module
                raise
            continue  # the sub-system is not part of this build
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except FacefuseError as exc:
        print(f"facefuse {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
