#!/usr/bin/env bash
# Build the Go backends tf_otel tests and `make demo` run against, once per machine.
#
# Usage: scripts/build_go_tools.sh [jaeger|collector|prometheus|promtool|all]   (default: all)
#        (`make demo` builds jaeger only; `make tools`/`make test` build all three)
#
#   jaeger     Jaeger v2 (cmd/jaeger, in-memory storage, OTLP in, /api/traces out) from the
#              Go module proxy, pinned to JAEGER_MODULE_VERSION below.
#   collector  an OpenTelemetry Collector built with the official builder (ocb) from
#              collector-config/builder-manifest.yaml (exactly the components our configs use).
#   prometheus Prometheus 3 (cmd/prometheus) from the Go module proxy, pinned below: the metrics
#              store of docker-compose.yml, run by tests/test_dashboard.py (OTLP in, PromQL out).
#   promtool   Prometheus's rule checker and rule unit tester (cmd/promtool, the same module and
#              version): tests/test_alerts.py runs `promtool check rules` / `test rules` on
#              deploy/prometheus-alerts.yaml.
#
# Binaries are cached as ${TF_OTEL_CACHE:-~/.cache/tf_otel}/bin/<name>-<version>; a second run
# with the same versions does nothing. The last lines printed are the binary paths:
#   JAEGER_BIN=...   COLLECTOR_BIN=...   PROMETHEUS_BIN=...   PROMTOOL_BIN=...
# Needs Go >= 1.26 (GO=/path/to/go to choose one; default: go on PATH, else /usr/local/go/bin/go).
set -euo pipefail

# --- pinned versions -------------------------------------------------------------------------
# Jaeger tags every release twice on the same commit: v1.x.y (visible to Go) and v2.x.y (ignored
# by Go, as the module path has no /v2). v1.76.0 is the commit of Jaeger v2.13.0, whose cmd/jaeger
# is the v2 binary. Its go.mod has a replace directive, so `go install ...@v1.76.0` refuses it;
# we build inside a copy of the module instead, which honours go.mod/go.sum exactly.
# Not a commit pseudo-version: the module proxy reachable from our build machines serves only
# tagged Jaeger versions (v1.76.0 is the newest v1 tag) and answers 403 to commit / pseudo-version
# queries. Where the full proxy is reachable, a newer release builds the same way:
#   JAEGER_MODULE_VERSION=v1.76.1-0.<yyyymmddhhmmss>-<sha12> JAEGER_RELEASE=v2.x.y
JAEGER_MODULE=github.com/jaegertracing/jaeger
JAEGER_MODULE_VERSION=${JAEGER_MODULE_VERSION:-v1.76.0}
JAEGER_RELEASE=${JAEGER_RELEASE:-v2.13.0}   # the v2 tag on that commit, reported by --version
# The builder (v0.140.0 is not on the module proxy; v0.139.0 generates the same code for the
# v0.140 modules of the manifest, which raise its otelcol requirement by one release).
OCB_VERSION=${OCB_VERSION:-v0.139.0}
OTELCOL_VERSION=${OTELCOL_VERSION:-v0.140.0}   # go.opentelemetry.io/collector/otelcol, as in the manifest
# Prometheus publishes its Go module as v0.<3 digits of minor>.<patch>: v0.316.0 is v3.16.0.
# Built with the tag remove_all_sd (no cloud service discovery; tf_otel's metrics arrive over
# OTLP): the Nomad discovery plugin needs a pseudo-version the module proxy here refuses (403).
# Its web UI is not embedded (the API and /graph's JSON work; docker-compose runs the image).
PROMETHEUS_MODULE_VERSION=${PROMETHEUS_MODULE_VERSION:-v0.316.0}
PROMETHEUS_RELEASE=${PROMETHEUS_RELEASE:-v3.16.0}   # prom/prometheus image tag in docker-compose.yml
# Nothing AGPL-licensed is built here (Loki, Tempo and Grafana are): docs/LICENSES.md.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MANIFEST=$ROOT/collector-config/builder-manifest.yaml
CACHE=${TF_OTEL_CACHE:-$HOME/.cache/tf_otel}
BIN=$CACHE/bin
WORK=$CACHE/build
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}   # never download another toolchain
export CGO_ENABLED=${CGO_ENABLED:-0}

