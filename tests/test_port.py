"""A port of the series beside the pin: pin.toml [[port]], --port sessions, carry."""

from __future__ import annotations

import shutil

import pytest

from conftest import BASE_FILES, add_release, base_commit, quiet
from serieskit import cli, git, status
from serieskit.build import build, overlay, recipe
from serieskit.checks import runner
from serieskit.errors import ToolkitError
from serieskit.pr import branches
from serieskit.series import apply, base, export, safety, series, target
from serieskit.state import State
from serieskit.upstream import carry, carry_record

PORT = "0.0.2"
# The port's release: lines moved (a header) and a line beside the series' change.
PORT_FILES = {
    **BASE_FILES,
    "setup.py": "print('setup 2')\n",
    "vllm/utils.py": "# 0.0.2\n"
    + BASE_FILES["vllm/utils.py"].replace("return 1\n", "return 1  # 0.0.2\n", 1),
}
F0 = "vllm/utils.py"


def commit_named(repo, files: dict[str, str], subject: str, name: str) -> None:
    """One commit of the series as a contributor makes it: with its Patch-Name."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
        git.git(repo, "add", path)
    env = {
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_AUTHOR_DATE": "1700000000 +0100",
    }
    git.git(
        repo,
        "commit",
        "-q",
        "-m",
        subject,
        "-m",
        "Why: the test says so.",
        "-m",
        f"Patch-Name: {name}",
        env=env,
    )


def write_series(t, patches) -> None:
    """Make ``t``'s patch folder hold ``patches``: (name, subject, edit of the
    base's files) each, through apply + commit + export."""
    for f in t.patches.glob("*.patch"):
        f.unlink()
    (t.patches / "series").write_text("")
    shutil.rmtree(t.work, ignore_errors=True)
    t.state_file.unlink(missing_ok=True)
    apply.apply(t, log=quiet)
    for name, subject, edit in patches:
        commit_named(
            t.work,
            {
                p: edit(p, (t.work / p).read_text() if (t.work / p).exists() else "")
                for p in edit.paths
            },
            subject,
            name,
        )
    export.export(t, log=quiet)


class Edit:
    """A change of some files, given as a function of the file's text."""

    def __init__(self, **changes):
        self.changes = {k.replace("__", "/").replace("_DOT_", "."): v for k, v in changes.items()}
        self.paths = list(self.changes)

    def __call__(self, path, text):
        change = self.changes[path]
        return change(text) if callable(change) else change


def f0(value):
    return Edit(vllm__utils_DOT_py=lambda text: text.replace("return 0\n", f"return {value}\n"))


def pin_patches(f0_edit=None, kernel="kernel v1\n", extra=()):
    return [
        ("f0", "[Kernel] Change f0", f0_edit or f0(100)),
        ("kern", "[Kernel] Add a kernel", Edit(csrc__sm7x__k_DOT_cu=kernel)),
        *extra,
    ]


def make_port(root, cache, files: dict[str, str] = PORT_FILES):
    """The pin (0.0.1) with two patches, and its port to 0.0.2 (a release of
    ``files``) made from them and recorded as carried. Returns (pin, port)."""
    git.git(root, "init", "-q")  # carry finds old patch texts in the toolkit's git objects
    sha = add_release(cache, PORT, files)
    commit = base_commit(cache / f"vllm-{PORT}.tar.gz", PORT, sha)
    (root / "ports" / PORT).mkdir(parents=True)
    (root / "ports" / PORT / "series").write_text("")
    base.add_port(root, base.Port(PORT, sha, commit, f"ports/{PORT}"))
    pin, port = target.pin(root), target.port(root, PORT)
    write_series(pin, pin_patches())
    write_series(port, pin_patches())
    carry_record.record(pin, port, log=quiet)
    return pin, port


@pytest.fixture
def pinport(root, cache):
    """make_port on the root fixture."""
    return make_port(root, cache)


