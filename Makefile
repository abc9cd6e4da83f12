# The two commands a newcomer needs (see README.md):
#   make demo   run the main job end to end on this machine
#   make test   install what the tests need, then lint and run every test
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: demo test bench envoy prometheus lint tools

demo: envoy
	$(CARGO) run --release --locked --quiet -- demo

test: tools lint
	$(CARGO) test --locked
	$(MAKE) bench

# Benchmarks report ratios against a baseline measured in the same run; they
# assert nothing about speed. Release build.
bench: tools
	$(CARGO) bench --locked --bench footprint

# Everything the tests run against, installed into .cache/ (no system changes).
tools: envoy prometheus

envoy:
	scripts/fetch-envoy.sh

prometheus:
	scripts/fetch-prometheus.sh

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets --locked -- -D warnings
