#!/usr/bin/env python3
"""Import circles between the files of one crate.

    scripts/import_circles.py CRATE_SRC_DIR...

Reads every `crate::module` path a file names (outside comments and its test module; the
crate root aside) and prints each group of files that name each other in a circle. Exits 1
when there is one. `scripts/test.sh` runs it on the crates that have none, so none comes
back.
"""
import os, re, sys
def circles(root):
    files = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith('.rs') and 'bin' not in d.split(os.sep):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, root)[:-3]
                mod = rel.replace(os.sep, '::')
                if mod.endswith('::mod'): mod = mod[:-5]
                if mod in ('lib', 'main'): continue
                files[mod] = open(p).read()
    graph = {m: set() for m in files}
    for m, text in files.items():
        # its test module: `#[cfg(test)]`, or `#[cfg(all(test, ...))]` for feature-gated tests
        text = re.sub(r'#\[cfg\((?:all\()?test\b[^\]]*\]\s*mod tests \{.*', '', text, flags=re.S)
        text = re.sub(r'//.*', '', text)
        for ref in re.findall(r'crate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)', text):
            parts = ref.split('::')
            for k in range(len(parts), 0, -1):
                cand = '::'.join(parts[:k])
                if cand in files and cand != m and not m.startswith(cand + '::') :
                    graph[m].add(cand); break
    # Tarjan
    index, low, st, on, out, i = {}, {}, [], set(), [], [0]
    def sc(v):
        index[v] = low[v] = i[0]; i[0] += 1; st.append(v); on.add(v)
        for w in graph[v]:
            if w not in index: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index: sc(v)
    return out

found = False
for root in sys.argv[1:]:
    for c in circles(root):
        print(f'{root}: circle:', ' '.join(c))
        found = True
sys.exit(1 if found else 0)