# --- pin.toml [[port]] -------------------------------------------------------------


def test_ports_are_read_and_the_pin_rewrite_keeps_them(pinport):
    pin, port = pinport
    ports = base.read_ports(pin.root)
    assert [(p.version, p.patches) for p in ports] == [(PORT, f"ports/{PORT}")]
    base.write_pin(pin.root, base.read_pin(pin.root))  # as rebase --update-pin does
    assert base.read_ports(pin.root) == ports
    assert port.work == pin.root / ".work" / f"vllm-{PORT}"
    assert port.state_file == pin.root / ".work" / f"state-{PORT}.json"
    assert port.cmd("apply") == f"nox -s apply -- --port {PORT}"


@pytest.mark.parametrize(
    "table, message",
    [
        (
            'version = "0.0.2"\nsha256 = "x"\ncommit = ""\npatches = "ports/a"\n',
            "port 1.sha256 must be 64 hex digits",
        ),
        (
            f'version = "0.0.1"\nsha256 = "{"a" * 64}"\npatches = "ports/a"\n',
            "port 0.0.1 is the pin's own release",
        ),
        (
            f'version = "0.0.2"\nsha256 = "{"a" * 64}"\npatches = "../elsewhere"\n',
            "port 0.0.2.patches must be a folder inside the toolkit",
        ),
        (
            f'version = "0.0.2"\nsha256 = "{"a" * 64}"\npatches = "patches"\n',
            "port 0.0.2.patches must be a folder inside the toolkit",
        ),
        (
            f'version = "0.0.2"\nsha256 = "{"a" * 64}"\npatches = "ports/a"\nsha = "b"\n',
            "port 1 has unknown key\\(s\\) sha",
        ),
        (
            f'version = "0.0.2"\nsha256 = "{"a" * 64}"\npatches = "ports/a"\ntorch = 2\n',
            "port 0.0.2.torch must be a torch release",
        ),
    ],
)
def test_a_bad_port_table_is_one_clear_error(root, table, message):
    (root / "pin.toml").write_text((root / "pin.toml").read_text() + "[[port]]\n" + table)
    with pytest.raises(ToolkitError, match=message):
        base.read_ports(root)


def test_two_tables_for_one_release_and_unknown_ports_are_errors(root):
    table = f'[[port]]\nversion = "0.0.2"\nsha256 = "{"a" * 64}"\npatches = "ports/a"\n'
    (root / "pin.toml").write_text((root / "pin.toml").read_text() + table)
    with pytest.raises(ToolkitError, match="patch folder ports/a .* does not exist"):
        target.port(root, "0.0.2")
    with pytest.raises(ToolkitError, match=r"lists no port to vLLM 9.9.9 \(ports: 0.0.2\)"):
        target.port(root, "9.9.9")
    (root / "pin.toml").write_text((root / "pin.toml").read_text() + table)
    with pytest.raises(ToolkitError, match="two \\[\\[port\\]\\] tables for vLLM 0.0.2"):
        base.read_ports(root)


# --- --port sessions ---------------------------------------------------------------


def test_apply_port_makes_its_own_tree_and_round_trips(pinport):
    pin, port = pinport
    assert (port.work / "setup.py").read_text() == "print('setup 2')\n"
    assert "return 100\n" in (port.work / F0).read_text()
    assert (pin.work / "setup.py").read_text() == BASE_FILES["setup.py"]
    assert State.load(port).base == port.commit and State.load(pin).base == pin.commit
    before = {p.name: p.read_bytes() for p in port.patches.glob("*.patch")}
    shutil.rmtree(port.work)
    port.state_file.unlink()
    apply.apply(port, log=quiet)
    assert export.export(port, check=True, log=quiet) == []
    assert {p.name: p.read_bytes() for p in port.patches.glob("*.patch")} == before


