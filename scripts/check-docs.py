#!/usr/bin/env python3
"""The documentation's own checks, run by `make docs` and `make test`.

- every relative link in the README and the book reaches a file, and every
  `#anchor` a heading of that page (ids as mdBook makes them); a link of the
  book stays inside it (the built book holds docs/src only);
- every page of docs/src is in SUMMARY.md and every entry of it exists;
- every `{{#include}}` reaches a file, and the configuration page includes
  config/default.toml (so the reference is the file the service reads);
- every `docs/src/….md` the code, configuration and scripts point at exists;
- the README stays a front door: at most 250 lines;
- the measured figures of the book's generated tables are those of the
  load test's reports (scripts/render-figures.py --check).

mdBook does not check links (its link-check plugin lags its releases), and
the check is this small, so it is written here. Exits 1 naming each fault.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs" / "src"
README_MAX_LINES = 250
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
INCLUDE = re.compile(r"\{\{#include ([^}\s]+)\}\}")


def prose(text):
    """The lines outside fenced code blocks, with inline code removed."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, re.sub(r"`[^`]*`", "", line), line


def anchors(path):
    """Heading ids as mdBook makes them: lowercase alphanumerics, `-` and
    `_`, whitespace as `-`; a repeated id gets `-1`, `-2`, …"""
    seen = {}
    ids = set()
    for _, _, line in prose(path.read_text()):
        m = re.match(r"^#{1,6} (.*)", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        text = text.replace("`", "").replace("*", "")
        base = "".join(
            c.lower() if c.isalnum() or c in "-_" else "-" if c.isspace() else ""
            for c in text.strip()
        )
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def check_links(page, faults):
    for number, line, _ in prose(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # http, https, mailto: outside the repository
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(ROOT)}:{number}"
            if not dest.exists():
                faults.append(f"{where}: {target} does not exist")
            elif page.is_relative_to(BOOK) and not dest.is_relative_to(BOOK):
                # The built book holds docs/src only: such a link breaks there.
                faults.append(f"{where}: {target} leaves the book (name the file in code instead)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                faults.append(f"{where}: {target} has no heading #{anchor}")


def main():
    faults = []
    pages = sorted(BOOK.rglob("*.md"))
    for page in [ROOT / "README.md", *pages]:
        check_links(page, faults)
    summary = (BOOK / "SUMMARY.md").read_text()
    listed = {(BOOK / t).resolve() for t in LINK.findall(summary)}
    for page in pages:
        if page.name != "SUMMARY.md" and page.resolve() not in listed:
            faults.append(f"{page.relative_to(ROOT)} is not in SUMMARY.md")
    for page in pages:
        for target in INCLUDE.findall(page.read_text()):
            target = target.split(":")[0]  # a file, then an anchor
            if not (page.parent / target).exists():
                faults.append(f"{page.relative_to(ROOT)}: include {target} does not exist")
    config_page = BOOK / "operating" / "configuration.md"
    included = [
        (config_page.parent / t.split(":")[0]).resolve()
        for t in INCLUDE.findall(config_page.read_text())
    ]
    if (ROOT / "config" / "default.toml").resolve() not in included:
        faults.append("docs/src/operating/configuration.md does not include config/default.toml")
    mentioned = re.compile(r"docs/src/[\w/.-]+\.md")
    for tree in ["src", "tests", "config", "scripts", "loadtest", "benches", "fuzz"]:
        for file in sorted((ROOT / tree).rglob("*")):
            if {"target", "corpus", "artifacts"} & set(file.parts) or not file.is_file():
                continue
            if file.suffix not in {".rs", ".toml", ".py", ".sh", ".js", ".conf", ".md"}:
                continue
            for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                for path in mentioned.findall(line):
                    if not (ROOT / path).exists():
                        faults.append(f"{file.relative_to(ROOT)}:{number}: {path} does not exist")
    figures = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render-figures.py"), "--check"],
        capture_output=True,
        text=True,
    )
    if figures.returncode != 0:
        fault = figures.stderr.strip()
        if "render-figures.py` to regenerate" not in fault:
            fault += "\nfigures: run `python3 scripts/render-figures.py` to regenerate"
        faults.append(fault)
    lines = len((ROOT / "README.md").read_text().splitlines())
    if lines > README_MAX_LINES:
        faults.append(f"README.md has {lines} lines; the front door keeps to {README_MAX_LINES}")
    for fault in faults:
        print(fault, file=sys.stderr)
    if faults:
        return 1
    print(f"docs: {len(pages)} pages and the README, every link, anchor and figure checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
