#!/usr/bin/env python3
"""The control plane's components and the calls between them.

    scripts/components.py CONTROL_SRC_DIR [--print]

A component is a struct of the control plane that holds a store bundle
(`store: Arc<dyn …Store>`). The import check (`import_circles.py`) sees `use crate::`
paths; it does not see `self.scheduler.spec_of(..)`, a call from one component into
another. This check does, and holds the picture DESIGN.md draws:

- every component keeps its state in private fields (none is `pub` or `pub(crate)`);
- no component but `Control` (the façade) holds the whole `Store`: each holds the bundle
  of store traits it needs;
- the components a component holds, and calls, form no circle: a component reaches
  another only through a field of that component's type, so the fields are the
  dependency picture, and every `self.<field>.<method>(` call is counted against it;
- no struct beside a lock (`Mutex`, `RwLock`, `Semaphore`, an atomic) has a `pub` or
  `pub(crate)` field: state behind a lock is changed through its owner's methods;
- `Control::with_store` (a reconcile pass's control plane, on the store fenced by the
  scheduler lease) rebuilds every component with its own `with_store`, so that no write
  of a pass reaches the unfenced store through a component kept as it was.

With `--print` it prints each component, its store bundle and the components it calls
(with the methods called), the picture `docs/architecture.md` describes. Exits 1 on a
violation, naming the file and the field or call.
"""
import os, re, sys

LOCKS = re.compile(r'\b(Mutex|RwLock|Semaphore|Atomic[A-Z][a-z0-9]*|Notify)\b')


def strip(text):
    text = re.sub(r'#\[cfg\((?:all\()?test\b[^\]]*\]\s*mod tests \{.*', '', text, flags=re.S)
    return re.sub(r'//[^\n]*', '', text)


def structs(text):
    """(name, body) of every braced struct."""
    for m in re.finditer(r'^(?:pub(?:\([a-z]+\))? )?struct (\w+)(?:<[^>{]*>)? \{', text, re.M):
        depth, i = 1, m.end()
        while depth:
            c = text[i]
            depth += c == '{'
            depth -= c == '}'
            i += 1
        yield m.group(1), text[m.end():i - 1]


def fields(body):
    """(visibility, name, type) of a struct body's fields."""
    out = []
    for m in re.finditer(r'^\s*(pub(?:\([a-z:]+\))?\s+)?([a-z_][a-z0-9_]*)\s*:\s*([^\n]+?),?\s*$', body, re.M):
        out.append(((m.group(1) or '').strip(), m.group(2), m.group(3)))
    return out


def main():
    root = sys.argv[1]
    show = '--print' in sys.argv
    files = {}
    for d, _, fs in os.walk(root):
        if 'bin' in d.split(os.sep):
            continue
        for f in fs:
            if f.endswith('.rs'):
                p = os.path.join(d, f)
                files[p] = strip(open(p).read())
    components = {}  # name -> (file, {field: type}, store bundle)
    problems = []
    for p, text in files.items():
        for name, body in structs(text):
            fs = fields(body)
            store = [t for _, n, t in fs if n == 'store' and 'Arc<dyn' in t]
            if store:
                bundle = re.search(r'dyn\s+([\w:]+)', store[0]).group(1).split('::')[-1]
                components[name] = (p, {n: t for _, n, t in fs}, bundle)
                for vis, n, _ in fs:
                    if vis and name != 'Control':
                        problems.append(f'{p}: component {name} has a {vis} field `{n}`')
                if bundle == 'Store' and name != 'Control':
                    problems.append(f'{p}: component {name} holds the whole Store; give it a bundle of the traits it needs')
            if any(LOCKS.search(t) for _, _, t in fs):
                for vis, n, _ in fs:
                    if vis in ('pub', 'pub(crate)'):
                        problems.append(f'{p}: struct {name} has a {vis} field `{n}` beside a lock')
    # the edges: component fields of component types, and the calls made through them
    edges = {c: {} for c in components}
    for c, (p, fs, _) in components.items():
        for n, t in fs.items():
            for other in components:
                if other != c and re.search(r'\b%s\b' % other, t):
                    edges[c][other] = set()
                    for q, text in files.items():
                        # the impl blocks of c, wherever they are
                        for m in re.finditer(r'^impl %s \{' % c, text, re.M):
                            body = text[m.end():text.find('\n}\n', m.end())]
                            edges[c][other] |= set(re.findall(r'self\s*\.%s\s*\.\s*(\w+)\s*\(' % n, body))
                            edges[c][other] |= set(re.findall(r'self\s*\.%s\(\)\s*\.\s*(\w+)\s*\(' % n, body))
    # a pass's control plane: every component rebuilt on the fenced store
    for p, text in files.items():
        m = re.search(r'fn with_store\(&self, store: Arc<dyn Store>\) -> Control \{', text)
        if not m:
            continue
        body = text[m.end():text.find('\n    }\n', m.end())]
        held = [n for n, ty in components['Control'][1].items() if ty in components]
        for field in held:
            bound = re.search(r'let %s\s*=\s*([^;]*);' % field, body, re.S)
            given = re.search(r'\b%s: ([^,]*),' % field, body)
            how = (bound.group(1) if bound else '') + (given.group(1) if given else '')
            if 'with_store' not in how:
                problems.append(f'{p}: Control::with_store keeps `{field}` as it was; rebuild it with its with_store')
    # circles
    seen, stack = set(), []

    def visit(v):
        if v in stack:
            problems.append('components call each other in a circle: ' + ' -> '.join(stack[stack.index(v):] + [v]))
            return
        if v in seen:
            return
        stack.append(v)
        for w in edges[v]:
            visit(w)
        stack.pop()
        seen.add(v)

    for v in sorted(edges):
        visit(v)
    if show:
        for c in sorted(components):
            p, _, bundle = components[c]
            print(f'{c} ({os.path.relpath(p, root)}): store {bundle}')
            for other, calls in sorted(edges[c].items()):
                print(f'    -> {other}: {", ".join(sorted(calls)) or "(held)"}')
    for pr in problems:
        print(pr)
    return 1 if problems else 0


sys.exit(main())