def test_cli_port_sessions_act_on_the_port(pinport, capsys):
    pin, port = pinport
    assert cli.run(["apply", "--port", PORT], pin.root) == 0
    assert cli.run(["status", "--port", PORT], pin.root) == 0
    out = capsys.readouterr().out
    assert f"port:      vLLM {PORT} (ports/{PORT})" in out
    assert f"the work tree matches ports/{PORT}/" in out
    assert cli.run(["export", "--port", PORT, "--check"], pin.root) == 0
    assert cli.run(["status", "--port", "9.9.9"], pin.root) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: pin.toml lists no port to vLLM 9.9.9")
    assert err.count("error:") == 1


def test_port_apply_refuses_over_work_and_keeps_it_with_force(pinport):
    pin, port = pinport
    (port.work / F0).write_text("mine\n")
    with pytest.raises(
        ToolkitError, match=f"commit your changes and run `nox -s export -- --port {PORT}`"
    ):
        apply.apply(port, force=False, log=quiet)
    # The pin's tree is another tree: its apply goes on.
    apply.apply(pin, log=quiet)
    apply.apply(port, force=True, log=quiet)
    assert git.git(port.work, "stash", "list").count("saved by apply --force") == 1
    assert "return 100" in (port.work / F0).read_text()


def test_one_session_at_a_time_across_targets(pinport, capsys):
    pin, _ = pinport
    with safety.session_lock(pin.root):
        assert cli.run(["apply", "--port", PORT], pin.root) == 1
    assert "holds" in capsys.readouterr().err


def test_port_export_refuses_over_changed_port_patches(pinport):
    _, port = pinport
    patch = next(port.patches.glob("0001-*.patch"))
    patch.write_bytes(patch.read_bytes() + b"\n")
    with pytest.raises(
        ToolkitError,
        match=f"ports/{PORT}/ changed since the work tree was "
        f"made from it: `nox -s apply -- --port {PORT}`",
    ):
        export.export(port, log=quiet)


# --- carry --check -----------------------------------------------------------------


def test_check_passes_when_the_port_has_every_change(pinport):
    pin, port = pinport
    lines = []
    carry.check(pin, port, log=lines.append)
    assert any("has all 2 patch(es)" in line for line in lines)
    assert any("csrc/sm7x/ is the same" in line and "(1 file(s))" in line for line in lines)


def test_check_fails_when_the_pin_changed_a_patch(pinport):
    pin, port = pinport
    write_series(pin, pin_patches(f0(101)))
    with pytest.raises(ToolkitError) as e:
        carry.check(pin, port, log=quiet)
    msg = str(e.value)
    assert msg.startswith(f"the port to vLLM {PORT} lacks changes of the pin's series:")
    assert "f0 (patches/0001-Kernel-Change-f0.patch) changed since it was last carried" in msg
    assert f"`nox -s carry -- {PORT}`" in msg


def test_check_reports_a_declared_pending_change_and_fails_once_it_moves_on(pinport):
    """[pending] names the pin's patch as it is now: reported, not failed; a
    later change of that patch fails again; a declaration needs its reason."""
    pin, port = pinport
    write_series(pin, pin_patches(f0(101)))
    pid = next(p.patch_id for p in carry_record.pin_patches(pin) if p.name == "f0")
    carried = port.patches / carry_record.CARRIED
    text = carried.read_text()
    carried.write_text(text + f'[pending]\n"f0" = {{ patch_id = "{pid}", why = "not yet" }}\n')
    lines = []
    carry.check(pin, port, log=lines.append)
    assert any("PENDING f0: not yet" in line for line in lines)
    write_series(pin, pin_patches(f0(102)))
    with pytest.raises(ToolkitError, match="f0 .* changed since it was last carried"):
        carry.check(pin, port, log=quiet)
    carried.write_text(text + f'[pending]\n"f0" = {{ patch_id = "{pid}", why = " " }}\n')
    with pytest.raises(ToolkitError, match=r"\[pending\] entry f0 needs patch_id and a "):
        carry.check(pin, port, log=quiet)


