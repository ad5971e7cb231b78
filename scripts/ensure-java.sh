#!/usr/bin/env bash
# Java 17+ is needed by PySpark. On Debian as root, install it when missing.
set -euo pipefail
major() { java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'; }
if command -v java >/dev/null 2>&1 && [ "$(major)" -ge 17 ] 2>/dev/null; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Java 17+ not found: installing openjdk-17-jre-headless" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  exit 0
fi
echo "error: Java 17 or newer is required for Spark (install openjdk-17-jre-headless or set JAVA_HOME)" >&2
exit 1
