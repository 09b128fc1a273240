"""Command line of the toolkit: what the nox sessions call.

``python -m serieskit COMMAND [ARGS]`` runs the same code as ``nox -s COMMAND``.
Each command is one function (``set_defaults(func=...)``) that only calls the
module doing the job; every session holds the work tree's lock. Every failure
is a ToolkitError: printed as ``error: ...``, exit status 1, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serieskit import (
    build,
    docs,
    lint,
    overlay,
    rebase,
    rebase_check,
    runner,
    safety,
    series,
    status,
)
from serieskit.errors import ToolkitError

ROOT = Path(__file__).resolve().parent.parent


def cmd_apply(args: argparse.Namespace, root: Path) -> None:
    series.apply(root, force=args.force)


def cmd_export(args: argparse.Namespace, root: Path) -> None:
    if series.export(root, check=args.check, force=args.force) and args.check:
        raise ToolkitError("patches/ differs from the work tree: run `nox -s export`")


def cmd_status(args: argparse.Namespace, root: Path) -> None:
    status.status(root)


def cmd_rebase(args: argparse.Namespace, root: Path) -> None:
    if args.check:
        if not args.target or args.cont or args.abort or args.update_pin:
            raise ToolkitError("rebase --check takes one or more vllm==VERSION or a range, "
                               "and nothing else")
        rebase_check.check(root, args.target)
        return
    if args.cont + args.abort + bool(args.target) > 1 or len(args.target) > 1 or (
            not (args.cont or args.abort or args.target or args.update_pin)):
        raise ToolkitError("rebase takes one of: TARGET, --continue, --abort, --update-pin")
    if args.cont:
        rebase.cont(root)
    elif args.abort:
        rebase.abort(root)
    elif args.target:
        rebase.start(root, args.target[0], update_pin=args.update_pin, force=args.force)
    else:
        rebase.update_pin(root)


def cmd_build(args: argparse.Namespace, root: Path) -> None:
    tree = args.tree or series.applied_tree(root)
    if args.full:
        build.full_build(tree)
        return
    out = args.out or root / series.WORK / "build"
    build.session(tree, out, archs=tuple(args.arch or build.ALL_ARCHS), ptx=args.ptx,
                  link=args.link, report=args.report or out / "report.json")


def cmd_test(args: argparse.Namespace, root: Path) -> None:
    tree = series.applied_tree(root)
    slug = args.coverage if args.coverage not in (None, "auto") else runner.machine_slug()
    rc = runner.coverage_rc(root / series.WORK / "coverage" / slug) if args.coverage else None
    outcomes = runner.run_all(tree, series.test_files(root),
                              root / series.WORK / "test-results", coverage=rc)
    if rc:
        from serieskit import results

        dest = root / series.WORK / "pr" / "coverage" / f"{slug}.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        runner.coverage_report(tree, rc, dest, results.series_from_work_tree(root))
        print(f"test: coverage of the series' test files on {slug}: {dest}")
    regressions = runner.upstream(root, tree)  # upstream's CPU tests of the touched files
    if any(not o.ok for o in outcomes) or regressions:
        raise ToolkitError("test: failures above")


def cmd_docs(args: argparse.Namespace, root: Path) -> None:
    docs.session(root, check_only=args.check)


def cmd_lint(args: argparse.Namespace, root: Path) -> None:
    lint.session(root)


def cmd_overlay(args: argparse.Namespace, root: Path) -> None:
    overlay.session(root, gpu=args.gpu)


def cmd_pr(args: argparse.Namespace, root: Path) -> None:
    from serieskit import pr  # needs GitPython, which the `pr` session installs

    pr.session(root, args.onto, args.signoff, version=args.version, others=args.others,
               check=args.check, push=args.push, remote=args.remote, gh=args.gh)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is a ToolkitError like every other failure."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ToolkitError(f"{self.prog}: {message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m serieskit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, func, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help)
        sp.set_defaults(func=func)
        return sp

    a = command("apply", cmd_apply, "make .work/vllm the pinned base plus patches/")
    a.add_argument("--force", action="store_true",
                   help="go on over unexported work (kept in a stash / backup ref first)")
    e = command("export", cmd_export, "write the work tree's commits to patches/")
    e.add_argument("--check", action="store_true",
                   help="write nothing; fail when patches/ differs from the work tree")
    e.add_argument("--force", action="store_true",
                   help="overwrite patches/ changed since the last apply (kept aside first)")
    command("status", cmd_status, "base, applied commits, differences, uncommitted files")
    r = command("rebase", cmd_rebase, "move the series onto another base")
    r.add_argument("target", nargs="*", help="vllm==VERSION or REPO@REF (with --check: "
                   "one or more vllm==VERSION, or a range such as 'vllm>=0.27,<=0.33')")
    r.add_argument("--check", action="store_true",
                   help="dry run: per patch clean / 3-way / conflict; changes nothing")
    r.add_argument("--continue", dest="cont", action="store_true",
                   help="go on after resolving a conflict")
    r.add_argument("--abort", action="store_true", help="give up; back to before")
    r.add_argument("--update-pin", action="store_true",
                   help="move the pin (and patches/) to the new release")
    r.add_argument("--force", action="store_true",
                   help="go on over unexported work (kept in a stash / backup ref first)")
    bd = command("build", cmd_build, "compile the series' native code")
    bd.add_argument("--ptx", action="store_true", help="add compute_75 PTX (newer GPUs)")
    bd.add_argument("--link", action="store_true", help="link the torch module (needs torch)")
    bd.add_argument("--arch", action="append", choices=build.ALL_ARCHS)
    bd.add_argument("--full", action="store_true",
                    help="build and install the whole patched vLLM for 7.0 / 7.5")
    bd.add_argument("--tree", type=Path, help="patched vLLM tree (default: .work/vllm)")
    bd.add_argument("--out", type=Path, help="build folder (default: .work/build)")
    bd.add_argument("--report", type=Path, help="JSON report (default: OUT/report.json)")
    t = command("test", cmd_test, "run the series' test files, one process each")
    t.add_argument("--coverage", nargs="?", const="auto", metavar="MACHINE",
                   help="under coverage.py with test contexts: data files in .work/coverage/"
                   "MACHINE, report .work/pr/coverage/MACHINE.json (default name: cpu, or "
                   "the GPUs, e.g. h200x2)")
    d = command("docs", cmd_docs, "regenerate the runtime reference in the work tree")
    d.add_argument("--check", action="store_true", help="fail with a diff when stale")
    command("lint", cmd_lint, "the tree's own pre-commit hooks on the series")
    ov = command("overlay", cmd_overlay, "overlays/vllm-VERSION: the patched Python tree")
    ov.add_argument("--gpu", action="store_true",
                    help="also pack .dev/gpu/part1 and part2 for the GPU machine")
    pr = command("pr", cmd_pr, "upstream pull requests from the series, with their evidence")
    pr.add_argument("--onto", help="vllm==VERSION: the series tree to build on (default: pin)")
    pr.add_argument("--signoff", metavar="\"NAME <MAIL>\"",
                    help="the contributor: author, committer and DCO Signed-off-by")
    pr.add_argument("--others", type=Path, help="folder of other PRs as N.diff (+ metadata JSON)")
    pr.add_argument("--version", type=int, help="N of refs/series/pr/<name>/vN (default: next)")
    pr.add_argument("--check", action="store_true", help="fail when a pull request's check fails")
    pr.add_argument("--push", action="store_true", help="also push each branch to --remote")
    pr.add_argument("--remote", help="the fork to push to (with --push)")
    pr.add_argument("--gh", action="store_true",
                    help="with --push: gh pr create --draft --body-file for each")
    return p


def run(argv: list[str], root: Path = ROOT) -> int:
    try:
        args = _parser().parse_args(argv)
        with safety.session_lock(root):
            args.func(args, root)
    except SystemExit as e:  # --help: argparse exits, which would end nox itself
        return int(e.code or 0) if isinstance(e.code, int | None) else 1
    except ToolkitError as e:
        first, *rest = str(e).splitlines() or ["unknown error"]
        print(f"error: {first}", file=sys.stderr)
        for line in rest:
            print(line if line.startswith("  ") else f"  {line}", file=sys.stderr)
        return 1
    return 0
