# Build entry points for codemode (Python package + Rust core).
#
# Everything runs from a project-local virtualenv (.venv) that `make` creates
# on demand with `python3 -m venv`; nothing is installed outside it.
# Stamp files (inside .venv/ and dist/) keep repeated runs cheap: deps are
# reinstalled only when pyproject.toml changes, the extension is rebuilt only
# when a Rust input changes, the wheel only when one of its inputs changes.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-builtin-rules

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip --disable-pip-version-check --no-input -q
MATURIN := $(VENV)/bin/maturin

DEV_DEPS := maturin msgspec fastjsonschema 'mcp>=2.3,<3' 'psycopg[binary]>=3.1' 'wordllama>=0.4,<0.5' 'openai>=3.57,<4' \
  'openai-agents>=0.24,<0.25' 'pydantic-ai-slim>=2.68,<3' 'langchain-core>=1.8,<2' 'anthropic>=2.16,<3' \
  'opentelemetry-api>=1.20' 'opentelemetry-sdk>=1.20' 'ray>=2.50,<3' pytest pytest-timeout pytest-benchmark hypothesis ruff mypy

DEPS_STAMP := $(VENV)/.deps-stamp
BUILD_STAMP := $(VENV)/.build-stamp
WHEEL_STAMP := dist/.wheel-stamp
# The docs tools (make docs, make lint): pinned, installed on first use and when this file changes.
DOCS_DEPS := mkdocs==1.6.1 mkdocstrings==1.0.8 mkdocstrings-python==2.0.11
DOCS_STAMP := $(VENV)/.docs-stamp

# Every file under rust/ counts (*.rs, *.js, and anything pulled in with
# include_str!/include_bytes!), plus the workspace manifests.
RUST_INPUTS := $(shell find rust -type f -not -path '*/target/*' 2>/dev/null) Cargo.toml Cargo.lock pyproject.toml
# The wheel also packages the Python sources, README (project metadata) and LICENSE.
PY_INPUTS := $(shell find python -type f -not -name '*.so' -not -name 'codemode-worker*' -not -name '*.pyc' -not -path '*/__pycache__/*' 2>/dev/null)
WHEEL_INPUTS := $(RUST_INPUTS) $(PY_INPUTS) README.md LICENSE

# The worker binary (rust/worker) goes next to the package: found there by workers.py, and
# packaged from there into the wheel (pyproject.toml, [tool.maturin] include).
WORKER_BIN := python/codemode/codemode-worker
CARGO_TARGET := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
WHEEL_TARGET := x86_64-unknown-linux-gnu
# The worker is linked statically (glibc included, as a static PIE): it needs no glibc of the
# machine it runs on, so the wheel carries the very binary the tests and benches run, and a new
# worker reaches main() ~0.45 ms sooner (no loading of libc, libm and libgcc_s at each start).
# With an explicit --target, the flag reaches only the worker, not build scripts or the
# extension (a cdylib, which must link libc dynamically).
WORKER_BUILD := RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -q -p codemode-worker --target $(WHEEL_TARGET)
WORKER_OUT := $(CARGO_TARGET)/$(WHEEL_TARGET)/release/codemode-worker

# Force a rebuild when the artifact a stamp vouches for has gone missing.
EXT_FORCE := $(if $(and $(wildcard python/codemode/_engine*.so),$(wildcard $(WORKER_BIN))),,FORCE)
WHEEL_FORCE := $(if $(wildcard dist/codemode-*.whl),,FORCE)

export PIP_NO_INPUT := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: soak fuzz help venv build test test-wheel mcp-servers lint docs demo bench bench-peers wheel clean FORCE

help: ## Show this help
	@echo "usage: make <target>"
	@echo
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) \
	  | awk 'BEGIN {FS = ":.*## "}; {printf "  %-11s %s\n", $$1, $$2}'

venv: $(DEPS_STAMP) ## (internal) Create .venv and install the dev tools (reinstalls when pyproject.toml changes)

