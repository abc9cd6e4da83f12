# The two commands a newcomer needs (see README.md):
#   make demo   run the main job end to end on this machine
#   make test   install what the tests need, then lint and run every test
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: demo test envoy prometheus lint tools bench-node

demo: envoy
	$(CARGO) run --release --locked --quiet -- demo

test: tools lint
	$(CARGO) test --locked

# Everything the tests run against, installed into .cache/ (no system changes).
tools: envoy prometheus

envoy:
	scripts/fetch-envoy.sh

prometheus:
	scripts/fetch-prometheus.sh

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets --locked -- -D warnings

# Node mode at scale (root): 100 pod namespaces, discovery time, RSS, idle CPU.
bench-node:
	$(CARGO) run --release --locked --quiet -- bench node-scale --pods 100