def test_a_carry_drops_the_pending_entries_it_settles_and_keeps_the_others(pinport):
    """A carry records the pin's patches as they are now: it settles every
    [pending] entry of a patch it carries (also one declared for an older
    version of it) and keeps the others."""
    pin, port = pinport
    write_series(pin, pin_patches(f0(101)))
    pid = next(p.patch_id for p in carry_record.pin_patches(pin) if p.name == "f0")
    carried = port.patches / carry_record.CARRIED
    carried.write_text(
        carried.read_text()
        + '\n[pending]\n"f0" = { patch_id = "00aa", why = "an older version" }\n'
        + '"gone" = { patch_id = "0123", why = "a \\"quoted\\" reason" }\n'
    )
    lines: list[str] = []
    carry.start(pin, port, log=lines.append)
    assert "carry: [pending] f0 is carried now; its entry is dropped" in lines
    assert carry_record.read_carried(port)["f0"]["patch_id"] == pid
    assert carry_record.read_pending(port) == {
        "gone": {"patch_id": "0123", "why": 'a "quoted" reason'}
    }


def _commit_then_change_f0(pin) -> str:
    """Commit the pin's series as it is (the commit a port was made from),
    then change f0 in the pin; returns that commit."""
    git.git(pin.root, "add", "-A")
    git.git(
        pin.root,
        "commit",
        "-q",
        "-m",
        "series",
        env={"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.com"},
    )
    made_from = git.rev(pin.root, "HEAD")
    assert made_from
    write_series(pin, pin_patches(f0(101)))
    return made_from


def test_record_of_an_older_series_keeps_the_pending_entry_of_a_newer_version(pinport):
    pin, port = pinport
    made_from = _commit_then_change_f0(pin)
    pid = next(p.patch_id for p in carry_record.pin_patches(pin) if p.name == "f0")
    carried = port.patches / carry_record.CARRIED
    carried.write_text(f'[pending]\n"f0" = {{ patch_id = "{pid}", why = "not yet" }}\n')
    carry_record.record(pin, port, rev=made_from, log=quiet)
    assert carry_record.read_pending(port) == {"f0": {"patch_id": pid, "why": "not yet"}}
    carry_record.record(pin, port, log=quiet)
    assert carry_record.read_pending(port) == {}


def test_check_ignores_a_reexport_that_moves_only_line_numbers(pinport):
    """A patch-id is of the diff's content: a change of an earlier patch that
    only moves this one's lines (or a new subject) is nothing to carry."""
    pin, port = pinport
    move = ("move", "[Core] Move lines", Edit(vllm__utils_DOT_py=lambda t: "# top\n" + t))
    write_series(pin, [move, *pin_patches()])
    with pytest.raises(ToolkitError, match="move .* is new in the pin's series"):
        carry.check(pin, port, log=quiet)
    write_series(pin, pin_patches())
    carry.check(pin, port, log=quiet)


def test_check_fails_when_the_kernels_differ(pinport):
    pin, port = pinport
    write_series(port, pin_patches(kernel="kernel v1, edited in the port\n"))
    with pytest.raises(
        ToolkitError, match="csrc/sm7x/ of the port to vLLM 0.0.2 is not the pin's"
    ) as e:
        carry.check(pin, port, log=quiet)
    assert "  csrc/sm7x/k.cu: differs" in str(e.value)


def test_check_needs_both_trees_made_from_their_patches(pinport):
    pin, port = pinport
    shutil.rmtree(pin.work)
    with pytest.raises(ToolkitError, match="no work tree: run `nox -s apply` first"):
        carry.check(pin, port, log=quiet)


