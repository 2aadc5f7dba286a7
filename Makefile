# Convenience targets; the README's two commands are scripts/demo.sh and scripts/test.sh.
.PHONY: test demo fuzz reliability lint

test:
	scripts/test.sh

demo:
	scripts/demo.sh

# Bounded fuzzing of the decoder/validator with proptest (no nightly here for
# cargo-fuzz): 200,000 structured and 200,000 byte-level cases, at most 10 minutes.
fuzz:
	PROPTEST_CASES=200000 timeout 600 cargo test --release --lib -- event::tests:: --test-threads 2

# Regenerate docs/reliability.md from the last test run's fault scenarios.
reliability:
	scripts/reliability-table.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
