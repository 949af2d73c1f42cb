# The README's two commands are `make demo` and `make test`; CI runs `.ci/run`, which calls `make test`.
CARGO ?= cargo

.PHONY: all build test lint fmt crds crds-check demo sim bench chaos

all: build

build:
	$(CARGO) build --workspace --all-targets

## Run the whole test suite (unit, simulator, kubectl and CRD drift tests).
test:
	@if [ -n "$$ARGO_ROLLOUTS_SRC" ]; then \
		echo "ARGO_ROLLOUTS_SRC=$$ARGO_ROLLOUTS_SRC: the parity tests read that Argo Rollouts checkout"; \
	else \
		echo "ARGO_ROLLOUTS_SRC is not set: the parity tests that read an Argo Rollouts checkout are skipped (point it at a clone of argoproj/argo-rollouts to run them)"; \
	fi
	$(CARGO) test --workspace --no-fail-fast

## Formatting and clippy, warnings denied.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Regenerate crds/yaml/ (and its copy in deploy/crds/) from the Rust types; commit the result.
crds:
	$(CARGO) run -q -p rollouts-crds --bin crdgen
	cp crds/yaml/*.yaml deploy/crds/

## Fail if crds/yaml/ differs from what the types generate.
crds-check: crds
	git diff --exit-code -- crds/yaml deploy/crds

## Start kube-sim on a loopback port with our CRDs; kubeconfig in target/kube-sim.kubeconfig.
sim:
	$(CARGO) run -q -p rollouts-e2e --bin kube-sim -- --listen 127.0.0.1:0 \
		--kubeconfig target/kube-sim.kubeconfig --crds crds/yaml

## Benchmarks print their figures.
bench:
	$(CARGO) bench --workspace

## The README's first command: on kube-sim with a real Prometheus (installed from Debian when
## missing and run as root), a canary the judge promotes and one it rolls back, shown live.
## Logs stay in target/demo/. `make demo DEMO_ARGS=--hold` keeps everything (the dashboard too)
## running after the story, until Ctrl-C.
DEMO_ARGS ?=
demo:
	$(CARGO) build -p rollouts-controller -p kubectl-rollouts -p rollouts-e2e --bins
	$(CARGO) run -q -p rollouts-e2e --bin rollouts-demo -- $(DEMO_ARGS)

## The fault soak: N Rollouts released at once on kube-sim under seeded faults (500s, 409s,
## 429s, cut watches, forced relists, latency spikes) while the controller is SIGKILLed and
## restarted; prints the figures. SEED= replays a run (random when empty), N= Rollouts (100),
## DURATION= seconds to settle (90 + 2 per Rollout), KILLS= (3).
SEED ?=
N ?= 100
DURATION ?=
KILLS ?= 3
chaos:
	$(CARGO) build -p rollouts-controller -p rollouts-e2e --bins
	$(CARGO) run -q -p rollouts-e2e --bin chaos-soak -- --rollouts $(N) --kills $(KILLS) \
		$(if $(SEED),--seed $(SEED)) $(if $(DURATION),--duration $(DURATION))

