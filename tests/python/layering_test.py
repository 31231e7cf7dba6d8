#!/usr/bin/env python3
"""The folder tree is the architecture: every #include "..." in the C++ sources points down the
layers README.md's "Layout" table lists, never up or sideways.

Layers (each may include itself and those listed for it):
  core/base                 nothing of eldr's
  core (the method)         core/base
  core/membership           core/base
  core/formats              core/base, core
  core/sim                  core/base, core, core/formats, core/membership (the routers' load
                            exchange it models: peer_estimate)
  storage                   core/base, core, core/formats, core/membership
  cluster                   the above and cluster (the edge)
  actors                    the above and actors
  tools, bench, tests       anything

Every source folder is also named in that table, so the table and the tree cannot drift apart.
A failure names the file, the line and the include that breaks the order, so that a move or a
new include that would tangle the tree is caught where it is written.
"""
import os
import re
import sys

sys.dont_write_bytecode = True
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))

CORE_NODE = {'core/base', 'core', 'core/formats', 'core/membership'}
ALLOWED = {
    'core/base': {'core/base'},
    'core': {'core/base', 'core'},
    'core/membership': {'core/base', 'core/membership'},
    'core/formats': {'core/base', 'core', 'core/formats'},
    'core/sim': {'core/base', 'core', 'core/formats', 'core/membership', 'core/sim'},
    'storage': CORE_NODE | {'storage'},
    'cluster': CORE_NODE | {'storage', 'cluster'},
    'actors': CORE_NODE | {'storage', 'cluster', 'actors'},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def room(path):
    """The layer a repository path belongs to (None: tools, bench, tests, generated)."""
    parts = path.split('/')
    if parts[0] == 'core':
        if len(parts) > 2 and parts[1] in ('base', 'formats', 'membership', 'sim'):
            return 'core/' + parts[1]
        return 'core'
    if parts[0] in ('storage', 'cluster', 'actors'):
        return parts[0]
    return None


def violations():
    found = []
    for top in ('core', 'storage', 'cluster', 'actors'):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for name in sorted(names):
                if not name.endswith(('.cpp', '.hpp')):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), ROOT)
                own = room(path)
                with open(os.path.join(ROOT, path), encoding='utf-8') as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if '/' not in target:
                            found.append(f'{path}:{number}: "{target}" has no folder '
                                         '(include from the repository root)')
                            continue
                        other = room(target)
                        if other is None:
                            # A generated header (actors/operator_page_html.hpp) or a tool's.
                            if not os.path.exists(os.path.join(ROOT, target)):
                                continue
                            found.append(f'{path}:{number}: "{target}" is outside the layers')
                        elif other not in ALLOWED[own]:
                            found.append(f'{path}:{number}: {own} must not include "{target}" '
                                         f'({other})')
    return found


def unlisted_folders():
    """Source folders README.md's "Layout" table does not name (as `core/sim/` in the folder
    column, or as `sim/` inside its parent's row): the table must describe the tree there is."""
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        text = f.read()
    start = text.index('## Layout')
    layout = text[start:text.index('\n## ', start + 1)]
    missing = []
    for top in ('core', 'storage', 'cluster', 'actors', 'tools'):
        for dirpath, dirnames, names in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != '__pycache__']
            path = os.path.relpath(dirpath, ROOT)
            depth = path.count('/')
            if depth > 1 or (top == 'tools' and depth == 1 and path != 'tools/common'):
                continue  # programs' own folders and deeper levels are their rows' business
            if not any(n.endswith(('.cpp', '.hpp', '.py')) for n in names):
                continue
            leaf = path.split('/')[-1]
            parent_row = f'| `{path.split("/")[0]}/` |'
            named = f'`{path}/`' in layout
            if not named and depth == 1:
                row = next((line for line in layout.splitlines() if line.startswith(parent_row)), '')
                named = f'`{leaf}/`' in row
            if not named:
                missing.append(path)
    return missing


def main():
    # The checker itself: a room it cannot place would pass everything.
    assert room('core/base/status.hpp') == 'core/base'
    assert room('core/signature.hpp') == 'core'
    assert room('core/sim/simulator.hpp') == 'core/sim'
    assert room('cluster/wire/route_protocol.hpp') == 'cluster'
    assert 'core/sim' not in ALLOWED['actors']
    found = violations()
    found += [f'{p}/: not in README.md\'s "Layout" table' for p in unlisted_folders()]
    for v in found:
        print(v)
    if found:
        print(f'layering: {len(found)} problem(s): includes against the layers, or folders '
              'the table misses')
        return 1
    print('layering: every include points down the layers')
    return 0


if __name__ == '__main__':
    sys.exit(main())
