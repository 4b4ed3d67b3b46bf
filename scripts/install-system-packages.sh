#!/usr/bin/env bash
# Installs the Debian packages the tests, the demo and the benchmarks need, when they are missing:
#   postgresql      - the local-process PostgreSQL provider, and the binaries of the built image
#   podman runc     - the containers provider on machines without a Docker engine
#   busybox-static  - /bin/sh inside the images built from this machine's JDK and PostgreSQL
#   chromium        - headless browser that renders the audit's HTML report in its test
#   gcc             - builds the test shim that runs a check endpoint on a clock 10 minutes off
# As root with apt-get it installs them; otherwise it says what to install and exits 0, so that
# machines set up by hand (or with Docker) are not blocked.
set -euo pipefail

need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null || need+=(chromium)
command -v gcc >/dev/null || need+=(gcc)
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
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "system packages: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "system packages: missing ${need[*]} - install them (Debian: sudo apt-get install ${need[*]})"
fi
