#!/usr/bin/env bash
# Installs what nri-resize's build, demo and tests need on a fresh Debian 12 (bookworm) machine.
# Idempotent: every step checks first. Never upgrades the system (trixie is pinned low).
# Usage: setup-host.sh [--ebpf]
set -euo pipefail

want_ebpf=0
[[ "${1:-}" == "--ebpf" ]] && want_ebpf=1

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (installs Debian packages, runs containerd)"
command -v apt-get >/dev/null || die "apt-get not found: this script targets Debian 12 (bookworm)"

CACHE=${NRI_RESIZE_CACHE:-/var/cache/nri-resize}
mkdir -p "$CACHE"

apt_updated=0
apt_update() {
  if [[ $apt_updated -eq 0 ]]; then
    log "apt-get update"
    apt-get update -qq -o Acquire::Retries=3 >/dev/null
    apt_updated=1
  fi
}

# 1. trixie source at low priority (only containerd 1.7.24 comes from it), sid for 2.x download only.
if [[ ! -f /etc/apt/sources.list.d/nri-resize-trixie.sources ]]; then
  log "adding Debian trixie apt source at Pin-Priority 100 (for containerd 1.7)"
  cat >/etc/apt/sources.list.d/nri-resize-trixie.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  cat >/etc/apt/preferences.d/nri-resize-trixie <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
  apt_updated=0
fi

need_pkgs=()
for p in protobuf-compiler busybox-static gcc libc6-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
# The VM tier (`cargo xtask vm-test`): QEMU from bookworm (TCG; qboot.rom is in qemu-system-data;
# qemu-system-arm has qemu-system-aarch64 for the arm64 guest),
# xz/zstd to unpack Debian's kernels, e2fsprogs for the guest's /tmp disk.
for p in qemu-system-x86 qemu-system-arm qemu-system-data xz-utils zstd e2fsprogs; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p/bookworm")
done
dpkg -s runc >/dev/null 2>&1 || need_pkgs+=("runc/bookworm")
# `cargo xtask image --push` (skopeo).
dpkg -s skopeo >/dev/null 2>&1 || need_pkgs+=("skopeo/bookworm")
# (No `dpkg -s | grep -q` here: with pipefail, grep's early exit makes dpkg die of SIGPIPE and
# the check fail at random, reinstalling containerd under running tests.)
containerd_version=$(dpkg-query -W -f='${Version}' containerd 2>/dev/null || true)
if [[ $containerd_version != 1.7.* ]]; then
  need_pkgs+=("containerd/trixie")