say() { printf '\033[1m[build_go_tools]\033[0m %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$GO" ] || die "Go not found (set GO=/path/to/go; Go >= 1.26 is needed)"
gov=$("$GO" env GOVERSION)   # go1.26.8
minor=$(echo "${gov#go}" | cut -d. -f2)
major=$(echo "${gov#go}" | cut -d. -f1)
{ [ "$major" -gt 1 ] || [ "$minor" -ge 26 ]; } || die "$GO is $gov; Go >= 1.26 is needed"
export PATH="$(dirname "$GO"):$PATH"   # the builder runs the `go` it finds on PATH
mkdir -p "$BIN" "$WORK"

# Hash of the manifest: a changed component list gives a new collector binary name.
manifest_hash() { sha256sum "$MANIFEST" | cut -c1-12; }

build_jaeger() {
  local out=$BIN/jaeger-$JAEGER_RELEASE-$JAEGER_MODULE_VERSION
  if [ -x "$out" ]; then say "jaeger: cached $out"; echo "JAEGER_BIN=$out"; return; fi
  say "jaeger: downloading $JAEGER_MODULE@$JAEGER_MODULE_VERSION from the Go module proxy"
  local dir
  dir=$(cd "$WORK" && "$GO" mod download -json "$JAEGER_MODULE@$JAEGER_MODULE_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || die "jaeger: module download failed"
  local src=$WORK/jaeger-$JAEGER_MODULE_VERSION
  rm -rf "$src" && cp -r "$dir" "$src" && chmod -R u+w "$src"
  say "jaeger: building cmd/jaeger ($JAEGER_RELEASE; takes several minutes on 2 cores)"
  local t0=$SECONDS vpkg=$JAEGER_MODULE/internal/version
  (cd "$src" && "$GO" build -trimpath -o "$out.tmp" \
    -ldflags "-s -w -X $vpkg.latestVersion=$JAEGER_RELEASE -X $vpkg.commitSHA=$JAEGER_MODULE_VERSION" \
    ./cmd/jaeger)
  mv "$out.tmp" "$out"
  rm -rf "$src"
  say "jaeger: built in $((SECONDS - t0)) s"
  echo "JAEGER_BIN=$out"
}

build_collector() {
  [ -f "$MANIFEST" ] || die "missing $MANIFEST"
  local out=$BIN/otelcol-tf-otel-$OCB_VERSION-$(manifest_hash)
  if [ -x "$out" ]; then say "collector: cached $out"; echo "COLLECTOR_BIN=$out"; return; fi
  local ocb=$BIN/ocb-$OCB_VERSION
  if [ ! -x "$ocb" ]; then
    say "collector: installing the builder go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION"
    GOBIN=$WORK/ocb "$GO" install "go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION"
    mv "$WORK/ocb/builder" "$ocb"
  fi
  local src=$WORK/otelcol-$OCB_VERSION
  rm -rf "$src" && mkdir -p "$src"
  say "collector: generating sources from $MANIFEST"
  local t0=$SECONDS
  # dist.output_path (./_build) is relative to the directory the builder runs in.
  (cd "$src" && "$ocb" --config "$MANIFEST" --skip-get-modules --skip-compilation)
  local dir=$src/_build
  # The builder requires otelcol at its own release; the manifest's modules are one newer.
  sed -i "s#\(go.opentelemetry.io/collector/otelcol\) v[0-9.]*#\1 $OTELCOL_VERSION#" "$dir/go.mod"
  # The manifest's modules (all but the file exporter) are in Jaeger's dependency graph (same
  # collector release): seed go.sum with Jaeger's checked sums, so `go mod tidy` has few
  # checksum-database lookups left.
  local jdir
  jdir=$(cd "$WORK" && "$GO" mod download -json "$JAEGER_MODULE@$JAEGER_MODULE_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  cp "$jdir/go.sum" "$dir/go.sum" && chmod u+w "$dir/go.sum"
  # -e: the file exporter's tests import a contrib encoding extension whose v0.140.1 the module
  # proxy refuses (403); tests are not built, so that import is left unresolved
  (cd "$dir" && "$GO" mod tidy -e)
  say "collector: compiling (takes several minutes on 2 cores)"
  (cd "$dir" && "$GO" build -trimpath -ldflags "-s -w" -o "$out.tmp" .)
  mv "$out.tmp" "$out"
  rm -rf "$src"
  say "collector: built in $((SECONDS - t0)) s"
  echo "COLLECTOR_BIN=$out"
}

# one binary of the Prometheus module (cmd/prometheus or cmd/promtool), cached by release
build_prometheus_cmd() {
  local cmd=$1 var=$2 note=${3:-}
  local out=$BIN/$cmd-$PROMETHEUS_RELEASE
  if [ -x "$out" ]; then say "$cmd: cached $out"; echo "$var=$out"; return; fi
  say "$cmd: building github.com/prometheus/prometheus/cmd/$cmd@$PROMETHEUS_MODULE_VERSION"
  [ -z "$note" ] || say "$cmd: ($note)"
  local t0=$SECONDS vpkg=github.com/prometheus/common/version
  rm -rf "${WORK:?}/$cmd"
  GOBIN=$WORK/$cmd "$GO" install -tags remove_all_sd -trimpath \
    -ldflags "-s -w -X $vpkg.Version=${PROMETHEUS_RELEASE#v} -X $vpkg.Revision=$PROMETHEUS_MODULE_VERSION" \
    "github.com/prometheus/prometheus/cmd/$cmd@$PROMETHEUS_MODULE_VERSION"
  mv "$WORK/$cmd/$cmd" "$out"
  rm -rf "${WORK:?}/$cmd"
  say "$cmd: built in $((SECONDS - t0)) s"
  echo "$var=$out"
}

build_prometheus() {
  build_prometheus_cmd prometheus PROMETHEUS_BIN "$PROMETHEUS_RELEASE; takes several minutes on 2 cores"
}

build_promtool() { build_prometheus_cmd promtool PROMTOOL_BIN; }

case "${1:-all}" in
  jaeger) build_jaeger ;;
  collector) build_collector ;;
  prometheus) build_prometheus ;;
  promtool) build_promtool ;;
  all) build_jaeger; build_collector; build_prometheus; build_promtool ;;
  *) die "unknown target '$1' (use jaeger, collector, prometheus, promtool or all)" ;;
esac
