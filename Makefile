# One venv per checkout, created from pyproject.toml; `make demo` and `make test` each set it up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SAM ?= sam
LAYER_BUILD := .aws-sam/build/GpufarmLayer

.PHONY: venv demo demo-quirks test lint typecheck unit cfn-lint bench local sandbox sam-build layer-check screenshots clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufarm demo

test: $(STAMP) lint typecheck unit cfn-lint demo-quirks

# The demo on a sandbox playing every Datadog quirk at once (gpufarm_sandbox.emulator.quirks): rules that fire only on
# state changes, unsubstituted header variables, refused facets...: every step still completes.
demo-quirks: $(STAMP)
	GPUFARM_DEMO_QUIRKS=all $(BIN)/gpufarm demo > $(VENV)/demo-quirks.log 2>&1 || { tail -60 $(VENV)/demo-quirks.log; exit 1; }
	@tail -1 $(VENV)/demo-quirks.log

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -n auto --dist loadfile

cfn-lint: $(STAMP)
	$(BIN)/cfn-lint template.yaml

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(BIN)/python benchmarks/sandbox.py
	$(BIN)/python benchmarks/node.py
	$(BIN)/python benchmarks/ingress.py
	$(BIN)/python benchmarks/aws_calls.py
	$(BIN)/python benchmarks/hardening.py --scale 10
	$(BIN)/python benchmarks/reliability.py
	$(BIN)/python benchmarks/report.py
	$(BIN)/python benchmarks/scale.py
	$(BIN)/python benchmarks/sweep.py
	$(BIN)/python benchmarks/agent_usage.py
	$(BIN)/python benchmarks/reservations.py
	$(BIN)/python benchmarks/reservations.py --sandbox
	$(BIN)/python benchmarks/why.py
	$(BIN)/python benchmarks/prices.py
	$(BIN)/python benchmarks/outlook.py

# docs/screenshots/*.png: the five dashboards as the sandbox draws them (needs chromium), with render times, the
# HTML report of a seeded farm (report.png), and the Slack page with its App Home (slack-page.png, slack-home.png).
screenshots: $(STAMP)
	$(BIN)/python benchmarks/dashboard_screenshots.py --out docs/screenshots
	$(BIN)/python benchmarks/report.py --leases 600 --days 14 --screenshot docs/screenshots/report.png
	$(BIN)/python benchmarks/app_home.py --changes 5 --screenshots docs/screenshots

# `make local ARGS="--port 8321"` passes options to `gpufarm local`.
local: $(STAMP)
	$(BIN)/gpufarm local $(ARGS)

sandbox: $(STAMP)
	$(BIN)/gpufarm sandbox

# Needs the SAM CLI (SAM=path/to/sam) and python3.12 on PATH (Lambda's runtime); resolves arm64 wheels without
# Docker. Then checks the layer it built.
sam-build:
	$(SAM) build --template-file template.yaml
	$(MAKE) --no-print-directory layer-check

# The built layer holds the runtime package and its requirements only: no sandbox, node agent, local host, demo,
# fake or simulated-farm code, no build leftovers; prints its size unzipped and zipped (Lambda: 250 MB unzipped).
layer-check:
	@test -f $(LAYER_BUILD)/python/gpufarm/handlers/runtime.py || { echo "no built layer: make sam-build"; exit 1; }
	@found="$$(cd $(LAYER_BUILD)/python && ls -d gpufarm_sandbox* gpufarm_node* werkzeug* click* moto* build *.egg-info 2>/dev/null)"; \
	  test -z "$$found" || { echo "the layer holds: $$found"; exit 1; }
	@found="$$(find $(LAYER_BUILD)/python/gpufarm | grep -iE 'sandbox|localhost|demo|fake|simfarm|emulator')"; \
	  test -z "$$found" || { echo "development tooling in the layer: $$found"; exit 1; }
	@found="$$(grep -rlE '^\s*(from|import) +(gpufarm_sandbox|gpufarm_node|werkzeug)\b' $(LAYER_BUILD)/python/gpufarm)"; \
	  test -z "$$found" || { echo "layer modules import development tooling: $$found"; exit 1; }
	@$(PYTHON) -c 'import io, os, sys, zipfile; \
	files = [os.path.join(d, f) for d, _, fs in os.walk(sys.argv[1]) for f in fs]; \
	buf = io.BytesIO(); z = zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED); \
	[z.write(f, os.path.relpath(f, sys.argv[1])) for f in files]; z.close(); \
	print(f"layer ok: {len(files)} files, {sum(map(os.path.getsize, files)):,} bytes unzipped, {len(buf.getvalue()):,} zipped")' $(LAYER_BUILD)

clean:
	rm -rf $(VENV) .aws-sam .mypy_cache .ruff_cache
