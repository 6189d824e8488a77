#!/usr/bin/env python3
"""Every module a crate root declares is named in its documentation's layout.

    scripts/layout_check.py CRATE_ROOT.rs...

A newcomer reads a crate from its root: each `mod name;` there must appear in the root's
`//!` documentation as `` `name` `` or `` [`name`] ``, with a line on what it holds. Prints
each module left out and exits 1 when there is one. `scripts/test.sh` runs it on every
crate.
"""
import re, sys

missing = []
for root in sys.argv[1:]:
    text = open(root).read()
    docs = '\n'.join(l for l in text.splitlines() if l.startswith('//!'))
    for m in re.finditer(r'^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;', text, re.M):
        name = m.group(1)
        if not re.search(r'`' + re.escape(name) + r'`', docs):
            missing.append(f'{root}: module `{name}` is not in the crate documentation')
for line in missing:
    print(line)
sys.exit(1 if missing else 0)
