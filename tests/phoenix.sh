#!/usr/bin/env bash
# `make phoenix`: export handrail's spans over OTLP/HTTP to a real Arize Phoenix started here,
# and check that they arrive nested and read as GenAI spans
# (tests/test_tracing.py::test_spans_reach_phoenix_nested). Phoenix is installed into
# .venv-phoenix on first use (about a minute), so this is not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-phoenix/bin/phoenix ]; then
  "$PY" -m venv .venv-phoenix
  .venv-phoenix/bin/python -m pip install --quiet arize-phoenix
fi
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
grpc=$(free_port)
work=$(mktemp -d)
PHOENIX_WORKING_DIR="$work" PHOENIX_HOST=127.0.0.1 PHOENIX_PORT="$port" PHOENIX_GRPC_PORT="$grpc" \
  .venv-phoenix/bin/phoenix serve >"$work/phoenix.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
url="http://127.0.0.1:$port"
.venv/bin/python - "$url" "$pid" <<'PY' || { cat "$work/phoenix.log"; exit 1; }
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
for _ in range(240):
    try:
        urllib.request.urlopen(url + "/healthz", timeout=1)
        sys.exit(0)
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit("Phoenix exited before it answered")
        time.sleep(0.5)
sys.exit("Phoenix did not answer within 2 minutes")
PY
HANDRAIL_PHOENIX_URL="$url" .venv/bin/python -m pytest tests/test_tracing.py -k phoenix -p no:cacheprovider -v
