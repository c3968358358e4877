# The two set-up commands of the README:
#   make demo  - create .venv, build and install the release wheel, run the main example
#   make test  - cargo tests, wheel build into .venv, pytest
# Both install what they need (venv, pip packages; cargo fetches crates).

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
WHEELS  := target/wheels
CARGO   ?= cargo

.PHONY: demo test venv wheel-dev wheel-release cargo-test pytest bench bench-python bench-store clean

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

# Wheel for tests: the dev profile (our crates unoptimised, dependencies optimised).
wheel-dev: venv
	rm -rf $(WHEELS)/dev
	$(VENV)/bin/maturin build --quiet -m python/Cargo.toml --profile dev -i $(PY) -o $(WHEELS)/dev
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(WHEELS)/dev/forebay-*.whl

wheel-release: venv
	rm -rf $(WHEELS)/release
	$(VENV)/bin/maturin build --quiet -m python/Cargo.toml --release -i $(PY) -o $(WHEELS)/release
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(WHEELS)/release/forebay-*.whl

cargo-test:
	$(CARGO) test --workspace --exclude forebay-python

pytest: wheel-dev
	$(PY) -m pytest -q tests/python

test: cargo-test pytest

demo: wheel-release
	$(PY) examples/scan_demo.py

bench: wheel-release
	$(CARGO) bench --bench scan

# Peer comparison on TPC-H lineitem; SF=5 is the reference run in BENCHMARKS.md.
SF ?= 1
bench-python: wheel-release
	$(PY) benches/python/scan.py --scale-factor $(SF)

# Object store vs pickle 5 / Arrow IPC / Ray (Ray is installed for this benchmark only).
bench-store: wheel-release
	$(PY) -m pip install --quiet "ray>=2.40"
	$(PY) benches/python/store.py --cold

clean:
	rm -rf target $(VENV)
