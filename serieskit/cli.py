"""Command line of the toolkit: what the nox sessions call.

``python -m serieskit COMMAND [ARGS]`` runs the same code as ``nox -s COMMAND``.
Every failure is a ToolkitError: printed as ``error: ...``, exit status 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from serieskit import base, build, git, docs, layering, lint, overlay, rebase, runner, series
from serieskit.errors import ToolkitError

ROOT = Path(__file__).resolve().parent.parent


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serieskit")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("apply", help="make .work/vllm the pinned base plus patches/")
    a.add_argument("--force", action="store_true",
                   help="go on over unexported work (stashed / saved under a ref first)")
    e = sub.add_parser("export", help="write the work tree's commits to patches/")
    e.add_argument("--check", action="store_true",
                   help="write nothing; fail when patches/ differs from the work tree")
    sub.add_parser("status", help="base, applied commits, differences, uncommitted files")
    r = sub.add_parser("rebase", help="move the series onto another base")
    r.add_argument("target", nargs="?", help="vllm==VERSION or REPO@REF")
    r.add_argument("--continue", dest="cont", action="store_true",
                   help="go on after resolving a conflict")
    r.add_argument("--abort", action="store_true", help="give up; back to before")
    r.add_argument("--update-pin", action="store_true",
                   help="move the pin (and patches/) to the new release")
    r.add_argument("--force", action="store_true")
    bd = sub.add_parser("build", help="compile the series' native code")
    bd.add_argument("--ptx", action="store_true", help="add compute_75 PTX (newer GPUs)")
    bd.add_argument("--link", action="store_true", help="link the torch module (needs torch)")
    bd.add_argument("--arch", action="append", choices=build.ALL_ARCHS)
    bd.add_argument("--full", action="store_true",
                    help="build and install the whole patched vLLM for 7.0 / 7.5")
    t = sub.add_parser("test", help="run the series' test files, one process each")
    t.add_argument("--gpu", action="store_true",
                   help="GPU machine: build with PTX, run every file, write results/")
    d = sub.add_parser("docs", help="regenerate the runtime reference in the work tree")
    d.add_argument("--check", action="store_true", help="fail with a diff when stale")
    sub.add_parser("lint", help="the tree's own pre-commit hooks on the series")
    ov = sub.add_parser("overlay", help="overlays/vllm-VERSION: the patched Python tree")
    ov.add_argument("--gpu", action="store_true",
                    help="also pack .dev/gpu/part1 and part2 for the GPU machine")
    return p


def _applied_tree(root: Path) -> Path:
    tree = series.work_repo(root)
    if not (tree / ".git").exists():
        raise ToolkitError("no work tree: run `nox -s apply` first")
    return tree


def _lint(root: Path) -> int:
    return lint.main(root)


def _test(root: Path, gpu: bool) -> int:
    tree = _applied_tree(root)
    tests = series.test_files(root)
    out = root / series.WORK / "test-results"
    if gpu:  # the module the GPU files load: this GPU runs it through the PTX
        report = build.build(tree, root / series.WORK / "build", archs=("75",), ptx=True,
                             link=True)
        if report.module:
            # vLLM's .gitignore ignores *.so: the work tree stays clean.
            shutil.copy2(report.module, tree / "vllm" / Path(report.module).name)
    outcomes = runner.run_all(tree, tests, out)
    regressions = [] if gpu else runner.upstream(root, tree)  # upstream's CPU tests
    if gpu:
        head = series.State.load(root).head or ""
        dest = root / "results" / f"tests-{time.strftime('%Y%m%d-%H%M%S')}.json"
        # The tree id names the tested content whatever the commit ids.
        tree_id = git.git(tree, "rev-parse", "HEAD^{tree}").strip()
        runner.write_results(dest, outcomes, head, {"series_tree": tree_id})
        print(f"test: results written to {dest.relative_to(root)}")
    if any(not o.ok for o in outcomes) or regressions:
        raise ToolkitError("test: failures above")
    return 0


def run(argv: list[str], root: Path = ROOT) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "apply":
            series.apply(root, force=args.force)
        elif args.command == "export":
            if series.export(root, check=args.check) and args.check:
                raise ToolkitError("patches/ differs from the work tree: run `nox -s export`")
        elif args.command == "status":
            series.status(root)
        elif args.command == "rebase":
            if args.cont + args.abort + bool(args.target) != 1:
                raise ToolkitError("rebase takes a TARGET, --continue or --abort")
            if args.cont:
                rebase.cont(root)
            elif args.abort:
                rebase.abort(root)
            else:
                rebase.start(root, args.target, update_pin=args.update_pin, force=args.force)
        elif args.command == "build":
            tree = _applied_tree(root)
            if args.full:
                build.full_build(tree)
                return 0
            out = root / series.WORK / "build"
            report = build.build(tree, out, archs=tuple(args.arch or build.ALL_ARCHS),
                                 ptx=args.ptx, link=args.link)
            if report.kernels:
                (out / "report.json").write_text(report.to_json())
                print(f"build: report {out / 'report.json'}")
        elif args.command == "test":
            return _test(root, args.gpu)
        elif args.command == "docs":
            tree = _applied_tree(root)
            if args.check:
                diff = docs.check(tree)
                if diff:
                    print(diff)
                    raise ToolkitError(f"{docs.OUTPUT} is stale: run `nox -s docs`")
                print(f"docs: {docs.OUTPUT} is up to date")
            elif docs.amend(tree, series.State.load(root).base or ""):
                series.export(root)
        elif args.command == "lint":
            return _lint(root)
        elif args.command == "overlay":
            tree = _applied_tree(root)
            pin = base.read_pin(root)
            module = next((root / series.WORK / "build").glob("_sm7x_C*.so"), None)
            overlay.build_overlay(tree, root / "overlays" / f"vllm-{pin.version}", module)
            if args.gpu:
                head = series.State.load(root).head or "?"
                extra = ["csrc/sm7x", *series.test_files(root)]
                overlay.pack_gpu(tree, root / ".dev" / "gpu", pin.version, head, extra)
    except ToolkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
