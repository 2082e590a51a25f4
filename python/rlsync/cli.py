"""`rlsync` command line: a look at running engines (`status`), whether this
trainer and those engines can sync weights (`doctor`), whether they hold the
same weights (`checksum`), a disk reload on all of them at once
(`sync-disk`), and the admin router (`router`).

Patch-series maintenance is developer tooling of the repository
(`make check|apply|...`), not part of this package.
"""

from __future__ import annotations

import argparse
import os
import sys

from rlsync import SERIES, SGLANG_VERSIONS, __version__


def engine_url(text: str) -> str:
    """An engine's base URL, http(s)://host:port."""
    from rlsync import client

    try:
        return client.require_scheme(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_api_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key", help="the engines' --api-key (default: $SGLANG_API_KEY)"
    )


def add_admin_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin-key", help="SGLang admin key (default: $SGLANG_ADMIN_API_KEY)"
    )


def _admin_key(args: argparse.Namespace) -> str | None:
    return args.admin_key or os.environ.get("SGLANG_ADMIN_API_KEY") or None


def _api_key(args: argparse.Namespace) -> str | None:
    return args.api_key or os.environ.get("SGLANG_API_KEY") or None


def cmd_status(args: argparse.Namespace) -> int:
    """One line per engine: health, weight version, weight operations in
    flight. Exit 1 when any engine is unhealthy or unreachable."""
    from rlsync import client

    worst = 0
    for url in args.urls:
        code, body = client.health_detail(url, timeout=args.timeout)
        try:
            version = client.get_weight_version(
                url, timeout=args.timeout, api_key=_api_key(args)
            )
        except client.EngineError as e:
            version = (
                "? (Unauthorized: give --api-key or set $SGLANG_API_KEY)"
                if e.status == 401
                else f"? ({e.message})"
            )
        in_flight = body.strip() if code == 200 and body.strip() else "-"
        state = (
            "healthy" if code == 200 else ("unreachable" if code == 0 else "unhealthy")
        )
        if code != 200:
            worst = 1
            in_flight = body.strip()[:200] or "-"
        print(f"{url}  {state} (HTTP {code})  weight_version={version}  {in_flight}")
    return worst


def cmd_doctor(args: argparse.Namespace) -> int:
    """The trainer's torch, CUDA and NCCL, what each engine runs, and per
    engine whether a sync can work; exit 1 when a check fails."""
    from rlsync.doctor import doctor

    return doctor(
        args.urls,
        backend=args.backend,
        admin_key=_admin_key(args),
        api_key=_api_key(args),
        timeout=args.timeout,
    )


def cmd_checksum(args: argparse.Namespace) -> int:
    """Every engine's weights checksum and whether they agree. Exit 1 when
    an engine gives none, or they differ. Checksums are per TP rank (shards):
    only engines of the same TP size compare."""
    from rlsync import client

    found: dict[str, tuple[str, int]] = {}
    for url in args.urls:
        try:
            body = client.weights_checksum(
                url,
                timeout=args.timeout,
                admin_key=_admin_key(args),
                api_key=_api_key(args),
            )
        except client.EngineError as e:
            print(f"{url}  FAILED: {e}")
            continue
        ranks = len(body["rank_results"])
        found[url] = (body["checksum"], ranks)
        print(
            f"{url}  {body['checksum']}  ({body['num_tensors']} tensors, "
            f"{ranks} rank{'s' if ranks != 1 else ''})"
        )
    if len(found) < len(args.urls):
        return 1
    if len({ranks for _, ranks in found.values()}) > 1:
        print("not comparable: the engines have different TP sizes")
        return 1
    if len({checksum for checksum, _ in found.values()}) > 1:
        print("DIFFER: the engines do not hold the same weights")
        return 1
    if len(found) > 1:
        print(f"same: all {len(found)} engines report the same checksum")
    return 0


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
        )
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


def build_parser() -> argparse.ArgumentParser:
    """The `rlsync` command's parser; `rlsync router` takes its own options
    (`rlsync.services.router.build_parser`)."""
    parser = argparse.ArgumentParser(prog="rlsync", description=__doc__)
    parser.add_argument(
        "--version",
        action="version",
        version=f"rlsync {__version__} (weight-update series {SERIES}; "
        f"SGLang {', '.join(SGLANG_VERSIONS)})",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "router",
        help="admin router in front of several workers (see `rlsync router --help`)",
    )
    p = sub.add_parser(
        "status", help="health, weight version and updates in flight of engines"
    )
    p.add_argument("urls", nargs="+", metavar="URL")
    p.add_argument("--timeout", type=float, default=10.0)
    add_api_key_option(p)
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser(
        "doctor",
        help="versions on both sides, and whether each engine can sync with "
        "this trainer",
    )
    p.add_argument("urls", nargs="+", metavar="URL")
    p.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        help="the trainer's WeightSender(backend=) (default: nccl where torch "
        "sees a GPU, else gloo)",
    )
    p.add_argument("--timeout", type=float, default=10.0)
    add_api_key_option(p)
    add_admin_key_option(p)
    p.set_defaults(fn=cmd_doctor)
    p = sub.add_parser(
        "checksum",
        help="every engine's weights checksum, and whether they hold the same weights",
    )
    p.add_argument("urls", nargs="+", metavar="URL")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds per engine (it serves no tokens while it hashes)",
    )
    add_api_key_option(p)
    add_admin_key_option(p)
    p.set_defaults(fn=cmd_checksum)
    p = sub.add_parser("sync-disk", help="reload a checkpoint on every engine at once")
    p.add_argument(
        "--path", required=True, help="checkpoint directory as the engines see it"
    )
    p.add_argument("urls", nargs="*", metavar="URL", help="SGLang engines")
    p.add_argument(
        "--vllm",
        action="append",
        default=[],
        metavar="URL",
        help="a vLLM engine (its /collective_rpc); repeatable",
    )
    p.add_argument(
        "--weight-version", help="version the SGLang engines report afterwards"
    )
    add_admin_key_option(p)
    p.add_argument("--vllm-api-key", help="vLLM API key")
    p.add_argument("--timeout", type=float, default=300.0)
    p.set_defaults(fn=cmd_sync_disk)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`argv` (not `router ...`) as `main` reads it: an option the command
    lacks or a URL without a scheme exits 2, naming it."""
    parser = build_parser()
    # URLs are checked after parsing: an option the command lacks is then
    # reported as such, not as a URL without a scheme (the value after it).
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    for url in [*getattr(args, "urls", []), *getattr(args, "vllm", [])]:
        try:
            engine_url(url)
        except argparse.ArgumentTypeError as e:
            parser.error(f"argument URL: {e}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["router"]:  # its own options: `rlsync router --help`
        try:
            from rlsync.services import router
        except ImportError as e:
            print(
                f"error: the router needs the [router] extra ({e}): "
                "pip install 'rlsync[router]' (from a clone: pip install "
                "'./python[router]')",
                file=sys.stderr,
            )
            return 2
        return router.main(argv[1:])
    args = parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
