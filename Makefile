# voxbatch: the two commands are `make demo` and `make test`. Both bootstrap what is missing first.
SHELL := /bin/bash
ENV := source scripts/env.sh &&

.PHONY: bootstrap build demo test test-faults test-cluster models models-all stop-seaweedfs

bootstrap:
	scripts/bootstrap.sh

build: bootstrap

## Turn the bundled sample corpus into WAV files in SeaweedFS and print the report.
## `make demo MODEL=cosyvoice2-tiny`: text jobs through CosyVoice2 (LLM + token2wav) instead. Its
## weights are random (bootstrap builds it from the reference code): the WAVs are noise of the right length.
demo: bootstrap
ifeq ($(MODEL),)
	$(ENV) target/debug/voxbatch demo
else
	@echo "demo with models/$(MODEL): random weights do not speak; the WAVs show the pipeline, not a voice"
	$(ENV) target/debug/voxbatch demo --model models/$(MODEL) --corpus corpus/cosyvoice2-sample.jsonl --campaign demo-$(MODEL)
endif

## Unit and integration tests against the real RabbitMQ, Postgres and SeaweedFS.
test: bootstrap
	scripts/test.sh

## Only the fault-injection suite (restarts RabbitMQ and Postgres, stops SeaweedFS; see docs/RELIABILITY.md).
test-faults: bootstrap
	FAULTS=only scripts/test.sh

## A local 3-node RabbitMQ cluster loses a node mid-run (issue 18; about 4 minutes; not in `make test`).
test-cluster: bootstrap
	scripts/test-cluster.sh

## Reference model in every size (tiny is made by bootstrap).
models-all: bootstrap
	$(ENV) for s in base large; do [ -f models/reference-$$s/model.pt ] || python tools/export_reference_model.py --size $$s --out models/reference-$$s; done

stop-seaweedfs:
	scripts/stop-seaweedfs.sh
