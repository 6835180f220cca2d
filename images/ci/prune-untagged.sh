#!/usr/bin/env bash
# prune-untagged.sh PACKAGE KEEP: delete the untagged versions of a GHCR container package
# of this repository's owner, newest KEEP kept. For the layer cache: each export re-tags
# <package>:<variant> and leaves the previous cache manifest untagged, ~10 GB of layers per
# variant that nothing references. Not for image packages: an image index's platform and
# attestation manifests are untagged versions that its tag still needs.
#
# Needs GH_TOKEN with packages: write and GITHUB_REPOSITORY_OWNER (GitHub Actions sets it).
# REST API: "List package versions for a package owned by an organization/user" and
# "Delete package version ..." (docs.github.com/en/rest/packages/packages).
set -euo pipefail

package=$1
keep=${2:-1}
owner=$GITHUB_REPOSITORY_OWNER
if [ "$(gh api "users/$owner" --jq .type)" = Organization ]; then
    base="orgs/$owner/packages/container/$package/versions"
else
    base="users/$owner/packages/container/$package/versions"
fi
# Newest first (the API's order); untagged only; all but the newest $keep.
mapfile -t old < <(gh api --paginate "$base" \
    --jq '.[] | select((.metadata.container.tags | length) == 0) | .id' | tail -n +"$((keep + 1))")
for id in "${old[@]}"; do
    gh api --method DELETE "$base/$id" --silent
done
echo "prune-untagged: deleted ${#old[@]} untagged versions of $package"
