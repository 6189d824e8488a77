#!/usr/bin/env python3
"""Functions longer than a limit (100 lines unless LIMIT says), outside test modules.

    scripts/long_functions.py CRATE_SRC_DIR...

Counts each `fn` from its name to its closing brace (comments and strings blanked first,
so braces in them do not count). Prints each one over the limit, longest first, and exits
1 when there is one. `scripts/test.sh` runs it on the crates kept within the limit, so a
function that grows past it is split into named steps before it lands.
"""
import os, re, sys
LIMIT = int(os.environ.get('LIMIT', '100'))
def strip(text):
    # blank out comments, strings and char literals, keeping newlines and length
    out = []; i = 0; n = len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i) + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == 'r' and re.match(r'r#*"', text[i:i+10]) and (i == 0 or not (text[i-1].isalnum() or text[i-1]=='_')):
            m = re.match(r'r(#*)"', text[i:]); hashes = m.group(1)
            j = text.find('"' + hashes, i + len(m.group(0))) + 1 + len(hashes)
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            j += 1
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == "'":
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:])
            if m:
                out.append(' ' * len(m.group(0))); i += len(m.group(0))
            else:
                out.append(c); i += 1
        else:
            out.append(c); i += 1
    return ''.join(out)
res = []
for root in sys.argv[1:]:
    for d, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith('.rs') or f == 'tests.rs': continue
            p = os.path.join(d, f)
            t = strip(open(p).read())
            m = re.search(r'#\[cfg\((?:all\()?test\b[^\]]*\]\s*mod tests', t)
            if m: t = t[:m.start()]
            for fm in re.finditer(r'\bfn\s+([A-Za-z_][A-Za-z0-9_]*)', t):
                # find the body's opening brace (skip a declaration ending in ';')
                j = fm.end(); depth = 0
                while j < len(t) and not (t[j] == '{' and depth == 0) and not (t[j] == ';' and depth == 0):
                    if t[j] in '(<[': depth += 1
                    elif t[j] in ')>]': depth -= 1 if t[j] != '>' or t[j-1] != '-' else 0
                    j += 1
                if j >= len(t) or t[j] == ';': continue
                k = j; depth = 0
                while True:
                    if t[k] == '{': depth += 1
                    elif t[k] == '}':
                        depth -= 1
                        if depth == 0: break
                    k += 1
                start = t.count('\n', 0, fm.start()) + 1
                lines = t.count('\n', fm.start(), k) + 1
                if lines > LIMIT: res.append((lines, p, start, fm.group(1)))
for r in sorted(res, reverse=True): print(f'{r[0]:5} {r[1]}:{r[2]} {r[3]}')
sys.exit(1 if res else 0)
