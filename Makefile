# The two set-up commands of the README:
#   make demo  - create .venv, build and install the release wheel, run the resume demo
#   make test  - lint, cargo tests, wheel build + checks, pytest
# Both install what they need (venv, pip packages; cargo fetches crates).

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
WHEELS  := target/wheels
CARGO   ?= cargo
# maturin finds zig (the `ziglang` package) as `python -m ziglang` on PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Wheels link against glibc 2.17 through zig, so they install on manylinux2014 systems
# (Amazon Linux 2, RHEL/Rocky 8, Ubuntu 20.04, Debian 11, ...).
MATURIN := $(VENV)/bin/maturin build -m python/Cargo.toml -i $(PY) --zig --compatibility manylinux2014

.PHONY: demo test lint lint-fast venv venv-build wheel-dev wheel-release wheel-check cargo-test pytest bench bench-python bench-store clean

# uv installs the dev requirements (Ray, Daft, polars, pyarrow, ...) in seconds where pip
# takes over a minute; the wheel's own smoke test below still installs it with pip, as a
# user would. --compile-bytecode writes the .pyc files at install, as pip does: uv does not
# by default, and where PYTHONDONTWRITEBYTECODE is set (this machine, CI) nothing writes
# them later, so every Python process (each Ray worker, each test's subprocess) compiled
# Ray, pandas and pyarrow from source again: pytest took 23m45s on a clean clone instead
# of ~11 minutes (BENCHMARKS.md, "Fast feedback").
UV := $(VENV)/bin/uv
$(UV):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv

# What building the wheel and running the demo need (`make demo` installs only these, not
# Ray, Daft, polars and the rest: ~40 s less on a fresh machine).
$(VENV)/.installed-build: requirements-build.txt | $(UV)
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -r requirements-build.txt
	touch $@

$(VENV)/.installed: requirements-dev.txt requirements-build.txt | $(UV)
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -r requirements-dev.txt
	touch $@ $(VENV)/.installed-build

venv-build: $(VENV)/.installed-build
venv: $(VENV)/.installed

# Fast checks first: formatting, lints and types fail in seconds, not after the long build.
lint-fast: venv
	$(CARGO) fmt --all --check
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	cd python && ../$(VENV)/bin/mypy forebay
	$(PY) .ci/check_features.py
	$(PY) .ci/check_module_cycles.py
	$(PY) .ci/check_reader_only.py

# Everything `make test` lints, clippy as a build of its own (make test runs clippy inside
# its one build instead; see CLIPPY below).
lint: lint-fast
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# One build of the dependencies per `make test` (they are most of its time on 2 cores):
# - the dev wheel, the tests, the example and clippy all build for the wheel's target triple
#   in the dev profile, so they share target/$(TARGET)/debug;
# - the tests build with the environment maturin's zig toolchain gave its own build (recorded
#   by .ci/record-cargo-env/cargo into $(CARGO_ENV)): a C compiler seen differently by a
#   build script (ring, zstd) would rebuild that crate and all above it;
# - the wheel and the tests resolve the same features (.ci/check_features.py);
# - clippy lints our crates while they compile: clippy-driver as cargo's wrapper for the
#   workspace's own crates (what `cargo clippy` does, but building instead of checking, so the
#   dependencies are not compiled a second time in check mode).
TARGET    := x86_64-unknown-linux-gnu
CARGO_ENV := target/maturin/cargo-env.sh
CLIPPY    := RUSTC_WORKSPACE_WRAPPER="$$(rustup which clippy-driver)" \
	CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# make test lints as it builds; `make wheel-dev` or `make cargo-test` on their own do not.
test: WITH_CLIPPY = $(CLIPPY)

# Wheel for tests: the dev profile (our crates unoptimised, dependencies optimised).
wheel-dev: venv
	rm -rf $(WHEELS)/dev
	mkdir -p target/maturin
	FOREBAY_REAL_CARGO="$$(command -v $(CARGO))" FOREBAY_CARGO_ENV=$(CURDIR)/$(CARGO_ENV) \
		PATH="$(CURDIR)/.ci/record-cargo-env:$$PATH" $(WITH_CLIPPY) \
		$(MATURIN) --quiet --profile dev -o $(WHEELS)/dev
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(WHEELS)/dev/forebay-*.whl

# The optimised wheel, built with Cargo's `dist` profile (link-time optimisation; see
# Cargo.toml). Shows cargo's progress: the first build compiles arrow and parquet (~10
# minutes on 2 cores); later builds take about 5 minutes, most of it the final link.
wheel-release: venv-build
	rm -rf $(WHEELS)/release
	$(MATURIN) --profile dist -o $(WHEELS)/release
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(WHEELS)/release/forebay-*.whl

# The wheel as a user gets it: manylinux tag and symbols checked, installed with its declared
# dependencies only into a fresh venv, a smoke job run there; the stub file checked against
# the built module.
SMOKE_VENV := target/smoke-venv
wheel-check: wheel-dev
	$(PY) .ci/check_wheel.py $(WHEELS)/dev/forebay-*.whl
	rm -rf $(SMOKE_VENV)
	$(PYTHON) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/python -m pip install --quiet $(WHEELS)/dev/forebay-*.whl
	$(SMOKE_VENV)/bin/python tests/smoke/smoke_job.py
	rm -rf $(SMOKE_VENV)
	cd target && ../$(PY) -m mypy.stubtest --mypy-config-file ../python/pyproject.toml \
		--allowlist ../python/stubtest-allowlist.txt forebay._forebay

# The Rust tests and the example, built like the dev wheel (see TARGET above).
cargo-test: wheel-dev
	set -a && . ./$(CARGO_ENV) && set +a && \
	$(WITH_CLIPPY) $(CARGO) test --profile dev --target $(TARGET) --workspace --exclude forebay-python \
		--all-targets --no-run && \
	$(WITH_CLIPPY) $(CARGO) test --profile dev --target $(TARGET) --workspace --exclude forebay-python && \
	$(WITH_CLIPPY) $(CARGO) run --target $(TARGET) --quiet --example engine_pipeline

# Two test processes (pytest-xdist), a file each at a time (a file's tests share its module
# fixtures: a Ray cluster, a moto server), and the files that start Ray clusters one after
# another in one process, first (tests/python/conftest.py: its scheduler and test order).
pytest: wheel-dev
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests/python

test: lint-fast wheel-dev cargo-test wheel-check pytest

# The resume demo: generate documents, embed them with a checkpointed write, SIGKILL the
# job half way, run it again, verify every id is written exactly once.
demo: wheel-release
	$(PY) examples/resume_demo.py

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
