#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the code blocks of a Markdown file that are marked as examples into a folder, so that tests compile
the documentation's examples exactly as they are written (no second copy is kept).

A marked block's info string names the file after the language: ```c example=quickstart.c
Usage: extract_examples.py README.md OUTDIR   (prints the files written; fails when there are none, a name
repeats, a name is not a plain file name, or a block is not closed)."""
import os
import re
import sys

FENCE = re.compile(r"^(`{3,})(\S*)(.*)$")
NAME = re.compile(r"(?:^|\s)example=(\S+)")


def extract(markdown_path):
    blocks = {}
    with open(markdown_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, rest = m.group(1), m.group(3)
        start = i + 1
        i = start
        while i < len(lines) and lines[i].rstrip() != fence:
            i += 1
        if i == len(lines):
            sys.exit(f"{markdown_path}:{start}: code block is not closed")
        name = NAME.search(rest)
        if name:
            name = name.group(1)
            if os.path.basename(name) != name or name.startswith("."):
                sys.exit(f"{markdown_path}:{start}: example name '{name}' must be a plain file name")
            if name in blocks:
                sys.exit(f"{markdown_path}:{start}: example '{name}' appears twice")
            blocks[name] = "\n".join(lines[start:i]) + "\n"
        i += 1
    return blocks


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    blocks = extract(sys.argv[1])
    if not blocks:
        sys.exit(f"{sys.argv[1]}: no code block is marked example=NAME")
    os.makedirs(sys.argv[2], exist_ok=True)
    for name, text in blocks.items():
        with open(os.path.join(sys.argv[2], name), "w", encoding="utf-8") as f:
            f.write(text)
        print(os.path.join(sys.argv[2], name))


if __name__ == "__main__":
    main()
