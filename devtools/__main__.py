"""Series maintenance and checkout operations, as `make` calls them.

`make [PIN=<version>] upstream|worktree|patches|overlay|check|apply|revert|
pr-branch` run `python -m devtools [--pin <version>] <the same verb>` from the
repository root. Without a pin, `check` checks every pin and apply, revert
and pr-branch take the series that serves the tree's SGLang version
(pins/releases). `make wheel|port|port-export RELEASE=<version>` run
`python -m devtools --release <version> <verb>`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from devtools import (
    checkout,
    matrix,
    patch_names,
    ports,
    pr_files,
    pr_series,
    releases,
    restamp,
    rewrite,
    rewrites,
    seams,
    series,
    smoke,
    wheel,
)
from devtools.pin import PinError


def _root(args: argparse.Namespace) -> Path:
    return series.find_root(Path(args.root) if args.root else None)


def _layout(args: argparse.Namespace) -> series.Layout:
    """The pin asked for; with --release, the release (and the pin that
    serves it, from pins/releases)."""
    root = _root(args)
    if not args.release:
        return series.Layout(root, args.pin or "")
    found = releases.read_releases(root).get(args.release)
    if found is None or found.how not in releases.SERVED:
        raise series.SeriesError(
            f"release {args.release}: {releases.RELEASES_FILE} does not map it "
            f"as-is or adjusted to a pin (the series serve "
            f"{', '.join(releases.supported(root))})"
        )
    return series.Layout(root, found.series, args.release)


def _layouts(args: argparse.Namespace) -> list[series.Layout]:
    """The pin asked for (with --release, the pin that serves it), or every
    pin."""
    if args.pin or args.release:
        layout = _layout(args)
        return [series.Layout(layout.root, layout.version)]
    root = _root(args)
    return [series.Layout(root, v) for v in series.pin_versions(root)]


def _layout_for_tree(args: argparse.Namespace, tree: Path) -> series.Layout:
    """The series that serves the tree's SGLang version (pins/releases);
    with --pin, that pin's (for another release it serves: with its ports)."""
    root = _root(args)
    versions = series.pin_versions(root)
    try:
        found = (checkout.detect_version(tree) or "").split("+")[0]
    except checkout.CheckoutError as e:
        served = releases.supported(root)
        raise checkout.CheckoutError(
            f"{e}; the series serve SGLang {served[0]} to {served[-1]} "
            f"({releases.RELEASES_FILE})"
        ) from e
    if args.pin:
        release = releases.read_releases(root).get(found)
        served = release is not None and release.how in releases.SERVED
        if served and release.series == args.pin:
            return series.Layout(root, args.pin, found)
        return _layout(args)  # check_tree names what the pin serves
    if found in versions:
        return series.Layout(root, found)
    release = releases.read_releases(root).get(found)
    if release is not None and release.series is not None:
        return series.Layout(root, release.series, found)
    if release is not None:
        raise checkout.CheckoutError(
            f"{tree}: SGLang {found} found, which no series serves yet "
            f"({release.note}; {releases.RELEASES_FILE}); the series serve "
            f"{', '.join(releases.supported(root))}"
        )
    # Raises, naming what the tree has and the releases a series serves.
    checkout.check_tree(tree, series.Layout(root).pin(), releases.supported(root))
    raise AssertionError("unreachable")


def cmd_upstream(args: argparse.Namespace) -> int:
    path = series.ensure_upstream(_layout(args))
    print(f"pristine tree: {path / 'python'}")
    return 0


