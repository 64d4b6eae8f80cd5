# facefuse: `make demo` runs the embedded default end to end, `make test` runs every test.
# Both create .venv when it is missing and install what they need (CPU torch first).
VENV ?= .venv
PY := $(VENV)/bin/python
FACEFUSE := $(VENV)/bin/facefuse
STAMP := $(VENV)/.facefuse-installed
REPOSITORY ?= model_repository
TORCH_VERSION ?= 2.13.0
# the embedded default: the trained face model shipped in facefuse/models/faces
MODEL ?= faces

.PHONY: install ui demo test test-fast test-unit test-integration lint format export clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel first: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e ".[dev,ui]"
	touch $(STAMP)

install: $(STAMP)

export: install
	$(FACEFUSE) export --model $(MODEL) --out $(REPOSITORY)

# the page on http://127.0.0.1:7860/, with its own local tritonserver on the exported default
ui: export
	$(FACEFUSE) ui --repository $(REPOSITORY)

demo: export
	$(FACEFUSE) demo --repository $(REPOSITORY) --out out/fused.png

test: install
	$(PY) -m pytest -q -p no:cacheprovider

# the unit tier without the tests marked slow (tiny-model export, servers): under a minute
test-fast: install
	$(PY) -m pytest -q -p no:cacheprovider tests/unit -m "not slow"

test-unit: install
	$(PY) -m pytest -q tests/unit

test-integration: install
	$(PY) -m pytest -q tests/integration

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf out .cache .pytest_cache
	find $(REPOSITORY) -name '*.onnx' -o -name '*.onnx.data' -o -name 'pipeline.json' | xargs rm -f
