# voxbatch: the two commands are `make demo` and `make test`. Both bootstrap what is missing first.
SHELL := /bin/bash
ENV := source scripts/env.sh &&

.PHONY: bootstrap build demo test test-faults test-cluster models models-all stop-seaweedfs

# What the demo needs (the binary alone); `make test` bootstraps the rest.
bootstrap:
	MODEL=$(MODEL) scripts/bootstrap.sh demo

build: bootstrap

## The product: text jobs (English and Chinese, two voices, several formats) through the tiny
## CosyVoice2 model (LLM + token2wav), RabbitMQ, SeaweedFS and Postgres, then what was done, where
## the audio is, the per-stage report and the cost. Its weights are random (bootstrap converts it
## from the reference code): the audio is noise of the right length, and each segment's length is
## forced ([llm] force_lengths), since random weights end speech at random.
## `make demo MODEL=cosyvoice3-tiny`: the same corpus through the tiny CosyVoice3 (its LLM and DiT
## token2wav; random weights too). `make demo MODEL=reference-tiny`: the CNN reference model on the
## plain sample corpus instead.
MODEL ?= cosyvoice2-tiny
demo: bootstrap
ifneq ($(filter $(MODEL),cosyvoice2-tiny cosyvoice3-tiny),)
	$(ENV) RUST_LOG=$${RUST_LOG:-info,flacenc=warn} VOXBATCH_LLM__FORCE_LENGTHS=true target/debug/voxbatch demo --model models/$(MODEL) --corpus corpus/cosyvoice2-sample.jsonl --campaign demo-$(MODEL)
else
	$(ENV) target/debug/voxbatch demo --model models/$(MODEL) --campaign demo-$(MODEL)
endif

## Unit and integration tests against the real RabbitMQ, Postgres and SeaweedFS.
test:
	scripts/bootstrap.sh test
	scripts/test.sh

## Only the fault-injection suite (restarts RabbitMQ and Postgres, stops SeaweedFS; see docs/RELIABILITY.md).
test-faults:
	scripts/bootstrap.sh test
	FAULTS=only scripts/test.sh

## A local 3-node RabbitMQ cluster loses a node mid-run (issue 18; about 4 minutes; not in `make test`).
test-cluster:
	scripts/bootstrap.sh test
	scripts/test-cluster.sh

## Reference model in every size (tiny is made by bootstrap).
models-all: bootstrap
	$(ENV) for s in base large; do [ -f models/reference-$$s/model.pt ] || python tools/export_reference_model.py --size $$s --out models/reference-$$s; done

stop-seaweedfs:
	scripts/stop-seaweedfs.sh
