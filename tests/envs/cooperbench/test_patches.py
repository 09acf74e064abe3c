"""Patch parsing: sections, paths, upstream's test-file rule, and path safety."""

from __future__ import annotations

import os

from simpop.envs.cooperbench.patches import file_changes, is_test_path, strip_test_files, touched_paths, unsafe_paths

CODE = """diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,2 +1,2 @@
 a
--- a line removed whose text starts with two dashes
+++ an added line that looks like a header
"""
TEST = """diff --git a/tests/test_mod.py b/tests/test_mod.py
--- a/tests/test_mod.py
+++ b/tests/test_mod.py
@@ -1 +1 @@
-x
+y
"""


def _new_file(path: str, body: str = "+x\n", mode: str = "100644") -> str:
    return f"diff --git a/{path} b/{path}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n{body}"


def test_sections_follow_hunk_counts_not_lookalike_lines():
    changes = file_changes(CODE + TEST)
    assert [c.paths for c in changes] == [["pkg/mod.py"], ["tests/test_mod.py"]]
    assert touched_paths(CODE + TEST) == ["pkg/mod.py", "tests/test_mod.py"]


def test_quoted_and_renamed_paths():
    patch = ('diff --git "a/we\\"ird name.py" "b/we\\"ird name.py"\n'
             "diff --git a/old.py b/new.py\nsimilarity index 100%\nrename from old.py\nrename to new.py\n")
    assert touched_paths(patch) == ['we"ird name.py', "old.py", "new.py"]


def test_upstream_test_file_rule():
    for path in ("tests/test_x.py", "pkg/tests/helpers.py", "test_x.py", "x_test.go", "a/b.spec.ts",
                 "src/FooTest.java", "tests.py", "pkg/testdata/f.txt"):
        assert is_test_path(path), path
    for path in ("pkg/testing.py", "pkg/contest.py", "latest/x.py"):
        assert not is_test_path(path), path
    assert strip_test_files(CODE + TEST) == CODE
    assert strip_test_files(TEST) == ""


def test_unsafe_paths_are_named():
    assert unsafe_paths(CODE) == []
    for patch in (_new_file("../evil.py"), _new_file("/etc/evil"), _new_file("pkg/../../evil.py"),
                  _new_file(".git/hooks/post-checkout"), _new_file("link", "+../../etc\n", mode="120000"),
                  _new_file("link", "+/etc/passwd\n", mode="120000")):
        assert unsafe_paths(patch), patch
    assert unsafe_paths(_new_file("pkg/link", "+../README.md\n", mode="120000")) == []


def test_paths_through_an_escaping_symlink_are_unsafe(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(tmp_path, repo / "outside")
    os.symlink(repo, repo / "inside")
    assert unsafe_paths(_new_file("outside/evil.py"), repo)
    assert unsafe_paths(_new_file("inside/ok.py"), repo) == []
