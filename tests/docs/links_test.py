#!/usr/bin/python3
"""The documentation holds together: every relative link in README.md and
docs/ resolves (the file exists, and a #fragment names a heading of it),
README.md links every page of docs/, nothing points outside the
repository, and the front door and the performance page keep their size
(README.md at most 400 lines, docs/performance.md at most 150,
docs/design/kernels.md at most 250).

Usage: links_test.py --source DIR
"""

import argparse
import json
import os
import re
import sys

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def check_links(source, pages, failures):
    """Every relative link of `pages` resolves inside the repository, a
    #fragment to a heading of its page. The number of links."""
    links = 0
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        name = os.path.relpath(page, source)
        if "../shared" in text or "numerics.md" in text:
            failures.append(f"{name} points outside the repository "
                            f"(../shared, numerics.md)")
        for target in LINK.findall(FENCE.sub("", text)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto: ...
            links += 1
            path, _, fragment = target.partition("#")
            resolved = (os.path.normpath(os.path.join(os.path.dirname(page),
                                                      path))
                        if path else page)
            if not resolved.startswith(source + os.sep):
                failures.append(f"{name}: {target} leaves the repository")
            elif not os.path.exists(resolved):
                failures.append(f"{name}: {target} does not exist")
            elif fragment and resolved.endswith(".md") and \
                    fragment not in anchors(resolved):
                failures.append(f"{name}: {target}: no heading "
                                f"#{fragment} in {os.path.relpath(resolved, source)}")
    return links


def check_readme_and_sizes(source, docs, pages, failures):
    """README.md links every page, and the pages kept short are."""
    with open(pages[0], encoding="utf-8") as f:
        readme = f.read()
    for page in pages[1:]:
        if f"({os.path.relpath(page, source)})" not in readme:
            failures.append(f"README.md does not link "
                            f"{os.path.relpath(page, source)}")
    for page, limit in ((pages[0], 400),
                        (os.path.join(docs, "performance.md"), 150),
                        (os.path.join(docs, "design", "kernels.md"), 250)):
        with open(page, encoding="utf-8") as f:
            count = len(f.read().splitlines())
        if count > limit:
            failures.append(f"{os.path.relpath(page, source)} has {count} "
                            f"lines (at most {limit})")


def check_numbers(source, docs, failures):
    """Numbers the docs state about the suite are the suite's own, read from
    its sources: counts, thread and request numbers, fuzz seconds, the
    tests left out under qemu, the bad-input table's rows."""
    # (page, phrase with {}, file, regex of the number).
    claims = [
        ("testing.md", "`pytorch_crosscheck` ({} random cases",
         "tests/e2e/pytorch_crosscheck.py", r'"--cases", type=int, default=(\d+)'),
        ("testing.md", "`concurrency_test` ({} threads",
         "tests/e2e/concurrency_test.cc", r"kThreads = (\d+);"),
        ("testing.md", "threads × {} mixed requests",
         "tests/e2e/concurrency_test.cc", r"kRequestsPerThread = (\d+);"),
        ("testing.md", "for `FUZZ_SECONDS`, {} s", "Makefile",
         r"FUZZ_SECONDS \?= (\d+)"),
        ("reliability.md", "(25 s in `make test`)".replace("25", "{}"),
         "Makefile", r"FUZZ_SECONDS \?= (\d+)"),
    ]
    for page, phrase, source_file, pattern in claims:
        with open(os.path.join(source, source_file), encoding="utf-8") as f:
            found = re.search(pattern, f.read())
        with open(os.path.join(docs, page), encoding="utf-8") as f:
            text = f.read()
        if found is None:
            failures.append(f"{source_file}: no {pattern!r} to check {page}")
        elif phrase.format(found.group(1)) not in text:
            failures.append(f"docs/{page} does not say "
                            f"{phrase.format(found.group(1))!r} "
                            f"({source_file})")
    # The x86-only tests of the ARM64 stage: as many as the list holds.
    with open(os.path.join(source, "tests", "core", "CMakeLists.txt"),
              encoding="utf-8") as f:
        skip = re.search(r'ARM64_SKIP_TESTS "([^"]*)"', f.read())
    words = dict(enumerate(
        "zero one two three four five six seven eight nine ten eleven "
        "twelve thirteen fourteen fifteen".split()))
    count = len(skip.group(1).split(":")) if skip else 0
    with open(os.path.join(docs, "testing.md"), encoding="utf-8") as f:
        if f"so {words.get(count, count)} of the slowest" not in f.read():
            failures.append(f"docs/testing.md does not say {count} tests "
                            f"are left out under qemu (ARM64_SKIP_TESTS)")
    # The bad-input table's rows.
    with open(os.path.join(source, "tests", "e2e", "bad_inputs.json"),
              encoding="utf-8") as f:
        rows = len(json.load(f)["rows"])
    with open(os.path.join(docs, "reliability.md"), encoding="utf-8") as f:
        reliability = f.read()
    if f"bad_inputs.json` lists {rows} such requests" not in reliability:
        failures.append(f"docs/reliability.md does not say that "
                        f"bad_inputs.json lists {rows} requests")


def check_alerts(source, docs, failures):
    """Every alert rule is in docs/deploy.md's alert table."""
    with open(os.path.join(source, "deploy", "prometheus", "alerts.yml"),
              encoding="utf-8") as f:
        alerts = re.findall(r"^\s*- alert: (\w+)", f.read(), re.M)
    with open(os.path.join(docs, "deploy.md"), encoding="utf-8") as f:
        deploy = f.read()
    for alert in alerts:
        if f"| `{alert}` |" not in deploy:
            failures.append(f"docs/deploy.md's alert table lacks {alert}")
    if not alerts:
        failures.append("no alert found in deploy/prometheus/alerts.yml")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True)
    source = os.path.abspath(parser.parse_args().source)
    docs = os.path.join(source, "docs")
    pages = [os.path.join(source, "README.md")] + sorted(
        os.path.join(directory, name)
        for directory in (docs, os.path.join(docs, "design"))
        for name in os.listdir(directory) if name.endswith(".md"))
    failures = []
    links = check_links(source, pages, failures)
    check_readme_and_sizes(source, docs, pages, failures)
    check_numbers(source, docs, failures)
    check_alerts(source, docs, failures)
    for failure in failures:
        print("FAIL", failure)
    print(f"{len(pages)} pages, {links} relative links, "
          f"{len(failures)} failures")
    return 1 if failures or links == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