def cmd_worktree(args: argparse.Namespace) -> int:
    work = series.make_worktree(_layout(args))
    print(
        f"{work}: pin + series as commits (tag 'upstream' = pristine); "
        "edit, commit, then `make patches overlay`"
    )
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
    failed = False
    # The release map's checks (ports, the table of releases); a scratch copy of
    # one pin has no map.
    mapped = (_root(args) / releases.RELEASES_FILE).is_file()
    for layout in _layouts(args):
        series.ensure_upstream(layout)
        problems = series.check(layout)
        problems += rewrites.check_rewrites(layout)
        problems += seams.check_series(layout)
        if mapped:
            problems += ports.check_ports(layout)
        for problem in problems:
            print(f"error: {layout.version}: {problem}", file=sys.stderr)
        failed = failed or bool(problems)
        if not problems:
            print(
                f"ok: {layout.version}: {len(layout.patches())} patches apply "
                "cleanly; overlay and common modules match"
            )
    root = _root(args)
    every_series = {
        v: series.read_series(series.Layout(root, v).patches_dir)
        for v in series.pin_versions(root)
    }
    map_problems = patch_names.check_names_across_pins(every_series)
    pr_commits = {}
    for version in every_series:
        commits, problems = pr_series.check(series.Layout(root, version))
        map_problems += [f"{version}: pull-request series: {p}" for p in problems]
        pr_commits[version] = [(c.name, c.message) for c in commits]
    map_problems += pr_files.check_pr_files(root, pr_commits)
    map_problems += pr_series.check_pull_descriptions(root)
    if mapped:
        map_problems += releases.check_map(root, list(every_series))
        map_problems += matrix.check_table(root)
    for problem in map_problems:
        print(f"error: {problem}", file=sys.stderr)
        failed = True
    if args.release and _layout(args).release:
        failed = _report_release(_layout(args)) or failed
    return 1 if failed else 0


def _report_release(layout: series.Layout) -> bool:
    """Apply a served release's series to its own wheel; True if it failed."""
    problems = ports.check_release(layout)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(
            f"ok: {layout.release}: {len(layout.patches())} patches apply to its "
            "wheel; every file they write compiles, binds every global it uses "
            "and its sglang imports resolve"
        )
    return bool(problems)


def cmd_check_releases(args: argparse.Namespace) -> int:
    """The drift check of every release a series serves (fetches each one's
    wheel): what tests/test_releases.py runs, from the command line."""
    root = _root(args)
    failed = False
    for release in releases.read_releases(root).values():
        if release.how in releases.SERVED:
            layout = series.Layout(root, release.series, release.version)
            failed = _report_release(layout) or failed
    return 1 if failed else 0


def cmd_support_matrix(args: argparse.Namespace) -> int:
    changed = matrix.write_table(_root(args))
    print(
        f"{matrix.TABLE_FILE}: table of releases {'written' if changed else 'unchanged'}"
    )
    return 0


def cmd_smoke_tree(args: argparse.Namespace) -> int:
    layout = _layout(args)
    if not layout.release:
        raise series.SeriesError("a smoke is run for a release: RELEASE=<version>")
    print(smoke.smoke_tree(layout))
    return 0


def cmd_smoke_pins(args: argparse.Namespace) -> int:
    layout = _layout(args)
    if not layout.release:
        raise series.SeriesError("a smoke is run for a release: RELEASE=<version>")
    if args.needed_in:
        print(" ".join(smoke.requirements_of_own_pins(Path(args.needed_in))))
    else:
        print(" ".join(smoke.release_pins(layout)))
    return 0


def cmd_smoke_record(args: argparse.Namespace) -> int:
    layout = _layout(args)
    done = smoke.record(layout, Path(args.junit), args.environment)
    matrix.write_table(layout.root)
    print(
        f"{smoke.SMOKES_FILE}: {done.release} {done.result} {done.counts} {done.note}"
    )
    return 0 if done.result == "pass" else 1


def cmd_wheel(args: argparse.Namespace) -> int:
    layout = _layout(args)
    if not layout.pin().wheel:
        print(
            f"error: pin {layout.version} is made from an sdist; its wheel is "
            "built by setup.py (`make wheel`)",
            file=sys.stderr,
        )
        return 1
    series.ensure_upstream(layout)
    print(wheel.build_forked_wheel(layout, Path(args.dist)))
    return 0


def cmd_port(args: argparse.Namespace) -> int:
    if (
        args.release
        and not args.pin
        and args.release in series.pin_versions(_root(args))
    ):
        raise series.SeriesError(
            f"{args.release} is a pin: its series is made against it "
            f"(`make worktree PIN={args.release}`)"
        )
    layout = _layout(args)
    start = None
    if args.start_from:
        found = releases.read_releases(_root(args)).get(args.start_from)
        if found is None or found.how not in releases.SERVED:
            raise series.SeriesError(
                f"FROM={args.start_from}: {releases.RELEASES_FILE} does not map it "
                f"as served (as-is or adjusted)"
            )
        start = series.Layout(_root(args), found.series, args.start_from)
    work, stopped = ports.make_port_worktree(layout, start)
    if stopped:
        print(
            f"{work}: stopped at {stopped} (conflict): resolve it there, `git am "
            f"--continue` (until the series is in), then `make port-export "
            f"RELEASE={layout.release}`",
            file=sys.stderr,
        )
        return 1
    print(
        f"{work}: {layout.release} + its series as commits; edit, commit, then "
        f"`make port-export RELEASE={layout.release}`"
    )
    return 0


