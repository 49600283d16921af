#!/usr/bin/env bash
# System packages rewardkit's tests need: tesseract-ocr (the OCR reward). Idempotent and quiet.
set -euo pipefail

if command -v tesseract >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install-system-deps: tesseract is missing and we are not root (no sudo); install tesseract-ocr" >&2
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: no apt-get here; install tesseract-ocr with this system's package manager" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends tesseract-ocr tesseract-ocr-eng >/dev/null
command -v tesseract >/dev/null 2>&1 || { echo "install-system-deps: tesseract still missing after install" >&2; exit 1; }