$(DEPS_STAMP): pyproject.toml
	@test -x $(VPY) || { echo ">> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo ">> installing dev dependencies into $(VENV)"
	$(PIP) install $(DEV_DEPS)
	@touch $@

build: $(BUILD_STAMP) ## Build the Rust extension and the worker binary (release) and install codemode editable into .venv

# (The binary is renamed into place: a running worker keeps the file it was started from.)
$(BUILD_STAMP): $(RUST_INPUTS) $(DEPS_STAMP) $(EXT_FORCE)
	@echo ">> cargo build --release -p codemode-worker (static)"
	$(WORKER_BUILD)
	cp $(WORKER_OUT) $(WORKER_BIN).tmp && mv -f $(WORKER_BIN).tmp $(WORKER_BIN)
	@echo ">> maturin develop --release"
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(MATURIN) develop --release -q
	@touch $@

test: build wheel mcp-servers $(DOCS_STAMP) ## Run cargo tests, then pytest (includes installing the built wheel into a fresh venv, and the docs build)
	cargo test --release --workspace --exclude codemode-pyext
	CODEMODE_WHEEL_TEST=1 $(VPY) -m pytest tests -q

mcp-servers: $(DEPS_STAMP) ## (internal) Install the real MCP servers the tests talk to (pinned; idempotent)
	VENV=$(CURDIR)/$(VENV) bash tools/install_mcp_servers.sh

test-wheel: wheel ## Only the wheel smoke test (fresh venv + pip install of dist/*.whl)
	CODEMODE_WHEEL_TEST=1 $(VPY) -m pytest tests/test_wheel.py -q

lint: build $(DOCS_STAMP) ## Run rustfmt, clippy, ruff (lint + format), mypy, stubtest and the docs build (all of them; fails if any fails)
	@rc=0; for cmd in \
	  "cargo fmt --all --check" \
	  "cargo clippy --workspace --all-targets -- -D warnings" \
	  "$(VENV)/bin/ruff check python tests benches tools" \
	  "$(VENV)/bin/ruff format --check python tests benches tools" \
	  "$(VENV)/bin/mypy" \
	  "$(VPY) -m mypy.stubtest codemode._engine" \
	  "$(VENV)/bin/mkdocs build --strict"; do \
	  echo ">> $$cmd"; $$cmd || { echo "!! failed: $$cmd"; rc=1; }; \
	done; exit $$rc

# The API reference (mkdocs.yml, docs/): mkdocstrings reads the docstrings statically (griffe),
# so it needs no build. Never with -q: mkdocs 1.6 then drops the warnings --strict counts.
$(DOCS_STAMP): Makefile $(DEPS_STAMP)
	@echo ">> installing $(DOCS_DEPS)"
	$(PIP) install $(DOCS_DEPS)
	@touch $@

docs: $(DOCS_STAMP) ## Build the API reference from the docstrings into site/ (strict: a warning fails it)
	$(VENV)/bin/mkdocs build --strict

demo: build ## Run the demo (python -m codemode.demo)
	$(VPY) -m codemode.demo

bench: build ## Run benches/ side by side with a pipe round trip and pydantic-monty; rewrite README's table
	@$(VPY) -c 'import pydantic_monty' 2>/dev/null || { echo ">> installing pydantic-monty"; $(PIP) install pydantic-monty; }
	@mkdir -p .benchmarks
	$(VPY) -m pytest benches --benchmark-only --benchmark-enable \
	  --benchmark-columns=min,median,mean,ops -q -p no:cacheprovider --benchmark-json=.benchmarks/latest.json
	$(VPY) benches/report.py .benchmarks/latest.json --write README.md

PEER_DEPS := mini-racer==0.14.1 quickjs==1.19.4 pydantic-monty matplotlib==3.11.2

bench-peers: build ## The same cells in codemode, mini-racer, quickjs, pydantic-monty and Node + quickjs-wasi; rewrite README's peer table and docs/peers.png
	@$(VPY) -c 'from importlib.metadata import version as v; import pydantic_monty; \
	  assert (v("mini-racer"), v("quickjs"), v("matplotlib")) == ("0.14.1", "1.19.4", "3.11.2")' 2>/dev/null \
	  || { echo ">> installing $(PEER_DEPS)"; $(PIP) install $(PEER_DEPS); }
	@test -d benches/peers/node/node_modules \
	  || { echo ">> npm ci in benches/peers/node"; cd benches/peers/node && npm ci --no-audit --no-fund; }
	$(VPY) benches/peers/run.py --write README.md

bench-scale: build ## Workers as Ray actors against local workers: CPU-bound throughput by worker count, cell and tool-call latency; rewrite README's scale table
	$(VPY) benches/scale_out.py --write README.md

soak: build ## Load and fault test: concurrent sessions, hostile cells, waits, random worker SIGKILLs (SOAK_SECONDS, default 60)
	$(VPY) tools/soak.py --seconds $${SOAK_SECONDS:-60}

fuzz: build ## Fuzz the engine (cargo-fuzz, ASan) and the worker-frame reader (hypothesis), FUZZ_SECONDS each (default 60)
	FUZZ_SECONDS=$${FUZZ_SECONDS:-60} $(VPY) tools/fuzz.py

wheel: $(WHEEL_STAMP) ## Build the abi3 manylinux2014 (manylinux_2_17) wheel into dist/ with maturin + zig

$(WHEEL_STAMP): $(WHEEL_INPUTS) $(DEPS_STAMP) $(WHEEL_FORCE)
	@$(VPY) -c 'import ziglang' 2>/dev/null || { echo ">> installing ziglang"; $(PIP) install ziglang; }
	@mkdir -p dist && rm -f dist/codemode-*.whl
	@echo ">> cargo build --release -p codemode-worker (static)"
	$(WORKER_BUILD)
	@echo ">> maturin build --release --zig --compatibility manylinux2014"
	@# The wheel's worker stands in for the dev build's only while maturin packages it: the
	@# tests run against the dev build, as they run against the dev build of the extension.
	trap 'test ! -e $(WORKER_BIN).dev || mv -f $(WORKER_BIN).dev $(WORKER_BIN)' EXIT; \
	  test ! -e $(WORKER_BIN) || mv -f $(WORKER_BIN) $(WORKER_BIN).dev; \
	  cp $(WORKER_OUT) $(WORKER_BIN); \
	  PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(MATURIN) build --release --zig \
	    --compatibility manylinux2014 -i $(VPY) -o dist -q
	@whl=$$(ls dist/codemode-*.whl); echo ">> built $$whl"; \
	  case "$$whl" in *abi3*manylinux*) ;; *) echo "error: expected an abi3 manylinux wheel, got $$whl" >&2; exit 1;; esac
	@touch $@

clean: ## Remove build outputs and caches (target/, dist/, the in-tree .so, stamps); keeps .venv
	rm -rf target dist site .pytest_cache .ruff_cache .mypy_cache $(BUILD_STAMP)
	rm -f python/codemode/_engine*.so $(WORKER_BIN)
	find python tests benches -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true

FORCE:
