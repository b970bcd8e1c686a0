"""The `attn2d` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="attn2d", description="Exact, memory-efficient attention for images."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="self-attention forward+backward on maps up to 256x256: time and measured memory",
    )
    demo.add_argument("--out", default="attn2d-report", help="folder for the markdown report")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_module

        def log(line: str) -> None:
            print(line, flush=True)

        demo_module.run(out_dir=args.out, log=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