def cmd_port_export(args: argparse.Namespace) -> int:
    layout = _layout(args)
    written = ports.export_port(layout)
    for path in written:
        print(path.relative_to(layout.root))
    if not written:
        print(f"{layout.release}: the pin's series applies as it is; no port kept")
    return 0


def cmd_rewrite_series(args: argparse.Namespace) -> int:
    script = Path(args.script).resolve()
    if not script.is_file():
        raise series.SeriesError(f"SCRIPT={args.script}: no such file")
    root = _root(args)
    pins = [series.Layout(root, v) for v in series.pin_versions(root)]
    served = [
        series.Layout(root, pin.version, release)
        for pin in pins
        for release in releases.adjusted(root, pin.version)
    ]
    # Every worktree from the series as committed, before anything changes.
    for layout in pins:
        series.make_worktree(layout)
    for layout in served:
        work, stopped = ports.make_port_worktree(layout)
        if stopped:
            raise series.SeriesError(
                f"{work}: the committed port stops at {stopped}; make it first"
            )
    for layout in pins + served:
        changed = rewrite.rewrite_worktree(layout.work_dir, script)
        print(
            f"{layout.work_dir.relative_to(root)}: "
            f"{', '.join(changed) if changed else 'no commit'} changed"
        )
    for layout in pins:
        series.export_patches(layout)
        series.regenerate_overlay(layout)
    for layout in served:
        ports.export_port(layout)
    print("exported every pin's patches and overlay, then every port")
    return 0


def cmd_rewrites(args: argparse.Namespace) -> int:
    for layout in _layouts(args):
        path = layout.pin_dir / rewrites.REWRITES_FILE
        found = rewrites.rewrites(layout)
        path.write_text(rewrites.rewrites_text(found))
        print(
            f"{path.relative_to(layout.root)}: {len(found)} rewrites, "
            f"{sum(found.values())} lines"
        )
    return 0


def cmd_port_restamp(args: argparse.Namespace) -> int:
    failed = False
    for layout in _layouts(args):
        done = restamp.restamp(layout, args.since)
        for path in done.written:
            print(path.relative_to(layout.root))
        for path in done.removed:
            print(f"removed {path.relative_to(layout.root)}")
        for stale in done.left_stale:
            failed = True
            print(
                f"error: {layout.version}: {stale}; make it again: `make port "
                f"RELEASE={stale.split('/')[0]}`",
                file=sys.stderr,
            )
        if not done.written and not done.left_stale:
            print(f"{layout.version}: every port is made from its pin patch as it is")
    return 1 if failed else 0


def cmd_new_releases(args: argparse.Namespace) -> int:
    """Releases on the package index, from the oldest pin on, that
    pins/releases does not list: each needs a decision (a series as it is,
    adjustments, or a new pin)."""
    root = _root(args)
    known = releases.read_releases(root)
    oldest = series.version_key(series.pin_versions(root)[0])
    new = [
        v
        for v in releases.index_versions()
        if series.version_key(v) >= oldest and v not in known
    ]
    for version in sorted(new, key=series.version_key):
        print(f"{version}: not in {releases.RELEASES_FILE}")
    if not new:
        print(f"every release on the index is in {releases.RELEASES_FILE}")
    return 0