def test_unrecorded_port_patches_are_named_with_the_record_command(pinport):
    pin, port = pinport
    (port.patches / carry_record.CARRIED).unlink()
    with pytest.raises(ToolkitError, match="does not say which version") as e:
        carry.check(pin, port, log=quiet)
    assert f"`nox -s carry -- {PORT} --record`" in str(e.value)
    with pytest.raises(ToolkitError, match=f"`nox -s carry -- {PORT} --record` says so"):
        carry.start(pin, port, log=quiet)


# --- carry -------------------------------------------------------------------------


def test_carry_applies_the_interdiff_to_the_port(pinport):
    pin, port = pinport
    write_series(pin, pin_patches(f0(101)))
    head = git.rev(port.work, "HEAD")
    lines = []
    carry.start(pin, port, log=lines.append)
    text = (port.work / F0).read_text()
    # The pin's change (100 -> 101) on the port's file, the port's release kept.
    assert "return 101\n" in text and text.startswith("# 0.0.2\n") and "# 0.0.2\n" in text
    assert "return 1  # 0.0.2\n" in text
    subjects = [s for _, s in git.commits(port.work, f"{port.commit}..HEAD")]
    assert subjects == ["[Kernel] Change f0", "[Kernel] Add a kernel"]  # fixed up, not added
    port_patch = next(port.patches.glob("0001-*.patch")).read_text()
    assert "+    return 101" in port_patch and "Patch-Name: f0" in port_patch
    assert export.export(port, check=True, log=quiet) == []
    carry.check(pin, port, log=quiet)
    # Nothing lost: the port as it was is under a backup ref.
    backups = git.git(
        port.work, "for-each-ref", "--format=%(objectname)", safety.BACKUP_REF
    ).split()
    assert head in backups
    assert any("the port before the carry is kept as" in line for line in lines)


def test_nothing_to_carry_changes_nothing(pinport):
    pin, port = pinport
    head = git.rev(port.work, "HEAD")
    lines = []
    carry.start(pin, port, log=lines.append)
    assert git.rev(port.work, "HEAD") == head
    assert "has every change of the pin's series" in lines[-1]


def test_carry_picks_new_patches_and_drops_removed_ones(pinport):
    pin, port = pinport
    new = ("new", "[Core] Add new module", Edit(vllm__new_DOT_py="NEW = 1\n"))
    write_series(pin, [pin_patches()[0], new])  # kern dropped, new after f0
    carry.start(pin, port, log=quiet)
    subjects = [s for _, s in git.commits(port.work, f"{port.commit}..HEAD")]
    assert subjects == ["[Kernel] Change f0", "[Core] Add new module"]
    assert (port.work / "vllm/new.py").read_text() == "NEW = 1\n"
    assert not (port.work / "csrc/sm7x/k.cu").exists()
    assert set(carry_record.read_carried(port)) == {"f0", "new"}


def test_carry_conflict_stops_with_help_then_continue_records_the_resolution(pinport):
    carry_with_a_conflict_resolved(*pinport)


def carry_with_a_conflict_resolved(pin, port) -> None:
    # The pin now also changes f1's line, which 0.0.2 changed too: a conflict there.
    both = Edit(
        vllm__utils_DOT_py=lambda t: t.replace("return 0\n", "return 100\n").replace(
            "return 1\n", "return 11\n"
        )
    )
    write_series(pin, pin_patches(both))
    lines = []
    with pytest.raises(ToolkitError, match="carry stopped at a conflict"):
        carry.start(pin, port, log=lines.append)
    out = "\n".join(lines)
    assert f"carry: the pin's changes onto the port to {PORT}, stopped at step" in out
    assert f"patch:  [Kernel] Change f0 (ports/{PORT}/0001-Kernel-Change-f0.patch)" in out
    assert "files:  vllm/utils.py (1 conflict hunk(s))" in out
    assert f"upstream changed them from 0.0.1 to {PORT}:" in out
    assert f"`nox -s carry -- {PORT} --continue`" in out
    # While it is stopped, the port's other sessions refuse, and status says where it is.
    with pytest.raises(ToolkitError, match=f"carry -- {PORT} --continue"):
        export.export(port, log=quiet)
    assert any("in a carry of the pin's changes" in line for line in _status_lines(port))
    resolved = (port.work / F0).read_text()
    resolved = (
        resolved[: resolved.index("<<<<<<<")]
        + "    return 11  # 0.0.2\n"
        + resolved[resolved.index(">>>>>>>") :].split("\n", 1)[1]
    )
    (port.work / F0).write_text(resolved)
    git.git(port.work, "add", F0)
    carry.cont(port, log=quiet)
    assert "    return 11  # 0.0.2\n" in (port.work / F0).read_text()
    assert any((port.patches / "resolutions").iterdir())
    carry.check(pin, port, log=quiet)