fi
if [[ ${#need_pkgs[@]} -gt 0 ]]; then
  apt_update
  log "installing ${need_pkgs[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# 2. Packages from sid, unpacked beside the system (never installed), through a private sources
#    list: sid_unpack <dir> <package>... downloads the .debs and extracts them all into <dir>.
sid_unpack() {
  local dest=$1 tmp deb pkg
  shift
  tmp=$(mktemp -d)
  mkdir -p "$tmp/etc/apt/sources.list.d" "$tmp/etc/apt/preferences.d" "$tmp/state/lists/partial" "$tmp/cache/archives/partial"
  cat >"$tmp/etc/apt/sources.list" <<'SRC'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main
SRC
  local opts=(-o Dir::Etc::SourceList="$tmp/etc/apt/sources.list" -o Dir::Etc::SourceParts="$tmp/etc/apt/sources.list.d"
        -o Dir::Etc::Preferences="$tmp/etc/apt/preferences" -o Dir::Etc::PreferencesParts="$tmp/etc/apt/preferences.d"
        -o Dir::State::Lists="$tmp/state/lists" -o Dir::Cache="$tmp/cache" -o Acquire::Retries=3)
  apt-get "${opts[@]}" update -qq >/dev/null
  (cd "$tmp" && apt-get "${opts[@]}" download "$@" 2>/dev/null >/dev/null) || die "could not download $* from sid"
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  : >"$dest.tmp/.deb"
  for pkg in "$@"; do
    deb=$(ls "$tmp"/"$pkg"_*.deb 2>/dev/null | head -1)
    [[ -n "$deb" ]] || die "could not download $pkg from sid"
    dpkg-deb -x "$deb" "$dest.tmp"
    basename "$deb" >>"$dest.tmp/.deb"
  done
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
  rm -rf "$tmp"
}

C2_DIR="$CACHE/containerd-2"
if [[ ! -x "$C2_DIR/usr/bin/containerd" ]]; then
  log "fetching containerd 2.x from Debian sid (unpacked into $C2_DIR, not installed)"
  sid_unpack "$C2_DIR" containerd
fi

# The CRI api.proto with UpdatePodSandboxResources (cri-api >= 0.34; k8s-cri 0.11 predates it):
# tests/build.rs generates a CRI client from it for the pod-level resize test.
CRI_DIR="$CACHE/cri-api"
CRI_PROTO="$CRI_DIR/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"
if ! grep -qs UpdatePodSandboxResources "$CRI_PROTO"; then
  log "fetching the CRI api.proto from Debian sid's golang-k8s-cri-api-dev (unpacked into $CRI_DIR)"
  sid_unpack "$CRI_DIR" golang-k8s-cri-api-dev
  grep -qs UpdatePodSandboxResources "$CRI_PROTO" || die "no CRI api.proto with UpdatePodSandboxResources at $CRI_PROTO"
fi

# The Go toolchain and NRI's Go stub with its dependencies, from Debian sid (unpacked into one
# GOPATH-style tree, never installed): the tests build an independent NRI plugin of their own
# (tests/go-plugin) to run beside nri-resize and to measure containerd's own NRI floor.
# Built offline: GOROOT=$GO_DIR/usr/lib/go-1.26 GOPATH=$GO_DIR/usr/share/gocode GO111MODULE=off.
GO_DIR="$CACHE/go-nri"
GO_PKGS=(golang-1.26-go golang-1.26-src golang-github-containerd-nri-dev golang-github-containerd-ttrpc-dev
  golang-github-containerd-log-dev golang-github-sirupsen-logrus-dev golang-golang-x-sys-dev
  golang-golang-x-net-dev golang-golang-x-text-dev golang-google-grpc-dev golang-google-genproto-dev
  golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev golang-github-opencontainers-specs-dev
  golang-k8s-cri-api-dev)
if [[ ! -x "$GO_DIR/usr/lib/go-1.26/bin/go" || ! -d "$GO_DIR/usr/share/gocode/src/github.com/containerd/nri/pkg/stub" \
      || "$(cat "$GO_DIR/.pkgs" 2>/dev/null)" != "${GO_PKGS[*]}" ]]; then
  log "fetching Go 1.26 and NRI's Go stub (0.8) with its dependencies from Debian sid (unpacked into $GO_DIR)"
  sid_unpack "$GO_DIR" "${GO_PKGS[@]}"
  echo "${GO_PKGS[*]}" >"$GO_DIR/.pkgs"
fi

# The push test's registry (xtask/src/push.rs): Debian's docker-registry (needs only libc),
# unpacked beside the system, never installed: installing it would start a registry service on
# :5000 where systemd runs.
REGISTRY_DIR="$CACHE/docker-registry"
if [[ ! -x "$REGISTRY_DIR/usr/bin/docker-registry" ]]; then
  log "fetching Debian's docker-registry (unpacked into $REGISTRY_DIR, not installed)"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download docker-registry/bookworm >/dev/null 2>&1) || {
    apt_update
    (cd "$tmp" && apt-get download docker-registry/bookworm >/dev/null 2>&1) || die "could not download docker-registry"
  }
  rm -rf "$REGISTRY_DIR" && mkdir -p "$REGISTRY_DIR"
  dpkg-deb -x "$tmp"/docker-registry_*.deb "$REGISTRY_DIR"
  rm -rf "$tmp"
fi

# 3. eBPF toolchain (Debian's rustc-web with precompiled core for bpfel, bpf-linker on LLVM 22).
if [[ $want_ebpf -eq 1 ]]; then
  e_pkgs=()
  for p in rustc-web cargo-web libstd-rust-web-dev-bpf llvm-22-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || e_pkgs+=("$p")
  done
  if [[ ${#e_pkgs[@]} -gt 0 ]]; then
    apt_update
    log "installing eBPF toolchain ${e_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${e_pkgs[@]}" >/dev/null
  fi
  # The arm64 guest's test binaries, cross-built: Debian's rustc-web with its arm64 standard
  # library (a multi-arch package of bookworm-security; the arm64 libc6 it needs must match the
  # host's version, which may bring the host's own multi-arch libraries to their security
  # update) and the cross linker.
  foreign=$(dpkg --print-foreign-architectures)
  if ! grep -qx arm64 <<<"$foreign"; then
    log "adding the arm64 architecture (for libstd-rust-web-dev:arm64)"
    dpkg --add-architecture arm64
    apt_updated=0
  fi
  x_pkgs=()
  for p in libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross; do
    dpkg -s "$p" >/dev/null 2>&1 || x_pkgs+=("$p")
  done
  if [[ ${#x_pkgs[@]} -gt 0 ]]; then
    apt_update
    log "installing the arm64 cross toolchain ${x_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${x_pkgs[@]}" >/dev/null
  fi
  # The same toolchain builds the image's linux/arm64 daemon (`cargo xtask image`, static:
  # xtask/src/cross.rs); qemu-user-static runs it once (`--version`) before it goes into the
  # image. One package, no binfmt registration here (no systemd-binfmt runs).
  if ! dpkg -s qemu-user-static >/dev/null 2>&1; then
    apt_update
    log "installing qemu-user-static (smoke run of the arm64 daemon)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user-static/bookworm >/dev/null
  fi
  if ! command -v bpf-linker >/dev/null 2>&1 || ! bpf-linker --version 2>/dev/null | grep -q '0\.13\.0'; then
    log "building bpf-linker 0.13.0 against LLVM 22 (about a minute)"
    LLVM_PREFIX=/usr/lib/llvm-22 LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 \
      cargo install --quiet --locked bpf-linker@0.13.0 --no-default-features --features llvm-22
  fi
fi

# 4. Manifest tooling: kustomize (Debian trixie: needs only libc6 >= 2.34) and kubernetes-validate
#    (PyPI, pinned; offline JSON schemas for Kubernetes 1.33-1.37) in a venv of Debian's python3.
KV_VERSION=1.37.0
VENV="$CACHE/venv"
m_pkgs=()
dpkg -s kustomize >/dev/null 2>&1 || m_pkgs+=("kustomize/trixie")
dpkg -s python3-venv >/dev/null 2>&1 || m_pkgs+=("python3-venv")
if [[ ${#m_pkgs[@]} -gt 0 ]]; then
  apt_update
  log "installing ${m_pkgs[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${m_pkgs[@]}" >/dev/null
fi
if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -qF "$KV_VERSION"; then
  log "installing kubernetes-validate==$KV_VERSION into $VENV"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi
#    helm-python-sdk (PyPI, pinned): Helm v4's Go library (libhelm_c.so, in the wheel) to render
#    and lint deploy/helm/nri-resize without a helm binary (xtask/scripts/helm-chart.py).
HELM_SDK_VERSION=0.2.2
if ! "$VENV/bin/python" -c "import sys, helm_python; sys.exit(helm_python.__version__ != '$HELM_SDK_VERSION')" 2>/dev/null; then
  log "installing helm-python-sdk==$HELM_SDK_VERSION into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "helm-python-sdk==$HELM_SDK_VERSION"
fi

# 5. promtool, for `promtool test rules` on deploy/monitoring's alerts (manifests tier): Debian's
#    prometheus package, downloaded and unpacked into the cache, never installed (installing it
#    would also install and start a Prometheus server).
PROM_DIR="$CACHE/prometheus"
if [[ ! -x "$PROM_DIR/usr/bin/promtool" ]]; then
  apt_update
  log "fetching promtool from Debian's prometheus package (unpacked into $PROM_DIR, not installed)"
  tmp=$(mktemp -d)
  chmod 755 "$tmp"
  (cd "$tmp" && apt-get download -qq -o Acquire::Retries=3 prometheus/bookworm >/dev/null 2>&1) \
    || die "could not download Debian's prometheus package"
  rm -rf "$PROM_DIR.tmp" && mkdir -p "$PROM_DIR.tmp"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$PROM_DIR.tmp"
  basename "$tmp"/prometheus_*.deb >"$PROM_DIR.tmp/.deb"
  rm -rf "$PROM_DIR" && mv "$PROM_DIR.tmp" "$PROM_DIR"
  rm -rf "$tmp"
  "$PROM_DIR/usr/bin/promtool" --version >/dev/null 2>&1 || die "promtool from $(cat "$PROM_DIR/.deb") does not run"
fi

log "containerd 1.7: $(containerd --version 2>/dev/null | awk '{print $3}')"
log "containerd 2.x: $("$C2_DIR/usr/bin/containerd" --version 2>/dev/null | awk '{print $3}')"
log "CRI api.proto: $(cat "$CRI_DIR/.deb" 2>/dev/null)"
log "Go for the tests' NRI plugin: $("$GO_DIR/usr/lib/go-1.26/bin/go" version 2>/dev/null | awk '{print $3}'), $(grep -h nri-dev "$GO_DIR/.deb" 2>/dev/null)"
log "helm-python-sdk: $("$VENV/bin/python" -c 'import helm_python as h; print(h.__version__, "(Helm", h.helm_sdk_version() + ")")' 2>/dev/null)"
log "runc: $(runc --version 2>/dev/null | head -1 | awk '{print $3}')"
log "promtool: $("$PROM_DIR/usr/bin/promtool" --version 2>/dev/null | head -1 | awk '{print $3}') ($(cat "$PROM_DIR/.deb" 2>/dev/null))"
