"""`rlsync` command line: patch-series maintenance and checkout operations.

The Makefile's upstream/worktree/patches/overlay/check/apply/revert/pr-branch
targets call this, so `make X` and `rlsync X` behave the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlsync import checkout, series
from rlsync.pin import PinError


def _layout(args: argparse.Namespace) -> series.Layout:
    return series.Layout(series.find_root(Path(args.root) if args.root else None))


def cmd_upstream(args: argparse.Namespace) -> int:
    path = series.ensure_upstream(_layout(args))
    print(f"pristine tree: {path / 'python'}")
    return 0


def cmd_worktree(args: argparse.Namespace) -> int:
    work = series.make_worktree(_layout(args))
    print(f"{work}: pin + series as commits (tag 'upstream' = pristine); "
          f"edit, commit, then `make patches overlay`")  # fmt: skip
    return 0


def cmd_patches(args: argparse.Namespace) -> int:
    for path in series.export_patches(_layout(args)):
        print(path.relative_to(path.parents[1]))
    return 0


def cmd_overlay(args: argparse.Namespace) -> int:
    layout = _layout(args)
    series.ensure_upstream(layout)
    files = series.regenerate_overlay(layout)
    print(f"overlay: {len(files)} files regenerated from pristine + series")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    layout = _layout(args)
    series.ensure_upstream(layout)
    problems = series.check(layout)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"ok: {len(layout.patches())} patches apply cleanly; overlay matches")
    return 0


def _checkout_cmd(fn):
    def run(args: argparse.Namespace) -> int:
        layout = _layout(args)
        extra = {"branch": args.branch} if getattr(args, "branch", None) else {}
        print(fn(Path(args.sglang_dir), layout.pin(), layout.patches(), **extra))
        return 0

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlsync", description=__doc__)
    parser.add_argument("--root", help="rlsync checkout (default: found from cwd)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "upstream", help="fetch, verify and unpack the pinned sdist"
    ).set_defaults(fn=cmd_upstream)
    sub.add_parser(
        "worktree", help="build/work: pin + series as git commits"
    ).set_defaults(fn=cmd_worktree)
    sub.add_parser("patches", help="re-export the series from build/work").set_defaults(
        fn=cmd_patches
    )
    sub.add_parser(
        "overlay", help="regenerate overlay/ from pristine + series"
    ).set_defaults(fn=cmd_overlay)
    sub.add_parser(
        "check", help="fail on any drift between series and overlay"
    ).set_defaults(fn=cmd_check)
    for name, fn, text in (
        ("apply", checkout.apply_series, "apply the series to an SGLang checkout"),
        ("revert", checkout.revert_series, "remove the series from an SGLang checkout"),
        ("pr-branch", checkout.pr_branch, "branch with one commit per patch"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("sglang_dir", metavar="SGLANG_DIR")
        if name == "pr-branch":
            p.add_argument(
                "--branch", help="branch name (default rlsync/<pin>-series<n>)"
            )
        p.set_defaults(fn=_checkout_cmd(fn))
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (series.SeriesError, PinError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
