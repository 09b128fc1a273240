"""Find and download one source distribution through pip's configured index.

``pip download --no-binary`` of vLLM runs its build backend to read the
metadata, which needs torch. This asks pip's own package finder (so the
user's index, extra indexes, find-links, certificates and proxies apply)
for the file and downloads only that file, with pip's own session.

Run as ``python -m serieskit.series._pipfetch NAME VERSION FILENAME DEST``; prints
JSON ``{"url": ..., "sha256": ..., "size": ...}`` and reports progress on
stderr. Exit status NOT_FOUND means "no such file on the index", UNREACHABLE
"the index could not be reached" (pip's own reason on stderr), 1 any other
error. This uses pip's internal API, kept to this one small module.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

from serieskit import killpoint

NOT_FOUND = 2
UNREACHABLE = 3


def _finder_and_session():
    from pip._internal.commands import create_command

    cmd = create_command("download")
    # No pip cache: the file is kept in the toolkit's cache, and from PyPI
    # (which sends cache headers) pip would keep a second copy of it (the
    # released wheel: 336 MB).
    options, _ = cmd.parse_args(["--no-deps", "--no-cache-dir", "placeholder"])
    return cmd, options


def _unreachable(session, index_urls: list[str], name: str, options) -> str | None:
    """pip's reason for each index that does not answer; None when all do.
    A release missing from the indexes that answered may be on one that did not."""
    reasons = []
    for url in index_urls:
        try:
            session.get(f"{url.rstrip('/')}/{name}/", timeout=options.timeout)
        except Exception as e:  # noqa: BLE001 - pip's session raises many kinds
            reasons.append(f"{url}: {e}")
    return "; ".join(reasons) or None


def list_releases(name: str, specifier: str) -> int:
    """Print (JSON) the versions of ``name`` matching ``specifier`` that have
    a source distribution on the index, oldest first."""
    from pip._vendor.packaging.specifiers import SpecifierSet

    logging.getLogger("pip").setLevel(logging.ERROR)
    cmd, options = _finder_and_session()
    with cmd.main_context():
        session = cmd.get_default_session(options)
        finder = cmd._build_package_finder(
            options=options, session=session, ignore_requires_python=True
        )
        wanted = SpecifierSet(specifier)
        found = {
            c.version
            for c in finder.find_all_candidates(name)
            if c.link.filename.endswith(".tar.gz") and c.version in wanted
        }
        if not found and (
            reason := _unreachable(session, finder.search_scope.index_urls, name, options)
        ):
            print(reason, file=sys.stderr)
            return UNREACHABLE
    print(json.dumps([str(v) for v in sorted(found)]))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--list"]:
        return list_releases(argv[1], argv[2])
    name, version, filename, dest = argv
    # pip warns about every find-links / file:// index that lacks the package.
    logging.getLogger("pip").setLevel(logging.ERROR)
    cmd, options = _finder_and_session()
    with cmd.main_context():
        session = cmd.get_default_session(options)
        finder = cmd._build_package_finder(
            options=options, session=session, ignore_requires_python=True
        )
        killpoint.reach("download.asking")  # the fault tests' Ctrl-C as pip asks its index
        found = [c.link for c in finder.find_all_candidates(name) if c.link.filename == filename]
        if not found:
            # pip's finder reads an unreachable index as an empty one: ask it once
            # more directly, so that an outage does not look like a missing release.
            reason = _unreachable(session, finder.search_scope.index_urls, name, options)
            if reason:
                print(reason, file=sys.stderr)
                return UNREACHABLE
            print(f"{filename} is not on the package index", file=sys.stderr)
            return NOT_FOUND
        link = found[0]
        info = {
            "url": link.url_without_fragment,
            "sha256": link.hash if link.hash_name == "sha256" else None,
        }
        try:
            resp = session.get(link.url_without_fragment, stream=True, timeout=60)
            resp.raise_for_status()
        except Exception as e:  # noqa: BLE001 - reported as one line
            print(f"download of {filename} failed: {e}", file=sys.stderr)
            return 1
        total = int(resp.headers.get("content-length") or 0)
        info["size"] = total
        print(f"downloading {filename} ({total / 1e6:.1f} MB)", file=sys.stderr)
        done, shown, start = 0, -1, time.monotonic()
        try:
            with open(dest, "wb") as f:
                for chunk in resp.iter_content(1 << 20):
                    f.write(chunk)
                    done += len(chunk)
                    pct = int(100 * done / total) if total else 0
                    if pct // 10 != shown:
                        shown = pct // 10
                        rate = done / max(time.monotonic() - start, 1e-3) / 1e6
                        print(
                            f"  {done / 1e6:6.1f} MB  {pct:3d}%  {rate:.1f} MB/s",
                            file=sys.stderr,
                            flush=True,
                        )
        except Exception as e:  # noqa: BLE001 - reported as one line
            print(f"download of {filename} failed: {e}", file=sys.stderr)
            return 1
        info["size"] = done
    print(json.dumps(info))
    return 0


def _interrupted(*_args) -> None:
    # Ctrl-C reaches the whole process group: the session says "interrupted"
    # in one line; this child ends at once, without a traceback of pip's.
    os._exit(130)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _interrupted)
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # one raised before the handler was in place
        os._exit(130)
