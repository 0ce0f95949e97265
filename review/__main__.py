"""`python -m review [PREVIEW_JSON]`: `pulumi preview --json` (a file, or stdin) in, Markdown
out."""

from __future__ import annotations

import argparse
import json
import sys

from .markdown import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/review",
        description="Summarise `pulumi preview --json` for code review: per node and role what "
                    "is created, replaced, updated or deleted, the flags and env vars that change "
                    "in each container, and the order of the replacements.")
    parser.add_argument("preview", nargs="?", default="-",
                        help="the JSON `pulumi preview --json` printed (default: stdin)")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.preview == "-" else open(args.preview, encoding="utf-8").read()
    try:
        preview = json.loads(text)
    except json.JSONDecodeError as error:
        print(f"review: {args.preview} is not the JSON of `pulumi preview --json` ({error}); "
              "did the preview fail? Its first line: " + (text.splitlines() or [""])[0][:200],
              file=sys.stderr)
        return 1
    sys.stdout.write(render(preview))
    return 0


if __name__ == "__main__":
    sys.exit(main())
