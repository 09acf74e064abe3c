#!/bin/bash
# The mini set ships its repository as plain files in repo/: copy them and commit them as the base.
set -euo pipefail

REPO_NAME="textkit"

cp -r "$(dirname "$0")/repo" "$REPO_NAME"
cd "$REPO_NAME"
git init -q
git add -A
git commit -qm "base"
echo "Repository location: $(pwd)"
