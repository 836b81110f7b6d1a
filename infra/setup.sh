#!/usr/bin/env bash
# Set up everything Velocity needs on a fresh machine, idempotently:
#   .venv/ with the locked Python packages and velocity itself (editable),
#   .cache/jars/ with the Delta JARs, Java 17 checked, redis-server installed.
# A second run installs nothing new and finishes in seconds.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

apt_install() {
  if [ -z "${_velocity_apt_updated:-}" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    _velocity_apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

python_bin="${PYTHON_BIN:-$(command -v python3.11 || command -v python3)}"
if ! "$python_bin" -c 'import sys; raise SystemExit(sys.version_info[:2] != (3, 11))'; then
  echo "Velocity needs Python 3.11; found $("$python_bin" --version)" >&2
  exit 1
fi
if ! command -v java >/dev/null 2>&1; then
  echo "installing Java 17 for Spark" >&2
  apt_install openjdk-17-jre-headless
fi
command -v redis-server >/dev/null 2>&1 || { echo "installing redis-server" >&2; apt_install redis-server; }
command -v mvn >/dev/null 2>&1 || { echo "installing maven" >&2; apt_install maven; }
# The browser tests (make test) drive Debian's chromium through its chromedriver.
if [ "${VELOCITY_SETUP_BROWSER:-0}" = 1 ] && ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }; then
  echo "installing chromium and chromedriver for the browser tests" >&2
  apt_install chromium chromium-driver
fi

stamp=".venv/.velocity-lock.sha256"
lock_sum="$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
  echo "installing Python packages into .venv (locked in requirements.lock)" >&2
  [ -x .venv/bin/python ] || "$python_bin" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "uv==0.13.9"
  .venv/bin/uv pip install -q --python .venv/bin/python -r requirements.lock
  .venv/bin/uv pip install -q --python .venv/bin/python --no-deps -e .
  echo "$lock_sum" > "$stamp"
fi
bash infra/fetch_jars.sh
echo "setup done: $(.venv/bin/velocity --help >/dev/null && echo 'velocity installed')" >&2
