.PHONY: run test lint ci

# Runs the service, starting a local MongoDB-compatible server unless
# HOURGLASS__MONGODB__URI is set.
run:
	scripts/run.sh

# Runs every test against a throw-away local stack (or MONGODB_URI if set).
test:
	scripts/test.sh

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

ci: lint test