def test_a_recorded_resolution_carries_the_same_change_by_itself(pinport):
    pin, port = pinport
    saved = {p.name: p.read_bytes() for p in port.patches.iterdir() if p.is_file()}
    carry_with_a_conflict_resolved(pin, port)
    # Another machine: the port as before the carry, the resolutions committed beside it.
    for p in port.patches.glob("*.patch"):
        p.unlink()
    for name, data in saved.items():
        (port.patches / name).write_bytes(data)
    shutil.rmtree(port.work)
    port.state_file.unlink()
    lines = []
    carry.start(pin, port, log=lines.append)
    assert any("resolved by a recorded resolution" in line for line in lines)
    assert "    return 11  # 0.0.2\n" in (port.work / F0).read_text()
    carry.check(pin, port, log=quiet)


def test_carry_abort_puts_the_port_back(pinport):
    pin, port = pinport
    head = git.rev(port.work, "HEAD")
    carried = (port.patches / carry_record.CARRIED).read_text()
    both = Edit(
        vllm__utils_DOT_py=lambda t: t.replace("return 0\n", "return 100\n").replace(
            "return 1\n", "return 11\n"
        )
    )
    write_series(pin, pin_patches(both))
    with pytest.raises(ToolkitError):
        carry.start(pin, port, log=quiet)
    carry.abort(port, log=quiet)
    assert git.rev(port.work, "HEAD") == head and git.operation_in_progress(port.work) is None
    assert (port.patches / carry_record.CARRIED).read_text() == carried
    assert State.load(port).rebase is None
    with pytest.raises(ToolkitError, match=f"no carry to the port to vLLM {PORT} is stopped"):
        carry.abort(port, log=quiet)


def test_cli_carry(pinport, capsys):
    pin, port = pinport
    assert cli.run(["carry", PORT, "--check"], pin.root) == 0
    write_series(pin, pin_patches(f0(101)))
    assert cli.run(["carry", PORT, "--check"], pin.root) == 1
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert cli.run(["carry", PORT], pin.root) == 0
    assert cli.run(["carry", PORT, "--check"], pin.root) == 0
    assert cli.run(["carry", PORT, "--check", "--record"], pin.root) == 1


def _status_lines(t):
    lines: list[str] = []
    status.status(t, log=lines.append)
    return lines


def test_pr_builds_from_a_port_with_onto(pinport):
    pin, port = pinport
    assert (
        branches.onto_target(pin.root, None) == pin == branches.onto_target(pin.root, "vllm==0.0.1")
    )
    assert branches.onto_target(pin.root, f"vllm=={PORT}") == port
    with pytest.raises(ToolkitError, match="no series tree for vLLM 9.9.9 yet"):
        branches.onto_target(pin.root, "vllm==9.9.9")


def test_the_pins_status_says_whether_each_port_is_carried(pinport):
    pin, port = pinport
    assert (
        f"port:      vLLM {PORT} (ports/{PORT}): has every change of the pin's patches"
        in _status_lines(pin)
    )
    write_series(pin, pin_patches(f0(101)))
    assert (
        f"port:      vLLM {PORT} (ports/{PORT}): lacks the pin's changes to f0: "
        f"`nox -s carry -- {PORT}`"
    ) in _status_lines(pin)


