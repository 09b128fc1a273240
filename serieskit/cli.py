"""Command line of the toolkit: what the nox sessions call.

``python -m serieskit COMMAND [ARGS]`` runs the same code as ``nox -s COMMAND``.
Each command is one function (``set_defaults(func=...)``) that only calls the
module doing the job; every session holds the work tree's lock. Every failure
is a ToolkitError: printed as ``error: ...``, exit status 1, no traceback.

What a command acts on, the pin's series or a port (``--port VERSION``), is
resolved here once into a :class:`~serieskit.series.target.Target` and passed down.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serieskit import files, git, results, status
from serieskit.build import build, overlay, recipe, sitting, wheel
from serieskit.checks import docs, figures, lint, names, runner, stated, upstream_tests
from serieskit.errors import ToolkitError
from serieskit.pr import pr
from serieskit.series import apply, base, export, resume, safety, series, target
from serieskit.series.target import Target
from serieskit.upstream import carry, rebase, rebase_check

ROOT = Path(__file__).resolve().parent.parent


def cmd_apply(args: argparse.Namespace, t: Target) -> None:
    if args.cont and args.force:
        raise ToolkitError(
            "apply takes --continue or --force, not both: --continue keeps the work tree "
            "as it is, --force starts over from the patch files"
        )
    if args.cont:
        resume.cont(t)
    else:
        apply.apply(t, force=args.force)


def cmd_export(args: argparse.Namespace, t: Target) -> None:
    if export.export(t, check=args.check, force=args.force) and args.check:
        raise ToolkitError(
            f"{t.patches_label}/ differs from the work tree: run `{t.cmd('export')}`"
        )


def cmd_status(args: argparse.Namespace, t: Target) -> None:
    status.status(t)


def cmd_rebase(args: argparse.Namespace, t: Target) -> None:
    root = t.root
    if args.check:
        if not args.target or args.cont or args.abort or args.update_pin:
            raise ToolkitError(
                "rebase --check takes one or more vllm==VERSION or a range, and nothing else"
            )
        try:
            rebase_check.next_step(rebase_check.check(root, args.target))
        except base.NoSdist as e:
            raise rebase_check.no_sdist(e, check=True) from None
        return
    if (
        args.cont + args.abort + bool(args.target) > 1
        or len(args.target) > 1
        or (not (args.cont or args.abort or args.target or args.update_pin))
    ):
        raise ToolkitError("rebase takes one of: TARGET, --continue, --abort, --update-pin")
    if args.cont:
        rebase.cont(root)
    elif args.abort:
        rebase.abort(root)
        return
    elif args.target:
        try:
            rebase.start(root, args.target[0], update_pin=args.update_pin, force=args.force)
        except base.NoSdist as e:
            raise rebase_check.no_sdist(e, check=False) from None
    else:
        rebase.update_pin(root)
    status.chores(root)  # finished (a stop raised): what the move still asks, on the pin now


def cmd_carry(args: argparse.Namespace, t: Target) -> None:
    carry.session(
        target.pin(t.root),
        target.port(t.root, args.version),
        check_only=args.check,
        record_only=args.record is not None,
        record_rev=args.record,
        cont_=args.cont,
        abort_=args.abort,
        force=args.force,
    )


def cmd_build(args: argparse.Namespace, t: Target) -> None:
    tree = args.tree or series.applied_tree(t)
    if args.full:
        build.full_build(tree)
        return
    out = args.out or t.out("build")
    build.session(
        tree,
        out,
        archs=tuple(args.arch) if args.arch else None,
        ptx=args.ptx,
        link=args.link,
        report=args.report or out / "report.json",
    )


def cmd_test(args: argparse.Namespace, t: Target) -> None:
    if args.jobs is not None and args.jobs < 1:
        raise ToolkitError(f"test --jobs takes a number of at least 1, not {args.jobs}")
    if args.what and (args.record_upstream_baseline or args.coverage):
        option = "--coverage" if args.coverage else "--record-upstream-baseline"
        raise ToolkitError(
            f"test {option} is of the whole series (the baseline, the pull requests' "
            f"coverage): run `{t.cmd('test', option)}` without {' '.join(args.what)}"
        )
    tree = series.applied_tree(t)
    jobs = args.jobs or runner.default_jobs()
    if args.record_upstream_baseline:
        upstream_tests.record_baseline(t, tree, jobs)
        return
    outcomes: list[runner.Outcome] = []
    head: str | None = None  # of a run of every series test file, over no uncommitted change
    # Before anything runs: a name that is neither a patch nor a test file is an error.
    chosen, said, patches = runner.select_tests(t, tree, args.what) if args.what else ([], [], [])
    if args.what and not args.upstream_only:
        print("\n".join(said))
        # A folder of their own: the whole run's results (test-results/*.xml
        # and the series they ran on) are what the pr session reads.
        out = t.out("test-results") / "chosen"
        outcomes = runner.run_all(tree, chosen, out, jobs=jobs, pycache=t.out("pycache"))
    elif not args.upstream_only:
        slug = args.coverage if args.coverage not in (None, "auto") else runner.machine_slug()
        rc = runner.coverage_rc(t.out("coverage") / slug) if args.coverage else None
        clean = not git.dirty_files(tree)  # what runs is HEAD's: a pass is HEAD's
        outcomes = runner.run_all(
            tree,
            series.test_files(t),
            t.out("test-results"),
            coverage=rc,
            jobs=jobs,
            pycache=t.out("pycache"),
        )
        head = runner.record_ran(t, tree)
        if rc:
            dest = t.out("pr") / "coverage" / f"{slug}.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            runner.coverage_report(tree, rc, dest, results.series_from_work_tree(t.root))
            print(f"test: coverage of the series' test files on {slug}: {dest}")
    # upstream's CPU tests of the touched files, against the base's outcomes
    wanted = args.upstream or args.upstream_only
    only = patches if args.what else None
    regressions = upstream_tests.upstream(t, tree, jobs, patches=only) if wanted else []
    if any(not o.ok for o in outcomes) or regressions:
        raise ToolkitError("test: failures above")
    if head:
        status.record_pass(t, "test", head, clean)


def cmd_docs(args: argparse.Namespace, t: Target) -> None:
    docs.session(t, check_only=args.check)
    if args.check:
        names.session(t)


def cmd_figures(args: argparse.Namespace, t: Target) -> None:
    figures.session(t.root, check_only=args.check, record=args.record_ci, timing=args.record_timing)
    if args.check:
        stated.session(t.root)


def cmd_lint(args: argparse.Namespace, t: Target) -> None:
    status.record_pass(t, "lint", lint.session(t))


def cmd_overlay(args: argparse.Namespace, t: Target) -> None:
    overlay.session(t, gpu=args.gpu)


def cmd_evidence(args: argparse.Namespace, t: Target) -> None:
    sitting.evidence(t.root, args.collect, args.held_s, args.replace, args.budget_s)


def cmd_wheel(args: argparse.Namespace, t: Target) -> None:
    wheel.session(
        t,
        tree=args.tree,
        release=args.release,
        dist=args.dist,
        module=not args.no_module,
        ptx=args.ptx,
        verify=args.verify,
    )


def cmd_pr(args: argparse.Namespace, t: Target) -> None:
    pr.session(
        t.root,
        args.onto,
        args.signoff,
        version=args.version,
        others=args.others,
        check=args.check,
        push=args.push,
        remote=args.remote,
        gh=args.gh,
        upstream=args.upstream,
        upstream_ref=args.upstream_ref,
        examples=args.examples,
    )


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is a ToolkitError like every other failure."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ToolkitError(f"{self.prog}: {message} (see --help)")


def _stop_options(
    p: argparse.ArgumentParser,
    abort_help: str | None,
    force_help: str,
    continue_help: str = "go on after resolving a conflict",
) -> None:
    """--continue / --abort / --force of the commands that can stop at a
    conflict (no --abort where ``abort_help`` is None)."""
    p.add_argument("--continue", dest="cont", action="store_true", help=continue_help)
    if abort_help is not None:
        p.add_argument("--abort", action="store_true", help=abort_help)
    p.add_argument("--force", action="store_true", help=force_help)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m serieskit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, func, help: str, port: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help)
        sp.set_defaults(func=func)
        if port:
            sp.add_argument(
                "--port",
                metavar="VERSION",
                help="act on the port to that release (pin.toml [[port]]), not the pin's series",
            )
        return sp

    a = command("apply", cmd_apply, "make .work/vllm the pinned base plus patches/", port=True)
    _stop_options(
        a,
        None,
        "go on over unexported work (kept in a stash / backup ref first)",
        continue_help="after an apply stopped at a patch and you finished it by hand in the "
        "work tree (one commit): apply the rest of the series on it",
    )
    e = command("export", cmd_export, "write the work tree's commits to patches/", port=True)
    e.add_argument(
        "--check",
        action="store_true",
        help="write nothing; fail when patches/ differs from the work tree",
    )
    e.add_argument(
        "--force",
        action="store_true",
        help="overwrite patches/ changed since the last apply (kept aside first)",
    )
    command(
        "status", cmd_status, "base, applied commits, differences, uncommitted files", port=True
    )
    r = command("rebase", cmd_rebase, "move the series onto another base")
    r.add_argument(
        "target",
        nargs="*",
        help="vllm==VERSION or REPO@REF (with --check: "
        "one or more vllm==VERSION, or a range such as 'vllm>=0.27,<=0.33')",
    )
    r.add_argument(
        "--check",
        action="store_true",
        help="dry run: per patch clean / 3-way / conflict; changes nothing",
    )
    _stop_options(
        r,
        "give up; back to before",
        "go on over unexported work (kept in a stash / backup ref first)",
    )
    r.add_argument(
        "--update-pin", action="store_true", help="move the pin (and patches/) to the new release"
    )
    c = command("carry", cmd_carry, "carry changes of the pin's series to a port")
    c.add_argument("version", metavar="VERSION", help="the port's release (pin.toml [[port]])")
    c.add_argument(
        "--check",
        action="store_true",
        help="fail when the port lacks a change of the pin's series, or its "
        f"{carry.KERNELS}/ differs from the pin's",
    )
    c.add_argument(
        "--record",
        nargs="?",
        const="",
        metavar="REV",
        help="record the pin's patches, as they are or as they were at the "
        "toolkit's commit REV, as carried (the series the port was made from)",
    )
    _stop_options(
        c,
        "give up; the port back to before",
        "go on over unexported work in the port's tree (kept first)",
    )
    bd = command("build", cmd_build, "compile the series' native code", port=True)
    bd.add_argument("--ptx", action="store_true", help="add compute_75 PTX (newer GPUs)")
    bd.add_argument("--link", action="store_true", help="link the torch module (needs torch)")
    bd.add_argument(
        "--arch", action="append", choices=recipe.native().archs, help="(build/recipe.toml)"
    )
    bd.add_argument(
        "--full", action="store_true", help="build and install the whole patched vLLM for 7.0 / 7.5"
    )
    bd.add_argument("--tree", type=Path, help="patched vLLM tree (default: .work/vllm)")
    bd.add_argument("--out", type=Path, help="build folder (default: .work/build)")
    bd.add_argument("--report", type=Path, help="JSON report (default: OUT/report.json)")
    ts = command("test", cmd_test, "run the series' test files, one process each", port=True)
    ts.add_argument(
        "what",
        nargs="*",
        metavar="PATCH-OR-FILE",
        help="only these: a patch by number (4, 0004), file name or manifest name (its "
        "manifest tests and the test files its commit adds or changes), or a test file of "
        "the work tree (tests/...py); with --upstream, upstream's tests of those patches",
    )
    which = ts.add_mutually_exclusive_group()
    which.add_argument(
        "--upstream",
        action="store_true",
        help="also upstream's tests of the files the series touches, on the series, against "
        f"the base's outcomes recorded in {upstream_tests.BASELINE} (what CI runs)",
    )
    which.add_argument(
        "--upstream-only", action="store_true", help="only those (CI's stage of its own)"
    )
    which.add_argument(
        "--record-upstream-baseline",
        action="store_true",
        help=f"run upstream's tests of the touched files on the base alone and write "
        f"patches/{upstream_tests.BASELINE} (after a rebase or a torch change)",
    )
    ts.add_argument(
        "--jobs",
        "-j",
        type=int,
        metavar="N",
        help="test files at once, one process each (default: one per core; 1 with a GPU)",
    )
    ts.add_argument(
        "--coverage",
        nargs="?",
        const="auto",
        metavar="MACHINE",
        help="under coverage.py with test contexts: data files in .work/coverage/"
        "MACHINE, report .work/pr/coverage/MACHINE.json (default name: cpu, or "
        "the GPUs, e.g. h200x2)",
    )
    d = command("docs", cmd_docs, "regenerate the runtime reference in the work tree", port=True)
    d.add_argument(
        "--check",
        action="store_true",
        help="fail with a diff when stale, and on a name in code format that the code lacks",
    )
    fg = command("figures", cmd_figures, "rewrite the figures blocks of README.md and docs/")
    fg.add_argument("--check", action="store_true", help="fail with a diff when a block is stale")
    fg.add_argument(
        "--record-ci",
        action="store_true",
        help="first copy the last complete CI run's stage durations to results/ci_timings.json",
    )
    fg.add_argument(
        "--record-timing",
        type=Path,
        metavar="DIR",
        help="first write a command timed by ci/time-command.sh DIR to results/timing_*.json",
    )
    command("lint", cmd_lint, "the tree's own pre-commit hooks on the series", port=True)
    ov = command(
        "overlay", cmd_overlay, "overlays/vllm-VERSION: the patched Python tree", port=True
    )
    ov.add_argument(
        "--gpu", action="store_true", help="also pack .dev/gpu/part1 and part2 for the GPU machine"
    )
    ev = command(
        "evidence",
        cmd_evidence,
        "the GPU machine's device calls for the single-GPU evidence (gpu/evidence.sh)",
    )
    ev.add_argument(
        "--plan", action="store_true", help="print the calls (the default): command, carry, minutes"
    )
    ev.add_argument("--budget-s", type=float, help="device seconds left: leave out what won't fit")
    ev.add_argument(
        "--collect",
        nargs="+",
        type=Path,
        metavar="FOLDER",
        help="write results/ from the files the calls returned (evidence-STEP.tgz in FOLDERs)",
    )
    ev.add_argument(
        "--held-s",
        type=float,
        help="with --collect: the seconds the device tool's lease says the machine was held",
    )
    ev.add_argument(
        "--replace",
        action="store_true",
        help="with --collect: write over the files of the same sitting collected before "
        "(else the day's first; default: a new _2, _3)",
    )
    wh = command(
        "wheel", cmd_wheel, "dist/vllm-VERSION+series...whl: an installable wheel", port=True
    )
    wh.add_argument(
        "--no-module",
        action="store_true",
        help="leave vllm._sm7x_C_stable_libtorch out (no CUDA toolkit here): "
        "the series' kernels stay off",
    )
    wh.add_argument("--ptx", action="store_true", help="add compute_75 PTX to the module")
    wh.add_argument(
        "--tree",
        type=Path,
        help="a tree assembled from `overlay --gpu` (its stamps), not .work/vllm",
    )
    wh.add_argument(
        "--release",
        type=Path,
        help="the released wheel (default: downloaded once), or the folder of its "
        "dist-info that `overlay --gpu` packs (members then from --tree)",
    )
    wh.add_argument("--dist", type=Path, help="where the wheel goes (default: dist/)")
    wh.add_argument(
        "--verify",
        action="store_true",
        help="then pip install it into a fresh virtual environment and check import vllm, "
        "vllm --version and the series' ops there (CPU)",
    )
    pr = command("pr", cmd_pr, "upstream pull requests from the series, with their evidence")
    pr.add_argument("--onto", help="vllm==VERSION: the series tree to build on (default: pin)")
    pr.add_argument(
        "--signoff",
        metavar='"NAME <MAIL>"',
        help="the contributor: author, committer and DCO Signed-off-by",
    )
    pr.add_argument("--others", type=Path, help="folder of other PRs as N.diff (+ metadata JSON)")
    pr.add_argument("--version", type=int, help="N of refs/series/pr/<name>/vN (default: next)")
    pr.add_argument("--check", action="store_true", help="fail when a pull request's check fails")
    pr.add_argument("--push", action="store_true", help="also push each branch to --remote")
    pr.add_argument("--remote", help="the fork to push to (with --push)")
    pr.add_argument(
        "--gh", action="store_true", help="with --push: gh pr create --draft --body-file for each"
    )
    pr.add_argument(
        "--upstream",
        metavar="SRC",
        help="a clone, mirror or URL of vllm-project/vllm: say whether each branch applies "
        "on its main (git am -3 in a scratch worktree)",
    )
    pr.add_argument(
        "--upstream-ref", default="HEAD", help="the ref of --upstream to check (default: HEAD)"
    )
    pr.add_argument(
        "--examples",
        action="store_true",
        help="write reports/pr/<name>/body.md and check.json, the committed examples, as the "
        "example contributor (with --check: fail where they differ, as CI does)",
    )
    return p


def port_of(argv: list[str]) -> str | None:
    """The VERSION of ``--port VERSION`` (or ``--port=VERSION``) in ``argv``,
    for the sessions that install per target before the command runs."""
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--port="):
            return arg.split("=", 1)[1]
    return None


def run(argv: list[str], root: Path = ROOT) -> int:
    try:
        args = _parser().parse_args(argv)
        with safety.session_lock(root):
            args.func(args, target.resolve(root, getattr(args, "port", None)))
    except SystemExit as e:  # --help: argparse exits, which would end nox itself
        return int(e.code or 0) if isinstance(e.code, int | None) else 1
    except ToolkitError as e:
        return _error(str(e))
    except OSError as e:  # the filesystem's: a full disk, a read-only folder, ...
        return _error(files.describe(e))
    except KeyboardInterrupt:
        return _error(INTERRUPTED, 130)
    return 0


def find_root(start: Path) -> Path | None:
    """The toolkit checkout that ``start`` is in: the nearest folder at or
    above it that holds pin.toml and patches/series."""
    for folder in [start, *start.parents]:
        if (folder / "pin.toml").is_file() and (folder / "patches" / "series").is_file():
            return folder
    return None


def main(argv: list[str], cwd: Path | None = None) -> int:
    """``python -m serieskit``: the checkout this package belongs to, from any
    folder in it (.work/vllm included); from inside another checkout it refuses
    rather than mix one's work tree with the other's patches."""
    here = (cwd or Path.cwd()).resolve()
    found = find_root(here)
    if found is not None and found != ROOT.resolve():
        return _error(
            f"{here} is in the checkout {found}, but this python -m serieskit is {ROOT}'s: "
            f"run that checkout's own from its root: cd {found} && python3 -m serieskit "
            + " ".join(argv)
        )
    return run(argv, ROOT)


# What Ctrl-C prints: every command takes up again where it was stopped.
INTERRUPTED = (
    "interrupted: run the same command again to go on (a stopped rebase or "
    "carry: its --continue or --abort); `nox -s status` shows where the work tree is"
)


def _error(text: str, rc: int = 1) -> int:
    """``error: <first line>``, further lines indented, on stderr."""
    first, *rest = text.splitlines() or ["unknown error"]
    print(f"error: {first}", file=sys.stderr)
    for line in rest:
        print(line if line.startswith("  ") else f"  {line}", file=sys.stderr)
    return rc
