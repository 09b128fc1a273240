"""Command line of the toolkit: what the nox sessions call.

``python -m serieskit COMMAND [ARGS]`` runs the same code as ``nox -s COMMAND``.
Every failure is a ToolkitError: printed as ``error: ...``, exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serieskit import build, rebase, series
from serieskit.errors import ToolkitError

ROOT = Path(__file__).resolve().parent.parent


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serieskit")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("apply", help="make .work/vllm the pinned base plus patches/")
    a.add_argument("--force", action="store_true",
                   help="go on over unexported work (stashed / saved under a ref first)")
    sub.add_parser("export", help="write the work tree's commits to patches/")
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
    sub.add_parser("test", help="run the series' test files, one process each")
    return p


def _applied_tree(root: Path) -> Path:
    tree = series.work_repo(root)
    if not (tree / ".git").exists():
        raise ToolkitError("no work tree: run `nox -s apply` first")
    return tree


def run(argv: list[str], root: Path = ROOT) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "apply":
            series.apply(root, force=args.force)
        elif args.command == "export":
            series.export(root)
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
            out = root / series.WORK / "build"
            report = build.build(tree, out, archs=tuple(args.arch or build.ALL_ARCHS),
                                 ptx=args.ptx, link=args.link)
            (out.mkdir(parents=True, exist_ok=True), (out / "report.json").write_text(report.to_json()))
        elif args.command == "test":
            print("test: the series has no test files yet (patches/manifest.toml lists none)")
    except ToolkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
