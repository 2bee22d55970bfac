.PHONY: run test lint ci docs bench loadtest fuzz

# Runs the service, starting a local MongoDB-compatible server unless
# HOURGLASS__MONGODB__URI is set.
run:
	scripts/run.sh

# Runs every test against a throw-away local stack (or MONGODB_URI if set).
test:
	scripts/test.sh

lint:
	cargo fmt --all --check
	cargo fmt --manifest-path fuzz/Cargo.toml --all --check
	cargo clippy --workspace --all-targets -- -D warnings

ci: lint test

# The documentation book (docs/): link and anchor check, then mdBook into
# target/book/.
docs:
	scripts/docs.sh

# Criterion benchmarks of the hot paths (a few minutes), then one summary table.
bench:
	cargo bench --bench hot_paths -- --warm-up-time 1 --measurement-time 3
	python3 scripts/bench-summary.py

# The full load test (about 10 minutes): every scenario, one report in
# loadtest/results/full/. Starts the local stack like `make run`.
loadtest:
	scripts/loadtest.sh

# Every fuzz target for five minutes each (CI runs them for seconds).
fuzz:
	FUZZ_SECONDS=300 scripts/fuzz.sh
