#!/usr/bin/env python3
"""A sysfs tree as one text file (the format of fixtures/sysfs/*, described in its README).

Usage:
  sysfsdump.py dump DIR FILE     write the tree under DIR (files, symlinks, empty folders) to FILE
  sysfsdump.py undump FILE DIR   recreate the tree of FILE under DIR (which must not exist)

The format, line by line (a line ends with "\\n"):
  # tap sysfs dump 1              the first line, always
  file PATH                       a regular file; its content follows as lines "|TEXT", each
  |TEXT                           standing for TEXT plus a newline; when the file does not end
  \\ no newline at end of file     with a newline, this line follows its last "|" line
  link PATH -> TARGET             a symlink (TARGET verbatim, usually relative)
  dir PATH                        an empty folder (others are implied by what is inside them)
PATH is relative to the tree's root, "/"-separated. Entries are in the order of their paths'
bytes. Lines starting with "#" between entries are comments. Content must be UTF-8 (sysfs text).
make-sysfs.py writes dumps through `Tree`; the engine reads them (engine/src/sysfs/dump.rs).
"""
import os
import sys

MAGIC = "# tap sysfs dump 1"
NO_EOL = "\\ no newline at end of file"


class Tree:
    """A tree in memory: files (path -> text), links (path -> target), empty folders."""

    def __init__(self):
        self.files, self.links, self.dirs = {}, {}, set()

    def write(self, path, text):
        self.files[path] = text

    def symlink(self, target, path):
        self.links[path] = target

    def lexists(self, path):
        return path in self.files or path in self.links

    def dumps(self):
        entries = [(p, "file") for p in self.files]
        entries += [(p, "link") for p in self.links] + [(p, "dir") for p in self.dirs]
        out = [MAGIC]
        for path, kind in sorted(entries, key=lambda e: e[0].encode()):
            check_path(path)
            if kind == "link":
                out.append(f"link {path} -> {self.links[path]}")
            elif kind == "dir":
                out.append(f"dir {path}")
            else:
                out.append(f"file {path}")
                text = self.files[path]
                if "\r" in text:
                    # Python's and Rust's line splitting agree on "\n" only; keep it simple.
                    raise ValueError(f"{path}: carriage return in content")
                if text:
                    lines = text.split("\n")
                    if text.endswith("\n"):
                        lines.pop()
                    out.extend("|" + line for line in lines)
                    if not text.endswith("\n"):
                        out.append(NO_EOL)
        return "\n".join(out) + "\n"

    def save(self, file):
        with open(file, "w", encoding="utf-8", newline="\n") as f:
            f.write(self.dumps())


def check_path(path):
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts) or " -> " in path or "\n" in path:
        raise ValueError(f"not a relative path this format can hold: {path!r}")


def loads(text):
    """Parses a dump into a Tree; ValueError names the line."""
    lines = text.split("\n")
    if lines[-1] != "":
        raise ValueError("the dump does not end with a newline")
    lines.pop()
    if not lines or lines[0] != MAGIC:
        raise ValueError(f"line 1: not {MAGIC!r}")
    t, seen, cur = Tree(), set(), None
    for n, line in enumerate(lines[1:], start=2):
        if line.startswith("|") and cur is not None:
            t.files[cur] += line[1:] + "\n"
            continue
        if line == NO_EOL and cur is not None and t.files[cur]:
            t.files[cur] = t.files[cur][:-1]
            cur = None
            continue
        cur = None
        if line == "" or line.startswith("#"):
            continue
        kind, _, rest = line.partition(" ")
        if kind == "link":
            path, sep, target = rest.partition(" -> ")
            if not sep:
                raise ValueError(f"line {n}: link without ' -> '")
        elif kind in ("file", "dir"):
            path = rest
        else:
            raise ValueError(f"line {n}: unexpected {line[:40]!r}")
        check_path(path)
        if path in seen:
            raise ValueError(f"line {n}: {path} twice")
        parts = path.split("/")
        for i in range(1, len(parts)):
            if t.lexists("/".join(parts[:i])):
                raise ValueError(f"line {n}: {path} is under a file or a link")
        seen.add(path)
        if kind == "file":
            t.files[path], cur = "", path
        elif kind == "link":
            t.links[path] = target
        else:
            t.dirs.add(path)
    return t


def read_dir(root):
    """The tree under root, symlinks not followed."""
    t = Tree()
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root).replace(os.sep, "/")
        rel = "" if rel == "." else rel + "/"
        if not dirs and not files and rel:
            t.dirs.add(rel[:-1])
        for name in dirs + files:
            p = os.path.join(d, name)
            if os.path.islink(p):
                t.links[rel + name] = os.readlink(p)
            elif name in files:
                with open(p, "rb") as f:
                    data = f.read()
                try:
                    t.files[rel + name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"{p}: not UTF-8 text")
    return t


def write_dir(t, root):
    """Writes the tree under root (which must not exist)."""
    os.makedirs(root)
    for path in sorted(t.dirs):
        os.makedirs(os.path.join(root, path), exist_ok=True)
    for path, text in t.files.items():
        p = os.path.join(root, path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    for path, target in t.links.items():
        p = os.path.join(root, path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.symlink(target, p)


def main(argv):
    if len(argv) == 3 and argv[0] == "dump":
        t = read_dir(argv[1])
        t.save(argv[2])
        print(f"{argv[2]}: {len(t.files)} files, {len(t.links)} symlinks, {len(t.dirs)} empty folders")
    elif len(argv) == 3 and argv[0] == "undump":
        with open(argv[1], encoding="utf-8", newline="") as f:
            t = loads(f.read())
        write_dir(t, argv[2])
        print(f"{argv[2]}: {len(t.files)} files, {len(t.links)} symlinks, {len(t.dirs)} empty folders")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
