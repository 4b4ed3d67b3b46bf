#!/usr/bin/env bash
# Installs the Debian packages the tests, the demo and the benchmarks need, when they are missing:
#   postgresql      - the local-process PostgreSQL provider, and the binaries of the built image
#   podman runc     - the containers provider on machines without a Docker engine
#   busybox-static  - /bin/sh inside the images built from this machine's JDK and PostgreSQL
#   chromium        - headless browser that renders the audit's HTML report in its test
#   gcc             - builds the test shim that runs a check endpoint on a clock 10 minutes off
#   prometheus      - promtool, which checks and unit-tests deploy/monitoring/outbox-rules.yaml;
#                     installed without its recommends (node-exporter) and without ever leaving
#                     the Prometheus server it also ships running or enabled (below)
# As root with apt-get it installs them; otherwise it says what to install and exits 0, so that
# machines set up by hand (or with Docker) are not blocked.
set -euo pipefail

need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null || need+=(chromium)
command -v gcc >/dev/null || need+=(gcc)
command -v promtool >/dev/null || need+=(prometheus)
if ! docker info >/dev/null 2>&1; then
  command -v podman >/dev/null || need+=(podman)
  command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need+=(runc)
fi
# A static busybox is needed (the images have no libc for a dynamic one).
if command -v dpkg >/dev/null; then
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
else
  [ -x /bin/busybox ] || need+=(busybox-static)
fi

if [ ${#need[@]} -eq 0 ]; then
  echo "system packages: all present"
  exit 0
fi
# The prometheus package's postinst starts the server it ships (invoke-rc.d, or systemd where it
# runs) unless /usr/sbin/policy-rc.d forbids it; we only want promtool. So: a policy-rc.d that
# forbids starting anything while it installs (when the machine has none of its own), then the
# server stopped and disabled whatever a machine's own policy allowed.
install_prometheus() {
  local policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/install-system-packages.sh: no service starts while it installs\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap "rm -f $policy" EXIT
  fi
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
  if [ -x /etc/init.d/prometheus ]; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
  command -v promtool >/dev/null
}

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "system packages: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  rest=()
  for package in "${need[@]}"; do
    [ "$package" = prometheus ] || rest+=("$package")
  done
  [ ${#rest[@]} -eq 0 ] || apt-get install -y -qq "${rest[@]}" >/dev/null
  [ ${#rest[@]} -eq ${#need[@]} ] || install_prometheus
else
  echo "system packages: missing ${need[*]} - install them (Debian: sudo apt-get install ${need[*]})"
fi
