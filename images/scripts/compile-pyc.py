#!/usr/bin/env python3
"""Build-time: write the .pyc of every .py under a directory, the same bytes on every build.

    python3 -I -S compile-pyc.py DIR

Why not pip's own compilation: marshal marks a string as interned, and an object as shared
(FLAG_REF), from the compiling process's state, not from the source. pip compiles inside a
process whose history (wheel scanning, hashing, install order) a build does not control, so
a rebuild could give other .pyc bytes for identical sources: measured, 36 of sglang's 4001
.pyc files differed when compiled in a fresh process. Here one fresh process (-I -S: no site
hooks, no environment) compiles the files in sorted path order, so the history is the same on
every build. Checked-hash .pyc: no source mtimes in them, and Python still revalidates them.

A file this Python cannot parse (a test fixture written for a newer Python, say) is skipped
and counted, as pip does; any other error fails the build.
"""

import os
import py_compile
import sys
import warnings
from pathlib import Path


def main() -> int:
    root = Path(sys.argv[1])
    # Other projects' questionable escapes and literals are theirs to fix, not this log's.
    warnings.simplefilter("ignore", SyntaxWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    compiled, skipped = 0, []
    for source in sorted(root.rglob("*.py")):
        try:
            py_compile.compile(str(source), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        except py_compile.PyCompileError as exc:
            if not isinstance(exc.exc_value, SyntaxError):
                raise
            skipped.append(str(source.relative_to(root)))
        else:
            compiled += 1
    # Read after compiling: an import before it would change the process's history.
    python = f"{os.uname().machine} Python {sys.version.split()[0]}"
    print(f"compile-pyc: {compiled} files compiled under {root} by {python}; {len(skipped)} skipped (syntax "
          f"this Python does not parse){': ' + ', '.join(skipped[:5]) if skipped else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