def _checkout_cmd(fn):
    def run(args: argparse.Namespace) -> int:
        layout = _layout_for_tree(args, Path(args.sglang_dir))
        extra = {"generated": checkout._generated_files(layout)}
        for name in ("branch", "author"):
            if getattr(args, name, None) is not None:
                extra[name] = getattr(args, name)
        if fn is not checkout.pr_branch:
            print(fn(Path(args.sglang_dir), layout.pin(), layout.patches(), **extra))
            return 0
        # The pull request is the series cut into commits none of which
        # rewrites another's (pr/series); the fork's generated module stays out.
        with tempfile.TemporaryDirectory() as tmp:
            commits = pr_series.cut(layout)
            patches = pr_series.write_patches(layout, commits, Path(tmp))
            extra["generated"] = {}
            extra["extras"] = pr_files.pr_files_of(layout.root, patches)
            plan = pr_series.read_plan(layout.root)
            extra["stack"] = pr_series.stacked_pulls(plan, commits)
            print(fn(Path(args.sglang_dir), layout.pin(), patches, **extra))
        return 0

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devtools", description=__doc__)
    parser.add_argument("--root", help="rlsync repository (default: found from cwd)")
    parser.add_argument(
        "--pin",
        metavar="VERSION",
        help="the pin (pins/<VERSION>) to work on (default: the oldest; check: "
        "every pin; apply, revert, pr-branch: the tree's version)",
    )
    parser.add_argument(
        "--release",
        metavar="VERSION",
        help="another release a pin's series serves (pins/releases): wheel, "
        "port and port-export work on it",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, text in (
        ("upstream", cmd_upstream, "fetch, verify and unpack the pinned archive"),
        ("worktree", cmd_worktree, "build/<pin>/work: pin + series as commits"),
        ("patches", cmd_patches, "re-export the series from the worktree"),
        ("overlay", cmd_overlay, "regenerate overlay/ from pristine + series"),
        ("check", cmd_check, "fail on any drift between series and overlay"),
        ("new-releases", cmd_new_releases, "releases on the index not mapped yet"),
        ("port-export", cmd_port_export, "write a release's port from its worktree"),
        ("check-releases", cmd_check_releases, "apply each served release's series"),
        ("smoke-tree", cmd_smoke_tree, "build/<release>/smoke: a release + its series"),
        ("support-matrix", cmd_support_matrix, "regenerate the table of releases"),
        ("rewrites", cmd_rewrites, "list the patches that rewrite earlier ones"),
    ):
        sub.add_parser(name, help=text).set_defaults(fn=fn)
    p = sub.add_parser("smoke-pins", help="the release's own pins its smoke installs")
    p.add_argument(
        "--needed-in",
        metavar="TREE",
        help="instead: what the pins installed in TREE require of the other "
        "such packages that TREE lacks",
    )
    p.set_defaults(fn=cmd_smoke_pins)
    p = sub.add_parser(
        "port", help="build/<release>/work: a release + its series (git am -3)"
    )
    p.add_argument(
        "--from",
        dest="start_from",
        metavar="RELEASE",
        help="take the ports of this nearer release the same pin serves where "
        "the release has none (its `make port` worktree gives the merge bases)",
    )
    p.set_defaults(fn=cmd_port)
    p = sub.add_parser(
        "port-restamp",
        help="carry pin patches' new names and messages into their ports",
    )
    p.add_argument(
        "--since",
        default="HEAD",
        metavar="REV",
        help="the revision whose series the ports were made from (default HEAD)",
    )
    p.set_defaults(fn=cmd_port_restamp)
    p = sub.add_parser(
        "rewrite-series",
        help="carry a scripted code change through every commit of every pin "
        "and port",
    )
    p.add_argument("script", help="python SCRIPT TREE edits TREE idempotently")
    p.set_defaults(fn=cmd_rewrite_series)
    p = sub.add_parser("smoke-record", help="keep a release's smoke result")
    p.add_argument("--junit", required=True, help="pytest's JUnit XML of the smoke")
    p.add_argument("--environment", required=True, help="where it ran, in words")
    p.set_defaults(fn=cmd_smoke_record)
    p = sub.add_parser("wheel", help="the forked wheel of a wheel-only pin")
    p.add_argument("--dist", default="dist", help="output folder (default dist)")
    p.set_defaults(fn=cmd_wheel)
    for name, fn, text in (
        ("apply", checkout.apply_series, "apply the series to an SGLang tree"),
        ("revert", checkout.revert_series, "remove the series from an SGLang tree"),
        ("pr-branch", checkout.pr_branch, "branch with one commit per patch"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "sglang_dir",
            metavar="SGLANG_DIR",
            help="an SGLang checkout, unpacked sdist, site-packages directory "
            "or the sglang package directory",
        )
        if name == "pr-branch":
            p.add_argument(
                "--branch", help="branch name (default rlsync/<pin>-series<n>)"
            )
            p.add_argument(
                "--author",
                metavar='"NAME <MAIL>"',
                help="author and Signed-off-by of each commit (default: the "
                "checkout's git config user.name and user.email)",
            )
        p.set_defaults(fn=_checkout_cmd(fn))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (series.SeriesError, PinError, checkout.CheckoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # e.g. a tree or a cache this user cannot read
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
