"""The committed patches are ones a person can sign: one author identity,
signed off by it, no placeholder address, and no shipped line (tests
included) that speaks of the original pull request as "the seed", of this
repository or of its toolkit (docs/user-guide.md: "Who the patches are by")."""

from __future__ import annotations

import email
import email.utils
import re
import tomllib
from pathlib import Path

import pytest

from serieskit import git
from serieskit.pr import branches

PATCHES = Path(__file__).resolve().parent.parent / "patches"

# Reserved for examples and tests, never a mailbox (RFC 2606, RFC 6761), and
# the toolkit's own committer.
PLACEHOLDER = re.compile(r"@(?:[\w.-]+\.)?(?:invalid|localhost|test)$|@localhost$", re.I)
TRAILER = re.compile(r"^(Signed-off-by|Co-authored-by): *(.+)$", re.M)
SEED = re.compile(
    r"\bseed(?:'s| (?:model|pull request|PR|fork|commit|run|case|sweep)s?)\b"
    r"|\b(?:the|our) seed\b(?! *[=(\[,:)])",
    re.I,
)
RNG = re.compile(r"random|\brng\b|generator|determinis|reproduc", re.I)  # a seed of an RNG
TOOLKIT = re.compile(
    r"\bserieskit\b|\bnox -s\b|vllm-series|patches/manifest\.toml|\.work/vllm"
    r"|\bresults/[\w.-]+\.json|\bgpu/stage\d",
    re.I,
)


def identities(text: str) -> tuple[str, list[tuple[str, str]]]:
    """A patch file's author and its message's (trailer, identity) pairs."""
    head = text.partition("\n---\n")[0]
    author = email.message_from_string(head.split("\n", 1)[1])["From"] or ""
    name, mail = email.utils.parseaddr(" ".join(author.split()))
    return f"{name} <{mail}>", [(m.group(1), m.group(2).strip()) for m in TRAILER.finditer(head)]


def problems(files: dict[str, str]) -> list[str]:
    """What keeps a person from signing these patch files (name -> text)."""
    out: list[str] = []
    authors = {name: identities(text)[0] for name, text in files.items()}
    if len(set(authors.values())) > 1:
        out.append(
            "more than one author identity: "
            + "; ".join(f"{n}: {a}" for n, a in sorted(authors.items()))
        )
    for name, text in sorted(files.items()):
        author, trailers = identities(text)
        sobs = [who for key, who in trailers if key == "Signed-off-by"]
        if sobs != [author]:
            out.append(
                f"{name}: signed off by {sobs or 'nobody'}, not by its author {author} alone"
            )
        for who in dict.fromkeys([author, *(who for _, who in trailers)]):
            mail = email.utils.parseaddr(who)[1]
            if PLACEHOLDER.search(mail) or mail == git.COMMITTER[1]:
                out.append(f"{name}: {who} is a placeholder address, no person's")
        for line in text.split("\n---\n", 1)[-1].splitlines():
            if not line.startswith("+") or line.startswith("+++ "):
                continue
            if (m := SEED.search(line)) and not RNG.search(line):
                out.append(f"{name}: a shipped line speaks of {m.group(0)!r}: {line[1:].strip()}")
            if m := TOOLKIT.search(line):
                out.append(f"{name}: a shipped line names {m.group(0)!r}: {line[1:].strip()}")
    return out


def patch(author: str, trailers: str, added: str) -> str:
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: {author}\nDate: Mon, 30 Nov 2026 12:00:00 +0000\nSubject: [PATCH] [Kernel] X\n\n"
        f"Why.\n\n{trailers}\n---\n diff --git a/x.py b/x.py\n+++ b/x.py\n@@ -0,0 +1 @@\n"
        f"+{added}\n"
    )


ADA = "Ada Lovelace <ada@example.org>"


def test_the_committed_patches_can_be_signed():
    files = {p.name: p.read_text() for p in sorted(PATCHES.glob("*.patch"))}
    assert files
    assert problems(files) == []


def test_each_patch_derived_from_the_original_work_credits_its_author():
    """A patch whose manifest ``seed`` names a commit of the original pull
    request carries its group's ``co_author`` as Co-authored-by (the pull
    request's branch adds it where missing; the patch says so itself)."""
    data = tomllib.loads((PATCHES / "manifest.toml").read_text())
    co_author = {p: g["co_author"] for g in data["pr"] if "co_author" in g for p in g["patches"]}
    seeds = {e["name"]: e["seed"] for e in data["patch"]}
    missing = []
    for path in sorted(PATCHES.glob("*.patch")):
        text = path.read_text().partition("\n---\n")[0]
        name = re.search(r"^Patch-Name: (\S+)$", text, re.M)
        assert name, f"{path.name} has no Patch-Name"
        want = co_author.get(name.group(1))
        derives = branches.DERIVES.search(seeds[name.group(1)])
        if want and derives and f"Co-authored-by: {want}" not in text:
            missing.append(f"{path.name}: no Co-authored-by: {want}")
    assert missing == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"1.patch": patch(ADA, f"Signed-off-by: {ADA}", "x = 1")},
            [],
        ),
        (
            {
                "1.patch": patch(ADA, f"Signed-off-by: {ADA}", "x = 1"),
                "2.patch": patch(
                    "Bob <bob@example.org>", "Signed-off-by: Bob <bob@example.org>", "y"
                ),
            },
            ["more than one author identity: 1.patch: " + ADA + "; 2.patch: Bob <bob@example.org>"],
        ),
        (
            {"1.patch": patch("vLLM series <series@vllm-series.invalid>", "", "x = 1")},
            [
                "1.patch: signed off by nobody, not by its author "
                "vLLM series <series@vllm-series.invalid> alone",
                "1.patch: vLLM series <series@vllm-series.invalid> is a placeholder address, "
                "no person's",
            ],
        ),
        (
            {
                "1.patch": patch(
                    ADA,
                    f"Co-authored-by: P <p@x.test>\nSigned-off-by: {ADA}",
                    "# as in the seed's runs",
                )
            },
            [
                "1.patch: P <p@x.test> is a placeholder address, no person's",
                "1.patch: a shipped line speaks of 'the seed': # as in the seed's runs",
            ],
        ),
        (
            {"1.patch": patch(ADA, f"Signed-off-by: {ADA}", '"build it: serieskit build --ptx"')},
            ["1.patch: a shipped line names 'serieskit': \"build it: serieskit build --ptx\""],
        ),
        (  # a random seed is no seed pull request
            {
                "1.patch": patch(
                    ADA, f"Signed-off-by: {ADA}", "# Reset the seed of the random state"
                )
            },
            [],
        ),
    ],
)
def test_what_keeps_a_person_from_signing(files, expected):
    assert problems(files) == expected
