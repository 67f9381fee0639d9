#!/usr/bin/env python3
"""Copy a sysfs fixture whose symlinks were flattened into plain files, restoring the links.

Usage: unflatten-sysfs.py SRC_FIXTURE DST_FIXTURE

Some copies of the fixtures (the project's shared folder) store each symlink as a plain file
holding the link's target, e.g. `devices/system/cpu/cpu0/node0` containing `../../node/node0`.
This copies SRC to DST (which must not exist) and turns every such file back into a relative
symlink. A file is taken for a flattened link when its whole content is one relative path
beginning with `../` (no newline: sysfs values end with one, link targets do not). The script
refuses, and writes nothing more, when such a target is absolute, leaves the fixture, does not
exist, or when following the links could loop (a link whose target is one of its own parent
directories). Afterwards it prints how many files and links it wrote.
"""
import os
import shutil
import sys


def link_target(path):
    """The target a flattened link stands for, or None for an ordinary file."""
    with open(path, "rb") as f:
        data = f.read(4097)
    if not data.startswith(b"../") or len(data) > 4096 or b"\n" in data or b"\0" in data:
        return None
    return data.decode("ascii")


def check_target(root, link, target):
    """Raises unless `target`, relative to `link`'s folder, resolves inside `root` without loops."""
    if os.path.isabs(target):
        raise SystemExit(f"{link}: absolute target {target}")
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    if os.path.commonpath([root, resolved]) != root:
        raise SystemExit(f"{link}: {target} leaves the fixture")
    if not os.path.lexists(resolved):
        raise SystemExit(f"{link}: {target} does not exist in the fixture")
    # A link to one of its own ancestors would make every walk that follows links endless.
    if os.path.commonpath([resolved, link]) == resolved:
        raise SystemExit(f"{link}: {target} is a parent of the link (a loop)")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, dst = (os.path.abspath(a) for a in sys.argv[1:])
    if os.path.lexists(dst):
        raise SystemExit(f"{dst} exists")
    shutil.copytree(src, dst, symlinks=True)
    links = []
    for folder, _, files in os.walk(dst):
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            target = link_target(path)
            if target is not None:
                check_target(dst, path, target)
                links.append((path, target))
    for path, target in links:
        os.remove(path)
        os.symlink(target, path)
    # Every link resolves now (a dangling one means it pointed at another flattened link).
    for path, _ in links:
        if not os.path.exists(path):
            raise SystemExit(f"{path}: dangling after the conversion")
    no_loops(dst, [os.path.realpath(dst)])
    files = sum(
        1 for d, _, names in os.walk(dst) for n in names if not os.path.islink(os.path.join(d, n))
    )
    print(f"{dst}: {files} files, {len(links)} symlinks")


def no_loops(folder, stack):
    """Walks `folder` following links; raises when a link leads back to a folder on `stack`."""
    for entry in os.scandir(folder):
        if not entry.is_dir(follow_symlinks=True):
            continue
        real = os.path.realpath(entry.path)
        if real in stack:
            raise SystemExit(f"{entry.path}: leads back to {real} (a loop)")
        no_loops(entry.path, stack + [real])


if __name__ == "__main__":
    main()
