"""Commit subjects of at most 72 characters, the story in the body (issue 29).

Checks every commit reachable from HEAD that the rule's first commit (RULE_SINCE, main when the
rule was made) does not reach: the commits of the branch being tested and of everything merged
since. Older history keeps its long subjects. Needs the history (a clean clone has it; a shallow
one is told to fetch it). Run from the repository root: python .ci/commit_subjects.py
"""
from __future__ import annotations

import subprocess
import sys

RULE_SINCE = "d46113e9b4ba1ae56d898b736f088a592e83fc3a"
LIMIT = 72


def main() -> int:
    known = subprocess.run(["git", "cat-file", "-e", f"{RULE_SINCE}^{{commit}}"],
                           capture_output=True)
    if known.returncode != 0:
        print(f"commit_subjects: commit {RULE_SINCE[:12]} is not in this clone's history "
              "(a shallow clone?): `git fetch --unshallow`, then run this again", file=sys.stderr)
        return 2
    log = subprocess.run(["git", "log", "--format=%h %s", f"{RULE_SINCE}..HEAD"],
                         capture_output=True, text=True, check=True).stdout
    long = [line for line in log.splitlines() if len(line.split(" ", 1)[1]) > LIMIT]
    for line in long:
        commit, subject = line.split(" ", 1)
        print(f"commit {commit}: subject of {len(subject)} characters (at most {LIMIT}): "
              f"{subject[:100]}", file=sys.stderr)
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
