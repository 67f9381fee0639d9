#!/usr/bin/env python3
"""Checks that every relative link in the project's Markdown resolves.

Usage: python3 hack/check-md-links.py [-v]

Reads README.md, CHANGELOG.md, fixtures/sysfs/README.md, every *.md under docs/, and charts/**/README.md with its README.md.gotmpl
(helm-docs' template, whose links must match the generated file). For each link or image
`[text](target)`, `![alt](target)` and reference definition `[id]: target` outside code, a
target without a scheme (not http:, https:, mailto:, ...) must name a file or folder in the
repository, relative to the Markdown file, and a `#anchor` on a Markdown target (or on the
file itself) must be the GitHub slug of one of its headings. Prints each file with the number
of links checked (-v: every link), then the broken ones; exits 1 if any is broken.
Python 3 standard library only.
"""

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files():
    files = []
    for top_file in ("README.md", "CHANGELOG.md", "fixtures/sysfs/README.md"):
        if os.path.isfile(os.path.join(ROOT, top_file)):
            files.append(top_file)
    for top, wanted in (("docs", None), ("charts", ("README.md", "README.md.gotmpl"))):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if (wanted is None and name.endswith(".md")) or (wanted and name in wanted):
                    files.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return files


def lines_outside_code(text):
    """(line number, line) for lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "")
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)  # emphasis markers
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchor_cache = {}


def anchors(path):
    if path not in _anchor_cache:
        found, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line in lines_outside_code(text):
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
            for a in HTML_ANCHOR.findall(line):
                found.add(a)
        _anchor_cache[path] = found
    return _anchor_cache[path]


def links(text):
    for number, line in lines_outside_code(text):
        line = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        m = REF_DEF.match(line)
        if m:
            yield number, m.group(1)
            continue
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1)


def check(md, verbose):
    """(links checked, broken [(line, target, why)])"""
    path = os.path.join(ROOT, md)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    checked, broken = 0, []
    for number, target in links(text):
        target = target.strip("<>")
        if SCHEME.match(target) or target.startswith("//"):
            continue
        # helm-docs template expressions are not links.
        if "{{" in target:
            continue
        checked += 1
        file_part, _, anchor = target.partition("#")
        if file_part:
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        else:
            resolved = path
        why = None
        if not resolved.startswith(ROOT + os.sep) and resolved != ROOT:
            why = "outside the repository"
        elif not os.path.exists(resolved):
            why = "no such file"
        elif anchor and resolved.endswith((".md", ".gotmpl")) and os.path.isfile(resolved):
            if anchor not in anchors(resolved):
                why = f"no heading #{anchor} in {os.path.relpath(resolved, ROOT)}"
        if verbose:
            print(f"  {md}:{number}: {target} {'ok' if why is None else 'BROKEN: ' + why}")
        if why:
            broken.append((number, target, why))
    return checked, broken


def main():
    verbose = "-v" in sys.argv[1:]
    total, failures = 0, []
    files = markdown_files()
    for md in files:
        checked, broken = check(md, verbose)
        total += checked
        print(f"{md}: {checked} relative links, {len(broken)} broken")
        failures += [(md, *b) for b in broken]
    print(f"checked {total} relative links in {len(files)} Markdown files")
    for md, number, target, why in failures:
        print(f"BROKEN {md}:{number}: ({target}): {why}")
    if failures:
        print(f"{len(failures)} broken links")
        return 1
    print("all relative links resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
