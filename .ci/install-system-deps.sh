#!/usr/bin/env bash
# System packages rewardkit's tests need: tesseract-ocr (the OCR reward), chromium (the browser tests of
# `rewardkit view`, driven by Playwright; never `playwright install`) and nginx (the load balancer of
# docs/serve.md, run by tests/serve/test_load_balancer.py as the current user; the distribution's own nginx
# service is not needed). Idempotent and quiet.
set -euo pipefail

# Debian installs nginx in /usr/sbin, which is not on a non-root user's PATH
have_nginx() { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; }

PKGS=()
command -v tesseract >/dev/null 2>&1 || PKGS+=(tesseract-ocr tesseract-ocr-eng)
command -v chromium >/dev/null 2>&1 || PKGS+=(chromium)
have_nginx || PKGS+=(nginx)
if [ "${#PKGS[@]}" -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
            echo "install-system-deps: missing ${PKGS[*]} and we are not root (no sudo); install them" >&2
            exit 1
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-system-deps: no apt-get here; install ${PKGS[*]} with this system's package manager" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
fi
command -v tesseract >/dev/null 2>&1 || { echo "install-system-deps: tesseract still missing after install" >&2; exit 1; }
command -v chromium >/dev/null 2>&1 || { echo "install-system-deps: chromium still missing after install" >&2; exit 1; }
have_nginx || { echo "install-system-deps: nginx still missing after install" >&2; exit 1; }
