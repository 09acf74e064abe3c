#!/bin/bash
# Usage: run_tests.sh <repo_path> <tests.patch> [feature.patch]
# Applies the feature patch (if given) and the tests patch to the checkout, then runs the tests.
set -e

REPO_PATH="$1"
TEST_PATCH="$(realpath "$2")"
FEATURE_PATCH="${3:+$(realpath "$3")}"
TEST_FILES="tests/test_calc.py"

cd "$REPO_PATH"
if [ -n "$FEATURE_PATCH" ]; then
    git apply "$FEATURE_PATCH"
fi
git apply "$TEST_PATCH"

export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
python -m pytest -q "$TEST_FILES"
