# Two commands on a fresh machine: `make run` and `make test`. Both build the venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LOCK := locks/sluice.txt
CLIENTS_LOCK := locks/clients.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) | md5sum | cut -c1-8)
CLIENTS_VENV ?= .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed-$(shell cat $(CLIENTS_LOCK) | md5sum | cut -c1-8)

.PHONY: install lock lint docs run test test-unit e2e crds chart-check images images-check bench-engine bench-embed bench-serve bench-gateway bench-priority bench-batch cluster-build cluster-up cluster-down clean

# Every package comes from the lock, at its exact version and with its file's hash; the project goes on top,
# editable, without resolving anything again.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --require-hashes --no-deps -r $(LOCK)
	$(PIP) install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

# Third-party client libraries the compatibility tests run as scripts (tests/fixtures/clients.py).
$(CLIENTS_STAMP): $(CLIENTS_LOCK)
	test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install -q --require-hashes --no-deps -r $(CLIENTS_LOCK)
	rm -f $(CLIENTS_VENV)/.installed-*
	touch $@

install: $(STAMP) $(CLIENTS_STAMP)

# Resolves pyproject.toml and tests/clients/requirements.txt afresh into the locks (a dry run: nothing is
# installed). Review the diff of locks/, then `make install` and `make test` before committing it.
lock: install
	$(PY) locks/update.py

# The runtime on 8000 and the gateway in front of it on 8080 (config/gateway.local.yaml, demo key sk-sluice-demo).
run: install
	@$(VENV)/bin/sluice-gateway --config config/gateway.local.yaml & gw=$$!; \
	( for i in $$(seq 600); do curl -sf http://127.0.0.1:8000/ready >/dev/null 2>&1 && break; sleep 1; done; \
	  echo; echo 'Sluice is up: runtime on :8000, gateway on :8080. Through the gateway:'; \
	  echo '  curl http://127.0.0.1:8080/v1/chat/completions -H "Authorization: Bearer sk-sluice-demo" -H "Content-Type: application/json" -d "{\"model\": \"smollm2\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}"'; echo ) & ready=$$!; \
	trap 'kill $$gw $$ready 2>/dev/null' EXIT INT TERM; \
	$(VENV)/bin/sluice-runtime serve --model smollm2 --dtype auto --port 8000 --print-examples

# ruff (pyproject.toml [tool.ruff]) over the whole tree, and mypy ([tool.mypy]) on the contracts and the gateway.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The generated tables of runtime/README.md, gateway/README.md and bench/README.md, from the code and the
# benchmarks' results files (docs/generate.py).
docs: install
	$(PY) -m docs.generate

# Two sessions at once: the tests on the local cluster and its real node mostly wait on kubelets, containers
# and image imports, and the rest mostly compute, so together they take little more than the longer alone. The
# cluster's session writes to a file, printed once both end, so each session's summary reads whole.
CLUSTER_TESTS := tests/chart tests/cluster tests/e2e tests/images tests/operator
PYTEST := $(PY) -m pytest -q -ra --durations=15
test: install lint
	@log=$$(mktemp); $(PYTEST) $(CLUSTER_TESTS) >"$$log" 2>&1 & cluster=$$!; \
	$(PYTEST) tests $(addprefix --ignore=,$(CLUSTER_TESTS)); rest=$$?; \
	wait $$cluster; on_cluster=$$?; echo "== $(CLUSTER_TESTS)"; cat "$$log"; rm -f "$$log"; \
	exit $$(( rest || on_cluster ))

test-unit: install
	$(PY) -m pytest -q -ra tests -m "not integration"

# The whole stack on the local control plane's real node (builds it on first use), from the images `make images`
# built: helm install, the samples, the OpenAI client through the gateway, canary, autoscaling, a crash, a
# rollout, the vLLM stand-in, scale to zero, LoRA, uninstall; prints a timing table.
# `make test` runs it too.
e2e: install
	$(PY) -m pytest -q -ra tests/e2e

bench-engine: install
	$(PY) bench/engine_bench.py

bench-embed: install
	$(PY) bench/embedding_bench.py

# A fresh runtime on a free port at concurrency 32, against the offline engine in the same run.
bench-serve: install
	$(PY) bench/serve_bench.py --start-server --compare-offline --max-concurrency 32 --num-prompts 32 --rounds 3

# Installs LiteLLM (pinned) into its own venv under /tmp on first use; never part of `make test`.
bench-gateway: install
	$(PY) bench/gateway_bench.py

# A critical tenant's TTFT alone and under a batch flood, priority classes on vs off, same run.
bench-priority: install
	$(PY) bench/priority_bench.py

# Online TTFT with a 2,000-line batch running and without, and the batch's throughput against LLM.generate.
bench-batch: install
	$(PY) bench/batch_bench.py

# Local control plane built from source (localcluster/README.md); stdlib only, so no venv is needed.
cluster-build:
	$(PYTHON) -m localcluster.cluster build

cluster-up:
	$(PYTHON) -m localcluster.cluster up

cluster-down:
	$(PYTHON) -m localcluster.cluster down

# The chart carries copies of the CRDs and of the operator's RBAC (Helm reads only files inside the chart).
crds: install
	$(VENV)/bin/sluice-operator crds --out crds
	cp crds/*.yaml charts/sluice/crds/
	cp operator/sluice_operator/rbac/rules.yaml charts/sluice/files/operator-rbac.yaml

# helm lint, helm template (default and full values), server-side dry run on the local control plane, Dockerfiles.
chart-check: install
	$(PY) -m pytest -q -ra tests/chart

# The operator image and the runtime image (CPU variant), built here with buildah from a local Debian base,
# under ~/.cache/sluice/images (images/README.md). Needs root, buildah and debootstrap; stdlib only.
images:
	$(PYTHON) -m images.build

# Rebuilds them if their sources changed, then runs each as its pod does (tests/images; `make test` runs
# those tests too, on the images built last).
images-check: images install
	$(PY) -m pytest -q -ra tests/images

clean:
	rm -rf $(VENV) .pytest_cache
