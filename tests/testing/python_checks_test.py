#!/usr/bin/python3
"""Every Python test's checks survive `python3 -O`: no `assert` statement in
tests/ (under -O an assert is removed with its expression, so a failed
check passes, and `assert server.start()` would not even start a server).
The tests use their own check()/expect()/require() helpers instead.

Usage: python_checks_test.py --source SOURCE_DIR
"""

import argparse
import ast
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True)
    args = parser.parse_args()
    tests = os.path.join(args.source, "tests")
    found, files = [], 0
    for root, dirs, names in os.walk(tests):
        dirs[:] = [d for d in dirs if d not in ("node_modules", "__pycache__")]
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            files += 1
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            found += [f"{os.path.relpath(path, args.source)}:{node.lineno}"
                      for node in ast.walk(tree)
                      if isinstance(node, ast.Assert)]
    for place in found:
        print("FAIL assert statement (removed by python3 -O):", place)
    print(f"{files} Python files, {len(found)} assert statements")
    return 1 if found or files == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