def test_build_test_and_overlay_take_the_ports_tree_and_folders(pinport, monkeypatch):
    pin, port = pinport
    seen: dict = {}
    monkeypatch.setattr(build, "session", lambda tree, out, **kw: seen.update(build=(tree, out)))
    monkeypatch.setattr(
        runner, "run_all", lambda tree, tests, out, **kw: seen.update(test=(tree, out)) or []
    )
    assert cli.run(["build", "--port", PORT], pin.root) == 0
    assert cli.run(["test", "--port", PORT], pin.root) == 0
    assert seen == {
        "build": (port.work, pin.root / ".work" / f"build-{PORT}"),
        "test": (port.work, pin.root / ".work" / f"test-results-{PORT}"),
    }
    port.out("build").mkdir()
    module = f"{recipe.native().module}.abi3.so"
    (port.out("build") / module).write_text("module")
    overlay.session(port, log=quiet)
    dest = pin.root / "overlays" / f"vllm-{PORT}" / "vllm"
    assert (dest / module).read_text() == "module"
    assert "return 100\n" in (dest / "utils.py").read_text()
    assert cli.port_of(["--port", PORT]) == PORT == cli.port_of([f"--port={PORT}"])


def test_record_from_an_older_commit_then_carry_what_changed_since(pinport):
    """A port made from an older pin series: recorded as of that commit of the
    toolkit, the pin's changes since then are what the carry brings."""
    pin, port = pinport
    made_from = _commit_then_change_f0(pin)
    (port.patches / carry_record.CARRIED).unlink()
    lines: list[str] = []
    carry_record.record(pin, port, rev=made_from, log=lines.append)
    assert f"as they were at {made_from}" in lines[-1]
    with pytest.raises(ToolkitError, match="f0 .* changed since it was last carried"):
        carry.check(pin, port, log=quiet)
    carry.start(pin, port, log=quiet)
    assert "return 101\n" in (port.work / F0).read_text()
    carry.check(pin, port, log=quiet)


def test_port_apply_stopped_then_finished_by_hand_and_continued(pinport, capsys):
    """apply --continue on a port: its own tree, state and folder, its --port commands."""
    pin, port = pinport
    name = series.read_series(port)[0]
    path = port.patches / name
    path.write_text(path.read_text().replace("\n def f1():\n", "\n def f1_gone():\n", 1))
    assert cli.run(["apply", "--port", PORT], pin.root) == 1
    err = capsys.readouterr().err
    assert f"patch ports/{PORT}/{name} (1/2) does not apply" in err
    assert f"am -3 --keep-non-patch {path}" in err
    assert f"nox -s apply -- --continue --port {PORT}" in err
    pin_head = git.rev(pin.work, "HEAD")
    # By hand: the patch does not apply even 3-way, so the user writes its change.
    am = git.run(port.work, "am", "-3", "--keep-non-patch", str(path))
    assert am.returncode != 0 and git.operation_in_progress(port.work) == "am"
    (port.work / F0).write_text((port.work / F0).read_text().replace("return 0\n", "return 100\n"))
    git.git(port.work, "add", F0)
    git.git(port.work, "am", "--continue")
    assert cli.run(["apply", "--continue", "--port", PORT], pin.root) == 0
    out = capsys.readouterr().out
    assert f"finished by hand: ports/{PORT}/{name}" in out
    assert f"`nox -s export -- --port {PORT}`" in out
    assert State.load(port).complete and git.rev(pin.work, "HEAD") == pin_head
    assert cli.run(["export", "--port", PORT], pin.root) == 0
    assert "\n def f1():\n" in path.read_text() and "Patch-Name: f0" in path.read_text()
    assert cli.run(["export", "--port", PORT, "--check"], pin.root) == 0
