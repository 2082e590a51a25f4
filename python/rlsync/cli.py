"""`rlsync` command line: patch-series maintenance, checkout operations, and
a look at (or a disk reload of) running engines.

The Makefile's upstream/worktree/patches/overlay/check/apply/revert/pr-branch
targets call this, so `make X` and `rlsync X` behave the same.
"""

from __future__ import annotations

import argparse
import os
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
    for copy in sorted(series.VENDORED):
        print(f"overlay: {copy} regenerated")
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


def _admin_key(args: argparse.Namespace) -> str | None:
    return args.admin_key or os.environ.get("SGLANG_ADMIN_API_KEY") or None


def cmd_status(args: argparse.Namespace) -> int:
    """One line per engine: health, weight version, weight operations in
    flight. Exit 1 when any engine is unhealthy or unreachable."""
    from rlsync import client

    worst = 0
    for url in args.urls:
        code, body = client.health_detail(url, timeout=args.timeout)
        try:
            version = client.get_weight_version(url, timeout=args.timeout)
        except client.EngineError as e:
            version = f"? ({e.message})"
        in_flight = body.strip() if code == 200 and body.strip() else "-"
        state = (
            "healthy" if code == 200 else ("unreachable" if code == 0 else "unhealthy")
        )
        if code != 200:
            worst = 1
            in_flight = body.strip()[:200] or "-"
        print(f"{url}  {state} (HTTP {code})  weight_version={version}  {in_flight}")
    return worst


def cmd_sync_disk(args: argparse.Namespace) -> int:
    """Every engine reloads --path at once; one line per engine; exit 1
    when any failed."""
    import asyncio

    from rlsync.engines import SGLangEngine, VLLMEngine, sync_weights_to_engines

    engines = [
        SGLangEngine(
            u,
            timeout=args.timeout,
            admin_key=_admin_key(args),
            weight_version=args.weight_version,
        )  # fmt: skip
        for u in args.urls
    ] + [
        VLLMEngine(u, timeout=args.timeout, api_key=args.vllm_api_key)
        for u in args.vllm
    ]
    if not engines:
        print("error: name at least one engine URL (or --vllm URL)", file=sys.stderr)
        return 2
    results = asyncio.run(sync_weights_to_engines(engines, args.path))
    for r in results:
        outcome = "ok" if r.success else f"FAILED: {r.error}"
        print(f"{r.base_url}  {outcome}  ({r.seconds:.2f} s)")
    return 0 if all(r.success for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["router"]:  # its own options: `rlsync router --help`
        from rlsync import router

        return router.main(argv[1:])
    parser = argparse.ArgumentParser(prog="rlsync", description=__doc__)
    parser.add_argument("--root", help="rlsync checkout (default: found from cwd)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "router",
        help="admin router in front of several workers (see `rlsync router --help`)",
    )
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
    p = sub.add_parser(
        "status", help="health, weight version and updates in flight of engines"
    )
    p.add_argument("urls", nargs="+", metavar="URL")
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("sync-disk", help="reload a checkpoint on every engine at once")
    p.add_argument(
        "--path", required=True, help="checkpoint directory as the engines see it"
    )
    p.add_argument("urls", nargs="*", metavar="URL", help="SGLang engines")
    p.add_argument("--vllm", action="append", default=[], metavar="URL",
                   help="a vLLM engine (its /collective_rpc); repeatable")  # fmt: skip
    p.add_argument(
        "--weight-version", help="version the SGLang engines report afterwards"
    )
    p.add_argument(
        "--admin-key", help="SGLang admin key (default: $SGLANG_ADMIN_API_KEY)"
    )
    p.add_argument("--vllm-api-key", help="vLLM API key")
    p.add_argument("--timeout", type=float, default=300.0)
    p.set_defaults(fn=cmd_sync_disk)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (series.SeriesError, PinError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
