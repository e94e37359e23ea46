"""``fleetops docs [--check] [--out DIR]``: write the generated reference pages, or check them.

Registered into the ``fleetops`` command by ``fleetops.cli``. Exit codes: 0 written / current,
1 (``--check``) a page is missing or differs, 4 usage error (from the main parser).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def default_docs_dir() -> str:
    """The checkout's ``docs/`` when fleetops runs from a checkout, else ``./docs``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isdir(os.path.join(root, "fleetops")):
        return os.path.join(root, "docs")
    return "docs"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "docs",
        help="regenerate the reference pages in docs/reference/ from the code (--check: only compare)",
        description="Writes docs/reference/{baseline,checks,xid,outputs,commands}.md from the baseline schema, "
        "the checks registry, the XID catalog, the report renderers and the argument parsers. With --check "
        "nothing is written: exit 1 lists the pages that differ from what the code generates.",
    )
    p.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a page is missing or differs"
    )
    p.add_argument("--out", help="the docs folder (default: this checkout's docs/)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fleetops.docgen import generate

    out = args.out or default_docs_dir()
    pages = generate.generate_all()
    if args.check:
        stale = generate.differing(out, pages)
        if not stale:
            print(f"{len(pages)} generated pages in {out} are current")
            return 0
        for path in stale:
            target = os.path.join(out, path)
            state = "missing" if not os.path.exists(target) else "differs from what the code generates"
            sys.stderr.write(f"{target}: {state}\n")
        sys.stderr.write("run `fleetops docs` to regenerate them, and commit the result\n")
        return 1
    changed = generate.write_all(out, pages)
    for path in changed:
        print(f"wrote {os.path.join(out, path)}")
    print(f"{len(pages)} generated pages in {out}: {len(changed)} changed")
    return 0
